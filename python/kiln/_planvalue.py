"""_planvalue.py — FlashInfer's read-back attributes of a planned wrapper (wrapper._sm_scale and
its kin) and the effective values a forward() re-plan compares; the CUDA-graph buffer copy."""

import math

from . import _check
from .attention import pos_encoding

# plan() arguments a FlashInfer wrapper keeps as wrapper._<name> after plan() / forward()
_READBACK = ("causal", "pos_encoding_mode", "use_fp16_qk_reduction", "window_left",
             "logits_soft_cap", "sm_scale", "rope_scale", "rope_theta")


def _readback(scalars):
    """The read-back values of a plan's scalar arguments, as FlashInfer's plan() keeps them:
    as given, but logits_soft_cap None as 0.0."""
    out = {name: scalars[name] for name in _READBACK if name in scalars}
    if "logits_soft_cap" in out and out["logits_soft_cap"] is None:
        out["logits_soft_cap"] = 0.0
    return out


class _PlanValue:
    """wrapper._sm_scale and its kin: what the last plan() (or forward()) was given, read as
    FlashInfer's wrappers expose it (AttributeError before a plan). Assigning raises: in kiln
    the value is part of the planned kernel, so writing it would change nothing."""

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        try:
            return obj._planned[self.name[1:]]
        except KeyError:
            raise AttributeError(f"{type(obj).__name__}.{self.name}: no plan() yet") from None

    def __set__(self, obj, value):
        raise AttributeError(
            f"{type(obj).__name__}.{self.name} is read-only in kiln: the value is part of the "
            "planned kernel; pass it to plan() (or kiln.fast_decode_plan) instead")


def _effective(scalars, D):
    """What a plan's attention arguments mean, defaults resolved (FlashInfer's: sm_scale None
    is 1/sqrt(head_dim), logits_soft_cap None is 0, window_left None or < 0 is no window,
    rope_scale / rope_theta None are 1 / 1e4 and matter only with ROPE_LLAMA): equal tuples
    plan the same kernel with the same parameters."""
    mode = pos_encoding(scalars["pos_encoding_mode"])
    scale = _check.real(scalars["sm_scale"], "sm_scale", none=True)
    cap = _check.real(scalars["logits_soft_cap"], "logits_soft_cap", none=True)
    window = _check.integer(scalars["window_left"], "window_left", none=True)
    rope = (None, None)
    if mode == "ROPE_LLAMA":
        rs = _check.real(scalars["rope_scale"], "rope_scale", none=True)
        rt = _check.real(scalars["rope_theta"], "rope_theta", none=True)
        rope = (1.0 if rs is None else rs, 1e4 if rt is None else rt)
    return (_check.flag(scalars.get("causal", False), "causal"), mode,
            1.0 / math.sqrt(D) if scale is None else scale, cap or 0.0,
            -1 if window is None or window < 0 else window) + rope


def _capturing(torch):
    """Whether the current stream is capturing a CUDA graph (False where CUDA is absent)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _copy_into(torch, buf, values, name):
    """buf[:n] = values (a tensor on any device, or a sequence), asynchronously when it can be;
    nothing when values is buf's own memory."""
    if isinstance(values, torch.Tensor):
        src = values.reshape(-1)
        if src.device == buf.device and src.data_ptr() == buf.data_ptr():
            return
    else:
        src = torch.tensor([int(x) for x in values], dtype=torch.int32)
    n = src.numel()
    if n > buf.numel():
        raise ValueError(f"{name}: {n} entries exceed the {buf.numel()} of its CUDA-graph buffer")
    buf[:n].copy_(src, non_blocking=True)
