"""test_fi_attributes.py — FlashInfer's wrapper surface beyond plan/run, written from FlashInfer
0.6's behaviour: forward() re-plans only when an attention argument's effective value changes
(and never inside a CUDA-graph capture), the CUDA-graph buffers under FlashInfer's attribute
names filled by plan(), the read-back attributes (_sm_scale, _causal, ...), the refusal of an
older positional plan() order, fast_decode_plan's q_len_per_req, and the module paths
kiln.decode / kiln.prefill / kiln.cascade / kiln.page / kiln.sparse / kiln.utils.

All on the CPU with test_wrapper_semantics.py's fake device (libkiln.so's GPU calls stubbed,
CPU tensors); they skip without torch.
"""

import importlib
import math
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_wrapper_semantics import D, H, H_KV, P, CpuCase, kiln, pages_for, torch  # noqa: E402


def int32(values):
    return torch.tensor(values, dtype=torch.int32)


class TestForwardEffectiveValues(CpuCase):
    """forward() compares what the arguments mean, not how they are spelled."""

    def test_spellings_of_the_planned_values_do_not_replan(self):
        w, q, kv = self.decode()  # sm_scale, logits_soft_cap None; window_left -1
        w.forward(q, kv, sm_scale=1.0 / math.sqrt(D), logits_soft_cap=0.0, window_left=None)
        w.forward(q, kv, window_left=-7)
        self.assertEqual(len(self.dev.plans), 1)
        w2, q, kv = self.decode(sm_scale=0.125, logits_soft_cap=0.0)
        w2.forward(q, kv, sm_scale=0.125)  # logits_soft_cap None == 0.0 planned
        self.assertEqual(len(self.dev.plans), 2)

    def test_rope_defaults_count_only_with_rope(self):
        w, q, kv = self.decode(pos_encoding_mode="ROPE_LLAMA")
        w.forward(q, kv, "rope_llama", rope_scale=1.0, rope_theta=1e4)
        self.assertEqual(len(self.dev.plans), 1)
        w.forward(q, kv, "ROPE_LLAMA", rope_theta=5e5)
        self.assertEqual(len(self.dev.plans), 2)
        self.assertAlmostEqual(self.dev.runs[-1].params.rope_theta, 5e5)
        w, q, kv = self.decode()
        w.forward(q, kv, rope_scale=4.0)  # no RoPE: the scale changes nothing
        self.assertEqual(len(self.dev.plans), 3)

    def test_a_real_change_replans(self):
        w, q, kv = self.decode()
        w.forward(q, kv, sm_scale=0.5)
        self.assertEqual(len(self.dev.plans), 2)
        self.assertAlmostEqual(self.dev.runs[-1].params.sm_scale, 0.5)
        w.forward(q, kv, window_left=8)
        self.assertEqual(w.variant.window, True)

    def test_prefill_causal_and_ignored_reduction_flag(self):
        pw = kiln.BatchPrefillWithPagedKVCacheWrapper(self.ws(), context=self.dev.ctx)
        pw.plan([0, 4], [0, 1], [0], [8], H, H_KV, D, P, causal=True)
        q = torch.zeros((4, H, D), dtype=torch.float16)
        pool = torch.zeros((1, P, H_KV, D), dtype=torch.float16)
        pw.forward(q, (pool, pool), causal=True, use_fp16_qk_reduction=True)
        self.assertEqual(len(self.dev.plans), 1)
        pw.forward(q, (pool, pool), causal=False)
        self.assertEqual((len(self.dev.plans), pw.variant.mask), (2, "none"))

    def test_no_plan_inside_a_capture(self):
        w, q, kv = self.decode()
        saved = torch.cuda.is_available, torch.cuda.is_current_stream_capturing
        torch.cuda.is_available = lambda: True
        torch.cuda.is_current_stream_capturing = lambda: True
        try:
            w.forward(q, kv, sm_scale=1.0 / math.sqrt(D))  # nothing to re-plan: it runs
            self.assertEqual(len(self.dev.runs), 1)
            with self.assertRaises(RuntimeError) as cm:
                w.forward(q, kv, sm_scale=0.5)
        finally:
            torch.cuda.is_available, torch.cuda.is_current_stream_capturing = saved
        self.assertIn("capture", str(cm.exception))
        self.assertEqual(len(self.dev.plans), 1)


