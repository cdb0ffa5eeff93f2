"""test_hostile.py — hostile arguments at every Python entry point, and Context.close() racing
other threads; no torch, no GPU.

ctypes would cut strings at a NUL, wrap integers to the C field's width, read "0" as a true
flag and fail deep inside on a wrong type; kiln/_check.py refuses all of that at the boundary.
Every case below is one row of a table: what is called, the exception it must raise, and a
fragment its message must hold (the argument's name). Each row becomes its own test method
(test_<table>_<row>), so `python3 -m unittest -v` lists them by name and a filter picks one.
The close tests compile real kernels (NVRTC, compile-only, no cache) from several threads.
"""

import gc
import os
import pathlib
import sys
import tempfile
import threading
import time
import unittest

_SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
if os.environ.get("KILN_TEST_INSTALLED") != "1" and os.path.isdir(os.path.join(_SRC, "kiln")):
    sys.path.insert(0, _SRC)

import kiln  # noqa: E402
from kiln import _check, batch  # noqa: E402
from kiln.plan import host_ints  # noqa: E402

SPEC = "op=decode head_dim=64"
NUL = "\0"


class Index:
    """An integer type that is not int (numpy's, torch's 0-dim tensors behave like this)."""

    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


class Workspace:
    """What the batch wrappers read of a workspace before they need torch."""

    device = None

    def data_ptr(self):
        return 0x10000

    def numel(self):
        return 1 << 20

    def element_size(self):
        return 1


def variant(**kw):
    return kiln.Variant(SPEC, **kw)


def context(**kw):
    kw.setdefault("no_device", True)
    kw.setdefault("no_cache", True)
    return kiln.Context(**kw)


def decode_plan(**kw):
    """BatchDecodeWithPagedKVCacheWrapper.plan with valid arguments, some replaced."""
    args = dict(indptr=[0, 1], indices=[0], last_page_len=[3], num_qo_heads=8, num_kv_heads=8,
                head_dim=64, page_size=16)
    args.update(kw)
    return kiln.BatchDecodeWithPagedKVCacheWrapper(Workspace()).plan(**args)


def ragged_plan(**kw):
    args = dict(qo_indptr=[0, 2], kv_indptr=[0, 5], num_qo_heads=8, num_kv_heads=8,
                head_dim_qk=64)
    args.update(kw)
    return kiln.BatchPrefillWithRaggedKVCacheWrapper(Workspace()).plan(**args)


def spec(**kw):
    args = dict(op="decode", kv="paged", num_qo_heads=8, num_kv_heads=8, head_dim=64)
    args.update(kw)
    return batch.batch_variant(**args)


_shared = {}


def kernel():
    """One compile-only kernel (sm_80) shared by the cases that need one."""
    if "k" not in _shared:
        _shared["ctx"] = context()
        _shared["k"] = _shared["ctx"].compile(SPEC, arch="sm_80")
    return _shared["k"]


