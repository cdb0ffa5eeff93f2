"""test_batch.py — the batch side of the Python package without torch and without a GPU: the
ctypes prototypes against kiln.h, the lazy binding of the batch API, the variant a plan builds
from FlashInfer's arguments, and the argument checks of the wrappers (clean exceptions with
messages, raised before anything needs torch, a GPU or a kernel).

The struct layouts of kiln_plan_opts, kiln_batch_shape, kiln_plan_info, kiln_batch_args and
kiln_merge_args are checked with the others in test_basic.TestABI ($KILN_ABI from
tests/test_python.c). The GPU side is test_batch_torch.py.
"""

import os
import re
import sys
import unittest

_SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
if os.environ.get("KILN_TEST_INSTALLED") != "1" and os.path.isdir(os.path.join(_SRC, "kiln")):
    sys.path.insert(0, _SRC)

import kiln  # noqa: E402
from kiln import _lib, batch  # noqa: E402
from kiln.plan import host_ints  # noqa: E402
from _reference import FakeBuffer  # noqa: E402 (the shared stand-in workspace)

HEADER = os.path.join(os.path.dirname(_SRC), "include", "kiln.h")

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

BASE = "layout=nhd mask=none window=0 logits=none lse=1"


class TestPrototypes(unittest.TestCase):
    def test_every_header_function_is_declared(self):
        if not os.path.exists(HEADER):
            self.skipTest("no include/kiln.h (installed package)")
        with open(HEADER) as f:
            text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
        declared = set(re.findall(r"^[A-Za-z_][\w \*]*?\b(kiln_\w+)\s*\(", text, flags=re.M))
        self.assertIn("kiln_plan_run", declared)
        self.assertGreater(len(declared), 30)
        mirrored = set(_lib._PROTOTYPES) | set(_lib._OPTIONAL_PROTOTYPES)
        self.assertEqual(sorted(declared - mirrored), [], "kiln.h functions without a prototype")
        self.assertEqual(sorted(mirrored - declared), [], "prototypes kiln.h does not declare")

    def test_batch_api_is_optional(self):
        for name in ("kiln_plan_create", "kiln_plan_destroy", "kiln_plan_workspace_size",
                     "kiln_plan_schedule", "kiln_plan_describe", "kiln_plan_run",
                     "kiln_merge_state", "kiln_merge_state_in_place", "kiln_merge_states"):
            self.assertIn(name, _lib._OPTIONAL_PROTOTYPES)
            self.assertNotIn(name, _lib._PROTOTYPES)

    def test_missing_function_is_a_clear_error(self):
        with self.assertRaises(kiln.KilnLibraryError) as cm:
            _lib.fn("kiln_no_such_function")
        self.assertIn("kiln_no_such_function", str(cm.exception))
        self.assertIn("batch API", str(cm.exception))
        self.assertIn(_lib.lib_path(), str(cm.exception))
        if not _lib.has("kiln_plan_run"):  # a library from before the batch API still loads
            with self.assertRaises(kiln.KilnLibraryError) as cm:
                _lib.fn("kiln_plan_run")
            self.assertIn("rebuild", str(cm.exception))
        else:
            self.assertIsNotNone(_lib.fn("kiln_plan_run").argtypes)

    def test_struct_fields(self):
        # Field order of the new mirrors, as kiln.h has it (sizes: test_basic.TestABI).
        self.assertEqual([f for f, _ in _lib.kiln_plan_opts._fields_],
                         ["num_qo_heads", "page_size", "max_batch", "max_qo_tokens",
                          "fixed_split", "no_split", "max_total_kv", "bsr_r", "bsr_c"])
        self.assertEqual([f for f, _ in _lib.kiln_batch_args._fields_][-6:],
                         ["workspace", "workspace_bytes", "params", "mask_bits", "bsr_indptr", "bsr_indices"])
        for name in ("kiln_plan_opts", "kiln_batch_shape", "kiln_plan_info", "kiln_batch_args",
                     "kiln_merge_args"):
            self.assertIn(name, _lib.ABI_STRUCTS)
        # The public names are the mirrors with checked fields (test_hostile.py), same layout.
        self.assertTrue(issubclass(kiln.BatchArgs, _lib.kiln_batch_args))
        self.assertTrue(issubclass(kiln.MergeArgs, _lib.kiln_merge_args))


