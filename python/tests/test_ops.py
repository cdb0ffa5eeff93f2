"""test_ops.py — kiln's torch.library operators (kiln.ops): schemas, fake implementations,
torch.compile tracing, and on a GPU, CUDA-graph capture through torch.compile.

Without torch the file skips. On the CPU the operators' CUDA kernels cannot run, so the test
registers CPU kernels of its own for them (plain torch math for the single-request functions
and the merges: a float reference; zeros of the planned dtype for the batch runs, whose plan
needs a GPU) and checks with torch.library.opcheck that schemas, mutations and the fake
(meta) implementations agree with those kernels, that torch.compile(fullgraph=True) traces the
operators (backend aot_eager, on CPU tensors; and torch.export on fake CUDA tensors), and the
plan-handle rules. On a CUDA GPU: FlashInfer's issue #541 case — a torch.library custom op
calling kiln.single_decode_with_kv_cache inside torch.compile(mode="reduce-overhead",
fullgraph=True) — against eager and a float64 reference, kiln.ops.single_decode the same way,
and the batch decode wrapper's run under reduce-overhead replaying after a re-plan.
"""

import math
import os
import sys
import unittest

_SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
if os.environ.get("KILN_TEST_INSTALLED") != "1" and os.path.isdir(os.path.join(_SRC, "kiln")):
    sys.path.insert(0, _SRC)

import kiln  # noqa: E402
from _reference import set_up_module, tear_down_module  # noqa: E402

try:
    import torch
    from kiln import ops
except ImportError:  # the whole file skips
    torch = ops = None

HAVE_TORCH = torch is not None
HAVE_GPU = HAVE_TORCH and torch.cuda.is_available()


def setUpModule():
    if not HAVE_TORCH:
        return
    _register_cpu_kernels()
    if HAVE_GPU:
        set_up_module("kiln-py-ops-")


def tearDownModule():
    tear_down_module()


# ---- the reference ---------------------------------------------------------------------------


