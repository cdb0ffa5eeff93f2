"""test_page.py — kiln.get_seq_lens, kiln.get_batch_indices_positions and
kiln.append_paged_kv_cache against references written here (a Python loop over the tokens),
for both layouts, the tuple and the one-tensor cache forms, page sizes 1, 3 and 16, and
FlashInfer's documented example; plus the argument checks. CPU with torch (and the GPU when
there is one); skips without torch."""

import random
import unittest

from fi_reference import HAVE_TORCH, torch

import kiln


def devices():
    yield "cpu"
    if HAVE_TORCH and torch.cuda.is_available():
        yield "cuda"


def ragged(lens, dev):
    ptr = [0]
    for n in lens:
        ptr.append(ptr[-1] + n)
    return torch.tensor(ptr, dtype=torch.int32, device=dev)


@unittest.skipUnless(HAVE_TORCH, "needs torch")
class TestSeqLens(unittest.TestCase):
    def test_flashinfer_example(self):
        indptr = torch.tensor([0, 3, 4, 6, 8], dtype=torch.int32)
        last = torch.tensor([13, 8, 9, 6], dtype=torch.int32)
        self.assertEqual(kiln.get_seq_lens(indptr, last, 16).tolist(), [45, 8, 25, 22])

    def test_request_without_pages_counts_its_last_page_len(self):
        # FlashInfer's formula: max(pages - 1, 0) * page_size + last
        got = kiln.get_seq_lens(torch.tensor([0, 0, 2]), torch.tensor([5, 3]), 4)
        self.assertEqual(got.tolist(), [5, 7])

    def test_refusals(self):
        with self.assertRaises(ValueError):
            kiln.get_seq_lens(torch.tensor([0, 1]), torch.tensor([1, 1]), 4)
        with self.assertRaises(ValueError):
            kiln.get_seq_lens(torch.tensor([0, 1]), torch.tensor([1]), 0)
        with self.assertRaises(TypeError):
            kiln.get_seq_lens(torch.tensor([0.0, 1.0]), torch.tensor([1]), 4)


@unittest.skipUnless(HAVE_TORCH, "needs torch")
class TestBatchIndicesPositions(unittest.TestCase):
    def test_flashinfer_example(self):
        for dev in devices():
            b, p = kiln.get_batch_indices_positions(
                torch.tensor([0, 1, 3, 6, 10], dtype=torch.int32, device=dev),
                torch.tensor([5, 5, 5, 5]), 10)
            self.assertEqual(b.tolist(), [0, 1, 1, 2, 2, 2, 3, 3, 3, 3])
            self.assertEqual(p.tolist(), [4, 3, 4, 2, 3, 4, 1, 2, 3, 4])
            self.assertEqual((b.dtype, p.dtype), (torch.int32, torch.int32))
            self.assertEqual(b.device.type, dev)

    def test_random_against_loop(self):
        rng = random.Random(3)
        for trial in range(20):
            lens = [rng.randint(0, 9) for _ in range(rng.randint(1, 7))]
            seq = [n + rng.randint(0, 30) for n in lens]
            b, p = kiln.get_batch_indices_positions(ragged(lens, "cpu"), torch.tensor(seq),
                                                    sum(lens))
            wb, wp = [], []
            for r, n in enumerate(lens):
                wb += [r] * n
                wp += list(range(seq[r] - n, seq[r]))
            self.assertEqual((b.tolist(), p.tolist()), (wb, wp), f"lens {lens} seq {seq}")

    def test_padding_past_the_appended_tokens_is_minus_one(self):
        b, p = kiln.get_batch_indices_positions(torch.tensor([0, 2]), torch.tensor([4]), 4)
        self.assertEqual((b.tolist(), p.tolist()), ([0, 0, -1, -1], [2, 3, -1, -1]))

    def test_refusals(self):
        with self.assertRaises(ValueError):
            kiln.get_batch_indices_positions(torch.tensor([0, 2]), torch.tensor([4, 4]), 2)
        with self.assertRaises(ValueError):
            kiln.get_batch_indices_positions(torch.tensor([0, 2]), torch.tensor([4]), -1)


