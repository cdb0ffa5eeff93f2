"""_lib.py — finding and loading libkiln.so, and the ctypes mirror of include/kiln.h.

Every struct here mirrors its C declaration field by field, in order, with the same types, so
ctypes lays it out exactly as the C compiler does; tests/test_python.c passes the C sizes and a
few offsets in $KILN_ABI and python/tests/test_basic.py compares them. Change kiln.h and this
file together.

The library is loaded on first use, not at import, so `import kiln` never fails: where it is
looked for is in find_library_path() below and in docs/python.md.
"""

import ctypes
import ctypes.util
import os
import threading

from . import _check

# ---- constants from kiln.h -------------------------------------------------------------------

KILN_MAX_SNIPPET = 512  # bytes of one snippet, with its NUL
KILN_MAX_USER_PARAMS = 8
KILN_MAX_PARAM_NAME = 32  # bytes of a parameter name, with its NUL

# The status table, in the order of KILN_STATUS_MAP (the enum values are the indices).
STATUS_NAMES = (
    "OK",
    "INVALID_ARGUMENT",
    "PARSE",
    "UNSUPPORTED",
    "NO_DEVICE",
    "CUDA",
    "NVRTC",
    "CACHE",
    "CACHE_MISS",
    "NOT_FOUND",
    "NO_MEMORY",
    "WORKSPACE",
    "IO",
    "MISMATCH",
)
STATUS = {name: i for i, name in enumerate(STATUS_NAMES)}

# Enum values, keyed by their spec spelling (kiln_op, kiln_dtype, ...).
OPS = {"decode": 0, "prefill": 1, "merge": 2}
DTYPES = {"f16": 0, "bf16": 1}  # q_dtype, out_dtype
KV_DTYPES = {"f16": 0, "bf16": 1, "e4m3": 2, "e5m2": 3}  # kv_dtype: fp8 KV too
KV_STORAGE = {"contiguous": 0, "ragged": 1, "paged": 2}  # kiln_kv_storage
LAYOUTS = {"nhd": 0, "hnd": 1}
MASKS = {"none": 0, "causal": 1}
MASK_DATA = {"none": 0, "bitmask": 1, "bsr": 2}
LOGITS = {"none": 0, "softcap": 1, "alibi": 2, "softcap_alibi": 3}
PARAM_TYPES = {"f32": 0, "i32": 1, "f32[]": 2, "i32[]": 3}
CACHE_MODES = {"default": 0, "compile": 1, "strict": 2, "record": 3}

c_devptr = ctypes.c_uint64  # kiln_devptr, a CUdeviceptr value
c_enum = ctypes.c_int  # every kiln enum


# ---- struct mirrors --------------------------------------------------------------------------


class kiln_param_decl(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * KILN_MAX_PARAM_NAME),
        ("type", c_enum),  # kiln_param_type
    ]


class kiln_param_value(ctypes.Union):
    _fields_ = [
        ("f32", ctypes.c_float),
        ("i32", ctypes.c_int32),
        ("ptr", c_devptr),
    ]


class kiln_variant(ctypes.Structure):
    _fields_ = [
        ("op", c_enum),
        ("q_dtype", c_enum),
        ("kv_dtype", c_enum),
        ("out_dtype", c_enum),
        ("head_dim", ctypes.c_int),
        ("group", ctypes.c_int),
        ("layout", c_enum),
        ("mask", c_enum),
        ("window", ctypes.c_int),
        ("logits", c_enum),
        ("lse", ctypes.c_int),
        ("mask_data", c_enum),  # kiln_mask_data
        ("num_params", ctypes.c_int),
        ("params", kiln_param_decl * KILN_MAX_USER_PARAMS),
        ("logits_expr", ctypes.c_char * KILN_MAX_SNIPPET),
        ("mask_expr", ctypes.c_char * KILN_MAX_SNIPPET),
        ("kv", c_enum),  # kiln_kv_storage
        ("rope", ctypes.c_int),
        ("q_tokens", ctypes.c_int),
    ]


