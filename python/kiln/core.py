"""core.py — variants, contexts and kernels: the parts of kiln that need neither torch nor a GPU.

Variant wraps a kiln_variant (parse, format, fields by name); Context wraps a kiln_ctx (cache,
device, arch); Kernel is a kiln_kernel of a context (inspection, workspace size, the raw
launches). Everything here calls libkiln.so through _lib; failures raise errors.KilnError
subclasses carrying kiln's message.
"""

import ctypes
import dataclasses

from . import _lib
from .errors import KilnError, KilnParseError, check

# ---- versions --------------------------------------------------------------------------------


def version():
    """kiln's version string, from libkiln.so ("0.1.0")."""
    return _lib.text(_lib.lib().kiln_version())


def nvrtc_version():
    """NVRTC's version as "major.minor" (e.g. "13.0"); loads NVRTC on first call."""
    return _lib.text(_lib.lib().kiln_nvrtc_version())


def status_str(status):
    """kiln_status_str: the short text of a status value."""
    return _lib.text(_lib.lib().kiln_status_str(status))


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
_INT_FIELDS = ("head_dim", "group")
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
    return [tuple(p) for p in params]


class Variant:
    """An attention variant (kiln_variant): what changes the generated code.

    Variant("op=decode head_dim=64") parses a spec; keyword fields override it
    (Variant(op="decode", dtype="bf16", group=4)). Values use the spec's spelling: op
    decode|prefill|merge, dtype/q_dtype/out_dtype f16|bf16, kv_dtype f16|bf16|e4m3|e5m2,
    head_dim 64|128|256, group 1..64, layout nhd|hnd, mask none|causal, window, lse and rope
    bool, logits none|softcap|alibi, mask_data none|bitmask|bsr, kv contiguous|ragged|paged,
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
            check(_lib.lib().kiln_variant_parse(spec.encode("utf-8"), ctypes.byref(c)))
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
            if key == "dtype":
                for f in ("q_dtype", "kv_dtype", "out_dtype"):
                    setattr(c, f, Variant._enum("dtype", _lib.DTYPES, value))
            elif key in _ENUM_FIELDS:
                setattr(c, key, Variant._enum(key, _ENUM_FIELDS[key], value))
            elif key in _INT_FIELDS:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise TypeError(f"Variant: {key} must be an int, not {type(value).__name__}")
                setattr(c, key, value)
            elif key in _BOOL_FIELDS:
                setattr(c, key, 1 if value else 0)
            elif key in _TEXT_FIELDS:
                raw = (value or "").encode("utf-8")
                if len(raw) >= _lib.KILN_MAX_SNIPPET:
                    raise KilnParseError(
                        _lib.STATUS["PARSE"],
                        f"variant: {key} is {len(raw)} bytes; at most {_lib.KILN_MAX_SNIPPET - 1}",
                    )
                setattr(c, key, raw)
            elif key == "params":
                params = _parse_params(value or [])
                if len(params) > _lib.KILN_MAX_USER_PARAMS:
                    raise KilnParseError(
                        _lib.STATUS["PARSE"],
                        f"variant: {len(params)} params; at most {_lib.KILN_MAX_USER_PARAMS}",
                    )
                ctypes.memset(ctypes.byref(c.params), 0, ctypes.sizeof(c.params))
                for i, (name, typ) in enumerate(params):
                    raw = name.encode("utf-8")
                    if len(raw) >= _lib.KILN_MAX_PARAM_NAME:
                        raise KilnParseError(
                            _lib.STATUS["PARSE"],
                            f"variant: param name '{name}' is longer than "
                            f"{_lib.KILN_MAX_PARAM_NAME - 1} bytes",
                        )
                    c.params[i].name = raw
                    c.params[i].type = Variant._enum("param type", _lib.PARAM_TYPES, typ)
                c.num_params = len(params)
            else:
                raise TypeError(f"Variant: unknown field '{key}' (fields: {', '.join(FIELDS)})")

    @staticmethod
    def _enum(what, table, value):
        if isinstance(value, int) and not isinstance(value, bool) and value in table.values():
            return value
        if isinstance(value, str) and value in table:
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


def _as_variant(spec_or_variant):
    if isinstance(spec_or_variant, Variant):
        return spec_or_variant
    if isinstance(spec_or_variant, str):
        return Variant(spec_or_variant)
    raise TypeError(
        f"expected a spec string or kiln.Variant, not {type(spec_or_variant).__name__}"
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


def _opt_bytes(s):
    return None if s is None else str(s).encode("utf-8")


class Context:
    """A kiln context (kiln_ctx): one device, one target arch, one cache, the kernel memo.

    Context(cache_dir=None, device=0, arch=None, no_device=False, no_cache=False,
    base_cache_dir=None, mode="default", record_path=None, max_cache_bytes=0) takes the fields of
    kiln_ctx_opts (docs/api.md); mode is "default" | "compile" | "strict" | "record". Without a
    GPU or driver the context is compile-only: compile() and inspection work, kernel() raises
    KilnNoDeviceError. Use it as a context manager or call close(); kernels belong to the
    context and die with it, so close it only when none of its launches is still running.
    Thread-safe, like kiln_ctx.
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
        if mode not in _lib.CACHE_MODES:
            raise ValueError(f"Context: mode={mode!r}: must be one of {', '.join(_lib.CACHE_MODES)}")
        # The strings stay referenced by the context object for its whole life.
        self._keep = [
            _opt_bytes(cache_dir),
            _opt_bytes(arch),
            _opt_bytes(base_cache_dir),
            _opt_bytes(record_path),
        ]
        opts = _lib.kiln_ctx_opts(
            cache_dir=self._keep[0],
            no_cache=1 if no_cache else 0,
            device=int(getattr(device, "index", device) or 0),
            no_device=1 if no_device else 0,
            arch=self._keep[1],
            base_cache_dir=self._keep[2],
            mode=_lib.CACHE_MODES[mode],
            record_path=self._keep[3],
            max_cache_bytes=int(max_cache_bytes),
        )
        handle = ctypes.c_void_p()
        check(_lib.lib().kiln_ctx_create(ctypes.byref(opts), ctypes.byref(handle)))
        self._handle = handle.value
        self._kernels = {}  # kiln_kernel * -> Kernel, so one C kernel is one Python object

    # ---- lifetime ----
    def close(self):
        """kiln_ctx_destroy: unload and free every kernel. Idempotent."""
        handle, self._handle = self._handle, None
        if handle:
            self._kernels.clear()
            _lib.lib().kiln_ctx_destroy(handle)

    @property
    def closed(self):
        return self._handle is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # The wrappers' default contexts set _keep_alive: launches they enqueued may still run
        # when the interpreter exits, and unloading modules under them is not worth the risk.
        if getattr(self, "_keep_alive", False):
            return
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass

    def _h(self):
        if self._handle is None:
            raise KilnError(_lib.STATUS["INVALID_ARGUMENT"], "kiln: the context is closed")
        return self._handle

    # ---- description ----
    @property
    def device(self):
        """DeviceInfo of the context (present=False on a compile-only context)."""
        info = _lib.kiln_device_info()
        check(_lib.lib().kiln_ctx_device(self._h(), ctypes.byref(info)))
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
        return _lib.text(_lib.lib().kiln_ctx_cache_path(self._h()))

    @property
    def errmsg(self):
        """kiln_ctx_errmsg: the context's last error (on a compile-only context: why)."""
        return _lib.text(_lib.lib().kiln_ctx_errmsg(self._h()))

    # ---- kernels ----
    def _wrap(self, ptr, variant):
        k = self._kernels.get(ptr)
        if k is None:
            k = Kernel(self, ptr, variant)
            self._kernels[ptr] = k
        return k

    def kernel(self, spec_or_variant):
        """kiln_kernel_get: the kernel for a variant on this context's device, loaded and ready
        to launch (memo, then cache, then NVRTC). Raises KilnNoDeviceError on a compile-only
        context."""
        v = _as_variant(spec_or_variant)
        out = ctypes.c_void_p()
        h = self._h()
        check(_lib.lib().kiln_kernel_get(h, v.as_parameter, ctypes.byref(out)), h)
        return self._wrap(out.value, v)

    def compile(self, spec_or_variant, arch=None):
        """kiln_kernel_compile: compile (or find in the cache) for a named arch (None: the
        context's) without loading; needs no GPU. The kernel can be inspected, not launched."""
        v = _as_variant(spec_or_variant)
        out = ctypes.c_void_p()
        h = self._h()
        a = _opt_bytes(arch)
        check(_lib.lib().kiln_kernel_compile(h, v.as_parameter, a, ctypes.byref(out)), h)
        return self._wrap(out.value, v)

    def __repr__(self):
        if self._handle is None:
            return "<kiln.Context closed>"
        d = self.device
        where = f"{d.name} ({d.arch})" if d.present else f"compile-only ({d.arch or 'no arch'})"
        return f"<kiln.Context {where} cache={self.cache_path or 'none'}>"


