"""test_prefix.py — kiln.BatchDecodeWithSharedPrefixPagedKVCacheWrapper and
kiln.BatchPrefillWithSharedPrefixPagedKVCacheWrapper against a float64 reference written here:
each request attends to the shared prefix (always visible) followed by its own pages (causal,
when asked, bottom-right aligned on its own keys, as FlashInfer's batch prefill does), one
softmax over both. Both layouts, GQA, a request with no pages of its own, forward() re-planned
for causal and sm_scale. The argument checks need no GPU."""

import unittest

from fi_reference import (RUN_GPU, WHY, FakeBuffer, attend, check_close, paged_cache, torch,
                          use_temp_cache)

import kiln


def setUpModule():
    use_temp_cache()


def shared_reference(q_rows, k_s, v_s, k_u, v_u, causal, sm_scale=None):
    """q_rows [n, H, D] of one request over shared (k_s, v_s) then unique (k_u, v_u) keys."""
    n, L_s, L_u = q_rows.shape[0], k_s.shape[0], k_u.shape[0]
    vis = torch.ones(n, L_s + L_u, dtype=torch.bool, device=q_rows.device)
    if causal:
        i = torch.arange(n, device=q_rows.device)[:, None]
        j = torch.arange(L_u, device=q_rows.device)[None, :]
        vis[:, L_s:] = j <= i + L_u - n
    o, _ = attend(q_rows, torch.cat([k_s, k_u]), torch.cat([v_s, v_u]), vis, sm_scale)
    return o


# (atol, rtol) as test_torch.py has them
TOL = {torch.float16: (2e-3, 5e-3), torch.bfloat16: (1.5e-2, 2e-2)} if torch else {}


def shared_kv(L_s, H_KV, D, dtype, layout):
    k = torch.randn(L_s, H_KV, D, dtype=dtype, device="cuda")
    v = torch.randn(L_s, H_KV, D, dtype=dtype, device="cuda")
    if layout == "HND":
        return k, v, k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()
    return k, v, k, v


@unittest.skipUnless(RUN_GPU, WHY)
class TestSharedPrefixGPU(unittest.TestCase):
    def setUp(self):
        self.ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")

    def test_decode(self):
        for seed, (layout, dtype, lens, L_s) in enumerate([
                ("NHD", torch.float16, [17, 1, 40, 0, 33], 100),
                ("HND", torch.bfloat16, [5, 64, 3], 257)]):
            torch.manual_seed(seed)
            H, H_KV, D, P = 8, 2, 128, 16
            kp, vp, indptr, indices, last, tokens = paged_cache(lens, P, H_KV, D, dtype, layout,
                                                                seed)
            k_s, v_s, k_arg, v_arg = shared_kv(L_s, H_KV, D, dtype, layout)
            q = torch.randn(len(lens), H, D, dtype=dtype, device="cuda")
            w = kiln.BatchDecodeWithSharedPrefixPagedKVCacheWrapper(self.ws, layout)
            w.begin_forward(indptr, indices, last, H, H_KV, D, P, data_type=dtype)
            o = w.forward(q, k_arg, v_arg, (kp, vp))
            self.assertEqual(tuple(o.shape), (len(lens), H, D))
            for b, (k_u, v_u) in enumerate(tokens):
                want = shared_reference(q[b:b + 1], k_s, v_s, k_u, v_u, False)
                check_close(self, o[b:b + 1], want, *TOL[dtype], f"decode {layout} request {b}")

    def test_decode_fp8(self):
        # fp8 caches (shared prefix and pages) with float16 q, FlashInfer's default
        for seed, (layout, fp8) in enumerate([("NHD", torch.float8_e4m3fn),
                                              ("HND", torch.float8_e5m2)]):
            torch.manual_seed(seed)
            H, H_KV, D, P, lens, L_s = 16, 4, 128, 16, [17, 1, 300, 0], 200
            kp, vp, indptr, indices, last, tokens = paged_cache(lens, P, H_KV, D, torch.float16,
                                                                layout, seed)
            k_s, v_s, k_arg, v_arg = shared_kv(L_s, H_KV, D, torch.float16, layout)
            q = torch.randn(len(lens), H, D, dtype=torch.float16, device="cuda")
            w = kiln.BatchDecodeWithSharedPrefixPagedKVCacheWrapper(self.ws, layout)
            w.begin_forward(indptr, indices, last, H, H_KV, D, P, data_type=fp8)
            o = w.forward(q, k_arg.to(fp8), v_arg.to(fp8), (kp.to(fp8), vp.to(fp8)))
            self.assertEqual(o.dtype, torch.float16)
            for b, (k_u, v_u) in enumerate(tokens):
                want = shared_reference(q[b:b + 1], k_s.to(fp8).float(), v_s.to(fp8).float(),
                                        k_u.to(fp8).float(), v_u.to(fp8).float(), False)
                check_close(self, o[b:b + 1], want, 2e-2, 3e-2, f"fp8 decode {layout} req {b}")

    def test_prefill(self):
        for seed, (layout, causal, sm_scale) in enumerate([
                ("NHD", True, None), ("HND", False, 0.05), ("NHD", False, None)]):
            torch.manual_seed(seed)
            dtype, H, H_KV, D, P = torch.float16, 4, 4, 64, 8
            qo_lens, kv_lens, L_s = [7, 1, 12], [20, 1, 12], 50
            kp, vp, indptr, indices, last, tokens = paged_cache(kv_lens, P, H_KV, D, dtype,
                                                                layout, seed)
            qo = [0]
            for n in qo_lens:
                qo.append(qo[-1] + n)
            k_s, v_s, k_arg, v_arg = shared_kv(L_s, H_KV, D, dtype, layout)
            q = torch.randn(qo[-1], H, D, dtype=dtype, device="cuda")
            w = kiln.BatchPrefillWithSharedPrefixPagedKVCacheWrapper(self.ws, layout)
            w.begin_forward(torch.tensor(qo, dtype=torch.int32, device="cuda"), indptr, indices,
                            last, H, H_KV, D, P)
            kv = torch.stack([kp, vp], dim=1)  # the one-tensor form
            o = w.forward(q, k_arg, v_arg, kv, causal=causal, sm_scale=sm_scale)
            for b, (k_u, v_u) in enumerate(tokens):
                rows = slice(qo[b], qo[b + 1])
                want = shared_reference(q[rows], k_s, v_s, k_u, v_u, causal, sm_scale)
                check_close(self, o[rows], want, *TOL[dtype],
                            f"prefill {layout} causal={causal} request {b}")


@unittest.skipUnless(torch is not None, "needs torch")
class TestSharedPrefixArguments(unittest.TestCase):
    def test_fp8_data_type_reaches_the_device(self):
        # accepted (fp8 caches, float16 q); the fake workspace then stops it at the device
        w = kiln.BatchDecodeWithSharedPrefixPagedKVCacheWrapper(FakeBuffer())
        with self.assertRaisesRegex(ValueError, "CUDA"):
            w.begin_forward([0, 1], [0], [1], 4, 4, 64, 16, data_type="float8_e4m3fn")

    def test_forward_before_begin_forward(self):
        w = kiln.BatchPrefillWithSharedPrefixPagedKVCacheWrapper(FakeBuffer())
        with self.assertRaises(RuntimeError):
            w.forward(None, None, None, None)

    def test_layout(self):
        with self.assertRaises(ValueError):
            kiln.BatchPrefillWithSharedPrefixPagedKVCacheWrapper(FakeBuffer(), "NDH")


if __name__ == "__main__":
    unittest.main()