def ref_append(k_pool, v_pool, layout, ak, av, b, p, indices, indptr):
    """The loop FlashInfer's kernel computes, on clones of the pools."""
    k, v = k_pool.clone(), v_pool.clone()
    P = k.shape[1] if layout == "NHD" else k.shape[2]
    for i in range(ak.shape[0]):
        if b[i] < 0:
            continue
        page = indices[indptr[b[i]] + p[i] // P]
        slot = p[i] % P
        if layout == "NHD":
            k[page, slot], v[page, slot] = ak[i], av[i]
        else:
            k[page, :, slot], v[page, :, slot] = ak[i], av[i]
    return k, v


@unittest.skipUnless(HAVE_TORCH, "needs torch")
class TestAppend(unittest.TestCase):
    def _case(self, dev, layout, P, form, seed):
        rng = random.Random(seed)
        H_KV, D = 2, 8
        B = rng.randint(1, 5)
        old = [rng.randint(0, 20) for _ in range(B)]
        new = [rng.randint(0, 12) for _ in range(B)]
        seq = [o + n for o, n in zip(old, new)]
        pages = [-(-s // P) for s in seq]
        total_pages = sum(pages) + 3
        perm = list(range(total_pages))
        rng.shuffle(perm)
        indices = torch.tensor(perm[:sum(pages)], dtype=torch.int32, device=dev)
        indptr = ragged(pages, dev)
        last = torch.tensor([(s - 1) % P + 1 if s else 0 for s in seq], dtype=torch.int32,
                            device=dev)
        shape = (total_pages, P, H_KV, D) if layout == "NHD" else (total_pages, H_KV, P, D)
        g = torch.Generator().manual_seed(seed)
        k_pool = torch.randn(shape, generator=g).to(dev)
        v_pool = torch.randn(shape, generator=g).to(dev)
        nnz = sum(new)
        ak = torch.randn(nnz, H_KV, D, generator=g).to(dev)
        av = torch.randn(nnz, H_KV, D, generator=g).to(dev)
        bi, pos = kiln.get_batch_indices_positions(ragged(new, dev), kiln.get_seq_lens(
            indptr, last, P), nnz)
        want_k, want_v = ref_append(k_pool.cpu(), v_pool.cpu(), layout, ak.cpu(), av.cpu(),
                                    bi.tolist(), pos.tolist(), indices.tolist(), indptr.tolist())
        if form == "tuple":
            cache = (k_pool, v_pool)
        else:
            cache = torch.stack([k_pool, v_pool], dim=1)
        kiln.append_paged_kv_cache(ak, av, bi, pos, cache, indices, indptr, last, layout)
        got_k, got_v = (k_pool, v_pool) if form == "tuple" else (cache[:, 0], cache[:, 1])
        what = f"{dev} {layout} P={P} {form} seed={seed} old={old} new={new}"
        self.assertTrue(torch.equal(got_k.cpu(), want_k), what)
        self.assertTrue(torch.equal(got_v.cpu(), want_v), what)

    def test_against_loop(self):
        seed = 0
        for dev in devices():
            for layout in ("NHD", "HND"):
                for P in (1, 3, 16):
                    for form in ("tuple", "tensor"):
                        for _ in range(3):
                            seed += 1
                            self._case(dev, layout, P, form, seed)

    def test_flashinfer_example_lengths(self):
        # FlashInfer's docstring: 45 + 8 + 25 + 22 tokens into pages of 16
        k = torch.zeros(10, 2, 16, 1, 8)
        ak = torch.randn(100, 1, 8)
        lens = torch.tensor([45, 8, 25, 22])
        indptr = torch.tensor([0, 3, 4, 6, 8], dtype=torch.int32)
        last = torch.tensor([13, 8, 9, 6], dtype=torch.int32)
        b, p = kiln.get_batch_indices_positions(
            torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]),
            kiln.get_seq_lens(indptr, last, 16), 100)
        kiln.append_paged_kv_cache(ak, ak, b, p, k, torch.arange(8, dtype=torch.int32), indptr,
                                   last)
        self.assertTrue(torch.equal(k[0, 0, :, 0], ak[:16, 0]))  # request 0, page 0
        self.assertTrue(torch.equal(k[2, 1, :13, 0], ak[32:45, 0]))  # its last page
        self.assertTrue(torch.equal(k[3, 0, :8, 0], ak[45:53, 0]))  # request 1
        self.assertTrue(torch.equal(k[7, 1, :6, 0], ak[94:100, 0]))  # request 3's last page
        self.assertTrue(torch.equal(k[8:], torch.zeros_like(k[8:])))  # unused pages untouched

    def test_padded_rows_are_skipped(self):
        k = torch.zeros(2, 4, 1, 8)
        v = torch.zeros(2, 4, 1, 8)
        ak = torch.ones(4, 1, 8)
        b, p = kiln.get_batch_indices_positions(torch.tensor([0, 2]), torch.tensor([2]), 4)
        kiln.append_paged_kv_cache(ak * 7, ak, b, p, (k, v), torch.tensor([1]),
                                   torch.tensor([0, 1]), torch.tensor([2]))
        self.assertEqual(k[1, :, 0, 0].tolist(), [7, 7, 0, 0])
        self.assertTrue(torch.equal(k[0], torch.zeros_like(k[0])))
        before = k.clone()
        minus = torch.full((4,), -1, dtype=torch.int32)
        kiln.append_paged_kv_cache(ak * 9, ak, minus, minus, (k, v), torch.tensor([1]),
                                   torch.tensor([0, 1]), torch.tensor([2]))
        self.assertTrue(torch.equal(k, before))  # every row padded: nothing written

    def test_refusals(self):
        k = torch.zeros(2, 4, 2, 8)
        ok = dict(batch_indices=torch.zeros(3, dtype=torch.int32),
                  positions=torch.arange(3, dtype=torch.int32), paged_kv_cache=(k, k.clone()),
                  kv_indices=torch.tensor([0]), kv_indptr=torch.tensor([0, 1]),
                  kv_last_page_len=torch.tensor([3]))
        a = torch.zeros(3, 2, 8)
        kiln.append_paged_kv_cache(a, a, **ok)
        with self.assertRaises(ValueError):  # dtype differs from the cache
            kiln.append_paged_kv_cache(a.half(), a.half(), **ok)
        with self.assertRaises(ValueError):  # heads differ
            kiln.append_paged_kv_cache(torch.zeros(3, 1, 8), torch.zeros(3, 1, 8), **ok)
        with self.assertRaises(ValueError):
            kiln.append_paged_kv_cache(a, a, **dict(ok, kv_layout="XYZ"))
        with self.assertRaises(ValueError):  # one position per row
            kiln.append_paged_kv_cache(a, a, **dict(ok, positions=torch.arange(2)))
        with self.assertRaises(ValueError):
            kiln.append_paged_kv_cache(a, a, **dict(ok, paged_kv_cache=(k,)))
        with self.assertRaises(TypeError):
            kiln.append_paged_kv_cache(a, a, **dict(ok, paged_kv_cache="cache"))


if __name__ == "__main__":
    unittest.main()
