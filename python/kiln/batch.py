"""batch.py — FlashInfer-shaped batch attention over torch tensors: plan on the host, run on
the stream.

BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper and
BatchPrefillWithRaggedKVCacheWrapper take FlashInfer's constructor, plan() and run() arguments,
so porting an engine is a change of import. plan() copies the index arrays to the host once,
checks them, builds the kiln variant the arguments call for (batch_variant: kv=paged|ragged,
op, dtypes, head_dim, group, layout, mask, window, logits, lse, rope), gets its kernel from the
wrapper's Context (compiled once per spec, memoised here), and makes a kiln_plan on the
caller's float_workspace_buffer (plan.py). run() checks the tensors and launches
kiln_batch_run on torch's current stream: no allocation but the outputs, no synchronisation,
so a run can be captured in a CUDA graph and replayed after a new plan().

Differences from FlashInfer are listed in docs/python.md: the LSE is base 2 by default like
FlashInfer's (lse_base="e" gives kiln's natural log), fp8 KV scales go to the kernel, the
custom masks in CUDA-graph mode / MLA / sinks / other backends are refused (custom_mask and
packed_custom_mask work in plan()).

torch is imported only inside the functions; batch_variant and the argument checks of plan()
work without it.
"""

import contextlib
import functools
import math
import threading
import weakref

from . import _check, _lib
from .attention import (LOG2E, _stride, alibi_slopes, default_context, mask_data_name,
                        pos_encoding, request_mask_bits)
from .core import Context, Variant
from .errors import KilnWorkspaceError
from .plan import Plan, host_ints

# ---- dtypes, spelled without torch ---------------------------------------------------------------

# torch / FlashInfer spellings -> kiln's spec spelling.
_DTYPE_WORDS = {
    "float16": "f16", "half": "f16", "fp16": "f16", "f16": "f16",
    "bfloat16": "bf16", "bf16": "bf16",
    "float8_e4m3fn": "e4m3", "fp8_e4m3": "e4m3", "e4m3": "e4m3",
    "float8_e5m2": "e5m2", "fp8_e5m2": "e5m2", "e5m2": "e5m2",
}
FP8 = ("e4m3", "e5m2")


def dtype_word(dtype, what):
    """kiln's spelling ("f16", "bf16", "e4m3", "e5m2") of a torch dtype or a FlashInfer dtype
    string ("float16", "torch.bfloat16", "float8_e4m3fn", ...)."""
    if not isinstance(dtype, str) and type(dtype).__module__ != "torch":
        raise TypeError(f"{what} must be a torch dtype or its name (a str), not "
                        f"{type(dtype).__name__}")
    word = str(dtype)
    if word.startswith("torch."):
        word = word[len("torch."):]
    if word not in _DTYPE_WORDS:
        raise ValueError(
            f"{what}={dtype!r} is not supported: float16 or bfloat16 (and for kv_data_type also "
            "float8_e4m3fn or float8_e5m2)"
        )
    return _DTYPE_WORDS[word]


def _torch_dtype(torch, word):
    return {"f16": torch.float16, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn,
            "e5m2": torch.float8_e5m2}[word]


def _torch():
    from .attention import _torch as load

    return load()


def _layout(kv_layout):
    return _check.choice(kv_layout, "kv_layout", ("NHD", "HND"), fold="upper")


def _lse_base(base):
    return _check.choice(base, "lse_base", ("2", "e"))


def _positive_int(value, name):
    return _check.integer(value, name, 1, _check.INT_MAX)


# ---- the variant a plan calls for --------------------------------------------------------------


def batch_variant(op, kv, num_qo_heads, num_kv_heads, head_dim, *, kv_layout="NHD",
                  causal=False, pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None,
                  q_data_type="float16", kv_data_type=None, o_data_type=None, lse=True,
                  mask_data="none"):
    """The kiln.Variant a batch plan with these arguments runs (no torch, no GPU needed): use
    it to compile ahead (ctx.compile(v, arch=...), `kiln warm`). op "decode" | "prefill"; kv
    "paged" | "ragged"; the rest are the plan arguments of the FlashInfer wrappers. group is
    num_qo_heads / num_kv_heads; mask=causal iff causal (prefill); window=1 iff window_left >= 0;
    logits=softcap iff logits_soft_cap > 0, alibi for pos_encoding_mode="ALIBI"; rope=1 for
    "ROPE_LLAMA"; lse=1 unless lse=False; mask_data "none" | "bitmask" (a prefill plan's
    custom_mask) | "bsr". Raises ValueError naming the argument."""
    op = _check.choice(op, "op", ("decode", "prefill"))
    kv = _check.choice(kv, "kv", ("paged", "ragged"))
    causal = _check.flag(causal, "causal")
    lse = _check.flag(lse, "lse")
    H = _positive_int(num_qo_heads, "num_qo_heads")
    H_KV = _positive_int(num_kv_heads, "num_kv_heads")
    D = _positive_int(head_dim, "head_dim")
    if H % H_KV:
        raise ValueError(f"num_qo_heads={H} must be a multiple of num_kv_heads={H_KV}")
    layout = _layout(kv_layout).lower()
    mode = pos_encoding(pos_encoding_mode)
    cap = _check.real(logits_soft_cap, "logits_soft_cap", none=True) or 0.0
    if cap < 0:
        raise ValueError(f"logits_soft_cap={logits_soft_cap}: must be > 0 (or None / 0 for none)")
    if mode == "ALIBI" and cap > 0:
        raise NotImplementedError(
            "kiln applies one built-in logits transform per kernel: soft-cap and ALiBi together "
            "are not supported yet"
        )
    q = dtype_word(q_data_type, "q_data_type")
    if q in FP8:
        raise NotImplementedError(
            f"q_data_type={q_data_type}: kiln takes fp8 keys and values, not fp8 queries"
        )
    k = q if kv_data_type is None else dtype_word(kv_data_type, "kv_data_type")
    if k != q and k not in FP8:
        raise ValueError(
            f"kv_data_type={kv_data_type} differs from q_data_type={q_data_type}: only fp8 KV "
            "(float8_e4m3fn, float8_e5m2) may differ from q"
        )
    o = q if o_data_type is None else dtype_word(o_data_type, "o_data_type")
    if o in FP8:
        raise ValueError(f"o_data_type={o_data_type}: must be float16 or bfloat16")
    window_left = _check.integer(window_left, "window_left", none=True)
    if window_left is None:
        window_left = -1
    logits = "alibi" if mode == "ALIBI" else ("softcap" if cap > 0 else "none")
    mask_data = _check.choice(mask_data, "mask_data", ("none", "bitmask", "bsr"))
    return Variant(op=op, q_dtype=q, kv_dtype=k, out_dtype=o, head_dim=D, group=H // H_KV,
                   layout=layout, mask="causal" if causal and op == "prefill" else "none",
                   window=window_left >= 0, logits=logits, lse=lse, kv=kv,
                   rope=mode == "ROPE_LLAMA", mask_data=mask_data)


