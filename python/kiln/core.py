"""core.py — variants, contexts and kernels: the parts of kiln that need neither torch nor a GPU.

Variant wraps a kiln_variant (parse, format, fields by name); Context wraps a kiln_ctx (cache,
device, arch); Kernel is a kiln_kernel of a context (inspection, workspace size, the raw
launches). Everything here calls libkiln.so through _lib; failures raise errors.KilnError
subclasses carrying kiln's message.
"""

import ctypes
import dataclasses
import threading
import weakref

from . import _check, _lib
from .errors import KilnParseError, check, error_for

# ---- versions --------------------------------------------------------------------------------


def version():
    """kiln's version string, from libkiln.so ("0.1.0")."""
    return _lib.text(_lib.lib().kiln_version())


def nvrtc_version():
    """NVRTC's version as "major.minor" (e.g. "13.0"); loads NVRTC on first call."""
    return _lib.text(_lib.lib().kiln_nvrtc_version())


def status_str(status):
    """kiln_status_str: the short text of a status value."""
    return _lib.text(_lib.lib().kiln_status_str(_check.integer(status, "status_str: status")))


# ---- variants --------------------------------------------------------------------------------

# Enum fields of kiln_variant: field -> (spelling -> value).
_ENUM_FIELDS = {
    "op": _lib.OPS,
    "q_dtype": _lib.DTYPES,
    "kv_dtype": _lib.KV_DTYPES,
    "out_dtype": _lib.DTYPES,
    "layout": _lib.LAYOUTS,
    "mask": _lib.MASKS,
    "logits": _lib.LOGITS,
    "mask_data": _lib.MASK_DATA,
    "kv": _lib.KV_STORAGE,
}
_INT_FIELDS = ("head_dim", "group", "q_tokens")
_BOOL_FIELDS = ("window", "lse", "rope")
_TEXT_FIELDS = ("logits_expr", "mask_expr")
FIELDS = ("op", "dtype") + tuple(_ENUM_FIELDS)[1:] + _INT_FIELDS + _BOOL_FIELDS + (
    "params",
) + _TEXT_FIELDS


def _name_of(table, value):
    for name, v in table.items():
        if v == value:
            return name
    return str(value)


def _parse_params(params):
    """params as [(name, type)], from a list of pairs or the spec form "a:f32,b:i32[]"."""
    if isinstance(params, str):
        out = []
        for item in filter(None, (p.strip() for p in params.split(","))):
            name, sep, typ = item.partition(":")
            if not sep:
                raise KilnParseError(
                    _lib.STATUS["PARSE"], f"variant: params item '{item}' is not name:type"
                )
            out.append((name, typ))
        return out
    if isinstance(params, (bytes, bytearray)) or not hasattr(params, "__iter__"):
        raise TypeError(f"Variant: params must be a str or a list of (name, type) pairs, not "
                        f"{type(params).__name__}")
    out = []
    for i, p in enumerate(params):
        if isinstance(p, (str, bytes)) or not hasattr(p, "__len__") or len(p) != 2:
            raise TypeError(f"Variant: params[{i}] must be a (name, type) pair, not {p!r}")
        out.append(tuple(p))
    return out


