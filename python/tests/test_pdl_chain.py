"""test_pdl_chain.py — kiln's launches chained back to back on one stream, with no sync.

On sm_90 and newer a split decode's or batch plan's merge kernel is a programmatic dependent
launch of its main kernel (jit/config.c, kiln__config.pdl): it may be scheduled while the main
kernel still runs and must wait for it before it reads a partial state (templates/merge.cuh);
the next call's kernels must not overwrite what it still reads. These tests chain calls so that
a missing or misplaced wait, or a launch out of order, shows:
  - read after write: call i + 1's q is call i's output (a batch decode split by the planner, so
    call i's last kernel is the merge kernel; ragged prefill; single prefill and single decode);
  - write after read: calls on one workspace with different q, call i + 1's partial states
    written where call i's merge kernel reads them;
eagerly and replayed from a CUDA graph. Each chained output must equal, bit for bit, the same
call made alone after a synchronisation (the kernels are deterministic), and the first decode
link is checked against the float64 reference. Runs on any GPU (below sm_90 every launch is an
ordinary one and the chain must hold all the same)."""

import unittest

from fi_reference import RUN_GPU, WHY, attend, check_close, paged_cache, torch, use_temp_cache

import kiln


def setUpModule():
    use_temp_cache()


H, H_KV, D, P = 32, 8, 128, 16
LINKS = 12


def _sync_alone(fn, x):
    torch.cuda.synchronize()
    y = fn(x.clone())
    torch.cuda.synchronize()
    return y


@unittest.skipUnless(RUN_GPU, WHY)
class TestPdlChain(unittest.TestCase):
    def chain(self, fn, x0, what):
        """x_{i+1} = fn(x_i) LINKS times back to back (eager, then a graph of the same chain);
        every link bitwise equal to fn of the same input made alone."""
        xs = [x0]
        for _ in range(LINKS):
            xs.append(fn(xs[-1]))
        torch.cuda.synchronize()
        for i in range(LINKS):
            alone = _sync_alone(fn, xs[i])
            self.assertTrue(torch.equal(xs[i + 1], alone), f"{what}: eager link {i}")
        fn(x0)  # compiled and loaded: capture no build
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        src = x0.clone()
        with torch.cuda.graph(g):
            ys = [src]
            for _ in range(LINKS):
                ys.append(fn(ys[-1]))
        for rep in range(2):
            g.replay()
            torch.cuda.synchronize()
            for i in range(LINKS):
                self.assertTrue(torch.equal(ys[i + 1], xs[i + 1]), f"{what}: graph {rep} link {i}")
        return xs

    def test_batch_decode_chain(self):
        torch.manual_seed(1)
        lens = [4097, 1, 700]  # the first request split many ways: a merge kernel runs
        kp, vp, indptr, indices, last, tokens = paged_cache(lens, P, H_KV, D, torch.bfloat16,
                                                            "NHD", 5)
        ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
        w = kiln.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
        w.plan(indptr, indices, last, H, H_KV, D, P, q_data_type=torch.bfloat16)
        q0 = torch.randn(len(lens), H, D, dtype=torch.bfloat16, device="cuda")
        xs = self.chain(lambda q: w.run(q, (kp, vp)), q0, "batch decode")
        want = torch.zeros(q0.shape, dtype=torch.float64, device="cuda")
        for b, (k, v) in enumerate(tokens):
            vis = torch.ones(1, k.shape[0], dtype=torch.bool, device="cuda")
            want[b:b + 1], _ = attend(q0[b:b + 1], k, v, vis)
        check_close(self, xs[1], want, 1e-2, 2e-2, "batch decode link 0")

    def test_batch_decode_write_after_read(self):
        torch.manual_seed(2)
        kp, vp, indptr, indices, last, _ = paged_cache([8191, 33], P, H_KV, D, torch.bfloat16,
                                                       "NHD", 6)
        ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
        w = kiln.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
        w.plan(indptr, indices, last, H, H_KV, D, P, q_data_type=torch.bfloat16)
        qs = [torch.randn(2, H, D, dtype=torch.bfloat16, device="cuda") for _ in range(LINKS)]
        w.run(qs[0], (kp, vp))
        torch.cuda.synchronize()
        outs = [w.run(q, (kp, vp)) for q in qs]  # one workspace, back to back
        torch.cuda.synchronize()
        for i, q in enumerate(qs):
            self.assertTrue(torch.equal(outs[i], _sync_alone(lambda x: w.run(x, (kp, vp)), q)),
                            f"call {i}")

    def test_ragged_prefill_chain(self):
        torch.manual_seed(3)
        qo = [0, 300, 301, 1100]
        n = qo[-1]
        k = torch.randn(n, H_KV, D, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(n, H_KV, D, dtype=torch.bfloat16, device="cuda")
        ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
        w = kiln.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
        w.plan(qo, qo, H, H_KV, D, causal=True, q_data_type=torch.bfloat16)
        q0 = torch.randn(n, H, D, dtype=torch.bfloat16, device="cuda")
        self.chain(lambda q: w.run(q, k, v), q0, "ragged prefill")

    def test_single_calls_chain(self):
        torch.manual_seed(4)
        k = torch.randn(2000, H_KV, D, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(2000, H_KV, D, dtype=torch.bfloat16, device="cuda")
        q0 = torch.randn(777, H, D, dtype=torch.bfloat16, device="cuda")
        self.chain(lambda q: kiln.single_prefill_with_kv_cache(q, k, v, causal=True), q0,
                   "single prefill")
        d0 = torch.randn(H, D, dtype=torch.bfloat16, device="cuda")
        self.chain(lambda q: kiln.single_decode_with_kv_cache(q, k, v), d0, "single decode")


if __name__ == "__main__":
    unittest.main()