# (name, call, exception, fragment of the message)
STRINGS = [
    ("spec_nul", lambda: kiln.Variant("op=decode" + NUL + " head_dim=128"), ValueError, "spec"),
    ("spec_bytes", lambda: kiln.Variant(b"op=decode"), TypeError, "spec"),
    ("logits_expr_nul", lambda: variant(logits_expr="logits" + NUL + "* 2"), ValueError,
     "logits_expr"),
    ("mask_expr_bytes", lambda: variant(mask_expr=b"kv_idx <= qo_idx"), TypeError, "mask_expr"),
    ("mask_expr_int", lambda: variant(mask_expr=1), TypeError, "mask_expr"),
    ("logits_expr_512_bytes", lambda: variant(logits_expr="x" * 512), ValueError, "511"),
    ("logits_expr_utf8_bytes_counted", lambda: variant(logits_expr="\u00e9" * 256), ValueError,
     "512 bytes"),
    ("logits_expr_lone_surrogate", lambda: variant(logits_expr="\udc80"), ValueError, "UTF-8"),
    ("param_name_nul", lambda: variant(params=[("cap" + NUL + "x", "f32")]), ValueError,
     "params[0] name"),
    ("param_name_32_bytes", lambda: variant(params=[("c" * 32, "f32")]), ValueError,
     "params[0] name"),
    ("param_name_bytes", lambda: variant(params=[(b"cap", "f32")]), TypeError, "params[0] name"),
    ("param_spec_form_nul", lambda: variant(params="a" + NUL + ":f32"), ValueError, "params[0]"),
    ("cache_dir_nul", lambda: context(no_cache=False, cache_dir="/tmp/x" + NUL + "y"), ValueError,
     "cache_dir"),
    ("cache_dir_bytes", lambda: context(no_cache=False, cache_dir=b"/tmp/kiln-b"), TypeError,
     "cache_dir"),
    ("cache_dir_empty", lambda: context(no_cache=False, cache_dir=""), ValueError, "cache_dir"),
    ("cache_dir_int", lambda: context(no_cache=False, cache_dir=3), TypeError, "cache_dir"),
    ("base_cache_dir_bytes_pathlike",
     lambda: context(base_cache_dir=type("P", (), {"__fspath__": lambda s: b"/x"})()),
     TypeError, "base_cache_dir"),
    ("record_path_nul", lambda: context(record_path="m" + NUL), ValueError, "record_path"),
    ("context_arch_nul", lambda: context(arch="sm_80" + NUL + "junk"), ValueError, "arch"),
    ("context_arch_bytes", lambda: context(arch=b"sm_80"), TypeError, "arch"),
    ("compile_arch_nul", lambda: kernel().context.compile(SPEC, arch="sm_80" + NUL + "x"),
     ValueError, "arch"),
    ("compile_arch_int", lambda: kernel().context.compile(SPEC, arch=80), TypeError, "arch"),
    ("compile_spec_nul", lambda: kernel().context.compile(SPEC + NUL + " group=4", arch="sm_80"),
     ValueError, "spec"),
    ("mode_bytes", lambda: context(mode=b"strict"), TypeError, "mode"),
    ("mode_wrong_case", lambda: context(mode="STRICT"), ValueError, "mode"),
]

