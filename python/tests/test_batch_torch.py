"""test_batch_torch.py — the batch wrappers and state merges on a GPU, against the float64 torch
reference of _reference.py: pages gathered per request, bottom-right causal, GQA, window, soft-cap,
fp8 KV with scales, llama RoPE; merges against the log-sum-exp formula.

Skips unless torch is importable (the reference self-checks), a CUDA GPU is usable and the
loaded libkiln.so has the batch API (everything else). Inputs are fresh random data (the seed
is in every failure message); outputs are poisoned with NaN first. Kernels compile into
$KILN_TEST_CACHE when set, else a fresh temporary cache.
"""

import unittest

from _reference import RUN_BATCH_GPU as RUN_GPU
from _reference import WHY_BATCH as WHY
from _reference import (DTYPES, HAVE_GPU, HAVE_TORCH, GpuCase, attention, gather,  # noqa: F401
                        kiln, packbits_little, rope, set_up_module, tear_down_module, tolerance,
                        torch)

WS_BYTES = 128 << 20  # FlashInfer's advice


def setUpModule():
    if RUN_GPU:
        set_up_module("kiln-py-batch-")


def tearDownModule():
    tear_down_module()


class PagedBatch:
    """A random paged batch: kv lengths, qo lengths, a shuffled page pool."""

    def __init__(self, kv_lens, qo_lens, H_KV, D, P, layout, dtype, extra_pages=5):
        self.kv_lens, self.qo_lens, self.P, self.layout = kv_lens, qo_lens, P, layout
        n_pages = [(L + P - 1) // P for L in kv_lens]
        total = sum(n_pages) + extra_pages
        perm = torch.randperm(total).tolist()
        self.pages, at = [], 0
        for n in n_pages:
            self.pages.append(perm[at:at + n])
            at += n
        self.indptr = [0]
        for n in n_pages:
            self.indptr.append(self.indptr[-1] + n)
        self.indices = torch.tensor(sum(self.pages, []), dtype=torch.int32, device="cuda")
        self.last = [(L - (n - 1) * P) if n else 0 for L, n in zip(kv_lens, n_pages)]
        self.qo_indptr = [0]
        for n in qo_lens:
            self.qo_indptr.append(self.qo_indptr[-1] + n)
        shape = (total, P, H_KV, D) if layout == "NHD" else (total, H_KV, P, D)
        self.k = torch.randn(*shape, device="cuda").to(dtype)
        self.v = torch.randn(*shape, device="cuda").to(dtype)

    def kv(self, b):
        return (gather(self.k, self.pages[b], self.last[b], self.layout),
                gather(self.v, self.pages[b], self.last[b], self.layout))


class Base(GpuCase):
    """GpuCase with a FlashInfer-sized workspace."""

    def setUp(self):
        super().setUp()
        self.ws = torch.zeros(WS_BYTES, dtype=torch.uint8, device="cuda")


# ---- the reference itself (torch only) -----------------------------------------------------


@unittest.skipUnless(HAVE_TORCH, "needs torch")
class TestReference(unittest.TestCase):
    def test_gather_layouts_agree(self):
        torch.manual_seed(0)
        pool = torch.randn(6, 4, 2, 8)  # NHD, page_size 4
        k = gather(pool, [3, 0, 5], 2, "NHD")
        self.assertEqual(tuple(k.shape), (10, 2, 8))
        self.assertTrue(torch.equal(k[:4], pool[3]) and torch.equal(k[8:], pool[5, :2]))
        k2 = gather(pool.transpose(1, 2).contiguous(), [3, 0, 5], 2, "HND")
        self.assertTrue(torch.equal(k, k2))

    def test_rope_rotates_pairs(self):
        x = torch.randn(3, 2, 8)
        y = rope(x, torch.arange(3))
        self.assertTrue(torch.allclose(y[0], x[0]))  # position 0: identity
        self.assertTrue(torch.allclose(y.norm(dim=-1), x.norm(dim=-1), atol=1e-5))
        # q.k depends on the distance only
        q, k = torch.randn(1, 1, 8), torch.randn(1, 1, 8)
        a = (rope(q, torch.tensor([5])) * rope(k, torch.tensor([2]))).sum()
        b = (rope(q, torch.tensor([9])) * rope(k, torch.tensor([6]))).sum()
        self.assertAlmostEqual(float(a), float(b), places=4)

    def test_causal_bottom_right(self):
        q, k = torch.randn(2, 1, 8), torch.randn(5, 1, 8)
        o, lse = attention(q, k, k, causal=True)
        o4, lse4 = attention(q[:1], k[:4], k[:4])  # row 0 sees keys 0..3
        self.assertTrue(torch.allclose(o[0], o4[0], atol=1e-6))


# ---- decode --------------------------------------------------------------------------------


@unittest.skipUnless(RUN_GPU, WHY)
class TestBatchDecode(Base):
    # (kv_lens, H, H_KV, D, page_size, layout, dtype)
    SHAPES = [
        ([7, 100, 1, 513, 64], 32, 8, 128, 16, "NHD", "bf16"),
        ([33, 0, 250], 8, 8, 64, 1, "HND", "f16"),  # a request with no pages; page_size 1
        ([4000, 17], 64, 1, 128, 64, "NHD", "bf16"),  # MQA, a long request (split)
        ([300, 301, 302, 303], 16, 2, 256, 32, "HND", "f16"),
    ]

    def run_case(self, kv_lens, H, H_KV, D, P, layout, dtype, single_tensor=False, **kw):
        b = PagedBatch(kv_lens, [1] * len(kv_lens), H_KV, D, P, layout, DTYPES[dtype])
        q = self.rand(len(kv_lens), H, D, dtype=dtype)
        w = kiln.BatchDecodeWithPagedKVCacheWrapper(self.ws, layout, lse_base="e")
        w.plan(torch.tensor(b.indptr, dtype=torch.int32, device="cuda"), b.indices,
               torch.tensor(b.last, dtype=torch.int32), H, H_KV, D, P, q_data_type=DTYPES[dtype],
               **kw)
        cache = torch.stack([b.k, b.v], dim=1) if single_tensor else (b.k, b.v)
        self.poison(len(kv_lens), H, D, dtype=dtype)
        o, lse = w.run(q, cache, return_lse=True)
        torch.cuda.synchronize()
        what = f"batch decode {kv_lens} H={H} H_KV={H_KV} D={D} P={P} {layout} {dtype} {kw}"
        self.assertEqual((o.dtype, tuple(o.shape)), (DTYPES[dtype], (len(kv_lens), H, D)))
        ref_kw = dict(window_left=kw.get("window_left", -1), softcap=kw.get("logits_soft_cap"),
                      sm_scale=kw.get("sm_scale"))
        if kw.get("pos_encoding_mode") == "ALIBI":
            ref_kw["slopes"] = kiln.alibi_slopes(H, "cuda")
        for r, _ in enumerate(kv_lens):
            k, v = b.kv(r)
            ref_o, ref_lse = attention(q[r:r + 1], k, v, **ref_kw)
            self.assertClose(o[r], ref_o[0], *tolerance(dtype), f"{what} o[{r}]")
            self.assertClose(lse[r], ref_lse[0], 1e-2, 1e-3, f"{what} lse[{r}]")
        return w, b, q, o, lse

    def test_shapes(self):
        for shape in self.SHAPES:
            with self.subTest(shape=shape):
                self.run_case(*shape)

    def test_all_requests_empty(self):
        """No request has a key (no pages at all): o = 0 and lse = -inf, eagerly and with the
        CUDA-graph wrapper (whose buffers hold the page ids)."""
        for kv_lens, graph in (([0, 0, 0], False), ([0], False), ([0, 0], True)):
            b = PagedBatch(kv_lens, [1] * len(kv_lens), 2, 64, 16, "NHD", torch.float16)
            q = self.rand(len(kv_lens), 8, 64, dtype="f16")
            kw = dict(use_cuda_graph=True, paged_kv_indptr_buffer=torch.zeros(
                          4, dtype=torch.int32, device="cuda"),
                      paged_kv_indices_buffer=torch.zeros(64, dtype=torch.int32, device="cuda"),
                      paged_kv_last_page_len_buffer=torch.zeros(
                          3, dtype=torch.int32, device="cuda")) if graph else {}
            w = kiln.BatchDecodeWithPagedKVCacheWrapper(self.ws, "NHD", lse_base="e", **kw)
            w.plan(b.indptr, b.indices, b.last, 8, 2, 64, 16)
            self.poison(len(kv_lens), 8, 64, dtype="f16")
            o, lse = w.run(q, (b.k, b.v), return_lse=True)
            torch.cuda.synchronize()
            what = f"all-empty decode {kv_lens} graph={graph}"
            self.assertTrue(torch.equal(o, torch.zeros_like(o)), what)
            self.assertTrue(bool(torch.isneginf(lse).all()), what)

    def test_single_tensor_cache(self):
        self.run_case([50, 60], 8, 2, 128, 16, "NHD", "bf16", single_tensor=True)
        self.run_case([50, 60], 8, 2, 128, 16, "HND", "f16", single_tensor=True)

    def test_alibi_and_softcap_alibi(self):
        self.run_case([1000, 20, 300], 32, 8, 128, 16, "NHD", "bf16", pos_encoding_mode="ALIBI")
        # both: FlashInfer's order, cap * tanh(x / cap + ALiBi bias); G 4 packed and G 1
        self.run_case([700, 1, 5000], 32, 8, 128, 16, "NHD", "bf16", pos_encoding_mode="ALIBI",
                      logits_soft_cap=5.0, sm_scale=0.3)
        self.run_case([99, 640], 8, 8, 64, 16, "HND", "f16", pos_encoding_mode="ALIBI",
                      logits_soft_cap=8.0)

    def test_window_softcap(self):
        self.run_case([1000, 20, 300], 32, 8, 128, 16, "NHD", "bf16", window_left=64)
        self.run_case([500, 200], 16, 4, 128, 16, "NHD", "bf16", logits_soft_cap=5.0,
                      sm_scale=0.3)

    def test_lse_base_two_and_out(self):
        b = PagedBatch([100, 200], [1, 1], 2, 64, 16, "NHD", torch.float16)
        q = self.rand(2, 8, 64, dtype="f16")
        w2 = kiln.BatchDecodeWithPagedKVCacheWrapper(self.ws)  # FlashInfer's base 2
        w2.plan(b.indptr, b.indices, b.last, 8, 2, 64, 16)
        out = torch.empty(2, 8, 64, dtype=torch.float16, device="cuda")
        lse = torch.empty(2, 8, device="cuda")
        o2, l2 = w2.run(q, (b.k, b.v), out=out, lse=lse, return_lse=True)
        self.assertTrue(o2 is out and l2 is lse)
        ws_e = torch.zeros(WS_BYTES, dtype=torch.uint8, device="cuda")
        we = kiln.BatchDecodeWithPagedKVCacheWrapper(ws_e, lse_base="e")
        we.plan(b.indptr, b.indices, b.last, 8, 2, 64, 16)
        oe, le = we.run(q, (b.k, b.v), return_lse=True)
        self.assertTrue(torch.equal(o2, oe))
        self.assertClose(l2, le * kiln.LOG2E, 1e-5, 1e-6, "lse base 2")
        self.assertTrue(torch.is_tensor(w2.run(q, (b.k, b.v))))  # no lse asked

    def test_fp8_kv(self):
        for kv_name, kv_dtype in (("float8_e4m3fn", torch.float8_e4m3fn),
                                  ("float8_e5m2", torch.float8_e5m2)):
            b = PagedBatch([200, 77], [1, 1], 2, 128, 16, "NHD", torch.float32)
            b.k, b.v = (b.k * 4).to(kv_dtype), (b.v * 4).to(kv_dtype)
            q = self.rand(2, 8, 128)
            w = kiln.BatchDecodeWithPagedKVCacheWrapper(self.ws, lse_base="e")
            w.plan(b.indptr, b.indices, b.last, 8, 2, 128, 16, q_data_type=torch.bfloat16,
                   kv_data_type=kv_name)
            self.assertEqual(w.variant.kv_dtype, kv_name[len("float8_"):][:4])
            o = w.run(q, (b.k, b.v), k_scale=0.25, v_scale=0.5)
            for r in range(2):
                k, v = b.kv(r)
                ref, _ = attention(q[r:r + 1], k.float() * 0.25, v.float() * 0.5)
                self.assertClose(o[r], ref[0], 2e-2, 3e-2, f"fp8 {kv_name} o[{r}]")

    def test_scales_fold_like_flashinfer(self):
        b = PagedBatch([90], [1], 8, 64, 16, "NHD", torch.float16)
        q = self.rand(1, 8, 64, dtype="f16")
        w = kiln.BatchDecodeWithPagedKVCacheWrapper(self.ws)
        w.plan(b.indptr, b.indices, b.last, 8, 8, 64, 16)
        o = w.run(q, (b.k, b.v), q_scale=0.5, k_scale=2.0, v_scale=3.0)
        k, v = b.kv(0)
        ref, _ = attention(q, k, v)
        self.assertClose(o[0], ref[0] * 3.0, 6e-3, 5e-3, "q/k/v scales")

    def test_rope(self):
        b = PagedBatch([123, 40], [1, 1], 4, 128, 16, "NHD", torch.bfloat16)
        q = self.rand(2, 16, 128)
        w = kiln.BatchDecodeWithPagedKVCacheWrapper(self.ws)
        w.plan(b.indptr, b.indices, b.last, 16, 4, 128, 16, pos_encoding_mode="ROPE_LLAMA",
               q_data_type="bfloat16", rope_scale=2.0, rope_theta=5e5)
        self.assertTrue(w.variant.rope)
        o = w.run(q, (b.k, b.v))
        for r in range(2):
            k, v = b.kv(r)
            ref, _ = attention(q[r:r + 1], k, v, rope_args=(2.0, 5e5))
            self.assertClose(o[r], ref[0], 2e-2, 3e-2, f"rope o[{r}]")

    def test_batch_invariant(self):
        # fixed_split_size: a request's output is bitwise the same in any batch.
        b = PagedBatch([3000, 50, 1200, 7], [1] * 4, 2, 128, 16, "NHD", torch.bfloat16)
        q = self.rand(4, 16, 128)
        w = kiln.BatchDecodeWithPagedKVCacheWrapper(self.ws)
        w.plan(b.indptr, b.indices, b.last, 16, 2, 128, 16, q_data_type="bfloat16",
               fixed_split_size=8)
        full = w.run(q, (b.k, b.v)).clone()
        pages0 = b.pages[0]
        w.plan([0, len(pages0)], b.indices[:len(pages0)], [b.last[0]], 16, 2, 128, 16,
               q_data_type="bfloat16", fixed_split_size=8)
        alone = w.run(q[:1], (b.k, b.v))
        self.assertTrue(torch.equal(alone[0], full[0]), f"batch-invariant (seed {self.seed})")
        self.assertGreater(w.plan_info.items, 1)

    def test_tiny_workspace_does_not_split(self):
        # the schedule lives in the wrapper's own buffer and the float workspace holds only
        # the split-KV partial states: one too small for any just means no split, same result
        b = PagedBatch([50000], [1], 8, 128, 16, "NHD", torch.bfloat16)
        q = self.rand(1, 64, 128)
        runs = []
        for ws in (torch.empty(64, dtype=torch.uint8, device="cuda"), self.ws):
            w = kiln.BatchDecodeWithPagedKVCacheWrapper(ws)
            w.plan(b.indptr, b.indices, b.last, 64, 8, 128, 16, q_data_type="bfloat16")
            runs.append((w.plan_info.split_items, w.run(q, (b.k, b.v)).float()))
        (tiny, o), (full, ref) = runs
        self.assertEqual(tiny, 0)
        self.assertGreater(full, 0)
        self.assertClose(o, ref, 2e-2, 2e-2, "a 64-byte workspace: no split, same result")

    def test_small_workspace_splits_less(self):
        # FlashInfer's tests pass 16 MB to a 1-request paged prefill: a workspace smaller than
        # kiln_plan_workspace_size holds fewer partial slots, so the schedule splits less, with
        # the same result
        b = PagedBatch([30000], [12], 8, 128, 16, "NHD", torch.bfloat16)
        q = self.rand(12, 32, 128)
        runs = []
        for nbytes in (512 << 20, 16 << 20, 1 << 20):
            w = kiln.BatchPrefillWithPagedKVCacheWrapper(
                torch.empty(nbytes, dtype=torch.uint8, device="cuda"))
            w.plan([0, 12], b.indptr, b.indices, b.last, 32, 8, 128, 16, causal=True,
                   q_data_type="bfloat16")
            runs.append((w.plan_info.split_items, w.run(q, (b.k, b.v)).float()))
        (split0, ref), rest = runs[0], runs[1:]
        self.assertGreater(split0, 0)
        for split, o in rest:
            self.assertLessEqual(split, split0)
            self.assertClose(o, ref, 2e-2, 2e-2, "a smaller workspace splits less, same result")
        self.assertLess(rest[-1][0], split0)

    def test_run_checks(self):
        b = PagedBatch([20, 30], [1, 1], 2, 64, 16, "NHD", torch.float16)
        w = kiln.BatchDecodeWithPagedKVCacheWrapper(self.ws)
        w.plan(b.indptr, b.indices, b.last, 8, 2, 64, 16)
        q = self.rand(2, 8, 64, dtype="f16")
        for bad, fragment in [
            ((self.rand(3, 8, 64, dtype="f16"), (b.k, b.v)), "rows"),
            ((q.bfloat16(), (b.k, b.v)), "dtype"),
            ((q, (b.k, b.v, b.v)), "(k_cache, v_cache)"),
            ((q, (b.k[:, :8], b.v[:, :8])), "k_cache must be"),
            ((q, b.k), "[pages, 2, ...]"),
        ]:
            with self.assertRaises(ValueError) as cm:
                w.run(*bad)
            self.assertIn(fragment, str(cm.exception))
        with self.assertRaises(ValueError):
            w.run(q, (b.k, b.v), window_left=5)

    def test_cuda_graph_replay_after_replan(self):
        H, H_KV, D, P, B = 32, 8, 128, 16, 4
        max_pages = 2048
        indices_buf = torch.zeros(max_pages, dtype=torch.int32, device="cuda")
        w = kiln.BatchDecodeWithPagedKVCacheWrapper(
            self.ws, "NHD", use_cuda_graph=True,
            paged_kv_indptr_buffer=torch.zeros(B + 1, dtype=torch.int32, device="cuda"),
            paged_kv_indices_buffer=indices_buf,
            paged_kv_last_page_len_buffer=torch.zeros(B, dtype=torch.int32, device="cuda"))
        pool_pages = 1500
        k_pool = self.rand(pool_pages, P, H_KV, D)
        v_pool = self.rand(pool_pages, P, H_KV, D)
        q = self.rand(B, H, D)

        def new_batch(lens):
            n = [(L + P - 1) // P for L in lens]
            ids = torch.randperm(pool_pages)[:sum(n)].tolist()
            indptr, pages, at = [0], [], 0
            for c in n:
                pages.append(ids[at:at + c])
                at += c
                indptr.append(indptr[-1] + c)
            last = [L - (c - 1) * P for L, c in zip(lens, n)]
            return indptr, ids, last, pages

        indptr, ids, last, _ = new_batch([100, 2000, 5, 700])
        w.plan(indptr, ids, last, H, H_KV, D, P, q_data_type="bfloat16")
        w.run(q, (k_pool, v_pool))  # load the kernel outside the capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            with torch.cuda.graph(g):
                out = w.run(q, (k_pool, v_pool))
        torch.cuda.current_stream().wait_stream(s)
        for lens in ([100, 2000, 5, 700], [3000, 1, 64, 16], [17, 18, 19, 20000 // 8]):
            indptr, ids, last, pages = new_batch(lens)
            w.plan(indptr, ids, last, H, H_KV, D, P, q_data_type="bfloat16")  # re-plan
            q.copy_(self.rand(B, H, D))
            g.replay()
            torch.cuda.synchronize()
            for r, L in enumerate(lens):
                k = gather(k_pool, pages[r], last[r], "NHD")
                v = gather(v_pool, pages[r], last[r], "NHD")
                ref, _ = attention(q[r:r + 1], k, v)
                self.assertClose(out[r], ref[0], *tolerance("bf16"),
                                 f"graph replay lens={lens} o[{r}]")


@unittest.skipUnless(RUN_GPU, WHY)
class TestSharedWorkspace(Base):
    """One float workspace shared by several wrappers whose plans and runs interleave, as
    engines do (SGLang's global workspace buffer): each plan's schedule is in a buffer of its
    own wrapper's, the buffer holds only the split-KV partial states of the run executing."""

    def check_decode(self, w, b, q, o, what):
        for r in range(len(b.kv_lens)):
            k, v = b.kv(r)
            ref, _ = attention(q[r:r + 1], k, v)
            self.assertClose(o[r], ref[0], *tolerance("bf16"), f"{what} o[{r}]")

    def check_prefill(self, b, q, o, causal, what):
        for r in range(len(b.qo_lens)):
            lo, hi = b.qo_indptr[r], b.qo_indptr[r + 1]
            k, v = b.kv(r)
            ref, _ = attention(q[lo:hi], k, v, causal=causal)
            self.assertClose(o[lo:hi], ref, *tolerance("bf16"), f"{what} o[req {r}]")

    def test_interleaved_plans_and_runs(self):
        # long requests, so that every plan splits and writes partial states into the buffer
        d1 = PagedBatch([7000, 3, 900], [1, 1, 1], 8, 128, 16, "NHD", torch.bfloat16)
        d2 = PagedBatch([20000], [1], 8, 128, 16, "NHD", torch.bfloat16)
        p1 = PagedBatch([9000, 40], [5, 33], 8, 128, 16, "NHD", torch.bfloat16)
        dec1 = kiln.BatchDecodeWithPagedKVCacheWrapper(self.ws)
        dec2 = kiln.BatchDecodeWithPagedKVCacheWrapper(self.ws)
        pre = kiln.BatchPrefillWithPagedKVCacheWrapper(self.ws)
        q1, q2, qp = self.rand(3, 32, 128), self.rand(1, 32, 128), self.rand(38, 32, 128)
        # plan all three, then run them in another order, then run the first again
        dec1.plan(d1.indptr, d1.indices, d1.last, 32, 8, 128, 16, q_data_type="bfloat16")
        pre.plan(p1.qo_indptr, p1.indptr, p1.indices, p1.last, 32, 8, 128, 16, causal=True,
                 q_data_type="bfloat16")
        dec2.plan(d2.indptr, d2.indices, d2.last, 32, 8, 128, 16, q_data_type="bfloat16")
        for w in (dec1, pre, dec2):
            self.assertGreater(w.plan_info.split_items, 0, "the plan splits")
        o2 = dec2.run(q2, (d2.k, d2.v))
        op = pre.run(qp, (p1.k, p1.v))
        o1 = dec1.run(q1, (d1.k, d1.v))
        o2b = dec2.run(q2, (d2.k, d2.v))
        torch.cuda.synchronize()
        self.check_decode(dec1, d1, q1, o1, "shared workspace, decode 1")
        self.check_decode(dec2, d2, q2, o2, "shared workspace, decode 2")
        self.check_prefill(p1, qp, op, True, "shared workspace, prefill")
        self.assertTrue(torch.equal(o2, o2b), "the same run after the others' runs")

    def test_graph_replay_between_other_wrappers(self):
        # a captured decode replayed after another wrapper planned and ran on the same buffer
        H, H_KV, D, P, B = 32, 8, 128, 16, 2
        w = kiln.BatchDecodeWithPagedKVCacheWrapper(
            self.ws, "NHD", use_cuda_graph=True,
            paged_kv_indptr_buffer=torch.zeros(B + 1, dtype=torch.int32, device="cuda"),
            paged_kv_indices_buffer=torch.zeros(2048, dtype=torch.int32, device="cuda"),
            paged_kv_last_page_len_buffer=torch.zeros(B, dtype=torch.int32, device="cuda"))
        other = kiln.BatchPrefillWithRaggedKVCacheWrapper(self.ws)
        d = PagedBatch([6000, 100], [1, 1], H_KV, D, P, "NHD", torch.bfloat16)
        q = self.rand(B, H, D)
        w.plan(d.indptr, d.indices, d.last, H, H_KV, D, P, q_data_type="bfloat16")
        self.assertGreater(w.plan_info.split_items, 0, "the plan splits")
        w.run(q, (d.k, d.v))  # load the kernel outside the capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            with torch.cuda.graph(g):
                out = w.run(q, (d.k, d.v))
        torch.cuda.current_stream().wait_stream(s)
        kr, vr = self.rand(8000, H_KV, D), self.rand(8000, H_KV, D)
        qr = self.rand(20, H, D)
        for rep in range(2):
            other.plan([0, 20], [0, 8000], H, H_KV, D, causal=False, q_data_type="bfloat16")
            self.assertGreater(other.plan_info.split_items, 0, "the other plan splits")
            orr = other.run(qr, kr, vr)
            g.replay()
            torch.cuda.synchronize()
            self.check_decode(w, d, q, out, f"graph replay {rep} after another wrapper's run")
            ref, _ = attention(qr, kr, vr)
            self.assertClose(orr, ref, *tolerance("bf16"), f"the other wrapper, {rep}")


# ---- prefill -------------------------------------------------------------------------------


@unittest.skipUnless(RUN_GPU, WHY)
class TestBatchPrefillPaged(Base):
    # (qo_lens, kv_lens, H, H_KV, D, page_size, causal, layout, dtype)
    SHAPES = [
        ([5, 128, 1, 300], [5, 400, 33, 300], 32, 8, 128, 16, True, "NHD", "bf16"),  # append
        ([64, 64], [64, 200], 8, 8, 64, 1, False, "HND", "f16"),
        ([200, 7], [150, 7], 16, 2, 256, 32, False, "NHD", "f16"),  # L_Q > L_KV, no causal
        ([17, 0, 40], [100, 10, 40], 8, 1, 128, 8, True, "HND", "bf16"),  # an empty request
    ]

    def run_case(self, qo_lens, kv_lens, H, H_KV, D, P, causal, layout, dtype, **kw):
        b = PagedBatch(kv_lens, qo_lens, H_KV, D, P, layout, DTYPES[dtype])
        q = self.rand(sum(qo_lens), H, D, dtype=dtype)
        w = kiln.BatchPrefillWithPagedKVCacheWrapper(self.ws, layout, lse_base="e")
        w.plan(torch.tensor(b.qo_indptr, dtype=torch.int32), b.indptr, b.indices, b.last, H,
               H_KV, D, P, causal=causal, q_data_type=DTYPES[dtype], **kw)
        self.poison(sum(qo_lens), H, D, dtype=dtype)
        o, lse = w.run(q, (b.k, b.v), return_lse=True)
        torch.cuda.synchronize()
        what = (f"batch prefill paged qo={qo_lens} kv={kv_lens} H={H} H_KV={H_KV} D={D} P={P} "
                f"causal={causal} {layout} {dtype} {kw}")
        for r in range(len(qo_lens)):
            lo, hi = b.qo_indptr[r], b.qo_indptr[r + 1]
            k, v = b.kv(r)
            slopes = (kiln.alibi_slopes(H, "cuda") if kw.get("pos_encoding_mode") == "ALIBI"
                      else None)
            ref_o, ref_lse = attention(q[lo:hi], k, v, causal=causal,
                                    window_left=kw.get("window_left", -1),
                                    softcap=kw.get("logits_soft_cap"), sm_scale=kw.get("sm_scale"),
                                    slopes=slopes)
            self.assertClose(o[lo:hi], ref_o, *tolerance(dtype), f"{what} o[req {r}]")
            self.assertClose(lse[lo:hi], ref_lse, 1e-2, 1e-3, f"{what} lse[req {r}]")

    def test_shapes(self):
        for shape in self.SHAPES:
            with self.subTest(shape=shape):
                self.run_case(*shape)

    def test_all_requests_empty(self):
        """Rows but no keys in any request (no pages at all): o = 0 and lse = -inf, with the
        few-token rows the wrapper picks and without them."""
        b = PagedBatch([0, 0, 0], [2, 1, 3], 2, 128, 16, "NHD", torch.bfloat16)
        for q_tokens in (None, 0):
            q = self.rand(6, 8, 128, dtype="bf16")
            w = kiln.BatchPrefillWithPagedKVCacheWrapper(self.ws, "NHD", lse_base="e")
            kw = {} if q_tokens is None else dict(q_tokens=q_tokens)
            w.plan(torch.tensor(b.qo_indptr, dtype=torch.int32), b.indptr, b.indices, b.last, 8,
                   2, 128, 16, q_data_type=torch.bfloat16, **kw)
            self.poison(6, 8, 128, dtype="bf16")
            o, lse = w.run(q, (b.k, b.v), return_lse=True)
            torch.cuda.synchronize()
            self.assertTrue(torch.equal(o, torch.zeros_like(o)), f"q_tokens={q_tokens}")
            self.assertTrue(bool(torch.isneginf(lse).all()), f"q_tokens={q_tokens}")

    def test_softcap_alibi(self):
        self.run_case([5, 128, 1, 300], [5, 400, 33, 3000], 32, 8, 128, 16, True, "NHD", "bf16",
                      pos_encoding_mode="ALIBI", logits_soft_cap=5.0, sm_scale=0.3)

    def test_window_softcap(self):
        self.run_case([100, 50], [400, 50], 8, 2, 128, 16, True, "NHD", "bf16", window_left=32)
        self.run_case([64], [256], 8, 8, 128, 16, True, "NHD", "bf16", logits_soft_cap=5.0,
                      sm_scale=0.3)

    def test_few_tokens(self):
        """Speculative-decoding verify: 0-8 query tokens a request take the packed rows
        (q_tokens picked by the wrapper, or given), against the reference; q_tokens=0 and a
        longer request than the bound say what they do."""
        cases = [([4, 1, 0, 3, 4], [1000, 17, 300, 5, 2049], 32, 8, 128, 16, True, "NHD", "bf16"),
                 ([8, 7, 2], [513, 64, 4096], 16, 2, 64, 1, True, "HND", "f16"),
                 ([2, 2], [100, 3000], 8, 8, 256, 8, False, "NHD", "bf16")]
        for case in cases:
            qo = case[0]
            want = kiln.batch.few_tokens([0] + [sum(qo[:i + 1]) for i in range(len(qo))],
                                         case[2] // case[3])
            self.assertEqual(want, 1 << (max(qo) - 1).bit_length())
            with self.subTest(case=case):
                self.run_case(*case)
                self.run_case(*case, q_tokens=0)
                self.run_case(*case, q_tokens=16)
        w = kiln.BatchPrefillWithPagedKVCacheWrapper(self.ws, "NHD")
        with self.assertRaisesRegex(Exception, "more than the kernel's q_tokens=2"):
            w.plan([0, 3], [0, 1], torch.zeros(1, dtype=torch.int32, device="cuda"), [16], 8, 2,
                   128, 16, causal=True, q_data_type=torch.bfloat16, q_tokens=2)


@unittest.skipUnless(RUN_GPU, WHY)
class TestBatchPrefillRagged(Base):
    # (qo_lens, kv_lens, H, H_KV, D, causal, layout, dtype)
    SHAPES = [
        ([100, 1, 300], [100, 513, 300], 32, 8, 128, True, "NHD", "bf16"),
        ([77, 20], [77, 10], 16, 4, 64, False, "HND", "f16"),
        ([128], [1000], 8, 1, 256, True, "NHD", "f16"),
    ]

    def run_case(self, qo_lens, kv_lens, H, H_KV, D, causal, layout, dtype):
        qo_indptr, kv_indptr = [0], [0]
        for a, c in zip(qo_lens, kv_lens):
            qo_indptr.append(qo_indptr[-1] + a)
            kv_indptr.append(kv_indptr[-1] + c)
        q = self.rand(qo_indptr[-1], H, D, dtype=dtype)
        shape = (kv_indptr[-1], H_KV, D) if layout == "NHD" else (H_KV, kv_indptr[-1], D)
        k, v = self.rand(*shape, dtype=dtype), self.rand(*shape, dtype=dtype)
        w = kiln.BatchPrefillWithRaggedKVCacheWrapper(self.ws, layout, lse_base="e")
        w.plan(qo_indptr, torch.tensor(kv_indptr, dtype=torch.int32, device="cuda"), H, H_KV,
               D, causal=causal, q_data_type=DTYPES[dtype])
        self.assertEqual(w.variant.kv, "ragged")
        o, lse = w.run(q, k, v, return_lse=True)
        torch.cuda.synchronize()
        kn, vn = (k, v) if layout == "NHD" else (k.transpose(0, 1), v.transpose(0, 1))
        what = f"ragged qo={qo_lens} kv={kv_lens} H={H} H_KV={H_KV} D={D} {causal} {layout}"
        for r in range(len(qo_lens)):
            a, z = qo_indptr[r], qo_indptr[r + 1]
            ref_o, ref_lse = attention(q[a:z], kn[kv_indptr[r]:kv_indptr[r + 1]],
                                    vn[kv_indptr[r]:kv_indptr[r + 1]], causal=causal)
            self.assertClose(o[a:z], ref_o, *tolerance(dtype), f"{what} o[req {r}]")
            self.assertClose(lse[a:z], ref_lse, 1e-2, 1e-3, f"{what} lse[req {r}]")

    def test_shapes(self):
        for shape in self.SHAPES:
            with self.subTest(shape=shape):
                self.run_case(*shape)

    def test_custom_mask(self):
        # FlashInfer's custom_mask (the requests' [qo, kv] bool masks flattened back to back),
        # causal on top, some rows fully hidden; ragged and paged.
        qo_lens, kv_lens, H, H_KV, D = [37, 0, 64, 5], [90, 40, 64, 300], 8, 2, 128
        qo_indptr, kv_indptr = [0], [0]
        for a, c in zip(qo_lens, kv_lens):
            qo_indptr.append(qo_indptr[-1] + a)
            kv_indptr.append(kv_indptr[-1] + c)
        masks = [torch.rand(a, c, device="cuda") < 0.6 for a, c in zip(qo_lens, kv_lens)]
        if qo_lens[0]:
            masks[0][3] = False  # a row that sees no key
        flat = torch.cat([m.reshape(-1) for m in masks])
        q = self.rand(qo_indptr[-1], H, D)
        k, v = self.rand(kv_indptr[-1], H_KV, D), self.rand(kv_indptr[-1], H_KV, D)
        w = kiln.BatchPrefillWithRaggedKVCacheWrapper(self.ws, lse_base="e")
        w.plan(qo_indptr, kv_indptr, H, H_KV, D, causal=True, custom_mask=flat,
               q_data_type="bfloat16")
        self.assertEqual(w.variant.mask_data, "bitmask")
        o, lse = w.run(q, k, v, return_lse=True)
        # the same batch in pages of 16 through the paged wrapper
        P = 16
        pages = [(c + P - 1) // P for c in kv_lens]
        pool_k = torch.zeros(sum(pages), P, H_KV, D, device="cuda", dtype=k.dtype)
        pool_v = torch.zeros_like(pool_k)
        page_indptr, at = [0], 0
        for r, c in enumerate(kv_lens):
            for t in range(c):
                pool_k[at + t // P, t % P] = k[kv_indptr[r] + t]
                pool_v[at + t // P, t % P] = v[kv_indptr[r] + t]
            at += pages[r]
            page_indptr.append(at)
        last = [c - (p - 1) * P if p else 0 for c, p in zip(kv_lens, pages)]
        wp = kiln.BatchPrefillWithPagedKVCacheWrapper(self.ws, lse_base="e")
        wp.plan(qo_indptr, page_indptr, list(range(at)), last, H, H_KV, D, P, causal=True,
                custom_mask=flat, q_data_type="bfloat16")
        op = wp.run(q, (pool_k, pool_v))
        torch.cuda.synchronize()
        for r in range(len(qo_lens)):
            a, z = qo_indptr[r], qo_indptr[r + 1]
            if a == z:
                continue
            ref_o, ref_lse = attention(q[a:z], k[kv_indptr[r]:kv_indptr[r + 1]],
                                    v[kv_indptr[r]:kv_indptr[r + 1]], causal=True, mask=masks[r])
            self.assertClose(o[a:z], ref_o, *tolerance("bf16"), f"custom mask ragged o[req {r}]")
            self.assertClose(lse[a:z], ref_lse, 1e-2, 1e-3, f"custom mask ragged lse[req {r}]")
            self.assertClose(op[a:z], ref_o, *tolerance("bf16"), f"custom mask paged o[req {r}]")
        with self.assertRaises(ValueError):
            w.plan(qo_indptr, kv_indptr, H, H_KV, D, custom_mask=flat[:-1], q_data_type="bfloat16")
        # FlashInfer's packed_custom_mask: segment_packbits (each request from a byte boundary;
        # 37 x 90 and 5 x 300 bits leave pad bits inside the buffer): the same outputs
        packed = torch.cat([packbits_little(m.reshape(-1)) for m in masks])
        w.plan(qo_indptr, kv_indptr, H, H_KV, D, causal=True, packed_custom_mask=packed,
               q_data_type="bfloat16")
        o2, lse2 = w.run(q, k, v, return_lse=True)
        wp.plan(qo_indptr, page_indptr, list(range(at)), last, H, H_KV, D, P, causal=True,
                packed_custom_mask=packed, q_data_type="bfloat16")
        op2 = wp.run(q, (pool_k, pool_v))
        torch.cuda.synchronize()
        self.assertTrue(torch.equal(o, o2) and torch.equal(lse, lse2), "packed_custom_mask ragged")
        self.assertTrue(torch.equal(op, op2), "packed_custom_mask paged")
        with self.assertRaises(ValueError) as cm:
            w.plan(qo_indptr, kv_indptr, H, H_KV, D, packed_custom_mask=packed[1:],
                   q_data_type="bfloat16")
        self.assertIn("packed_custom_mask has", str(cm.exception))

    def test_fused_qkv_views(self):
        # q, k, v as head slices of one projection output (strided, no copies).
        H, H_KV, D, L = 16, 4, 128, 300
        qkv = self.rand(L, H + 2 * H_KV, D)
        q, k, v = qkv[:, :H], qkv[:, H:H + H_KV], qkv[:, H + H_KV:]
        w = kiln.BatchPrefillWithRaggedKVCacheWrapper(self.ws)
        w.plan([0, 100, L], [0, 100, L], H, H_KV, D, causal=True, q_data_type="bfloat16")
        o = w.run(q, k, v)
        for a, z in ((0, 100), (100, L)):
            ref, _ = attention(q[a:z], k[a:z], v[a:z], causal=True)
            self.assertClose(o[a:z], ref, *tolerance("bf16"), f"fused qkv rows {a}..{z}")


# ---- merges and cascade --------------------------------------------------------------------


def ref_merge(vs, ss):
    """Merge states in float64: vs [S] of [n, H, D], ss [S] of [n, H] natural-log LSE."""
    s = torch.stack([x.double() for x in ss])  # [S, n, H]
    m = torch.logsumexp(s, dim=0)
    w = torch.nan_to_num(torch.exp(s - m[None]), nan=0.0)  # rows with all -inf: weight 0
    v = sum(w[i][..., None] * vs[i].double() for i in range(len(vs)))
    return v, m


@unittest.skipUnless(RUN_GPU, WHY)
class TestMerge(Base):
    def states(self, n, H, D, dtype):
        v = self.rand(n, H, D, dtype=dtype)
        s = torch.randn(n, H, device="cuda") * 3
        return v, s

    def test_merge_state(self):
        for dtype, base in (("bf16", "2"), ("f16", "e")):
            va, sa = self.states(300, 32, 128, dtype)
            vb, sb = self.states(300, 32, 128, dtype)
            sa[0], sb[1] = float("-inf"), float("-inf")  # a state with no keys
            sa[2], sb[2] = float("-inf"), float("-inf")  # both empty
            vb[2].zero_()
            va[2].zero_()
            k = kiln.LOG2E if base == "2" else 1.0
            v, s = kiln.merge_state(va, sa * k, vb, sb * k, lse_base=base)
            ref_v, ref_s = ref_merge([va, vb], [sa, sb])
            self.assertClose(v, ref_v, *tolerance(dtype), f"merge_state v ({dtype}, base {base})")
            self.assertClose(s, ref_s * k, 1e-4, 1e-5, f"merge_state s (base {base})")
            self.assertFalse(torch.isnan(v).any())

    def test_merge_state_in_place(self):
        v, s = self.states(200, 8, 64, "f16")
        vo, so = self.states(200, 8, 64, "f16")
        mask = torch.rand(200, device="cuda") < 0.5
        v0, s0 = v.clone(), s.clone() * kiln.LOG2E
        s2 = s0.clone()
        kiln.merge_state_in_place(v, s2, vo, so * kiln.LOG2E, mask=mask)
        ref_v, ref_s = ref_merge([v0, vo], [s0 / kiln.LOG2E, so])
        self.assertClose(v[mask], ref_v[mask], *tolerance("f16"), "in place v (merged rows)")
        self.assertClose(s2[mask], ref_s[mask] * kiln.LOG2E, 1e-4, 1e-5, "in place s")
        self.assertTrue(torch.equal(v[~mask], v0[~mask]), "unmasked rows of v changed")
        self.assertTrue(torch.equal(s2[~mask], s0[~mask]), "unmasked rows of s changed")

    def test_merge_states(self):
        n, S, H, D = 100, 3, 8, 128
        v = self.rand(n, S, H, D)
        s = torch.randn(n, S, H, device="cuda")
        vm, sm = kiln.merge_states(v, s * kiln.LOG2E)
        ref_v, ref_s = ref_merge([v[:, i] for i in range(S)], [s[:, i] for i in range(S)])
        self.assertClose(vm, ref_v, *tolerance("bf16"), "merge_states v")
        self.assertClose(sm, ref_s * kiln.LOG2E, 1e-4, 1e-5, "merge_states s")

    def test_split_attention_merges_to_whole(self):
        # Two key halves attended separately and merged equal the whole: the states are real.
        q = self.rand(64, 8, 128)
        k, v = self.rand(600, 8, 128), self.rand(600, 8, 128)
        o1, l1 = kiln.single_prefill_with_kv_cache(q, k[:250], v[:250], return_lse=True)
        o2, l2 = kiln.single_prefill_with_kv_cache(q, k[250:], v[250:], return_lse=True)
        o, lse = kiln.merge_state(o1, l1, o2, l2)
        ref_o, ref_lse = attention(q, k, v)
        self.assertClose(o, ref_o, *tolerance("bf16"), "split + merge o")
        self.assertClose(lse, ref_lse * kiln.LOG2E, 1e-2, 1e-3, "split + merge lse")

    def test_bad_inputs(self):
        v, s = self.states(10, 8, 64, "f16")
        with self.assertRaises(ValueError):
            kiln.merge_state(v, s, v.bfloat16(), s)
        with self.assertRaises(ValueError):
            kiln.merge_state(v, s.half(), v, s)
        with self.assertRaises(ValueError):
            kiln.merge_state(v.float(), s, v.float(), s)
        with self.assertRaises(ValueError):
            kiln.merge_state_in_place(v, s, v, s, mask=torch.ones(3, device="cuda"))


@unittest.skipUnless(RUN_GPU, WHY)
class TestCascade(Base):
    def test_two_levels(self):
        # Level 0: one shared prefix for every request (one "request" holding all rows);
        # level 1: each request's own pages, causal.
        H, H_KV, D, P = 16, 4, 128, 16
        qo_lens, own_lens, prefix_len = [5, 1, 20], [30, 17, 20], 100
        total_pages = 64
        k_pool = self.rand(total_pages, P, H_KV, D)
        v_pool = self.rand(total_pages, P, H_KV, D)
        perm = torch.randperm(total_pages).tolist()
        n_prefix = (prefix_len + P - 1) // P
        prefix_pages, at = perm[:n_prefix], n_prefix
        own_pages = []
        for L in own_lens:
            c = (L + P - 1) // P
            own_pages.append(perm[at:at + c])
            at += c
        qo_indptr = [0]
        for n in qo_lens:
            qo_indptr.append(qo_indptr[-1] + n)
        own_indptr = [0]
        for p in own_pages:
            own_indptr.append(own_indptr[-1] + len(p))
        own_last = [L - (len(p) - 1) * P for L, p in zip(own_lens, own_pages)]
        prefix_last = prefix_len - (n_prefix - 1) * P
        q = self.rand(qo_indptr[-1], H, D)
        w = kiln.MultiLevelCascadeAttentionWrapper(2, self.ws)
        w.plan([[0, qo_indptr[-1]], qo_indptr], [[0, n_prefix], own_indptr],
               [torch.tensor(prefix_pages, dtype=torch.int32, device="cuda"),
                torch.tensor(sum(own_pages, []), dtype=torch.int32, device="cuda")],
               [[prefix_last], own_last], H, H_KV, D, P, causal=True, q_data_type="bfloat16")
        o = w.run(q, (k_pool, v_pool))
        torch.cuda.synchronize()
        kp = gather(k_pool, prefix_pages, prefix_last, "NHD")
        vp = gather(v_pool, prefix_pages, prefix_last, "NHD")
        for r in range(len(qo_lens)):
            a, z = qo_indptr[r], qo_indptr[r + 1]
            ko = gather(k_pool, own_pages[r], own_last[r], "NHD")
            vo = gather(v_pool, own_pages[r], own_last[r], "NHD")
            o_p, l_p = attention(q[a:z], kp, vp)
            o_o, l_o = attention(q[a:z], ko, vo, causal=True)
            ref, _ = ref_merge([o_p, o_o], [l_p, l_o])
            self.assertClose(o[a:z], ref, *tolerance("bf16"), f"cascade req {r}")


if __name__ == "__main__":
    unittest.main()
