"""kiln.integrations.transformers — kiln as a transformers attention implementation.

    import kiln.integrations.transformers                      # registers "kiln"
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="kiln",
                                                 dtype=torch.bfloat16).cuda()

Importing the module registers kiln_attention_forward under the name "kiln" in transformers'
AttentionInterface, with transformers' sdpa mask builder (masking_utils.sdpa_mask) under the same
name in AttentionMaskInterface, so a model hands kiln exactly the mask it would hand sdpa: None
for plain causal or full attention, else a boolean [B, 1, L_Q, L_KV] (True: visible) that already
holds causality, padding, sliding windows and any model-specific pattern.

    query [B, H, L_Q, D], key / value [B, H_KV, L_KV, D] (transformers' layout, any strides)
      ─► each batch row's keys are one page of a paged cache (kv_layout "HND", page_size L_KV):
         no copy of the cache
      ─► mask None, L_Q = 1:  BatchDecodeWithPagedKVCacheWrapper (decode with a cache)
         mask None, L_Q > 1:  BatchPrefillWithPagedKVCacheWrapper, causal=is_causal (L_Q = L_KV;
                              a longer key as in an empty StaticCache is cut to L_Q, as sdpa does)
         mask [B,1,L_Q,L_KV]: BatchPrefillWithPagedKVCacheWrapper with the mask as custom_mask
                              (padded prefill and padded decode: exact for any boolean mask)
      ─► out [B * L_Q, H, D] ─► attn_output [B, L_Q, H, D], attn_weights None

GQA is kiln's group H / H_KV (1..64); D 64, 128 or 256; float16 / bfloat16. One plan serves
every layer of a step: the plan is kept while the shapes, scale, soft-cap and mask object stay
the same. What kiln cannot do raises (NotImplementedError / ValueError), never a different
result: dropout > 0, float (additive) masks, per-head masks, position_bias, attention sinks
(s_aux), output_attentions, float32 models. Padding rows are computed, not removed (a row that
sees no key gets o = 0, where sdpa's value is unspecified). The call plans on the host, so it
is not a torch.compile region: use kiln.ops for compiled graphs.
"""

import threading
import weakref

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .. import batch as _batch

NAME = "kiln"
WORKSPACE_BYTES = 128 << 20  # each of the two wrappers' float workspace (FlashInfer's advice)


class Call:
    """One attention call mapped onto a kiln wrapper (no GPU needed to build one).

    kind: "decode" | "prefill"; q [B * L_Q, H, D]; k_pages, v_pages [B, H_KV, L_KV, D] (one
    page per batch row, HND); plan: the keyword arguments of the wrapper's plan() past the
    index arrays; shape (B, L_Q, H, D) of the output; key: what decides whether a kept plan
    still fits; mask: the caller's mask tensor or None."""

    __slots__ = ("kind", "q", "k_pages", "v_pages", "plan", "shape", "key", "mask")


def _refuse(dropout, kwargs, query):
    if dropout:
        raise NotImplementedError(f"kiln attention: dropout={dropout} is not supported (kiln "
                                  "kernels have no dropout; use it for inference / eval())")
    for name in ("position_bias", "s_aux", "sinks"):
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"kiln attention: {name} is not supported")
    if kwargs.get("output_attentions"):
        raise NotImplementedError("kiln attention: output_attentions=True is not supported "
                                  "(no attention weights are formed)")
    if query.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"kiln attention: the model runs in {query.dtype}; kiln needs float16 "
                         "or bfloat16 (dtype=torch.bfloat16 in from_pretrained)")