class Variant:
    """An attention variant (kiln_variant): what changes the generated code.

    Variant("op=decode head_dim=64") parses a spec; keyword fields override it
    (Variant(op="decode", dtype="bf16", group=4)). Values use the spec's spelling: op
    decode|prefill|merge, dtype/q_dtype/out_dtype f16|bf16, kv_dtype f16|bf16|e4m3|e5m2,
    head_dim 64|128|256, group 1..64, q_tokens 0|1|2|4|8|16 (prefill batches: at most that many
    query tokens a request), layout nhd|hnd, mask none|causal, window, lse and rope
    bool, logits none|softcap|alibi|softcap_alibi, mask_data none|bitmask|bsr, kv contiguous|ragged|paged,
    params
    [(name, "f32"|"i32"|"f32[]"|"i32[]")], logits_expr / mask_expr C expressions. Fields read
    back by name (v.head_dim); str(v) is the canonical spec. Variants are immutable and
    hashable; v.replace(**fields) returns a changed copy. Invalid combinations raise
    KilnUnsupportedError with kiln's message; unknown spellings KilnParseError.
    """

    __slots__ = ("_c", "_spec")

    def __init__(self, spec="", **fields):
        c = _lib.kiln_variant()
        if isinstance(spec, Variant):
            ctypes.memmove(ctypes.byref(c), ctypes.byref(spec._c), ctypes.sizeof(c))
        else:
            if not isinstance(spec, str):
                raise TypeError(f"Variant: spec must be a str or Variant, not {type(spec).__name__}")
            raw = _check.text(spec, "Variant: spec")
            check(_lib.lib().kiln_variant_parse(raw, ctypes.byref(c)))
        if fields:
            self._apply(c, fields)
            check(_lib.lib().kiln_variant_check(ctypes.byref(c)))
        self._c = c
        self._spec = None

    @classmethod
    def from_spec(cls, spec):
        """Parse a spec line (kiln_variant_parse); raises KilnParseError naming the token."""
        return cls(spec)

    @classmethod
    def default(cls):
        """kiln_variant_default(): op=prefill dtype=f16 head_dim=128 group=1 ..."""
        v = cls.__new__(cls)
        v._c = _lib.kiln_variant()
        v._spec = None
        _lib.lib().kiln_variant_default(ctypes.byref(v._c))
        return v

    @staticmethod
    def _apply(c, fields):
        for key, value in fields.items():
            what = f"Variant: {key}"
            if key == "dtype":
                for f in ("q_dtype", "kv_dtype", "out_dtype"):
                    setattr(c, f, Variant._enum("dtype", _lib.DTYPES, value))
            elif key in _ENUM_FIELDS:
                setattr(c, key, Variant._enum(key, _ENUM_FIELDS[key], value))
            elif key in _INT_FIELDS:
                setattr(c, key, _check.integer(value, what))
            elif key in _BOOL_FIELDS:
                setattr(c, key, int(_check.flag(value, what)))
            elif key in _TEXT_FIELDS:
                raw = _check.text("" if value is None else value, what,
                                  max_bytes=_lib.KILN_MAX_SNIPPET - 1)
                setattr(c, key, raw)
            elif key == "params":
                params = _parse_params([] if value is None else value)
                if len(params) > _lib.KILN_MAX_USER_PARAMS:
                    raise KilnParseError(
                        _lib.STATUS["PARSE"],
                        f"variant: {len(params)} params; at most {_lib.KILN_MAX_USER_PARAMS}",
                    )
                ctypes.memset(ctypes.byref(c.params), 0, ctypes.sizeof(c.params))
                for i, (name, typ) in enumerate(params):
                    c.params[i].name = _check.text(name, f"Variant: params[{i}] name",
                                                   max_bytes=_lib.KILN_MAX_PARAM_NAME - 1)
                    c.params[i].type = Variant._enum(f"params[{i}] type", _lib.PARAM_TYPES, typ)
                c.num_params = len(params)
            else:
                raise TypeError(f"Variant: unknown field '{key}' (fields: {', '.join(FIELDS)})")

    @staticmethod
    def _enum(what, table, value):
        """An enum field: its spec spelling (a str), or the enum's int value."""
        if isinstance(value, int) and not isinstance(value, bool) and value in table.values():
            return value
        if not isinstance(value, str):
            raise TypeError(f"Variant: {what} must be a str (one of {', '.join(table)}), not "
                            f"{type(value).__name__}")
        if value in table:
            return table[value]
        raise KilnParseError(
            _lib.STATUS["PARSE"],
            f"variant: {what}={value!r}: must be one of {', '.join(table)}",
        )

    def replace(self, **fields):
        """A copy with some fields changed (same keywords as the constructor)."""
        return Variant(self, **fields)

    # ---- fields ----
    op = property(lambda self: _name_of(_lib.OPS, self._c.op))
    q_dtype = property(lambda self: _name_of(_lib.DTYPES, self._c.q_dtype))
    kv_dtype = property(lambda self: _name_of(_lib.KV_DTYPES, self._c.kv_dtype))
    out_dtype = property(lambda self: _name_of(_lib.DTYPES, self._c.out_dtype))
    head_dim = property(lambda self: self._c.head_dim)
    group = property(lambda self: self._c.group)
    q_tokens = property(lambda self: self._c.q_tokens)
    layout = property(lambda self: _name_of(_lib.LAYOUTS, self._c.layout))
    mask = property(lambda self: _name_of(_lib.MASKS, self._c.mask))
    window = property(lambda self: bool(self._c.window))
    logits = property(lambda self: _name_of(_lib.LOGITS, self._c.logits))
    mask_data = property(lambda self: _name_of(_lib.MASK_DATA, self._c.mask_data))
    lse = property(lambda self: bool(self._c.lse))
    kv = property(lambda self: _name_of(_lib.KV_STORAGE, self._c.kv))
    rope = property(lambda self: bool(self._c.rope))
    logits_expr = property(lambda self: _lib.text(self._c.logits_expr))
    mask_expr = property(lambda self: _lib.text(self._c.mask_expr))

    @property
    def dtype(self):
        """The common dtype of q, k, v and o, or None when out_dtype differs."""
        c = self._c
        same = c.q_dtype == c.kv_dtype == c.out_dtype
        return _name_of(_lib.DTYPES, c.q_dtype) if same else None

    @property
    def params(self):
        """The declared user parameters, ((name, type), ...)."""
        c = self._c
        return tuple(
            (_lib.text(c.params[i].name), _name_of(_lib.PARAM_TYPES, c.params[i].type))
            for i in range(min(c.num_params, _lib.KILN_MAX_USER_PARAMS))
        )

    @property
    def spec(self):
        """The canonical spec (kiln_variant_format)."""
        if self._spec is None:
            lib = _lib.lib()
            cap = 512
            while True:
                buf = ctypes.create_string_buffer(cap)
                need = lib.kiln_variant_format(ctypes.byref(self._c), buf, cap)
                if need == 0:
                    check(_lib.STATUS["UNSUPPORTED"])
                if need < cap:
                    break
                cap = need + 1
            self._spec = buf.value.decode("utf-8")
        return self._spec

    def to_dict(self):
        """Every field by name, in spec spelling."""
        return {
            "op": self.op,
            "q_dtype": self.q_dtype,
            "kv_dtype": self.kv_dtype,
            "out_dtype": self.out_dtype,
            "head_dim": self.head_dim,
            "group": self.group,
            "layout": self.layout,
            "mask": self.mask,
            "window": self.window,
            "logits": self.logits,
            "lse": self.lse,
            "mask_data": self.mask_data,
            "kv": self.kv,
            "rope": self.rope,
            "params": list(self.params),
            "logits_expr": self.logits_expr,
            "mask_expr": self.mask_expr,
        }

    @property
    def as_parameter(self):
        """A pointer to the underlying kiln_variant (for direct ctypes calls)."""
        return ctypes.byref(self._c)

    def __str__(self):
        return self.spec

    def __repr__(self):
        return f"kiln.Variant({self.spec!r})"

    def _key(self):
        # The spec, plus the fields a library may not print in it yet.
        return (self.spec, self.mask_data, self.params, self.logits_expr, self.mask_expr)

    def __eq__(self, other):
        return isinstance(other, Variant) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())


