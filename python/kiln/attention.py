"""attention.py — FlashInfer-shaped single-request attention over torch tensors.

single_decode_with_kv_cache and single_prefill_with_kv_cache take FlashInfer's arguments and
shapes (q [H, D] or [L_Q, H, D]; k, v [L_KV, H_KV, D] for "NHD", [H_KV, L_KV, D] for "HND"),
pick the kiln variant the call needs, get its kernel from a process-wide default Context (one
per device, created on first use, caching in the default cache directory), allocate the outputs
and the decode workspace with torch, and launch on torch's current stream. torch is imported
only inside these functions: the rest of the package works without it.

The batch wrappers are in batch.py, merge_state(s) and cascade in cascade.py.
"""

import math
import threading

from . import _check
from .core import Context, Variant

LOG2E = 1.4426950408889634  # log2(e): natural-log LSE * LOG2E = base-2 LSE

_lock = threading.Lock()
_contexts = {}  # CUDA ordinal -> Context (the default contexts, never closed)
_kernels = {}  # (ordinal, variant fields) -> Kernel
_plans = {}  # (ordinal, variant fields, H) -> [kiln.Plan, threading.Lock, sizes by L_Q]


def _torch():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - exercised only without torch
        raise ImportError(
            "kiln's attention wrappers need torch; specs, Context.compile and kernel "
            "inspection work without it"
        ) from exc
    return torch


def _ordinal(device, what="device"):
    """A CUDA ordinal from None (0), an int, or a torch.device (its index; the current device
    when it has none)."""
    if device is None:
        return 0
    if isinstance(device, (int, str, bytes)) or not hasattr(device, "index"):
        return _check.integer(device, what, 0, _check.INT_MAX)
    index = device.index
    if index is None:
        return _torch().cuda.current_device()
    return _check.integer(index, what, 0, _check.INT_MAX)


# ---- the default contexts ----------------------------------------------------------------------


def default_context(device=None):
    """The process-wide Context the wrappers use for a CUDA device (an ordinal, a torch.device,
    or None for ordinal 0), created on first use with every option at its default: the cache
    is $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln, and $KILN_STRICT /
    $KILN_RECORD choose the cache mode."""
    ordinal = _ordinal(device)
    ctx = _contexts.get(ordinal)
    if ctx is None:
        with _lock:
            ctx = _contexts.get(ordinal)
            if ctx is None:
                ctx = Context(device=ordinal)
                ctx._keep_alive = True  # never destroyed by the garbage collector (see Context)
                _contexts[ordinal] = ctx
    return ctx


def set_default_context(ctx, device=None):
    """Make `ctx` the wrappers' context for its device (or for `device` when given); for a
    strict serving cache, say. The previous default is not closed (kernels may still run)."""
    _check.instance(ctx, "set_default_context: ctx", Context)
    ordinal = ctx.device.ordinal if device is None else _ordinal(device)
    with _lock:
        _contexts[ordinal] = ctx
        for key in [k for k in _kernels if k[0] == ordinal]:
            del _kernels[key]


def _kernel(ordinal, fields):
    key = (ordinal,) + tuple(sorted(fields.items()))
    k = _kernels.get(key)
    if k is None:
        k = default_context(ordinal).kernel(Variant(**fields))
        _kernels[key] = k
    return k


# ---- argument checks ---------------------------------------------------------------------------


def _as_tensor(torch, x, name):
    if isinstance(x, torch.Tensor):
        return x
    if hasattr(x, "__dlpack__"):
        return torch.from_dlpack(x)
    raise TypeError(f"{name} must be a torch.Tensor (or support __dlpack__), not {type(x).__name__}")


def _dtype_name(torch, dtype, what, fp8=False):
    """kiln's word for a float16 / bfloat16 dtype (with fp8: also float8_e4m3fn -> "e4m3",
    float8_e5m2 -> "e5m2")."""
    if dtype == torch.float16:
        return "f16"
    if dtype == torch.bfloat16:
        return "bf16"
    if fp8 and dtype == getattr(torch, "float8_e4m3fn", None):
        return "e4m3"
    if fp8 and dtype == getattr(torch, "float8_e5m2", None):
        return "e5m2"
    raise ValueError(f"{what}: dtype {dtype} is not supported (float16 or bfloat16"
                     f"{'; float8_e4m3fn or float8_e5m2 for k and v' if fp8 else ''})")