# ---- host checks of the index arrays -----------------------------------------------------------


def _request_kv_lens(kv_indptr, last_page_len, page_size):
    """Keys of each request: the indptr's differences (ragged), or (pages - 1) * page_size +
    last page's length (paged; last_page_len given)."""
    n = [kv_indptr[b + 1] - kv_indptr[b] for b in range(len(kv_indptr) - 1)]
    if last_page_len is None:
        return n
    return [(p - 1) * page_size + last_page_len[b] if p else 0 for b, p in enumerate(n)]


def check_indptr(name, values, batch=None):
    """indptr arrays: batch + 1 entries, starting at 0, never decreasing."""
    if not values:
        raise ValueError(f"{name} is empty: it needs batch + 1 entries (at least [0])")
    if batch is not None and len(values) != batch + 1:
        raise ValueError(f"{name} has {len(values)} entries; batch {batch} needs {batch + 1}")
    if values[0] != 0:
        raise ValueError(f"{name}[0] = {values[0]}: must be 0")
    for b in range(1, len(values)):
        if values[b] < values[b - 1]:
            raise ValueError(
                f"{name}[{b}] = {values[b]} < {name}[{b - 1}] = {values[b - 1]}: an indptr "
                f"never decreases (request {b - 1})"
            )


def check_last_page_len(name, last, indptr, page_size):
    """Each request with pages holds 1..page_size tokens in its last page."""
    if len(last) != len(indptr) - 1:
        raise ValueError(f"{name} has {len(last)} entries; the batch is {len(indptr) - 1}")
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


# ---- tensor checks -----------------------------------------------------------------------------


def _check_tensor(torch, name, t, ndim, device, dtype=None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}; the plan's workspace is on {device}")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name} has dtype {t.dtype}; the plan says {dtype}")
    if t.numel() == 0:
        return
    if t.stride(-1) != 1 and t.size(-1) > 1:
        raise ValueError(f"{name}: the last (head_dim) dimension must be contiguous, "
                         f"got strides {t.stride()}")
    if t.data_ptr() % 16:
        raise ValueError(f"{name}: data must be 16-byte aligned (data_ptr 0x{t.data_ptr():x})")
    item = t.element_size()
    for d in range(ndim - 1):
        if t.size(d) > 1 and (t.stride(d) <= 0 or (t.stride(d) * item) % 16):
            raise ValueError(f"{name}: stride {t.stride(d)} of dim {d} must be positive and a "
                             f"multiple of 16 bytes (strides {t.stride()}); call .contiguous()")


def _unpack_paged(torch, paged_kv_cache, layout):
    """(k, v) page pools, 4-D, from FlashInfer's forms: a tuple of two [pages, P, H_KV, D]
    (NHD) / [pages, H_KV, P, D] (HND) tensors, or one [pages, 2, ...] tensor; 3-D / 4-D forms
    mean page_size 1."""
    page_dim = -3 if layout == "NHD" else -2
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise ValueError(f"paged_kv_cache as a tuple must be (k_cache, v_cache), got "
                             f"{len(paged_kv_cache)} items")
        k, v = paged_kv_cache
        out = []
        for name, t in (("k_cache", k), ("v_cache", v)):
            if not isinstance(t, torch.Tensor) or t.dim() not in (3, 4):
                raise ValueError(f"{name} must be a 4-D tensor (3-D for page_size 1), got "
                                 f"{getattr(t, 'shape', type(t).__name__)}")
            out.append(t if t.dim() == 4 else t.unsqueeze(page_dim))
        return out[0], out[1]
    if isinstance(paged_kv_cache, torch.Tensor):
        t = paged_kv_cache
        if t.dim() not in (4, 5) or t.size(1) != 2:
            raise ValueError(f"paged_kv_cache as one tensor must be [pages, 2, ...] with 5 dims "
                             f"(4 for page_size 1), got shape {tuple(t.shape)}")
        if t.dim() == 4:
            t = t.unsqueeze(page_dim)
        return t[:, 0], t[:, 1]
    raise TypeError(f"paged_kv_cache must be a tensor or a (k_cache, v_cache) tuple, not "
                    f"{type(paged_kv_cache).__name__}")


@contextlib.contextmanager
def _on_device(torch, device):
    if device.index is None or device.index == torch.cuda.current_device():
        yield
        return
    with torch.cuda.device(device):
        yield


def _float_scale(value, name):
    f = _check.real(value, name, none=True)  # a one-element tensor is read (a synchronisation)
    if f is None:
        return 1.0
    if not f > 0 or math.isinf(f):
        raise ValueError(f"{name}={value}: must be a finite value > 0")
    return f


# ---- the shared machinery ----------------------------------------------------------------------


