"""batch.py — the place of FlashInfer's batch wrappers, which kiln does not have yet.

BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper and
BatchPrefillWithRaggedKVCacheWrapper (plan/run over paged or ragged KV) and merge_state /
merge_states need kiln's batch kernels and planner, which come with the batch-serving issue.
Until then these names exist so that an engine ported from FlashInfer fails at construction
with a clear message instead of an AttributeError deep inside; merge_state(s) are left out
entirely. docs/python.md lists what is supported now.
"""

_NOT_YET = (
    "kiln has no batch kernels yet (they come with the batch-serving work): {name} is not "
    "available; call kiln.single_decode_with_kv_cache / kiln.single_prefill_with_kv_cache per "
    "request for now"
)


class _NotYet:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError(_NOT_YET.format(name=type(self).__name__))


class BatchDecodeWithPagedKVCacheWrapper(_NotYet):
    """Not available yet (batch serving); constructing it raises NotImplementedError."""


class BatchPrefillWithPagedKVCacheWrapper(_NotYet):
    """Not available yet (batch serving); constructing it raises NotImplementedError."""


class BatchPrefillWithRaggedKVCacheWrapper(_NotYet):
    """Not available yet (batch serving); constructing it raises NotImplementedError."""