class kiln_params(ctypes.Structure):
    _fields_ = [
        ("sm_scale", ctypes.c_float),
        ("softcap", ctypes.c_float),
        ("window_left", ctypes.c_int),
        ("alibi_slopes", c_devptr),
        ("user", kiln_param_value * KILN_MAX_USER_PARAMS),
        ("k_scale", ctypes.c_float),
        ("v_scale", ctypes.c_float),
        ("rope_scale", ctypes.c_float),
        ("rope_theta", ctypes.c_float),
        ("lse_base2", ctypes.c_int),
    ]


class kiln_attn_args(ctypes.Structure):
    _fields_ = [
        ("q", c_devptr),
        ("k", c_devptr),
        ("v", c_devptr),
        ("o", c_devptr),
        ("lse", c_devptr),
        ("num_qo_heads", ctypes.c_int),
        ("qo_len", ctypes.c_int),
        ("kv_len", ctypes.c_int),
        ("q_stride_n", ctypes.c_int64),
        ("q_stride_h", ctypes.c_int64),
        ("o_stride_n", ctypes.c_int64),
        ("o_stride_h", ctypes.c_int64),
        ("k_stride_n", ctypes.c_int64),
        ("k_stride_h", ctypes.c_int64),
        ("v_stride_n", ctypes.c_int64),
        ("v_stride_h", ctypes.c_int64),
        ("mask_bits", c_devptr),
        ("bsr_indptr", c_devptr),
        ("bsr_indices", c_devptr),
        ("bsr_r", ctypes.c_int),
        ("bsr_c", ctypes.c_int),
        ("tile_map", c_devptr),
        ("tile_map_bytes", ctypes.c_size_t),
        ("workspace", c_devptr),
        ("workspace_bytes", ctypes.c_size_t),
        ("params", kiln_params),
    ]


class kiln_ctx_opts(ctypes.Structure):
    _fields_ = [
        ("cache_dir", ctypes.c_char_p),
        ("no_cache", ctypes.c_int),
        ("device", ctypes.c_int),
        ("no_device", ctypes.c_int),
        ("arch", ctypes.c_char_p),
        ("base_cache_dir", ctypes.c_char_p),
        ("mode", c_enum),  # kiln_cache_mode
        ("record_path", ctypes.c_char_p),
        ("max_cache_bytes", ctypes.c_int64),
    ]


class kiln_device_info(ctypes.Structure):
    _fields_ = [
        ("present", ctypes.c_int),
        ("ordinal", ctypes.c_int),
        ("name", ctypes.c_char * 96),
        ("sm", ctypes.c_int),
        ("sm_count", ctypes.c_int),
        ("driver_version", ctypes.c_int),
        ("arch", ctypes.c_char * 16),
    ]


class kiln_kernel_info(ctypes.Structure):
    _fields_ = [
        ("key", ctypes.c_char * 33),
        ("arch", ctypes.c_char * 16),
        ("spec", ctypes.c_char * 256),
        ("from_cache", ctypes.c_int),
        ("compile_ms", ctypes.c_double),
        ("registers", ctypes.c_int),
        ("smem_bytes", ctypes.c_int),
        ("spill_bytes", ctypes.c_int),
        ("stack_bytes", ctypes.c_int),
        ("cubin_bytes", ctypes.c_size_t),
        ("threads", ctypes.c_int),
    ]


# ---- batches: plans, batch launches, softmax-state merges ----


class kiln_plan_opts(ctypes.Structure):
    _fields_ = [
        ("num_qo_heads", ctypes.c_int),
        ("page_size", ctypes.c_int),
        ("max_batch", ctypes.c_int),
        ("max_qo_tokens", ctypes.c_int),
        ("fixed_split", ctypes.c_int),
        ("no_split", ctypes.c_int),
        ("max_total_kv", ctypes.c_int64),
        ("bsr_r", ctypes.c_int),
        ("bsr_c", ctypes.c_int),
    ]


class kiln_batch_shape(ctypes.Structure):
    _fields_ = [
        ("batch", ctypes.c_int),
        ("qo_indptr", ctypes.POINTER(ctypes.c_int)),
        ("kv_indptr", ctypes.POINTER(ctypes.c_int)),
        ("kv_last_page_len", ctypes.POINTER(ctypes.c_int)),
    ]


