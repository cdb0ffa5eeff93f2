"""test_hot.py — the C Runner (kiln/hot.c, loaded by kiln/_hot.py) without torch and without a
GPU: stand-in tensors, a real kiln.Context for the hold, and a ctypes callback in place of
kiln_plan_run that records what it was given.

What is checked: a run whose tensors are all in the config's dicts fills kiln_batch_args as
the Python path does and calls kiln_plan_run once, on torch's current stream, holding the
context; every case the Python path must see (a tensor not seen yet, a shape seen with other
rows, misaligned pointers, scales, another device, a closed context or plan, an unbound
Runner, a return_lse that is not a bool, a scale that is not a float > 0) returns
NotImplemented before any call; float scales set the parameters as _Config.set_params does; a failed
status raises through fail() with the context still held; errors that are not "not a tensor"
propagate; close() waits for a run in flight. The wrappers' use of the Runner on real tensors
is the GPU suite's (python/tests/test_batch_torch.py and the others run with it, and
tools/scripts/device_tests.sh runs them once more with KILN_HOT=0).

Skips when the extension is not built (no Python headers where `make` ran); tests/test_python.c
makes this module required when the build has it.
"""

import array
import ctypes
import gc
import os
import sys
import threading
import unittest

_SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
if os.environ.get("KILN_TEST_INSTALLED") != "1" and os.path.isdir(os.path.join(_SRC, "kiln")):
    sys.path.insert(0, _SRC)

import kiln  # noqa: E402
from kiln import _hot, _lib  # noqa: E402
from kiln._wrapper import _meta, _State  # noqa: E402

H, D = 4, 64
SM_SCALE = 0.125


class T:
    """What the Runner reads of a tensor: shape, stride(), dtype, device, data_ptr(), mul_()."""

    def __init__(self, shape, ptr, dtype="bf16", device="dev0", stride=None):
        self.shape = tuple(shape)
        if stride is None:
            stride, n = [], 1
            for s in reversed(self.shape):
                stride.insert(0, n)
                n *= s
        self._stride = tuple(stride)
        self.dtype, self.device, self._ptr = dtype, device, ptr
        self.muls = []

    def stride(self):
        return self._stride

    def data_ptr(self):
        return self._ptr

    def mul_(self, x):
        self.muls.append(x)
        return self


class Broken(T):
    def data_ptr(self):
        raise RuntimeError("the device is gone")


class Cfg:
    scaled = False


class PlanStub:
    def __init__(self, handle):
        self._handle = handle


RUN_T = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


class Failed(Exception):
    pass


class Harness:
    """A Runner's surroundings: a context, stand-ins for the plan, config and kiln_plan_run."""

    def setUp(self):
        self.ctx = kiln.Context(no_device=True, no_cache=True)
        self.addCleanup(self.ctx.close)
        self.plan = PlanStub(0x2000)
        self.cfg = Cfg()
        self.seen_q, self.seen_kv, self.seen_out, self.seen_lse, self.out_info = {}, {}, {}, {}, {}
        self.args = _lib.kiln_batch_args()
        self.calls = []
        self.status = 0
        self.during = None  # called inside kiln_plan_run's stand-in

        def run(plan, args, stream):
            a = ctypes.cast(args, ctypes.POINTER(_lib.kiln_batch_args)).contents
            self.calls.append((plan, stream, a.q, a.k, a.v, a.o, a.lse, a.q_stride_n,
                               a.q_stride_h, a.o_stride_n, a.o_stride_h, a.k_stride_page,
                               a.k_stride_n, a.k_stride_h, a.v_stride_page, a.v_stride_n,
                               a.v_stride_h, len(self.ctx._calls)))
            if self.during:
                self.during()
            return self.status

        self.fn = RUN_T(run)
        self.made = []
        self.device = 0
        self.failed = []

    def empty(self, *sizes, dtype, device):  # torch.empty(a, b, c, dtype=, device=)
        t = T(sizes, 0x90000 + 0x1000 * len(self.made), dtype, device)
        self.made.append(t)
        return t

    def on_fail(self, status, handle):
        self.failed.append((status, handle, len(self.ctx._calls)))
        raise Failed(f"status {status}")

    def empty_like(self, t):
        u = T(t.shape, 0x70000 + 0x1000 * len(self.made), t.dtype, t.device)
        self.made.append(u)
        return u

    def runner(self, total_qo=2, total_kv=-1, scratch=0x5550, graph=0, has_lse=1, fp8=0,
               like=None):
        r = _hot.module().Runner(
            self.ctx, self.plan, self.cfg, self.seen_q, self.seen_kv, self.seen_out,
            self.seen_lse, self.out_info, self.empty, like, {"dtype": "o-dtype", "device": "dev0"},
            {"dtype": "f32", "device": "dev0"}, lambda: self.device, lambda index: 0xabc0 + index,
            0, self.on_fail, ctypes.addressof(self.args),
            ctypes.cast(self.fn, ctypes.c_void_p).value, SM_SCALE, H, D, graph, has_lse, fp8)
        return r.bind(total_qo, total_kv, scratch)

    def tensors(self, rows=2):
        """q, (k, v) known to the config, with distinct strides so that a mix-up shows."""
        q = T((rows, H, D), 0x10000, stride=(H * D + 64, D, 1))
        k = T((7, 16, 2, D), 0x20000)
        v = T((7, 16, 2, D), 0x30000, stride=(2 * 16 * 2 * D, 2 * D, D, 1))
        self.seen_q[_meta(q)] = (rows, H * D + 64, D)
        self.seen_kv[(_meta(k), _meta(v))] = (2048, 128, 64, 4096, 256, 128, None)
        self.out_info[rows] = (rows, H * D, D)
        return q, (k, v)



