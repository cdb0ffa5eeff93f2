"""test_packbits.py — kiln.packbits and kiln.segment_packbits against a bit-by-bit reference
written here (numpy.packbits' definition: "big" puts the first element in bit 7, "little" in
bit 0, the last byte padded with zeros), FlashInfer's documented examples, and the argument
checks. Runs on the CPU with torch (and again on a GPU when there is one); skips without
torch."""

import random
import unittest

from fi_reference import HAVE_TORCH, torch

import kiln


def ref_pack(bits, order):
    out = []
    for i in range(0, len(bits), 8):
        byte = 0
        for t, b in enumerate(bits[i:i + 8]):
            if b:
                byte |= 1 << (7 - t if order == "big" else t)
        out.append(byte)
    return out


def devices():
    yield "cpu"
    if HAVE_TORCH and torch.cuda.is_available():
        yield "cuda"


@unittest.skipUnless(HAVE_TORCH, "needs torch")
class TestPackbits(unittest.TestCase):
    def test_flashinfer_example(self):
        x = torch.tensor([1, 0, 1, 1, 0, 0, 1, 1], dtype=torch.bool)
        self.assertEqual([bin(v) for v in kiln.packbits(x).tolist()], ["0b10110011"])
        self.assertEqual(kiln.packbits(x, bitorder="little").tolist(), [0b11001101])

    def test_random_lengths_both_orders(self):
        rng = random.Random(15)
        for dev in devices():
            for n in list(range(0, 20)) + [63, 64, 65, 1000]:
                bits = [rng.random() < 0.5 for _ in range(n)]
                x = torch.tensor(bits, dtype=torch.bool, device=dev)
                for order in ("big", "little"):
                    y = kiln.packbits(x, order)
                    self.assertEqual(y.dtype, torch.uint8)
                    self.assertEqual(y.device.type, dev)
                    self.assertEqual(y.tolist(), ref_pack(bits, order), f"n={n} {order} {dev}")

    def test_nonzero_is_one(self):
        x = torch.tensor([0.0, 2.5, -1.0, 0.0, 0.0, 0.0, 0.0, 3.0])
        self.assertEqual(kiln.packbits(x).tolist(), [0b01100001])

    def test_refusals(self):
        with self.assertRaises(ValueError):
            kiln.packbits(torch.ones(2, 8, dtype=torch.bool))
        with self.assertRaises(ValueError):
            kiln.packbits(torch.ones(8, dtype=torch.bool), bitorder="middle")
        with self.assertRaises(TypeError):
            kiln.packbits([1, 0, 1])


@unittest.skipUnless(HAVE_TORCH, "needs torch")
class TestSegmentPackbits(unittest.TestCase):
    def test_flashinfer_example(self):
        x = torch.tensor([1, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1], dtype=torch.bool)
        y, new = kiln.segment_packbits(x, torch.tensor([0, 4, 7, 11]), bitorder="big")
        self.assertEqual([bin(v) for v in y.tolist()], ["0b10110000", "0b100000", "0b11010000"])
        self.assertEqual(new.tolist(), [0, 1, 2, 3])
        self.assertEqual(new.dtype, torch.int32)

    def test_random_segments(self):
        rng = random.Random(7)
        for dev in devices():
            for trial in range(20):
                lens = [rng.choice([0, 1, 7, 8, 9, 16, 23]) for _ in range(rng.randint(1, 6))]
                bits = [rng.random() < 0.5 for _ in range(sum(lens))]
                ptr = [0]
                for n in lens:
                    ptr.append(ptr[-1] + n)
                x = torch.tensor(bits, dtype=torch.bool, device=dev)
                for order in ("big", "little"):
                    y, new = kiln.segment_packbits(x, torch.tensor(ptr, device=dev), order)
                    want, want_ptr = [], [0]
                    for b in range(len(lens)):
                        seg = ref_pack(bits[ptr[b]:ptr[b + 1]], order)
                        want += seg
                        want_ptr.append(want_ptr[-1] + len(seg))
                    self.assertEqual(y.tolist(), want, f"lens {lens} {order} {dev}")
                    self.assertEqual(new.tolist(), want_ptr)

    def test_little_matches_kiln_bitmask_of_one_segment(self):
        x = torch.rand(37) < 0.5
        y, _ = kiln.segment_packbits(x, torch.tensor([0, 37]), "little")
        self.assertEqual(y.tolist(), kiln.packbits(x, "little").tolist())

    def test_refusals(self):
        x = torch.ones(8, dtype=torch.bool)
        with self.assertRaises(ValueError):
            kiln.segment_packbits(x, torch.tensor([0, 5, 3]))
        with self.assertRaises(ValueError):
            kiln.segment_packbits(x, torch.tensor([0, 9]))
        with self.assertRaises(TypeError):
            kiln.segment_packbits(x, torch.tensor([0.0, 8.0]))
        with self.assertRaises(ValueError):
            kiln.segment_packbits(x, torch.tensor([0, 8]), bitorder="BIG")


if __name__ == "__main__":
    unittest.main()