# ---- kernels ---------------------------------------------------------------------------------


def _stream_handle(stream):
    """A CUstream as an int: None/0 is the legacy default stream; objects with .cuda_stream
    (torch.cuda.Stream) give theirs."""
    if stream is None:
        return None
    handle = getattr(stream, "cuda_stream", stream)
    return int(handle) or None


class Kernel:
    """A kernel of a context (kiln_kernel): inspect it, size its workspace, launch it.

    Alive as long as its context: every accessor raises once the context is closed.
    """

    def __init__(self, ctx, ptr, variant):
        self._ctx = ctx  # keeps the context (and so the C kernel) alive
        self._ptr = ptr
        self.variant = variant
        self._info = None

    def _p(self):
        if self._ctx.closed:
            raise KilnError(_lib.STATUS["INVALID_ARGUMENT"], "kiln: the kernel's context is closed")
        return self._ptr

    @property
    def context(self):
        return self._ctx

    @property
    def info(self):
        """KernelInfo (kiln_kernel_describe)."""
        if self._info is None:
            i = _lib.kiln_kernel_info()
            check(_lib.lib().kiln_kernel_describe(self._p(), ctypes.byref(i)))
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

    key = property(lambda self: self.info.key)
    arch = property(lambda self: self.info.arch)
    # the whole canonical spec (info.spec is cut to 255 bytes; snippet specs run longer)
    spec = property(lambda self: _lib.text(_lib.lib().kiln_kernel_spec(self._p())))

    @property
    def source(self):
        """The exact CUDA source NVRTC compiled."""
        return _lib.text(_lib.lib().kiln_kernel_source(self._p()))

    @property
    def log(self):
        """The NVRTC log, with ptxas' resource report."""
        return _lib.text(_lib.lib().kiln_kernel_log(self._p()))

    @property
    def key_material(self):
        """The exact text hashed into the cache key."""
        return _lib.text(_lib.lib().kiln_kernel_key_material(self._p()))

    @property
    def cubin(self):
        """The cubin (an ELF image), as bytes."""
        size = ctypes.c_size_t()
        ptr = _lib.lib().kiln_kernel_cubin(self._p(), ctypes.byref(size))
        return ctypes.string_at(ptr, size.value) if ptr and size.value else b""

    def workspace_size(self, num_qo_heads, kv_len):
        """kiln_decode_workspace_size: bytes of workspace a single decode of this shape needs
        (0: none). Never decreases as kv_len grows."""
        n = ctypes.c_size_t()
        p = self._p()
        check(_lib.lib().kiln_decode_workspace_size(p, num_qo_heads, kv_len, ctypes.byref(n)),
              self._ctx._handle)
        return n.value

    def single_decode(self, args, stream=None):
        """kiln_single_decode with a filled kiln.AttnArgs (device pointers, strides in
        elements) on `stream` (a CUstream int, an object with .cuda_stream, or None)."""
        check(_lib.lib().kiln_single_decode(self._p(), ctypes.byref(args), _stream_handle(stream)),
              self._ctx._handle)

    def single_prefill(self, args, stream=None):
        """kiln_single_prefill with a filled kiln.AttnArgs on `stream`."""
        check(_lib.lib().kiln_single_prefill(self._p(), ctypes.byref(args), _stream_handle(stream)),
              self._ctx._handle)

    def prefill_mask_plan_size(self, qo_len, kv_len):
        """kiln_prefill_mask_plan_size: bytes of the tile map a single prefill of this shape
        needs (a prefill with a mask snippet or mask data; 0 otherwise)."""
        n = ctypes.c_size_t()
        check(_lib.lib().kiln_prefill_mask_plan_size(self._p(), int(qo_len), int(kv_len),
                                                     ctypes.byref(n)), self._ctx._handle)
        return n.value

    def prefill_mask_plan(self, args, stream=None):
        """kiln_prefill_mask_plan: fill args.tile_map (args.tile_map_bytes from
        prefill_mask_plan_size) for the mask in `args`, on `stream`; a later single_prefill with
        the same args skips the tiles it marks hidden."""
        check(_lib.lib().kiln_prefill_mask_plan(self._p(), ctypes.byref(args),
                                                _stream_handle(stream)), self._ctx._handle)

    # ---- batches (kv=ragged / kv=paged kernels) and merges (op=merge kernels) ----
    def plan(self, num_qo_heads, page_size=0, max_batch=0, max_qo_tokens=0, fixed_split=0,
             no_split=False):
        """kiln_plan_create: a kiln.Plan for this batch kernel with the fields of
        kiln_plan_opts. KilnLibraryError when the library predates the batch API."""
        from .plan import Plan

        return Plan(self, num_qo_heads=num_qo_heads, page_size=page_size, max_batch=max_batch,
                    max_qo_tokens=max_qo_tokens, fixed_split=fixed_split, no_split=no_split)

    def _merge(self, name, args, stream):
        check(_lib.fn(name)(self._p(), ctypes.byref(args), _stream_handle(stream)),
              self._ctx._handle)

    def merge_state(self, args, stream=None):
        """kiln_merge_state with a filled kiln.MergeArgs (v_a, lse_a, v_b, lse_b -> v_out,
        lse_out; natural-log LSE) on `stream`. The kernel is an op=merge variant."""
        self._merge("kiln_merge_state", args, stream)

    def merge_state_in_place(self, args, stream=None):
        """kiln_merge_state_in_place: (v_a, lse_a) absorbs (v_b, lse_b), rows where mask != 0."""
        self._merge("kiln_merge_state_in_place", args, stream)

    def merge_states(self, args, stream=None):
        """kiln_merge_states: v_all [n, S, H, D], lse_all [n, S, H] -> v_out, lse_out."""
        self._merge("kiln_merge_states", args, stream)

    def __repr__(self):
        if self._ctx.closed:
            return "<kiln.Kernel (context closed)>"
        i = self.info
        return f"<kiln.Kernel {i.key[:12]} {i.arch} {i.spec!r}>"
