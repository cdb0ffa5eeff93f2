"""test_rope.py — kiln's flashinfer.rope functions (kiln.apply_rope and the rest) against a
float64 reference written here another way: each (token, head) as complex numbers turned by
e^(i pos f_d), positions walked token by token, Llama 3.1's frequencies by its published
if / elif / else rule. Runs on the CPU with torch (and on the GPU too when there is one);
skips without torch."""

import cmath
import math
import unittest

try:
    import torch
except ImportError:
    torch = None

import kiln

DEVICES = ["cpu"] + (["cuda"] if torch is not None and torch.cuda.is_available() else [])
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def ref_freqs(half, rotary_dim, scale, theta, llama31=None):
    out = []
    for d in range(half):
        f = theta ** (-2.0 * d / rotary_dim)
        if llama31 is None:
            out.append(f / scale)
            continue
        low, high, old = llama31
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(f)
        elif wavelen > old / low:
            out.append(f / scale)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / scale + smooth * f)
    return out


def ref_rotate(x, positions, rotary_dim, interleave, freqs):
    """x [nnz, H, D] (any dtype) -> float64, the first rotary_dim dims rotated."""
    y = x.double().cpu().clone()
    half = rotary_dim // 2
    for t, pos in enumerate(positions):
        for h in range(x.shape[1]):
            for d in range(half):
                a, b = (2 * d, 2 * d + 1) if interleave else (d, d + half)
                z = complex(float(y[t, h, a]), float(y[t, h, b])) * cmath.exp(1j * pos * freqs[d])
                y[t, h, a], y[t, h, b] = z.real, z.imag
    return y


def positions_of(indptr, offsets):
    pos = []
    for i in range(len(offsets)):
        pos += [offsets[i] + j for j in range(indptr[i + 1] - indptr[i])]
    return pos


