"""test_graph.py — kiln.CUDAGraphBatchDecodeWithPagedKVCacheWrapper and kiln.fast_decode_plan.

On a GPU: plan fills the three fixed buffers (FlashInfer's graph-mode plan copies indptr, page
ids and last_page_len into them); a run captured in a torch CUDA graph replays correctly after
later plans with other lengths, pages and a smaller batch; fast_decode_plan gives the same
output as plan, copies nothing into the graph buffers, and takes global_override_indptr_cpu.
Outputs are checked against the float64 reference. The argument checks need no GPU."""

import unittest

from fi_reference import RUN_GPU, WHY, FakeBuffer, attend, check_close, paged_cache, torch, \
    use_temp_cache

import kiln


def setUpModule():
    use_temp_cache()


H, H_KV, D, P = 8, 2, 128, 16
TOL = (2e-3, 5e-3)  # float16, as test_torch.py


def decode_reference(q, tokens):
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    for b, (k, v) in enumerate(tokens):
        if k.shape[0]:
            vis = torch.ones(1, k.shape[0], dtype=torch.bool, device=q.device)
            out[b:b + 1], _ = attend(q[b:b + 1], k, v, vis)
    return out


@unittest.skipUnless(RUN_GPU, WHY)
class TestCUDAGraphDecodeGPU(unittest.TestCase):
    def test_capture_replay_after_replans(self):
        torch.manual_seed(0)
        ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
        max_batch, max_pages = 8, 64
        indptr_buf = torch.zeros(max_batch + 1, dtype=torch.int32, device="cuda")
        indices_buf = torch.zeros(max_pages, dtype=torch.int32, device="cuda")
        last_buf = torch.zeros(max_batch, dtype=torch.int32, device="cuda")
        w = kiln.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(ws, indptr_buf, indices_buf,
                                                             last_buf)
        self.assertTrue(w.is_cuda_graph_enabled)
        self.assertIs(w._paged_kv_indices_buf, indices_buf)
        def cache(lens, seed):  # every pool max_pages pages, so replans reuse one pool
            used = sum(-(-n // P) for n in lens)
            return paged_cache(lens, P, H_KV, D, torch.float16, "NHD", seed,
                               spare=max_pages - used)

        kp, vp, indptr, indices, last, tokens = cache([40, 3, 100, 17, 64, 1, 9, 30], 1)
        q = torch.randn(max_batch, H, D, dtype=torch.float16, device="cuda")
        w.plan(indptr, indices, last, H, H_KV, D, P)
        self.assertEqual(indptr_buf.tolist(), indptr.tolist())
        self.assertEqual(last_buf.tolist(), last.tolist())
        self.assertEqual(indices_buf[:indices.numel()].tolist(), indices.tolist())
        w.run(q, (kp, vp))  # compile and load before capturing
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            o = w.run(q, (kp, vp))
        graph.replay()
        check_close(self, o, decode_reference(q, tokens), *TOL, "first plan")
        for seed, lens in ((2, [1, 90, 5, 33, 2, 70, 12, 4]), (3, [60, 0, 7, 120, 1])):
            kp2, vp2, indptr, indices, last, tokens = cache(lens, seed)
            kp.copy_(kp2)
            vp.copy_(vp2)
            w.plan(indptr, indices, last, H, H_KV, D, P)
            graph.replay()
            B = len(lens)
            self.assertEqual(indptr_buf[:B + 1].tolist(), indptr.tolist())
            check_close(self, o[:B], decode_reference(q[:B], tokens), *TOL, f"replan {lens}")

    def test_fast_decode_plan(self):
        torch.manual_seed(4)
        ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
        for page_size in (16, 1):
            kp, vp, indptr, indices, last, tokens = paged_cache([33, 8, 50], page_size, H_KV, D,
                                                                torch.bfloat16, "HND", 5)
            q = torch.randn(3, H, D, dtype=torch.bfloat16, device="cuda")
            w = kiln.BatchDecodeWithPagedKVCacheWrapper(ws, "HND")
            kiln.fast_decode_plan(w, indptr, indices, last, H, H_KV, D, page_size,
                                  data_type=torch.bfloat16,
                                  global_override_indptr_cpu=indptr.cpu())
            check_close(self, w.run(q, (kp, vp)), decode_reference(q, tokens), 1.5e-2, 2e-2,
                        f"fast_decode_plan page_size={page_size}")

    def test_fast_decode_plan_in_graph_mode_copies_nothing(self):
        torch.manual_seed(6)
        ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
        kp, vp, indptr, indices, last, tokens = paged_cache([12, 70, 5, 31], P, H_KV, D,
                                                            torch.float16, "NHD", 7)
        indptr_buf = torch.full((5,), -7, dtype=torch.int32, device="cuda")
        indices_buf = torch.zeros(32, dtype=torch.int32, device="cuda")
        last_buf = torch.full((4,), -7, dtype=torch.int32, device="cuda")
        indices_buf[:indices.numel()].copy_(indices)  # the engine writes the page ids itself
        w = kiln.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(ws, indptr_buf, indices_buf,
                                                             last_buf)
        kiln.fast_decode_plan(w, indptr, indices_buf, last, H, H_KV, D, P,
                              global_override_indptr_cpu=indptr.cpu())
        self.assertEqual(indptr_buf.tolist(), [-7] * 5)  # not copied, as in FlashInfer
        self.assertEqual(last_buf.tolist(), [-7] * 4)
        q = torch.randn(4, H, D, dtype=torch.float16, device="cuda")
        check_close(self, w.run(q, (kp, vp)), decode_reference(q, tokens), *TOL,
                    "fast plan, graph mode")


@unittest.skipUnless(torch is not None, "needs torch")
class TestGraphArguments(unittest.TestCase):
    def test_buffers_must_be_int32_cuda(self):
        b = torch.zeros(5, dtype=torch.int32)
        with self.assertRaisesRegex(ValueError, "indptr_buffer"):
            kiln.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(FakeBuffer(), b, b, b[:4])
        with self.assertRaisesRegex(ValueError, "indptr_buffer"):
            kiln.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(FakeBuffer(), [0, 1], b, b)

    def test_fast_decode_plan_needs_a_decode_wrapper(self):
        with self.assertRaises(TypeError):
            kiln.fast_decode_plan(object(), [0, 1], [0], [1], 4, 4, 64, 16)

    def test_global_override_must_be_on_the_host(self):
        w = kiln.BatchDecodeWithPagedKVCacheWrapper(FakeBuffer())
        with self.assertRaises(ValueError):
            kiln.fast_decode_plan(w, [0, 1], [0], [1], 4, 4, 64, 16,
                                  global_override_indptr_cpu=[0, 1])
        with self.assertRaises(ValueError):
            kiln.fast_decode_plan(w, [0, 1, 2], [0, 1], [1, 1], 4, 4, 64, 16,
                                  global_override_indptr_cpu=torch.tensor([0, 1]))


if __name__ == "__main__":
    unittest.main()