INTS = [
    ("head_dim_wraps_2p32", lambda: variant(head_dim=2**32 + 128), ValueError, "head_dim"),
    ("group_wraps_2p64", lambda: variant(group=2**64 + 4), ValueError, "group"),
    ("head_dim_below_int_min", lambda: variant(head_dim=-(2**31) - 1), ValueError, "head_dim"),
    ("head_dim_bool", lambda: variant(head_dim=True), TypeError, "head_dim"),
    ("head_dim_float", lambda: variant(head_dim=128.0), TypeError, "head_dim"),
    ("head_dim_str", lambda: variant(head_dim="128"), TypeError, "head_dim"),
    ("max_cache_bytes_2p70", lambda: context(max_cache_bytes=2**70), ValueError,
     "max_cache_bytes"),
    ("max_cache_bytes_negative", lambda: context(max_cache_bytes=-1), ValueError,
     "max_cache_bytes"),
    ("max_cache_bytes_str", lambda: context(max_cache_bytes="1G"), TypeError, "max_cache_bytes"),
    ("device_2p32", lambda: context(device=2**32), ValueError, "device"),
    ("device_bool", lambda: context(device=True), TypeError, "device"),
    ("device_str", lambda: context(device="0"), TypeError, "device"),
    ("workspace_size_2p31", lambda: kernel().workspace_size(2**31, 1), ValueError,
     "num_qo_heads"),
    ("workspace_size_float", lambda: kernel().workspace_size(8, 100.0), TypeError, "kv_len"),
    ("plan_num_qo_heads_2p32", lambda: kiln.Plan(kernel(), 2**32 + 8), ValueError,
     "num_qo_heads"),
    ("plan_page_size_negative", lambda: kiln.Plan(kernel(), 8, page_size=-16), ValueError,
     "page_size"),
    ("plan_kernel_not_a_kernel", lambda: kiln.Plan("op=decode", 8), TypeError, "kernel"),
    ("host_ints_2p31", lambda: host_ints([0, 2**31], "kv_indptr"), ValueError, "kv_indptr[1]"),
    ("host_ints_str", lambda: host_ints([0, "3"], "kv_indptr"), TypeError, "kv_indptr[1]"),
    ("host_ints_bool", lambda: host_ints([0, True], "kv_indptr"), TypeError, "kv_indptr[1]"),
    ("host_ints_integral_float", lambda: host_ints([0, 4.0], "qo_indptr"), TypeError,
     "qo_indptr[1]"),
    ("batch_num_qo_heads_2p32", lambda: spec(num_qo_heads=2**32 + 8), ValueError,
     "num_qo_heads"),
    ("batch_head_dim_float", lambda: spec(head_dim=64.0), TypeError, "head_dim"),
    ("batch_window_left_str", lambda: spec(window_left="5"), TypeError, "window_left"),
    ("batch_window_left_2p40", lambda: spec(window_left=2**40), ValueError, "window_left"),
    ("decode_plan_page_size_2p31", lambda: decode_plan(page_size=2**31), ValueError,
     "page_size"),
    ("decode_plan_fixed_split_2p40", lambda: decode_plan(fixed_split_size=2**40), ValueError,
     "fixed_split_size"),
    ("decode_plan_fixed_split_times_page", lambda: decode_plan(fixed_split_size=2**27),
     ValueError, "fixed_split_size"),
    ("decode_plan_indptr_2p32", lambda: decode_plan(indptr=[0, 2**32 + 1]), ValueError,
     "indptr[1]"),
    ("ragged_plan_head_dim_vo_str", lambda: ragged_plan(head_dim_vo="64"), TypeError,
     "head_dim_vo"),
    ("stream_str", lambda: _check.stream("0x1234"), TypeError, "stream"),
    ("stream_2p64", lambda: _check.stream(2**64), ValueError, "stream"),
    ("raw_launch_stream_str", lambda: kernel().single_decode(kiln.AttnArgs(), "0"), TypeError,
     "stream"),
    ("alibi_slopes_zero_heads", lambda: kiln.alibi_slopes(0), ValueError, "num_heads"),
    ("single_decode_window_2p40",
     lambda: kiln.single_decode_with_kv_cache(None, None, None, window_left=2**40), ValueError,
     "window_left"),
    ("attn_args_heads_2p32", lambda: kiln.AttnArgs(num_qo_heads=2**32 + 8), ValueError,
     "AttnArgs.num_qo_heads"),
    ("attn_args_pointer_negative", lambda: setattr(kiln.AttnArgs(), "q", -16), ValueError,
     "AttnArgs.q"),
    ("batch_args_workspace_bytes_2p64", lambda: kiln.BatchArgs(workspace_bytes=2**64),
     ValueError, "BatchArgs.workspace_bytes"),
    ("merge_args_rows_bool", lambda: kiln.MergeArgs(rows=True), TypeError, "MergeArgs.rows"),
    ("status_str_2p32", lambda: kiln.status_str(2**32 + 1), ValueError, "status"),
    ("cascade_levels_str", lambda: kiln.MultiLevelCascadeAttentionWrapper("2", Workspace()),
     TypeError, "num_levels"),
]


