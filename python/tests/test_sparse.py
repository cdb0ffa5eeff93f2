"""test_sparse.py — kiln.BlockSparseAttentionWrapper and kiln.VariableBlockSparseAttentionWrapper.

The GPU cases compare against a float64 reference of FlashInfer's documented semantics written
here: block row r of a BSR mask is a request of its R query rows over the keys of its listed
column blocks, gathered in the listed order, so causal is bottom-right aligned on the gathered
keys; a per-block mask [nnz, R, C] replaces causal. The variable wrapper's request is one
(KV head, block row) over its selected column blocks, in column order. Both kiln routes of the
fixed-block wrapper are exercised (plain BSR mask data; the paged mapping). The argument checks
run without a GPU (a fake workspace), and skip only without torch where they need it.
"""

import random
import unittest

from fi_reference import RUN_GPU, WHY, FakeBuffer, attend, check_close, torch, use_temp_cache

import kiln


def setUpModule():
    use_temp_cache()


def bsr_reference(q, k, v, ptr, cols, R, C, causal=False, mask=None, sm_scale=None,
                  softcap=None):
    M, H, D = q.shape
    o = torch.zeros(M, H, D, dtype=torch.float64, device=q.device)
    lse = torch.full((M, H), float("-inf"), dtype=torch.float64, device=q.device)
    for r in range(len(ptr) - 1):
        r0, r1 = r * R, min((r + 1) * R, M)
        blocks = cols[ptr[r]:ptr[r + 1]]
        if not blocks or r0 >= r1:
            continue
        keys = torch.cat([torch.arange(c * C, (c + 1) * C) for c in blocks]).to(q.device)
        L_Q, L_KV = r1 - r0, keys.numel()
        if mask is not None:
            vis = mask[ptr[r]:ptr[r + 1]].transpose(0, 1).reshape(R, -1)[:L_Q]
        elif causal:
            i = torch.arange(L_Q, device=q.device)[:, None]
            j = torch.arange(L_KV, device=q.device)[None, :]
            vis = j <= i + L_KV - L_Q
        else:
            vis = torch.ones(L_Q, L_KV, dtype=torch.bool, device=q.device)
        o[r0:r1], lse[r0:r1] = attend(q[r0:r1], k[keys], v[keys], vis, sm_scale, softcap)
    return o, lse


def random_bsr(rng, MB, NB, density, shuffle=True):
    ptr, cols = [0], []
    for _ in range(MB):
        row = [c for c in range(NB) if rng.random() < density]
        if shuffle:
            rng.shuffle(row)
        cols += row
        ptr.append(len(cols))
    return ptr, cols


# (atol, rtol) as test_torch.py has them
TOL = {torch.float16: (2e-3, 5e-3), torch.bfloat16: (1.5e-2, 2e-2)} if torch else {}


