"""test_torch.py — the FlashInfer-shaped wrappers on a GPU, against the float64 torch reference
of _reference.py.

Skips unless torch is importable (the reference and the argument checks that need no GPU) and
a CUDA GPU is usable (everything else). Each wrapper runs on fresh random inputs (the seed is in
every failure message) with its output allocation poisoned with NaN first, for several shapes,
both KV layouts, GQA / MQA, causal (bottom-right), sliding window, soft-cap, ALiBi, LSE in both
bases, non-contiguous views, empty requests, a side stream, a CUDA graph, and the raw
Kernel/AttnArgs path on the same inputs.

Kernels compile into $KILN_TEST_CACHE when set (reused across runs, like the C GPU tests), else
into a fresh temporary cache: never the user's default cache.
"""

import math
import random
import unittest

from _reference import (DTYPES, HAVE_GPU, HAVE_TORCH, GpuCase, attention, kiln,  # noqa: F401
                        packbits_little, reference_args, set_up_module, tear_down_module,
                        tolerance, torch)


def setUpModule():
    if HAVE_GPU:
        set_up_module("kiln-py-gpu-")


def tearDownModule():
    tear_down_module()


def _decode_ref(q, k, v, layout, **kw):
    o, lse = attention(q.unsqueeze(0), k, v, layout=layout, **kw)
    return o[0], lse[0]


# ---- no GPU needed -------------------------------------------------------------------------


