"""decode.py — flashinfer.decode's import path: the names engines import from it that kiln has
(re-exports only; the code lives in batch.py, graph.py, attention.py and page.py)."""

from .attention import single_decode_with_kv_cache
from .batch import BatchDecodeWithPagedKVCacheWrapper
from .graph import CUDAGraphBatchDecodeWithPagedKVCacheWrapper, fast_decode_plan
from .page import _get_range_buf, get_seq_lens

__all__ = ["BatchDecodeWithPagedKVCacheWrapper", "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
           "_get_range_buf", "fast_decode_plan", "get_seq_lens", "single_decode_with_kv_cache"]
