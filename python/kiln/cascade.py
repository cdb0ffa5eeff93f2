"""cascade.py — softmax-state merges and multi-level cascade attention over torch tensors,
shaped like FlashInfer's flashinfer.cascade.

A state is (v [n, H, D] float16/bfloat16, s [n, H] float32 LSE) from any attention with LSE
output; merging the states of two key sets gives the state of their union. merge_state,
merge_state_in_place and merge_states launch kiln's op=merge kernels (kiln_merge_state*) on
torch's current stream. FlashInfer's LSE is base 2 and so is the default here (lse_base="2":
the LSEs are converted to kiln's natural log on the way in and back on the way out, in
temporaries, so the caller's tensors only change where FlashInfer's do); lse_base="e" takes and
gives kiln's natural-log LSE with no conversion.

MultiLevelCascadeAttentionWrapper runs each level as a BatchPrefillWithPagedKVCacheWrapper with
LSE (all of them on the one workspace) and merges them in place. The shared-prefix
wrappers FlashInfer keeps in flashinfer.cascade live in prefix.py and are reachable here too.
"""

from . import _check, _lib
from .attention import LOG2E, _ordinal, _stride, default_context
from .core import Context, Variant

LN2 = 0.6931471805599453  # ln(2): base-2 LSE * LN2 = natural-log LSE

_kernels = {}  # (id(context) or ordinal, dtype, D) -> op=merge Kernel


def _torch():
    from .attention import _torch as load

    return load()


def _merge_kernel(torch, device, dtype, D, context):
    word = {torch.float16: "f16", torch.bfloat16: "bf16"}.get(dtype)
    if word is None:
        raise ValueError(f"merge: v has dtype {dtype}; kiln merges float16 or bfloat16 states")
    key = (id(context) if context is not None else _ordinal(device), word, D)
    k = _kernels.get(key)
    if k is None:
        ctx = context if context is not None else default_context(device)
        k = ctx.kernel(Variant(op="merge", dtype=word, head_dim=D))
        _kernels[key] = k
    return k


def _check_v(torch, name, v, ndim, device):
    if not isinstance(v, torch.Tensor) or v.dim() != ndim:
        raise ValueError(f"{name} must be a {ndim}-D tensor, got {getattr(v, 'shape', v)}")
    if v.device != device or device.type != "cuda":
        raise ValueError(f"{name} is on {v.device}: every state must be on one CUDA device")


def _check_s(torch, name, s, shape, device):
    if not isinstance(s, torch.Tensor) or tuple(s.shape) != tuple(shape):
        raise ValueError(f"{name} must be {tuple(shape)}, got {getattr(s, 'shape', s)}")
    if s.dtype != torch.float32:
        raise ValueError(f"{name} must be float32, got {s.dtype}")
    if s.device != device:
        raise ValueError(f"{name} is on {s.device}, the states on {device}")


def _natural(s, base):
    """The LSE in natural log, dense: a new tensor for base 2, s itself when already dense."""
    return s * LN2 if base == "2" else s.contiguous()


def _scalars(lse_base, context):
    """The non-tensor arguments of the merges, checked before torch is needed."""
    _check.choice(lse_base, "lse_base", ("2", "e"))
    _check.instance(context, "context", Context, none=True)


def _launch(torch, kernel, name, a, device):
    stream = torch.cuda.current_stream(device).cuda_stream
    if device.index is not None and device.index != torch.cuda.current_device():
        with torch.cuda.device(device):
            getattr(kernel, name)(a, stream)
    else:
        getattr(kernel, name)(a, stream)


def _check_pair(torch, names, v_a, s_a, v_b, s_b, device):
    """Two states of the same rows: v [n, H, D] of one shape and dtype, s [n, H] float32 LSE.
    names: what the caller calls v_a, s_a, v_b, s_b. Returns (n, H, D)."""
    va, sa, vb, sb = names
    _check_v(torch, va, v_a, 3, device)
    _check_v(torch, vb, v_b, 3, device)
    if v_a.shape != v_b.shape or v_a.dtype != v_b.dtype:
        raise ValueError(f"{va} and {vb} must share shape and dtype, got {tuple(v_a.shape)} "
                         f"{v_a.dtype} and {tuple(v_b.shape)} {v_b.dtype}")
    n, H, D = v_a.shape
    _check_s(torch, sa, s_a, (n, H), device)
    _check_s(torch, sb, s_b, (n, H), device)
    return n, H, D