def _check_input(torch, name, t, shape_doc, ndim, device, fp8=False):
    """q, k, v: on `device`, ndim dims, fp16/bf16 (fp8 too for k, v), last dim contiguous,
    16-byte aligned, other strides positive multiples of 16 bytes (8 elements of 2 bytes; where
    the dim has more than one element)."""
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {shape_doc}, got shape {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, q on {device}: all tensors must share a device")
    _dtype_name(torch, t.dtype, name, fp8)
    if t.stride(-1) != 1 and t.size(-1) > 1:
        raise ValueError(
            f"{name}: the last (head_dim) dimension must be contiguous, got strides {t.stride()}"
        )
    if t.numel() and t.data_ptr() % 16:
        raise ValueError(f"{name}: data must be 16-byte aligned (data_ptr 0x{t.data_ptr():x})")
    esize = t.element_size()
    for d in range(ndim - 1):
        if t.size(d) > 1 and (t.stride(d) <= 0 or t.stride(d) * esize % 16):
            raise ValueError(
                f"{name}: stride {t.stride(d)} of dim {d} must be a positive multiple of "
                f"{16 // esize} elements (strides {t.stride()}); call .contiguous()"
            )


def _stride(t, d):
    """Stride in elements of dim d, or 0 (kiln's "dense default") where the dim has one element."""
    return t.stride(d) if t.size(d) > 1 else 0


def _layout(kv_layout):
    return _check.choice(kv_layout, "kv_layout", ("NHD", "HND"), fold="upper").lower()


def _scale(value, name):
    """A FlashInfer scale argument as a float (a one-element tensor is read, which syncs)."""
    f = _check.real(value, name, none=True)
    return 1.0 if f is None else f


POS_ENCODING_MODES = ("NONE", "ROPE_LLAMA", "ALIBI")


def pos_encoding(mode):
    """FlashInfer's pos_encoding_mode, upper-cased: "NONE" | "ROPE_LLAMA" | "ALIBI"."""
    return _check.choice(mode, "pos_encoding_mode", POS_ENCODING_MODES, fold="upper")


def alibi_slopes(num_heads, device=None):
    """The ALiBi paper's slopes for num_heads heads (what FlashInfer's pos_encoding_mode="ALIBI"
    uses): 2^(-8i/n) for i = 1..n with n the largest power of two <= num_heads, then the odd
    powers of 2^(-4/n) for the remaining heads. A float32 tensor [num_heads] on `device`."""
    num_heads = _check.integer(num_heads, "alibi_slopes: num_heads", 1, _check.INT_MAX)
    torch = _torch()
    n = 2 ** int(math.floor(math.log2(num_heads)))
    m = torch.pow(2.0 ** (-8.0 / n), torch.arange(1, n + 1, device=device, dtype=torch.float32))
    if n < num_heads:
        extra = torch.arange(1, 1 + 2 * (num_heads - n), 2, device=device, dtype=torch.float32)
        m = torch.cat([m, torch.pow(2.0 ** (-4.0 / n), extra)])
    return m


def _logits(torch, device, H, mode, logits_soft_cap, slopes):
    """The variant's logits transform and the ALiBi slopes tensor (or None). mode: checked by
    pos_encoding() (ROPE_LLAMA is no logits transform: the caller routes it); logits_soft_cap:
    a float or None."""
    cap = 0.0 if logits_soft_cap is None else logits_soft_cap
    if cap < 0:
        raise ValueError(f"logits_soft_cap={logits_soft_cap}: must be > 0 (or None / 0 for none)")
    alibi = mode == "ALIBI" or slopes is not None
    if not alibi:
        return _logits_word(False, cap > 0), cap, None
    if slopes is None:  # computed on the device for each call, never kept (see _workspace)
        slopes = alibi_slopes(H, device)
    else:
        slopes = _as_tensor(torch, slopes, "alibi_slopes")
        if tuple(slopes.shape) != (H,):
            raise ValueError(f"alibi_slopes must be [H] = [{H}], got shape {tuple(slopes.shape)}")
        if slopes.device != device:
            raise ValueError(f"alibi_slopes is on {slopes.device}, q on {device}")
        slopes = slopes.to(torch.float32).contiguous()
    return _logits_word(True, cap > 0), cap, slopes


def _logits_word(alibi, softcap):
    """The variant's logits word: both is "softcap_alibi" (FlashInfer's order, the ALiBi bias
    inside the tanh: cap * tanh(x / cap + bias))."""
    if alibi:
        return "softcap_alibi" if softcap else "alibi"
    return "softcap" if softcap else "none"


def _workspace(torch, device, nbytes):
    """A decode workspace of nbytes, allocated for this call from torch's caching allocator (on
    the current stream, so a later call's reuse of the block is stream-ordered) and never kept:
    a buffer kept across calls would, when first made during torch.compile's CUDA-graph warm-up,
    live in the graph's memory pool untracked, and torch then refuses to record the graph
    (FlashInfer's issue #541)."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


# ---- the launch shared by decode and prefill ---------------------------------------------------


def pack_mask_bits(torch, mask, count, device):
    """A boolean mask of `count` elements (True: visible), flattened, as kiln's bitmask bytes:
    element n is bit n % 8 of byte n // 8 (little-endian, FlashInfer's bit order), one spare
    zero byte so the tensor is never empty. Raises ValueError on a size mismatch."""
    if not isinstance(mask, torch.Tensor) or mask.numel() != count:
        raise ValueError(f"custom_mask must be a tensor of {count} elements (qo_len * kv_len per "
                         f"request), got {getattr(mask, 'shape', type(mask).__name__)}")
    m = mask.reshape(-1).to(device=device, dtype=torch.bool)
    pad = (-count) % 8 + 8
    m = torch.cat([m, m.new_zeros(pad)])
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.int32, device=device)
    return (m.view(-1, 8).to(torch.int32) * weights).sum(dim=1).to(torch.uint8)


def mask_bits_from_packed(torch, packed, sizes, device):
    """FlashInfer's packed_custom_mask as kiln's bitmask bytes. FlashInfer packs each request's
    qo_len * kv_len mask on its own (packbits / segment_packbits, bitorder="little"), so request
    b's bits start at a byte boundary: (n_b + 7) // 8 bytes each. kiln's requests follow each
    other bit by bit. Where every request but the last fills whole bytes the two layouts are
    the same bytes; otherwise each request's pad bits are dropped on the GPU and the rest
    repacked. Raises ValueError on a dtype or size mismatch."""
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise ValueError("packed_custom_mask must be a uint8 tensor (FlashInfer's packbits / "
                         "segment_packbits output, bitorder='little'), got "
                         f"{getattr(packed, 'dtype', type(packed).__name__)}")
    nbytes = [(n + 7) // 8 for n in sizes]
    if packed.numel() != sum(nbytes):
        raise ValueError(f"packed_custom_mask has {packed.numel()} bytes; the requests' qo_len * "
                         f"kv_len bits take {sum(nbytes)} ((n + 7) // 8 per request)")
    p = packed.reshape(-1).to(device=device).contiguous()
    if all(n % 8 == 0 for n in sizes[:-1]):  # the same bytes (kiln reads bytes, no spare needed)
        return p if p.numel() else p.new_zeros(1)  # never an empty tensor (a null pointer)
    shifts = torch.arange(8, dtype=torch.uint8, device=device)
    bits = ((p.unsqueeze(1) >> shifts) & 1).reshape(-1).bool()
    seg = torch.repeat_interleave(torch.arange(len(sizes), device=device),
                                  torch.tensor(nbytes, device=device) * 8)
    starts = torch.tensor([0] + nbytes[:-1], device=device).cumsum(0) * 8
    within = torch.arange(bits.numel(), device=device) - starts[seg]
    keep = within < torch.tensor(sizes, device=device)[seg]
    return pack_mask_bits(torch, bits[keep], sum(sizes), device)


def mask_data_name(custom_mask, packed_custom_mask):
    """The variant's mask_data for FlashInfer's custom mask arguments."""
    return "none" if custom_mask is None and packed_custom_mask is None else "bitmask"


def request_mask_bits(torch, custom_mask, packed_custom_mask, sizes, device):
    """kiln's bitmask bytes from FlashInfer's custom_mask (bool, the requests' masks flattened
    back to back) or packed_custom_mask (which wins when both are given, as in FlashInfer);
    None when neither is."""
    if packed_custom_mask is not None:
        return mask_bits_from_packed(torch, packed_custom_mask, sizes, device)
    if custom_mask is not None:
        return pack_mask_bits(torch, custom_mask, sum(sizes), device)
    return None


def _attention(op, q, k, v, *, causal, kv_layout, sm_scale, logits_soft_cap, window_left,
               return_lse, pos_encoding_mode, alibi_slopes_arg, lse_base, o_dtype, qk_scale=1.0,
               v_scale=None, custom_mask=None, packed_custom_mask=None, rope_scale=None,
               rope_theta=None):
    # The scalar arguments first: their checks need neither torch nor a GPU.
    lse_base = _check.choice(lse_base, "lse_base", ("2", "e"))
    layout = _layout(kv_layout)
    causal = _check.flag(causal, "causal")
    return_lse = _check.flag(return_lse, "return_lse")
    window_left = _check.integer(window_left, "window_left", none=True)
    sm_scale = _check.real(sm_scale, "sm_scale", none=True)
    logits_soft_cap = _check.real(logits_soft_cap, "logits_soft_cap", none=True)
    pos_encoding_mode = pos_encoding(pos_encoding_mode)
    rope = pos_encoding_mode == "ROPE_LLAMA"
    # FlashInfer's defaults; they count only with RoPE
    rope_scale = _check.real(rope_scale, "rope_scale", none=True)
    rope_theta = _check.real(rope_theta, "rope_theta", none=True)
    rope_scale = 1.0 if rope_scale is None else rope_scale
    rope_theta = 1e4 if rope_theta is None else rope_theta
    if rope and not (rope_scale > 0 and rope_theta > 0):
        raise ValueError(f"rope_scale={rope_scale} and rope_theta={rope_theta} must be > 0")
    torch = _torch()
    q = _as_tensor(torch, q, "q")
    k = _as_tensor(torch, k, "k")
    v = _as_tensor(torch, v, "v")
    device = q.device
    if device.type != "cuda":
        raise ValueError(f"q must be a CUDA tensor, got one on {device}")
    decode = op == "decode"
    q_doc = "[H, D]" if decode else "[L_Q, H, D]"
    _check_input(torch, "q", q, q_doc, 2 if decode else 3, device)
    kv_doc = "[L_KV, H_KV, D] (NHD)" if layout == "nhd" else "[H_KV, L_KV, D] (HND)"
    _check_input(torch, "k", k, kv_doc, 3, device, fp8=True)
    _check_input(torch, "v", v, kv_doc, 3, device, fp8=True)
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    kv_name = _dtype_name(torch, k.dtype, "k", fp8=True)
    fp8 = kv_name in ("e4m3", "e5m2")
    if v.dtype != k.dtype or (k.dtype != q.dtype and not fp8):
        raise ValueError(f"q, k, v must share a dtype (or k and v one fp8 dtype), got {q.dtype}, "
                         f"{k.dtype}, {v.dtype}")
    L_Q = 1 if decode else q.size(0)
    H, D = q.size(-2), q.size(-1)
    n_dim, h_dim = (0, 1) if layout == "nhd" else (1, 0)
    L_KV, H_KV = k.size(n_dim), k.size(h_dim)
    if k.size(2) != D:
        raise ValueError(f"k, v head_dim {k.size(2)} differs from q's {D}")
    if H_KV < 1 or H % H_KV:
        raise ValueError(f"num_qo_heads={H} must be a positive multiple of num_kv_heads={H_KV}")
    out_dtype = q.dtype if o_dtype is None else o_dtype
    out_name = _dtype_name(torch, out_dtype, "o_dtype")
    window = window_left is not None and window_left >= 0
    scale = (1.0 / math.sqrt(D)) if sm_scale is None else sm_scale
    if not scale > 0:
        raise ValueError(f"sm_scale={sm_scale}: must be > 0")
    scale *= qk_scale
    if not scale > 0:
        raise ValueError(f"q_scale * k_scale = {qk_scale}: must be > 0")
    logits, cap, slopes = _logits(torch, device, H, pos_encoding_mode, logits_soft_cap,
                                  alibi_slopes_arg)

    o_shape = (H, D) if decode else (L_Q, H, D)
    lse_shape = (H,) if decode else (L_Q, H)
    if L_Q == 0 or L_KV == 0:  # an empty request: no launch (kiln needs L_KV >= 1)
        o = torch.zeros(o_shape, dtype=out_dtype, device=device)
        if not return_lse:
            return o
        return o, torch.full(lse_shape, float("-inf"), dtype=torch.float32, device=device)

    fields = dict(op=op, q_dtype=_dtype_name(torch, q.dtype, "q"), kv_dtype=kv_name,
                  out_dtype=out_name, head_dim=D, group=H // H_KV, layout=layout,
                  mask="causal" if causal else "none", window=window, logits=logits,
                  lse=bool(return_lse), mask_data=mask_data_name(custom_mask, packed_custom_mask))
    bits = request_mask_bits(torch, custom_mask, packed_custom_mask, [L_Q * L_KV], device)
    o = torch.empty(o_shape, dtype=out_dtype, device=device)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=device) if return_lse else None
    if rope or fp8:  # kiln's single-request kernels have neither: a batch of one does
        fields.update(kv="ragged", rope=rope)
        _batch_of_one(torch, device, fields, q, k, v, o, lse, H, L_Q, L_KV, n_dim, h_dim,
                      scale=scale, cap=cap, window_left=window_left if window else 0,
                      slopes=slopes, bits=bits, rope_scale=rope_scale, rope_theta=rope_theta,
                      v_scale=v_scale, lse_base2=lse_base == "2")
        return o if lse is None else (o, lse)

    from ._lib import kiln_attn_args

    a = kiln_attn_args()
    a.q, a.k, a.v, a.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
    a.lse = lse.data_ptr() if lse is not None else 0
    a.num_qo_heads, a.qo_len, a.kv_len = H, L_Q, L_KV
    if decode:
        a.q_stride_h, a.o_stride_h = _stride(q, 0), _stride(o, 0)
    else:
        a.q_stride_n, a.q_stride_h = _stride(q, 0), _stride(q, 1)
        a.o_stride_n, a.o_stride_h = _stride(o, 0), _stride(o, 1)
    a.k_stride_n, a.k_stride_h = _stride(k, n_dim), _stride(k, h_dim)
    a.v_stride_n, a.v_stride_h = _stride(v, n_dim), _stride(v, h_dim)
    a.params.sm_scale = scale
    a.params.softcap = cap
    a.params.window_left = int(window_left) if window else 0
    a.params.alibi_slopes = slopes.data_ptr() if slopes is not None else 0
    a.params.v_scale = 0.0 if v_scale is None else v_scale  # the kernel multiplies o by it
    a.params.lse_base2 = int(lse_base == "2")  # the kernel writes the LSE in this base
    a.mask_bits = bits.data_ptr() if bits is not None else 0

    switch = device.index != torch.cuda.current_device()
    guard = torch.cuda.device(device) if switch else None
    if guard is not None:
        guard.__enter__()
    try:
        kern = _kernel(device.index, fields)
        stream = torch.cuda.current_stream(device).cuda_stream
        if decode:
            need = kern.workspace_size(H, L_KV)
            if need:
                ws = _workspace(torch, device, need)
                a.workspace, a.workspace_bytes = ws.data_ptr(), ws.numel()
            kern.single_decode(a, stream)
        else:
            kern.single_prefill(a, stream)
    finally:
        if guard is not None:
            guard.__exit__(None, None, None)

    return o if lse is None else (o, lse)


def _batch_of_one(torch, device, fields, q, k, v, o, lse, H, L_Q, L_KV, n_dim, h_dim, *, scale,
                  cap, window_left, slopes, bits, rope_scale, rope_theta, v_scale, lse_base2):
    """One request as a ragged batch of one (kv_indptr [0, L_KV]; prefill qo_indptr [0, L_Q]):
    the batch kernels have RoPE and fp8 KV, the single-request ones not. The plan is kept per
    (device, variant, H) and used under its lock (kiln_plan is not thread-safe); its schedule
    and split-KV scratch are one buffer from torch's allocator for this call, as the single
    decode's workspace is (see _workspace). A plan copies its schedule from pinned host memory,
    which a CUDA graph cannot hold for later replays: inside a capture this raises."""
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "single-request attention with RoPE or fp8 KV runs as a planned batch of one, and a "
            "plan cannot be captured in a CUDA graph (its schedule is copied from host memory "
            "at plan time): use BatchDecodeWithPagedKVCacheWrapper / BatchPrefillWith*Wrapper "
            "with use_cuda_graph=True, planned before the capture"
        )
    from ._lib import kiln_batch_args

    key = (device.index,) + tuple(sorted(fields.items())) + (H,)
    with _lock:
        entry = _plans.get(key)
    decode = fields["op"] == "decode"
    a = kiln_batch_args()
    a.q, a.k, a.v, a.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
    a.lse = lse.data_ptr() if lse is not None else 0
    if decode:  # q [H, D] is the batch's q [1, H, D] (its row stride unused)
        a.q_stride_h, a.o_stride_h = _stride(q, 0), _stride(o, 0)
    else:
        a.q_stride_n, a.q_stride_h = _stride(q, 0), _stride(q, 1)
        a.o_stride_n, a.o_stride_h = _stride(o, 0), _stride(o, 1)
    a.k_stride_n, a.k_stride_h = _stride(k, n_dim), _stride(k, h_dim)
    a.v_stride_n, a.v_stride_h = _stride(v, n_dim), _stride(v, h_dim)
    p = a.params
    p.sm_scale, p.softcap, p.window_left = scale, cap, window_left
    p.alibi_slopes = slopes.data_ptr() if slopes is not None else 0
    p.rope_scale, p.rope_theta = rope_scale, rope_theta
    p.k_scale, p.v_scale = 1.0, 1.0 if v_scale is None else v_scale  # k's scale is in scale
    p.lse_base2 = int(lse_base2)
    a.mask_bits = bits.data_ptr() if bits is not None else 0

    switch = device.index != torch.cuda.current_device()
    guard = torch.cuda.device(device) if switch else None
    if guard is not None:
        guard.__enter__()
    try:
        if entry is None:
            plan = _kernel(device.index, fields).plan(num_qo_heads=H)
            with _lock:
                entry = _plans.setdefault(key, [plan, threading.Lock(), {}])
        plan, plan_lock, sizes = entry
        stream = torch.cuda.current_stream(device).cuda_stream
        with plan_lock:
            need = sizes.get(L_Q)
            if need is None:  # depends on the rows only, not on L_KV
                if len(sizes) >= 256:
                    sizes.clear()
                need = sizes[L_Q] = plan.workspace_sizes(1, L_Q)
            sched, scratch = need
            buf = _workspace(torch, device, max(sched + scratch, 256))
            a.workspace, a.workspace_bytes = buf.data_ptr(), sched
            plan.plan([0, L_KV], a.workspace, sched, stream,
                      qo_indptr=None if decode else [0, L_Q],
                      scratch=a.workspace + sched if scratch else 0, scratch_bytes=scratch)
            plan.run(a, stream)
    finally:
        if guard is not None:
            guard.__exit__(None, None, None)


# ---- the FlashInfer-shaped functions -----------------------------------------------------------


def single_decode_with_kv_cache(
    q,
    k,
    v,
    kv_layout="NHD",
    pos_encoding_mode="NONE",
    use_tensor_cores=False,
    q_scale=None,
    k_scale=None,
    v_scale=None,
    window_left=-1,
    logits_soft_cap=None,
    sm_scale=None,
    rope_scale=None,
    rope_theta=None,
    return_lse=False,
    *,
    alibi_slopes=None,
    lse_base="2",
):
    """Decode attention for one request: FlashInfer's single_decode_with_kv_cache.

    q [H, D]; k, v [L_KV, H_KV, D] ("NHD") or [H_KV, L_KV, D] ("HND"); float16 or bfloat16 on
    one CUDA device; H a multiple of H_KV (GQA group G = H / H_KV, 1..64); D 64, 128 or 256. Any
    strides whose last dimension is contiguous, 16-byte aligned, with other strides multiples
    of 8 elements. Returns o [H, D] in q's dtype, and with return_lse=True also lse [H]
    (float32, base 2 like FlashInfer's unless lse_base="e").

    window_left >= 0 keeps the last window_left + 1 keys; logits_soft_cap > 0 applies
    cap * tanh(x / cap); pos_encoding_mode="ALIBI" adds slope[h] * (j - (L_KV - 1)) with the
    ALiBi paper's slopes, or with `alibi_slopes` (float32 [H]) when given. q_scale and k_scale
    multiply sm_scale (default 1/sqrt(D)); v_scale multiplies o. use_tensor_cores is accepted
    and ignored (kiln picks its decode kernel). pos_encoding_mode="ROPE_LLAMA" rotates q (at
    position L_KV - 1) and k (at 0..L_KV - 1) inside the kernel, llama style, with rope_scale
    (default 1) and rope_theta (default 1e4), which count only then. k, v may be float8_e4m3fn or
    float8_e5m2 (q float16 / bfloat16): k_scale and v_scale then dequantise them in the kernel.
    RoPE and fp8 run on kiln's batch kernels as a batch of one (planned per call, so not inside
    a CUDA-graph capture: RuntimeError). Launches on torch's current stream.
    """
    return _attention(
        "decode", q, k, v, causal=False, kv_layout=kv_layout, sm_scale=sm_scale,
        qk_scale=_scale(q_scale, "q_scale") * _scale(k_scale, "k_scale"),
        logits_soft_cap=logits_soft_cap, window_left=window_left, return_lse=return_lse,
        pos_encoding_mode=pos_encoding_mode, alibi_slopes_arg=alibi_slopes, lse_base=lse_base,
        o_dtype=None, v_scale=None if v_scale is None else _scale(v_scale, "v_scale"),
        rope_scale=rope_scale, rope_theta=rope_theta,
    )


def single_prefill_with_kv_cache(
    q,
    k,
    v,
    scale_q=None,
    scale_k=None,
    scale_v=None,
    o_dtype=None,
    custom_mask=None,
    packed_custom_mask=None,
    causal=False,
    kv_layout="NHD",
    pos_encoding_mode="NONE",
    use_fp16_qk_reduction=False,
    sm_scale=None,
    window_left=-1,
    logits_soft_cap=None,
    rope_scale=None,
    rope_theta=None,
    backend="auto",
    return_lse=False,
    *,
    alibi_slopes=None,
    lse_base="2",
):
    """Prefill / append attention for one request: FlashInfer's single_prefill_with_kv_cache.

    q [L_Q, H, D]; k, v [L_KV, H_KV, D] ("NHD") or [H_KV, L_KV, D] ("HND"); same dtype, device
    and stride rules as single_decode_with_kv_cache. causal=True is bottom-right aligned (query
    i sees keys j <= i + L_KV - L_Q; needs L_Q <= L_KV). window_left >= 0 keeps keys
    j >= i + L_KV - L_Q - window_left. o_dtype (float16 / bfloat16) may differ from q's. Returns
    o [L_Q, H, D], and with return_lse=True also lse [L_Q, H] (float32, base 2 unless
    lse_base="e"). ALiBi adds slope[h] * (j - (i + L_KV - L_Q)).

    custom_mask: bool [L_Q, L_KV] (or flattened), True where the key is visible, AND-ed with
    causal and the window (a row that sees no key gets o = 0, lse = -inf). packed_custom_mask:
    the same mask as FlashInfer's packbits(custom_mask.flatten(), bitorder="little"), uint8
    [ceil(L_Q * L_KV / 8)]; it wins when both are given.
    pos_encoding_mode="ROPE_LLAMA" rotates row i at position i + L_KV - L_Q and key j at j,
    llama style (rope_scale default 1, rope_theta default 1e4; they count only then). k, v may
    be float8_e4m3fn or float8_e5m2 with q float16 / bfloat16 (scale 1). RoPE and fp8 KV run on
    kiln's batch kernels as a batch of one (planned per call, so not inside a CUDA-graph
    capture: RuntimeError). Not supported yet (NotImplementedError): scale_q / scale_k /
    scale_v (FlashInfer's fp8 q, k and v). use_fp16_qk_reduction and backend are accepted and
    ignored (kiln accumulates q.k in fp32 and picks its own kernel).
    """
    if scale_q is not None or scale_k is not None or scale_v is not None:
        raise NotImplementedError("kiln has no fp8 queries yet (scale_q / scale_k / scale_v); "
                                  "fp8 k and v with float16 / bfloat16 q need no scale")
    return _attention(
        "prefill", q, k, v, causal=causal, kv_layout=kv_layout, sm_scale=sm_scale,
        logits_soft_cap=logits_soft_cap, window_left=window_left, return_lse=return_lse,
        pos_encoding_mode=pos_encoding_mode, alibi_slopes_arg=alibi_slopes, lse_base=lse_base,
        o_dtype=o_dtype, custom_mask=custom_mask, packed_custom_mask=packed_custom_mask,
        rope_scale=rope_scale, rope_theta=rope_theta,
    )


def single_prefill_with_kv_cache_return_lse(*args, **kwargs):
    """single_prefill_with_kv_cache(..., return_lse=True), as FlashInfer has it."""
    kwargs["return_lse"] = True
    return single_prefill_with_kv_cache(*args, **kwargs)