class _WorkspaceClaims:
    """Which wrapper planned last over each byte range of the float workspaces. A kiln plan
    keeps its schedule in its workspace, so once another wrapper has planned over a wrapper's
    range, that wrapper's run() would launch on the other's schedule: it raises instead
    (FlashInfer's wrappers may share one float workspace; kiln's may not). Owners are held
    weakly: a wrapper that is gone claims nothing. Captured CUDA graphs replay without run():
    a graph whose workspace another wrapper plans over is not caught here."""

    def __init__(self):
        self._lock = threading.Lock()
        self._gen = 0
        self._claims = weakref.WeakKeyDictionary()  # owner -> (device, start, end, generation)

    def claim(self, owner, device, start, nbytes):
        """owner planned into [start, start + nbytes) of device's memory, after every claim
        made so far."""
        with self._lock:
            self._gen += 1
            self._claims[owner] = (device, start, start + nbytes, self._gen)

    def overtaken_by(self, owner):
        """The wrapper that planned over owner's range after owner did, or None."""
        with self._lock:
            mine = self._claims.get(owner)
            if mine is None:
                return None
            dev, a, b, g = mine
            for other, (d2, a2, b2, g2) in self._claims.items():
                if other is not owner and d2 == dev and g2 > g and a2 < b and a < b2:
                    return other
        return None


_CLAIMS = _WorkspaceClaims()


class _State:
    """What plan() decided and run() needs."""

    __slots__ = ("variant", "plan", "H", "H_KV", "D", "page_size", "batch", "total_qo",
                 "total_kv", "sm_scale", "softcap", "window_left", "rope_scale", "rope_theta",
                 "q_dtype", "kv_dtype", "o_dtype", "indices", "slopes", "mask_bits")


