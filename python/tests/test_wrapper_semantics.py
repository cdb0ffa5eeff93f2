"""test_wrapper_semantics.py — the batch wrappers' FlashInfer semantics and hot path, written
from FlashInfer's documented behaviour (v0.6): plan()'s data_type / q_data_type / kv_data_type,
the deprecated forward() / forward_return_lse(), a batch with no keys at all, run() without an
LSE asked for, and the run-time tensor checks the hot path keeps by tensor metadata.

Most cases run on the CPU: the libkiln.so calls that need a GPU are replaced by recording
stubs (the "fake device" below; its kiln_plan_run writes a known natural-log LSE into the
host memory it is pointed at), torch tensors live on the CPU and the wrappers' CUDA check is
lifted. They skip without torch. TestOnGpu runs the same semantics on a real GPU against a
float32 reference and skips cleanly without one.
"""

import array
import ctypes
import math
import os
import sys
import tempfile
import unittest

_SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
if os.environ.get("KILN_TEST_INSTALLED") != "1" and os.path.isdir(os.path.join(_SRC, "kiln")):
    sys.path.insert(0, _SRC)

import kiln  # noqa: E402
from kiln import _hot, _lib, _wrapper  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

HAVE_TORCH = torch is not None
H, H_KV, D, P = 8, 2, 64, 16
NATURAL_LSE = 0.75  # the fake kiln_plan_run's LSE of every entry, natural log


def written_lse(args):
    """What the fake run writes: NATURAL_LSE in the base args.params.lse_base2 names."""
    return NATURAL_LSE * (kiln.LOG2E if args.params.lse_base2 else 1.0)


RUN_T = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
SCHED_T = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_lib.kiln_batch_shape),
                           ctypes.c_uint64, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_size_t,
                           ctypes.c_void_p)


def _set(ref, value):
    ref._obj.value = value
    return 0


class FakeDevice:
    """Stubs for the GPU calls of libkiln.so (the rest is the real library), CPU tensors in
    place of CUDA ones. Records every kiln_plan_schedule(_scratch) (batch, kv_indptr) and kiln_plan_run
    (a copy of its kiln_batch_args)."""

    def __init__(self):
        self.plans, self.runs, self.kernels = [], [], []  # kernels: kiln_kernel_get calls
        self.scratches = []  # (schedule ws, bytes, scratch, bytes) of each schedule_scratch
        self.lse_count = 0  # floats the fake run writes at args.lse

        def kernel_get(ctx, variant, out):
            self.kernels.append(variant)
            return _set(out, 0x1000 + 0x10 * len(self.kernels))

        def batch_plan(plan, shape, ws, nbytes, stream):
            s = shape.contents if hasattr(shape, "contents") else shape._obj  # C or Python call
            self.plans.append((s.batch, [s.kv_indptr[i] for i in range(s.batch + 1)]))
            return 0

        def sizes(plan, b, t, sched, scratch):
            _set(sched, 4096)
            return _set(scratch, 1 << 16)

        def batch_run(plan, args, stream):
            # args: the address (the C Runner's call through the function pointer below)
            a = _lib.kiln_batch_args()
            ctypes.memmove(ctypes.byref(a), args, ctypes.sizeof(a))
            self.runs.append(a)
            if a.lse and self.lse_count:  # as the kernel: in base 2 where params ask for it
                vals = (ctypes.c_float * self.lse_count)(*([written_lse(a)] * self.lse_count))
                ctypes.memmove(a.lse, vals, ctypes.sizeof(vals))
            return 0

        self.stubs = {
            "kiln_kernel_get": kernel_get,
            "kiln_plan_create": lambda kernel, opts, out: _set(out, 0x2000),
            "kiln_plan_destroy": lambda plan: None,
            "kiln_plan_workspace_size": lambda plan, b, t, out: _set(out, 4096 + (1 << 16)),
            "kiln_plan_workspace_sizes": sizes,
            "kiln_plan_schedule": batch_plan,
            "kiln_plan_schedule_scratch": lambda plan, shape, ws, nbytes, sc, sc_bytes, stream:
                self.scratches.append((ws, nbytes, sc, sc_bytes))
                or batch_plan(plan, shape, ws, nbytes, stream),
            "kiln_plan_run": batch_run,  # made a C function pointer in __enter__
            "kiln_plan_describe": lambda plan, info: 0,
        }

    def __getattr__(self, name):  # the library object the package sees
        stubs = self.__dict__.get("stubs", {})
        if name in stubs:
            return stubs[name]
        return getattr(self.__dict__["real"], name)

    def __enter__(self):
        self.real = _lib.lib()
        # kiln_plan_run as a C function pointer declared like the real one, so that the C
        # Runner (kiln/hot.c) takes the run()s it can, as it does on a GPU
        real_run = self.real.kiln_plan_run
        self.run_cb = RUN_T(self.stubs["kiln_plan_run"])
        fn = type(real_run)(ctypes.cast(self.run_cb, ctypes.c_void_p).value)
        fn.restype, fn.argtypes = real_run.restype, real_run.argtypes
        self.stubs["kiln_plan_run"] = fn
        # kiln_plan_schedule_scratch likewise, so that the decode plan() of the same scalar
        # arguments again goes through the C path (kiln/hot.c's replan), as it does on a GPU
        real_sched = self.real.kiln_plan_schedule_scratch
        self.sched_cb = SCHED_T(self.stubs["kiln_plan_schedule_scratch"])
        fn = type(real_sched)(ctypes.cast(self.sched_cb, ctypes.c_void_p).value)
        fn.restype, fn.argtypes = real_sched.restype, real_sched.argtypes
        self.stubs["kiln_plan_schedule_scratch"] = fn
        self.saved = (_lib._lib, _wrapper._require_cuda, torch._C._cuda_getDevice,
                      getattr(torch._C, "_cuda_getCurrentRawStream", None))
        _lib._lib = self
        _wrapper._require_cuda = lambda device, what: None
        torch._C._cuda_getDevice = lambda: 0
        torch._C._cuda_getCurrentRawStream = lambda index: 0
        self.ctx = kiln.Context(no_device=True, no_cache=True)
        return self

    def __exit__(self, *exc):
        self.ctx.close()  # destroys its plans through the stubs, before they go
        _lib._lib, _wrapper._require_cuda, torch._C._cuda_getDevice, raw = self.saved
        if raw is not None:
            torch._C._cuda_getCurrentRawStream = raw
        return False


