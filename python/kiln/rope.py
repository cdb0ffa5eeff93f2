"""rope.py — flashinfer.rope's functions: rotary embeddings applied to q and k outside
attention, with FlashInfer's names, arguments, defaults and return values.

    apply_rope(q, k, indptr, offsets, ...)              -> (q_rope, k_rope)
    apply_rope_inplace(q, k, indptr, offsets, ...)      -> None (q and k rotated in place)
    apply_rope_pos_ids(q, k, pos_ids, ...)              -> (q_rope, k_rope)
    apply_rope_pos_ids_inplace(q, k, pos_ids, ...)      -> None
    apply_llama31_rope(...), apply_llama31_rope_inplace(...),
    apply_llama31_rope_pos_ids(...), apply_llama31_rope_pos_ids_inplace(...)
                                                        Llama 3.1's frequency scaling
    apply_rope_with_cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox=True)
    apply_rope_with_cos_sin_cache_inplace(...)          a precomputed cos / sin table

q, k are ragged tensors [nnz, heads, head_dim] (float16, bfloat16 or float32). With indptr
[B + 1] and offsets [B], token t of segment i (indptr[i] <= t < indptr[i + 1]) sits at position
offsets[i] + t - indptr[i]; with pos_ids [nnz] at pos_ids[t]. The first rotary_dim dimensions
(default: all; even) are rotated, the rest copied: non-interleaved pairs (d, d + rotary_dim / 2)
(NeoX / Llama style), interleaved pairs (2d, 2d + 1) (GPT-J style). Pair d turns by pos * f_d,
f_d = theta^(-2d / rotary_dim) / rope_scale; Llama 3.1 blends f_d and f_d / rope_scale by
wavelength (low_freq_factor, high_freq_factor, old_context_len).

These are torch operations (a few elementwise launches; the angles in float64, the rotation in
float32, the result in the input's dtype), not kiln kernels: kiln's own RoPE is fused into its attention kernels
(pos_encoding_mode="ROPE_LLAMA", and rope_offsets in the C API), which engines should prefer.
They run on any device torch does; nothing is compiled.
"""

import math

from . import _check


def _torch():
    from .attention import _torch as load

    return load()


_FLOATS = ("float16", "bfloat16", "float32")


def _tensor3(torch, x, name):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(x).__name__}")
    if x.dim() != 3:
        raise ValueError(f"{name} must be [nnz, heads, head_dim], got shape {tuple(x.shape)}")
    if str(x.dtype).replace("torch.", "") not in _FLOATS:
        raise ValueError(f"{name}: dtype {x.dtype} is not supported (float16, bfloat16, float32)")
    return x


def _check_qk(torch, q, k):
    _tensor3(torch, q, "q")
    _tensor3(torch, k, "k")
    if q.size(0) != k.size(0):
        raise ValueError(f"q has {q.size(0)} tokens, k {k.size(0)}: they must match")
    if q.size(2) != k.size(2):
        raise ValueError(f"q and k head_dim differ ({q.size(2)} and {k.size(2)})")
    if q.device != k.device:
        raise ValueError(f"q is on {q.device}, k on {k.device}")


def _rotary_dim(rotary_dim, head_dim):
    r = head_dim if rotary_dim is None else _check.integer(rotary_dim, "rotary_dim", 2, head_dim)
    if r % 2:
        raise ValueError(f"rotary_dim={r} must be even")
    return r


def _freqs(torch, half, rotary_dim, rope_scale, rope_theta, device, llama31=None):
    """f_d for d < half, float64 on device (llama31: (low, high, old_context_len))."""
    scale = _check.real(rope_scale, "rope_scale")
    theta = _check.real(rope_theta, "rope_theta")
    if not (scale > 0 and theta > 0):
        raise ValueError(f"rope_scale={rope_scale} and rope_theta={rope_theta} must be > 0")
    d = torch.arange(half, device=device, dtype=torch.float64)
    f = theta ** (-2.0 * d / rotary_dim)
    if llama31 is None:
        return f / scale
    low, high, old = llama31
    if not (high > low > 0 and old > 0):
        raise ValueError(f"low_freq_factor={low} < high_freq_factor={high} (both > 0) and "
                         f"old_context_len={old} > 0 are needed")
    # smooth = 0 for long wavelengths (f / scale), 1 for short ones (f), linear between
    smooth = ((old * f / (2 * math.pi) - low) / (high - low)).clamp(0.0, 1.0)
    return (1 - smooth) * f / scale + smooth * f


def _rotate(torch, x, cos, sin, rotary_dim, interleave):
    """x [nnz, H, D] with its first rotary_dim dims turned by the angles of cos / sin
    [nnz, rotary_dim / 2] (float32), in x's dtype."""
    c, s = cos[:, None, :], sin[:, None, :]
    r = x[..., :rotary_dim].float()
    if interleave:
        x1, x2 = r[..., 0::2], r[..., 1::2]
        out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    else:
        half = rotary_dim // 2
        x1, x2 = r[..., :half], r[..., half:]
        out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    out = out.to(x.dtype)
    if rotary_dim == x.size(-1):
        return out
    return torch.cat((out, x[..., rotary_dim:]), dim=-1)