def _as_variant(spec_or_variant, what="spec_or_variant"):
    if isinstance(spec_or_variant, Variant):
        return spec_or_variant
    if isinstance(spec_or_variant, str):
        return Variant(spec_or_variant)
    raise TypeError(
        f"{what} must be a spec str or a kiln.Variant, not {type(spec_or_variant).__name__}"
    )


# ---- contexts --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """kiln_device_info: the context's device and target arch."""

    present: bool  # False: a compile-only context
    ordinal: int
    name: str
    sm: int  # compute capability * 10
    sm_count: int
    driver_version: int
    arch: str  # the context's target arch ("" on a compile-only context with no arch)


@dataclasses.dataclass(frozen=True)
class KernelInfo:
    """kiln_kernel_info: identity and resources of a kernel."""

    key: str  # 32 hex digits of XXH3-128
    arch: str
    spec: str  # canonical spec
    from_cache: bool  # True: this context found it in the cache; False: it compiled it
    compile_ms: float  # NVRTC wall time of the compile, whoever did it
    registers: int
    smem_bytes: int
    spill_bytes: int
    stack_bytes: int
    cubin_bytes: int
    threads: int


def _device_ordinal(device, what="device"):
    """A CUDA ordinal from an int or a torch.device-like object (.index; None means 0)."""
    if device is not None and not isinstance(device, int) and hasattr(device, "index"):
        device = device.index if device.index is not None else 0
    return _check.integer(device, what, 0, _check.INT_MAX)