def map_call(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
             is_causal=None, softcap=None, **kwargs):
    """transformers' attention arguments -> a Call (see the module comment). Raises for what
    kiln cannot compute exactly."""
    _refuse(dropout, kwargs, query)
    if query.dim() != 4 or key.dim() != 4 or key.shape != value.shape:
        raise ValueError(f"kiln attention: query [B, H, L_Q, D] and key = value [B, H_KV, L_KV, "
                         f"D] expected, got {tuple(query.shape)}, {tuple(key.shape)}, "
                         f"{tuple(value.shape)}")
    B, H, L_Q, D = query.shape
    H_KV, L_KV = key.shape[1], key.shape[2]
    if key.shape[0] != B or key.shape[3] != D:
        raise ValueError(f"kiln attention: key {tuple(key.shape)} does not match query "
                         f"{tuple(query.shape)} (batch, head_dim)")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    mask = attention_mask
    causal = False
    if mask is None:
        causal = bool(is_causal) and L_Q > 1
        if causal and L_KV > L_Q:  # an empty StaticCache's prefill: sdpa keeps the first L_Q keys
            key, value, L_KV = key[:, :, :L_Q], value[:, :, :L_Q], L_Q
        if causal and L_KV < L_Q:
            raise ValueError(f"kiln attention: causal with {L_Q} queries and {L_KV} keys and no "
                             "mask (sdpa aligns it top-left, kiln bottom-right)")
    else:
        if mask.dtype != torch.bool:
            raise NotImplementedError(f"kiln attention: a {mask.dtype} (additive) mask is not "
                                      "supported; kiln takes boolean masks (sdpa's mask builder)")
        if mask.dim() != 4 or mask.shape[1] != 1 or tuple(mask.shape[2:]) != (L_Q, L_KV) or (
                mask.shape[0] not in (1, B)):
            raise NotImplementedError(f"kiln attention: mask {tuple(mask.shape)} is not "
                                      f"[B, 1, L_Q, L_KV] = [{B}, 1, {L_Q}, {L_KV}] (per-head "
                                      "masks are not supported)")
    c = Call()
    c.kind = "decode" if mask is None and L_Q == 1 else "prefill"
    c.q = query.transpose(1, 2).reshape(B * L_Q, H, D)
    c.k_pages, c.v_pages = key, value
    c.shape = (B, L_Q, H, D)
    c.mask = mask
    c.plan = dict(num_qo_heads=H, num_kv_heads=H_KV, head_dim=D, page_size=L_KV,
                  sm_scale=scaling, logits_soft_cap=softcap if softcap else None,
                  q_data_type=query.dtype, lse=False)
    if c.kind == "prefill":
        c.plan["head_dim_qk"] = c.plan.pop("head_dim")
        c.plan["causal"] = causal
        if mask is not None:
            c.plan["custom_mask"] = mask.expand(B, 1, L_Q, L_KV).reshape(-1)
    c.key = (c.kind, B, L_Q, L_KV, H, H_KV, D, query.dtype, query.device, scaling, softcap,
             causal)
    return c


class _Runner:
    """The two wrappers of one device and the plan each holds."""

    def __init__(self, device):
        self.device = device
        self.wrappers = {}  # kind -> (wrapper, its float workspace)
        self.planned = {}  # kind -> (Call.key, weakref to the mask or None, mask version)
        self.pages = {}  # B -> int32 arange(B) on the device: the page of batch row b is b

    def wrapper(self, kind):
        pair = self.wrappers.get(kind)
        if pair is None:
            ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
            cls = (_batch.BatchDecodeWithPagedKVCacheWrapper if kind == "decode"
                   else _batch.BatchPrefillWithPagedKVCacheWrapper)
            pair = self.wrappers[kind] = (cls(ws, kv_layout="HND"), ws)
        return pair

    def run(self, c):
        w, ws = self.wrapper(c.kind)
        mask_ref = None if c.mask is None else (c.mask, c.mask._version)
        kept = self.planned.get(c.kind)
        same = kept is not None and kept[0] == c.key and (
            (kept[1] is None and mask_ref is None) or (
                kept[1] is not None and mask_ref is not None and kept[1]() is c.mask
                and kept[2] == mask_ref[1]))
        if not same:
            B = c.shape[0]
            pages = self.pages.get(B)
            if pages is None:
                pages = self.pages[B] = torch.arange(B, dtype=torch.int32, device=self.device)
            indptr = list(range(B + 1))
            last = [c.plan["page_size"]] * B
            if kept is not None and kept[0][3] != c.key[3]:
                # a new page size (L_KV grows every decode step): drop the wrapper's plan
                # objects, which it keeps one per page size
                w.reset_workspace_buffer(ws)
            self.planned.pop(c.kind, None)
            if c.kind == "decode":
                w.plan(indptr, pages, last, **c.plan)
            else:
                L_Q = c.shape[1]
                w.plan([b * L_Q for b in range(B + 1)], indptr, pages, last, **c.plan)
            self.planned[c.kind] = (c.key, None if c.mask is None else weakref.ref(c.mask),
                                    None if c.mask is None else c.mask._version)
        return w.run(c.q, (c.k_pages, c.v_pages))


_runners = {}
_lock = threading.Lock()


def _execute(c):
    """Run a Call on kiln: out [B * L_Q, H, D]."""
    device = c.q.device
    runner = _runners.get(device)
    if runner is None:
        with _lock:
            runner = _runners.setdefault(device, _Runner(device))
    return runner.run(c)


def kiln_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                           is_causal=None, softcap=None, **kwargs):
    """transformers' attention interface: (attn_output [B, L_Q, H, D], None). kwargs such as
    sliding_window are carried by the mask (sdpa's mask builder) and are otherwise unused."""
    c = map_call(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                 is_causal=is_causal, softcap=softcap, **kwargs)
    return _execute(c).view(c.shape), None


def register(name=NAME):
    """Register kiln under `name` in transformers' AttentionInterface and, with sdpa's mask
    builder, in AttentionMaskInterface (done on import for "kiln")."""
    AttentionInterface.register(name, kiln_attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)


register()
