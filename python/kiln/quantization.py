"""quantization.py — FlashInfer's packbits and segment_packbits, in plain torch.

packbits(x, bitorder) packs a 1-D binary-valued tensor into uint8 bytes, eight elements a
byte, with numpy.packbits' bit orders: "big" puts the first element in the most significant
bit (bit 7), "little" in the least significant (bit 0); the last byte is padded with zero
bits. segment_packbits packs each segment x[indptr[i]:indptr[i + 1]] on its own, from a byte
boundary, and returns the bytes with the new indptr (int32). kiln's bitmask mask data
(mask_data=bitmask) is packbits(mask.flatten(), bitorder="little").

These are torch operations on the tensors' device (a handful of elementwise kernels), not a
fused kernel; segment_packbits reads one three-element tensor back to the host (a
synchronisation) to size its output, as FlashInfer's does.
"""

from . import _check
from .page import _torch


_SHIFTS = {"big": (7, 6, 5, 4, 3, 2, 1, 0), "little": (0, 1, 2, 3, 4, 5, 6, 7)}


def _bitorder(bitorder):
    return _check.choice(bitorder, "bitorder", ("big", "little"))


def _binary(torch, x, name):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(x).__name__}")
    if x.dim() != 1:
        raise ValueError(f"{name} must be 1-D (FlashInfer packs a 1-D array), got shape "
                         f"{tuple(x.shape)}; flatten it first")
    return x.to(torch.bool)


def _pack_rows(torch, bits, order):
    """bits: bool [n, 8] -> uint8 [n], element t of a row at bit _SHIFTS[order][t]."""
    b = bits.to(torch.uint8)
    out = torch.zeros(b.size(0), dtype=torch.uint8, device=b.device)
    for t, shift in enumerate(_SHIFTS[order]):
        out |= b[:, t] << shift
    return out


def packbits(x, bitorder="big"):
    """FlashInfer's packbits (numpy.packbits semantics): x a 1-D tensor (any dtype; nonzero is
    1), returns uint8 [(x.size(0) + 7) // 8] on x's device. bitorder "big" (default) or
    "little"."""
    order = _bitorder(bitorder)
    torch = _torch()
    bits = _binary(torch, x, "x")
    n = bits.size(0)
    pad = (-n) % 8
    if pad:
        bits = torch.cat([bits, bits.new_zeros(pad)])
    return _pack_rows(torch, bits.view(-1, 8), order)


def segment_packbits(x, indptr, bitorder="big"):
    """FlashInfer's segment_packbits: each segment x[indptr[i]:indptr[i + 1]] packed on its own
    (numpy.packbits semantics, bitorder "big" by default). Returns (y uint8 [new_indptr[-1]] on
    x's device, new_indptr int32 [B + 1] on indptr's device) with new_indptr[i + 1] -
    new_indptr[i] == (indptr[i + 1] - indptr[i] + 7) // 8. Synchronises once (the output size).
    Raises ValueError when indptr decreases or points past x."""
    order = _bitorder(bitorder)
    torch = _torch()
    bits = _binary(torch, x, "x")
    if not isinstance(indptr, torch.Tensor):
        raise TypeError(f"indptr must be a torch.Tensor, not {type(indptr).__name__}")
    if indptr.dim() != 1 or indptr.numel() < 1:
        raise ValueError(f"indptr must be 1-D with batch + 1 >= 1 entries, got shape "
                         f"{tuple(indptr.shape)}")
    if indptr.dtype.is_floating_point or indptr.dtype == torch.bool:
        raise TypeError(f"indptr must hold integers, got {indptr.dtype}")
    seglen = indptr[1:] - indptr[:-1]
    new = torch.zeros(indptr.numel(), dtype=indptr.dtype, device=indptr.device)
    new[1:] = torch.cumsum((seglen + 7) // 8, 0)
    total, last, first, negative = torch.stack(
        [new[-1], indptr[-1], indptr[0], (seglen < 0).sum().to(indptr.dtype)]).tolist()
    if negative or first < 0:
        raise ValueError(f"indptr must start at >= 0 and never decrease, got {indptr.tolist()}")
    if last > bits.numel():
        raise ValueError(f"indptr[-1] = {last} points past x, which has {bits.numel()} elements")
    new_indptr = new.to(torch.int32)
    if total == 0:
        return torch.empty(0, dtype=torch.uint8, device=bits.device), new_indptr
    dev = bits.device
    starts = indptr.to(device=dev, dtype=torch.int64)
    packed = new.to(device=dev, dtype=torch.int64)
    batch = indptr.numel() - 1
    seg = torch.repeat_interleave(torch.arange(batch, device=dev), packed[1:] - packed[:-1],
                                  output_size=total)  # the segment of each output byte
    byte = torch.arange(total, device=dev) - packed[seg]  # byte within its segment
    pos = starts[seg, None] + 8 * byte[:, None] + torch.arange(8, device=dev)[None, :]
    valid = pos < starts[seg + 1, None]
    got = bits[pos.clamp(max=bits.numel() - 1)] & valid
    return _pack_rows(torch, got, order), new_indptr