class _BatchWrapper:
    """plan/run over a kiln_plan; the three public wrappers fill in the shapes."""

    _op = None  # "decode" | "prefill"
    _kv = None  # "paged" | "ragged"

    def __init__(self, float_workspace_buffer, kv_layout, use_cuda_graph, indices_buf,
                 max_batch, max_qo_tokens, context, lse_base):
        self._kv_layout = _layout(kv_layout)
        self._lse_base = _lse_base(lse_base)
        self._use_cuda_graph = _check.flag(use_cuda_graph, "use_cuda_graph")
        self._context_arg = _check.instance(context, "context", Context, none=True)
        self._indices_buf = indices_buf
        self._max_batch = max(int(max_batch or 0), 0)  # a buffer's length, not an argument
        self._max_qo_tokens = _check.integer(max_qo_tokens, "max_qo_tokens", 0, _check.INT_MAX,
                                             none=True) or 0
        self._kernels = {}  # Variant -> kiln.Kernel (compiled once per spec)
        self._plans = {}  # (Variant, kiln_plan_opts fields) -> kiln.Plan
        self._slopes = {}  # H -> ALiBi slopes, float32 [H]
        self._state = None
        self._set_workspace(float_workspace_buffer)
        if self._use_cuda_graph and self._max_batch < 1:
            raise ValueError(
                f"{type(self).__name__}: use_cuda_graph=True needs the fixed-size index buffers "
                "(their lengths bound the batch of every later plan)"
            )

    def _set_workspace(self, buf):
        if buf is None or not hasattr(buf, "data_ptr"):
            raise TypeError("float_workspace_buffer must be a CUDA tensor (torch.uint8 is usual), "
                            f"not {type(buf).__name__}")
        self._float_workspace_buffer = buf
        self._workspace_bytes = int(buf.numel()) * int(buf.element_size())
        self.device = getattr(buf, "device", None)

    @property
    def is_cuda_graph_enabled(self):
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None,
                               *args, **kwargs):
        """Use another float workspace (int_workspace_buffer is accepted and ignored: kiln's
        schedule lives in the float workspace). The next run needs a new plan()."""
        self._set_workspace(float_workspace_buffer)
        self._plans.clear()
        self._state = None

    def end_forward(self):
        """Nothing to release (FlashInfer's old API)."""

    @property
    def context(self):
        """The kiln.Context kernels come from: the one given, else the default context of the
        workspace's device."""
        if self._context_arg is not None:
            return self._context_arg
        return default_context(self.device)

    @property
    def variant(self):
        """The kiln.Variant of the last plan() (None before one)."""
        return self._state.variant if self._state else None

    @property
    def plan_info(self):
        """kiln.PlanInfo of the last plan() (kiln_plan_describe)."""
        if self._state is None:
            raise RuntimeError(f"{type(self).__name__}: call plan() first")
        return self._state.plan.info

    def _kernel(self, variant):
        k = self._kernels.get(variant)
        if k is None:
            k = self.context.kernel(variant)
            self._kernels[variant] = k
        return k

    def _plan_common(self, *, variant, H, H_KV, D, page_size, kv_indptr, qo_indptr,
                     last_page_len, indices, fixed_split_size, disable_split_kv, sm_scale,
                     logits_soft_cap, window_left, rope_scale, rope_theta, pos_encoding_mode,
                     total_kv, custom_mask=None, packed_custom_mask=None):
        """Everything after the host checks: kernel, plan object, workspace, the custom mask
        packed into kiln's bitmask, kiln_batch_plan."""
        self._state = None  # a failed plan leaves nothing to run
        masked = custom_mask is not None or packed_custom_mask is not None
        if masked and self._use_cuda_graph:
            raise NotImplementedError("custom masks in CUDA-graph mode: the mask buffer's address "
                                      "would change with every plan")
        sm_scale = _check.real(sm_scale, "sm_scale", none=True)
        rope_scale = _check.real(rope_scale, "rope_scale", none=True)
        rope_theta = _check.real(rope_theta, "rope_theta", none=True)
        fixed_split_size = _check.integer(fixed_split_size, "fixed_split_size", none=True)
        window_left = _check.integer(window_left, "window_left", none=True)  # an int from here
        disable_split_kv = _check.flag(disable_split_kv, "disable_split_kv")
        scale = (1.0 / math.sqrt(D)) if sm_scale is None else sm_scale
        if not scale > 0 or math.isinf(scale):
            raise ValueError(f"sm_scale={sm_scale}: must be a finite value > 0")
        if self._kv == "paged" and indices is None:
            raise ValueError("the page ids (indices) are missing")
        batch = len(kv_indptr) - 1
        total_qo = batch if qo_indptr is None else qo_indptr[-1]
        if self._use_cuda_graph:
            if batch > self._max_batch:
                raise ValueError(f"batch {batch} exceeds {self._max_batch}, the bound the CUDA-"
                                 "graph buffers given to the constructor set")
            if self._op == "prefill" and not self._max_qo_tokens:
                self._max_qo_tokens = max(total_qo, 1)  # FlashInfer: the first plan bounds it
            if self._op == "prefill" and total_qo > self._max_qo_tokens:
                raise ValueError(f"{total_qo} query rows exceed {self._max_qo_tokens}, the bound "
                                 "of CUDA-graph mode (the first plan's, or max_qo_tokens=)")
        split = 0
        if fixed_split_size is not None and fixed_split_size > 0:
            split = fixed_split_size * (page_size if self._kv == "paged" else 1)
            if split > _check.INT_MAX:
                raise ValueError(f"fixed_split_size={fixed_split_size} pages of {page_size} "
                                 f"tokens is past kiln's bound ({_check.INT_MAX} tokens)")
        opts = dict(num_qo_heads=H, page_size=page_size if self._kv == "paged" else 0,
                    max_batch=self._max_batch if self._use_cuda_graph else 0,
                    max_qo_tokens=self._max_qo_tokens if self._use_cuda_graph else 0,
                    fixed_split=split, no_split=disable_split_kv)
        torch = _torch()
        device = self.device
        if not isinstance(self._float_workspace_buffer, torch.Tensor) or device.type != "cuda":
            raise ValueError(f"float_workspace_buffer must be a CUDA tensor, got one on {device}")
        with _on_device(torch, device):
            kernel = self._kernel(variant)
            key = (variant,) + tuple(sorted(opts.items()))
            plan = self._plans.get(key)
            if plan is None:
                plan = Plan(kernel, **opts)
                self._plans[key] = plan
            if self._use_cuda_graph:
                need_b = self._max_batch
                need_q = self._max_batch if self._op == "decode" else self._max_qo_tokens
            else:
                need_b, need_q = batch, total_qo
            need = plan.workspace_size(need_b, need_q)
            if need > self._workspace_bytes:
                raise KilnWorkspaceError(
                    _lib.STATUS["WORKSPACE"],
                    f"kiln: {self._op} plan of {need_b} requests and {need_q} query rows on "
                    f"{variant.spec}: float_workspace_buffer has {self._workspace_bytes} bytes, "
                    f"kiln_plan_workspace_size says {need}",
                )
            dev_indices = None
            if self._kv == "paged":
                dev_indices = self._device_indices(torch, indices, kv_indptr[-1])
            slopes = None
            if variant.logits == "alibi":  # one tensor per H: captured runs keep its address
                slopes = self._slopes.get(H)
                if slopes is None:
                    slopes = self._slopes[H] = alibi_slopes(H, device)
            mask_bits = None
            if masked:
                # FlashInfer's custom_mask: the requests' bool [qo_len, kv_len] masks flattened
                # back to back, which is kiln's per-request bitmask layout once packed; its
                # packed_custom_mask: each request packed on its own from a byte boundary
                kv_lens = _request_kv_lens(kv_indptr, last_page_len, page_size)
                sizes = [(qo_indptr[b + 1] - qo_indptr[b]) * kv_lens[b] for b in range(batch)]
                mask_bits = request_mask_bits(torch, custom_mask, packed_custom_mask, sizes, device)
            stream = torch.cuda.current_stream(device).cuda_stream
            plan.plan(kv_indptr, self._float_workspace_buffer.data_ptr(), self._workspace_bytes,
                      stream, qo_indptr=qo_indptr, kv_last_page_len=last_page_len)
        st = _State()
        st.variant, st.plan = variant, plan
        st.H, st.H_KV, st.D, st.page_size = H, H_KV, D, page_size
        st.batch, st.total_qo, st.total_kv = batch, total_qo, total_kv
        st.sm_scale = scale
        st.softcap = float(logits_soft_cap or 0.0)  # checked by batch_variant
        st.window_left = window_left if window_left is not None and window_left >= 0 else -1
        rope = variant.rope
        st.rope_scale = rope_scale if rope and rope_scale is not None else 0.0
        st.rope_theta = rope_theta if rope and rope_theta is not None else 0.0
        st.q_dtype = _torch_dtype(torch, variant.q_dtype)
        st.kv_dtype = _torch_dtype(torch, variant.kv_dtype)
        st.o_dtype = _torch_dtype(torch, variant.out_dtype)
        st.indices, st.slopes, st.mask_bits = dev_indices, slopes, mask_bits
        self._state = st
        _CLAIMS.claim(self, str(device), self._float_workspace_buffer.data_ptr(),
                      self._workspace_bytes)

    def _device_indices(self, torch, indices, used):
        """The page ids as an int32 device tensor at a fixed address in CUDA-graph mode (copied
        into the constructor's buffer), else the caller's tensor (converted once if needed)."""
        if used > _count(indices):
            raise ValueError(f"the indptr says {used} page ids, the indices hold {_count(indices)}")
        if isinstance(indices, torch.Tensor):
            t = indices.reshape(-1)
            if t.dtype != torch.int32 or t.device != self.device or not t.is_contiguous():
                t = t.to(device=self.device, dtype=torch.int32).contiguous()
        else:
            t = torch.tensor(host_ints(indices, "indices"), dtype=torch.int32, device=self.device)
        if not self._use_cuda_graph:
            return t
        buf = self._indices_buf
        if used > buf.numel():
            raise ValueError(f"{used} page ids exceed the {buf.numel()} of the CUDA-graph "
                             "indices buffer")
        if used and buf.data_ptr() != t.data_ptr():
            buf[:used].copy_(t[:used], non_blocking=True)
        return buf

    def _run(self, q, k, v, *, rows_dim_doc, k_strides, out, lse, return_lse, q_scale, k_scale,
             v_scale, window_left):
        st = self._require_plan()
        other = _CLAIMS.overtaken_by(self)
        if other is not None:
            raise RuntimeError(
                f"{type(self).__name__}.run(): {type(other).__name__} planned into this wrapper's "
                "float_workspace_buffer after its plan(); kiln keeps a plan's schedule in its "
                "workspace, so wrappers cannot share one: give each its own buffer, or plan again")
        window_left = _check.integer(window_left, "run: window_left", none=True)
        return_lse = _check.flag(return_lse, "run: return_lse")
        torch = _torch()
        device = self.device
        if window_left is not None and window_left != st.window_left and not (
                window_left < 0 and st.window_left < 0):
            raise ValueError(f"run(window_left={window_left}) differs from plan(window_left="
                             f"{st.window_left}): the window is part of the planned kernel")
        _check_tensor(torch, "q", q, 3, device, st.q_dtype)
        rows = q.size(0)
        if tuple(q.shape[1:]) != (st.H, st.D):
            raise ValueError(f"q must be {rows_dim_doc}, [*, {st.H}, {st.D}], got "
                             f"{tuple(q.shape)}")
        if rows < st.total_qo or (rows != st.total_qo and not self._use_cuda_graph):
            raise ValueError(f"q has {rows} rows; the plan has {st.total_qo}")
        if out is None:
            out = torch.empty((rows, st.H, st.D), dtype=st.o_dtype, device=device)
        else:
            _check_tensor(torch, "out", out, 3, device, st.o_dtype)
            if tuple(out.shape) != (rows, st.H, st.D):
                raise ValueError(f"out must be {(rows, st.H, st.D)}, got {tuple(out.shape)}")
        if return_lse and not st.variant.lse:
            raise ValueError("return_lse=True, but plan() was called with lse=False")
        if lse is not None:
            if (not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (rows, st.H)
                    or lse.dtype != torch.float32 or lse.device != device
                    or not lse.is_contiguous()):
                raise ValueError(f"lse must be a contiguous float32 tensor {(rows, st.H)} on "
                                 f"{device}, got {getattr(lse, 'shape', lse)}")
        elif st.variant.lse:
            lse = torch.empty((rows, st.H), dtype=torch.float32, device=device)

        fp8 = st.variant.kv_dtype in FP8
        qs, ks, vs = (_float_scale(q_scale, "q_scale"), _float_scale(k_scale, "k_scale"),
                      _float_scale(v_scale, "v_scale"))
        a = _lib.kiln_batch_args()
        a.q, a.k, a.v, a.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()
        a.lse = lse.data_ptr() if lse is not None else 0
        a.kv_indices = st.indices.data_ptr() if st.indices is not None else 0
        a.q_stride_n, a.q_stride_h = _stride(q, 0), _stride(q, 1)
        a.o_stride_n, a.o_stride_h = _stride(out, 0), _stride(out, 1)
        (a.k_stride_page, a.k_stride_n, a.k_stride_h), (
            a.v_stride_page, a.v_stride_n, a.v_stride_h) = k_strides
        a.workspace = self._float_workspace_buffer.data_ptr()
        a.workspace_bytes = self._workspace_bytes
        a.mask_bits = st.mask_bits.data_ptr() if st.mask_bits is not None else 0
        p = a.params
        p.sm_scale = st.sm_scale * qs * (1.0 if fp8 else ks)
        p.softcap = st.softcap
        p.window_left = max(st.window_left, 0)
        p.alibi_slopes = st.slopes.data_ptr() if st.slopes is not None else 0
        p.k_scale = ks if fp8 else 0.0
        p.v_scale = vs if fp8 else 0.0
        p.rope_scale, p.rope_theta = st.rope_scale, st.rope_theta
        with _on_device(torch, device):
            st.plan.run(a, torch.cuda.current_stream(device).cuda_stream)
        if not fp8 and vs != 1.0:
            out.mul_(vs)
        if lse is not None and self._lse_base == "2":
            lse.mul_(LOG2E)  # in place: kiln writes natural-log LSE
        return (out, lse) if return_lse else out

    def _require_plan(self):
        if self._state is None:
            raise RuntimeError(f"{type(self).__name__}: call plan() before run()")
        return self._state

    def _paged_strides(self, torch, paged_kv_cache):
        st = self._require_plan()
        k, v = _unpack_paged(torch, paged_kv_cache, self._kv_layout)
        nhd = self._kv_layout == "NHD"
        want = (st.page_size, st.H_KV, st.D) if nhd else (st.H_KV, st.page_size, st.D)
        doc = "[pages, page_size, H_KV, D]" if nhd else "[pages, H_KV, page_size, D]"
        for name, t in (("k_cache", k), ("v_cache", v)):
            _check_tensor(torch, name, t, 4, self.device, st.kv_dtype)
            if tuple(t.shape[1:]) != want:
                raise ValueError(f"{name} must be {doc} = [*, {', '.join(map(str, want))}] "
                                 f"({self._kv_layout}), got {tuple(t.shape)}")
        n_dim, h_dim = (1, 2) if nhd else (2, 1)
        strides = tuple((_stride(t, 0), _stride(t, n_dim), _stride(t, h_dim)) for t in (k, v))
        return k, v, strides


