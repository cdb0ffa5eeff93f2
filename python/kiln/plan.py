"""plan.py — kiln_plan from Python: the raw batch API under the FlashInfer-shaped wrappers.

A Plan belongs to one loaded batch kernel (kv=ragged or kv=paged) and one device workspace.
plan() takes the batch as host integer sequences (lists, tuples, or anything with .tolist()),
checks them, and calls kiln_plan_schedule, which writes the schedule into the workspace with one
asynchronous copy on the stream; run() launches kiln_plan_run with a filled kiln.BatchArgs.
Nothing here needs torch: device memory is passed as integer pointers. batch.py builds the
torch wrappers on top of it.

The batch functions are bound lazily (_lib.fn): with a libkiln.so older than the batch API,
creating a Plan raises KilnLibraryError saying so; the rest of the package still works.
"""

import array
import ctypes
import dataclasses
import sys

from . import _check, _lib
from .errors import KilnError, check, error_for


@dataclasses.dataclass(frozen=True)
class PlanInfo:
    """kiln_plan_info: what the last plan() decided."""

    batch: int  # requests
    items: int  # work items (request x query tile x key chunk)
    grid: int  # CTAs along x of the main launch (>= items in graph mode)
    kv_chunk: int  # keys per split (0: no request was split)
    split_items: int  # items writing partial states merged afterwards
    merge_tasks: int  # (request, query tile) groups merged (KILN_TUNE merge=1: by their last CTA)
    max_item_keys: int  # keys of the longest item
    total_keys: int  # keys over all items


def host_ints(x, name, lo=_check.INT_MIN, hi=_check.INT_MAX):
    """A 1-D sequence of C ints from a list, tuple, range, numpy array or torch tensor (a CUDA
    tensor is copied to the host, which synchronises); each entry an integer within [lo, hi]
    (_check.integer: no floats, bools or strings). None stays None."""
    if x is None:
        return None
    values = host_array(x, name, lo, hi)[0]
    return values.tolist() if type(values) is array.array else values


def host_array(x, name, lo=_check.INT_MIN, hi=_check.INT_MAX):
    """(values, source): host_ints(x) as a list, and where C can read them as int32: a
    contiguous int32 CPU tensor (x itself, or its host copy) or an array.array("i"); see
    c_address. Checked with builtins over the whole list (one type set, min, max; none for an
    int32 tensor against the C int range); only a list that fails them is walked entry by
    entry, for the message naming the entry.

    A contiguous 1-D int32 tensor on the host with the whole C int range allowed (plan()'s
    index arrays as engines pass them) is copied as it is into an array.array("i"), which is
    both values and source: tolist() would cost 4 µs at 257 entries; an array.array("i") is
    used as it is. Such values are every C int; what else the arrays must satisfy,
    kiln_plan_schedule checks (check_indptr and check_last_page_len leave those checks to it,
    see there)."""
    any_int = lo <= _check.INT_MIN and _check.INT_MAX <= hi  # every C int allowed
    if any_int and type(x) is array.array and x.typecode == "i":
        return x, x  # C ints already (fast_decode_plan's last_page_len of ones)
    tensor = hasattr(x, "tolist") and not isinstance(x, (list, tuple))
    if tensor and hasattr(x, "detach"):  # torch: to the host once
        if x.requires_grad:
            x = x.detach()
        if x.is_cuda:
            x = x.cpu()
        width = _int_widths(x).get(x.dtype)
        if any_int and width == 32 and x.dim() == 1 and x.is_cpu and x.is_contiguous():
            n = x.numel()
            values = array.array("i", ctypes.string_at(x.data_ptr(), 4 * n) if n else b"")
            return values, values
        if width is not None and x.dim() == 1:
            values = x.tolist()  # Python ints
            if (width <= 32 and any_int) or not values or (lo <= min(values) and max(values) <= hi):
                if width == 32 and x.is_cpu and x.is_contiguous():
                    return values, x
                return values, array.array("i", values)
            return _checked(values, name, lo, hi)
    if tensor:
        x = x.tolist()
    if isinstance(x, (str, bytes, bytearray)) or not hasattr(x, "__iter__"):
        raise TypeError(f"{name} must be a 1-D sequence of integers, not {type(x).__name__}")
    values = x if isinstance(x, list) else list(x)
    if set(map(type, values)) <= _INT_ONLY and (
            not values or (lo <= min(values) and max(values) <= hi)):
        return values, array.array("i", values)
    return _checked(values, name, lo, hi)


_INT_WIDTHS = {}  # torch's signed integer dtypes (and uint8) -> bits, once torch is loaded


def _int_widths(t):
    if not _INT_WIDTHS:
        torch = sys.modules[type(t).__module__.split(".")[0]]
        _INT_WIDTHS.update({torch.int64: 64, torch.int32: 32, torch.int16: 16, torch.int8: 8,
                            torch.uint8: 8})
    return _INT_WIDTHS


