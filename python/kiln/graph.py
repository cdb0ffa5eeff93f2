"""graph.py — FlashInfer's CUDA-graph decode surface: CUDAGraphBatchDecodeWithPagedKVCacheWrapper
and fast_decode_plan.

CUDAGraphBatchDecodeWithPagedKVCacheWrapper is BatchDecodeWithPagedKVCacheWrapper in CUDA-graph
mode with the three fixed buffers given to the constructor, as FlashInfer's subclass is (the
base wrapper keeps them under FlashInfer's attribute names and its graph-mode plan() copies
into them), and a run() captured once replays after any later plan within the buffers'
bounds.

fast_decode_plan(wrapper, ...) is FlashInfer's faster decode plan (SGLang binds it to its
wrappers): it skips the copies of indptr and last_page_len into the CUDA-graph buffers (the
caller has written them), takes the host indptr from global_override_indptr_cpu when given (no
device-to-host copy), and builds last_page_len on the host when page_size is 1.
"""

import array

from . import _check
from .batch import BatchDecodeWithPagedKVCacheWrapper
from .page import _torch


def _int32_buffer(torch, t, name):
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} should be a torch.Tensor in cudagraph mode, not "
                         f"{type(t).__name__}")
    if t.dim() != 1 or t.dtype != torch.int32 or t.device.type != "cuda":
        raise ValueError(f"{name} must be a 1-D int32 CUDA tensor, got {tuple(t.shape)} "
                         f"{t.dtype} on {t.device}")
    return t


class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """FlashInfer's CUDA-graph decode wrapper:
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper(workspace_buffer, indptr_buffer, indices_buffer,
    last_page_len_buffer, kv_layout="NHD", use_tensor_cores=False, *, context=None,
    lse_base="2"). The buffers are int32 CUDA tensors: indptr_buffer [max_batch + 1],
    indices_buffer [max pages], last_page_len_buffer [max_batch]. plan() is not capturable;
    run() is (plan and run once before capturing). A later plan may have any batch up to
    max_batch (FlashInfer requires exactly max_batch; kiln's graph plans cover any smaller
    batch); the buffers' first B + 1 / B entries are then written."""

    def __init__(self, workspace_buffer, indptr_buffer, indices_buffer, last_page_len_buffer,
                 kv_layout="NHD", use_tensor_cores=False, *, context=None, lse_base="2"):
        torch = _torch()
        _int32_buffer(torch, indptr_buffer, "indptr_buffer")
        _int32_buffer(torch, indices_buffer, "indices_buffer")
        _int32_buffer(torch, last_page_len_buffer, "last_page_len_buffer")
        if indptr_buffer.numel() != last_page_len_buffer.numel() + 1:
            raise ValueError(f"indptr_buffer has {indptr_buffer.numel()} entries; "
                             f"last_page_len_buffer says batch {last_page_len_buffer.numel()}, "
                             f"so {last_page_len_buffer.numel() + 1}")
        super().__init__(workspace_buffer, kv_layout, use_cuda_graph=True,
                         use_tensor_cores=use_tensor_cores,
                         paged_kv_indptr_buffer=indptr_buffer,
                         paged_kv_indices_buffer=indices_buffer,
                         paged_kv_last_page_len_buffer=last_page_len_buffer, context=context,
                         lse_base=lse_base)


_ONE = array.array("i", [1])  # a page of one token is full: last_page_len is all ones


def _batch_of(last_page_len):
    if hasattr(last_page_len, "numel"):
        return int(last_page_len.numel())
    return len(last_page_len)


def _host_indptr(torch, indptr, override, batch):
    """The indptr as host values: global_override_indptr_cpu when given (its first batch + 1
    entries, as FlashInfer's plan reads), else indptr (copied to the host by the plan)."""
    if override is None:
        return indptr
    if not isinstance(override, torch.Tensor) or override.device.type != "cpu":
        raise ValueError("global_override_indptr_cpu must be a CPU tensor (the host copy of "
                         f"indptr), got {type(override).__name__}")
    if override.numel() < batch + 1:
        raise ValueError(f"global_override_indptr_cpu has {override.numel()} entries; the batch "
                         f"({batch}, from last_page_len) needs {batch + 1}")
    return override.reshape(-1)[:batch + 1]


def fast_decode_plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
                     page_size, pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None,
                     q_data_type=None, kv_data_type=None, data_type=None, sm_scale=None,
                     rope_scale=None, rope_theta=None, non_blocking=True, fixed_split_size=None,
                     disable_split_kv=False, global_override_indptr_cpu=None, q_len_per_req=1):
    """FlashInfer's fast_decode_plan(wrapper, ...): a decode plan for `self` (a
    BatchDecodeWithPagedKVCacheWrapper, CUDA-graph or not) that copies nothing into the
    CUDA-graph buffers and reads no device memory when global_override_indptr_cpu is given and
    page_size is 1. Dtypes as FlashInfer resolves them here: data_type fills a missing
    q_data_type / kv_data_type, q_data_type defaults to float16, kv_data_type to q_data_type.
    In CUDA-graph mode pass the indices buffer itself (as SGLang does); other page ids are
    copied into it (FlashInfer would run on whatever the buffer holds). q_len_per_req (FlashInfer's
    default 1) other than 1 raises NotImplementedError."""
    if not isinstance(self, BatchDecodeWithPagedKVCacheWrapper):
        raise TypeError("fast_decode_plan: self must be a kiln.BatchDecodeWithPagedKVCacheWrapper, "
                        f"not {type(self).__name__}")
    if _check.integer(q_len_per_req, "fast_decode_plan: q_len_per_req", 1, _check.INT_MAX) != 1:
        raise NotImplementedError(
            f"fast_decode_plan(q_len_per_req={q_len_per_req}): kiln's decode kernels take one "
            "query row per request; plan several rows per request on "
            "BatchPrefillWithPagedKVCacheWrapper")
    page_size = _check.integer(page_size, "page_size", 1, _check.INT_MAX)
    if data_type is not None:
        q_data_type = data_type if q_data_type is None else q_data_type
        kv_data_type = data_type if kv_data_type is None else kv_data_type
    elif q_data_type is None:
        q_data_type = "float16"
    if kv_data_type is None:
        kv_data_type = q_data_type
    torch = _torch()
    batch = _batch_of(last_page_len)
    host_indptr = _host_indptr(torch, indptr, global_override_indptr_cpu, batch)
    host_last = _ONE * batch if page_size == 1 else last_page_len  # C ints: no checks
    self._copy_buffers = False  # the caller has written indptr and last_page_len
    try:
        BatchDecodeWithPagedKVCacheWrapper.plan(
            self, host_indptr, indices, host_last, num_qo_heads, num_kv_heads, head_dim,
            page_size, pos_encoding_mode=pos_encoding_mode, window_left=window_left,
            logits_soft_cap=logits_soft_cap, q_data_type=q_data_type,
            kv_data_type=kv_data_type, sm_scale=sm_scale, rope_scale=rope_scale,
            rope_theta=rope_theta, non_blocking=non_blocking,
            fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv)
    finally:
        del self._copy_buffers