# ---- the wrappers ------------------------------------------------------------------------------


class BatchDecodeWithPagedKVCacheWrapper(_BatchWrapper):
    """Decode for a batch of requests over a paged KV cache: FlashInfer's wrapper of the same
    name. One query row per request (q [B, H, D]); request b owns pages
    indices[indptr[b] .. indptr[b + 1]) of the page pool, the last holding last_page_len[b]
    tokens.

    BatchDecodeWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout="NHD",
    use_cuda_graph=False, use_tensor_cores=False, paged_kv_indptr_buffer=None,
    paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None, backend="auto",
    jit_args=None, *, context=None, lse_base="2"). float_workspace_buffer is a CUDA tensor
    (torch.uint8; 128 MB is FlashInfer's advice and plenty): kiln writes the schedule and the
    split-KV partials there. With use_cuda_graph=True the indices buffer (int32, fixed address)
    receives each plan's page ids and the length of the last_page_len (or indptr) buffer
    bounds the batch; a run captured in a graph replays correctly after any later plan within
    those bounds. use_tensor_cores, backend and jit_args are accepted and ignored. Extra
    keywords: context (a kiln.Context; default: the device's default context), lse_base
    ("2": FlashInfer's base-2 LSE; "e": kiln's natural log).
    """

    _op, _kv = "decode", "paged"

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 use_tensor_cores=False, paged_kv_indptr_buffer=None,
                 paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto", jit_args=None, *, context=None, lse_base="2"):
        use_cuda_graph = _check.flag(use_cuda_graph, "use_cuda_graph")
        max_batch = 0
        if use_cuda_graph:
            if paged_kv_indices_buffer is None:
                raise ValueError("use_cuda_graph=True needs paged_kv_indices_buffer (int32, the "
                                 "page ids every captured run reads)")
            if paged_kv_last_page_len_buffer is not None:
                max_batch = _count(paged_kv_last_page_len_buffer)
            elif paged_kv_indptr_buffer is not None:
                max_batch = _count(paged_kv_indptr_buffer) - 1
        self.use_tensor_cores = use_tensor_cores
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph,
                         paged_kv_indices_buffer, max_batch, 0, context, lse_base)

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
             page_size, pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None,
             q_data_type="float16", kv_data_type=None, o_data_type=None, data_type=None,
             sm_scale=None, rope_scale=None, rope_theta=None, non_blocking=True,
             block_tables=None, seq_lens=None, fixed_split_size=None, disable_split_kv=False,
             q_len_per_req=1, *, window_right=0, lse=True):
        """Plan the batch (FlashInfer's arguments). indptr [B + 1], indices [indptr[-1]]
        (int32 page ids), last_page_len [B]: tensors (any device) or lists; indptr and
        last_page_len are copied to the host here, once. q_data_type / kv_data_type /
        o_data_type: torch dtypes or their names; kv may be float8_e4m3fn / float8_e5m2.
        pos_encoding_mode "NONE" | "ROPE_LLAMA" (RoPE inside the kernel, rope_scale /
        rope_theta) | "ALIBI". fixed_split_size (in pages) cuts every request's keys into
        chunks of that many pages whatever the batch (batch-invariant output);
        disable_split_kv never splits. lse=False (kiln extra) drops the LSE output from the
        kernel. Not supported: block_tables / seq_lens, q_len_per_req != 1, window_right != 0
        (NotImplementedError)."""
        if block_tables is not None or seq_lens is not None:
            raise NotImplementedError("block_tables / seq_lens (trtllm-gen's form) are not "
                                      "supported: pass indptr, indices and last_page_len")
        if _check.integer(q_len_per_req, "q_len_per_req") != 1:
            raise NotImplementedError("q_len_per_req > 1: use BatchPrefillWithPagedKVCacheWrapper")
        if _check.integer(window_right, "window_right"):
            raise NotImplementedError("window_right != 0 is not supported")
        if data_type is not None:
            q_data_type = data_type
            kv_data_type = data_type if kv_data_type is None else kv_data_type
        page_size = _positive_int(page_size, "page_size")
        variant = batch_variant("decode", "paged", num_qo_heads, num_kv_heads, head_dim,
                                kv_layout=self._kv_layout, pos_encoding_mode=pos_encoding_mode,
                                window_left=window_left, logits_soft_cap=logits_soft_cap,
                                q_data_type=q_data_type, kv_data_type=kv_data_type,
                                o_data_type=o_data_type, lse=lse)
        kv_indptr = host_ints(indptr, "indptr")
        check_indptr("indptr", kv_indptr)
        last = host_ints(last_page_len, "last_page_len")
        check_last_page_len("last_page_len", last, kv_indptr, page_size)
        self._plan_common(
            variant=variant, H=int(num_qo_heads), H_KV=int(num_kv_heads), D=int(head_dim),
            page_size=page_size, kv_indptr=kv_indptr, qo_indptr=None, last_page_len=last,
            indices=indices, fixed_split_size=fixed_split_size,
            disable_split_kv=disable_split_kv, sm_scale=sm_scale,
            logits_soft_cap=logits_soft_cap, window_left=window_left, rope_scale=rope_scale,
            rope_theta=rope_theta, pos_encoding_mode=pos_encoding_mode, total_kv=None)

    begin_forward = plan

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None,
            lse=None, return_lse=False, enable_pdl=None, window_left=None, sinks=None):
        """Decode: q [B, H, D]; paged_kv_cache a (k_cache, v_cache) tuple of [pages, page_size,
        H_KV, D] (NHD) / [pages, H_KV, page_size, D] (HND) tensors, or one [pages, 2, ...]
        tensor. Returns o [B, H, D] (and lse [B, H], float32, base 2 unless lse_base="e").
        q_scale multiplies sm_scale; for fp8 KV k_scale / v_scale dequantise inside the
        kernel, otherwise k_scale multiplies sm_scale and v_scale multiplies o (FlashInfer's
        meaning). A tensor scale is read with float(), which synchronises: pass floats inside
        a CUDA graph. enable_pdl is ignored; sinks raise NotImplementedError."""
        if args:
            raise TypeError(f"run() takes no extra positional arguments (custom-kernel "
                            f"arguments are not supported), got {len(args)}")
        if sinks is not None:
            raise NotImplementedError("attention sinks are not supported")
        self._require_plan()
        torch = _torch()
        k, v, strides = self._paged_strides(torch, paged_kv_cache)
        return self._run(q, k, v, rows_dim_doc="[B, H, D]", k_strides=strides, out=out, lse=lse,
                         return_lse=return_lse, q_scale=q_scale, k_scale=k_scale,
                         v_scale=v_scale, window_left=window_left)

    forward = run
    run_return_lse = functools.partialmethod(run, return_lse=True)