_CLOSED = "kiln: the context is closed"


class _Hold:
    """One call's hold on a context (Context._use): entering counts the call in, or raises
    KilnInvalidArgumentError once close() has begun; leaving counts it out and wakes close().
    __enter__ returns the context's handle, or make(handle) when make is given (a kernel's or
    plan's pointer with it). A class, not a generator: it sits on every launch.

    The count is the length of the list ctx._calls (one entry a call in progress). Here it
    changes under ctx._lock, with the check of _closing. kiln/hot.c's hold() and unhold() count
    a C run in and out without the lock: a list's append and pop are each atomic under the GIL
    (the Runner is a stable-ABI extension, so there is one), and the order does the rest: the
    Runner appends, then reads _handle and _closing, and backs out if closing; close() sets
    _closing, then reads the length, and waits while it is not 0. Whichever of the two reads
    comes second sees the other's write, so either the run backs out or close() waits for it.
    The Runner's last count-out wakes close() under the condition's lock (close() checks the
    length and waits holding it, so the wake-up cannot fall between the two). Change the
    protocol in both places."""

    __slots__ = ("_ctx", "_make")

    def __init__(self, ctx, make=None):
        self._ctx = ctx
        self._make = make

    def __enter__(self):
        ctx = self._ctx
        tid = threading.get_ident()
        with ctx._lock:
            if ctx._handle is None or ctx._closing:
                raise error_for(_lib.STATUS["INVALID_ARGUMENT"], _CLOSED)
            ctx._calls.append(None)
            ctx._holders[tid] = ctx._holders.get(tid, 0) + 1
            handle = ctx._handle
        if self._make is None:
            return handle
        try:
            return self._make(handle)
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(self, *exc):
        ctx = self._ctx
        tid = threading.get_ident()
        with ctx._lock:
            ctx._calls.pop()
            n = ctx._holders.pop(tid) - 1
            if n:
                ctx._holders[tid] = n
            if not ctx._calls and ctx._closing:  # close() waits (it sets _closing first)
                ctx._cv.notify_all()
        return False