def attend(q, k, v, *, causal=False, scale=None, dtype=None):
    """Reference attention in `dtype` (q's when None): q [L_Q, H, D], k, v [L_KV, H_KV, D]
    (NHD); causal bottom-right aligned. Returns (o [L_Q, H, D], natural-log lse [L_Q, H])."""
    dtype = dtype or torch.float32
    L_Q, H, D = q.shape
    L_KV, H_KV = k.shape[0], k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    kk = k.to(dtype).repeat_interleave(H // H_KV, dim=1)
    vv = v.to(dtype).repeat_interleave(H // H_KV, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.to(dtype), kk) * scale
    if causal:
        i = torch.arange(L_Q, device=q.device)[:, None]
        j = torch.arange(L_KV, device=q.device)[None, :]
        s = s.masked_fill(j > i + L_KV - L_Q, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [H, L_Q]
    o = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), vv)
    return o, lse.transpose(0, 1)


def _lse_out(lse, base):
    return lse * (1.0 / math.log(2.0)) if base == "2" else lse


def _lse_in(lse, base):
    return lse * math.log(2.0) if base == "2" else lse


def _merge(v_a, s_a, v_b, s_b, base):
    la, lb = _lse_in(s_a, base), _lse_in(s_b, base)
    m = torch.logaddexp(la, lb)
    wa, wb = torch.exp(la - m)[..., None], torch.exp(lb - m)[..., None]
    v = (v_a.float() * wa + v_b.float() * wb).to(v_a.dtype)
    return v, _lse_out(m, base)


def _register_cpu_kernels():
    """CPU kernels for the operators (the C layer needs CUDA): see the file comment."""

    def decode(return_lse, q, k, v, *args):
        base = args[-1]
        o, lse = attend(q[None], k, v, scale=args[4])
        o, lse = o[0].to(q.dtype).contiguous(), _lse_out(lse[0], base).contiguous()
        return (o, lse) if return_lse else o

    def prefill(return_lse, q, k, v, mask, packed, causal, layout, pe, scale, wl, cap, o_dtype,
                *rest):
        o, lse = attend(q, k, v, causal=causal, scale=scale)
        o, lse = o.to(o_dtype or q.dtype).contiguous(), _lse_out(lse, rest[-1]).contiguous()
        return (o, lse) if return_lse else o

    def run(return_lse, handle, q, *rest):
        h = ops._handles[handle]
        o = torch.zeros(q.shape, dtype=h.o_dtype)
        return (o, torch.zeros(q.shape[:2])) if return_lse else o

    for name, fn in (("single_decode", decode), ("single_prefill", prefill),
                     ("batch_decode_run", run), ("batch_prefill_paged_run", run),
                     ("batch_prefill_ragged_run", run)):
        for suffix, lse in (("", False), ("_lse", True)):
            torch.library.register_kernel(f"kiln::{name}{suffix}", "cpu", ops._bind(fn, lse))
    torch.library.register_kernel("kiln::cascade_run", "cpu", ops._bind(run, False))
    torch.library.register_kernel("kiln::merge_state", "cpu", _merge)

    def merge_states(v, s, base):
        acc_v, acc_s = v[:, 0], s[:, 0]
        for i in range(1, v.shape[1]):
            acc_v, acc_s = _merge(acc_v, acc_s, v[:, i], s[:, i], base)
        return acc_v.clone(), acc_s.clone()

    def merge_in_place(v, s, v_other, s_other, mask, base):
        nv, ns = _merge(v, s, v_other, s_other, base)
        if mask is not None:
            keep = ~mask.bool()
            nv[keep], ns[keep] = v[keep], s[keep]
        v.copy_(nv)
        s.copy_(ns)

    torch.library.register_kernel("kiln::merge_states", "cpu", merge_states)
    torch.library.register_kernel("kiln::merge_state_in_place", "cpu", merge_in_place)


class _FakeVariant:
    def __init__(self, out_dtype, lse):
        self.out_dtype, self.lse = out_dtype, lse


class _StandIn:
    """A planned wrapper as the CPU tests see it: ops reads variant.out_dtype / .lse."""

    def __init__(self, out_dtype="bf16", lse=True):
        self.variant = _FakeVariant(out_dtype, lse)


def _stand_in_handle(kind, out_dtype="bf16", lse=True):
    """A handle for a stand-in wrapper (plan_handle refuses non-kiln objects)."""
    import weakref

    w = _StandIn(out_dtype, lse)
    number = ops._next_handle[0]
    ops._next_handle[0] += 1
    ops._handles[number] = ops._Handle(weakref.ref(w), kind, ops._DTYPES[out_dtype], lse)
    return number, w


def _randn(*shape, dtype=None, device="cpu"):
    return torch.randn(*shape, dtype=dtype or torch.bfloat16, device=device)


# ---- CPU: schemas, fakes, tracing ----------------------------------------------------------


@unittest.skipUnless(HAVE_TORCH, "torch is not installed")
class TestOpsCPU(unittest.TestCase):
    def test_opcheck_single(self):
        q, k, v = _randn(8, 64), _randn(20, 2, 64), _randn(20, 2, 64)
        for lse in (False, True):
            name = "single_decode_lse" if lse else "single_decode"
            torch.library.opcheck(getattr(torch.ops.kiln, name).default,
                                  (q, k, v, "NHD", "NONE", -1, None, 0.1, None, None, None,
                                   None, None, None, "2"))
        qp = _randn(5, 8, 64)
        for lse in (False, True):
            name = "single_prefill_lse" if lse else "single_prefill"
            torch.library.opcheck(getattr(torch.ops.kiln, name).default,
                                  (qp, k, v, None, None, True, "NHD", "NONE", None, -1, None,
                                   torch.float16, None, None, None, "e"))

    def test_opcheck_merges(self):
        n, H, D = 6, 4, 64
        v_a, v_b = _randn(n, H, D), _randn(n, H, D)
        s_a, s_b = torch.randn(n, H), torch.randn(n, H)
        torch.library.opcheck(torch.ops.kiln.merge_state.default, (v_a, s_a, v_b, s_b, "2"))
        torch.library.opcheck(torch.ops.kiln.merge_states.default,
                              (_randn(n, 3, H, D), torch.randn(n, 3, H), "e"))
        mask = torch.tensor([1, 0, 1, 1, 0, 1], dtype=torch.bool)
        torch.library.opcheck(torch.ops.kiln.merge_state_in_place.default,
                              (v_a.clone(), s_a.clone(), v_b, s_b, mask, "2"))

    def test_opcheck_runs(self):
        q, k = _randn(4, 8, 64), _randn(10, 16, 2, 64)
        for kind, op in (("decode", "batch_decode_run"), ("paged", "batch_prefill_paged_run"),
                         ("ragged", "batch_prefill_ragged_run")):
            h, keep = _stand_in_handle(kind, "f16")
            for suffix in ("", "_lse"):
                torch.library.opcheck(getattr(torch.ops.kiln, op + suffix).default,
                                      (h, q, k, k, None, 2.0, None))
        h, keep = _stand_in_handle("cascade")
        torch.library.opcheck(torch.ops.kiln.cascade_run.default, (h, q, k, None))

    def test_fake_shapes(self):
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            q = torch.empty(8, 128, dtype=torch.bfloat16, device="cuda")
            k = torch.empty(33, 2, 128, dtype=torch.bfloat16, device="cuda")
            o, lse = ops.single_decode_with_kv_cache(q, k, k, return_lse=True)
            self.assertEqual((o.shape, o.dtype, o.device.type), (q.shape, q.dtype, "cuda"))
            self.assertEqual((tuple(lse.shape), lse.dtype), ((8,), torch.float32))
            qp = torch.empty(5, 8, 128, dtype=torch.float16, device="cuda")
            kp = torch.empty(9, 2, 128, dtype=torch.float16, device="cuda")
            o, lse = ops.single_prefill_with_kv_cache_return_lse(qp, kp, kp, causal=True,
                                                                 o_dtype=torch.bfloat16)
            self.assertEqual((tuple(o.shape), o.dtype), ((5, 8, 128), torch.bfloat16))
            self.assertEqual(tuple(lse.shape), (5, 8))
            h, keep = _stand_in_handle("decode", "f16", lse=False)
            o = ops.batch_decode_run(h, qp, (kp, kp))
            self.assertEqual((tuple(o.shape), o.dtype), ((5, 8, 128), torch.float16))
            with self.assertRaisesRegex(ValueError, "lse=False"):
                ops.batch_decode_run(h, qp, (kp, kp), return_lse=True)
            with self.assertRaisesRegex(ValueError, r"\[H, D\]"):
                ops.single_decode_with_kv_cache(qp, kp, kp)
            v, s = ops.merge_states(torch.empty(3, 4, 8, 64, device="cuda", dtype=torch.half),
                                    torch.empty(3, 4, 8, device="cuda"))
            self.assertEqual((tuple(v.shape), tuple(s.shape)), ((3, 8, 64), (3, 8)))

    def test_compile_fullgraph_cpu(self):
        """torch.compile(fullgraph=True) traces decode, prefill, a batch run and the merges
        into one graph (aot_eager), and its result is the eager one."""
        q, k, v = _randn(8, 64), _randn(20, 2, 64), _randn(20, 2, 64)
        qp = _randn(4, 8, 64)
        h, keep = _stand_in_handle("paged")

        def fn(q, k, v, qp):
            o1, s1 = ops.single_decode_with_kv_cache(q, k, v, return_lse=True, sm_scale=0.125)
            o2, s2 = ops.single_prefill_with_kv_cache(qp, k, v, causal=True, return_lse=True)
            o3 = ops.batch_prefill_paged_run(h, qp, (k[None], v[None]))
            m, ms = ops.merge_state(o2, s2, o2, s2)
            ops.merge_state_in_place(m, ms, o2, s2)
            return o1, s1, m, ms, o3

        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            from torch._dynamo.backends.common import aot_autograd

            return aot_autograd(fw_compiler=lambda g, _: g)(gm, example_inputs)

        got = torch.compile(fn, fullgraph=True, backend=backend)(q, k, v, qp)
        want = fn(q, k, v, qp)
        self.assertEqual(len(graphs), 1)
        targets = {str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"}
        for name in ("kiln.single_decode_lse", "kiln.single_prefill_lse",
                     "kiln.batch_prefill_paged_run", "kiln.merge_state",
                     "kiln.merge_state_in_place"):
            self.assertTrue(any(name in t for t in targets), f"{name} not in {targets}")
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)

    def test_export_on_fake_cuda(self):
        """torch.export traces the operators over fake CUDA tensors (no GPU needed)."""
        from torch._subclasses.fake_tensor import FakeTensorMode

        class Decode(torch.nn.Module):
            def forward(self, q, k, v):
                return ops.single_decode_with_kv_cache(q, k, v, kv_layout="HND",
                                                       logits_soft_cap=30.0)

        with FakeTensorMode():
            q = torch.empty(16, 64, dtype=torch.float16, device="cuda")
            k = torch.empty(4, 100, 64, dtype=torch.float16, device="cuda")
            ep = torch.export.export(Decode(), (q, k, k))
        nodes = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
        self.assertIn("kiln.single_decode.default", nodes)
        out = [n for n in ep.graph.nodes if n.op == "output"][0].args[0][0]
        self.assertEqual(tuple(out.meta["val"].shape), (16, 64))

    def test_handle_rules(self):
        with self.assertRaisesRegex(TypeError, "not a kiln batch or cascade wrapper"):
            ops.plan_handle(object())
        with self.assertRaisesRegex(ValueError, "not a live plan handle"):
            torch.ops.kiln.batch_decode_run(10 ** 9, _randn(2, 8, 64, device="meta"),
                                            _randn(1, 4, 2, 64, device="meta"), None, None,
                                            None, None)
        h, w = _stand_in_handle("ragged")
        q = _randn(2, 8, 64, device="meta")
        with self.assertRaisesRegex(ValueError, "is a ragged plan, not decode"):
            ops.batch_decode_run(h, q, (q, q))
        # the real path (a CUDA tensor on a CPU-only machine never gets there; call it directly)
        w.variant = _FakeVariant("f16", True)
        with self.assertRaisesRegex(RuntimeError, "planned again"):
            ops._live_wrapper(h, "ragged", "batch_prefill_ragged_run")
        del w
        with self.assertRaisesRegex(ValueError, "gone|not a live"):
            ops._live_wrapper(h, "ragged", "batch_prefill_ragged_run")
        with self.assertRaisesRegex(TypeError, "float or None"):
            ops.single_decode_with_kv_cache(q[0], q, q, sm_scale=torch.tensor(0.1))

    def test_plan_handle_needs_plan(self):
        ws = torch.empty(1024, dtype=torch.uint8)
        wrapper = kiln.BatchDecodeWithPagedKVCacheWrapper(ws)
        with self.assertRaisesRegex(RuntimeError, "call plan"):
            ops.plan_handle(wrapper)


# ---- GPU: CUDA graphs through torch.compile --------------------------------------------------


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


@unittest.skipUnless(HAVE_GPU, "no CUDA GPU (torch.cuda.is_available() is False)")
class TestOpsGPU(unittest.TestCase):
    def setUp(self):
        torch._dynamo.reset()
        torch.manual_seed(541)

    def _replays(self, fn, make_inputs, reference, steps=5, tol=2e-2):
        """fn compiled with reduce-overhead over fresh inputs each step (warm-up, record, then
        replays): each output matches eager fn and the float64 reference."""
        compiled = torch.compile(fn, mode="reduce-overhead", fullgraph=True)
        for step in range(steps):
            args = make_inputs()
            got = compiled(*args).clone()
            want = fn(*args)
            torch.cuda.synchronize()
            ref = reference(*args)
            self.assertLess(_rel(got, want), 1e-6, f"step {step}: compiled vs eager")
            self.assertLess(_rel(got, ref), tol, f"step {step}: compiled vs float64 reference")

    def test_issue_541_custom_op_over_single_decode(self):
        """FlashInfer's issue #541: a user's custom op calling single_decode_with_kv_cache, its
        first call of the variant inside torch.compile(mode="reduce-overhead")."""
        H, H_KV, D, L = 32, 8, 128, 1000

        @torch.library.custom_op("kiln_test::decode541", mutates_args=())
        def decode541(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return kiln.single_decode_with_kv_cache(q, k, v, logits_soft_cap=20.0)

        @decode541.register_fake
        def _(q, k, v):
            return torch.empty_like(q)

        def inputs():
            return (_randn(H, D, device="cuda"), _randn(L, H_KV, D, device="cuda"),
                    _randn(L, H_KV, D, device="cuda"))

        def reference(q, k, v):
            scale = 1.0 / math.sqrt(D)
            kk = k.double().repeat_interleave(H // H_KV, dim=1)
            vv = v.double().repeat_interleave(H // H_KV, dim=1)
            s = 20.0 * torch.tanh(torch.einsum("hd,khd->hk", q.double(), kk) * scale / 20.0)
            return torch.einsum("hk,khd->hd", torch.softmax(s, dim=-1), vv)

        self._replays(lambda q, k, v: decode541(q, k, v) * 2.0, inputs,
                      lambda q, k, v: reference(q, k, v) * 2.0)

    def test_ops_single_decode_and_prefill_reduce_overhead(self):
        H, H_KV, D, L = 16, 2, 64, 300

        def fn(q, k, v, qp):
            o, lse = ops.single_decode_with_kv_cache(q, k, v, return_lse=True)
            op = ops.single_prefill_with_kv_cache(qp, k, v, causal=True)
            return torch.cat([o.float().reshape(-1), op.float().reshape(-1)])

        def inputs():
            return (_randn(H, D, device="cuda"), _randn(L, H_KV, D, device="cuda"),
                    _randn(L, H_KV, D, device="cuda"), _randn(7, H, D, device="cuda"))

        def reference(q, k, v, qp):
            o, _ = attend(q[None], k, v, dtype=torch.float64)
            op, _ = attend(qp, k, v, causal=True, dtype=torch.float64)
            return torch.cat([o.reshape(-1), op.reshape(-1)])

        self._replays(fn, inputs, reference)

    def test_batch_decode_replays_after_replan(self):
        """The batch decode wrapper (use_cuda_graph=True) run through kiln.ops under
        reduce-overhead: recorded on one plan, replayed on later plans of the same shapes."""
        B, H, H_KV, D, P, pages = 4, 16, 4, 128, 16, 64
        dev = "cuda"
        ws = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
        indptr_buf = torch.empty(B + 1, dtype=torch.int32, device=dev)
        indices_buf = torch.empty(pages, dtype=torch.int32, device=dev)
        last_buf = torch.empty(B, dtype=torch.int32, device=dev)
        w = kiln.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=True,
                                                    paged_kv_indptr_buffer=indptr_buf,
                                                    paged_kv_indices_buffer=indices_buf,
                                                    paged_kv_last_page_len_buffer=last_buf)
        k_cache = _randn(pages, P, H_KV, D, device=dev)
        v_cache = _randn(pages, P, H_KV, D, device=dev)
        torch._dynamo.mark_static_address(k_cache)
        torch._dynamo.mark_static_address(v_cache)

        def plan(seed):
            g = torch.Generator().manual_seed(seed)
            per = torch.randint(1, pages // B + 1, (B,), generator=g).tolist()
            indices = torch.randperm(pages, generator=g)[:sum(per)].to(torch.int32)
            indptr = [0]
            for n in per:
                indptr.append(indptr[-1] + n)
            last = torch.randint(1, P + 1, (B,), generator=g).tolist()
            w.plan(indptr, indices.to(dev), last, H, H_KV, D, P, q_data_type=torch.bfloat16)
            return indptr, indices.tolist(), last

        def reference(q, indptr, indices, last):
            out = []
            for b in range(B):
                ids = indices[indptr[b]:indptr[b + 1]]
                n = (len(ids) - 1) * P + last[b]
                k = k_cache[ids].reshape(-1, H_KV, D)[:n]
                v = v_cache[ids].reshape(-1, H_KV, D)[:n]
                out.append(attend(q[b:b + 1], k, v, dtype=torch.float64)[0][0])
            return torch.stack(out)

        layout = plan(1)
        h = ops.plan_handle(w)
        fn = torch.compile(lambda q: ops.batch_decode_run(h, q, (k_cache, v_cache)),
                           mode="reduce-overhead", fullgraph=True)
        for step in range(6):
            if step >= 3:  # re-plan: new pages and lengths, same shapes and dtypes
                layout = plan(100 + step)
                self.assertEqual(ops.plan_handle(w), h)
            q = _randn(B, H, D, device=dev)
            got = fn(q).clone()
            want = w.run(q, (k_cache, v_cache))
            torch.cuda.synchronize()
            self.assertLess(_rel(got, want), 1e-6, f"step {step}: replay vs eager")
            self.assertLess(_rel(got, reference(q, *layout)), 2e-2, f"step {step}: vs float64")

    def test_first_call_inside_manual_capture(self):
        """A first call inside torch.cuda.graph either works or raises with the advice; after
        prepare() the capture works and replays."""
        H, H_KV, D, L = 8, 8, 256, 64
        q, k = _randn(H, D, device="cuda"), _randn(L, H_KV, D, device="cuda")
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                ops.single_decode_with_kv_cache(q, k, k, window_left=10)
        except RuntimeError as exc:  # ending the broken capture may raise on top of ours
            text = str(exc) + str(exc.__context__)
            self.assertIn("prepare", text)
        ops.prepare(ops.single_decode_with_kv_cache, q, k, k, window_left=10)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            o = ops.single_decode_with_kv_cache(q, k, k, window_left=10)
        q.copy_(_randn(H, D, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        want = ops.single_decode_with_kv_cache(q, k, k, window_left=10)
        self.assertLess(_rel(o, want), 1e-6)


if __name__ == "__main__":
    unittest.main()