class BatchPrefillWithPagedKVCacheWrapper(_BatchWrapper):
    """Prefill / append for a batch over a paged KV cache: FlashInfer's wrapper of the same
    name. Request b has query rows qo_indptr[b] .. qo_indptr[b + 1] of q [total_qo, H, D] and
    the pages of paged_kv_indices[paged_kv_indptr[b] .. paged_kv_indptr[b + 1]); with causal
    (bottom-right aligned) and the request's new tokens already in its last pages this is
    "append".

    BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout="NHD",
    use_cuda_graph=False, qo_indptr_buf=None, paged_kv_indptr_buf=None,
    paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None, custom_mask_buf=None,
    mask_indptr_buf=None, backend="auto", jit_args=None, jit_kwargs=None, *, context=None,
    lse_base="2", max_qo_tokens=None). In CUDA-graph mode the length of qo_indptr_buf (or
    paged_kv_last_page_len_buf) bounds the batch and the first plan's query rows bound later
    plans (as in FlashInfer) unless max_qo_tokens is given.
    """

    _op, _kv = "prefill", "paged"

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 qo_indptr_buf=None, paged_kv_indptr_buf=None, paged_kv_indices_buf=None,
                 paged_kv_last_page_len_buf=None, custom_mask_buf=None, mask_indptr_buf=None,
                 backend="auto", jit_args=None, jit_kwargs=None, *, context=None,
                 lse_base="2", max_qo_tokens=None):
        if custom_mask_buf is not None or mask_indptr_buf is not None:
            raise NotImplementedError("custom_mask_buf / mask_indptr_buf: custom masks are not "
                                      "supported in CUDA-graph mode (pass custom_mask to plan() "
                                      "without use_cuda_graph)")
        use_cuda_graph = _check.flag(use_cuda_graph, "use_cuda_graph")
        max_batch = 0
        if use_cuda_graph:
            if paged_kv_indices_buf is None:
                raise ValueError("use_cuda_graph=True needs paged_kv_indices_buf (int32, the "
                                 "page ids every captured run reads)")
            if qo_indptr_buf is not None:
                max_batch = _count(qo_indptr_buf) - 1
            elif paged_kv_last_page_len_buf is not None:
                max_batch = _count(paged_kv_last_page_len_buf)
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph,
                         paged_kv_indices_buf, max_batch, max_qo_tokens, context, lse_base)

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
             num_qo_heads, num_kv_heads, head_dim_qk, page_size, head_dim_vo=None,
             custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None,
             rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
             o_data_type=None, non_blocking=True, *, fixed_split_size=None,
             disable_split_kv=False, lse=True, **unsupported):
        """Plan the batch (FlashInfer's arguments; see BatchDecodeWithPagedKVCacheWrapper.plan
        for the shared ones). qo_indptr [B + 1] rows; causal is bottom-right aligned per
        request. custom_mask (bool, the requests' [qo_len, kv_len] masks flattened back to back)
        or packed_custom_mask (FlashInfer's segment_packbits of it, bitorder "little": each
        request from a byte boundary) AND with causal and the window; not in CUDA-graph mode.
        head_dim_vo must equal head_dim_qk; FlashInfer's other keywords (prefix_len_ptr,
        seq_lens, block_tables, ...) raise NotImplementedError;
        use_fp16_qk_reduction is ignored (kiln accumulates in fp32)."""
        _refuse_prefill_extras(head_dim_qk, head_dim_vo, unsupported)
        page_size = _positive_int(page_size, "page_size")
        variant = batch_variant("prefill", "paged", num_qo_heads, num_kv_heads, head_dim_qk,
                                kv_layout=self._kv_layout, causal=causal,
                                pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                                logits_soft_cap=logits_soft_cap, q_data_type=q_data_type,
                                kv_data_type=kv_data_type, o_data_type=o_data_type, lse=lse,
                                mask_data=mask_data_name(custom_mask, packed_custom_mask))
        qo = host_ints(qo_indptr, "qo_indptr")
        check_indptr("qo_indptr", qo)
        kv_indptr = host_ints(paged_kv_indptr, "paged_kv_indptr")
        check_indptr("paged_kv_indptr", kv_indptr, len(qo) - 1)
        last = host_ints(paged_kv_last_page_len, "paged_kv_last_page_len")
        check_last_page_len("paged_kv_last_page_len", last, kv_indptr, page_size)
        self._plan_common(
            variant=variant, H=int(num_qo_heads), H_KV=int(num_kv_heads), D=int(head_dim_qk),
            page_size=page_size, kv_indptr=kv_indptr, qo_indptr=qo, last_page_len=last,
            indices=paged_kv_indices, fixed_split_size=fixed_split_size,
            disable_split_kv=disable_split_kv, sm_scale=sm_scale,
            logits_soft_cap=logits_soft_cap, window_left=window_left, rope_scale=rope_scale,
            rope_theta=rope_theta, pos_encoding_mode=pos_encoding_mode, total_kv=None,
            custom_mask=custom_mask, packed_custom_mask=packed_custom_mask)

    begin_forward = plan

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None,
            lse=None, return_lse=False, enable_pdl=None, window_left=None, sinks=None):
        """Prefill: q [total_qo, H, D]; paged_kv_cache as for batch decode. Returns o
        [total_qo, H, D] (and lse [total_qo, H]); scales as in batch decode."""
        if args:
            raise TypeError(f"run() takes no extra positional arguments, got {len(args)}")
        if sinks is not None:
            raise NotImplementedError("attention sinks are not supported")
        self._require_plan()
        torch = _torch()
        k, v, strides = self._paged_strides(torch, paged_kv_cache)
        return self._run(q, k, v, rows_dim_doc="[total_qo, H, D]", k_strides=strides, out=out,
                         lse=lse, return_lse=return_lse, q_scale=q_scale, k_scale=k_scale,
                         v_scale=v_scale, window_left=window_left)

    forward = run
    run_return_lse = functools.partialmethod(run, return_lse=True)