@unittest.skipUnless(HAVE_TORCH, "needs torch")
class TestMaskPacking(unittest.TestCase):
    """FlashInfer's packed_custom_mask (segment_packbits: each request from a byte boundary)
    turned into kiln's bitmask (requests back to back) equals packing the bool mask directly;
    CPU tensors, odd and empty request sizes."""

    def test_segments(self):
        from kiln.attention import mask_bits_from_packed, pack_mask_bits
        rng = random.Random(3)
        torch.manual_seed(3)
        cpu = torch.device("cpu")
        for trial in range(200):
            sizes = [rng.choice([0, 1, 7, 8, 9, 16, 3330, 1500, rng.randint(0, 500)])
                     for _ in range(rng.randint(1, 6))]
            masks = [torch.rand(n) < 0.5 for n in sizes]
            packed = torch.cat([packbits_little(m) for m in masks])
            want = pack_mask_bits(torch, torch.cat(masks), sum(sizes), cpu)
            got = mask_bits_from_packed(torch, packed, sizes, cpu)
            nb = (sum(sizes) + 7) // 8
            self.assertTrue(torch.equal(got[:nb], want[:nb]), f"sizes {sizes}")
        with self.assertRaises(ValueError) as cm:
            mask_bits_from_packed(torch, torch.zeros(2, dtype=torch.uint8), [9, 1], cpu)
        self.assertIn("packed_custom_mask has 2 bytes", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            mask_bits_from_packed(torch, torch.zeros(2, dtype=torch.int32), [9], cpu)
        self.assertIn("uint8", str(cm.exception))


@unittest.skipUnless(HAVE_TORCH, "needs torch")
class TestReference(unittest.TestCase):
    """The reference itself, against a per-row loop (so the GPU tests compare with the truth)."""

    def test_against_loop(self):
        torch.manual_seed(0)
        L_Q, L_KV, H, H_KV, D = 5, 9, 4, 2, 8
        q, k, v = torch.randn(L_Q, H, D), torch.randn(L_KV, H_KV, D), torch.randn(L_KV, H_KV, D)
        slopes = torch.rand(H)
        for kw in ({}, {"causal": True}, {"causal": True, "window_left": 2},
                   {"window_left": 0}, {"softcap": 2.0}, {"slopes": slopes, "causal": True}):
            o, lse = attention(q, k, v, **kw)
            for i in range(L_Q):
                for h in range(H):
                    row = []
                    for j in range(L_KV):
                        x = float(q[i, h] @ k[j, h // 2]) / math.sqrt(D)
                        if kw.get("softcap"):
                            x = kw["softcap"] * math.tanh(x / kw["softcap"])
                        if "slopes" in kw:
                            x += float(slopes[h]) * (j - (i + L_KV - L_Q))
                        seen = not (kw.get("causal") and j > i + L_KV - L_Q)
                        if kw.get("window_left", -1) >= 0 and j < i + L_KV - L_Q - kw["window_left"]:
                            seen = False
                        row.append(x if seen else -math.inf)
                    m = max(row)
                    w = [math.exp(x - m) for x in row]
                    want_lse = m + math.log(sum(w))
                    want_o = sum(w[j] * v[j, h // 2] for j in range(L_KV)) / sum(w)
                    self.assertAlmostEqual(float(lse[i, h]), want_lse, places=4, msg=str(kw))
                    self.assertTrue(torch.allclose(o[i, h], want_o.double(), atol=1e-5), str(kw))

    def test_hnd_and_empty_rows(self):
        torch.manual_seed(1)
        q, k, v = torch.randn(3, 2, 8), torch.randn(6, 1, 8), torch.randn(6, 1, 8)
        o1, l1 = attention(q, k, v)
        o2, l2 = attention(q, k.transpose(0, 1), v.transpose(0, 1), layout="HND")
        self.assertTrue(torch.equal(o1, o2) and torch.equal(l1, l2))
        # Causal with L_Q > L_KV: the first rows' diagonals are left of every key.
        o, lse = attention(torch.randn(8, 2, 8), k, v, causal=True)
        self.assertTrue(torch.isinf(lse[0]).all() and (o[0] == 0).all())

    def test_cpu_tensors_refused(self):
        q, k = torch.randn(8, 64).half(), torch.randn(16, 8, 64).half()
        with self.assertRaises(ValueError) as cm:
            kiln.single_decode_with_kv_cache(q, k, k)
        self.assertIn("CUDA", str(cm.exception))
        with self.assertRaises(ValueError):
            kiln.single_prefill_with_kv_cache(q.unsqueeze(0), k, k)

    def test_not_yet(self):
        q, k = torch.randn(8, 64).half(), torch.randn(16, 8, 64).half()
        with self.assertRaises(NotImplementedError):  # FlashInfer's fp8 q, k and v
            kiln.single_prefill_with_kv_cache(q.unsqueeze(0), k, k, scale_q=1.0)
        # rope_scale / rope_theta count only with RoPE, as in FlashInfer: accepted here, so
        # the call gets as far as the device check
        with self.assertRaises(ValueError) as cm:
            kiln.single_decode_with_kv_cache(q, k, k, rope_theta=1e4)
        self.assertIn("CUDA", str(cm.exception))

    def test_alibi_slopes(self):
        s = kiln.alibi_slopes(8)
        self.assertTrue(torch.allclose(s, torch.tensor([2.0 ** -(i + 1) for i in range(8)])))
        s = kiln.alibi_slopes(12)  # 8 from 2^-1.., then 4 odd powers of 2^-0.5
        self.assertEqual(tuple(s.shape), (12,))
        self.assertAlmostEqual(float(s[8]), 2.0 ** -0.5, places=6)
        self.assertAlmostEqual(float(s[9]), 2.0 ** -1.5, places=6)


# ---- decode --------------------------------------------------------------------------------


@unittest.skipUnless(HAVE_GPU, "needs torch and a CUDA GPU")
class TestDecode(GpuCase):
    # (H, H_KV, D, L_KV, layout, dtype)
    SHAPES = [
        (32, 8, 128, 1000, "NHD", "bf16"),
        (32, 8, 128, 1000, "HND", "bf16"),
        (8, 8, 64, 33, "NHD", "f16"),
        (8, 8, 64, 1, "HND", "f16"),
        (16, 2, 256, 777, "NHD", "f16"),
        (64, 1, 128, 500, "HND", "bf16"),  # MQA, group 64
        (32, 8, 128, 16384, "NHD", "bf16"),  # long: split-KV with a workspace
    ]

    def kv(self, H_KV, L, D, layout, dtype):
        shape = (L, H_KV, D) if layout == "NHD" else (H_KV, L, D)
        return self.rand(*shape, dtype=dtype), self.rand(*shape, dtype=dtype)

    def run_case(self, H, H_KV, D, L, layout, dtype, **kw):
        q = self.rand(H, D, dtype=dtype)
        k, v = self.kv(H_KV, L, D, layout, dtype)
        self.poison(H, D, dtype=dtype)
        o, lse = kiln.single_decode_with_kv_cache(q, k, v, kv_layout=layout, return_lse=True,
                                                  lse_base="e", **kw)
        ref_kw = reference_args(kw, H, q.device)
        ref_o, ref_lse = _decode_ref(q, k, v, layout, **ref_kw)
        torch.cuda.synchronize()
        what = f"decode H={H} H_KV={H_KV} D={D} L={L} {layout} {dtype} {kw}"
        self.assertEqual(o.dtype, DTYPES[dtype])
        self.assertEqual(tuple(o.shape), (H, D))
        self.assertEqual(lse.dtype, torch.float32)
        atol, rtol = tolerance(dtype)
        self.assertClose(o, ref_o, atol, rtol, what + " o")
        self.assertClose(lse, ref_lse, 1e-2, 1e-3, what + " lse")

    def test_shapes(self):
        for shape in self.SHAPES:
            with self.subTest(shape=shape):
                self.run_case(*shape)

    def test_window(self):
        self.run_case(32, 8, 128, 4096, "NHD", "bf16", window_left=100)
        self.run_case(8, 2, 64, 300, "HND", "f16", window_left=0)

    def test_softcap(self):
        # A larger sm_scale makes logits large enough for the cap to bend them.
        self.run_case(32, 8, 128, 1000, "NHD", "bf16", logits_soft_cap=5.0, sm_scale=0.3)

    def test_alibi(self):
        self.run_case(32, 8, 128, 1000, "NHD", "bf16", pos_encoding_mode="ALIBI")
        slopes = torch.rand(16, device="cuda") * 0.1
        self.run_case(16, 4, 64, 500, "HND", "f16", alibi_slopes=slopes)

    def test_softcap_with_alibi(self):
        # one transform, FlashInfer's order: cap * tanh(x / cap + ALiBi bias)
        self.run_case(32, 8, 128, 1000, "NHD", "bf16", pos_encoding_mode="ALIBI",
                      logits_soft_cap=5.0, sm_scale=0.3)
        slopes = torch.rand(8, device="cuda") * 0.01
        self.run_case(8, 1, 64, 333, "HND", "f16", alibi_slopes=slopes, logits_soft_cap=8.0)

    def test_lse_base_and_plain_return(self):
        q = self.rand(32, 128)
        k, v = self.kv(8, 700, 128, "NHD", "bf16")
        o = kiln.single_decode_with_kv_cache(q, k, v)
        self.assertTrue(torch.is_tensor(o))
        o2, lse2 = kiln.single_decode_with_kv_cache(q, k, v, return_lse=True)  # base 2
        o_e, lse_e = kiln.single_decode_with_kv_cache(q, k, v, return_lse=True, lse_base="e")
        self.assertTrue(torch.equal(o, o2) and torch.equal(o, o_e))
        self.assertClose(lse2, lse_e * kiln.LOG2E, 1e-5, 1e-6, "lse base 2")

    def test_scales(self):
        q = self.rand(8, 64, dtype="f16")
        k, v = self.kv(8, 100, 64, "NHD", "f16")
        o = kiln.single_decode_with_kv_cache(q, k, v, q_scale=0.5, k_scale=2.0, v_scale=3.0)
        ref, _ = _decode_ref(q, k, v, "NHD")
        self.assertClose(o, ref * 3.0, 6e-3, 5e-3, "q/k/v scales")

    def test_rope(self):
        # RoPE inside the kernel (a batch of one): q at position L_KV - 1, keys at 0..L_KV - 1
        for H, H_KV, D, L, layout, dtype in ((32, 8, 128, 700, "NHD", "bf16"),
                                             (8, 8, 64, 33, "HND", "f16"),
                                             (16, 4, 128, 3000, "NHD", "bf16")):  # split
            q = self.rand(H, D, dtype=dtype)
            k, v = self.kv(H_KV, L, D, layout, dtype)
            o, lse = kiln.single_decode_with_kv_cache(
                q, k, v, kv_layout=layout, pos_encoding_mode="ROPE_LLAMA", rope_scale=2.0,
                rope_theta=5e5, return_lse=True, lse_base="e")
            ref_o, ref_lse = _decode_ref(q, k, v, layout, rope_args=(2.0, 5e5))
            torch.cuda.synchronize()
            what = f"rope decode H={H} H_KV={H_KV} D={D} L={L} {layout} {dtype}"
            self.assertEqual(o.dtype, DTYPES[dtype])
            self.assertClose(o, ref_o, 2e-2, 3e-2, what + " o")
            self.assertClose(lse, ref_lse, 2e-2, 2e-3, what + " lse")

    def test_fp8_kv(self):
        # fp8 k, v with float16 / bfloat16 q (a batch of one): k_scale, v_scale dequantise
        for kv_dtype, q_dtype, H, H_KV, D, L, layout in (
                (torch.float8_e4m3fn, "bf16", 32, 8, 128, 1000, "NHD"),
                (torch.float8_e5m2, "f16", 8, 2, 64, 77, "HND"),
                (torch.float8_e4m3fn, "f16", 16, 16, 256, 5000, "NHD")):
            q = self.rand(H, D, dtype=q_dtype)
            k, v = self.kv(H_KV, L, D, layout, "bf16")
            k8, v8 = (k.float() * 4).to(kv_dtype), (v.float() * 4).to(kv_dtype)
            o, lse = kiln.single_decode_with_kv_cache(q, k8, v8, kv_layout=layout, k_scale=0.25,
                                                      v_scale=0.5, return_lse=True,
                                                      lse_base="e")
            ref_o, ref_lse = _decode_ref(q, k8.float() * 0.25, v8.float() * 0.5, layout)
            torch.cuda.synchronize()
            what = f"fp8 decode {kv_dtype} q {q_dtype} H={H} H_KV={H_KV} D={D} L={L} {layout}"
            self.assertEqual(o.dtype, DTYPES[q_dtype])
            self.assertClose(o, ref_o, 2e-2, 3e-2, what + " o")
            self.assertClose(lse, ref_lse, 2e-2, 2e-3, what + " lse")

    def test_rope_inside_capture_raises(self):
        q = self.rand(8, 64)
        k, v = self.kv(8, 100, 64, "NHD", "bf16")
        kiln.single_decode_with_kv_cache(q, k, v, pos_encoding_mode="ROPE_LLAMA")  # warm
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            with self.assertRaises(RuntimeError) as cm:
                with torch.cuda.graph(g):
                    kiln.single_decode_with_kv_cache(q, k, v, pos_encoding_mode="ROPE_LLAMA")
        torch.cuda.current_stream().wait_stream(s)
        self.assertIn("CUDA graph", str(cm.exception))

    def test_non_contiguous(self):
        H, H_KV, D, L = 32, 8, 128, 900
        q = self.rand(H, 2 * D)[:, :D]  # head stride 2D
        kv = self.rand(L, 2, H_KV, D)  # packed k and v: token stride 2 * H_KV * D
        k, v = kv[:, 0], kv[:, 1]
        o = kiln.single_decode_with_kv_cache(q, k, v)
        ref, _ = _decode_ref(q, k, v, "NHD")
        self.assertClose(o, ref, *tolerance("bf16"), "decode strided NHD")
        cache = self.rand(H_KV, 2048, D)  # an HND cache longer than the request
        k, v = cache[:, :L], cache[:, 1000:1000 + L]
        o = kiln.single_decode_with_kv_cache(q, k, v, kv_layout="HND")
        ref, _ = _decode_ref(q, k, v, "HND")
        self.assertClose(o, ref, *tolerance("bf16"), "decode strided HND")

    def test_empty_kv(self):
        q = self.rand(8, 64)
        k = self.rand(0, 8, 64)
        o, lse = kiln.single_decode_with_kv_cache(q, k, k, return_lse=True)
        self.assertTrue((o == 0).all())
        self.assertTrue(torch.isinf(lse).all() and (lse < 0).all())

    def test_bad_inputs(self):
        q = self.rand(8, 64)
        k = self.rand(16, 8, 64)
        with self.assertRaises(ValueError):  # float32
            kiln.single_decode_with_kv_cache(q.float(), k.float(), k.float())
        with self.assertRaises(ValueError):  # mixed dtypes
            kiln.single_decode_with_kv_cache(q, k.half(), k.half())
        with self.assertRaises(ValueError):  # last dim not contiguous
            kiln.single_decode_with_kv_cache(self.rand(64, 8).t(), k, k)
        with self.assertRaises(ValueError):  # not 16-byte aligned
            kiln.single_decode_with_kv_cache(self.rand(8 * 64 + 1)[1:].view(8, 64), k, k)
        with self.assertRaises(ValueError):  # H not a multiple of H_KV
            kiln.single_decode_with_kv_cache(self.rand(12, 64), k, k)
        with self.assertRaises(ValueError):  # wrong rank
            kiln.single_decode_with_kv_cache(q.unsqueeze(0), k, k)
        with self.assertRaises(ValueError):  # bad layout
            kiln.single_decode_with_kv_cache(q, k, k, kv_layout="NDH")
        with self.assertRaises(kiln.KilnUnsupportedError):  # head_dim 96
            kiln.single_decode_with_kv_cache(self.rand(8, 96), self.rand(4, 8, 96),
                                             self.rand(4, 8, 96))
        # soft-cap with ALiBi is supported since logits=softcap_alibi (test_softcap_with_alibi)

    def test_side_stream(self):
        q = self.rand(32, 128)
        k, v = self.kv(8, 16384, 128, "NHD", "bf16")
        want = kiln.single_decode_with_kv_cache(q, k, v)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            got = kiln.single_decode_with_kv_cache(q, k, v)
        torch.cuda.current_stream().wait_stream(s)
        self.assertTrue(torch.equal(got, want))

    def test_cuda_graph(self):
        q = self.rand(32, 128)
        k, v = self.kv(8, 16384, 128, "NHD", "bf16")
        kiln.single_decode_with_kv_cache(q, k, v)  # compile and load outside the capture
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            with torch.cuda.graph(g):
                o = kiln.single_decode_with_kv_cache(q, k, v)
        torch.cuda.current_stream().wait_stream(s)
        for _ in range(2):
            q.copy_(self.rand(32, 128))
            g.replay()
            ref, _ = _decode_ref(q, k, v, "NHD")
            self.assertClose(o, ref, *tolerance("bf16"), "decode in a CUDA graph")

    def test_raw_api_matches_wrapper(self):
        H, H_KV, D, L = 32, 8, 128, 5000
        q = self.rand(H, D)
        k, v = self.kv(H_KV, L, D, "NHD", "bf16")
        want = kiln.single_decode_with_kv_cache(q, k, v)
        ctx = kiln.default_context(q.device)
        kern = ctx.kernel(f"op=decode dtype=bf16 head_dim={D} group={H // H_KV}")
        o = torch.empty_like(q)
        ws = torch.empty(max(kern.workspace_size(H, L), 16), dtype=torch.uint8, device="cuda")
        a = kiln.AttnArgs(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(),
                          num_qo_heads=H, kv_len=L, workspace=ws.data_ptr(),
                          workspace_bytes=ws.numel())
        kern.single_decode(a, torch.cuda.current_stream())
        self.assertTrue(torch.equal(o, want))
        self.assertTrue(kern.info.arch.startswith("sm_"))
        self.assertIn("generated", kern.source)


# ---- prefill -------------------------------------------------------------------------------


@unittest.skipUnless(HAVE_GPU, "needs torch and a CUDA GPU")
class TestPrefill(GpuCase):
    # (L_Q, L_KV, H, H_KV, D, causal, layout, dtype)
    SHAPES = [
        (128, 128, 8, 8, 128, True, "NHD", "f16"),
        (100, 300, 32, 8, 128, True, "NHD", "bf16"),  # bottom-right causal
        (77, 77, 16, 4, 64, False, "HND", "bf16"),
        (200, 150, 8, 2, 256, False, "NHD", "f16"),  # L_Q > L_KV without causal
        (1, 513, 8, 1, 128, True, "HND", "bf16"),
        (333, 1000, 4, 4, 64, True, "NHD", "f16"),
    ]

    def qkv(self, L_Q, L_KV, H, H_KV, D, layout, dtype):
        q = self.rand(L_Q, H, D, dtype=dtype)
        shape = (L_KV, H_KV, D) if layout == "NHD" else (H_KV, L_KV, D)
        return q, self.rand(*shape, dtype=dtype), self.rand(*shape, dtype=dtype)

    def run_case(self, L_Q, L_KV, H, H_KV, D, causal, layout, dtype, o_dtype=None, **kw):
        q, k, v = self.qkv(L_Q, L_KV, H, H_KV, D, layout, dtype)
        out_dtype = o_dtype or dtype
        self.poison(L_Q, H, D, dtype=out_dtype)
        o, lse = kiln.single_prefill_with_kv_cache(q, k, v, causal=causal, kv_layout=layout,
                                                   o_dtype=DTYPES.get(o_dtype), return_lse=True,
                                                   lse_base="e", **kw)
        ref_kw = reference_args(kw, H, q.device)
        ref_o, ref_lse = attention(q, k, v, layout=layout, causal=causal, **ref_kw)
        torch.cuda.synchronize()
        what = f"prefill L_Q={L_Q} L_KV={L_KV} H={H} H_KV={H_KV} D={D} causal={causal} {layout} {dtype} {kw}"
        self.assertEqual(o.dtype, DTYPES[out_dtype])
        self.assertEqual(tuple(o.shape), (L_Q, H, D))
        self.assertEqual(tuple(lse.shape), (L_Q, H))
        atol, rtol = tolerance("bf16" if "bf16" in (dtype, out_dtype) else dtype)
        self.assertClose(o, ref_o, atol, rtol, what + " o")
        self.assertClose(lse, ref_lse, 1e-2, 1e-3, what + " lse")

    def test_shapes(self):
        for shape in self.SHAPES:
            with self.subTest(shape=shape):
                self.run_case(*shape)

    def test_window(self):
        self.run_case(256, 512, 8, 2, 128, True, "NHD", "bf16", window_left=64)
        self.run_case(128, 128, 8, 8, 64, False, "HND", "f16", window_left=16)

    def test_softcap(self):
        self.run_case(128, 256, 8, 8, 128, True, "NHD", "bf16", logits_soft_cap=5.0,
                      sm_scale=0.3)

    def test_alibi(self):
        self.run_case(128, 256, 8, 8, 128, True, "NHD", "bf16", pos_encoding_mode="ALIBI")
        slopes = torch.rand(8, device="cuda") * 0.1
        self.run_case(64, 64, 8, 4, 64, False, "HND", "f16", alibi_slopes=slopes)

    def test_softcap_with_alibi(self):
        self.run_case(128, 256, 8, 8, 128, True, "NHD", "bf16", pos_encoding_mode="ALIBI",
                      logits_soft_cap=5.0, sm_scale=0.3)
        slopes = torch.rand(8, device="cuda") * 0.01
        self.run_case(64, 100, 8, 4, 64, False, "HND", "f16", alibi_slopes=slopes,
                      logits_soft_cap=8.0)

    def test_out_dtype(self):
        self.run_case(64, 128, 8, 8, 128, True, "NHD", "bf16", o_dtype="f16")

    def test_rope(self):
        # RoPE inside the kernel (a batch of one): row i at i + L_KV - L_Q, key j at j
        for L_Q, L_KV, H, H_KV, D, causal, layout, dtype in (
                (100, 300, 32, 8, 128, True, "NHD", "bf16"),
                (77, 77, 16, 4, 64, False, "HND", "f16"),
                (5, 4000, 8, 2, 128, True, "NHD", "bf16")):
            q, k, v = self.qkv(L_Q, L_KV, H, H_KV, D, layout, dtype)
            o, lse = kiln.single_prefill_with_kv_cache(
                q, k, v, causal=causal, kv_layout=layout, pos_encoding_mode="ROPE_LLAMA",
                rope_scale=2.0, rope_theta=5e5, return_lse=True, lse_base="e")
            ref_o, ref_lse = attention(q, k, v, layout=layout, causal=causal,
                                       rope_args=(2.0, 5e5))
            torch.cuda.synchronize()
            what = f"rope prefill L_Q={L_Q} L_KV={L_KV} H={H} H_KV={H_KV} D={D} {layout}"
            self.assertClose(o, ref_o, 2e-2, 3e-2, what + " o")
            self.assertClose(lse, ref_lse, 2e-2, 2e-3, what + " lse")

    def test_fp8_kv(self):
        # fp8 k, v with float16 / bfloat16 q (a batch of one), scale 1
        for kv_dtype, q_dtype, L_Q, L_KV, H, H_KV, D, causal, layout in (
                (torch.float8_e4m3fn, "bf16", 64, 300, 32, 8, 128, True, "NHD"),
                (torch.float8_e5m2, "f16", 33, 33, 8, 8, 64, False, "HND"),
                (torch.float8_e4m3fn, "f16", 3, 2000, 16, 4, 128, True, "NHD")):
            q, k, v = self.qkv(L_Q, L_KV, H, H_KV, D, layout, q_dtype)
            k8, v8 = k.to(kv_dtype), v.to(kv_dtype)
            o = kiln.single_prefill_with_kv_cache(q, k8, v8, causal=causal, kv_layout=layout)
            ref, _ = attention(q, k8.float(), v8.float(), layout=layout, causal=causal)
            torch.cuda.synchronize()
            what = f"fp8 prefill {kv_dtype} q {q_dtype} L_Q={L_Q} L_KV={L_KV} D={D} {layout}"
            self.assertEqual(o.dtype, DTYPES[q_dtype])
            self.assertClose(o, ref, 2e-2, 3e-2, what)

    def test_lse_base(self):
        q, k, v = self.qkv(64, 64, 8, 8, 64, "NHD", "f16")
        o2, lse2 = kiln.single_prefill_with_kv_cache_return_lse(q, k, v, causal=True)
        o_e, lse_e = kiln.single_prefill_with_kv_cache(q, k, v, causal=True, return_lse=True,
                                                       lse_base="e")
        self.assertTrue(torch.equal(o2, o_e))
        self.assertClose(lse2, lse_e * kiln.LOG2E, 1e-5, 1e-6, "lse base 2")

    def test_non_contiguous(self):
        L, H, H_KV, D = 300, 16, 4, 128
        qkv = self.rand(L, H + 2 * H_KV, D)  # a fused QKV projection's output
        q, k, v = qkv[:, :H], qkv[:, H:H + H_KV], qkv[:, H + H_KV:]
        o = kiln.single_prefill_with_kv_cache(q, k, v, causal=True)
        ref, _ = attention(q, k, v, causal=True)
        self.assertClose(o, ref, *tolerance("bf16"), "prefill strided (fused qkv)")
        cache = self.rand(H_KV, 1024, D)
        k, v = cache[:, :L], cache[:, 512:512 + L]
        o = kiln.single_prefill_with_kv_cache(q, k, v, kv_layout="HND")
        ref, _ = attention(q, k, v, layout="HND")
        self.assertClose(o, ref, *tolerance("bf16"), "prefill strided HND")

    def test_empty(self):
        q, k, v = self.qkv(0, 10, 8, 8, 64, "NHD", "f16")
        o, lse = kiln.single_prefill_with_kv_cache(q, k, v, return_lse=True)
        self.assertEqual((tuple(o.shape), tuple(lse.shape)), ((0, 8, 64), (0, 8)))
        q, k, v = self.qkv(5, 0, 8, 8, 64, "NHD", "f16")
        o, lse = kiln.single_prefill_with_kv_cache(q, k, v, return_lse=True)
        self.assertTrue((o == 0).all() and torch.isinf(lse).all())

    def test_custom_mask(self):
        # a bool [L_Q, L_KV] mask AND-ed with causal; one row sees no key
        L_Q, L_KV, H, H_KV, D = 77, 300, 8, 2, 128
        q, k, v = self.rand(L_Q, H, D), self.rand(L_KV, H_KV, D), self.rand(L_KV, H_KV, D)
        mask = torch.rand(L_Q, L_KV, device="cuda") < 0.5
        mask[5] = False
        o, lse = kiln.single_prefill_with_kv_cache(q, k, v, custom_mask=mask, causal=True,
                                                   return_lse=True, lse_base="e")
        ref_o, ref_lse = attention(q, k, v, causal=True, mask=mask)
        self.assertClose(o, ref_o, *tolerance("bf16"), "custom mask o")
        self.assertClose(lse, ref_lse, 1e-2, 1e-3, "custom mask lse")
        with self.assertRaises(ValueError):
            kiln.single_prefill_with_kv_cache(q, k, v, custom_mask=mask[:, :-1])
        # FlashInfer's packed form (packbits, little bit order) gives the same bits: the same o
        packed = packbits_little(mask.reshape(-1))
        o2, lse2 = kiln.single_prefill_with_kv_cache(q, k, v, packed_custom_mask=packed, causal=True,
                                                     return_lse=True, lse_base="e")
        self.assertTrue(torch.equal(o, o2) and torch.equal(lse, lse2), "packed_custom_mask o")
        with self.assertRaises(ValueError) as cm:
            kiln.single_prefill_with_kv_cache(q, k, v, packed_custom_mask=packed[:-1])
        self.assertIn("packed_custom_mask has", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            kiln.single_prefill_with_kv_cache(q, k, v, packed_custom_mask=packed.to(torch.int32))
        self.assertIn("uint8", str(cm.exception))

    def test_causal_needs_short_q(self):
        q, k, v = self.qkv(20, 10, 8, 8, 64, "NHD", "f16")
        with self.assertRaises(ValueError) as cm:
            kiln.single_prefill_with_kv_cache(q, k, v, causal=True)
        self.assertIn("qo_len", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