def pages_for(lens):
    """indptr, last_page_len, page count for requests of these key counts (page P)."""
    indptr, last = [0], []
    for n in lens:
        pages = (n + P - 1) // P
        indptr.append(indptr[-1] + pages)
        last.append(n - (pages - 1) * P if pages else 0)
    return indptr, last, indptr[-1]


@unittest.skipUnless(HAVE_TORCH, "needs torch (CPU is enough)")
class CpuCase(unittest.TestCase):
    def setUp(self):
        self.dev = FakeDevice().__enter__()

    def tearDown(self):
        self.dev.__exit__(None, None, None)

    def ws(self):
        return torch.empty(1 << 16, dtype=torch.uint8)

    def decode(self, lens=(20, 33), dtype=None, kv_dtype=None, **plan_kw):
        """A planned decode wrapper and its q, paged (k, v) (float16 unless said)."""
        dtype = dtype or torch.float16
        w = kiln.BatchDecodeWithPagedKVCacheWrapper(self.ws(), "NHD", context=self.dev.ctx)
        indptr, last, pages = pages_for(lens)
        self.plan_args = (torch.tensor(indptr, dtype=torch.int32),
                          torch.arange(pages, dtype=torch.int32),
                          torch.tensor(last, dtype=torch.int32), H, H_KV, D, P)
        w.plan(*self.plan_args, **plan_kw)
        kv_dtype = kv_dtype or dtype
        k = torch.zeros((max(pages, 1), P, H_KV, D), dtype=kv_dtype)
        return w, torch.zeros((len(lens), H, D), dtype=dtype), (k, k.clone())