class TestVariantFields(unittest.TestCase):
    def test_kv_rope_fp8_merge(self):
        v = kiln.Variant("op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 kv=paged rope=1")
        self.assertEqual((v.kv, v.rope, v.kv_dtype, v.q_dtype), ("paged", True, "e4m3", "bf16"))
        self.assertIn("kv=paged rope=1", str(v))
        self.assertEqual(kiln.Variant(str(v)), v)
        self.assertEqual(v.to_dict()["kv"], "paged")
        self.assertEqual(kiln.Variant().kv, "contiguous")
        self.assertIs(kiln.Variant().rope, False)
        w = kiln.Variant(op="prefill", kv="ragged", dtype="f16")
        self.assertTrue(str(w).endswith(" kv=ragged"))
        m = kiln.Variant(op="merge", dtype="bf16", head_dim=64)
        self.assertEqual(m.op, "merge")
        with self.assertRaises(kiln.KilnUnsupportedError):
            kiln.Variant(op="merge", dtype="bf16", lse=True)
        with self.assertRaises(kiln.KilnParseError):
            kiln.Variant(kv="sharded")


class TestBatchVariant(unittest.TestCase):
    def spec(self, *args, **kw):
        return str(batch.batch_variant(*args, **kw))

    def test_decode_paged(self):
        self.assertEqual(
            self.spec("decode", "paged", 32, 8, 128, q_data_type="bfloat16"),
            f"op=decode dtype=bf16 head_dim=128 group=4 {BASE} kv=paged",
        )
        # FlashInfer's default q_data_type is float16; torch dtypes print as "torch.float16".
        self.assertEqual(self.spec("decode", "paged", 8, 8, 64),
                         f"op=decode dtype=f16 head_dim=64 group=1 {BASE} kv=paged")
        self.assertEqual(self.spec("decode", "paged", 8, 8, 64, q_data_type="torch.float16"),
                         self.spec("decode", "paged", 8, 8, 64))
        # causal means nothing for decode (one row at the end of its keys)
        self.assertEqual(self.spec("decode", "paged", 8, 8, 64, causal=True),
                         self.spec("decode", "paged", 8, 8, 64))

    def test_fp8_kv_rope_window_softcap(self):
        self.assertEqual(
            self.spec("decode", "paged", 64, 8, 128, q_data_type="bfloat16",
                      kv_data_type="torch.float8_e4m3fn", pos_encoding_mode="ROPE_LLAMA",
                      window_left=127, logits_soft_cap=30.0, kv_layout="HND"),
            "op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=8 "
            "layout=hnd mask=none window=1 logits=softcap lse=1 kv=paged rope=1",
        )
        self.assertIn("kv_dtype=e5m2",
                      self.spec("decode", "paged", 8, 8, 64, kv_data_type="float8_e5m2"))
        # soft-cap with ALiBi: one transform, FlashInfer's order
        self.assertIn("logits=softcap_alibi",
                      self.spec("prefill", "ragged", 8, 8, 64, pos_encoding_mode="ALIBI",
                                logits_soft_cap=30.0))
        self.assertEqual(kiln.Variant("op=prefill logits=softcap_alibi").logits, "softcap_alibi")
        # window_left=-1 and None: no window; soft-cap None / 0: none
        self.assertEqual(self.spec("decode", "paged", 8, 8, 64, window_left=None,
                                   logits_soft_cap=0.0),
                         self.spec("decode", "paged", 8, 8, 64))

    def test_prefill(self):
        self.assertEqual(
            self.spec("prefill", "paged", 32, 4, 128, causal=True, q_data_type="bf16",
                      o_data_type="float16"),
            "op=prefill q_dtype=bf16 kv_dtype=bf16 out_dtype=f16 head_dim=128 group=8 "
            "layout=nhd mask=causal window=0 logits=none lse=1 kv=paged",
        )
        self.assertEqual(
            self.spec("prefill", "ragged", 16, 16, 256, pos_encoding_mode="ALIBI", lse=False),
            "op=prefill dtype=f16 head_dim=256 group=1 layout=nhd mask=none window=0 "
            "logits=alibi lse=0 kv=ragged",
        )

    def test_few_tokens(self):
        """q_tokens: the variant's bound, and the choice the prefill wrappers make from qo_indptr."""
        self.assertEqual(
            self.spec("prefill", "paged", 32, 8, 128, causal=True, q_data_type="bfloat16", q_tokens=4),
            "op=prefill dtype=bf16 head_dim=128 group=4 layout=nhd mask=causal window=0 "
            "logits=none lse=1 kv=paged q_tokens=4",
        )
        ft = batch.few_tokens
        self.assertEqual(ft([0, 4, 8, 11], 4), 4)
        self.assertEqual(ft([0, 1, 2], 4), 1)
        self.assertEqual(ft([0, 0, 3, 8], 8), 8)  # a request with no tokens
        self.assertEqual(ft([0, 9], 1), 16)
        self.assertEqual(ft([0, 17], 4), 0)  # past 16: the prefill families
        self.assertEqual(ft([0, 16, 32], 4), 16)  # 16 on average and at most
        self.assertEqual(ft([0, 16, 33], 4), 0)  # more than 16 on average: one is longer
        self.assertEqual(ft([0, 1, 2, 20], 4), 0)  # few on average, one past 16
        self.assertEqual(ft([5, 6, 9], 4), 4)  # an indptr read from its first entry
        self.assertEqual(ft([0, 0, 0], 4), 0)  # no tokens at all
        self.assertEqual(ft([0], 4), 0)  # no requests
        self.assertEqual(ft([0, 3], 3), 0)  # a group that does not divide 64
        self.assertEqual(ft([0, 3], 4, masked=True), 0)
        self.assertEqual(ft([0, 3], 4, graph=True), 0)
        for bad in (3, 32, -1):
            with self.assertRaises((kiln.KilnParseError, kiln.KilnUnsupportedError)):
                batch.batch_variant("prefill", "paged", 32, 8, 128, q_tokens=bad)
        with self.assertRaisesRegex(kiln.KilnUnsupportedError, "only prefill batches"):
            batch.batch_variant("decode", "paged", 32, 8, 128, q_tokens=4)

    def test_bad_arguments(self):
        V = batch.batch_variant
        cases = [
            (ValueError, "multiple of num_kv_heads", dict(num_qo_heads=12, num_kv_heads=8)),
            (ValueError, "num_kv_heads=0", dict(num_kv_heads=0)),
            (TypeError, "num_qo_heads", dict(num_qo_heads="32")),
            (ValueError, "kv_layout", dict(kv_layout="NDH")),
            (ValueError, "pos_encoding_mode", dict(pos_encoding_mode="ROPE_NEOX")),
            (ValueError, "logits_soft_cap", dict(logits_soft_cap=-1.0)),
            (NotImplementedError, "fp8", dict(q_data_type="float8_e4m3fn")),
            (ValueError, "q_data_type", dict(q_data_type="float32")),
            (ValueError, "only fp8 KV", dict(q_data_type="float16", kv_data_type="bfloat16")),
            (ValueError, "o_data_type", dict(o_data_type="float8_e5m2")),
            (kiln.KilnUnsupportedError, "head_dim", dict(head_dim=96)),
        ]
        for exc, fragment, kw in cases:
            args = dict(num_qo_heads=32, num_kv_heads=8, head_dim=128)
            args.update(kw)
            with self.subTest(kw=kw):
                with self.assertRaises(exc) as cm:
                    V("decode", "paged", args.pop("num_qo_heads"), args.pop("num_kv_heads"),
                      args.pop("head_dim"), **args)
                self.assertIn(fragment, str(cm.exception))
        with self.assertRaises(ValueError):
            V("append", "paged", 8, 8, 64)
        with self.assertRaises(ValueError):
            V("decode", "contiguous", 8, 8, 64)

    def test_host_ints(self):
        self.assertEqual(host_ints([0, 3, 5], "x"), [0, 3, 5])
        self.assertEqual(host_ints((0, 1), "x"), [0, 1])
        self.assertEqual(host_ints(range(3), "x"), [0, 1, 2])
        self.assertIsNone(host_ints(None, "x"))
        with self.assertRaises(TypeError) as cm:
            host_ints([0, 1.5], "indptr")
        self.assertIn("indptr", str(cm.exception))
        with self.assertRaises(TypeError):
            host_ints("012", "indptr")
        with self.assertRaises(TypeError):
            host_ints(7, "indptr")