def merge_state(v_a, s_a, v_b, s_b, *, lse_base="2", context=None):
    """Merge two states of the same rows: FlashInfer's merge_state. v_a, v_b [n, H, D]
    (float16 / bfloat16), s_a, s_b [n, H] float32 LSE (base 2 unless lse_base="e"). Returns
    (v [n, H, D], s [n, H]), new dense tensors; a row whose LSE is -inf in one state takes the
    other's (both -inf: v = 0, s = -inf)."""
    _scalars(lse_base, context)
    torch = _torch()
    device = v_a.device if isinstance(v_a, torch.Tensor) else None
    n, H, D = _check_pair(torch, ("v_a", "s_a", "v_b", "s_b"), v_a, s_a, v_b, s_b, device)
    kernel = _merge_kernel(torch, device, v_a.dtype, D, context)
    v_out = torch.empty((n, H, D), dtype=v_a.dtype, device=device)
    s_out = torch.empty((n, H), dtype=torch.float32, device=device)
    if n == 0:
        return v_out, s_out
    va, vb = v_a.contiguous(), v_b.contiguous()  # every v of one launch shares strides
    la, lb = _natural(s_a, lse_base), _natural(s_b, lse_base)
    a = _lib.kiln_merge_args(v_a=va.data_ptr(), lse_a=la.data_ptr(), v_b=vb.data_ptr(),
                             lse_b=lb.data_ptr(), v_out=v_out.data_ptr(),
                             lse_out=s_out.data_ptr(), rows=n, num_heads=H)
    _launch(torch, kernel, "merge_state", a, device)
    if lse_base == "2":
        s_out.mul_(LOG2E)
    return v_out, s_out


def merge_state_in_place(v, s, v_other, s_other, mask=None, *, lse_base="2", context=None):
    """Merge (v_other, s_other) into (v, s) in place: FlashInfer's merge_state_in_place.
    v, v_other [n, H, D]; s, s_other [n, H] float32 (base 2 unless lse_base="e"); mask
    (bool / uint8 [n], optional): rows where it is 0 stay exactly as they were. v may be any
    view whose last dim is contiguous; v_other is copied to v's strides when they differ."""
    _scalars(lse_base, context)
    torch = _torch()
    device = v.device if isinstance(v, torch.Tensor) else None
    n, H, D = _check_pair(torch, ("v", "s", "v_other", "s_other"), v, s, v_other, s_other, device)
    if n and (v.stride(2) != 1 or v.data_ptr() % 16 or any(
            v.size(d) > 1 and (v.stride(d) * v.element_size()) % 16 for d in (0, 1))):
        raise ValueError(f"v: the last dim must be contiguous, data 16-byte aligned and strides "
                         f"multiples of 16 bytes (strides {v.stride()})")
    kernel = _merge_kernel(torch, device, v.dtype, D, context)
    m = None
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != (n,):
            raise ValueError(f"mask must be a tensor [n] = [{n}], got {getattr(mask, 'shape', mask)}")
        m = mask.to(device=device, dtype=torch.uint8).contiguous()
    if n == 0:
        return
    vo = v_other
    if vo.stride() != v.stride():
        vo = torch.empty_like(v)
        vo.copy_(v_other)
        if vo.stride() != v.stride():
            vo = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=device)
            vo.copy_(v_other)
    s_work = s if (lse_base == "e" and s.is_contiguous()) else _natural(s, lse_base)
    lo = _natural(s_other, lse_base)
    a = _lib.kiln_merge_args(v_a=v.data_ptr(), lse_a=s_work.data_ptr(), v_b=vo.data_ptr(),
                             lse_b=lo.data_ptr(), mask=m.data_ptr() if m is not None else 0,
                             rows=n, num_heads=H, v_stride_n=_stride(v, 0),
                             v_stride_h=_stride(v, 1))
    _launch(torch, kernel, "merge_state_in_place", a, device)
    if s_work is s:
        return
    new = s_work * LOG2E if lse_base == "2" else s_work
    if m is not None:  # untouched rows keep their exact bits, not a round trip through ln 2
        new = torch.where(m.bool()[:, None], new, s)
    s.copy_(new)


def merge_states(v, s, *, lse_base="2", context=None):
    """Merge S states of each row: FlashInfer's merge_states. v [n, S, H, D], s [n, S, H]
    float32 (base 2 unless lse_base="e"). Returns (v [n, H, D], s [n, H])."""
    _scalars(lse_base, context)
    torch = _torch()
    device = v.device if isinstance(v, torch.Tensor) else None
    _check_v(torch, "v", v, 4, device)
    n, S, H, D = v.shape
    if S < 1:
        raise ValueError("merge_states needs at least one state per row (v.shape[1] >= 1)")
    _check_s(torch, "s", s, (n, S, H), device)
    kernel = _merge_kernel(torch, device, v.dtype, D, context)
    v_out = torch.empty((n, H, D), dtype=v.dtype, device=device)
    s_out = torch.empty((n, H), dtype=torch.float32, device=device)
    if n == 0:
        return v_out, s_out
    vall = v.contiguous()
    lall = _natural(s, lse_base)
    a = _lib.kiln_merge_args(v_all=vall.data_ptr(), lse_all=lall.data_ptr(),
                             v_out=v_out.data_ptr(), lse_out=s_out.data_ptr(), num_states=S,
                             rows=n, num_heads=H)
    _launch(torch, kernel, "merge_states", a, device)
    if lse_base == "2":
        s_out.mul_(LOG2E)
    return v_out, s_out


# ---- multi-level cascade -----------------------------------------------------------------------