@unittest.skipUnless(torch is not None, "needs torch (CPU is enough)")
class TestRope(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(7)

    def close(self, got, ref, dtype, what):
        tol = TOL[str(dtype).replace("torch.", "")]
        err = (got.double().cpu() - ref).abs().max().item()
        self.assertLessEqual(err, tol * max(1.0, ref.abs().max().item()), f"{what}: max err {err}")

    def test_indptr_offsets(self):
        for dev in DEVICES:
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                for interleave in (False, True):
                    for rotary_dim in (None, 32):
                        lens, offsets = [3, 0, 5, 1], [0, 7, 100, 4000]
                        indptr = [0]
                        for n in lens:
                            indptr.append(indptr[-1] + n)
                        q = torch.randn(indptr[-1], 4, 64).to(dtype).to(dev)
                        k = torch.randn(indptr[-1], 2, 64).to(dtype).to(dev)
                        qr, kr = kiln.apply_rope(
                            q, k, torch.tensor(indptr, dtype=torch.int32, device=dev),
                            torch.tensor(offsets, dtype=torch.int32, device=dev),
                            rotary_dim=rotary_dim, interleave=interleave, rope_scale=2.0,
                            rope_theta=5e4)
                        r = rotary_dim or 64
                        f = ref_freqs(r // 2, r, 2.0, 5e4)
                        pos = positions_of(indptr, offsets)
                        what = f"{dev} {dtype} interleave={interleave} rotary_dim={rotary_dim}"
                        self.assertEqual((qr.dtype, qr.shape), (dtype, q.shape))
                        self.close(qr, ref_rotate(q, pos, r, interleave, f), dtype, what + " q")
                        self.close(kr, ref_rotate(k, pos, r, interleave, f), dtype, what + " k")

    def test_pos_ids_and_inplace(self):
        for dev in DEVICES:
            q = torch.randn(6, 2, 32, device=dev)
            k = torch.randn(6, 1, 32, device=dev)
            pos = [5, 0, 9, 9, 1000, 3]
            ids = torch.tensor(pos, device=dev)
            qr, kr = kiln.apply_rope_pos_ids(q, k, ids)
            f = ref_freqs(16, 32, 1.0, 1e4)
            self.close(qr, ref_rotate(q, pos, 32, False, f), q.dtype, f"{dev} pos_ids q")
            self.close(kr, ref_rotate(k, pos, 32, False, f), k.dtype, f"{dev} pos_ids k")
            q2, k2 = q.clone(), k.clone()
            self.assertIsNone(kiln.apply_rope_pos_ids_inplace(q2, k2, ids))
            self.assertTrue(torch.equal(q2, qr) and torch.equal(k2, kr))
            q3, k3 = q.clone(), k.clone()
            ptr = torch.tensor([0, 6], device=dev)
            self.assertIsNone(kiln.apply_rope_inplace(q3, k3, ptr, torch.tensor([2], device=dev)))
            q4, k4 = kiln.apply_rope(q, k, ptr, torch.tensor([2], device=dev))
            self.assertTrue(torch.equal(q3, q4) and torch.equal(k3, k4))

    def test_llama31(self):
        for dev in DEVICES:
            q = torch.randn(5, 2, 128, device=dev)
            k = torch.randn(5, 2, 128, device=dev)
            indptr, offsets = [0, 2, 5], [10, 20000]
            ptr = torch.tensor(indptr, device=dev)
            off = torch.tensor(offsets, device=dev)
            qr, kr = kiln.apply_llama31_rope(q, k, ptr, off)  # FlashInfer's defaults
            f = ref_freqs(64, 128, 8.0, 5e5, (1.0, 4.0, 8192.0))
            pos = positions_of(indptr, offsets)
            self.close(qr, ref_rotate(q, pos, 128, False, f), q.dtype, f"{dev} llama31 q")
            self.close(kr, ref_rotate(k, pos, 128, False, f), k.dtype, f"{dev} llama31 k")
            # the three frequency regimes all occur at these defaults
            plain = ref_freqs(64, 128, 1.0, 5e5)
            self.assertTrue(any(a == b for a, b in zip(f, plain)))
            self.assertTrue(any(abs(a - b / 8) < 1e-18 for a, b in zip(f, plain)))
            ids = torch.tensor(pos, device=dev)
            q2, k2 = kiln.apply_llama31_rope_pos_ids(q, k, ids)
            self.assertTrue(torch.equal(q2, qr) and torch.equal(k2, kr))
            q3, k3 = q.clone(), k.clone()
            kiln.apply_llama31_rope_pos_ids_inplace(q3, k3, ids)
            self.assertTrue(torch.equal(q3, qr))
            q4, k4 = q.clone(), k.clone()
            kiln.apply_llama31_rope_inplace(q4, k4, ptr, off)
            self.assertTrue(torch.equal(k4, kr))

    def test_cos_sin_cache(self):
        for dev in DEVICES:
            for is_neox in (True, False):
                H, H_KV, D, R, n = 4, 2, 64, 48, 7
                inv = torch.tensor(ref_freqs(R // 2, R, 1.0, 1e4), dtype=torch.float64)
                ang = torch.arange(500, dtype=torch.float64)[:, None] * inv[None, :]
                cache = torch.cat([ang.cos(), ang.sin()], dim=-1).float().to(dev)
                pos = [0, 3, 499, 17, 17, 250, 1]
                query = torch.randn(n, H * D, device=dev).half()
                key = torch.randn(n, H_KV * D, device=dev).half()
                positions = torch.tensor(pos, device=dev)
                qo, ko = kiln.apply_rope_with_cos_sin_cache(positions, query, key, D, cache,
                                                            is_neox=is_neox)
                self.assertEqual((qo.shape, ko.shape), (query.shape, key.shape))
                f = inv.tolist()
                want_q = ref_rotate(query.view(n, H, D), pos, R, not is_neox, f).view(n, -1)
                want_k = ref_rotate(key.view(n, H_KV, D), pos, R, not is_neox, f).view(n, -1)
                self.close(qo, want_q, torch.float16, f"{dev} cache neox={is_neox} q")
                self.close(ko, want_k, torch.float16, f"{dev} cache neox={is_neox} k")
                q2, k2 = query.clone(), key.clone()
                self.assertIsNone(kiln.apply_rope_with_cos_sin_cache_inplace(
                    positions, q2, k2, D, cache, is_neox=is_neox))
                self.assertTrue(torch.equal(q2, qo) and torch.equal(k2, ko))

    def test_module_path(self):
        import kiln.rope

        self.assertIs(kiln.rope.apply_rope, kiln.apply_rope)  # flashinfer.rope's import path

    def test_bad_arguments(self):
        q, k = torch.randn(4, 2, 16), torch.randn(4, 1, 16)
        ptr, off = torch.tensor([0, 4]), torch.tensor([0])
        cases = [
            (ValueError, "must be even", lambda: kiln.apply_rope(q, k, ptr, off, rotary_dim=7)),
            (ValueError, "rotary_dim", lambda: kiln.apply_rope(q, k, ptr, off, rotary_dim=32)),
            (ValueError, "indptr has 2 entries", lambda: kiln.apply_rope(
                q, k, ptr, torch.tensor([0, 1]))),
            (ValueError, "tokens", lambda: kiln.apply_rope(q, k[:3], ptr, off)),
            (ValueError, "pos_ids has 3", lambda: kiln.apply_rope_pos_ids(
                q, k, torch.tensor([0, 1, 2]))),
            (ValueError, "integers", lambda: kiln.apply_rope_pos_ids(q, k, torch.zeros(4))),
            (ValueError, "float16, bfloat16, float32", lambda: kiln.apply_rope(
                q.double(), k.double(), ptr, off)),
            (ValueError, "rope_theta", lambda: kiln.apply_rope(q, k, ptr, off, rope_theta=0)),
            (ValueError, "low_freq_factor", lambda: kiln.apply_llama31_rope(
                q, k, ptr, off, low_freq_factor=4, high_freq_factor=4)),
            (ValueError, "float32", lambda: kiln.apply_rope_with_cos_sin_cache(
                torch.tensor([0]), torch.randn(1, 32), None, 16, torch.zeros(8, 16).half())),
            (ValueError, "head_size", lambda: kiln.apply_rope_with_cos_sin_cache(
                torch.tensor([0]), torch.randn(1, 30), None, 16, torch.zeros(8, 16))),
            (TypeError, "interleave", lambda: kiln.apply_rope(q, k, ptr, off, interleave="no")),
        ]
        for exc, fragment, call in cases:
            with self.subTest(fragment=fragment):
                with self.assertRaises(exc) as cm:
                    call()
                self.assertIn(fragment, str(cm.exception))


if __name__ == "__main__":
    unittest.main()