@unittest.skipUnless(RUN_GPU, WHY)
class TestBlockSparseGPU(unittest.TestCase):
    def setUp(self):
        self.ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")

    def _run(self, seed, M, N, R, C, H, H_KV, D, dtype, *, causal=False, with_mask=False,
             packed=False, softcap=None, sm_scale=None, o_dtype=None, density=0.5,
             lse_base="2", route=None):
        o_dtype = o_dtype or torch.float16  # FlashInfer's default o_data_type
        rng = random.Random(seed)
        torch.manual_seed(seed)
        MB, NB = -(-M // R), N // C
        ptr, cols = random_bsr(rng, MB, NB, density, shuffle=not causal)
        q = torch.randn(M, H, D, dtype=dtype, device="cuda")
        k = torch.randn(N, H_KV, D, dtype=dtype, device="cuda")
        v = torch.randn(N, H_KV, D, dtype=dtype, device="cuda")
        mask = packed_mask = None
        if with_mask:
            mask = torch.rand(len(cols), R, C, device="cuda") < 0.6
            if packed:
                rows = [min((r + 1) * R, M) - r * R for r in range(MB)]
                flat = torch.cat([mask[ptr[r]:ptr[r + 1]].transpose(0, 1).reshape(R, -1)
                                  [:rows[r]].reshape(-1) for r in range(MB)])
                seg = [0]
                for r in range(MB):
                    seg.append(seg[-1] + rows[r] * (ptr[r + 1] - ptr[r]) * C)
                packed_mask, _ = kiln.segment_packbits(flat, torch.tensor(seg, device="cuda"),
                                                       bitorder="little")
        w = kiln.BlockSparseAttentionWrapper(self.ws, lse_base=lse_base)
        w.plan(torch.tensor(ptr, dtype=torch.int32, device="cuda"),
               torch.tensor(cols, dtype=torch.int32, device="cuda"), M, N, R, C, H, H_KV, D,
               mask=None if packed else mask, packed_mask=packed_mask, causal=causal,
               logits_soft_cap=softcap, sm_scale=sm_scale, q_data_type=dtype,
               o_data_type=o_dtype)
        if route is not None:
            self.assertEqual(w._bsr is not None, route == "bsr", "route taken")
        out = torch.full((M, H, D), float("nan"), dtype=o_dtype, device="cuda")
        o, lse = w.run(q, k, v, out=out, return_lse=True)
        self.assertIs(o, out)
        ro, rl = bsr_reference(q, k, v, ptr, cols, R, C, causal=causal, mask=mask,
                               sm_scale=sm_scale, softcap=softcap)
        if lse_base == "e":
            rl = rl * 0.6931471805599453
        what = f"seed={seed} M={M} N={N} R={R} C={C} causal={causal} mask={with_mask}"
        atol, rtol = TOL[o_dtype if o_dtype == torch.bfloat16 else dtype]
        check_close(self, o, ro, atol, rtol, f"o {what}")
        check_close(self, lse, rl, 1e-2, 1e-3, f"lse {what}")
        return w

    def test_plain_bsr_route(self):
        self._run(1, 100, 96, 16, 32, 8, 2, 128, torch.bfloat16, route="bsr")
        self._run(2, 64, 64, 1, 1, 4, 4, 64, torch.float16, o_dtype=torch.float16, route="bsr")
        self._run(3, 129, 256, 64, 16, 8, 1, 64, torch.float16, softcap=30.0, sm_scale=0.1,
                  route="bsr")
        self._run(4, 80, 160, 16, 16, 4, 2, 128, torch.bfloat16, o_dtype=torch.bfloat16,
                  density=0.2, lse_base="e", route="bsr")

    def test_flashinfer_docstring_example(self):
        M = N = 3
        q = torch.randn(M, 32, 128, dtype=torch.float16, device="cuda")
        k = torch.randn(N, 8, 128, dtype=torch.float16, device="cuda")
        v = torch.randn(N, 8, 128, dtype=torch.float16, device="cuda")
        w = kiln.BlockSparseAttentionWrapper(self.ws)
        w.plan(torch.tensor([0, 1, 3, 5], dtype=torch.int32, device="cuda"),
               torch.tensor([2, 0, 2, 1, 2], dtype=torch.int32, device="cuda"), M, N, 1, 1, 32,
               8, 128)
        dense = torch.tensor([[0, 0, 1], [1, 0, 1], [0, 1, 1]], dtype=torch.bool, device="cuda")
        want = kiln.single_prefill_with_kv_cache(q, k, v, custom_mask=dense)
        check_close(self, w.run(q, k, v), want, 2e-3, 2e-3, "docstring example")

    def test_paged_route_causal_on_gathered_keys(self):
        self._run(5, 128, 128, 32, 32, 8, 2, 128, torch.float16, causal=True, route="paged")
        self._run(6, 100, 64, 16, 16, 4, 1, 64, torch.bfloat16, causal=True, route="paged")

    def test_paged_route_block_masks(self):
        self._run(7, 96, 128, 16, 32, 4, 2, 64, torch.float16, with_mask=True, route="paged")
        self._run(8, 90, 96, 16, 8, 4, 2, 128, torch.bfloat16, with_mask=True, packed=True,
                  causal=True, route="paged")  # the mask replaces causal, as in FlashInfer

    def test_default_o_dtype_is_float16(self):
        w = self._run(9, 32, 32, 16, 16, 2, 2, 64, torch.bfloat16)
        self.assertEqual(w.run(*[torch.randn(32, 2, 64, dtype=torch.bfloat16, device="cuda")
                                 for _ in range(3)]).dtype, torch.float16)


def variable_reference(q, k, v, mask, rows, cols, causal):
    H, L_Q, D = q.shape
    H_KV = k.shape[0]
    G = H // H_KV
    o = torch.zeros(H, L_Q, D, dtype=torch.float64, device=q.device)
    lse = torch.full((H, L_Q), float("-inf"), dtype=torch.float64, device=q.device)
    for h in range(H_KV):
        col_start = [0]
        for c in cols[h]:
            col_start.append(col_start[-1] + c)
        r0 = 0
        for r, n in enumerate(rows[h]):
            keys = [t for c in range(len(cols[h])) if mask[h][r][c]
                    for t in range(col_start[c], col_start[c] + cols[h][c])]
            if keys and n:
                i = torch.arange(n, device=q.device)[:, None]
                j = torch.arange(len(keys), device=q.device)[None, :]
                vis = (j <= i + len(keys) - n) if causal else torch.ones_like(i + j).bool()
                qh = q[h * G:(h + 1) * G, r0:r0 + n].transpose(0, 1)  # [n, G, D]
                kk = k[h, keys].unsqueeze(1)
                vv = v[h, keys].unsqueeze(1)
                oo, ll = attend(qh, kk, vv, vis)
                o[h * G:(h + 1) * G, r0:r0 + n] = oo.transpose(0, 1)
                lse[h * G:(h + 1) * G, r0:r0 + n] = ll.transpose(0, 1)
            r0 += n
    return o, lse


@unittest.skipUnless(RUN_GPU, WHY)
class TestVariableBlockSparseGPU(unittest.TestCase):
    def test_against_reference(self):
        ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
        rows = [[3, 5, 8, 0], [8, 4, 4, 0]]
        cols = [[10, 6, 4], [4, 4, 12]]
        for seed, (H, H_KV, dtype, causal) in enumerate(
                [(4, 2, torch.float16, False), (4, 2, torch.bfloat16, True),
                 (2, 2, torch.float16, True)]):
            rng = random.Random(seed)
            torch.manual_seed(seed)
            mask = [[[rng.random() < 0.6 for _ in range(3)] for _ in range(4)]
                    for _ in range(H_KV)]
            r, c = rows[:H_KV], cols[:H_KV]
            q = torch.randn(H, 16, 64, dtype=dtype, device="cuda")
            k = torch.randn(H_KV, 20, 64, dtype=dtype, device="cuda")
            v = torch.randn(H_KV, 20, 64, dtype=dtype, device="cuda")
            w = kiln.VariableBlockSparseAttentionWrapper(ws)
            w.plan(torch.tensor(mask, device="cuda"), torch.tensor(r, device="cuda"),
                   torch.tensor(c, device="cuda"), H, H_KV, 64, causal=causal, q_data_type=dtype)
            o, lse = w.run(q, k, v, return_lse=True)
            ro, rl = variable_reference(q, k, v, mask, r, c, causal)
            atol, rtol = TOL[dtype]
            what = f"seed={seed} H={H} H_KV={H_KV} causal={causal}"
            check_close(self, o, ro, atol, rtol, f"o {what}")
            check_close(self, lse, rl, 1e-2, 1e-3, f"lse {what}")


@unittest.skipUnless(torch is not None, "needs torch")
class TestSparseArguments(unittest.TestCase):
    """The checks that raise before anything needs a GPU."""

    def plan(self, **kw):
        args = dict(indptr=[0, 1, 2], indices=[0, 1], M=32, N=32, R=16, C=16, num_qo_heads=4,
                    num_kv_heads=2, head_dim=64)
        args.update(kw)
        kiln.BlockSparseAttentionWrapper(FakeBuffer()).plan(**args)

    def test_n_not_a_multiple_of_c(self):
        with self.assertRaisesRegex(ValueError, "N=30 must be a multiple of C=16"):
            self.plan(N=30)

    def test_indptr_length(self):
        with self.assertRaisesRegex(ValueError, "indptr has 2 entries"):
            self.plan(indptr=[0, 2])

    def test_block_listed_twice(self):
        with self.assertRaisesRegex(ValueError, "lists column block 1 twice"):
            self.plan(indptr=[0, 2, 2], indices=[1, 1])

    def test_block_out_of_range(self):
        with self.assertRaisesRegex(ValueError, "outside"):
            self.plan(indices=[0, 2])

    def test_vsa_arguments(self):
        with self.assertRaisesRegex(ValueError, "block_mask"):
            self.plan(block_mask=object())

    def test_fp8_kv(self):
        with self.assertRaises(NotImplementedError):
            self.plan(kv_data_type="float8_e4m3fn")

    def test_heads(self):
        with self.assertRaises(ValueError):
            self.plan(num_qo_heads=3)

    def test_backend(self):
        with self.assertRaises(NotImplementedError):
            kiln.BlockSparseAttentionWrapper(FakeBuffer(), backend="cake")
        kiln.BlockSparseAttentionWrapper(FakeBuffer(), backend="fa2")

    def test_run_before_plan(self):
        with self.assertRaises(RuntimeError):
            kiln.BlockSparseAttentionWrapper(FakeBuffer()).run(None, None, None)
        with self.assertRaises(NotImplementedError):
            kiln.BlockSparseAttentionWrapper(FakeBuffer()).run(None, None, None, scale_q=1.0)

    def test_variable(self):
        w = kiln.VariableBlockSparseAttentionWrapper(FakeBuffer())
        m = torch.ones(1, 2, 2, dtype=torch.bool)
        with self.assertRaises(NotImplementedError):
            w.plan(m, torch.tensor([[2, 2]]), torch.tensor([[2, 2]]), 2, 1, 64,
                   pos_encoding_mode="ALIBI")
        with self.assertRaises(ValueError):
            w.plan(m, torch.tensor([[2, 2]]), torch.tensor([[2, 2]]), 3, 2, 64)
        with self.assertRaises(RuntimeError):
            w.run(None, None, None)


if __name__ == "__main__":
    unittest.main()


class FakePagedPrefill:
    """FlashInfer's batch paged prefill as its documentation defines it, in float64 on the CPU:
    request b has query rows qo[b] .. qo[b + 1] and the tokens of pages indices[kv[b] ..
    kv[b + 1]) (page_size P, the last page holding last[b]); custom_mask is the requests'
    [qo_len, kv_len] masks flattened back to back, packed_custom_mask each request's mask
    packed from a byte boundary (bitorder "little"); causal is bottom-right aligned per
    request; lse base 2. It stands in for kiln's wrapper so that the block-sparse wrappers'
    mapping onto it is checked without a GPU."""

    def plan(self, qo, kv, indices, last, H, H_KV, D, P, custom_mask=None,
             packed_custom_mask=None, causal=False, sm_scale=None, o_data_type=None, **_):
        self.qo, self.kv, self.last, self.P = list(qo), list(kv), list(last), P
        self.indices = torch.as_tensor(indices).tolist()
        self.causal, self.sm_scale = causal, sm_scale
        self.o_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(
            str(o_data_type).replace("torch.", ""), o_data_type)
        self.masks = []
        at = 0
        for b in range(len(self.qo) - 1):
            n = (self.qo[b + 1] - self.qo[b]) * self.kv_len(b)
            if packed_custom_mask is not None:
                nbytes = (n + 7) // 8
                raw = packed_custom_mask[at:at + nbytes].tolist()
                bits = [(raw[i // 8] >> (i % 8)) & 1 for i in range(n)]
                self.masks.append(torch.tensor(bits, dtype=torch.bool))
                at += nbytes
            elif custom_mask is not None:
                self.masks.append(custom_mask[at:at + n].cpu())
                at += n
            else:
                self.masks.append(None)

    def kv_len(self, b):
        pages = self.kv[b + 1] - self.kv[b]
        return (pages - 1) * self.P + self.last[b] if pages else 0

    def run(self, q, paged_kv_cache, out=None, lse=None, return_lse=False):
        k_pool, v_pool = paged_kv_cache
        o = torch.zeros(q.shape, dtype=torch.float64)
        s = torch.full(q.shape[:2], float("-inf"), dtype=torch.float64)
        for b in range(len(self.qo) - 1):
            rows = slice(self.qo[b], self.qo[b + 1])
            n_q, n_kv = self.qo[b + 1] - self.qo[b], self.kv_len(b)
            if not n_q or not n_kv:
                continue
            ids = self.indices[self.kv[b]:self.kv[b + 1]]
            k = k_pool[ids].reshape(-1, *k_pool.shape[2:])[:n_kv]
            v = v_pool[ids].reshape(-1, *v_pool.shape[2:])[:n_kv]
            i = torch.arange(n_q)[:, None]
            j = torch.arange(n_kv)[None, :]
            vis = (j <= i + n_kv - n_q) if self.causal else torch.ones(n_q, n_kv).bool()
            if self.masks[b] is not None:
                vis = vis & self.masks[b].reshape(n_q, n_kv)
            o[rows], s[rows] = attend(q[rows], k, v, vis, self.sm_scale)
        o = o.to(self.o_dtype or q.dtype)
        s = s.float()
        if out is not None:
            out.copy_(o)
            o = out
        return (o, s) if return_lse else o


@unittest.skipUnless(torch is not None, "needs torch")
class TestSparseMappingCPU(unittest.TestCase):
    """The wrappers' mapping onto the batch prefill (requests, pages, masks, q / o regrouping)
    against the references, with FakePagedPrefill in place of kiln's kernel."""

    def test_block_sparse_paged_route(self):
        for seed, (M, N, R, C, causal, with_mask, packed) in enumerate([
                (40, 48, 8, 16, True, False, False), (37, 32, 8, 8, False, True, False),
                (30, 64, 16, 8, True, True, True)]):
            rng = random.Random(seed)
            torch.manual_seed(seed)
            MB = -(-M // R)
            ptr, cols = random_bsr(rng, MB, N // C, 0.5, shuffle=not causal)
            q, k, v = (torch.randn(n, h, 64) for n, h in ((M, 4), (N, 2), (N, 2)))
            mask = torch.rand(len(cols), R, C) < 0.6 if with_mask else None
            packed_mask = None
            if packed:
                rows = [min((r + 1) * R, M) - r * R for r in range(MB)]
                flat = torch.cat([mask[ptr[r]:ptr[r + 1]].transpose(0, 1).reshape(R, -1)
                                  [:rows[r]].reshape(-1) for r in range(MB)])
                seg = [0]
                for r in range(MB):
                    seg.append(seg[-1] + rows[r] * (ptr[r + 1] - ptr[r]) * C)
                packed_mask, _ = kiln.segment_packbits(flat, torch.tensor(seg), "little")
            w = kiln.BlockSparseAttentionWrapper(torch.empty(8, dtype=torch.uint8))
            w._paged = FakePagedPrefill()
            w.plan(ptr, cols, M, N, R, C, 4, 2, 64, mask=None if packed else mask,
                   packed_mask=packed_mask, causal=causal)
            self.assertIsNone(w._bsr)
            o, lse = w.run(q.half(), k.half(), v.half(), return_lse=True)
            ro, rl = bsr_reference(q.half(), k.half(), v.half(), ptr, cols, R, C, causal=causal,
                                   mask=mask)
            what = f"seed={seed} causal={causal} mask={with_mask} packed={packed}"
            check_close(self, o, ro, 2e-3, 2e-3, f"o {what}")
            check_close(self, lse, rl, 1e-6, 1e-6, f"lse {what}")

    def test_variable_mapping(self):
        rows = [[3, 5, 0, 8], [8, 4, 4, 0]]
        cols = [[10, 6, 4], [4, 4, 12]]
        for seed, (H, causal) in enumerate([(4, False), (6, True), (2, True)]):
            rng = random.Random(seed)
            torch.manual_seed(seed)
            mask = [[[rng.random() < 0.6 for _ in range(3)] for _ in range(4)] for _ in range(2)]
            q = torch.randn(H, 16, 16).half()
            k = torch.randn(2, 20, 16).half()
            v = torch.randn(2, 20, 16).half()
            w = kiln.VariableBlockSparseAttentionWrapper(torch.empty(8, dtype=torch.uint8))
            w._paged = FakePagedPrefill()
            w.plan(torch.tensor(mask), torch.tensor(rows), torch.tensor(cols), H, 2, 16,
                   causal=causal)
            out = torch.empty(H, 16, 16, dtype=torch.float16)
            o, lse = w.run(q, k, v, out=out, return_lse=True)
            self.assertIs(o, out)
            ro, rl = variable_reference(q, k, v, mask, rows, cols, causal)
            check_close(self, o, ro, 2e-3, 2e-3, f"o seed={seed} H={H} causal={causal}")
            check_close(self, lse, rl, 1e-6, 1e-6, f"lse seed={seed}")