def _positions(torch, indptr, offsets, nnz, device):
    """Position of every token from indptr [B + 1] and offsets [B] (int tensors)."""
    for name, t in (("indptr", indptr), ("offsets", offsets)):
        if not isinstance(t, torch.Tensor) or t.dim() != 1:
            raise ValueError(f"{name} must be a 1-D integer tensor")
        if t.dtype.is_floating_point:
            raise ValueError(f"{name} must hold integers, got {t.dtype}")
    B = offsets.numel()
    if indptr.numel() != B + 1:
        raise ValueError(f"indptr has {indptr.numel()} entries; offsets says batch {B}, so "
                         f"{B + 1}")
    indptr = indptr.to(device=device, dtype=torch.int64)
    offsets = offsets.to(device=device, dtype=torch.int64)
    counts = indptr[1:] - indptr[:-1]
    seg = torch.repeat_interleave(torch.arange(B, device=device), counts, output_size=nnz)
    tok = torch.arange(nnz, device=device)
    return offsets[seg] + tok - indptr[seg]


def _apply(q, k, pos_fn, rotary_dim, interleave, rope_scale, rope_theta, llama31, inplace):
    torch = _torch()
    _check_qk(torch, q, k)
    interleave = _check.flag(interleave, "interleave")
    inplace = _check.flag(inplace, "inplace")
    r = _rotary_dim(rotary_dim, q.size(2))
    pos = pos_fn(torch, q.size(0), q.device).to(torch.float64)
    f = _freqs(torch, r // 2, r, rope_scale, rope_theta, q.device, llama31)
    # the angles in float64 (pos * f_d reaches 1e4 radians and more), the rotation in float32
    ang = pos[:, None] * f[None, :]
    cos, sin = ang.cos().to(torch.float32), ang.sin().to(torch.float32)
    qr = _rotate(torch, q, cos, sin, r, interleave)
    kr = _rotate(torch, k, cos, sin, r, interleave)
    if not inplace:
        return qr, kr
    q.copy_(qr)
    k.copy_(kr)
    return None


def _by_indptr(indptr, offsets):
    return lambda torch, nnz, device: _positions(torch, indptr, offsets, nnz, device)


def _by_pos_ids(pos_ids):
    def fn(torch, nnz, device):
        if not isinstance(pos_ids, torch.Tensor) or pos_ids.dim() != 1:
            raise ValueError("pos_ids must be a 1-D integer tensor [nnz]")
        if pos_ids.numel() != nnz:
            raise ValueError(f"pos_ids has {pos_ids.numel()} entries; q and k have {nnz} tokens")
        if pos_ids.dtype.is_floating_point:
            raise ValueError(f"pos_ids must hold integers, got {pos_ids.dtype}")
        return pos_ids.to(device=device, dtype=torch.int64)
    return fn


def apply_rope(q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=1,
               rope_theta=1e4):
    """FlashInfer's apply_rope: (q_rope, k_rope), positions offsets[i] + t - indptr[i]."""
    return _apply(q, k, _by_indptr(indptr, offsets), rotary_dim, interleave, rope_scale,
                  rope_theta, None, False)


def apply_rope_inplace(q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=1,
                       rope_theta=1e4):
    """FlashInfer's apply_rope_inplace: q and k rotated in place; returns None."""
    return _apply(q, k, _by_indptr(indptr, offsets), rotary_dim, interleave, rope_scale,
                  rope_theta, None, True)


def apply_rope_pos_ids(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=1,
                       rope_theta=1e4):
    """FlashInfer's apply_rope_pos_ids: (q_rope, k_rope) at positions pos_ids [nnz]."""
    return _apply(q, k, _by_pos_ids(pos_ids), rotary_dim, interleave, rope_scale, rope_theta,
                  None, False)


def apply_rope_pos_ids_inplace(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=1,
                               rope_theta=1e4):
    """FlashInfer's apply_rope_pos_ids_inplace; returns None."""
    return _apply(q, k, _by_pos_ids(pos_ids), rotary_dim, interleave, rope_scale, rope_theta,
                  None, True)


def _llama31(low_freq_factor, high_freq_factor, old_context_len):
    return (_check.real(low_freq_factor, "low_freq_factor"),
            _check.real(high_freq_factor, "high_freq_factor"),
            _check.real(old_context_len, "old_context_len"))


def apply_llama31_rope(q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=8,
                       rope_theta=5e5, low_freq_factor=1, high_freq_factor=4,
                       old_context_len=8192):
    """FlashInfer's apply_llama31_rope (Llama 3.1's frequency scaling)."""
    return _apply(q, k, _by_indptr(indptr, offsets), rotary_dim, interleave, rope_scale,
                  rope_theta, _llama31(low_freq_factor, high_freq_factor, old_context_len), False)


def apply_llama31_rope_inplace(q, k, indptr, offsets, rotary_dim=None, interleave=False,
                               rope_scale=8, rope_theta=5e5, low_freq_factor=1,
                               high_freq_factor=4, old_context_len=8192):
    """FlashInfer's apply_llama31_rope_inplace; returns None."""
    return _apply(q, k, _by_indptr(indptr, offsets), rotary_dim, interleave, rope_scale,
                  rope_theta, _llama31(low_freq_factor, high_freq_factor, old_context_len), True)


def apply_llama31_rope_pos_ids(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=8,
                               rope_theta=5e5, low_freq_factor=1, high_freq_factor=4,
                               old_context_len=8192):
    """FlashInfer's apply_llama31_rope_pos_ids."""
    return _apply(q, k, _by_pos_ids(pos_ids), rotary_dim, interleave, rope_scale, rope_theta,
                  _llama31(low_freq_factor, high_freq_factor, old_context_len), False)


def apply_llama31_rope_pos_ids_inplace(q, k, pos_ids, rotary_dim=None, interleave=False,
                                       rope_scale=8, rope_theta=5e5, low_freq_factor=1,
                                       high_freq_factor=4, old_context_len=8192):
    """FlashInfer's apply_llama31_rope_pos_ids_inplace; returns None."""
    return _apply(q, k, _by_pos_ids(pos_ids), rotary_dim, interleave, rope_scale, rope_theta,
                  _llama31(low_freq_factor, high_freq_factor, old_context_len), True)


def _cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox, inplace):
    torch = _torch()
    head_size = _check.integer(head_size, "head_size", 2, _check.INT_MAX)
    is_neox = _check.flag(is_neox, "is_neox")
    if not isinstance(cos_sin_cache, torch.Tensor) or cos_sin_cache.dim() != 2:
        raise ValueError("cos_sin_cache must be a 2-D tensor [max_seq_len, rotary_dim]")
    if cos_sin_cache.dtype != torch.float32:
        raise ValueError(f"cos_sin_cache must be float32, got {cos_sin_cache.dtype}")
    r = cos_sin_cache.size(1)
    if r % 2 or r > head_size:
        raise ValueError(f"cos_sin_cache's rotary_dim {r} must be even and <= head_size "
                         f"{head_size}")
    views = []
    for name, x in (("query", query), ("key", key)):
        if x is None and name == "key":
            views.append(None)
            continue
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.size(1) % head_size:
            raise ValueError(f"{name} must be [nnz, heads * head_size] (head_size {head_size}), "
                             f"got {getattr(x, 'shape', type(x).__name__)}")
        views.append(_tensor3(torch, x.view(x.size(0), -1, head_size), name))
    if not isinstance(positions, torch.Tensor) or positions.dim() != 1 or \
            positions.numel() != query.size(0) or positions.dtype.is_floating_point:
        raise ValueError(f"positions must be a 1-D integer tensor of {query.size(0)} entries")
    if views[1] is not None and views[1].size(0) != views[0].size(0):
        raise ValueError(f"query has {views[0].size(0)} tokens, key {views[1].size(0)}")
    idx = positions.to(device=cos_sin_cache.device, dtype=torch.int64)
    rows = cos_sin_cache.index_select(0, idx).to(query.device)
    cos, sin = rows[:, :r // 2], rows[:, r // 2:]
    outs = [None if v is None else _rotate(torch, v, cos, sin, r, not is_neox) for v in views]
    if inplace:
        for v, o in zip(views, outs):
            if v is not None:
                v.copy_(o)
        return None
    return tuple(None if o is None else o.reshape(x.shape)
                 for o, x in zip(outs, (query, key)))


def apply_rope_with_cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox=True):
    """FlashInfer's apply_rope_with_cos_sin_cache (vLLM / SGLang's layout): query [nnz, H *
    head_size], key [nnz, H_KV * head_size] (or None), cos_sin_cache float32 [max_seq_len,
    rotary_dim], cosines in the first half of a row, sines in the second; is_neox=True rotates
    halves, False interleaved pairs. Returns (query_out, key_out)."""
    return _cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox, False)


def apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cos_sin_cache,
                                          is_neox=True):
    """FlashInfer's apply_rope_with_cos_sin_cache_inplace; returns None."""
    return _cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox, True)


__all__ = ["apply_llama31_rope", "apply_llama31_rope_inplace", "apply_llama31_rope_pos_ids",
           "apply_llama31_rope_pos_ids_inplace", "apply_rope", "apply_rope_inplace",
           "apply_rope_pos_ids", "apply_rope_pos_ids_inplace", "apply_rope_with_cos_sin_cache",
           "apply_rope_with_cos_sin_cache_inplace"]