class TestGraphBuffers(CpuCase):
    """A graph-mode wrapper keeps its buffers under FlashInfer's names; plan() fills them."""

    def test_plain_decode_wrapper(self):
        indptr_buf, indices_buf, last_buf = int32([-1] * 4), int32([-1] * 8), int32([-1] * 3)
        w = kiln.BatchDecodeWithPagedKVCacheWrapper(
            self.ws(), "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=indptr_buf,
            paged_kv_indices_buffer=indices_buf, paged_kv_last_page_len_buffer=last_buf,
            context=self.dev.ctx)
        self.assertIs(w._paged_kv_indptr_buf, indptr_buf)
        self.assertIs(w._paged_kv_indices_buf, indices_buf)
        self.assertIs(w._paged_kv_last_page_len_buf, last_buf)
        self.assertEqual(w._fixed_batch_size, 3)
        indptr, last, pages = pages_for((20, 33))
        w.plan(int32(indptr), int32([7, 6, 5, 4, 3][:pages]), last, H, H_KV, D, P)
        self.assertEqual(indptr_buf.tolist(), indptr + [-1])
        self.assertEqual(last_buf.tolist(), last + [-1])
        self.assertEqual(indices_buf[:pages].tolist(), [7, 6, 5, 4, 3][:pages])
        w.plan(indptr_buf[:3], indices_buf, last_buf[:2], H, H_KV, D, P)  # the buffers themselves
        self.assertEqual(indptr_buf.tolist(), indptr + [-1])

    def test_eager_wrappers_have_no_fixed_batch(self):
        w, _, _ = self.decode()
        self.assertEqual(w._fixed_batch_size, 0)
        self.assertIsNone(w._paged_kv_indptr_buf)

    def test_graph_subclass_uses_the_base_plan(self):
        self.assertIs(kiln.CUDAGraphBatchDecodeWithPagedKVCacheWrapper.plan,
                      kiln.BatchDecodeWithPagedKVCacheWrapper.plan)

    def test_fast_decode_plan_leaves_indptr_and_last(self):
        indptr_buf, indices_buf, last_buf = int32([-1] * 3), int32([-1] * 4), int32([-1] * 2)
        w = kiln.BatchDecodeWithPagedKVCacheWrapper(
            self.ws(), use_cuda_graph=True, paged_kv_indptr_buffer=indptr_buf,
            paged_kv_indices_buffer=indices_buf, paged_kv_last_page_len_buffer=last_buf,
            context=self.dev.ctx)
        kiln.fast_decode_plan(w, indptr_buf, int32([3, 2, 1]), last_buf, H, H_KV, D, 1,
                              global_override_indptr_cpu=int32([0, 1, 3]))
        self.assertEqual(self.dev.plans[-1], (2, [0, 1, 3]))
        self.assertEqual((indptr_buf.tolist(), last_buf.tolist()), ([-1] * 3, [-1] * 2))
        self.assertEqual(indices_buf[:3].tolist(), [3, 2, 1])
        w.plan([0, 1, 3], int32([3, 2, 1]), [1, 1], H, H_KV, D, 1)  # plan() copies again
        self.assertEqual((indptr_buf.tolist(), last_buf.tolist()), ([0, 1, 3], [1, 1]))

    def test_prefill_wrappers(self):
        qo_buf, kv_buf, idx_buf, last_buf = (int32([-1] * 3), int32([-1] * 3), int32([-1] * 4),
                                             int32([-1] * 2))
        pw = kiln.BatchPrefillWithPagedKVCacheWrapper(
            self.ws(), use_cuda_graph=True, qo_indptr_buf=qo_buf, paged_kv_indptr_buf=kv_buf,
            paged_kv_indices_buf=idx_buf, paged_kv_last_page_len_buf=last_buf,
            context=self.dev.ctx)
        self.assertEqual(pw._fixed_batch_size, 2)
        pw.plan([0, 2, 5], [0, 1, 3], int32([2, 0, 1]), [4, 9], H, H_KV, D, P, causal=True)
        self.assertEqual((qo_buf.tolist(), kv_buf.tolist(), last_buf.tolist()),
                         ([0, 2, 5], [0, 1, 3], [4, 9]))
        self.assertEqual(idx_buf[:3].tolist(), [2, 0, 1])
        rq, rk = int32([-1] * 3), int32([-1] * 3)
        rw = kiln.BatchPrefillWithRaggedKVCacheWrapper(
            self.ws(), use_cuda_graph=True, qo_indptr_buf=rq, kv_indptr_buf=rk,
            context=self.dev.ctx)
        self.assertIs(rw._kv_indptr_buf, rk)
        rw.plan(int32([0, 3, 4]), [0, 5, 11], H, H_KV, D)
        self.assertEqual((rq.tolist(), rk.tolist()), ([0, 3, 4], [0, 5, 11]))