FLAGS = [
    ("variant_lse_str_zero", lambda: variant(lse="0"), TypeError, "lse"),
    ("variant_window_str_false", lambda: variant(window="false"), TypeError, "window"),
    ("variant_rope_two", lambda: variant(rope=2), ValueError, "rope"),
    ("variant_lse_none", lambda: variant(lse=None), TypeError, "lse"),
    ("context_no_device_str", lambda: kiln.Context(no_cache=True, no_device="false"), TypeError,
     "no_device"),
    ("context_no_cache_str", lambda: context(no_cache="0"), TypeError, "no_cache"),
    ("batch_causal_str", lambda: spec(op="prefill", causal="False"), TypeError, "causal"),
    ("batch_lse_str", lambda: spec(lse="no"), TypeError, "lse"),
    ("wrapper_use_cuda_graph_str",
     lambda: kiln.BatchDecodeWithPagedKVCacheWrapper(Workspace(), use_cuda_graph="False"),
     TypeError, "use_cuda_graph"),
    ("decode_plan_disable_split_kv_str", lambda: decode_plan(disable_split_kv="yes"), TypeError,
     "disable_split_kv"),
    ("ragged_plan_causal_none", lambda: ragged_plan(causal=None), TypeError, "causal"),
    ("single_prefill_causal_str",
     lambda: kiln.single_prefill_with_kv_cache(None, None, None, causal="false"), TypeError,
     "causal"),
    ("single_decode_return_lse_str",
     lambda: kiln.single_decode_with_kv_cache(None, None, None, return_lse="True"), TypeError,
     "return_lse"),
    ("plan_no_split_two", lambda: kiln.Plan(kernel(), 8, no_split=2), ValueError, "no_split"),
]

TYPES = [
    ("kv_layout_bytes", lambda: kiln.BatchDecodeWithPagedKVCacheWrapper(Workspace(), b"NHD"),
     TypeError, "kv_layout"),
    ("kv_layout_none", lambda: kiln.BatchDecodeWithPagedKVCacheWrapper(Workspace(), None),
     TypeError, "kv_layout"),
    ("pos_encoding_mode_int", lambda: spec(pos_encoding_mode=1), TypeError,
     "pos_encoding_mode"),
    ("lse_base_int", lambda: kiln.BatchDecodeWithPagedKVCacheWrapper(Workspace(), lse_base=2),
     TypeError, "lse_base"),
    ("q_data_type_bytes", lambda: spec(q_data_type=b"float16"), TypeError, "q_data_type"),
    ("kv_data_type_int", lambda: spec(kv_data_type=16), TypeError, "kv_data_type"),
    ("logits_soft_cap_str", lambda: spec(logits_soft_cap="30"), TypeError, "logits_soft_cap"),
    ("sm_scale_bool", lambda: decode_plan(sm_scale=True), TypeError, "sm_scale"),
    ("sm_scale_nan", lambda: decode_plan(sm_scale=float("nan")), ValueError, "sm_scale"),
    ("rope_theta_str", lambda: decode_plan(pos_encoding_mode="ROPE_LLAMA", rope_theta="1e4"),
     TypeError, "rope_theta"),
    ("wrapper_context_str",
     lambda: kiln.BatchDecodeWithPagedKVCacheWrapper(Workspace(), context="default"),
     TypeError, "context"),
    ("merge_state_lse_base_bytes",
     lambda: kiln.merge_state(None, None, None, None, lse_base=b"2"), TypeError, "lse_base"),
    ("merge_states_context_int", lambda: kiln.merge_states(None, None, context=1), TypeError,
     "context"),
    ("merge_in_place_lse_base_10",
     lambda: kiln.merge_state_in_place(None, None, None, None, lse_base="10"), ValueError,
     "lse_base"),
    ("variant_op_bytes", lambda: kiln.Variant(op=b"decode"), TypeError, "op"),
    ("variant_mask_none", lambda: variant(mask=None), TypeError, "mask"),
    ("variant_params_bytes", lambda: variant(params=b"a:f32"), TypeError, "params"),
    ("variant_params_not_pairs", lambda: variant(params=[("a",)]), TypeError, "params[0]"),
    ("compile_not_a_spec", lambda: kernel().context.compile(42, arch="sm_80"), TypeError,
     "spec_or_variant"),
    ("raw_launch_args_dict", lambda: kernel().single_decode({}), TypeError, "args"),
    ("set_default_context_str", lambda: kiln.set_default_context("ctx"), TypeError, "ctx"),
    ("default_context_bool", lambda: kiln.default_context(True), TypeError, "device"),
    ("params_sm_scale_str", lambda: kiln.Params(sm_scale="0.5"), TypeError, "Params.sm_scale"),
    ("single_decode_q_scale_str",
     lambda: kiln.single_decode_with_kv_cache(None, None, None, q_scale="2"), TypeError,
     "q_scale"),
    ("cascade_plan_arrays_int",
     lambda: kiln.MultiLevelCascadeAttentionWrapper(2, Workspace()).plan(
         7, [[0, 1]] * 2, [[0]] * 2, [[1]] * 2, 8, 8, 64, 16), TypeError, "qo_indptr_arr"),
    ("cascade_plan_causal_str",
     lambda: kiln.MultiLevelCascadeAttentionWrapper(2, Workspace()).plan(
         [[0, 1]] * 2, [[0, 1]] * 2, [[0]] * 2, [[1]] * 2, 8, 8, 64, 16, causal="no"),
     TypeError, "causal"),
    ("single_decode_kv_layout_int",
     lambda: kiln.single_decode_with_kv_cache(None, None, None, kv_layout=0), TypeError,
     "kv_layout"),
]

