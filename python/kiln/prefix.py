"""prefix.py — FlashInfer's shared-prefix wrappers (deprecated there in favour of
MultiLevelCascadeAttentionWrapper, still called): BatchDecodeWithSharedPrefixPagedKVCacheWrapper
and BatchPrefillWithSharedPrefixPagedKVCacheWrapper.

A batch whose requests share one prefix keeps that prefix once, in plain k_shared / v_shared
tensors, and each request's own tokens in a paged cache. forward() is two attentions and one
merge, as FlashInfer's:
    q [n, H, D] x (k_shared, v_shared) [L_shared, H_KV, D]  single prefill, not causal -> V_s, S_s
    q [n, H, D] x each request's own pages                  the batch wrapper          -> V_u, S_u
    merge_state_in_place(V_s, S_s, V_u, S_u)                                            -> V_s
The LSEs stay in kiln's natural log throughout (lse_base="e"), so nothing is converted.
"""

from .attention import single_prefill_with_kv_cache
from ._wrapper import FP8
from .batch import (BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper,
                    dtype_word)
from .cascade import merge_state_in_place
from .page import _layout


def _host(values):
    """A list of ints from a tensor (copied to the host once) or a sequence; None stays None."""
    if values is None:
        return None
    if hasattr(values, "tolist"):
        if hasattr(values, "detach"):
            values = values.detach().cpu()
        return values.tolist()
    return list(values)


class BatchDecodeWithSharedPrefixPagedKVCacheWrapper:
    """FlashInfer's BatchDecodeWithSharedPrefixPagedKVCacheWrapper(float_workspace_buffer,
    kv_layout="NHD"): decode over a shared prefix (k_shared, v_shared) plus each request's
    pages. begin_forward(unique_kv_indptr, unique_kv_indices, unique_kv_last_page_len,
    num_qo_heads, num_kv_heads, head_dim, page_size, data_type="float16") plans the pages;
    forward(q, k_shared, v_shared, unique_kv_cache) returns o [B, H, D]. data_type float16 /
    bfloat16 is the dtype of q and of both caches; float8_e4m3fn / float8_e5m2 that of both
    caches, with float16 queries (FlashInfer's default q_data_type), scale 1."""

    def __init__(self, float_workspace_buffer, kv_layout="NHD"):
        self._kv_layout = _layout(kv_layout)
        self._batch_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            float_workspace_buffer, self._kv_layout, lse_base="e")

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None):
        """Use another float workspace (plan again afterwards); the int buffer is ignored."""
        self._batch_decode_wrapper.reset_workspace_buffer(float_workspace_buffer,
                                                          int_workspace_buffer)

    def begin_forward(self, unique_kv_indptr, unique_kv_indices, unique_kv_last_page_len,
                      num_qo_heads, num_kv_heads, head_dim, page_size, data_type="float16"):
        """Plan the requests' own pages (FlashInfer's arguments)."""
        fp8 = dtype_word(data_type, "data_type") in FP8
        self._batch_decode_wrapper.plan(
            unique_kv_indptr, unique_kv_indices, unique_kv_last_page_len, num_qo_heads,
            num_kv_heads, head_dim, page_size, pos_encoding_mode="NONE",
            q_data_type="float16" if fp8 else data_type, kv_data_type=data_type)


    def forward(self, q, k_shared, v_shared, unique_kv_cache):
        """q [B, H, D]; k_shared, v_shared [L_shared, H_KV, D] (NHD) or [H_KV, L_shared, D]
        (HND); unique_kv_cache as for the batch decode wrapper. Returns o [B, H, D]."""
        v_s, s_s = single_prefill_with_kv_cache(q, k_shared, v_shared, causal=False,
                                                kv_layout=self._kv_layout, return_lse=True,
                                                lse_base="e")
        v_u, s_u = self._batch_decode_wrapper.run(q, unique_kv_cache, return_lse=True)
        merge_state_in_place(v_s, s_s, v_u, s_u, lse_base="e")
        return v_s

    def end_forward(self):
        """Nothing to release (FlashInfer's old API)."""


class BatchPrefillWithSharedPrefixPagedKVCacheWrapper:
    """FlashInfer's BatchPrefillWithSharedPrefixPagedKVCacheWrapper(float_workspace_buffer,
    kv_layout="NHD"): prefill / append over a shared prefix plus each request's pages.
    begin_forward(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
    num_qo_heads, num_kv_heads, head_dim, page_size) plans with FlashInfer's defaults (float16,
    not causal); forward(q, k_shared, v_shared, unique_kv_cache, causal=False,
    use_fp16_qk_reduction=False, sm_scale=None, rope_scale=None, rope_theta=None) plans again
    when causal or sm_scale differ from the last plan (in kiln both belong to the plan; in
    FlashInfer forward() sets them for the run). causal applies to the requests' own pages
    only (bottom-right aligned); the shared prefix is always fully visible. rope_scale and
    rope_theta have no effect, as in FlashInfer (pos_encoding_mode is "NONE");
    use_fp16_qk_reduction is ignored (kiln accumulates in fp32)."""

    def __init__(self, float_workspace_buffer, kv_layout="NHD"):
        self._kv_layout = _layout(kv_layout)
        self._batch_prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(
            float_workspace_buffer, self._kv_layout, lse_base="e")
        self._arrays = None  # the begin_forward arrays, host copies (page ids as given)
        self._planned = None  # (causal, sm_scale) of the last plan

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None):
        """Use another float workspace (plan again afterwards); the int buffer is ignored."""
        self._batch_prefill_wrapper.reset_workspace_buffer(float_workspace_buffer,
                                                           int_workspace_buffer)
        self._planned = None

    def begin_forward(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                      num_qo_heads, num_kv_heads, head_dim, page_size):
        """Plan the requests' own pages (FlashInfer's arguments)."""
        self._arrays = None
        self._planned = None
        arrays = (_host(qo_indptr), _host(paged_kv_indptr), paged_kv_indices,
                  _host(paged_kv_last_page_len), num_qo_heads, num_kv_heads, head_dim, page_size)
        self._plan(arrays, False, None)
        self._arrays = arrays


    def _plan(self, arrays, causal, sm_scale):
        self._batch_prefill_wrapper.plan(*arrays, causal=causal, sm_scale=sm_scale)
        self._planned = (causal, sm_scale)

    def forward(self, q, k_shared, v_shared, unique_kv_cache, causal=False,
                use_fp16_qk_reduction=False, sm_scale=None, rope_scale=None, rope_theta=None):
        """q [qo_indptr[-1], H, D]; k_shared, v_shared [L_shared, H_KV, D] (NHD) or [H_KV,
        L_shared, D] (HND); unique_kv_cache as for the batch prefill wrapper. Returns o."""
        if self._arrays is None:
            raise RuntimeError("BatchPrefillWithSharedPrefixPagedKVCacheWrapper: call "
                               "begin_forward() before forward()")
        if (causal, sm_scale) != self._planned:
            self._plan(self._arrays, causal, sm_scale)
        v_s, s_s = single_prefill_with_kv_cache(q, k_shared, v_shared, causal=False,
                                                kv_layout=self._kv_layout, sm_scale=sm_scale,
                                                return_lse=True, lse_base="e")
        v_u, s_u = self._batch_prefill_wrapper.run(q, unique_kv_cache, return_lse=True)
        merge_state_in_place(v_s, s_s, v_u, s_u, lse_base="e")
        return v_s

    def end_forward(self):
        """Nothing to release (FlashInfer's old API)."""