class kiln_plan_info(ctypes.Structure):
    _fields_ = [
        ("batch", ctypes.c_int),
        ("items", ctypes.c_int),
        ("grid", ctypes.c_int),
        ("kv_chunk", ctypes.c_int),
        ("split_items", ctypes.c_int),
        ("merge_tasks", ctypes.c_int),
        ("max_item_keys", ctypes.c_int64),
        ("total_keys", ctypes.c_int64),
    ]


class kiln_batch_args(ctypes.Structure):
    _fields_ = [
        ("q", c_devptr),
        ("k", c_devptr),
        ("v", c_devptr),
        ("o", c_devptr),
        ("lse", c_devptr),
        ("kv_indices", c_devptr),
        ("rope_offsets", c_devptr),
        ("q_stride_n", ctypes.c_int64),
        ("q_stride_h", ctypes.c_int64),
        ("o_stride_n", ctypes.c_int64),
        ("o_stride_h", ctypes.c_int64),
        ("k_stride_page", ctypes.c_int64),
        ("k_stride_n", ctypes.c_int64),
        ("k_stride_h", ctypes.c_int64),
        ("v_stride_page", ctypes.c_int64),
        ("v_stride_n", ctypes.c_int64),
        ("v_stride_h", ctypes.c_int64),
        ("workspace", c_devptr),
        ("workspace_bytes", ctypes.c_size_t),
        ("params", kiln_params),
        ("mask_bits", c_devptr),
        ("bsr_indptr", c_devptr),
        ("bsr_indices", c_devptr),
    ]


class kiln_merge_args(ctypes.Structure):
    _fields_ = [
        ("v_a", c_devptr),
        ("lse_a", c_devptr),
        ("v_b", c_devptr),
        ("lse_b", c_devptr),
        ("v_out", c_devptr),
        ("lse_out", c_devptr),
        ("mask", c_devptr),
        ("v_all", c_devptr),
        ("lse_all", c_devptr),
        ("num_states", ctypes.c_int),
        ("rows", ctypes.c_int),
        ("num_heads", ctypes.c_int),
        ("v_stride_n", ctypes.c_int64),
        ("v_stride_h", ctypes.c_int64),
    ]


# The public names of the argument structs (kiln.AttnArgs, ...): the same layouts, with every
# scalar field checked as it is set from Python (_check.CheckedStruct). The package's own code
# fills the plain mirrors above, with values it has already checked.


class AttnArgs(_check.CheckedStruct, kiln_attn_args):
    """kiln_attn_args (kiln.h) with checked fields: device pointers as ints, strides in
    elements."""


class Params(_check.CheckedStruct, kiln_params):
    """kiln_params (kiln.h) with checked fields."""


class BatchArgs(_check.CheckedStruct, kiln_batch_args):
    """kiln_batch_args (kiln.h) with checked fields."""


class MergeArgs(_check.CheckedStruct, kiln_merge_args):
    """kiln_merge_args (kiln.h) with checked fields."""


# The structs test_basic.py checks against $KILN_ABI, by their C names.
ABI_STRUCTS = {
    "kiln_variant": kiln_variant,
    "kiln_params": kiln_params,
    "kiln_attn_args": kiln_attn_args,
    "kiln_ctx_opts": kiln_ctx_opts,
    "kiln_device_info": kiln_device_info,
    "kiln_kernel_info": kiln_kernel_info,
    "kiln_param_decl": kiln_param_decl,
    "kiln_param_value": kiln_param_value,
    "kiln_plan_opts": kiln_plan_opts,
    "kiln_batch_shape": kiln_batch_shape,
    "kiln_plan_info": kiln_plan_info,
    "kiln_batch_args": kiln_batch_args,
    "kiln_merge_args": kiln_merge_args,
}

# ---- function prototypes ---------------------------------------------------------------------

_p = ctypes.POINTER
_ctx_p = ctypes.c_void_p  # kiln_ctx *
_kernel_p = ctypes.c_void_p  # kiln_kernel *
_plan_p = ctypes.c_void_p  # kiln_plan *

