"""test_transformers.py — kiln.integrations.transformers: attn_implementation="kiln".

Skips without torch or transformers. On the CPU: the registration (attention function and mask
builder under "kiln"), the argument mapping (shapes, GQA groups, causal / padding / mask
handling, StaticCache's long key, the refusals), and whole small models run with the mapping
executed by a float32 reference instead of kiln's kernels (so the mapping, not the kernels, is
what is checked): padded prefill and cached decode match transformers' sdpa path. On a CUDA GPU:
random-weight Llama-shaped (GQA, head dim 128) and Qwen2-shaped (GQA, head dim 64) models of two
layers, padded prefill and cached decode steps, kiln in bfloat16 against the same model in
float32 sdpa: kiln's logits error is at most 1.5x transformers' own bfloat16 sdpa error plus a
small epsilon.
"""

import copy
import math
import os
import sys
import unittest
from unittest import mock

_SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
if os.environ.get("KILN_TEST_INSTALLED") != "1" and os.path.isdir(os.path.join(_SRC, "kiln")):
    sys.path.insert(0, _SRC)

from _reference import set_up_module, tear_down_module  # noqa: E402

try:
    import torch
    import transformers
    from kiln.integrations import transformers as kt
except ImportError:  # the whole file skips
    torch = transformers = kt = None

HAVE = kt is not None
HAVE_GPU = HAVE and torch.cuda.is_available()


def setUpModule():
    if HAVE_GPU:
        set_up_module("kiln-py-hf-")


def tearDownModule():
    tear_down_module()


class _Module:
    is_causal = True