class Context:
    """A kiln context (kiln_ctx): one device, one target arch, one cache, the kernel memo.

    Context(cache_dir=None, device=0, arch=None, no_device=False, no_cache=False,
    base_cache_dir=None, mode="default", record_path=None, max_cache_bytes=0) takes the fields of
    kiln_ctx_opts (docs/api.md); mode is "default" | "compile" | "strict" | "record". Paths are
    str or os.PathLike, arch a str, flags bool (docs/python.md, "Argument rules"). Without a
    GPU or driver the context is compile-only: compile() and inspection work, kernel() raises
    KilnNoDeviceError. Use it as a context manager or call close(); kernels belong to the
    context and die with it, so close it only when none of its launches is still running.
    Thread-safe, like kiln_ctx: close() waits for the calls other threads are making into it,
    and every call that starts after close() raises KilnInvalidArgumentError.
    """

    def __init__(
        self,
        cache_dir=None,
        device=0,
        arch=None,
        no_device=False,
        no_cache=False,
        base_cache_dir=None,
        mode="default",
        record_path=None,
        max_cache_bytes=0,
    ):
        self._handle = None
        # An RLock: a Plan collected by the garbage collector inside close() re-enters _use on
        # this thread (and finds the context closing) instead of deadlocking.
        self._lock = threading.RLock()  # the condition's lock, taken bare by every Python-path call
        self._cv = threading.Condition(self._lock)
        self._calls = []  # one entry a call into the C context in progress (_Hold: why a list)
        self._holders = {}  # thread ident -> its calls in progress (close() refuses to self-wait)
        self._closing = False
        self._kernels = {}  # kiln_kernel * -> Kernel, so one C kernel is one Python object
        self._plans = weakref.WeakSet()  # live kiln.Plan objects: close() destroys them first
        mode = _check.choice(mode, "Context: mode", _lib.CACHE_MODES)
        # The strings stay referenced by the context object for its whole life.
        self._keep = [
            _check.path(cache_dir, "Context: cache_dir"),
            _check.text(arch, "Context: arch", none=True),
            _check.path(base_cache_dir, "Context: base_cache_dir"),
            _check.path(record_path, "Context: record_path"),
        ]
        opts = _lib.kiln_ctx_opts(
            cache_dir=self._keep[0],
            no_cache=int(_check.flag(no_cache, "Context: no_cache")),
            device=_device_ordinal(device, "Context: device"),
            no_device=int(_check.flag(no_device, "Context: no_device")),
            arch=self._keep[1],
            base_cache_dir=self._keep[2],
            mode=_lib.CACHE_MODES[mode],
            record_path=self._keep[3],
            max_cache_bytes=_check.integer(max_cache_bytes, "Context: max_cache_bytes", 0,
                                           _check.INT64_MAX),
        )
        handle = ctypes.c_void_p()
        check(_lib.lib().kiln_ctx_create(ctypes.byref(opts), ctypes.byref(handle)))
        self._handle = handle.value

    # ---- lifetime ----
    def _use(self, make=None):
        """`with ctx._use() as handle:` for the duration of one call into the C context:
        close() waits until every _use has ended, and a _use that starts once close() has begun
        raises KilnInvalidArgumentError. Everything that reads the handle, or a kernel or plan
        of this context, runs inside one (borrowed strings are copied before it ends)."""
        return _Hold(self, make)

    def close(self):
        """kiln_ctx_destroy: destroy the context's plans, unload and free every kernel, once the
        calls other threads are making into this context (a compile, say) have returned; new
        calls fail from the moment close() starts. Idempotent; safe to call from several
        threads. Called from inside a call on this same context on the same thread (a callback,
        a __del__), where it would wait for itself, it raises RuntimeError instead."""
        with self._cv:
            if self._holders.get(threading.get_ident()):
                raise RuntimeError("kiln: Context.close() called from inside a call on the same "
                                   "context on the same thread; it would wait for itself")
            self._closing = True
            while self._calls:
                self._cv.wait()
            handle, self._handle = self._handle, None
            if handle:
                for plan in list(self._plans):  # a plan reaches its context to free itself
                    plan._destroy()
                self._kernels.clear()
                _lib.lib().kiln_ctx_destroy(handle)

    @property
    def closed(self):
        return self._handle is None or self._closing

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # The wrappers' default contexts set _keep_alive: launches they enqueued may still run
        # when the interpreter exits, and unloading modules under them is not worth the risk.
        if getattr(self, "_keep_alive", False) or getattr(self, "_cv", None) is None:
            return
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass

    # ---- description ----
    @property
    def device(self):
        """DeviceInfo of the context (present=False on a compile-only context)."""
        info = _lib.kiln_device_info()
        with self._use() as h:
            check(_lib.lib().kiln_ctx_device(h, ctypes.byref(info)), h)
        return DeviceInfo(
            present=bool(info.present),
            ordinal=info.ordinal,
            name=_lib.text(info.name),
            sm=info.sm,
            sm_count=info.sm_count,
            driver_version=info.driver_version,
            arch=_lib.text(info.arch),
        )

    @property
    def has_device(self):
        return self.device.present

    @property
    def arch(self):
        """The context's target arch ("sm_90a"; "" when compile-only with no arch named)."""
        return self.device.arch

    @property
    def cache_path(self):
        """Path of the cache database ("" with no_cache)."""
        with self._use() as h:
            return _lib.text(_lib.lib().kiln_ctx_cache_path(h))

    @property
    def errmsg(self):
        """kiln_ctx_errmsg: the context's last error (on a compile-only context: why)."""
        with self._use() as h:
            return _lib.text(_lib.lib().kiln_ctx_errmsg(h))

    # ---- kernels ----
    def _wrap(self, ptr, variant):
        k = self._kernels.get(ptr)
        if k is None:  # setdefault: two threads getting one kernel share one object
            k = self._kernels.setdefault(ptr, Kernel(self, ptr, variant))
        return k

    def kernel(self, spec_or_variant):
        """kiln_kernel_get: the kernel for a variant on this context's device, loaded and ready
        to launch (memo, then cache, then NVRTC). Raises KilnNoDeviceError on a compile-only
        context."""
        v = _as_variant(spec_or_variant)
        out = ctypes.c_void_p()
        with self._use() as h:
            check(_lib.lib().kiln_kernel_get(h, v.as_parameter, ctypes.byref(out)), h)
            return self._wrap(out.value, v)

    def compile(self, spec_or_variant, arch=None):
        """kiln_kernel_compile: compile (or find in the cache) for a named arch (a str; None:
        the context's) without loading; needs no GPU. The kernel can be inspected, not
        launched."""
        v = _as_variant(spec_or_variant)
        a = _check.text(arch, "compile: arch", none=True)
        out = ctypes.c_void_p()
        with self._use() as h:
            check(_lib.lib().kiln_kernel_compile(h, v.as_parameter, a, ctypes.byref(out)), h)
            return self._wrap(out.value, v)

    def __repr__(self):
        if self.closed:
            return "<kiln.Context closed>"
        d = self.device
        where = f"{d.name} ({d.arch})" if d.present else f"compile-only ({d.arch or 'no arch'})"
        return f"<kiln.Context {where} cache={self.cache_path or 'none'}>"