# name: (restype, argtypes)
_PROTOTYPES = {
    "kiln_status_str": (ctypes.c_char_p, [c_enum]),
    "kiln_errmsg": (ctypes.c_char_p, []),
    "kiln_variant_default": (None, [_p(kiln_variant)]),
    "kiln_variant_parse": (c_enum, [ctypes.c_char_p, _p(kiln_variant)]),
    "kiln_variant_format": (ctypes.c_size_t, [_p(kiln_variant), ctypes.c_char_p, ctypes.c_size_t]),
    "kiln_variant_check": (c_enum, [_p(kiln_variant)]),
    "kiln_ctx_create": (c_enum, [_p(kiln_ctx_opts), _p(_ctx_p)]),
    "kiln_ctx_destroy": (None, [_ctx_p]),
    "kiln_ctx_errmsg": (ctypes.c_char_p, [_ctx_p]),
    "kiln_ctx_device": (c_enum, [_ctx_p, _p(kiln_device_info)]),
    "kiln_ctx_cache_path": (ctypes.c_char_p, [_ctx_p]),
    "kiln_kernel_get": (c_enum, [_ctx_p, _p(kiln_variant), _p(_kernel_p)]),
    "kiln_kernel_get_spec": (c_enum, [_ctx_p, ctypes.c_char_p, _p(_kernel_p)]),
    "kiln_kernel_compile": (c_enum, [_ctx_p, _p(kiln_variant), ctypes.c_char_p, _p(_kernel_p)]),
    "kiln_kernel_describe": (c_enum, [_kernel_p, _p(kiln_kernel_info)]),
    "kiln_kernel_source": (ctypes.c_char_p, [_kernel_p]),
    "kiln_kernel_spec": (ctypes.c_char_p, [_kernel_p]),
    "kiln_kernel_log": (ctypes.c_char_p, [_kernel_p]),
    "kiln_kernel_family": (ctypes.c_char_p, [_kernel_p]),
    "kiln_kernel_key_material": (ctypes.c_char_p, [_kernel_p]),
    "kiln_kernel_cubin": (ctypes.c_void_p, [_kernel_p, _p(ctypes.c_size_t)]),
    "kiln_decode_workspace_size": (
        c_enum,
        [_kernel_p, ctypes.c_int, ctypes.c_int, _p(ctypes.c_size_t)],
    ),
    "kiln_single_decode": (c_enum, [_kernel_p, _p(kiln_attn_args), ctypes.c_void_p]),
    "kiln_single_prefill": (c_enum, [_kernel_p, _p(kiln_attn_args), ctypes.c_void_p]),
    "kiln_prefill_tile_map_size": (
        c_enum,
        [_kernel_p, ctypes.c_int, ctypes.c_int, _p(ctypes.c_size_t)],
    ),
    "kiln_prefill_tile_map": (c_enum, [_kernel_p, _p(kiln_attn_args), ctypes.c_void_p]),
    # deprecated C names of the two above (kiln.h "Deprecated names"), declared while exported
    "kiln_prefill_mask_plan_size": (
        c_enum,
        [_kernel_p, ctypes.c_int, ctypes.c_int, _p(ctypes.c_size_t)],
    ),
    "kiln_prefill_mask_plan": (c_enum, [_kernel_p, _p(kiln_attn_args), ctypes.c_void_p]),
    "kiln_version": (ctypes.c_char_p, []),
    "kiln_nvrtc_version": (ctypes.c_char_p, []),
}