class MultiLevelCascadeAttentionWrapper:
    """Cascade attention over levels of a paged KV cache (shared prefixes first, each request's
    own pages last): FlashInfer's wrapper of the same name. Each level is a batch prefill with
    LSE over its own (qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len);
    the levels' states are merged in place into the last level's output. causal applies to the
    last level only, as in FlashInfer.

    MultiLevelCascadeAttentionWrapper(num_levels, float_workspace_buffer, kv_layout="NHD",
    use_cuda_graph=False, qo_indptr_buf_arr=None, paged_kv_indptr_buf_arr=None,
    paged_kv_indices_buf_arr=None, paged_kv_last_page_len_buf_arr=None, *, context=None).
    Every level uses the whole float workspace for its split-KV partial states (each level's
    schedule is in a buffer of its own wrapper's; the levels run one after another).
    CUDA-graph mode is not supported here yet (NotImplementedError).
    """

    def __init__(self, num_levels, float_workspace_buffer, kv_layout="NHD",
                 use_cuda_graph=False, qo_indptr_buf_arr=None, paged_kv_indptr_buf_arr=None,
                 paged_kv_indices_buf_arr=None, paged_kv_last_page_len_buf_arr=None, *,
                 context=None):
        from .batch import BatchPrefillWithPagedKVCacheWrapper

        if _check.flag(use_cuda_graph, "use_cuda_graph"):
            raise NotImplementedError("MultiLevelCascadeAttentionWrapper: use_cuda_graph=True is "
                                      "not supported yet")
        num_levels = _check.integer(num_levels, "num_levels", 1, _check.INT_MAX)
        _check.instance(context, "context", Context, none=True)
        self._num_levels = num_levels
        self._context = context
        self._batch_prefill_wrappers = [
            BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout,
                                                context=context, lse_base="e")
            for _ in range(num_levels)
        ]

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffers=None):
        """Use a new workspace for every level (plan again afterwards)."""
        self.__init__(self._num_levels, float_workspace_buffer,
                      self._batch_prefill_wrappers[0]._kv_layout, context=self._context)

    def plan(self, qo_indptr_arr, paged_kv_indptr_arr, paged_kv_indices_arr,
             paged_kv_last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
             sm_scale=None, window_left=-1, logits_soft_cap=None, rope_scale=None,
             rope_theta=None, q_data_type="float16", kv_data_type=None):
        """Plan every level: each *_arr holds one array per level (see
        BatchPrefillWithPagedKVCacheWrapper.plan)."""
        arrays = (qo_indptr_arr, paged_kv_indptr_arr, paged_kv_indices_arr,
                  paged_kv_last_page_len)
        for name, arr in zip(("qo_indptr_arr", "paged_kv_indptr_arr", "paged_kv_indices_arr",
                              "paged_kv_last_page_len"), arrays):
            if isinstance(arr, (str, bytes)) or not hasattr(arr, "__len__"):
                raise TypeError(f"{name} must hold one array per level, not "
                                f"{type(arr).__name__}")
            if len(arr) != self._num_levels:
                raise ValueError(f"{name} has {len(arr)} entries; there are "
                                 f"{self._num_levels} levels")
        causal = _check.flag(causal, "causal")  # only the last level sees it: check it now
        last = self._num_levels - 1
        for i, wrapper in enumerate(self._batch_prefill_wrappers):
            wrapper.plan(qo_indptr_arr[i], paged_kv_indptr_arr[i], paged_kv_indices_arr[i],
                         paged_kv_last_page_len[i], num_qo_heads, num_kv_heads, head_dim,
                         page_size, causal=causal if i == last else False,
                         pos_encoding_mode=pos_encoding_mode, sm_scale=sm_scale,
                         window_left=window_left, logits_soft_cap=logits_soft_cap,
                         rope_scale=rope_scale, rope_theta=rope_theta, q_data_type=q_data_type,
                         kv_data_type=kv_data_type)

    begin_forward = plan

    def run(self, q, paged_kv_cache):
        """q [total_qo, H, D]; paged_kv_cache as for the batch wrappers. Returns o."""
        out, lse = self._batch_prefill_wrappers[-1].run(q, paged_kv_cache, return_lse=True)
        for wrapper in self._batch_prefill_wrappers[:-1]:
            o_i, lse_i = wrapper.run(q, paged_kv_cache, return_lse=True)
            merge_state_in_place(out, lse, o_i, lse_i, lse_base="e", context=self._context)
        return out

    forward = run

    def end_forward(self):
        """Nothing to release (FlashInfer's old API)."""


def __getattr__(name):
    """kiln.cascade.BatchDecodeWithSharedPrefixPagedKVCacheWrapper and
    BatchPrefillWithSharedPrefixPagedKVCacheWrapper, as in flashinfer.cascade (prefix.py,
    which imports this module, holds them)."""
    if name in ("BatchDecodeWithSharedPrefixPagedKVCacheWrapper",
                "BatchPrefillWithSharedPrefixPagedKVCacheWrapper"):
        from . import prefix

        return getattr(prefix, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