TABLES = {"strings": STRINGS, "ints": INTS, "flags": FLAGS, "types": TYPES}


class TestHostile(unittest.TestCase):
    """One method per table row (added below)."""

    @classmethod
    def tearDownClass(cls):
        ctx = _shared.pop("ctx", None)
        _shared.clear()
        if ctx is not None:
            ctx.close()


def _case(call, exc, fragment):
    def test(self):
        with self.assertRaises(exc) as cm:
            call()
        self.assertNotIsInstance(cm.exception, (AttributeError, kiln.KilnLibraryError))
        self.assertIn(fragment, str(cm.exception))

    return test


for _table, _rows in TABLES.items():
    for _name, _call, _exc, _fragment in _rows:
        _method = f"test_{_table}_{_name}"
        assert not hasattr(TestHostile, _method), _method
        setattr(TestHostile, _method, _case(_call, _exc, _fragment))


class TestAccepted(unittest.TestCase):
    """What the rules let through, so the checks are not simply refusing everything."""

    def test_index_types_and_int_flags(self):
        v = variant(head_dim=Index(128), group=Index(4), lse=1, window=0)
        self.assertEqual((v.head_dim, v.group, v.lse, v.window), (128, 4, True, False))
        self.assertEqual(host_ints((0, Index(3)), "kv_indptr"), [0, 3])

    def test_pathlike_cache_dir_and_bytes_refused_creates_nothing(self):
        with tempfile.TemporaryDirectory(prefix="kiln-hostile-") as tmp:
            cache = pathlib.Path(tmp) / "cache"
            with kiln.Context(cache_dir=cache, no_device=True) as ctx:
                self.assertEqual(ctx.cache_path, str(cache / "kernels.db"))
            before = set(os.listdir(tmp))
            cwd = os.getcwd()
            os.chdir(tmp)  # a bytes path must not become a directory named "b'...'" here
            try:
                with self.assertRaises(TypeError):
                    kiln.Context(cache_dir=os.fsencode("x"), no_device=True)
            finally:
                os.chdir(cwd)
            self.assertEqual(set(os.listdir(tmp)), before)

    def test_public_structs_keep_the_c_layout(self):
        import ctypes

        from kiln import _lib

        for public, plain in ((kiln.AttnArgs, _lib.kiln_attn_args),
                              (kiln.Params, _lib.kiln_params),
                              (kiln.BatchArgs, _lib.kiln_batch_args),
                              (kiln.MergeArgs, _lib.kiln_merge_args)):
            self.assertTrue(issubclass(public, plain))
            self.assertEqual(ctypes.sizeof(public), ctypes.sizeof(plain))
        a = kiln.AttnArgs(q=2**63, num_qo_heads=Index(8), workspace_bytes=2**64 - 1)
        a.params.sm_scale = 0.25
        self.assertEqual((a.q, a.num_qo_heads, a.workspace_bytes), (2**63, 8, 2**64 - 1))
        self.assertEqual(a.params.sm_scale, 0.25)

    def test_case_folding_of_flashinfer_words(self):
        self.assertEqual(spec(kv_layout="hnd", pos_encoding_mode="alibi").logits, "alibi")

    def test_nul_would_have_been_cut(self):
        # What ctypes does without the check: the arch after the NUL is silently dropped.
        import ctypes

        self.assertEqual(ctypes.c_char_p(b"sm_80\0junk").value, b"sm_80")
        with self.assertRaises(ValueError):
            _check.text("sm_80\0junk", "arch")