class TestReadBack(CpuCase):
    """_sm_scale, _window_left, ... read back what plan() / forward() were given."""

    def test_decode_values(self):
        w = kiln.BatchDecodeWithPagedKVCacheWrapper(self.ws(), context=self.dev.ctx)
        with self.assertRaises(AttributeError):
            w._sm_scale
        w, q, kv = self.decode()
        self.assertEqual((w._pos_encoding_mode, w._window_left, w._sm_scale, w._rope_scale,
                          w._rope_theta), ("NONE", -1, None, None, None))
        self.assertEqual(w._logits_soft_cap, 0.0)  # None becomes 0.0, as in FlashInfer's plan
        self.assertIsInstance(w._logits_soft_cap, float)
        self.assertFalse(hasattr(w, "_causal"))  # decode wrappers have none
        w, q, kv = self.decode(sm_scale=0.25, window_left=16, logits_soft_cap=30.0)
        self.assertEqual((w._sm_scale, w._window_left, w._logits_soft_cap), (0.25, 16, 30.0))
        w.forward(q, kv, window_left=16)  # forward keeps its values as given
        self.assertEqual((w._sm_scale, w._logits_soft_cap), (None, None))

    def test_prefill_values_and_no_writes(self):
        pw = kiln.BatchPrefillWithPagedKVCacheWrapper(self.ws(), context=self.dev.ctx)
        pw.plan([0, 4], [0, 1], [0], [8], H, H_KV, D, P, causal=True, sm_scale=0.1)
        self.assertEqual((pw._causal, pw._sm_scale, pw._use_fp16_qk_reduction), (True, 0.1, False))
        rw = kiln.BatchPrefillWithRaggedKVCacheWrapper(self.ws(), context=self.dev.ctx)
        rw.plan([0, 4], [0, 6], H, H_KV, D)
        self.assertIs(rw._causal, False)
        with self.assertRaises(AttributeError) as cm:
            pw._sm_scale = 0.5
        self.assertIn("plan()", str(cm.exception))
        self.assertEqual(pw._sm_scale, 0.1)


class TestPositionalOrder(CpuCase):
    def test_older_order_is_named(self):
        w = kiln.BatchDecodeWithPagedKVCacheWrapper(self.ws(), context=self.dev.ctx)
        indptr, last, pages = pages_for((20, 33))
        # vLLM's 21 positional arguments: data_type 13th, then sm_scale ... disable_split_kv
        with self.assertRaises(TypeError) as cm:
            w.plan(indptr, int32(list(range(pages))), last, H, H_KV, D, P, "NONE", -1, None,
                   torch.float16, torch.float16, torch.float16, 0.125, None, None, True, None,
                   None, None, False)
        msg = str(cm.exception)
        self.assertIn("FlashInfer 0.6", msg)
        self.assertIn("keyword", msg)
        self.assertEqual(self.dev.plans, [])
        with self.assertRaises(NotImplementedError):  # the real keywords still say so
            w.plan(indptr, int32(list(range(pages))), last, H, H_KV, D, P,
                   seq_lens=int32([20, 33]))


class TestFastDecodePlan(CpuCase):
    def test_q_len_per_req(self):
        w = kiln.BatchDecodeWithPagedKVCacheWrapper(self.ws(), context=self.dev.ctx)
        kiln.fast_decode_plan(w, [0, 1], int32([0]), [3], H, H_KV, D, P, q_len_per_req=1)
        self.assertEqual(len(self.dev.plans), 1)
        with self.assertRaises(NotImplementedError) as cm:
            kiln.fast_decode_plan(w, [0, 1], int32([0]), [3], H, H_KV, D, P, q_len_per_req=2)
        self.assertIn("one query row", str(cm.exception))
        self.assertEqual(len(self.dev.plans), 1)


class TestModulePaths(unittest.TestCase):
    """FlashInfer's module paths name the package's own objects."""

    NAMES = {
        "decode": ["BatchDecodeWithPagedKVCacheWrapper",
                   "CUDAGraphBatchDecodeWithPagedKVCacheWrapper", "single_decode_with_kv_cache",
                   "fast_decode_plan", "get_seq_lens"],
        "prefill": ["BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper",
                    "single_prefill_with_kv_cache", "single_prefill_with_kv_cache_return_lse"],
        "cascade": ["MultiLevelCascadeAttentionWrapper", "merge_state", "merge_state_in_place",
                    "merge_states", "BatchDecodeWithSharedPrefixPagedKVCacheWrapper",
                    "BatchPrefillWithSharedPrefixPagedKVCacheWrapper"],
        "page": ["append_paged_kv_cache", "get_batch_indices_positions", "get_seq_lens"],
        "sparse": ["BlockSparseAttentionWrapper", "VariableBlockSparseAttentionWrapper"],
    }

    def test_names(self):
        for module, names in self.NAMES.items():
            m = importlib.import_module(f"kiln.{module}")
            self.assertIs(getattr(kiln, module), m)
            for name in names:
                self.assertIs(getattr(m, name), getattr(kiln, name), f"kiln.{module}.{name}")
        with self.assertRaises(AttributeError):
            importlib.import_module("kiln.cascade").NoSuchWrapper

    @unittest.skipUnless(torch is not None, "needs torch")
    def test_range_buf(self):
        from kiln.decode import _get_range_buf
        from kiln.utils import _get_range_buf as from_utils

        self.assertIs(_get_range_buf, from_utils)
        r = _get_range_buf(5, "cpu")
        self.assertEqual((r.tolist(), r.dtype), ([0, 1, 2, 3, 4], torch.int32))
        self.assertEqual(_get_range_buf(7, "cpu").data_ptr(), r.data_ptr())  # one cached arange
        self.assertEqual(_get_range_buf(0, "cpu").numel(), 0)
        with self.assertRaises(ValueError):
            _get_range_buf(-1, "cpu")


if __name__ == "__main__":
    unittest.main()