class BatchPrefillWithRaggedKVCacheWrapper(_BatchWrapper):
    """Prefill for a batch whose keys and values are one ragged tensor: FlashInfer's wrapper
    of the same name. Request b has query rows qo_indptr[b] .. qo_indptr[b + 1] of q and key
    rows kv_indptr[b] .. kv_indptr[b + 1] of k, v [total_kv, H_KV, D] (NHD) or
    [H_KV, total_kv, D] (HND).

    BatchPrefillWithRaggedKVCacheWrapper(float_workspace_buffer, kv_layout="NHD",
    use_cuda_graph=False, qo_indptr_buf=None, kv_indptr_buf=None, custom_mask_buf=None,
    mask_indptr_buf=None, backend="auto", jit_args=None, jit_kwargs=None, *, context=None,
    lse_base="2", max_qo_tokens=None).
    """

    _op, _kv = "prefill", "ragged"

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 qo_indptr_buf=None, kv_indptr_buf=None, custom_mask_buf=None,
                 mask_indptr_buf=None, backend="auto", jit_args=None, jit_kwargs=None, *,
                 context=None, lse_base="2", max_qo_tokens=None):
        if custom_mask_buf is not None or mask_indptr_buf is not None:
            raise NotImplementedError("custom_mask_buf / mask_indptr_buf: custom masks are not "
                                      "supported in CUDA-graph mode (pass custom_mask to plan() "
                                      "without use_cuda_graph)")
        use_cuda_graph = _check.flag(use_cuda_graph, "use_cuda_graph")
        max_batch = 0
        if use_cuda_graph:
            buf = qo_indptr_buf if qo_indptr_buf is not None else kv_indptr_buf
            max_batch = _count(buf) - 1 if buf is not None else 0
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, None, max_batch,
                         max_qo_tokens, context, lse_base)

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk,
             head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal=False,
             pos_encoding_mode="NONE", use_fp16_qk_reduction=False, window_left=-1,
             logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None,
             q_data_type="float16", kv_data_type=None, o_data_type=None, non_blocking=True, *,
             fixed_split_size=None, disable_split_kv=False, lse=True, **unsupported):
        """Plan the batch (FlashInfer's arguments). qo_indptr, kv_indptr [B + 1] row offsets,
        copied to the host once. fixed_split_size is in tokens here (no pages)."""
        _refuse_prefill_extras(head_dim_qk, head_dim_vo, unsupported)
        variant = batch_variant("prefill", "ragged", num_qo_heads, num_kv_heads, head_dim_qk,
                                kv_layout=self._kv_layout, causal=causal,
                                pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                                logits_soft_cap=logits_soft_cap, q_data_type=q_data_type,
                                kv_data_type=kv_data_type, o_data_type=o_data_type, lse=lse,
                                mask_data=mask_data_name(custom_mask, packed_custom_mask))
        qo = host_ints(qo_indptr, "qo_indptr")
        check_indptr("qo_indptr", qo)
        kv = host_ints(kv_indptr, "kv_indptr")
        check_indptr("kv_indptr", kv, len(qo) - 1)
        self._plan_common(
            variant=variant, H=int(num_qo_heads), H_KV=int(num_kv_heads), D=int(head_dim_qk),
            page_size=1, kv_indptr=kv, qo_indptr=qo, last_page_len=None, indices=None,
            fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv,
            sm_scale=sm_scale, logits_soft_cap=logits_soft_cap, window_left=window_left,
            rope_scale=rope_scale, rope_theta=rope_theta,
            pos_encoding_mode=pos_encoding_mode, total_kv=kv[-1], custom_mask=custom_mask,
            packed_custom_mask=packed_custom_mask)

    begin_forward = plan

    def run(self, q, k, v, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None):
        """Prefill: q [total_qo, H, D]; k, v [total_kv, H_KV, D] (NHD) or [H_KV, total_kv, D]
        (HND). Returns o [total_qo, H, D] (and lse [total_qo, H])."""
        if args:
            raise TypeError(f"run() takes no extra positional arguments, got {len(args)}")
        st = self._require_plan()
        torch = _torch()
        nhd = self._kv_layout == "NHD"
        n_dim, h_dim = (0, 1) if nhd else (1, 0)
        for name, t in (("k", k), ("v", v)):
            _check_tensor(torch, name, t, 3, self.device, st.kv_dtype)
            if t.size(h_dim) != st.H_KV or t.size(2) != st.D or t.size(n_dim) < st.total_kv:
                doc = "[total_kv, H_KV, D]" if nhd else "[H_KV, total_kv, D]"
                raise ValueError(f"{name} must be {doc} with H_KV={st.H_KV}, D={st.D} and at "
                                 f"least {st.total_kv} rows, got {tuple(t.shape)}")
        strides = tuple((0, _stride(t, n_dim), _stride(t, h_dim)) for t in (k, v))
        return self._run(q, k, v, rows_dim_doc="[total_qo, H, D]", k_strides=strides, out=out,
                         lse=lse, return_lse=return_lse, q_scale=q_scale, k_scale=k_scale,
                         v_scale=v_scale, window_left=None)

    forward = run
    run_return_lse = functools.partialmethod(run, return_lse=True)


