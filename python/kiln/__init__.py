"""kiln — a runtime JIT generator of GPU attention kernels, from Python.

A binding over libkiln.so: ctypes, and where `make` built it the C extension of kiln/hot.c that
runs the batch wrappers' run() (kiln/_hot.py); no build step beyond the repository's `make`.
Without torch and without a GPU: variants and specs (Variant), contexts and compile-only kernels
for any arch (Context.compile), kernel inspection (source, NVRTC log,
key material, cubin, resources), the variant a batch plan needs (batch_variant). With torch and
a CUDA GPU: FlashInfer-shaped single-request decode and prefill, the batch wrappers (paged
decode, paged and ragged prefill: plan/run, CUDA graphs), merge_state(s) and multi-level
cascade on torch tensors; FlashInfer's block-sparse, shared-prefix and CUDA-graph decode
wrappers, fast_decode_plan, the page utilities and packbits. FlashInfer's module paths work
too: kiln.decode, kiln.prefill, kiln.cascade, kiln.page, kiln.sparse, kiln.utils. See
docs/python.md.

    import kiln
    v = kiln.Variant("op=decode dtype=bf16 head_dim=128 group=4")
    with kiln.Context(no_device=True) as ctx:
        k = ctx.compile(v, arch="sm_90a")
        print(k.info.registers, k.info.from_cache)

    o = kiln.single_decode_with_kv_cache(q, k_cache, v_cache)      # torch tensors
"""

from ._version import __version__
from ._lib import AttnArgs, BatchArgs, MergeArgs, Params
from .core import (
    Context,
    DeviceInfo,
    Kernel,
    KernelInfo,
    Variant,
    nvrtc_version,
    status_str,
    version,
)
from .errors import (
    KilnCacheError,
    KilnCacheMiss,
    KilnCompileError,
    KilnCudaError,
    KilnError,
    KilnInvalidArgumentError,
    KilnIOError,
    KilnLibraryError,
    KilnMismatchError,
    KilnNoDeviceError,
    KilnNoMemoryError,
    KilnNotFoundError,
    KilnParseError,
    KilnUnsupportedError,
    KilnWorkspaceError,
)
from .attention import (
    LOG2E,
    alibi_slopes,
    default_context,
    set_default_context,
    single_decode_with_kv_cache,
    single_prefill_with_kv_cache,
    single_prefill_with_kv_cache_return_lse,
)
from .plan import Plan, PlanInfo
from .batch import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    batch_variant,
)
from .cascade import (
    MultiLevelCascadeAttentionWrapper,
    merge_state,
    merge_state_in_place,
    merge_states,
)
from .page import append_paged_kv_cache, get_batch_indices_positions, get_seq_lens
from .quantization import packbits, segment_packbits
from .graph import CUDAGraphBatchDecodeWithPagedKVCacheWrapper, fast_decode_plan
from .prefix import (
    BatchDecodeWithSharedPrefixPagedKVCacheWrapper,
    BatchPrefillWithSharedPrefixPagedKVCacheWrapper,
)
from .sparse import BlockSparseAttentionWrapper, VariableBlockSparseAttentionWrapper
from .rope import (
    apply_llama31_rope,
    apply_llama31_rope_inplace,
    apply_llama31_rope_pos_ids,
    apply_llama31_rope_pos_ids_inplace,
    apply_rope,
    apply_rope_inplace,
    apply_rope_pos_ids,
    apply_rope_pos_ids_inplace,
    apply_rope_with_cos_sin_cache,
    apply_rope_with_cos_sin_cache_inplace,
)


def __getattr__(name):
    """kiln.ops (torch.library operators), kiln.integrations and FlashInfer's module paths
    kiln.decode / kiln.prefill / kiln.utils load on first use."""
    if name in ("ops", "integrations", "decode", "prefill", "utils"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")


def library_path():
    """Path of the libkiln.so this process loaded (loads it; KilnLibraryError if none)."""
    from . import _lib

    return _lib.lib_path()


__all__ = [name for name in dir() if not name.startswith("_")]