SPECS = ["op=decode head_dim=64", "op=decode head_dim=128", "op=decode head_dim=64 group=4"]


class TestClose(unittest.TestCase):
    def test_calls_after_close_raise_a_clean_error(self):
        ctx = context()
        k = ctx.compile(SPEC, arch="sm_80")
        ctx.close()
        calls = {
            "compile": lambda: ctx.compile(SPEC, arch="sm_80"),
            "kernel": lambda: ctx.kernel(SPEC),
            "device": lambda: ctx.device,
            "cache_path": lambda: ctx.cache_path,
            "errmsg": lambda: ctx.errmsg,
            "source": lambda: k.source,
            "info": lambda: k.info,
            "cubin": lambda: k.cubin,
            "workspace_size": lambda: k.workspace_size(8, 100),
            "single_decode": lambda: k.single_decode(kiln.AttnArgs()),
            "plan": lambda: k.plan(8),
        }
        for name, call in calls.items():
            with self.subTest(call=name):
                with self.assertRaises(kiln.KilnInvalidArgumentError) as cm:
                    call()
                self.assertIn("closed", str(cm.exception))
        self.assertIn("closed", repr(ctx))
        self.assertIn("closed", repr(k))

    def test_close_waits_for_a_call_in_progress(self):
        # A call holding the context (as every C call does, through Context._use) delays
        # close() until it ends; a call that starts once close() has begun fails at once.
        ctx = context()
        inside, release = threading.Event(), threading.Event()
        ended = []

        def hold():
            with ctx._use():
                inside.set()
                release.wait(10)
                ended.append(time.monotonic())

        holder = threading.Thread(target=hold)
        holder.start()
        self.assertTrue(inside.wait(10))
        closer = threading.Thread(target=ctx.close)
        closer.start()
        while not ctx.closed:
            time.sleep(0.001)
        self.assertTrue(closer.is_alive(), "close() returned while a call was in progress")
        t0 = time.monotonic()
        with self.assertRaises(kiln.KilnInvalidArgumentError):
            ctx.compile(SPEC, arch="sm_80")
        self.assertLess(time.monotonic() - t0, 5, "a call during close() waited instead of failing")
        release.set()
        closer.join(10)
        holder.join(10)
        self.assertFalse(closer.is_alive())
        self.assertIsNone(ctx._handle)
        self.assertEqual(len(ctx._calls), 0)

    def test_close_while_threads_compile(self):
        # Real NVRTC compiles in flight when close() is called: each one either returns a
        # kernel before close() returns (its key read cleanly or refused as closed) or fails
        # with KilnInvalidArgumentError; nothing else, and no garbage keys.
        ctx = context()
        start = threading.Barrier(len(SPECS) + 1)
        outcomes = [None] * len(SPECS)

        def work(i):
            start.wait()
            try:
                k = ctx.compile(SPECS[i], arch="sm_80")
                done = time.monotonic()
                try:
                    outcomes[i] = ("key", done, k.key)
                except kiln.KilnInvalidArgumentError:
                    outcomes[i] = ("closed", done, None)
            except kiln.KilnInvalidArgumentError:
                outcomes[i] = ("refused", time.monotonic(), None)
            except BaseException as exc:  # anything else is the bug
                outcomes[i] = ("error", time.monotonic(), repr(exc))

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(SPECS))]
        for t in threads:
            t.start()
        start.wait()
        time.sleep(0.05)  # the compiles are in NVRTC now
        ctx.close()
        closed_at = time.monotonic()
        for t in threads:
            t.join(120)
        for i, (kind, when, detail) in enumerate(outcomes):
            with self.subTest(spec=SPECS[i]):
                self.assertIn(kind, ("key", "closed", "refused"), detail)
                if kind == "key":
                    self.assertRegex(detail, r"^[0-9a-f]{32}$")
                if kind in ("key", "closed"):
                    self.assertLessEqual(when, closed_at, "a compile outlived close()")
        with self.assertRaises(kiln.KilnInvalidArgumentError):
            ctx.compile(SPECS[0], arch="sm_80")

    def test_close_destroys_live_plans_first(self):
        # Plans need a loaded kernel (a GPU), so a stand-in plan with a fake handle and a
        # recording kiln_plan_destroy: close() destroys each live plan once, through the
        # library, before the context; the plan's own close() afterwards does nothing.
        from kiln import _lib, plan as plan_mod

        ctx = context()
        k = ctx.compile(SPEC, arch="sm_80")
        p = plan_mod.Plan.__new__(plan_mod.Plan)
        p.kernel, p._handle = k, 0xDEAD0
        ctx._plans.add(p)
        destroyed = []
        real_fn = _lib.fn

        def fn(name):
            if name == "kiln_plan_destroy":
                return lambda h: destroyed.append((h, ctx._handle is None, ctx._closing))
            return real_fn(name)

        _lib.fn = fn
        try:
            ctx.close()
            p.close()
        finally:
            _lib.fn = real_fn
        self.assertEqual(destroyed, [(0xDEAD0, True, True)])
        self.assertIsNone(p._handle)
        with self.assertRaises(kiln.KilnInvalidArgumentError):
            p.workspace_size(1)

    def test_close_inside_a_call_on_the_same_thread_raises(self):
        ctx = context()
        with ctx._use():
            with self.assertRaises(RuntimeError) as cm:
                ctx.close()
            self.assertIn("wait for itself", str(cm.exception))
        self.assertFalse(ctx.closed)
        self.assertEqual(ctx.compile(SPEC, arch="sm_80").arch, "sm_80")  # still usable
        ctx.close()
        self.assertEqual((len(ctx._calls), ctx._holders), (0, {}))

    def test_close_from_several_threads(self):
        ctx = context()
        ctx.compile(SPEC, arch="sm_80")
        errors = []

        def close():
            try:
                ctx.close()
            except BaseException as exc:
                errors.append(repr(exc))

        threads = [threading.Thread(target=close) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        self.assertEqual(errors, [])
        self.assertTrue(ctx.closed)
        ctx.close()  # and once more, idempotent

    def test_failed_constructor_collects_quietly(self):
        # A Context whose __init__ raised is still collected; its __del__ must not complain.
        seen = []
        old, sys.unraisablehook = sys.unraisablehook, seen.append
        try:
            for bad in (dict(mode="bogus"), dict(cache_dir=b"/x"), dict(device=-1)):
                with self.assertRaises((TypeError, ValueError)):
                    kiln.Context(no_device=True, **bad)
            gc.collect()
        finally:
            sys.unraisablehook = old
        self.assertEqual([repr(u.exc_value) for u in seen], [])


if __name__ == "__main__":
    unittest.main()