class TestDataTypes(CpuCase):
    """FlashInfer's plan(): kv_data_type and o_data_type default to q's; the deprecated
    data_type fills only the dtypes passed as None (q_data_type's default is "float16")."""

    def test_data_type_fills_kv_and_keeps_q(self):
        w, _, _ = self.decode(data_type=torch.float8_e4m3fn, q_data_type=torch.float16)
        self.assertEqual((w.variant.q_dtype, w.variant.kv_dtype, w.variant.out_dtype),
                         ("f16", "e4m3", "f16"))

    def test_data_type_fills_q_when_none(self):
        w, _, _ = self.decode(data_type="bfloat16", q_data_type=None)
        self.assertEqual((w.variant.q_dtype, w.variant.kv_dtype), ("bf16", "bf16"))
        w, _, _ = self.decode(data_type=torch.bfloat16, q_data_type=None,
                              kv_data_type=torch.float8_e5m2)
        self.assertEqual((w.variant.q_dtype, w.variant.kv_dtype), ("bf16", "e5m2"))

    def test_kv_defaults_to_q(self):
        w, _, _ = self.decode(q_data_type=torch.bfloat16)
        self.assertEqual((w.variant.q_dtype, w.variant.kv_dtype, w.variant.out_dtype),
                         ("bf16", "bf16", "bf16"))

    def test_kiln_refuses_what_it_cannot_run(self):
        # FlashInfer would take fp16 queries over a bf16 cache here; kiln has no such kernel
        with self.assertRaises(ValueError) as cm:
            self.decode(data_type=torch.bfloat16)
        self.assertIn("kv_data_type", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            self.decode(q_data_type=None)
        self.assertIn("data_type", str(cm.exception))

    def test_run_checks_the_planned_dtypes(self):
        w, q, kv = self.decode(data_type=torch.float8_e4m3fn, q_data_type=torch.float16,
                               kv_dtype=torch.float8_e4m3fn)
        w.run(q, kv)
        with self.assertRaises(ValueError) as cm:
            w.run(q.bfloat16(), kv)
        self.assertIn("dtype", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            w.run(q, (kv[0].half(), kv[1].half()))
        self.assertIn("k_cache has dtype torch.float16", str(cm.exception))


class TestEmptyBatch(CpuCase):
    """Requests with no keys attend to nothing: o = 0 and lse = -inf, without a launch."""

    def test_decode_without_pages(self):
        w, q, kv = self.decode(lens=(0, 0, 0))
        q.fill_(1.0)
        o = w.run(q, kv)
        self.assertEqual(tuple(o.shape), (3, H, D))
        self.assertTrue(bool((o == 0).all()))
        o, lse = w.run(q, kv, return_lse=True)
        self.assertTrue(bool((lse == -math.inf).all()))
        self.assertEqual(lse.dtype, torch.float32)
        self.assertEqual(self.dev.runs, [])  # no launch, no refusal

    def test_prefill_without_keys(self):
        w = kiln.BatchPrefillWithRaggedKVCacheWrapper(self.ws(), context=self.dev.ctx)
        w.plan([0, 3, 5], [0, 0, 0], H, H_KV, D)
        k = torch.zeros((0, H_KV, D), dtype=torch.float16)
        o, lse = w.run(torch.ones((5, H, D), dtype=torch.float16), k, k, return_lse=True)
        self.assertTrue(bool((o == 0).all()) and bool((lse == -math.inf).all()))
        pw = kiln.BatchPrefillWithPagedKVCacheWrapper(self.ws(), context=self.dev.ctx)
        pw.plan([0, 4], [0, 0], torch.zeros(0, dtype=torch.int32), [0], H, H_KV, D, P,
                causal=True)
        pool = torch.zeros((1, P, H_KV, D), dtype=torch.float16)
        o = pw.run(torch.ones((4, H, D), dtype=torch.float16), (pool, pool))
        self.assertTrue(bool((o == 0).all()))
        self.assertEqual(self.dev.runs, [])

    def test_a_batch_with_keys_launches(self):
        w, q, kv = self.decode(lens=(0, 5))
        w.run(q, kv)
        self.assertEqual(len(self.dev.runs), 1)


class TestLse(CpuCase):
    """run(return_lse=False) returns o alone and converts nothing; return_lse=True gives
    FlashInfer's base-2 LSE."""

    def test_no_lse_asked(self):
        w, q, kv = self.decode()
        self.dev.lse_count = 2 * H
        o = w.run(q, kv)
        self.assertIsInstance(o, torch.Tensor)
        scratch = self.dev.runs[-1].lse
        self.assertNotEqual(scratch, 0)  # the kernel's LSE goes to the wrapper's scratch
        w.run(q, kv)
        self.assertEqual(self.dev.runs[-1].lse, scratch)  # no new buffer per call
        written = (ctypes.c_float * (2 * H)).from_address(scratch)
        self.assertEqual(list(written), [ctypes.c_float(written_lse(self.dev.runs[-1])).value] *
                         (2 * H))  # and no conversion pass

    def test_lse_base_two(self):
        w, q, kv = self.decode()
        self.dev.lse_count = 2 * H
        o, lse = w.run(q, kv, return_lse=True)
        self.assertEqual(self.dev.runs[-1].params.lse_base2, 1)  # the kernel writes base 2
        self.assertEqual(tuple(lse.shape), (2, H))
        self.assertAlmostEqual(float(lse[1, 3]), NATURAL_LSE * kiln.LOG2E, places=5)
        o, lse = w.run_return_lse(q, kv)
        self.assertAlmostEqual(float(lse[0, 0]), NATURAL_LSE * kiln.LOG2E, places=5)
        mine = torch.empty((2, H), dtype=torch.float32)
        o2 = w.run(q, kv, lse=mine)  # a given lse is written (and converted) even unasked
        self.assertIsInstance(o2, torch.Tensor)
        self.assertAlmostEqual(float(mine[0, 1]), NATURAL_LSE * kiln.LOG2E, places=5)

    def test_lse_base_e_and_v_scale(self):
        """lse_base="e" asks the kernel for the natural log; a v_scale on 16-bit K/V goes to the
        kernel (which multiplies o by it), with no pass over o or the LSE after the launch."""
        w, q, kv = self.decode()
        w2 = kiln.BatchDecodeWithPagedKVCacheWrapper(self.ws(), "NHD", context=self.dev.ctx,
                                                     lse_base="e")
        w2.plan(*self.plan_args)
        self.dev.lse_count = 2 * H
        o, lse = w2.run(q, kv, return_lse=True)
        self.assertEqual(self.dev.runs[-1].params.lse_base2, 0)
        self.assertEqual(float(lse[1, 3]), NATURAL_LSE)
        w.run(q, kv, v_scale=2.0)
        self.assertEqual(self.dev.runs[-1].params.v_scale, 2.0)
        w.run(q, kv)  # the next run without scales resets it
        self.assertIn(self.dev.runs[-1].params.v_scale, (0.0, 1.0))

    def test_lse_false_plan(self):
        w, q, kv = self.decode(lse=False)
        w.run(q, kv)
        self.assertEqual(self.dev.runs[-1].lse, 0)
        with self.assertRaises(ValueError):
            w.run(q, kv, return_lse=True)


class TestForward(CpuCase):
    """FlashInfer's deprecated forward(): its attention arguments (defaults included) replace
    the plan's, for this call and later runs; forward_return_lse() returns (o, lse)."""

    def test_same_arguments_do_not_replan(self):
        w, q, kv = self.decode()
        o = w.forward(q, kv)
        self.assertIsInstance(o, torch.Tensor)
        self.assertEqual(len(self.dev.plans), 1)

    def test_new_arguments_replan_and_stay(self):
        w, q, kv = self.decode(sm_scale=0.25)
        w.forward(q, kv)  # sm_scale=None: FlashInfer's default 1/sqrt(D) replaces 0.25
        self.assertEqual(len(self.dev.plans), 2)
        self.assertAlmostEqual(self.dev.runs[-1].params.sm_scale, 1 / math.sqrt(D), places=6)
        w.forward(q, kv, "NONE", None, None, None, -1, 30.0, 0.5)  # FlashInfer's order
        self.assertEqual(w.variant.logits, "softcap")
        self.assertAlmostEqual(self.dev.runs[-1].params.softcap, 30.0)
        self.assertAlmostEqual(self.dev.runs[-1].params.sm_scale, 0.5)
        w.run(q, kv)  # later runs keep forward's arguments
        self.assertAlmostEqual(self.dev.runs[-1].params.softcap, 30.0)
        self.assertEqual(self.dev.plans[-1], self.dev.plans[0])  # the same batch, re-planned

    def test_repeated_forward_reads_back_what_it_was_given(self):
        # each layer of an engine calls forward() with the same arguments: after the first,
        # nothing is planned or compared again, and the read-back values stay as given
        w, q, kv = self.decode()
        scale = 1 / math.sqrt(D)
        for _ in range(3):
            w.forward(q, kv, sm_scale=scale, window_left=-1, logits_soft_cap=None)
        self.assertEqual((len(self.dev.plans), w._sm_scale, w._logits_soft_cap), (1, scale, None))
        w.forward(q, kv, sm_scale=None, window_left=-1, logits_soft_cap=0.0)  # the same in effect
        self.assertEqual((len(self.dev.plans), w._sm_scale, w._logits_soft_cap), (1, None, 0.0))
        w.forward(q, kv, sm_scale=scale, window_left=-1, logits_soft_cap=None)
        self.assertEqual((w._sm_scale, w._logits_soft_cap), (scale, None))
        w.forward(q, kv, sm_scale=scale, logits_soft_cap=0.0)
        w.forward(q, kv, sm_scale=scale, logits_soft_cap=0)  # equal, of another type: as given
        self.assertIs(type(w._logits_soft_cap), int)
        self.assertEqual(len(self.dev.plans), 1)
        w.forward(q, kv, sm_scale=0.5)
        w.forward(q, kv, sm_scale=0.5)
        self.assertEqual((len(self.dev.plans), w._sm_scale), (2, 0.5))
        self.assertAlmostEqual(self.dev.runs[-1].params.sm_scale, 0.5)
        w.plan(*self.plan_args)  # a new plan: its own arguments, compared again by forward()
        self.assertIsNone(w._sm_scale)
        w.forward(q, kv, sm_scale=0.5)
        self.assertEqual((len(self.dev.plans), w._sm_scale), (4, 0.5))
        self.assertAlmostEqual(self.dev.runs[-1].params.sm_scale, 0.5)

    def test_forward_return_lse(self):
        w, q, kv = self.decode()
        o, lse = w.forward_return_lse(q, kv, q_scale=2.0)
        self.assertEqual(tuple(lse.shape), (2, H))
        self.assertAlmostEqual(self.dev.runs[-1].params.sm_scale, 2.0 / math.sqrt(D), places=6)

    def test_prefill_forward(self):
        pw = kiln.BatchPrefillWithPagedKVCacheWrapper(self.ws(), context=self.dev.ctx)
        pw.plan([0, 4], [0, 1], [0], [8], H, H_KV, D, P)
        q = torch.zeros((4, H, D), dtype=torch.float16)
        pool = torch.zeros((1, P, H_KV, D), dtype=torch.float16)
        pw.forward(q, (pool, pool), causal=True)
        self.assertEqual(pw.variant.mask, "causal")
        o, lse = pw.forward_return_lse(q, (pool, pool))  # causal=False by default
        self.assertEqual(pw.variant.mask, "none")
        rw = kiln.BatchPrefillWithRaggedKVCacheWrapper(self.ws(), context=self.dev.ctx)
        rw.plan([0, 4], [0, 6], H, H_KV, D, causal=True)
        k = torch.zeros((6, H_KV, D), dtype=torch.float16)
        rw.forward(q, k, k, True)
        self.assertEqual((rw.variant.mask, len(self.dev.plans)), ("causal", 4))  # no re-plan
        o, lse = rw.forward_return_lse(q, k, k, True, logits_soft_cap=5.0)
        self.assertEqual(rw.variant.logits, "softcap")


@unittest.skipUnless(HAVE_TORCH, "needs torch (CPU is enough)")
class TestFewTokensBatch(unittest.TestCase):
    """few_tokens over an int32 tensor's copy (plan.host_array's array.array): the longest
    request by torch past 64 requests, as by the walk in Python."""

    def test_the_same_choice_either_way(self):
        import array
        import random

        from kiln import batch

        rnd = random.Random(7)
        for trial in range(300):
            B = rnd.choice((3, 64, 65, 200, 256))
            rows = [rnd.choice((1, 2, 4, 5)) for _ in range(B)]
            if trial % 3 == 1:
                rows[rnd.randrange(B)] = rnd.choice((0, 16, 17, 40))
            if trial % 7 == 2:
                rows = [0] * B
            indptr = [0]
            for n in rows:
                indptr.append(indptr[-1] + n)
            got = batch.few_tokens(array.array("i", indptr), 4)
            self.assertEqual(got, batch.few_tokens(indptr, 4), (B, rows))


class TestSharedWorkspace(CpuCase):
    """Wrappers on one float workspace: each plan's schedule goes to a buffer of its wrapper's
    own, the shared buffer is every plan's scratch; plans and runs interleave freely."""

    def test_two_wrappers_one_buffer(self):
        ws = self.ws()
        a = kiln.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", context=self.dev.ctx)
        b = kiln.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", context=self.dev.ctx)
        indptr, last, pages = pages_for((20, 33))
        ids = torch.arange(pages, dtype=torch.int32)
        a.plan(indptr, ids, last, H, H_KV, D, P)
        b.plan([0, 3, 5], indptr, ids, last, H, H_KV, D, P)
        (sa, na, xa, xna), (sb, nb, xb, xnb) = self.dev.scratches
        self.assertEqual((xa, xna), (ws.data_ptr(), ws.numel()))  # the shared scratch
        self.assertEqual((xb, xnb), (ws.data_ptr(), ws.numel()))
        self.assertNotEqual(sa, sb)  # each its own schedule buffer
        self.assertNotIn(ws.data_ptr(), (sa, sb))
        self.assertEqual((na, nb), (4096, 4096))
        k = torch.zeros((pages, P, H_KV, D), dtype=torch.float16)
        a.run(torch.zeros((2, H, D), dtype=torch.float16), (k, k))  # planned before b: runs
        b.run(torch.zeros((5, H, D), dtype=torch.float16), (k, k))
        a.run(torch.zeros((2, H, D), dtype=torch.float16), (k, k))
        self.assertEqual([r.workspace for r in self.dev.runs], [sa, sb, sa])

    def test_schedule_buffer_is_kept(self):
        w = kiln.BatchDecodeWithPagedKVCacheWrapper(self.ws(), "NHD", context=self.dev.ctx)
        for lens in ((20,), (20, 33), (5,)):
            indptr, last, pages = pages_for(lens)
            w.plan(indptr, torch.arange(pages, dtype=torch.int32), last, H, H_KV, D, P)
        ptrs = [s[0] for s in self.dev.scratches]
        self.assertEqual(ptrs[0], ptrs[2])  # a smaller batch reuses the buffer it has
        self.assertEqual(len(self.dev.scratches), 3)


class TestHotPathChecks(CpuCase):
    """What run() remembers of a tensor is its metadata; the pointer is read every call."""

    def test_pointers_follow_the_tensors(self):
        w, q, kv = self.decode()
        w.run(q, kv)
        q2 = q.clone()
        w.run(q2, kv)
        self.assertEqual(self.dev.runs[-2].q, q.data_ptr())
        self.assertEqual(self.dev.runs[-1].q, q2.data_ptr())
        pool = torch.zeros((kv[0].shape[0], 2, P, H_KV, D), dtype=torch.float16)
        w.run(q, pool)  # one [pages, 2, ...] tensor: v at its offset
        a = self.dev.runs[-1]
        self.assertEqual((a.k, a.v), (pool[:, 0].data_ptr(), pool[:, 1].data_ptr()))
        self.assertEqual(a.k_stride_page, pool.stride(0))

    def test_checks_still_bite_after_a_good_call(self):
        w, q, kv = self.decode()
        w.run(q, kv)
        bad = torch.zeros((2, H, 2 * D), dtype=torch.float16)[:, :, ::2]
        with self.assertRaises(ValueError) as cm:
            w.run(bad, kv)
        self.assertIn("contiguous", str(cm.exception))
        flat = torch.zeros(2 * H * D + 1, dtype=torch.float16)
        shifted = flat[1:].view(2, H, D)  # q's metadata exactly, a 2-byte aligned pointer
        with self.assertRaises(ValueError) as cm:
            w.run(shifted, kv)
        self.assertIn("16-byte aligned", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            w.run(q[:1], kv)
        self.assertIn("rows", str(cm.exception))
        with self.assertRaises(TypeError):
            w.run(q.tolist(), kv)
        w.run(q, kv)  # and the good tensor still runs
        self.assertEqual(len(self.dev.runs), 2)

    def test_the_c_runner_takes_what_was_checked(self):
        if _hot.module() is None:
            self.skipTest(f"no C Runner: {_hot.status()}")
        w, q, kv = self.decode()
        python_path = []
        run = w._run
        w._run = lambda *a, **k: python_path.append(1) or run(*a, **k)
        o = torch.empty((2, H, D), dtype=torch.float16)
        calls = [lambda: w.run(q, kv), lambda: w.run(q, kv, out=o),
                 lambda: w.run(q, kv, return_lse=True), lambda: w.run(q, kv, k_scale=2.0)]
        for call in calls:
            call()
        self.assertEqual(len(python_path), 2)  # q and kv, then out: checked in Python once
        seen = self.dev.runs[:]
        for call in calls:
            call()
        self.assertEqual(len(python_path), 2)  # then C takes them all, float scales too
        fields = [f for f, _ in _lib.kiln_batch_args._fields_ if f not in ("o", "lse")]
        for old, new in zip(seen, self.dev.runs[-4:]):  # the same args either way
            for f in fields:
                got, want = getattr(new, f), getattr(old, f)
                if f == "params":
                    got, want = bytes(got), bytes(want)
                self.assertEqual(got, want, f)
        o2, lse = w.run(q, kv, return_lse=True)
        self.assertEqual((self.dev.runs[-1].o, self.dev.runs[-1].lse),
                         (o2.data_ptr(), lse.data_ptr()))

    def test_a_plan_of_the_same_arguments_in_c(self):
        if _hot.module() is None:
            self.skipTest(f"no C Runner: {_hot.status()}")
        # four requests first: the schedule buffer and the LSE scratch hold the three after
        w, q, kv = self.decode(lens=(20, 33, 1, 2), q_data_type=torch.float16, sm_scale=0.1)
        st = w._state
        python_path = []
        plan_batch = w._plan_batch
        w._plan_batch = lambda *a, **k: python_path.append(1) or plan_batch(*a, **k)
        # another batch under the same scalar arguments: planned in C, the state kept
        indptr, last, pages = pages_for((5, 40, 17))
        ids = torch.arange(pages, dtype=torch.int32).flip(0)
        args = (torch.tensor(indptr, dtype=torch.int32), ids,
                torch.tensor(last, dtype=torch.int32)) + self.plan_args[3:]
        w.plan(*args, q_data_type=torch.float16, sm_scale=0.1)
        self.assertEqual((python_path, self.dev.plans[-1]), ([], (3, indptr)))
        self.assertIs(w._state, st)
        self.assertEqual((st.batch, st.total_qo, list(array.array("i", st.kv_indptr)),
                          list(array.array("i", st.last)), st.indices), (3, 3, indptr, last, ids))
        q3 = torch.zeros((3, H, D), dtype=torch.float16)
        k = torch.zeros((pages, P, H_KV, D), dtype=torch.float16)
        o = w.run(q3, (k, k.clone()))
        self.assertEqual(tuple(o.shape), (3, H, D))
        self.assertEqual(self.dev.runs[-1].kv_indices, ids.data_ptr())
        # the same arguments in another form (equal values, other objects) still go to C
        w.plan(*args, q_data_type=torch.float16, sm_scale=float("0.1"))
        self.assertEqual(python_path, [])
        # its arguments are the plan's: forward() re-plans this batch with a new scale
        w.forward(q3, (k, k.clone()), sm_scale=0.5)
        self.assertEqual((len(python_path), self.dev.plans[-1]), (1, (3, indptr)))
        self.assertAlmostEqual(self.dev.runs[-1].params.sm_scale, 0.5)
        # other scalars, other forms of the arrays, bad arrays: the Python path
        w.plan(*args, q_data_type=torch.float16, sm_scale=0.1)  # after forward: not armed
        w.plan(*args, q_data_type=torch.float16, sm_scale=0.1)
        self.assertEqual(len(python_path), 2)
        for changed in [dict(sm_scale=0.2), dict(sm_scale=0.1, logits_soft_cap=0.0)]:
            w.plan(*args, q_data_type=torch.float16, **changed)
        self.assertEqual(len(python_path), 4)
        w.plan(*args, q_data_type=torch.float16, sm_scale=0.1)
        w.plan(indptr, ids, last, *self.plan_args[3:], q_data_type=torch.float16, sm_scale=0.1)
        self.assertEqual(len(python_path), 6)
        bad = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
        with self.assertRaisesRegex(ValueError, r"indptr\[0\] = 1: must be 0"):
            w.plan(bad, *args[1:], q_data_type=torch.float16, sm_scale=0.1)
        self.assertIsNone(w._state)  # a failed plan leaves nothing to run
        w.plan(*args, q_data_type=torch.float16, sm_scale=0.1)
        with self.assertRaisesRegex(ValueError, "the indptr says 6 page ids, the indices hold 5"):
            w.plan(args[0], ids[:-1], *args[2:], q_data_type=torch.float16, sm_scale=0.1)

    def test_prefill_plans_of_the_same_arguments_in_c(self):
        if _hot.module() is None:
            self.skipTest(f"no C Runner: {_hot.status()}")
        i32 = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
        pw = kiln.BatchPrefillWithPagedKVCacheWrapper(self.ws(), context=self.dev.ctx)
        rw = kiln.BatchPrefillWithRaggedKVCacheWrapper(self.ws(), context=self.dev.ctx)
        python_path = []
        for w in (pw, rw):
            plan_batch = w._plan_batch
            w._plan_batch = lambda *a, plan_batch=plan_batch, **k: (
                python_path.append(1) or plan_batch(*a, **k))
        ids = torch.arange(8, dtype=torch.int32)
        # 40 rows in the first request: the prefill families (q_tokens left to kiln)
        pw.plan(i32([0, 40, 43, 60]), i32([0, 3, 5, 8]), ids, i32([16, 1, 9]), H, H_KV, D, P,
                causal=True)
        rw.plan(i32([0, 40, 43, 60]), i32([0, 50, 90, 120]), H, H_KV, D, causal=True)
        st_p, st_r = pw._state, rw._state
        self.assertEqual(len(python_path), 2)
        pw.plan(i32([0, 30, 31]), i32([0, 2, 6]), ids, i32([3, 4]), H, H_KV, D, P, causal=True)
        rw.plan(i32([0, 30, 31]), i32([0, 60, 61]), H, H_KV, D, causal=True)
        self.assertEqual(len(python_path), 2)  # both in C
        self.assertIs(pw._state, st_p)
        self.assertEqual((st_p.batch, st_p.total_qo, list(array.array("i", st_p.qo_indptr)),
                          list(array.array("i", st_p.last))), (2, 31, [0, 30, 31], [3, 4]))
        self.assertEqual((st_r.batch, st_r.total_qo, st_r.total_kv), (2, 31, 61))
        q = torch.zeros((31, H, D), dtype=torch.float16)
        k = torch.zeros((61, H_KV, D), dtype=torch.float16)
        rw.run(q, k, k)
        self.assertEqual(self.dev.plans[-1], (2, [0, 60, 61]))
        with self.assertRaisesRegex(ValueError, "61"):
            rw.run(q, k[:60], k[:60])  # the rows the plan in C asked for
        # requests of at most 16 rows: the few-token kernels, planned on the Python path
        pw.plan(i32([0, 3, 7]), i32([0, 2, 6]), ids, i32([3, 4]), H, H_KV, D, P, causal=True)
        self.assertEqual((len(python_path), pw.variant.q_tokens), (3, 4))
        pw.plan(i32([0, 2, 6]), i32([0, 2, 6]), ids, i32([3, 4]), H, H_KV, D, P, causal=True)
        self.assertEqual(len(python_path), 3)  # the same choice: in C
        pw.plan(i32([0, 2, 7]), i32([0, 2, 6]), ids, i32([3, 4]), H, H_KV, D, P, causal=True)
        self.assertEqual((len(python_path), pw.variant.q_tokens), (4, 8))  # another kernel
        # a custom mask is the Python path's, always
        mask = torch.ones(2 * 17 + 5 * 50, dtype=torch.bool)
        pw.plan(i32([0, 2, 7]), i32([0, 2, 6]), ids, i32([1, 2]), H, H_KV, D, P,
                custom_mask=mask)
        pw.plan(i32([0, 2, 7]), i32([0, 2, 6]), ids, i32([1, 2]), H, H_KV, D, P,
                custom_mask=mask)
        self.assertEqual(len(python_path), 6)

    def test_plan_arrays_from_every_form(self):
        w = kiln.BatchDecodeWithPagedKVCacheWrapper(self.ws(), context=self.dev.ctx)
        for indptr in ([0, 2, 3], (0, 2, 3), torch.tensor([0, 2, 3]),
                       torch.tensor([0, 2, 3], dtype=torch.int32)):
            w.plan(indptr, torch.arange(3, dtype=torch.int32), [5, 1], H, H_KV, D, P)
            self.assertEqual(self.dev.plans[-1], (2, [0, 2, 3]))
        with self.assertRaises(ValueError) as cm:
            w.plan(torch.tensor([0, 2**33]), [0], [1], H, H_KV, D, P)
        self.assertIn("indptr[1]", str(cm.exception))
        with self.assertRaises(TypeError):
            w.plan([0, True], [0], [1], H, H_KV, D, P)
        with self.assertRaises(RuntimeError):  # a failed plan leaves nothing to run
            w.run(torch.zeros((2, H, D), dtype=torch.float16), (None, None))


# ---- on a GPU --------------------------------------------------------------------------------

HAVE_GPU = HAVE_TORCH and torch.cuda.is_available()


def _have_batch_api():
    try:
        return _lib.has("kiln_plan_run")
    except kiln.KilnLibraryError:
        return False


def reference_decode(q, k_pool, v_pool, indptr, last, sm_scale, k_scale=1.0, v_scale=1.0):
    """o [B, H, D], natural-log lse [B, H], float32, for paged NHD pools."""
    B = q.shape[0]
    o = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full((B, H), -math.inf, dtype=torch.float32, device=q.device)
    for b in range(B):
        pages = list(range(indptr[b], indptr[b + 1]))
        if not pages:
            continue
        n = (len(pages) - 1) * P + last[b]
        k = k_pool[pages].float().reshape(-1, H_KV, D)[:n] * k_scale
        v = v_pool[pages].float().reshape(-1, H_KV, D)[:n] * v_scale
        k = k.repeat_interleave(H // H_KV, dim=1)
        v = v.repeat_interleave(H // H_KV, dim=1)
        s = torch.einsum("hd,nhd->hn", q[b].float(), k) * sm_scale
        lse[b] = torch.logsumexp(s, dim=1)
        o[b] = torch.einsum("hn,nhd->hd", s.softmax(dim=1), v)
    return o, lse


@unittest.skipUnless(HAVE_GPU and _have_batch_api(),
                     "needs torch, a CUDA GPU and a libkiln.so with the batch API")
class TestOnGpu(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="kiln-py-semantics-")
        cache = os.environ.get("KILN_TEST_CACHE") or cls.tmp.name
        cls.ctx = kiln.Context(cache_dir=cache)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()  # the context stays open: launches may still be in flight

    def setUp(self):
        torch.manual_seed(15)

    def wrapper(self):
        ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
        return kiln.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", context=self.ctx)

    def batch(self, lens, kv_dtype=None):
        indptr, last, pages = pages_for(lens)
        pool = torch.randn((2, max(pages, 1), P, H_KV, D), device="cuda")
        pool = pool.to(kv_dtype or torch.float16)
        q = torch.randn((len(lens), H, D), device="cuda", dtype=torch.float16)
        return q, pool[0], pool[1], indptr, last, pages

    def close(self, got, want, what, atol=2e-2, rtol=2e-2):
        err = (got.float() - want).abs() - (atol + rtol * want.abs())
        self.assertLessEqual(float(err.max()), 0.0, f"{what}: max excess {float(err.max())}")

    def test_int32_index_arrays_are_checked_by_the_planner(self):
        # plan.host_array copies int32 host tensors as they are and leaves their values to
        # kiln_plan_schedule: the same refusals (a ValueError naming the request), no state
        w = self.wrapper()
        ids = torch.arange(4, dtype=torch.int32, device="cuda")
        q = torch.zeros((3, H, D), dtype=torch.float16, device="cuda")
        pool = torch.zeros((4, P, H_KV, D), dtype=torch.float16, device="cuda")
        for indptr, last, what in (([0, 3, 1, 4], [1, 1, 1], "request 1: kv_indptr decreases"),
                                   ([0, 2, 4, 4], [P + 1, 1, 1], "request 0: kv_last_page_len"),
                                   ([0, 2, 3, 4], [3, 0, 2], "request 1: kv_last_page_len")):
            with self.subTest(what):
                with self.assertRaisesRegex(ValueError, what):
                    w.plan(torch.tensor(indptr, dtype=torch.int32), ids,
                           torch.tensor(last, dtype=torch.int32), H, H_KV, D, P)
                with self.assertRaises(RuntimeError):  # a failed plan leaves nothing to run
                    w.run(q, (pool, pool))
        w.plan(torch.tensor([0, 2, 4, 4], dtype=torch.int32), ids,
               torch.tensor([5, P, 0], dtype=torch.int32), H, H_KV, D, P)  # 2 has no pages
        self.assertEqual(tuple(w.run(q, (pool, pool)).shape), (3, H, D))

    def test_fp8_kv_with_data_type_and_q_data_type(self):
        q, k, v, indptr, last, pages = self.batch([100, 7, 300], torch.float8_e4m3fn)
        w = self.wrapper()
        w.plan(torch.tensor(indptr, dtype=torch.int32),
               torch.arange(pages, dtype=torch.int32, device="cuda"),
               torch.tensor(last, dtype=torch.int32), H, H_KV, D, P,
               data_type=torch.float8_e4m3fn, q_data_type=torch.float16)
        o, lse = w.run(q, (k, v), k_scale=0.5, v_scale=2.0, return_lse=True)
        ro, rl = reference_decode(q, k, v, indptr, last, 1 / math.sqrt(D), 0.5, 2.0)
        self.assertEqual(o.dtype, torch.float16)
        self.close(o, ro, "o")
        self.close(lse, rl * kiln.LOG2E, "lse (base 2)", 1e-3, 1e-3)

    def test_empty_batch(self):
        q, k, v, indptr, last, pages = self.batch([0, 0])
        w = self.wrapper()
        w.plan(torch.tensor(indptr, dtype=torch.int32),
               torch.zeros(0, dtype=torch.int32, device="cuda"),
               torch.tensor(last, dtype=torch.int32), H, H_KV, D, P)
        o, lse = w.run(q, (k, v), return_lse=True)
        self.assertTrue(bool((o == 0).all()) and bool((lse == -math.inf).all()))

    def test_forward_and_lse_free_run(self):
        q, k, v, indptr, last, pages = self.batch([40, 129])
        w = self.wrapper()
        w.plan(indptr, torch.arange(pages, dtype=torch.int32, device="cuda"), last, H, H_KV, D,
               P, sm_scale=0.3)
        ro, rl = reference_decode(q, k, v, indptr, last, 0.3)
        self.close(w.run(q, (k, v)), ro, "run, no lse")
        o, lse = w.forward_return_lse(q, (k, v), sm_scale=0.3)
        self.close(o, ro, "forward_return_lse o")
        self.close(lse, rl * kiln.LOG2E, "forward_return_lse lse", 1e-3, 1e-3)
        ro2, _ = reference_decode(q, k, v, indptr, last, 1 / math.sqrt(D))
        self.close(w.forward(q, (k, v)), ro2, "forward with FlashInfer's default sm_scale")
        torch.cuda.synchronize()


if __name__ == "__main__":
    unittest.main()