class TestLastPageLenCheck(unittest.TestCase):
    """check_last_page_len's fast path (bytes / translate below page size 256, min / max above)
    agrees with the entry-by-entry rule: a request with pages holds 1..page_size tokens."""

    def test_fast_path_agrees(self):
        from kiln.plan import check_last_page_len

        for page_size in (1, 16, 255, 256, 1000):
            for last, ok in (([1, page_size, 1], True), ([0, 1, 1], False),
                             ([page_size + 1, 1, 1], False), ([-1, 1, 1], False),
                             ([1, 300, 1], page_size >= 300), ([1, 2 ** 20, 1], False)):
                last = [min(n, page_size) if ok else n for n in last]
                indptr = [0, 1, 2, 3]
                with self.subTest(page_size=page_size, last=last):
                    if ok:
                        check_last_page_len("last", last, indptr, page_size)
                    else:
                        with self.assertRaisesRegex(ValueError, "last page holds"):
                            check_last_page_len("last", last, indptr, page_size)
                    # the same entries on a request without pages are ignored
                    check_last_page_len("last", last, [0, 0, 0, 0], page_size)


class TestWrapperChecks(unittest.TestCase):
    """The checks plan() makes before it needs torch, a GPU or a kernel."""

    def decode(self, **kw):
        return kiln.BatchDecodeWithPagedKVCacheWrapper(FakeBuffer(), "NHD", **kw)

    def plan_decode(self, w, indptr=(0, 2, 3), indices=(4, 1, 0), last=(16, 1), **kw):
        args = dict(num_qo_heads=32, num_kv_heads=8, head_dim=128, page_size=16)
        args.update(kw)
        w.plan(list(indptr), list(indices), list(last), args.pop("num_qo_heads"),
               args.pop("num_kv_heads"), args.pop("head_dim"), args.pop("page_size"), **args)

    def test_constructor(self):
        with self.assertRaises(ValueError) as cm:
            kiln.BatchDecodeWithPagedKVCacheWrapper(FakeBuffer(), "NDH")
        self.assertIn("kv_layout", str(cm.exception))
        with self.assertRaises(TypeError) as cm:
            kiln.BatchDecodeWithPagedKVCacheWrapper(None)
        self.assertIn("float_workspace_buffer", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            self.decode(use_cuda_graph=True)
        self.assertIn("paged_kv_indices_buffer", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            self.decode(lse_base="10")
        self.assertIn("lse_base", str(cm.exception))
        with self.assertRaises(NotImplementedError):
            kiln.BatchPrefillWithPagedKVCacheWrapper(FakeBuffer(), custom_mask_buf=[1])
        with self.assertRaises(NotImplementedError):
            kiln.BatchPrefillWithRaggedKVCacheWrapper(FakeBuffer(), mask_indptr_buf=[0])
        w = self.decode(use_cuda_graph=True, paged_kv_indices_buffer=[0] * 64,
                        paged_kv_last_page_len_buffer=[0] * 4)
        self.assertTrue(w.is_cuda_graph_enabled)
        self.assertIsNone(w.variant)
        self.assertFalse(self.decode().is_cuda_graph_enabled)
        with self.assertRaises(RuntimeError) as cm:
            self.decode().run(None, None)
        self.assertIn("plan()", str(cm.exception))

    def test_decode_plan_arrays(self):
        cases = [
            ("indptr[0] = 1", dict(indptr=(1, 2, 3))),
            ("indptr[2] = 1 < indptr[1] = 2", dict(indptr=(0, 2, 1))),
            ("indptr is empty", dict(indptr=())),
            ("last_page_len has 3 entries; the batch is 2", dict(last=(1, 1, 1))),
            ("last_page_len[0] = 17", dict(last=(17, 1))),
            ("last_page_len[1] = 0", dict(last=(16, 0))),
            ("page_size=0", dict(page_size=0)),
            ("multiple of num_kv_heads", dict(num_qo_heads=30)),
            ("block_tables", dict(block_tables=[[0]])),
            ("q_len_per_req", dict(q_len_per_req=2)),
            ("window_right", dict(window_right=4)),
            ("sm_scale=-1", dict(sm_scale=-1.0)),
        ]
        for fragment, kw in cases:
            with self.subTest(kw=kw):
                with self.assertRaises((ValueError, NotImplementedError)) as cm:
                    self.plan_decode(self.decode(), **kw)
                self.assertIn(fragment, str(cm.exception))
        # A request without pages may say anything in last_page_len (it is ignored).
        self.assertRaisesRegex(Exception, "torch|CUDA", self.plan_decode, self.decode(),
                               indptr=(0, 0, 3), last=(0, 1))

    def test_graph_bounds(self):
        w = self.decode(use_cuda_graph=True, paged_kv_indices_buffer=[0] * 64,
                        paged_kv_last_page_len_buffer=[0] * 2)
        with self.assertRaises(ValueError) as cm:
            self.plan_decode(w, indptr=(0, 1, 2, 3), indices=(0, 1, 2), last=(1, 1, 1))
        self.assertIn("batch 3 exceeds 2", str(cm.exception))

    def test_valid_plan_reaches_the_device(self):
        # Past the host checks the plan needs torch and a CUDA workspace: a clean error, never
        # a ctypes crash.
        exc = ImportError if not HAVE_TORCH else ValueError
        with self.assertRaises(exc) as cm:
            self.plan_decode(self.decode())
        self.assertTrue("torch" in str(cm.exception) or "CUDA" in str(cm.exception))

    def test_prefill_plan_arrays(self):
        w = kiln.BatchPrefillWithPagedKVCacheWrapper(FakeBuffer())
        base = dict(qo_indptr=[0, 5, 9], paged_kv_indptr=[0, 1, 3],
                    paged_kv_indices=[0, 1, 2], paged_kv_last_page_len=[5, 4],
                    num_qo_heads=8, num_kv_heads=8, head_dim_qk=64, page_size=16)
        cases = [
            ("paged_kv_indptr has 4 entries; batch 2 needs 3",
             dict(paged_kv_indptr=[0, 1, 2, 3])),
            ("qo_indptr[1] = 5", dict(qo_indptr=[0, 5, 4])),
            ("head_dim_vo", dict(head_dim_vo=128)),
            ("seq_lens", dict(seq_lens=[5, 4])),
        ]
        for fragment, kw in cases:
            args = dict(base, **kw)
            with self.subTest(kw=kw):
                with self.assertRaises((ValueError, NotImplementedError)) as cm:
                    w.plan(**args)
                self.assertIn(fragment, str(cm.exception))
        with self.assertRaises(TypeError) as cm:
            w.plan(**dict(base, no_such_argument=1))
        self.assertIn("no_such_argument", str(cm.exception))

    def test_ragged_plan_arrays(self):
        w = kiln.BatchPrefillWithRaggedKVCacheWrapper(FakeBuffer(), "HND")
        with self.assertRaises(ValueError) as cm:
            w.plan([0, 3, 6], [0, 4], 8, 8, 64, causal=True)
        self.assertIn("kv_indptr has 2 entries; batch 2 needs 3", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            w.plan([0, 3, 6], [0, 4, 8], 8, 8, 64, q_data_type="float32")
        self.assertIn("q_data_type", str(cm.exception))

    def test_cascade_constructor(self):
        with self.assertRaises(ValueError):
            kiln.MultiLevelCascadeAttentionWrapper(0, FakeBuffer())
        with self.assertRaises(NotImplementedError):
            kiln.MultiLevelCascadeAttentionWrapper(2, FakeBuffer(), use_cuda_graph=True)
        buf = FakeBuffer(1 << 20)
        c = kiln.MultiLevelCascadeAttentionWrapper(2, buf)
        self.assertEqual(len(c._batch_prefill_wrappers), 2)
        for w in c._batch_prefill_wrappers:  # every level on the whole (shared) workspace
            self.assertIs(w._float_workspace_buffer, buf)
        with self.assertRaises(ValueError) as cm:
            c.plan([[0, 1]], [[0, 1]], [[0]], [[1]], 8, 8, 64, 16)
        self.assertIn("2 levels", str(cm.exception))


if __name__ == "__main__":
    unittest.main()