def reference_execute(c):
    """A Call executed in float32 torch: each batch row's page is its keys; the custom mask,
    else bottom-right causal, else everything is visible; a row that sees nothing gets 0."""
    B, L_Q, H, D = c.shape
    q = c.q.view(B, L_Q, H, D).float()
    L_KV = c.plan["page_size"]
    scale = c.plan["sm_scale"] or 1.0 / math.sqrt(D)
    group = H // c.plan["num_kv_heads"]
    out = []
    for b in range(B):
        k = c.k_pages[b].float().repeat_interleave(group, dim=0)  # [H, L_KV, D]
        v = c.v_pages[b].float().repeat_interleave(group, dim=0)
        s = torch.einsum("qhd,hkd->hqk", q[b], k) * scale
        cap = c.plan["logits_soft_cap"]
        if cap:
            s = cap * torch.tanh(s / cap)
        if "custom_mask" in c.plan:
            visible = c.plan["custom_mask"].view(B, L_Q, L_KV)[b]
        elif c.plan.get("causal"):
            i = torch.arange(L_Q)[:, None]
            visible = torch.arange(L_KV)[None, :] <= i + L_KV - L_Q
        else:
            visible = torch.ones(L_Q, L_KV, dtype=torch.bool)
        s = s.masked_fill(~visible.to(s.device), float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        out.append(torch.einsum("hqk,hkd->qhd", p, v))
    return torch.cat(out).to(c.q.dtype)


def _config(kind, vocab=256):
    """Two-layer random-weight configs: "llama" (H 4, H_KV 2, D 128), "qwen" (H 8, H_KV 2, D 64,
    qkv bias)."""
    if kind == "llama":
        return transformers.LlamaConfig(vocab_size=vocab, hidden_size=512, intermediate_size=768,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=128,
                                        max_position_embeddings=512)
    return transformers.Qwen2Config(vocab_size=vocab, hidden_size=512, intermediate_size=768,
                                    num_hidden_layers=2, num_attention_heads=8,
                                    num_key_value_heads=2, max_position_embeddings=512)


def _models(kind, device, dtype):
    """(float32 sdpa, dtype sdpa, dtype kiln) copies of one random-weight model."""
    torch.manual_seed(15)
    cfg = _config(kind)
    base = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    base = base.to(device).eval()
    low = copy.deepcopy(base).to(dtype)
    ours = copy.deepcopy(base).to(dtype)
    ours.set_attn_implementation("kiln")
    return base, low, ours


def _batch(device, B=3, L=24, vocab=256, pad=(0, 5, 11)):
    """Left-padded token ids [B, L] and their attention mask (row b has pad[b] pads)."""
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(1, vocab, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.long)
    for b, n in enumerate(pad[:B]):
        mask[b, :n] = 0
        ids[b, :n] = 0
    return ids.to(device), mask.to(device)


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _logits_over_steps(model, ids, mask, steps):
    """Padded prefill, then `steps` cached decode steps fed fixed tokens: the logits of every
    non-padding position, one [N, vocab] float32 tensor."""
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        got = [out.logits[mask.bool()].float()]
        cache = out.past_key_values
        g = torch.Generator().manual_seed(3)
        for _ in range(steps):
            nxt = torch.randint(1, model.config.vocab_size, (ids.shape[0], 1), generator=g)
            nxt = nxt.to(ids.device)
            mask = torch.cat([mask, torch.ones_like(nxt)], dim=1)
            out = model(input_ids=nxt, attention_mask=mask, past_key_values=cache,
                        use_cache=True)
            cache = out.past_key_values
            got.append(out.logits[:, -1].float())
    return torch.cat(got)


@unittest.skipUnless(HAVE, "torch or transformers is not installed")
class TestMapping(unittest.TestCase):
    def test_registered(self):
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        self.assertIs(ALL_ATTENTION_FUNCTIONS["kiln"], kt.kiln_attention_forward)
        self.assertIs(ALL_MASK_ATTENTION_FUNCTIONS["kiln"], sdpa_mask)
        model = transformers.AutoModelForCausalLM.from_config(_config("llama"),
                                                             attn_implementation="kiln")
        self.assertEqual(model.config._attn_implementation, "kiln")

    def test_prefill_and_decode_mapping(self):
        B, H, H_KV, D = 2, 8, 2, 64
        q = torch.randn(B, H, 5, D, dtype=torch.bfloat16)
        k = torch.randn(B, H_KV, 5, D, dtype=torch.bfloat16)
        c = kt.map_call(_Module(), q, k, k, None, scaling=0.2, softcap=30.0)
        self.assertEqual(c.kind, "prefill")
        self.assertEqual(tuple(c.q.shape), (B * 5, H, D))
        torch.testing.assert_close(c.q.view(B, 5, H, D), q.transpose(1, 2))
        self.assertEqual(c.plan["num_qo_heads"] // c.plan["num_kv_heads"], 4)  # the GQA group
        self.assertEqual((c.plan["page_size"], c.plan["causal"], c.plan["sm_scale"],
                          c.plan["logits_soft_cap"]), (5, True, 0.2, 30.0))
        self.assertNotIn("custom_mask", c.plan)
        self.assertEqual(c.plan["head_dim_qk"], D)  # the prefill wrapper's name for it
        self.assertFalse(kt.map_call(_Module(), q, k, k, None, is_causal=False).plan["causal"])
        # decode with a cache: one query row, every cached key, no mask
        kc = torch.randn(B, H_KV, 40, D, dtype=torch.bfloat16)
        c = kt.map_call(_Module(), q[:, :, :1], kc, kc, None)
        self.assertEqual((c.kind, tuple(c.q.shape), c.plan["page_size"], c.plan["head_dim"]),
                         ("decode", (B, H, D), 40, D))
        self.assertIs(c.k_pages, kc)  # the cache itself: one page per batch row, no copy
        # a padded decode: the mask goes to the prefill wrapper as a custom mask
        m = torch.ones(B, 1, 1, 40, dtype=torch.bool)
        m[1, :, :, :7] = False
        c = kt.map_call(_Module(), q[:, :, :1], kc, kc, m)
        self.assertEqual(c.kind, "prefill")
        self.assertFalse(c.plan["causal"])
        torch.testing.assert_close(c.plan["custom_mask"], m.reshape(-1))

    def test_static_cache_prefill_cuts_keys(self):
        q = torch.randn(1, 4, 6, 128, dtype=torch.float16)
        k = torch.randn(1, 2, 32, 128, dtype=torch.float16)
        c = kt.map_call(_Module(), q, k, k, None)
        self.assertEqual((c.plan["page_size"], tuple(c.k_pages.shape)), (6, (1, 2, 6, 128)))

    def test_refusals(self):
        q = torch.randn(1, 4, 3, 64, dtype=torch.bfloat16)
        k = torch.randn(1, 2, 3, 64, dtype=torch.bfloat16)
        cases = [
            (dict(dropout=0.1), NotImplementedError, "dropout"),
            (dict(position_bias=torch.zeros(1)), NotImplementedError, "position_bias"),
            (dict(s_aux=torch.zeros(4)), NotImplementedError, "s_aux"),
            (dict(output_attentions=True), NotImplementedError, "output_attentions"),
            (dict(attention_mask=torch.zeros(1, 1, 3, 3)), NotImplementedError, "additive"),
            (dict(attention_mask=torch.ones(1, 4, 3, 3, dtype=torch.bool)), NotImplementedError,
             "per-head"),
        ]
        for extra, exc, words in cases:
            mask = extra.pop("attention_mask", None)
            with self.subTest(extra=list(extra) or words), self.assertRaisesRegex(exc, words):
                kt.map_call(_Module(), q, k, k, mask, **extra)
        with self.assertRaisesRegex(ValueError, "float16 or bfloat16"):
            kt.map_call(_Module(), q.float(), k.float(), k.float(), None)
        with self.assertRaisesRegex(ValueError, "bottom-right"):
            kt.map_call(_Module(), torch.randn(1, 4, 8, 64, dtype=torch.bfloat16), k, k, None)

    def test_models_with_reference_kernels(self):
        """Whole models on the CPU, the mapped calls run by reference_execute: kiln's mapping
        of padded prefill and cached decode gives sdpa's logits (both bfloat16)."""
        for kind in ("llama", "qwen"):
            with self.subTest(kind=kind), mock.patch.object(kt, "_execute", reference_execute):
                base, low, ours = _models(kind, "cpu", torch.bfloat16)
                ids, mask = _batch("cpu")
                want = _logits_over_steps(low, ids, mask, steps=3)
                got = _logits_over_steps(ours, ids, mask, steps=3)
                self.assertLess(_rel(got, want), 2e-2)
                full = torch.ones_like(mask)  # no padding: the mask-free causal / decode paths
                want = _logits_over_steps(low, ids, full, steps=2)
                got = _logits_over_steps(ours, ids, full, steps=2)
                self.assertLess(_rel(got, want), 2e-2)


@unittest.skipUnless(HAVE_GPU, "no CUDA GPU, or no torch / transformers")
class TestModelsGPU(unittest.TestCase):
    def _check(self, kind):
        base, low, ours = _models(kind, "cuda", torch.bfloat16)
        for name, pad in (("padded", (0, 5, 11)), ("unpadded", (0, 0, 0))):
            ids, mask = _batch("cuda", pad=pad)
            ref = _logits_over_steps(base, ids, mask, steps=4)
            sdpa = _rel(_logits_over_steps(low, ids, mask, steps=4), ref)
            got = _rel(_logits_over_steps(ours, ids, mask, steps=4), ref)
            print(f"\n{kind} {name}: rel-L2 vs float32 sdpa: kiln bf16 {got:.6e}, "
                  f"sdpa bf16 {sdpa:.6e}", file=sys.stderr)
            self.assertLessEqual(got, 1.5 * sdpa + 1e-3, f"{kind} {name}")

    def test_llama_gqa_d128(self):
        self._check("llama")

    def test_qwen_gqa_d64(self):
        self._check("qwen")

    def test_generate(self):
        """generate() runs end to end with kiln (greedy, a few tokens, padded batch)."""
        base, low, ours = _models("llama", "cuda", torch.bfloat16)
        ids, mask = _batch("cuda")
        out = ours.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6,
                            do_sample=False)
        self.assertEqual(tuple(out.shape), (ids.shape[0], ids.shape[1] + 6))


if __name__ == "__main__":
    unittest.main()