@unittest.skipIf(_hot.module() is None, f"the C Runner is not built: {_hot.status()}")
class TestRunner(Harness, unittest.TestCase):
    def test_a_known_run_fills_the_args_and_calls_once(self):
        r = self.runner()
        q, kv = self.tensors()
        o = r(q, kv, None, None, False)
        self.assertIs(o, self.made[0])
        self.assertEqual(o.shape, (2, H, D))
        self.assertEqual(o.dtype, "o-dtype")
        self.assertEqual(self.calls, [(0x2000, 0xabc0, 0x10000, 0x20000, 0x30000, o.data_ptr(),
                                       0x5550, H * D + 64, D, H * D, D, 2048, 128, 64, 4096,
                                       256, 128, 1)])
        self.assertEqual(len(self.ctx._calls), 0)
        self.assertEqual(o.muls, [])

    def test_o_like_a_dense_q(self):
        # o's dtype is q's: a dense q of the plain tensor type gives o by empty_like(q)
        r = self.runner(like=(self.empty_like, T))
        q, kv = self.tensors()  # q's rows are padded (stride H * D + 64): torch.empty
        o = r(q, kv, None, None, False)
        self.assertEqual((o.dtype, o.data_ptr()), ("o-dtype", 0x90000))
        dense = T((2, H, D), 0x10000)
        self.seen_q[_meta(dense)] = (2, H * D, D)
        o = r(dense, kv, None, None, False)
        self.assertEqual((o.shape, o.dtype, o.data_ptr()), ((2, H, D), "bf16", 0x71000))
        self.assertEqual(self.calls[-1][5], 0x71000)

        class Sub(T):
            pass

        sub = Sub((2, H, D), 0x10000)  # a subclass: torch.empty, as the Python path
        self.seen_q[_meta(sub)] = (2, H * D, D)
        self.assertEqual(r(sub, kv, None, None, False).dtype, "o-dtype")

    def test_out_and_lse_given(self):
        r = self.runner()
        q, kv = self.tensors()
        out = T((2, H, D), 0x40000)
        lse = T((2, H), 0x50000, dtype="f32")
        self.seen_out[_meta(out)] = (2, 999, 7)
        self.seen_lse[_meta(lse)] = 2
        self.assertIs(r(q, kv, out, lse, False), out)
        call = self.calls[-1]
        self.assertEqual((call[5], call[6], call[9], call[10]), (0x40000, 0x50000, 999, 7))
        self.assertEqual(lse.muls, [])  # the kernel writes the LSE's base (params.lse_base2)
        o, lse2 = r(q, kv, out, lse, True)
        self.assertEqual((o, lse2), (out, lse))
        self.assertEqual(self.made, [])

    def test_return_lse_allocates_it(self):
        r = self.runner()
        q, kv = self.tensors()
        o, lse = r(q, kv, None, None, True)
        self.assertEqual((lse.shape, lse.dtype), ((2, H), "f32"))
        self.assertEqual(self.calls[-1][6], lse.data_ptr())
        self.assertEqual(lse.muls, [])  # no pass after the kernel: it wrote the base asked for

    def test_scales(self):
        params = self.args.params
        params.sm_scale = SM_SCALE
        q, kv = self.tensors()
        r = self.runner()
        o = r(q, kv, None, None, False, 2.0, 3.0, 0.5)  # 16-bit KV: FlashInfer's meaning
        self.assertEqual((params.sm_scale, params.k_scale, params.v_scale), (0.75, 0.0, 0.5))
        self.assertEqual(o.muls, [])  # the kernel multiplies o by v_scale: no pass after it
        self.assertIs(self.cfg.scaled, True)
        o = r(q, kv, None, None, False)  # the next run without scales resets them
        self.assertEqual(params.sm_scale, SM_SCALE)
        self.assertIs(self.cfg.scaled, False)
        self.assertEqual(o.muls, [])
        r8 = self.runner(fp8=1)
        o = r8(q, kv, None, None, False, None, 3.0, 0.5)  # fp8 KV: dequantised in the kernel
        self.assertEqual((params.sm_scale, params.k_scale, params.v_scale), (SM_SCALE, 3.0, 0.5))
        self.assertEqual(o.muls, [])
        r8(q, kv, None, None, False, 1.0, 1.0, 1.0)
        self.assertEqual((params.sm_scale, params.k_scale, params.v_scale), (SM_SCALE, 1.0, 1.0))
        self.assertIs(self.cfg.scaled, False)
        self.assertEqual(len(self.calls), 4)
        for bad in (0.0, -1.0, float("nan"), float("inf"), 2, True, "2", T((1,), 0x10)):
            with self.subTest(scale=bad):  # the Python path reads or refuses these
                self.assertIs(r(q, kv, None, None, False, None, bad, None), NotImplemented)
        self.assertEqual(len(self.calls), 4)

    def test_one_paged_tensor_puts_v_at_its_offset(self):
        r = self.runner()
        q, _ = self.tensors()
        kv = T((7, 2, 16, 2, D), 0x60000)
        self.seen_kv[_meta(kv)] = (4096, 128, 64, 4096, 128, 64, 2048 * 2)
        r(q, kv, None, None, False)
        self.assertEqual(self.calls[-1][3:5], (0x60000, 0x60000 + 4096))

    def test_what_the_python_path_must_see(self):
        r = self.runner(has_lse=0, scratch=0)
        q, kv = self.tensors()
        new_q = T((2, H, D), 0x10000, stride=(H * D, D, 1))
        out_rows = T((3, H, D), 0x40000)
        self.seen_out[_meta(out_rows)] = (3, H * D, D)
        odd = T((2, H, D), 0x10008, stride=(H * D + 64, D, 1))
        self.seen_q[_meta(odd)] = (2, H * D + 64, D)
        unseen_lse = T((2, H), 0x50000, dtype="f32")
        lse_rows = T((3, H), 0x50000, dtype="f32")
        self.seen_lse[_meta(lse_rows)] = 3
        cases = {
            "a q not seen": (new_q, kv, None, None, False),
            "q not a tensor": ([1, 2], kv, None, None, False),
            "kv as a list": (q, list(kv), None, None, False),
            "kv not seen": (q, (kv[1], kv[0]), None, None, False),
            "an out of other rows": (q, kv, out_rows, None, False),
            "an out not seen": (q, kv, T((2, H, D), 0x40000, dtype="f16"), None, False),
            "an lse not seen": (q, kv, None, unseen_lse, False),
            "an lse of other rows": (q, kv, None, lse_rows, False),
            "return_lse without an LSE kernel": (q, kv, None, None, True),
            "return_lse not a bool": (q, kv, None, None, 1),
            "a misaligned q": (odd, kv, None, None, False),
        }
        for name, call in cases.items():
            with self.subTest(name):
                self.assertIs(r(*call), NotImplemented)
        self.assertEqual(self.calls, [])
        self.assertEqual(len(self.ctx._calls), 0)

    def test_rows_the_plan_does_not_have(self):
        q, kv = self.tensors(rows=3)
        self.assertIs(self.runner(total_qo=2)(q, kv, None, None, False), NotImplemented)
        self.assertIs(self.runner(total_qo=4)(q, kv, None, None, False), NotImplemented)
        # CUDA-graph mode: q may hold more rows than this plan's batch (the buffer's bound)
        self.assertIsNot(self.runner(total_qo=2, graph=1)(q, kv, None, None, False),
                         NotImplemented)
        self.assertIs(self.runner(total_qo=4, graph=1)(q, kv, None, None, False),
                      NotImplemented)

    def test_ragged_rows_short(self):
        q, kv = self.tensors()
        self.seen_kv[(_meta(kv[0]), _meta(kv[1]))] = (0, 128, 64, 0, 128, 64, None, 100)
        self.assertIs(self.runner(total_kv=101)(q, kv, None, None, False), NotImplemented)
        self.assertIsNot(self.runner(total_kv=100)(q, kv, None, None, False), NotImplemented)
        self.assertEqual(len(self.calls), 1)

    def test_state_the_python_path_handles(self):
        q, kv = self.tensors()
        r = self.runner()
        self.device = 1  # another current device: the Python path switches around the call
        self.assertIs(r(q, kv, None, None, False), NotImplemented)
        self.device = 0
        self.plan._handle = None  # a destroyed plan: the Python path raises
        self.assertIs(r(q, kv, None, None, False), NotImplemented)
        self.assertEqual(len(self.ctx._calls), 0)
        self.plan._handle = 0x2000
        unbound = _hot.module().Runner(  # the same dicts: only bind() is missing
            self.ctx, self.plan, self.cfg, self.seen_q, self.seen_kv, self.seen_out,
            self.seen_lse, self.out_info, self.empty, None, {}, {}, lambda: 0, lambda i: 0, 0,
            self.on_fail, ctypes.addressof(self.args),
            ctypes.cast(self.fn, ctypes.c_void_p).value, SM_SCALE, H, D, 0, 1, 0)
        self.assertIs(unbound(q, kv, None, None, False), NotImplemented)
        q0 = T((0, H, D), 0x10000)  # rows an unbound Runner's zeroed batch would match
        self.seen_q[_meta(q0)] = (0, H * D, D)
        self.out_info[0] = (0, H * D, D)
        self.assertIs(unbound(q0, kv, None, None, False), NotImplemented)
        self.ctx._closing = True  # close() begun (it waits for calls in flight): counted out again
        self.assertIs(r(q, kv, None, None, False), NotImplemented)
        self.assertEqual(len(self.ctx._calls), 0)
        self.ctx._closing = False
        self.ctx.close()  # a closed context: the Python path raises
        self.assertIs(r(q, kv, None, None, False), NotImplemented)
        self.assertEqual(self.calls, [])

    def test_a_failed_status_raises_inside_the_hold(self):
        r = self.runner()
        q, kv = self.tensors()
        self.status = 3
        with self.assertRaises(Failed):
            r(q, kv, None, None, False)
        handle = self.ctx._handle
        self.assertEqual(self.failed, [(3, handle, 1)])
        self.assertEqual(len(self.ctx._calls), 0)

    def test_other_errors_propagate(self):
        r = self.runner()
        q, kv = self.tensors()
        bad = Broken((2, H, D), 0, stride=(H * D + 64, D, 1))
        self.seen_q[_meta(bad)] = (2, H * D + 64, D)
        with self.assertRaisesRegex(RuntimeError, "the device is gone"):
            r(bad, kv, None, None, False)
        with self.assertRaises(TypeError):
            r(q, kv, None, None)  # five to eight arguments
        with self.assertRaises(TypeError):
            r(q, kv, None, None, False, None, None, None, None)
        with self.assertRaises(TypeError):
            r(q, kv, None, None, False, out=None)
        self.assertEqual(self.calls, [])

    def test_no_reference_is_leaked_or_lost(self):
        r = self.runner()
        q, kv = self.tensors()
        out = T((2, H, D), 0x40000)
        lse = T((2, H), 0x50000, dtype="f32")
        self.seen_out[_meta(out)] = (2, H * D, D)
        self.seen_lse[_meta(lse)] = 2
        new_q = T((2, H, D), 0x10000, stride=(H * D, D, 1))
        watched = [q, kv, kv[0], out, lse, new_q, r, self.cfg, self.ctx,
                   self.seen_q[_meta(q)], self.seen_kv[(_meta(kv[0]), _meta(kv[1]))],
                   self.seen_out[_meta(out)], self.out_info[2]]
        calls = [lambda: r(q, kv, None, None, False), lambda: r(q, kv, out, lse, True, 2.0),
                 lambda: r(q, kv, None, None, True), lambda: r(new_q, kv, None, None, False)]
        for call in calls:  # once first: whatever a first call creates to keep
            call()
        gc.collect()  # earlier tests' garbage may hold the constant tuples tensors() stores
        before = [sys.getrefcount(x) for x in watched]
        for _ in range(200):
            for call in calls:
                call()
        self.status = 3
        for _ in range(50):
            with self.assertRaises(Failed):
                r(q, kv, out, None, False)
        gc.collect()
        self.assertEqual([sys.getrefcount(x) for x in watched], before)
        self.status = 0
        r(q, kv, None, None, True)  # what the call made is the caller's alone
        a, b = self.made[-2:]
        self.assertEqual((sys.getrefcount(a), sys.getrefcount(b)), (3, 3))  # made, a, argument

    def test_close_waits_for_a_run_in_flight(self):
        r = self.runner()
        q, kv = self.tensors()
        inside, release = threading.Event(), threading.Event()
        order = []

        def hold_it():
            inside.set()
            release.wait(10)
            order.append("run returns")

        self.during = hold_it
        t = threading.Thread(target=lambda: r(q, kv, None, None, False))
        t.start()
        self.assertTrue(inside.wait(10))
        closer = threading.Thread(target=lambda: (self.ctx.close(), order.append("closed")))
        closer.start()
        closer.join(0.3)
        self.assertTrue(closer.is_alive(), "close() returned while a run was in flight")
        release.set()
        t.join(10)
        closer.join(10)
        self.assertEqual(order, ["run returns", "closed"])
        self.assertEqual(len(self.ctx._calls), 0)


