"""plan.py — kiln_plan from Python: the raw batch API under the FlashInfer-shaped wrappers.

A Plan belongs to one loaded batch kernel (kv=ragged or kv=paged) and one device workspace.
plan() takes the batch as host integer sequences (lists, tuples, or anything with .tolist()),
checks them, and calls kiln_batch_plan, which writes the schedule into the workspace with one
asynchronous copy on the stream; run() launches kiln_batch_run with a filled kiln.BatchArgs.
Nothing here needs torch: device memory is passed as integer pointers. batch.py builds the
torch wrappers on top of it.

The batch functions are bound lazily (_lib.fn): with a libkiln.so older than the batch API,
creating a Plan raises KilnLibraryError saying so; the rest of the package still works.
"""

import ctypes
import dataclasses

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
    merge_tasks: int  # (request, query tile) groups the merge kernel combines
    max_item_keys: int  # keys of the longest item
    total_keys: int  # keys over all items


def host_ints(x, name, lo=_check.INT_MIN, hi=_check.INT_MAX):
    """A 1-D sequence of C ints from a list, tuple, range, numpy array or torch tensor (a CUDA
    tensor is copied to the host, which synchronises); each entry an integer within [lo, hi]
    (_check.integer: no floats, bools or strings). None stays None."""
    if x is None:
        return None
    if hasattr(x, "tolist") and not isinstance(x, (list, tuple)):
        if hasattr(x, "detach"):  # torch: to the host once
            x = x.detach()
            if getattr(x, "is_cuda", False):
                x = x.cpu()
        x = x.tolist()
    if isinstance(x, (str, bytes, bytearray)) or not hasattr(x, "__iter__"):
        raise TypeError(f"{name} must be a 1-D sequence of integers, not {type(x).__name__}")
    return [_check.integer(v, f"{name}[{i}]", lo, hi) for i, v in enumerate(x)]


def _c_ints(values):
    if values is None:
        return None
    arr = (ctypes.c_int * max(len(values), 1))(*values)
    return arr


class Plan:
    """A kiln_plan: one batch kernel, one workspace, the schedule of the last plan().

    Plan(kernel, num_qo_heads, page_size=0, max_batch=0, max_qo_tokens=0, fixed_split=0,
    no_split=False) takes the fields of kiln_plan_opts (kiln.h): max_batch > 0 is CUDA-graph
    mode, fixed_split > 0 batch-invariant mode. Not thread-safe (like kiln_plan); alive as long
    as its kernel's context.
    """

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
        `total_qo` query rows (decode: batch) may need."""
        b = _check.integer(batch, "workspace_size: batch", 0, _check.INT_MAX)
        total = b if total_qo is None else _check.integer(total_qo, "workspace_size: total_qo",
                                                          0, _check.INT_MAX)
        n = ctypes.c_size_t()
        with self._use() as (p, h):
            check(_lib.fn("kiln_plan_workspace_size")(p, b, total, ctypes.byref(n)), h)
        return n.value

    def plan(self, kv_indptr, workspace, workspace_bytes, stream=None, qo_indptr=None,
             kv_last_page_len=None):
        """kiln_batch_plan: kv_indptr [B + 1] (ragged: token offsets; paged: offsets into the
        page ids), qo_indptr [B + 1] (prefill; None for decode), kv_last_page_len [B] (paged);
        host sequences. workspace is a device pointer (int) of workspace_bytes bytes; the
        schedule is copied there asynchronously on `stream`."""
        kv = host_ints(kv_indptr, "kv_indptr")
        qo = host_ints(qo_indptr, "qo_indptr")
        last = host_ints(kv_last_page_len, "kv_last_page_len")
        if not kv:
            raise ValueError("kv_indptr must have batch + 1 entries (at least one)")
        batch = len(kv) - 1
        if qo is not None and len(qo) != batch + 1:
            raise ValueError(f"qo_indptr has {len(qo)} entries; kv_indptr says batch {batch}, "
                             f"so {batch + 1}")
        if last is not None and len(last) != batch:
            raise ValueError(f"kv_last_page_len has {len(last)} entries; the batch is {batch}")
        arrays = [_c_ints(qo), _c_ints(kv), _c_ints(last)]  # alive across the call
        shape = _lib.kiln_batch_shape(batch=batch)
        if arrays[0] is not None:
            shape.qo_indptr = ctypes.cast(arrays[0], ctypes.POINTER(ctypes.c_int))
        shape.kv_indptr = ctypes.cast(arrays[1], ctypes.POINTER(ctypes.c_int))
        if arrays[2] is not None:
            shape.kv_last_page_len = ctypes.cast(arrays[2], ctypes.POINTER(ctypes.c_int))
        ws = _check.integer(workspace, "plan: workspace", 0, _check.UINT64_MAX)
        ws_bytes = _check.integer(workspace_bytes, "plan: workspace_bytes", 0, _check.UINT64_MAX)
        s = _check.stream(stream, "plan: stream")
        with self._use() as (p, h):
            check(_lib.fn("kiln_plan_schedule")(p, ctypes.byref(shape), ws, ws_bytes, s), h)

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
        """kiln_batch_run with a filled kiln.BatchArgs on `stream` (no allocation, no
        synchronisation: safe inside a CUDA graph capture)."""
        _check.instance(args, "run: args", _lib.kiln_batch_args)
        s = _check.stream(stream, "run: stream")
        with self._use() as (p, h):
            check(_lib.fn("kiln_plan_run")(p, ctypes.byref(args), s), h)

    def __repr__(self):
        o = self.opts
        state = "destroyed" if self._handle is None else self.kernel.variant.spec
        return (f"<kiln.Plan H={o.num_qo_heads} page_size={o.page_size} max_batch={o.max_batch} "
                f"fixed_split={o.fixed_split} {state!r}>")