_INT_ONLY = frozenset((int,))


def _checked(values, name, lo, hi):
    """host_array's slow path: each entry through _check.integer (raises naming it)."""
    values = [_check.integer(v, f"{name}[{i}]", lo, hi) for i, v in enumerate(values)]
    return values, array.array("i", values)


_NO_INTS = (ctypes.c_int * 1)()  # what an empty array points at (never NULL, as C expects)


def c_address(source):
    """The address of the ints C reads from a host_array source (0, NULL, for None). The
    source must stay alive across the call."""
    if source is None:
        return 0
    if isinstance(source, array.array):
        addr, n = source.buffer_info()
    else:  # a contiguous int32 CPU tensor
        addr, n = source.data_ptr(), source.numel()
    return addr if n else ctypes.addressof(_NO_INTS)


# ---- host checks of the index arrays (the batch wrappers') -----------------------------------------------------------


def _request_kv_lens(kv_indptr, last_page_len, page_size):
    """Keys of each request: the indptr's differences (ragged), or (pages - 1) * page_size +
    last page's length (paged; last_page_len given)."""
    n = [kv_indptr[b + 1] - kv_indptr[b] for b in range(len(kv_indptr) - 1)]
    if last_page_len is None:
        return n
    return [(p - 1) * page_size + last_page_len[b] if p else 0 for b, p in enumerate(n)]


def check_indptr(name, values, batch=None):
    """indptr arrays: batch + 1 entries, starting at 0, never decreasing. An int32 tensor's
    copy (host_array's array.array values) is left to kiln_plan_schedule for the order, which
    it checks (KilnInvalidArgumentError, a ValueError, naming the request)."""
    if not values:
        raise ValueError(f"{name} is empty: it needs batch + 1 entries (at least [0])")
    if batch is not None and len(values) != batch + 1:
        raise ValueError(f"{name} has {len(values)} entries; batch {batch} needs {batch + 1}")
    if values[0] != 0:
        raise ValueError(f"{name}[0] = {values[0]}: must be 0")
    if type(values) is array.array or values == sorted(values):  # never decreasing
        return
    for b in range(1, len(values)):
        if values[b] < values[b - 1]:
            raise ValueError(
                f"{name}[{b}] = {values[b]} < {name}[{b - 1}] = {values[b - 1]}: an indptr "
                f"never decreases (request {b - 1})"
            )


_VALID_LAST = {}  # page_size (< 256) -> bytes(range(1, page_size + 1))


def _all_in_pages(last, page_size):
    """Whether every entry of the int list is in 1..page_size. For page sizes below 256: one
    bytes() conversion (it refuses any value outside 0..255) and a translate that deletes the
    valid values, both at C speed (1.3 us for 256 entries on the 2-core box, against 5.1 for
    min() and max()); else min() and max()."""
    if page_size < 256:
        valid = _VALID_LAST.get(page_size)
        if valid is None:
            valid = _VALID_LAST[page_size] = bytes(range(1, page_size + 1))
        try:
            return not bytes(last).translate(None, valid)
        except ValueError:  # an entry outside 0..255
            return False
    return min(last) >= 1 and max(last) <= page_size


def check_last_page_len(name, last, indptr, page_size):
    """Each request with pages holds 1..page_size tokens in its last page. The values of an
    int32 tensor's copy (an array.array) are left to kiln_plan_schedule, as in check_indptr."""
    if len(last) != len(indptr) - 1:
        raise ValueError(f"{name} has {len(last)} entries; the batch is {len(indptr) - 1}")
    if not last or type(last) is array.array or _all_in_pages(last, page_size):
        return
    for b, n in enumerate(last):
        if indptr[b + 1] > indptr[b] and not 1 <= n <= page_size:
            raise ValueError(
                f"{name}[{b}] = {n}: request {b} has pages, so its last page holds 1.."
                f"{page_size} tokens (page_size)"
            )


def _count(x):
    """Entries of a 1-D tensor or sequence, without copying a device tensor."""
    if hasattr(x, "numel"):
        return int(x.numel())
    return len(x)