# The batch API (kiln.h "Batches"): declared when the library has it. A libkiln.so built before
# it still loads; calling one of these through fn() then raises KilnLibraryError saying so.
_OPTIONAL_PROTOTYPES = {
    "kiln_plan_create": (c_enum, [_kernel_p, _p(kiln_plan_opts), _p(_plan_p)]),
    "kiln_plan_destroy": (None, [_plan_p]),
    "kiln_plan_workspace_size": (
        c_enum,
        [_plan_p, ctypes.c_int, ctypes.c_int, _p(ctypes.c_size_t)],
    ),
    "kiln_plan_workspace_sizes": (
        c_enum,
        [_plan_p, ctypes.c_int, ctypes.c_int, _p(ctypes.c_size_t), _p(ctypes.c_size_t)],
    ),
    "kiln_plan_schedule": (
        c_enum,
        [_plan_p, _p(kiln_batch_shape), c_devptr, ctypes.c_size_t, ctypes.c_void_p],
    ),
    "kiln_plan_schedule_scratch": (
        c_enum,
        [_plan_p, _p(kiln_batch_shape), c_devptr, ctypes.c_size_t, c_devptr, ctypes.c_size_t,
         ctypes.c_void_p],
    ),
    "kiln_plan_describe": (c_enum, [_plan_p, _p(kiln_plan_info)]),
    "kiln_plan_run": (c_enum, [_plan_p, _p(kiln_batch_args), ctypes.c_void_p]),
    # deprecated C names of kiln_plan_schedule / kiln_plan_run, declared while exported
    "kiln_batch_plan": (
        c_enum,
        [_plan_p, _p(kiln_batch_shape), c_devptr, ctypes.c_size_t, ctypes.c_void_p],
    ),
    "kiln_batch_run": (c_enum, [_plan_p, _p(kiln_batch_args), ctypes.c_void_p]),
    "kiln_merge_state": (c_enum, [_kernel_p, _p(kiln_merge_args), ctypes.c_void_p]),
    "kiln_merge_state_in_place": (c_enum, [_kernel_p, _p(kiln_merge_args), ctypes.c_void_p]),
    "kiln_merge_states": (c_enum, [_kernel_p, _p(kiln_merge_args), ctypes.c_void_p]),
}

# ---- loading ---------------------------------------------------------------------------------

_lock = threading.Lock()
_lib = None
_lib_path = None


def candidate_paths():
    """Where libkiln.so is looked for, in order (see docs/python.md).

    $KILN_LIB, when set, is the only candidate: a path that does not load is an error, never a
    silent fall-back to another copy. Otherwise: the source tree's build/lib/libkiln.so (the
    package used from python/ or installed in editable mode), a libkiln.so installed next to the
    package, then the system's search (ctypes.util.find_library).
    """
    env = os.environ.get("KILN_LIB")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.normpath(os.path.join(here, "..", ".."))
    paths = []
    if os.path.exists(os.path.join(root, "include", "kiln.h")):  # python/kiln in the source tree
        paths.append(os.path.join(root, "build", "lib", "libkiln.so"))
    paths.append(os.path.join(here, "libkiln.so"))
    found = ctypes.util.find_library("kiln")
    if found:
        paths.append(found)
    return paths


def _declare(lib):
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    for name, (restype, argtypes) in _OPTIONAL_PROTOTYPES.items():
        fn = getattr(lib, name, None)  # absent from a library older than the batch API
        if fn is not None:
            fn.restype = restype
            fn.argtypes = argtypes


def lib():
    """The loaded library (a ctypes.CDLL with every prototype declared). Loads it on first call;
    raises kiln.KilnLibraryError naming every path tried and why each failed."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in candidate_paths():
            is_file_path = os.sep in path
            if is_file_path and not os.path.exists(path):
                tried.append(f"{path}: no such file")
                continue
            try:
                handle = ctypes.CDLL(path)
                _declare(handle)
            except (OSError, AttributeError) as exc:
                tried.append(f"{path}: {exc}")
                continue
            _lib_path = path
            _lib = handle
            return _lib
        where = "; ".join(tried) if tried else "no candidate"
        from .errors import KilnLibraryError

        raise KilnLibraryError(
            None,
            "kiln: cannot load libkiln.so (build it with `make` at the repository root, or set "
            f"KILN_LIB to its path): tried {where}"
        )


def has(name):
    """Whether the loaded library exports `name` (loads it)."""
    return getattr(lib(), name, None) is not None


def fn(name):
    """The library function `name`, declared; for the optional (batch) API, raises
    KilnLibraryError naming the library and the function when this build lacks it."""
    f = getattr(lib(), name, None)
    if f is None:
        from .errors import KilnLibraryError

        raise KilnLibraryError(
            None,
            f"kiln: {_lib_path} has no {name}: this libkiln.so predates kiln's batch API "
            "(plans, batch runs, state merges); rebuild it with `make` or point KILN_LIB at a "
            "newer build",
        )
    return f


def lib_path():
    """Path of the loaded library (loads it)."""
    lib()
    return _lib_path


def text(ptr):
    """A borrowed C string as str ("" for NULL); kiln's texts are ASCII or UTF-8."""
    return ptr.decode("utf-8", "replace") if ptr else ""
