"""prefill.py — flashinfer.prefill's import path: the names engines import from it that kiln
has (re-exports only; the code lives in batch.py and attention.py)."""

from .attention import single_prefill_with_kv_cache, single_prefill_with_kv_cache_return_lse
from .batch import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

__all__ = ["BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper",
           "single_prefill_with_kv_cache", "single_prefill_with_kv_cache_return_lse"]