class Plan:
    """A kiln_plan: one batch kernel, one workspace (and optionally a shared scratch buffer),
    the schedule of the last plan().

    Plan(kernel, num_qo_heads, page_size=0, max_batch=0, max_qo_tokens=0, fixed_split=0,
    no_split=False) takes the fields of kiln_plan_opts (kiln.h): max_batch > 0 is CUDA-graph
    mode, fixed_split > 0 batch-invariant mode. Not thread-safe (like kiln_plan); alive as long
    as its kernel's context.
    """

    _handle = None

    def __init__(self, kernel, num_qo_heads, page_size=0, max_batch=0, max_qo_tokens=0,
                 fixed_split=0, no_split=False):
        from .core import Kernel

        self._handle = None
        self.kernel = _check.instance(kernel, "Plan: kernel", Kernel)  # keeps the context alive
        nonneg = dict(lo=0, hi=_check.INT_MAX)
        self.opts = _lib.kiln_plan_opts(
            num_qo_heads=_check.integer(num_qo_heads, "Plan: num_qo_heads", **nonneg),
            page_size=_check.integer(page_size, "Plan: page_size", **nonneg),
            max_batch=_check.integer(max_batch, "Plan: max_batch", **nonneg),
            max_qo_tokens=_check.integer(max_qo_tokens, "Plan: max_qo_tokens", **nonneg),
            fixed_split=_check.integer(fixed_split, "Plan: fixed_split", **nonneg),
            no_split=int(_check.flag(no_split, "Plan: no_split")),
        )
        create = _lib.fn("kiln_plan_create")
        _lib.fn("kiln_plan_destroy")  # both or neither
        # the calls of every plan() and run(), bound once
        self._fn_plan = _lib.fn("kiln_plan_schedule")
        self._fn_plan_scratch = None  # kiln_plan_schedule_scratch, bound on first use
        self._schedule_addr = None  # its address (_schedule_address), once
        self._fn_run = _lib.fn("kiln_plan_run")
        self._shape = shape = _lib.kiln_batch_shape()  # refilled by each plan()
        self._shape_ref = ctypes.byref(shape)
        # its three int * fields as plain addresses, set without a ctypes.cast each
        self._shape_ptrs = [ctypes.c_void_p.from_buffer(shape, getattr(type(shape), f).offset)
                            for f in ("qo_indptr", "kv_indptr", "kv_last_page_len")]
        out = ctypes.c_void_p()
        with kernel._use() as (p, h):
            check(create(p, ctypes.byref(self.opts), ctypes.byref(out)), h)
            self._handle = out.value
            kernel.context._plans.add(self)

    def _use(self):
        """`with plan._use() as (plan handle, context handle):` for one call, holding the
        kernel's context (Context._use)."""
        return self.kernel.context._use(self._handles)

    def _handles(self, h):
        if self._handle is None:
            raise error_for(_lib.STATUS["INVALID_ARGUMENT"], "kiln: the plan is destroyed")
        return self._handle, h

    def _call(self, fn, *args):
        """fn(plan handle, *args) with the context held; raises on a failed status."""
        with self.kernel.context._use() as h:
            handle = self._handle
            if handle is None:
                raise error_for(_lib.STATUS["INVALID_ARGUMENT"], "kiln: the plan is destroyed")
            status = fn(handle, *args)
            if status:
                check(status, h)

    def close(self):
        """kiln_plan_destroy. Idempotent. Only when no run of this plan is still in flight
        (or captured in a graph that may replay). Closing the context destroys its plans."""
        try:
            with self.kernel._use():
                self._destroy()
        except KilnError:  # the context is closed, and its close() destroyed this plan
            self._handle = None

    def _destroy(self):
        """kiln_plan_destroy, with the context held (by close() here or Context.close)."""
        handle, self._handle = self._handle, None
        if handle:
            _lib.fn("kiln_plan_destroy")(handle)

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def workspace_size(self, batch, total_qo=None):
        """kiln_plan_workspace_size: bytes of workspace a plan of `batch` requests and
        `total_qo` query rows (decode: batch) uses at most (a smaller one splits less)."""
        b = _check.integer(batch, "workspace_size: batch", 0, _check.INT_MAX)
        total = b if total_qo is None else _check.integer(total_qo, "workspace_size: total_qo",
                                                          0, _check.INT_MAX)
        out = ctypes.c_size_t()
        self._call(_lib.fn("kiln_plan_workspace_size"), b, total, ctypes.byref(out))
        return out.value

    def workspace_sizes(self, batch, total_qo=None):
        """kiln_plan_workspace_sizes: (schedule bytes, scratch bytes) of that workspace, the two
        buffers plan(..., scratch=) takes; they add up to workspace_size()."""
        b = _check.integer(batch, "workspace_sizes: batch", 0, _check.INT_MAX)
        total = b if total_qo is None else _check.integer(total_qo, "workspace_sizes: total_qo",
                                                          0, _check.INT_MAX)
        sched, scratch = ctypes.c_size_t(), ctypes.c_size_t()
        self._call(_lib.fn("kiln_plan_workspace_sizes"), b, total, ctypes.byref(sched),
                   ctypes.byref(scratch))
        return sched.value, scratch.value

    def plan(self, kv_indptr, workspace, workspace_bytes, stream=None, qo_indptr=None,
             kv_last_page_len=None, scratch=None, scratch_bytes=0):
        """kiln_plan_schedule: kv_indptr [B + 1] (ragged: token offsets; paged: offsets into the
        page ids), qo_indptr [B + 1] (prefill; None for decode), kv_last_page_len [B] (paged);
        host sequences. workspace is a device pointer (int) of workspace_bytes bytes; the
        schedule is copied there asynchronously on `stream`. With scratch (a device pointer of
        scratch_bytes bytes, 0 for none): kiln_plan_schedule_scratch, the split-KV partial
        states in scratch, which plans whose runs are ordered on one stream may share, and only
        the schedule in workspace (workspace_sizes())."""
        kv, kv_src = host_array(kv_indptr, "kv_indptr")
        qo, qo_src = (None, None) if qo_indptr is None else host_array(qo_indptr, "qo_indptr")
        last, last_src = ((None, None) if kv_last_page_len is None
                          else host_array(kv_last_page_len, "kv_last_page_len"))
        if not kv:
            raise ValueError("kv_indptr must have batch + 1 entries (at least one)")
        batch = len(kv) - 1
        if qo is not None and len(qo) != batch + 1:
            raise ValueError(f"qo_indptr has {len(qo)} entries; kv_indptr says batch {batch}, "
                             f"so {batch + 1}")
        if last is not None and len(last) != batch:
            raise ValueError(f"kv_last_page_len has {len(last)} entries; the batch is {batch}")
        ws = _check.integer(workspace, "plan: workspace", 0, _check.UINT64_MAX)
        ws_bytes = _check.integer(workspace_bytes, "plan: workspace_bytes", 0, _check.UINT64_MAX)
        s = _check.stream(stream, "plan: stream")
        if scratch is not None:
            scratch = _check.integer(scratch, "plan: scratch", 0, _check.UINT64_MAX)
            scratch_bytes = _check.integer(scratch_bytes, "plan: scratch_bytes", 0,
                                           _check.UINT64_MAX)
        self._plan_sources(batch, qo_src, kv_src, last_src, ws, ws_bytes, s, scratch,
                           scratch_bytes)

    def _schedule_address(self):
        """The address of kiln_plan_schedule_scratch as this plan calls it (kiln/hot.c's
        replan calls it there), or 0 when that is not a C function (pyhost.py's stubs)."""
        addr = self._schedule_addr
        if addr is None:
            fn = self._fn_plan_scratch
            if fn is None:
                fn = self._fn_plan_scratch = _lib.fn("kiln_plan_schedule_scratch")
            ok = isinstance(fn, ctypes._CFuncPtr)
            addr = self._schedule_addr = ctypes.cast(fn, ctypes.c_void_p).value if ok else 0
        return addr

    def _plan_sources(self, batch, qo, kv, last, workspace, workspace_bytes, stream,
                      scratch=None, scratch_bytes=0):
        """kiln_plan_schedule (or with scratch not None, kiln_plan_schedule_scratch) on checked
        values: host_array sources (alive across the call, which reads them), int device
        pointers and sizes, a CUstream int or None."""
        self._shape.batch = batch
        p_qo, p_kv, p_last = self._shape_ptrs
        p_qo.value, p_kv.value, p_last.value = c_address(qo), c_address(kv), c_address(last)
        if scratch is None:
            self._call(self._fn_plan, self._shape_ref, workspace, workspace_bytes, stream)
            return
        fn = self._fn_plan_scratch
        if fn is None:
            fn = self._fn_plan_scratch = _lib.fn("kiln_plan_schedule_scratch")
        self._call(fn, self._shape_ref, workspace, workspace_bytes, scratch, scratch_bytes,
                   stream)

    @property
    def info(self):
        """PlanInfo of the last plan() (kiln_plan_describe)."""
        i = _lib.kiln_plan_info()
        with self._use() as (p, h):
            check(_lib.fn("kiln_plan_describe")(p, ctypes.byref(i)), h)
        return PlanInfo(batch=i.batch, items=i.items, grid=i.grid, kv_chunk=i.kv_chunk,
                        split_items=i.split_items, merge_tasks=i.merge_tasks,
                        max_item_keys=i.max_item_keys, total_keys=i.total_keys)

    def run(self, args, stream=None):
        """kiln_plan_run with a filled kiln.BatchArgs on `stream` (no allocation, no
        synchronisation: safe inside a CUDA graph capture)."""
        _check.instance(args, "run: args", _lib.kiln_batch_args)
        s = _check.stream(stream, "run: stream")
        self._call(self._fn_run, ctypes.byref(args), s)

    def __repr__(self):
        o = self.opts
        state = "destroyed" if self._handle is None else self.kernel.variant.spec
        return (f"<kiln.Plan H={o.num_qo_heads} page_size={o.page_size} max_batch={o.max_batch} "
                f"fixed_split={o.fixed_split} {state!r}>")