# ---- kernels ---------------------------------------------------------------------------------


def _stream_handle(stream):
    """A CUstream as an int (or None for the legacy default stream): see _check.stream."""
    return _check.stream(stream)


class Kernel:
    """A kernel of a context (kiln_kernel): inspect it, size its workspace, launch it.

    Alive as long as its context: every accessor raises KilnInvalidArgumentError once the
    context is closed, and close() waits for the accessors in progress.
    """

    def __init__(self, ctx, ptr, variant):
        self._ctx = ctx  # keeps the context (and so the C kernel) alive
        self._ptr = ptr
        self.variant = variant
        self._info = None

    def _use(self):
        """`with kernel._use() as (kernel pointer, context handle):` for one call; see
        Context._use."""
        return self._ctx._use(lambda h: (self._ptr, h))

    @property
    def context(self):
        return self._ctx

    @property
    def info(self):
        """KernelInfo (kiln_kernel_describe)."""
        if self._info is None:
            i = _lib.kiln_kernel_info()
            with self._use() as (p, h):
                check(_lib.lib().kiln_kernel_describe(p, ctypes.byref(i)), h)
            self._info = KernelInfo(
                key=_lib.text(i.key),
                arch=_lib.text(i.arch),
                spec=_lib.text(i.spec),
                from_cache=bool(i.from_cache),
                compile_ms=i.compile_ms,
                registers=i.registers,
                smem_bytes=i.smem_bytes,
                spill_bytes=i.spill_bytes,
                stack_bytes=i.stack_bytes,
                cubin_bytes=i.cubin_bytes,
                threads=i.threads,
            )
        return self._info

    def _text(self, name):
        """A borrowed string accessor of the kernel, copied while the context is held."""
        with self._use() as (p, _):
            return _lib.text(getattr(_lib.lib(), name)(p))

    key = property(lambda self: self.info.key)
    arch = property(lambda self: self.info.arch)
    # the whole canonical spec (info.spec is cut to 255 bytes; snippet specs run longer)
    spec = property(lambda self: self._text("kiln_kernel_spec"))

    @property
    def source(self):
        """The exact CUDA source NVRTC compiled."""
        return self._text("kiln_kernel_source")

    @property
    def family(self):
        """The kernel family, by the generated source's entry point: "wgmma" (the
        warp-specialized Hopper prefill, sm_90a), "mma.sync", "simt" (decode on CUDA cores) or
        "merge" — as `kiln compile` prints it; `kiln show` also says why a prefill is not on
        wgmma (kiln_kernel_family)."""
        return self._text("kiln_kernel_family")

    @property
    def log(self):
        """The NVRTC log, with ptxas' resource report."""
        return self._text("kiln_kernel_log")

    @property
    def key_material(self):
        """The exact text hashed into the cache key."""
        return self._text("kiln_kernel_key_material")

    @property
    def cubin(self):
        """The cubin (an ELF image), as bytes."""
        size = ctypes.c_size_t()
        with self._use() as (p, _):
            ptr = _lib.lib().kiln_kernel_cubin(p, ctypes.byref(size))
            return ctypes.string_at(ptr, size.value) if ptr and size.value else b""

    def workspace_size(self, num_qo_heads, kv_len):
        """kiln_decode_workspace_size: bytes of workspace a single decode of this shape needs
        (0: none). Never decreases as kv_len grows."""
        H = _check.integer(num_qo_heads, "workspace_size: num_qo_heads")
        L = _check.integer(kv_len, "workspace_size: kv_len")
        n = ctypes.c_size_t()
        with self._use() as (p, h):
            check(_lib.lib().kiln_decode_workspace_size(p, H, L, ctypes.byref(n)), h)
        return n.value

    def _launch(self, fn, args, struct, stream):
        _check.instance(args, f"{fn}: args", struct)
        s = _check.stream(stream, f"{fn}: stream")
        with self._use() as (p, h):
            check(_lib.fn(fn)(p, ctypes.byref(args), s), h)

    def single_decode(self, args, stream=None):
        """kiln_single_decode with a filled kiln.AttnArgs (device pointers, strides in
        elements) on `stream` (a CUstream int, an object with .cuda_stream, or None)."""
        self._launch("kiln_single_decode", args, _lib.kiln_attn_args, stream)

    def single_prefill(self, args, stream=None):
        """kiln_single_prefill with a filled kiln.AttnArgs on `stream`."""
        self._launch("kiln_single_prefill", args, _lib.kiln_attn_args, stream)

    def prefill_mask_plan_size(self, qo_len, kv_len):
        """kiln_prefill_tile_map_size: bytes of the tile map a single prefill of this shape
        needs (a prefill with a mask snippet or mask data; 0 otherwise)."""
        L_Q = _check.integer(qo_len, "prefill_mask_plan_size: qo_len")
        L_KV = _check.integer(kv_len, "prefill_mask_plan_size: kv_len")
        n = ctypes.c_size_t()
        with self._use() as (p, h):
            check(_lib.lib().kiln_prefill_tile_map_size(p, L_Q, L_KV, ctypes.byref(n)), h)
        return n.value

    def prefill_mask_plan(self, args, stream=None):
        """kiln_prefill_tile_map: fill args.tile_map (args.tile_map_bytes from
        prefill_mask_plan_size) for the mask in `args`, on `stream`; a later single_prefill with
        the same args skips the tiles it marks hidden."""
        self._launch("kiln_prefill_tile_map", args, _lib.kiln_attn_args, stream)

    # ---- batches (kv=ragged / kv=paged kernels) and merges (op=merge kernels) ----
    def plan(self, num_qo_heads, page_size=0, max_batch=0, max_qo_tokens=0, fixed_split=0,
             no_split=False):
        """kiln_plan_create: a kiln.Plan for this batch kernel with the fields of
        kiln_plan_opts. KilnLibraryError when the library predates the batch API."""
        from .plan import Plan

        return Plan(self, num_qo_heads=num_qo_heads, page_size=page_size, max_batch=max_batch,
                    max_qo_tokens=max_qo_tokens, fixed_split=fixed_split, no_split=no_split)

    def merge_state(self, args, stream=None):
        """kiln_merge_state with a filled kiln.MergeArgs (v_a, lse_a, v_b, lse_b -> v_out,
        lse_out; natural-log LSE) on `stream`. The kernel is an op=merge variant."""
        self._launch("kiln_merge_state", args, _lib.kiln_merge_args, stream)

    def merge_state_in_place(self, args, stream=None):
        """kiln_merge_state_in_place: (v_a, lse_a) absorbs (v_b, lse_b), rows where mask != 0."""
        self._launch("kiln_merge_state_in_place", args, _lib.kiln_merge_args, stream)

    def merge_states(self, args, stream=None):
        """kiln_merge_states: v_all [n, S, H, D], lse_all [n, S, H] -> v_out, lse_out."""
        self._launch("kiln_merge_states", args, _lib.kiln_merge_args, stream)

    def __repr__(self):
        if self._ctx.closed:
            return "<kiln.Kernel (context closed)>"
        i = self.info
        return f"<kiln.Kernel {i.key[:12]} {i.arch} {i.spec!r}>"