# FlashInfer prefill plan() keywords kiln has no use for: refused unless None / 0 / False.
_FLASHINFER_PREFILL_EXTRAS = frozenset((
    "prefix_len_ptr", "token_pos_in_items_ptr", "token_pos_in_items_len", "max_item_len_ptr",
    "seq_lens", "seq_lens_q", "block_tables", "max_token_per_sequence", "max_sequence_kv",
    "v_indptr", "o_indptr",
))


def _refuse_prefill_extras(head_dim_qk, head_dim_vo, extra):
    head_dim_vo = _check.integer(head_dim_vo, "head_dim_vo", none=True)
    if head_dim_vo is not None and head_dim_vo != head_dim_qk:
        raise NotImplementedError(f"head_dim_vo={head_dim_vo} != head_dim_qk={head_dim_qk}: "
                                  "kiln's kernels have one head dim")
    unknown = sorted(set(extra) - _FLASHINFER_PREFILL_EXTRAS)
    if unknown:
        raise TypeError(f"plan() got unexpected keyword arguments: {', '.join(unknown)}")
    given = sorted(k for k, v in extra.items()
                   if v is not None and not (isinstance(v, (bool, int)) and not v))
    if given:
        raise NotImplementedError(f"plan() arguments kiln does not support: {', '.join(given)}")