class HT:
    """What replan reads of an index tensor: dtype, is_cpu or device, shape, stride(),
    data_ptr() (host arrays: real memory, which replan copies)."""

    def __init__(self, values, dtype="i32", device="cpu", stride=1, ptr=None, n=None):
        self._buf = (ctypes.c_int * max(len(values), 1))(*values)
        self.shape = (len(values) if n is None else n,)
        self._stride = (stride,)
        self.dtype, self.device, self.is_cpu = dtype, device, device == "cpu"
        self._ptr = ctypes.addressof(self._buf) if ptr is None else ptr

    def stride(self):
        return self._stride

    def data_ptr(self):
        return self._ptr


SCHEDULE_T = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64,
                              ctypes.c_size_t, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p)
SCALARS = (32, 8, 128, 16, "NONE", -1, None, "bf16", None, None, None, 0.0883, None, None,
           True, None, None, None, False, 1, 0, True)


@unittest.skipIf(_hot.module() is None, f"the C Runner is not built: {_hot.status()}")
class TestReplan(Harness, unittest.TestCase):
    """replan(): the decode plan() of the armed config's next batch in C."""

    def setUp(self):
        super().setUp()
        self.scheds = []
        self.sched_status = 0

        def schedule(plan, shape, ws, ws_bytes, scratch, scratch_bytes, stream):
            s = ctypes.cast(shape, ctypes.POINTER(_lib.kiln_batch_shape)).contents
            B = s.batch
            self.scheds.append((plan, B, list(s.qo_indptr[:B + 1]) if s.qo_indptr else None,
                                list(s.kv_indptr[:B + 1]),
                                list(s.kv_last_page_len[:B]) if s.kv_last_page_len else None,
                                ws, ws_bytes, scratch, scratch_bytes, stream, len(self.ctx._calls)))
            return self.sched_status

        self.schedule = SCHEDULE_T(schedule)
        self.state = _State()
        self.state.batch = self.state.total_qo = 1
        self.state.kv_indptr, self.state.last, self.state.indices = [0, 1], [3], "old ids"
        self.state.forwarded = "memo"

    def armed(self, graph=0, scalars=SCALARS, sched_batch=8, sched_qo=8, lse_cap=8 * H,
              prefill=False, paged=True, few_group=0, q_tokens=0):
        r = self.runner(total_qo=1, graph=graph)
        r.arm(scalars, self.state, "dev0", "cpu", "i32", HT,
              ctypes.cast(self.schedule, ctypes.c_void_p).value, 0x7000, 4096, sched_batch,
              sched_qo, 0x8000, 1 << 20, lse_cap, prefill, paged, few_group, q_tokens)
        return r

    def batch(self, B=3):
        indptr = HT([0, 2, 2, 5][:B + 1])
        last = HT([16, 7, 1][:B])
        ids = HT(list(range(5)), device="dev0", ptr=0xd000)
        return indptr, ids, last

    def test_a_replan_schedules_and_updates_the_state(self):
        r = self.armed()
        indptr, ids, last = self.batch()
        self.assertIs(r.replan(None, indptr, ids, last, SCALARS), True)
        self.assertEqual(self.scheds, [(0x2000, 3, None, [0, 2, 2, 5], [16, 7, 1], 0x7000, 4096,
                                        0x8000, 1 << 20, 0xabc0, 1)])
        st = self.state
        self.assertEqual((st.batch, st.total_qo, st.indices, st.forwarded), (3, 3, ids, None))
        self.assertEqual((list(array.array("i", st.kv_indptr)), list(array.array("i", st.last))),
                         ([0, 2, 2, 5], [16, 7, 1]))
        self.assertEqual(self.args.kv_indices, 0xd000)
        self.assertEqual(len(self.ctx._calls), 0)
        indptr._buf[1] = 99  # the state holds copies
        self.assertEqual(list(array.array("i", st.kv_indptr)), [0, 2, 2, 5])
        # the run that follows takes the new batch's rows
        q, kv = self.tensors(rows=3)
        r(q, kv, None, None, False)
        self.assertEqual(len(self.calls), 1)
        # host arrays may also be array.array("i") (fast_decode_plan's last_page_len)
        self.assertIs(r.replan(None, array.array("i", [0, 4]), ids, array.array("i", [2]), SCALARS),
                      True)
        self.assertEqual(self.scheds[-1][1:5], (1, None, [0, 4], [2]))

    def test_equal_scalars_of_the_same_types_only(self):
        r = self.armed()
        same = tuple(x if not isinstance(x, str) else "".join(list(x)) for x in SCALARS)
        same = same[:11] + (float(repr(SCALARS[11])),) + same[12:]  # equal, other objects
        self.assertIs(r.replan(None, *self.batch(), same), True)
        for i, other in ((0, 32.0), (0, 33), (14, 1), (11, 0.0884), (21, 1), (7, "f16"),
                         (8, "bf16"), (6, 0.0)):
            changed = SCALARS[:i] + (other,) + SCALARS[i + 1:]
            self.assertIs(r.replan(None, *self.batch(), changed), False, (i, other))
        self.assertIs(r.replan(None, *self.batch(), SCALARS[:-1]), False)
        self.assertIs(r.replan(None, *self.batch(), list(SCALARS)), False)
        self.assertEqual(len(self.scheds), 1)

    def test_what_the_python_path_must_plan(self):
        r = self.armed()
        indptr, ids, last = self.batch()
        cases = [
            (HT([0, 2, 2, 5], dtype="i64"), ids, last),  # not int32
            (HT([0, 2, 2, 5], device="dev0"), ids, last),  # not on the host
            (HT([0, 2, 2, 5], stride=2), ids, last),  # not contiguous
            (array.array("l", [0, 2, 2, 5]), ids, last),  # another typecode
            ([0, 2, 2, 5], ids, last),  # a list
            (indptr, ids, HT([16, 7])),  # last_page_len of another batch
            (HT([1, 2, 2, 5]), ids, last),  # indptr[0] != 0
            (HT([0]), ids, HT([])),  # no request
            (HT([0, 0, 0, 0]), ids, last),  # no page: o = 0 without a launch
            (indptr, HT(list(range(4)), device="dev0"), last),  # fewer page ids than pages
            (indptr, HT(list(range(5)), device="dev1"), last),  # page ids on another device
            (indptr, HT(list(range(5)), device="dev0", dtype="i64"), last),
            (indptr, HT(list(range(5)), device="dev0", stride=2), last),
            (indptr, list(range(5)), last),
            (HT(list(range(10))), ids, HT([1] * 9)),  # more requests than the schedule holds
        ]
        for i, case in enumerate(cases):
            self.assertIs(r.replan(None, *case, SCALARS), False, i)
        self.assertEqual(self.scheds, [])
        self.assertEqual(self.state.indices, "old ids")
        small = self.armed(lse_cap=3 * H - 1)  # the LSE scratch holds fewer rows
        self.assertIs(small.replan(None, indptr, ids, last, SCALARS), False)
        self.assertIs(self.armed(sched_qo=2).replan(None, indptr, ids, last, SCALARS), False)
        self.assertEqual(self.scheds, [])

    def test_not_armed(self):
        indptr, ids, last = self.batch()
        r = self.runner()
        self.assertIs(r.replan(None, indptr, ids, last, SCALARS), False)  # never armed
        r = self.armed()
        r.bind(1, -1, 0x5550)  # a plan made elsewhere (the Python path) disarms it
        self.assertIs(r.replan(None, indptr, ids, last, SCALARS), False)
        self.assertIs(self.armed(graph=1).replan(None, indptr, ids, last, SCALARS), False)
        r = self.armed()
        self.plan._handle = None  # a destroyed plan: the Python path raises
        self.assertIs(r.replan(None, indptr, ids, last, SCALARS), False)
        self.plan._handle = 0x2000
        self.ctx.close()  # a closed context likewise
        self.assertIs(r.replan(None, indptr, ids, last, SCALARS), False)
        self.assertEqual(self.scheds, [])

    def test_a_failed_schedule_changes_nothing(self):
        r = self.armed()
        self.sched_status = 3  # the Python path plans again and raises the status's error
        self.assertIs(r.replan(None, *self.batch(), SCALARS), False)
        self.assertEqual(len(self.scheds), 1)
        self.assertEqual((self.state.batch, self.state.indices, self.state.forwarded),
                         (1, "old ids", "memo"))
        self.assertEqual((self.args.kv_indices, len(self.ctx._calls)), (0, 0))

    def test_a_paged_prefill(self):
        r = self.armed(prefill=True, sched_qo=20, lse_cap=20 * H)
        indptr, ids, last = self.batch()
        qo = HT([0, 4, 4, 9])
        self.assertIs(r.replan(qo, indptr, ids, last, SCALARS), True)
        self.assertEqual(self.scheds[-1][1:5], (3, [0, 4, 4, 9], [0, 2, 2, 5], [16, 7, 1]))
        st = self.state
        self.assertEqual((st.batch, st.total_qo, list(array.array("i", st.qo_indptr))),
                         (3, 9, [0, 4, 4, 9]))
        self.assertEqual(self.args.kv_indices, 0xd000)
        q, kv = self.tensors(rows=9)
        r(q, kv, None, None, False)  # the run takes the plan's rows
        self.assertEqual(len(self.calls), 1)
        for bad in [HT([0, 4, 9]), HT([1, 4, 4, 9]), HT([0, 0, 0, 0]), HT([0, 4, 4, 21]),
                    HT([0, 4, 4, 9], dtype="i64"), None]:
            self.assertIs(r.replan(bad, indptr, ids, last, SCALARS), False)
        self.assertIs(self.armed(prefill=True, sched_qo=20, lse_cap=8 * H).replan(
            qo, indptr, ids, last, SCALARS), False)  # 9 rows: more than the LSE scratch holds
        self.assertIs(r.replan(None, indptr, ids, last, SCALARS), False)  # a decode's arrays
        self.assertEqual(len(self.scheds), 1)

    def test_a_ragged_prefill(self):
        r = self.armed(prefill=True, paged=False, sched_qo=20, lse_cap=20 * H)
        qo, kv = HT([0, 3, 5]), HT([0, 30, 70])
        self.assertIs(r.replan(qo, kv, None, None, SCALARS), True)
        self.assertEqual(self.scheds[-1][1:5], (2, [0, 3, 5], [0, 30, 70], None))
        st = self.state
        self.assertEqual((st.batch, st.total_qo, st.total_kv, st.indices), (2, 5, 70, "old ids"))
        self.assertEqual(self.args.kv_indices, 0)
        self.assertIs(r.replan(qo, kv, *self.batch()[1:], SCALARS), False)  # page ids: paged
        self.assertIs(r.replan(qo, HT([0, 0, 0]), None, None, SCALARS), False)  # no key

    def test_the_few_token_choice(self):
        # q_tokens left to few_tokens: the plan's kernel takes requests of up to 4 rows
        r = self.armed(prefill=True, paged=False, sched_qo=64, lse_cap=64 * H, few_group=4,
                       q_tokens=4)
        kv = HT([0, 30, 70])
        for qo, ok in (([0, 3, 7], True), ([0, 4, 5], True), ([0, 5, 6], False),
                       ([0, 1, 3], False), ([0, 17, 18], False), ([0, 40, 41], False)):
            self.assertIs(r.replan(HT(qo), kv, None, None, SCALARS), ok, qo)
        r = self.armed(prefill=True, paged=False, sched_qo=64, lse_cap=64 * H, few_group=4,
                       q_tokens=0)  # the prefill families: more than 16 rows in a request
        for qo, ok in (([0, 17, 18], True), ([0, 3, 7], False), ([0, 40, 41], True)):
            self.assertIs(r.replan(HT(qo), kv, None, None, SCALARS), ok, qo)
        r = self.armed(prefill=True, paged=False, sched_qo=64, lse_cap=64 * H, few_group=3,
                       q_tokens=0)  # a group that does not divide 64: never few tokens
        self.assertIs(r.replan(HT([0, 3, 7]), kv, None, None, SCALARS), True)

    def test_the_few_token_choice_is_batch_few_tokens(self):
        # the C port against the Python one, on random batches: a plan armed with one batch's
        # choice takes another batch in C exactly when its choice is the same
        import random

        from kiln.batch import few_tokens
        rng = random.Random(7)
        kv = None
        for trial in range(300):
            G = rng.choice((1, 2, 3, 4, 5, 8, 16, 64))
            B = rng.randint(1, 9)
            def batch():
                qo = [0]
                for _ in range(B):
                    qo.append(qo[-1] + rng.choice((0, 1, 1, 2, 3, 4, 5, 8, 9, 16, 17, 40)))
                return qo
            first, second = batch(), batch()
            if second[-1] == 0:
                continue  # no row: never the C path (o = 0 without a launch)
            kv = HT(list(range(B + 1)))
            r = self.armed(prefill=True, paged=False, sched_batch=16, sched_qo=1 << 12,
                           lse_cap=(1 << 12) * H, few_group=G, q_tokens=few_tokens(first, G))
            want = few_tokens(second, G) == few_tokens(first, G)
            self.assertIs(r.replan(HT(second), kv, None, None, SCALARS), want,
                          (trial, G, first, second))

    def test_replan_keeps_references(self):
        r = self.armed()
        indptr, ids, last = self.batch()
        watched = [indptr, ids, last, SCALARS, self.state, r]
        r.replan(None, indptr, ids, last, SCALARS)
        gc.collect()
        before = [sys.getrefcount(x) for x in watched]
        for _ in range(200):
            r.replan(None, indptr, ids, last, SCALARS)
            r.replan(None, HT([0, 0]), ids, HT([1]), SCALARS)
        self.sched_status = 3
        for _ in range(50):
            r.replan(None, indptr, ids, last, SCALARS)
        gc.collect()
        # the state holds the last page ids, as the Python path's does
        self.assertEqual([sys.getrefcount(x) for x in watched], before)


class TestStatus(unittest.TestCase):
    def test_status_names_the_path(self):
        line = _hot.status()
        self.assertRegex(line, r"^(on: .*_kiln_hot\.abi3\.so|off.*)$")
        if os.environ.get("KILN_HOT") == "1":
            self.assertTrue(line.startswith("on: "), line)


if __name__ == "__main__":
    unittest.main()
