"""batch.py — FlashInfer-shaped batch attention over torch tensors: plan on the host, run on
the stream.

BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper and
BatchPrefillWithRaggedKVCacheWrapper take FlashInfer's constructor, plan() and run() arguments,
so porting an engine is a change of import. plan() copies the index arrays to the host once,
checks them, builds the kiln variant the arguments call for (batch_variant: kv=paged|ragged,
op, dtypes, head_dim, group, layout, mask, window, logits, lse, rope), gets its kernel from the
wrapper's Context (compiled once per spec, memoised here), and makes a kiln_plan (plan.py)
whose schedule goes to a small buffer of the wrapper's own and whose split-KV partial states go
to the caller's float_workspace_buffer, which several wrappers may share as in FlashInfer; all
of that once per set of scalar arguments (_wrapper.py keeps it). run() checks the tensors (once per tensor metadata) and launches
kiln_plan_run on torch's current stream: no allocation but the outputs asked for, no
synchronisation, so a run can be captured in a CUDA graph and replayed after a new plan().
The deprecated forward() / forward_return_lse() take FlashInfer's attention arguments and plan
the batch again when they change it. A batch without keys returns o = 0, lse = -inf.

Differences from FlashInfer are listed in docs/python.md: the LSE is base 2 by default like
FlashInfer's (lse_base="e" gives kiln's natural log), fp8 KV scales go to the kernel, the
custom masks in CUDA-graph mode / MLA / sinks / other backends are refused (custom_mask and
packed_custom_mask work in plan()).

torch is imported only inside the functions; batch_variant and the argument checks of plan()
work without it.
"""

import array
import functools
import sys

from . import _check
from ._planvalue import _PlanValue
from ._wrapper import (FP8, _BatchWrapper, _check_tensor, _layout, _meta, _positive_int,
                       _remember, dtype_word)
from .attention import _logits_word, _stride, mask_data_name, pos_encoding
from .core import Variant
from .plan import _count, check_indptr, check_last_page_len, host_array

# ---- the variant a plan calls for --------------------------------------------------------------


def batch_variant(op, kv, num_qo_heads, num_kv_heads, head_dim, *, kv_layout="NHD",
                  causal=False, pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None,
                  q_data_type="float16", kv_data_type=None, o_data_type=None, lse=True,
                  mask_data="none", q_tokens=0):
    """The kiln.Variant a batch plan with these arguments runs (no torch, no GPU needed): use
    it to compile ahead (ctx.compile(v, arch=...), `kiln warm`). op "decode" | "prefill"; kv
    "paged" | "ragged"; the rest are the plan arguments of the FlashInfer wrappers. group is
    num_qo_heads / num_kv_heads; mask=causal iff causal (prefill); window=1 iff window_left >= 0;
    logits=softcap iff logits_soft_cap > 0, alibi for pos_encoding_mode="ALIBI", softcap_alibi
    for both (FlashInfer's order: cap * tanh(x / cap + ALiBi bias)); rope=1 for
    "ROPE_LLAMA"; lse=1 unless lse=False; mask_data "none" | "bitmask" (a prefill plan's
    custom_mask) | "bsr"; q_tokens 0 | 1 | 2 | 4 | 8 | 16 (prefill: at most that many query
    tokens a request; the prefill wrappers pick it, see few_tokens). Raises ValueError naming
    the argument."""
    op = _check.choice(op, "op", ("decode", "prefill"))
    kv = _check.choice(kv, "kv", ("paged", "ragged"))
    causal = _check.flag(causal, "causal")
    lse = _check.flag(lse, "lse")
    H = _positive_int(num_qo_heads, "num_qo_heads")
    H_KV = _positive_int(num_kv_heads, "num_kv_heads")
    D = _positive_int(head_dim, "head_dim")
    if H % H_KV:
        raise ValueError(f"num_qo_heads={H} must be a multiple of num_kv_heads={H_KV}")
    layout = _layout(kv_layout).lower()
    mode = pos_encoding(pos_encoding_mode)
    cap = _check.real(logits_soft_cap, "logits_soft_cap", none=True) or 0.0
    if cap < 0:
        raise ValueError(f"logits_soft_cap={logits_soft_cap}: must be > 0 (or None / 0 for none)")
    q = dtype_word(q_data_type, "q_data_type")
    if q in FP8:
        raise NotImplementedError(
            f"q_data_type={q_data_type}: kiln takes fp8 keys and values, not fp8 queries"
        )
    k = q if kv_data_type is None else dtype_word(kv_data_type, "kv_data_type")
    if k != q and k not in FP8:
        raise ValueError(
            f"kv_data_type={kv_data_type} differs from q_data_type={q_data_type}: only fp8 KV "
            "(float8_e4m3fn, float8_e5m2) may differ from q"
        )
    o = q if o_data_type is None else dtype_word(o_data_type, "o_data_type")
    if o in FP8:
        raise ValueError(f"o_data_type={o_data_type}: must be float16 or bfloat16")
    window_left = _check.integer(window_left, "window_left", none=True)
    if window_left is None:
        window_left = -1
    logits = _logits_word(mode == "ALIBI", cap > 0)
    mask_data = _check.choice(mask_data, "mask_data", ("none", "bitmask", "bsr"))
    return Variant(op=op, q_dtype=q, kv_dtype=k, out_dtype=o, head_dim=D, group=H // H_KV,
                   layout=layout, mask="causal" if causal and op == "prefill" else "none",
                   window=window_left >= 0, logits=logits, lse=lse, kv=kv,
                   rope=mode == "ROPE_LLAMA", mask_data=mask_data, q_tokens=q_tokens)


# The most query tokens a request may have for a prefill plan to take the packed rows
# (kiln_variant.q_tokens), and the values q_tokens takes.
FEW_TOKENS_MAX = 16


def few_tokens(qo_indptr, group, *, masked=False, graph=False):
    """The q_tokens a prefill plan of these query rows takes: the power of two at or above its
    longest request when that is at most FEW_TOKENS_MAX (speculative-decoding verify, chunked
    decode: the tokens and the group's heads packed into tensor-core rows, each K/V tile read
    once for all of them, decode's bandwidth), else 0 (any length: the prefill families). 0
    also with a custom mask, a group that does not divide 64, in CUDA-graph mode (a captured
    run keeps its kernel while later plans change the lengths) or for an empty batch."""
    if masked or graph or 64 % group or len(qo_indptr) < 2:
        return 0
    if qo_indptr[-1] - qo_indptr[0] > FEW_TOKENS_MAX * (len(qo_indptr) - 1):
        return 0  # more rows than that on average: the longest has more (no walk of B entries)
    torch = sys.modules.get("torch")
    if (type(qo_indptr) is array.array and qo_indptr.itemsize == 4 and len(qo_indptr) > 64
            and torch is not None):
        # an int32 tensor's copy (plan.host_array): one diff and max in torch, 6 us at B256
        # against 15 for the walk in Python (speculative verify: a few rows a request)
        longest = int(torch.diff(torch.frombuffer(qo_indptr, dtype=torch.int32)).max())
    else:
        longest = max(b - a for a, b in zip(qo_indptr, qo_indptr[1:]))
    if longest < 1 or longest > FEW_TOKENS_MAX:
        return 0
    return 1 << (longest - 1).bit_length()


def _paged_run(doc, no_args=""):
    """The run() of the wrappers over a paged KV cache (decode, paged prefill), with doc:
    the C Runner (_hot.py) for tensors checked before, else _BatchWrapper._run."""

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None,
            lse=None, return_lse=False, enable_pdl=None, window_left=None, sinks=None):
        st = self._state
        if (st is not None and st.hot is not None and not args and window_left is None
                and sinks is None):
            r = st.hot(q, paged_kv_cache, out, lse, return_lse, q_scale, k_scale, v_scale)
            if r is not NotImplemented:
                return r
        if args:
            raise TypeError(f"run() takes no extra positional arguments{no_args}, got "
                            f"{len(args)}")
        if sinks is not None:
            raise NotImplementedError("attention sinks are not supported")
        st = self._require_plan()
        kp, vp, kv = self._paged_kv(st, paged_kv_cache)
        return self._run(st, q, kp, vp, kv, out=out, lse=lse, return_lse=return_lse,
                         q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                         window_left=window_left)

    run.__doc__ = doc
    return run


# ---- the wrappers ------------------------------------------------------------------------------


class BatchDecodeWithPagedKVCacheWrapper(_BatchWrapper):
    """Decode for a batch of requests over a paged KV cache: FlashInfer's wrapper of the same
    name. One query row per request (q [B, H, D]); request b owns pages
    indices[indptr[b] .. indptr[b + 1]) of the page pool, the last holding last_page_len[b]
    tokens.

    BatchDecodeWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout="NHD",
    use_cuda_graph=False, use_tensor_cores=False, paged_kv_indptr_buffer=None,
    paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None, backend="auto",
    jit_args=None, *, context=None, lse_base="2"). float_workspace_buffer is a CUDA tensor
    (torch.uint8; 128 MB is FlashInfer's advice and plenty): kiln writes the schedule and the
    split-KV partials there. With use_cuda_graph=True the indices buffer (int32, fixed address)
    receives each plan's page ids and the length of the last_page_len (or indptr) buffer
    bounds the batch; a run captured in a graph replays correctly after any later plan within
    those bounds. use_tensor_cores, backend and jit_args are accepted and ignored. Extra
    keywords: context (a kiln.Context; default: the device's default context), lse_base
    ("2": FlashInfer's base-2 LSE; "e": kiln's natural log).
    """

    _op, _kv = "decode", "paged"
    _q_doc = "[B, H, D]"
    _graph_bufs = ("_paged_kv_indptr_buf", None, "_paged_kv_last_page_len_buf")

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 use_tensor_cores=False, paged_kv_indptr_buffer=None,
                 paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto", jit_args=None, *, context=None, lse_base="2"):
        use_cuda_graph = _check.flag(use_cuda_graph, "use_cuda_graph")
        max_batch = 0
        if use_cuda_graph:
            if paged_kv_indices_buffer is None:
                raise ValueError("use_cuda_graph=True needs paged_kv_indices_buffer (int32, the "
                                 "page ids every captured run reads)")
            if paged_kv_last_page_len_buffer is not None:
                max_batch = _count(paged_kv_last_page_len_buffer)
            elif paged_kv_indptr_buffer is not None:
                max_batch = _count(paged_kv_indptr_buffer) - 1
        self.use_tensor_cores = use_tensor_cores
        # FlashInfer's names for the CUDA-graph buffers (engines read them; None when not given)
        self._paged_kv_indptr_buf = paged_kv_indptr_buffer
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buffer
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph,
                         paged_kv_indices_buffer, max_batch, 0, context, lse_base)

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
             page_size, pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None,
             q_data_type="float16", kv_data_type=None, o_data_type=None, data_type=None,
             sm_scale=None, rope_scale=None, rope_theta=None, non_blocking=True,
             block_tables=None, seq_lens=None, fixed_split_size=None, disable_split_kv=False,
             q_len_per_req=1, *, window_right=0, lse=True):
        """Plan the batch (FlashInfer's arguments). indptr [B + 1], indices [indptr[-1]]
        (int32 page ids), last_page_len [B]: tensors (any device) or lists; indptr and
        last_page_len are copied to the host here, once. q_data_type / kv_data_type /
        o_data_type: torch dtypes or their names; kv may be float8_e4m3fn / float8_e5m2;
        kv_data_type and o_data_type default to q's. data_type (FlashInfer's deprecated alias)
        only fills what is None: q_data_type=None takes it, and so does kv_data_type=None
        (so data_type=fp8 with q_data_type=float16 is fp16 queries over an fp8 cache).
        pos_encoding_mode "NONE" | "ROPE_LLAMA" (RoPE inside the kernel, rope_scale /
        rope_theta) | "ALIBI". fixed_split_size (in pages) cuts every request's keys into
        chunks of that many pages whatever the batch (batch-invariant output);
        disable_split_kv never splits. lse=False (kiln extra) drops the LSE output from the
        kernel. In CUDA-graph mode indptr and last_page_len are also copied into the
        constructor's buffers (FlashInfer's _paged_kv_indptr_buf, _paged_kv_last_page_len_buf),
        the page ids into _paged_kv_indices_buf. After a plan, _pos_encoding_mode, _window_left,
        _logits_soft_cap, _sm_scale, _rope_scale and _rope_theta read back its arguments, as in
        FlashInfer. The positional order is FlashInfer 0.6's (o_data_type before data_type): an
        older order is refused (TypeError). Not supported: block_tables / seq_lens,
        q_len_per_req != 1, window_right != 0 (NotImplementedError)."""
        # the scalar arguments as they came: a plan() with the same ones (values and types) as
        # the last, and int32 tensors for the arrays, is planned in C (kiln/hot.c's replan)
        scalars = (num_qo_heads, num_kv_heads, head_dim, page_size, pos_encoding_mode,
                   window_left, logits_soft_cap, q_data_type, kv_data_type, o_data_type,
                   data_type, sm_scale, rope_scale, rope_theta, non_blocking, block_tables,
                   seq_lens, fixed_split_size, disable_split_kv, q_len_per_req, window_right, lse)
        if self._planned_in_c(None, indptr, indices, last_page_len, scalars):
            return
        if _older_order(data_type, rope_theta, seq_lens, fixed_split_size):
            raise TypeError(
                "BatchDecodeWithPagedKVCacheWrapper.plan(): these positional arguments follow an "
                "older FlashInfer order (data_type 13th, before sm_scale); kiln follows FlashInfer "
                "0.6's positional order (o_data_type 13th, data_type 14th, then sm_scale, "
                "rope_scale, rope_theta, non_blocking, block_tables, seq_lens, fixed_split_size, "
                "disable_split_kv): pass every argument after page_size by keyword")
        if block_tables is not None or seq_lens is not None:
            raise NotImplementedError("block_tables / seq_lens (trtllm-gen's form) are not "
                                      "supported: pass indptr, indices and last_page_len")
        if data_type is not None:  # FlashInfer: the deprecated alias fills only what is None
            if q_data_type is None:
                q_data_type = data_type
            if kv_data_type is None:
                kv_data_type = data_type
        cfg_args = dict(num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                        head_dim=head_dim, page_size=page_size,
                        pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                        logits_soft_cap=logits_soft_cap, q_data_type=q_data_type,
                        kv_data_type=kv_data_type, o_data_type=o_data_type, sm_scale=sm_scale,
                        rope_scale=rope_scale, rope_theta=rope_theta,
                        fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv,
                        q_len_per_req=q_len_per_req, window_right=window_right, lse=lse)
        cfg = self._config(cfg_args)
        kv = host_array(indptr, "indptr")
        check_indptr("indptr", kv[0])
        last = host_array(last_page_len, "last_page_len")
        check_last_page_len("last_page_len", last[0], kv[0], cfg.page_size)
        self._plan_batch(cfg, cfg_args, kv=kv, qo=None, last=last, indices=indices,
                         total_kv=None)
        if self._use_cuda_graph and self._copy_buffers:
            self._fill_graph_buffers(indptr, None, last_page_len)
        self._arm(scalars, None)

    begin_forward = plan

    def _make_config(self, *, num_qo_heads, num_kv_heads, head_dim, page_size,
                     pos_encoding_mode, window_left, logits_soft_cap, q_data_type, kv_data_type,
                     o_data_type, sm_scale, rope_scale, rope_theta, fixed_split_size,
                     disable_split_kv, q_len_per_req, window_right, lse):
        if _check.integer(q_len_per_req, "q_len_per_req") != 1:
            raise NotImplementedError("q_len_per_req > 1: use BatchPrefillWithPagedKVCacheWrapper")
        if _check.integer(window_right, "window_right"):
            raise NotImplementedError("window_right != 0 is not supported")
        if q_data_type is None:
            raise ValueError("q_data_type=None needs data_type (FlashInfer's alias) to say the "
                             "query dtype")
        page_size = _positive_int(page_size, "page_size")
        variant = batch_variant("decode", "paged", num_qo_heads, num_kv_heads, head_dim,
                                kv_layout=self._kv_layout, pos_encoding_mode=pos_encoding_mode,
                                window_left=window_left, logits_soft_cap=logits_soft_cap,
                                q_data_type=q_data_type, kv_data_type=kv_data_type,
                                o_data_type=o_data_type, lse=lse)
        return self._new_config(
            variant=variant, H=int(num_qo_heads), H_KV=int(num_kv_heads), D=int(head_dim),
            page_size=page_size, sm_scale=sm_scale, logits_soft_cap=logits_soft_cap,
            window_left=window_left, rope_scale=rope_scale, rope_theta=rope_theta,
            fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv)

    run = _paged_run(
        """Decode: q [B, H, D]; paged_kv_cache a (k_cache, v_cache) tuple of [pages, page_size,
        H_KV, D] (NHD) / [pages, H_KV, page_size, D] (HND) tensors, or one [pages, 2, ...]
        tensor. Returns o [B, H, D] (and lse [B, H], float32, base 2 unless lse_base="e").
        q_scale multiplies sm_scale; for fp8 KV k_scale / v_scale dequantise inside the
        kernel, otherwise k_scale multiplies sm_scale and v_scale multiplies o (FlashInfer's
        meaning). A tensor scale is read with float(), which synchronises: pass floats inside
        a CUDA graph. enable_pdl is ignored; sinks raise NotImplementedError. A batch without
        any page returns o = 0 (and lse = -inf) without a launch.""",
        " (custom-kernel arguments are not supported)")

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(self, q, paged_kv_cache, pos_encoding_mode="NONE", q_scale=None, k_scale=None,
                v_scale=None, window_left=-1, logits_soft_cap=None, sm_scale=None,
                rope_scale=None, rope_theta=None):
        """Deprecated in FlashInfer (use run()): these attention arguments replace the
        plan()'s, here and for later runs (the batch is planned again when they change it),
        then run()."""
        return self._forward(self.run, dict(
            pos_encoding_mode=pos_encoding_mode, window_left=window_left,
            logits_soft_cap=logits_soft_cap, sm_scale=sm_scale, rope_scale=rope_scale,
            rope_theta=rope_theta), q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale,
            v_scale=v_scale)

    def forward_return_lse(self, q, paged_kv_cache, pos_encoding_mode="NONE", q_scale=None,
                           k_scale=None, v_scale=None, window_left=-1, logits_soft_cap=None,
                           sm_scale=None, rope_scale=None, rope_theta=None):
        """forward() returning (o, lse), as FlashInfer's deprecated method of the name."""
        return self._forward(self.run, dict(
            pos_encoding_mode=pos_encoding_mode, window_left=window_left,
            logits_soft_cap=logits_soft_cap, sm_scale=sm_scale, rope_scale=rope_scale,
            rope_theta=rope_theta), q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale,
            v_scale=v_scale, return_lse=True)


class _PrefillWrapper(_BatchWrapper):
    """What the two prefill wrappers share: their plan() scalar arguments and forward()."""

    _op = "prefill"
    _causal = _PlanValue()
    _use_fp16_qk_reduction = _PlanValue()

    def _make_config(self, *, num_qo_heads, num_kv_heads, head_dim_qk, page_size, head_dim_vo,
                     masked, causal, pos_encoding_mode, use_fp16_qk_reduction, sm_scale,
                     window_left, logits_soft_cap, rope_scale, rope_theta, q_data_type,
                     kv_data_type, o_data_type, fixed_split_size, disable_split_kv, lse,
                     q_tokens=0):
        _refuse_prefill_extras(head_dim_qk, head_dim_vo, {})
        if self._kv == "paged":
            page_size = _positive_int(page_size, "page_size")
        variant = batch_variant("prefill", self._kv, num_qo_heads, num_kv_heads, head_dim_qk,
                                kv_layout=self._kv_layout, causal=causal,
                                pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                                logits_soft_cap=logits_soft_cap, q_data_type=q_data_type,
                                kv_data_type=kv_data_type, o_data_type=o_data_type, lse=lse,
                                mask_data="bitmask" if masked else "none", q_tokens=q_tokens)
        return self._new_config(
            variant=variant, H=int(num_qo_heads), H_KV=int(num_kv_heads), D=int(head_dim_qk),
            page_size=page_size, sm_scale=sm_scale, logits_soft_cap=logits_soft_cap,
            window_left=window_left, rope_scale=rope_scale, rope_theta=rope_theta,
            fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv,
            masked=masked)

    @staticmethod
    def _prefill_scalars(num_qo_heads, num_kv_heads, head_dim_qk, page_size, head_dim_vo,
                         custom_mask, packed_custom_mask, causal, pos_encoding_mode,
                         use_fp16_qk_reduction, sm_scale, window_left, logits_soft_cap,
                         rope_scale, rope_theta, q_data_type, kv_data_type, o_data_type,
                         fixed_split_size, disable_split_kv, lse):
        return dict(num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                    head_dim_qk=head_dim_qk, page_size=page_size, head_dim_vo=head_dim_vo,
                    masked=mask_data_name(custom_mask, packed_custom_mask) != "none",
                    causal=causal, pos_encoding_mode=pos_encoding_mode,
                    use_fp16_qk_reduction=use_fp16_qk_reduction, sm_scale=sm_scale,
                    window_left=window_left, logits_soft_cap=logits_soft_cap,
                    rope_scale=rope_scale, rope_theta=rope_theta, q_data_type=q_data_type,
                    kv_data_type=kv_data_type, o_data_type=o_data_type,
                    fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv,
                    lse=lse)

    def _few_tokens(self, scalars, qo, q_tokens):
        """scalars with the plan's q_tokens: few_tokens' choice (q_tokens=None), or the
        caller's (0: the prefill families whatever the lengths)."""
        if q_tokens is None:
            H, H_KV = scalars["num_qo_heads"], scalars["num_kv_heads"]
            ok = isinstance(H, int) and isinstance(H_KV, int) and H > 0 and H_KV > 0 and H % H_KV == 0
            # heads the config refuses: 0 here, and _make_config names the argument
            q_tokens = few_tokens(qo, H // H_KV, masked=scalars["masked"],
                                  graph=self._use_cuda_graph) if ok else 0
        scalars["q_tokens"] = _check.integer(q_tokens, "q_tokens")
        return scalars

    @staticmethod
    def _forward_changes(causal, pos_encoding_mode, use_fp16_qk_reduction, window_left,
                         logits_soft_cap, sm_scale, rope_scale, rope_theta):
        return dict(causal=causal, pos_encoding_mode=pos_encoding_mode,
                    use_fp16_qk_reduction=use_fp16_qk_reduction, window_left=window_left,
                    logits_soft_cap=logits_soft_cap, sm_scale=sm_scale, rope_scale=rope_scale,
                    rope_theta=rope_theta)


class BatchPrefillWithPagedKVCacheWrapper(_PrefillWrapper):
    """Prefill / append for a batch over a paged KV cache: FlashInfer's wrapper of the same
    name. Request b has query rows qo_indptr[b] .. qo_indptr[b + 1] of q [total_qo, H, D] and
    the pages of paged_kv_indices[paged_kv_indptr[b] .. paged_kv_indptr[b + 1]); with causal
    (bottom-right aligned) and the request's new tokens already in its last pages this is
    "append".

    BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout="NHD",
    use_cuda_graph=False, qo_indptr_buf=None, paged_kv_indptr_buf=None,
    paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None, custom_mask_buf=None,
    mask_indptr_buf=None, backend="auto", jit_args=None, jit_kwargs=None, *, context=None,
    lse_base="2", max_qo_tokens=None). In CUDA-graph mode the length of qo_indptr_buf (or
    paged_kv_last_page_len_buf) bounds the batch and the first plan's query rows bound later
    plans (as in FlashInfer) unless max_qo_tokens is given.
    """

    _kv = "paged"
    _graph_bufs = ("_paged_kv_indptr_buf", "_qo_indptr_buf", "_paged_kv_last_page_len_buf")

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 qo_indptr_buf=None, paged_kv_indptr_buf=None, paged_kv_indices_buf=None,
                 paged_kv_last_page_len_buf=None, custom_mask_buf=None, mask_indptr_buf=None,
                 backend="auto", jit_args=None, jit_kwargs=None, *, context=None,
                 lse_base="2", max_qo_tokens=None):
        if custom_mask_buf is not None or mask_indptr_buf is not None:
            raise NotImplementedError("custom_mask_buf / mask_indptr_buf: custom masks are not "
                                      "supported in CUDA-graph mode (pass custom_mask to plan() "
                                      "without use_cuda_graph)")
        use_cuda_graph = _check.flag(use_cuda_graph, "use_cuda_graph")
        max_batch = 0
        if use_cuda_graph:
            if paged_kv_indices_buf is None:
                raise ValueError("use_cuda_graph=True needs paged_kv_indices_buf (int32, the "
                                 "page ids every captured run reads)")
            if qo_indptr_buf is not None:
                max_batch = _count(qo_indptr_buf) - 1
            elif paged_kv_last_page_len_buf is not None:
                max_batch = _count(paged_kv_last_page_len_buf)
        # FlashInfer's names for the CUDA-graph buffers (engines read them; None when not given)
        self._qo_indptr_buf = qo_indptr_buf
        self._paged_kv_indptr_buf = paged_kv_indptr_buf
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buf
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph,
                         paged_kv_indices_buf, max_batch, max_qo_tokens, context, lse_base)

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
             num_qo_heads, num_kv_heads, head_dim_qk, page_size, head_dim_vo=None,
             custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None,
             rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
             o_data_type=None, non_blocking=True, *, fixed_split_size=None,
             disable_split_kv=False, lse=True, q_tokens=None, **unsupported):
        """Plan the batch (FlashInfer's arguments; see BatchDecodeWithPagedKVCacheWrapper.plan
        for the shared ones). q_tokens (kiln's): None picks kiln.batch.few_tokens (requests of
        at most 16 query tokens take the packed rows at decode's bandwidth), 0 the prefill
        families, 1 | 2 | 4 | 8 | 16 that bound (a longer request is refused). qo_indptr [B + 1] rows; causal is bottom-right aligned per
        request. custom_mask (bool, the requests' [qo_len, kv_len] masks flattened back to back)
        or packed_custom_mask (FlashInfer's segment_packbits of it, bitorder "little": each
        request from a byte boundary) AND with causal and the window; not in CUDA-graph mode.
        head_dim_vo must equal head_dim_qk; FlashInfer's other keywords (prefix_len_ptr,
        seq_lens, block_tables, ...) raise NotImplementedError;
        use_fp16_qk_reduction is ignored (kiln accumulates in fp32)."""
        given = (num_qo_heads, num_kv_heads, head_dim_qk, page_size, head_dim_vo, custom_mask,
                 packed_custom_mask, causal, pos_encoding_mode, use_fp16_qk_reduction, sm_scale,
                 window_left, logits_soft_cap, rope_scale, rope_theta, q_data_type,
                 kv_data_type, o_data_type, non_blocking, fixed_split_size, disable_split_kv,
                 lse, q_tokens)
        if not unsupported and self._planned_in_c(
                qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, given):
            return
        if unsupported:
            _refuse_prefill_extras(head_dim_qk, head_dim_vo, unsupported)
        scalars = self._prefill_scalars(
            num_qo_heads, num_kv_heads, head_dim_qk, page_size, head_dim_vo, custom_mask,
            packed_custom_mask, causal, pos_encoding_mode, use_fp16_qk_reduction, sm_scale,
            window_left, logits_soft_cap, rope_scale, rope_theta, q_data_type, kv_data_type,
            o_data_type, fixed_split_size, disable_split_kv, lse)
        qo = host_array(qo_indptr, "qo_indptr")
        check_indptr("qo_indptr", qo[0])
        cfg = self._config(self._few_tokens(scalars, qo[0], q_tokens))
        kv = host_array(paged_kv_indptr, "paged_kv_indptr")
        check_indptr("paged_kv_indptr", kv[0], len(qo[0]) - 1)
        last = host_array(paged_kv_last_page_len, "paged_kv_last_page_len")
        check_last_page_len("paged_kv_last_page_len", last[0], kv[0], cfg.page_size)
        self._plan_batch(cfg, scalars, kv=kv, qo=qo, last=last, indices=paged_kv_indices,
                         total_kv=None, custom_mask=custom_mask,
                         packed_custom_mask=packed_custom_mask)
        if self._use_cuda_graph:
            self._fill_graph_buffers(paged_kv_indptr, qo_indptr, paged_kv_last_page_len)
        self._arm(given, scalars, q_tokens)

    begin_forward = plan

    run = _paged_run(
        """Prefill: q [total_qo, H, D]; paged_kv_cache as for batch decode. Returns o
        [total_qo, H, D] (and lse [total_qo, H]); scales as in batch decode.""")

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(self, q, paged_kv_cache, causal=False, pos_encoding_mode="NONE",
                use_fp16_qk_reduction=False, k_scale=None, v_scale=None, window_left=-1,
                logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None):
        """Deprecated in FlashInfer (use run()): these attention arguments replace the
        plan()'s, here and for later runs (the batch is planned again when they change it),
        then run()."""
        return self._forward(self.run, self._forward_changes(
            causal, pos_encoding_mode, use_fp16_qk_reduction, window_left, logits_soft_cap,
            sm_scale, rope_scale, rope_theta), q, paged_kv_cache, k_scale=k_scale,
            v_scale=v_scale)

    def forward_return_lse(self, q, paged_kv_cache, causal=False, pos_encoding_mode="NONE",
                           use_fp16_qk_reduction=False, k_scale=None, v_scale=None,
                           window_left=-1, logits_soft_cap=None, sm_scale=None,
                           rope_scale=None, rope_theta=None):
        """forward() returning (o, lse), as FlashInfer's deprecated method of the name."""
        return self._forward(self.run, self._forward_changes(
            causal, pos_encoding_mode, use_fp16_qk_reduction, window_left, logits_soft_cap,
            sm_scale, rope_scale, rope_theta), q, paged_kv_cache, k_scale=k_scale,
            v_scale=v_scale, return_lse=True)


class BatchPrefillWithRaggedKVCacheWrapper(_PrefillWrapper):
    """Prefill for a batch whose keys and values are one ragged tensor: FlashInfer's wrapper
    of the same name. Request b has query rows qo_indptr[b] .. qo_indptr[b + 1] of q and key
    rows kv_indptr[b] .. kv_indptr[b + 1] of k, v [total_kv, H_KV, D] (NHD) or
    [H_KV, total_kv, D] (HND).

    BatchPrefillWithRaggedKVCacheWrapper(float_workspace_buffer, kv_layout="NHD",
    use_cuda_graph=False, qo_indptr_buf=None, kv_indptr_buf=None, custom_mask_buf=None,
    mask_indptr_buf=None, backend="auto", jit_args=None, jit_kwargs=None, *, context=None,
    lse_base="2", max_qo_tokens=None).
    """

    _kv = "ragged"
    _graph_bufs = ("_kv_indptr_buf", "_qo_indptr_buf", None)

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 qo_indptr_buf=None, kv_indptr_buf=None, custom_mask_buf=None,
                 mask_indptr_buf=None, backend="auto", jit_args=None, jit_kwargs=None, *,
                 context=None, lse_base="2", max_qo_tokens=None):
        if custom_mask_buf is not None or mask_indptr_buf is not None:
            raise NotImplementedError("custom_mask_buf / mask_indptr_buf: custom masks are not "
                                      "supported in CUDA-graph mode (pass custom_mask to plan() "
                                      "without use_cuda_graph)")
        use_cuda_graph = _check.flag(use_cuda_graph, "use_cuda_graph")
        max_batch = 0
        if use_cuda_graph:
            buf = qo_indptr_buf if qo_indptr_buf is not None else kv_indptr_buf
            max_batch = _count(buf) - 1 if buf is not None else 0
        self._qo_indptr_buf, self._kv_indptr_buf = qo_indptr_buf, kv_indptr_buf  # FlashInfer's
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, None, max_batch,
                         max_qo_tokens, context, lse_base)

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk,
             head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal=False,
             pos_encoding_mode="NONE", use_fp16_qk_reduction=False, window_left=-1,
             logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None,
             q_data_type="float16", kv_data_type=None, o_data_type=None, non_blocking=True, *,
             fixed_split_size=None, disable_split_kv=False, lse=True, q_tokens=None,
             **unsupported):
        """Plan the batch (FlashInfer's arguments). qo_indptr, kv_indptr [B + 1] row offsets,
        copied to the host once. fixed_split_size is in tokens here (no pages). q_tokens as in
        BatchPrefillWithPagedKVCacheWrapper.plan."""
        given = (num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, custom_mask,
                 packed_custom_mask, causal, pos_encoding_mode, use_fp16_qk_reduction,
                 window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta, q_data_type,
                 kv_data_type, o_data_type, non_blocking, fixed_split_size, disable_split_kv,
                 lse, q_tokens)
        if not unsupported and self._planned_in_c(qo_indptr, kv_indptr, None, None, given):
            return
        if unsupported:
            _refuse_prefill_extras(head_dim_qk, head_dim_vo, unsupported)
        scalars = self._prefill_scalars(
            num_qo_heads, num_kv_heads, head_dim_qk, 1, head_dim_vo, custom_mask,
            packed_custom_mask, causal, pos_encoding_mode, use_fp16_qk_reduction, sm_scale,
            window_left, logits_soft_cap, rope_scale, rope_theta, q_data_type, kv_data_type,
            o_data_type, fixed_split_size, disable_split_kv, lse)
        qo = host_array(qo_indptr, "qo_indptr")
        check_indptr("qo_indptr", qo[0])
        cfg = self._config(self._few_tokens(scalars, qo[0], q_tokens))
        kv = host_array(kv_indptr, "kv_indptr")
        check_indptr("kv_indptr", kv[0], len(qo[0]) - 1)
        self._plan_batch(cfg, scalars, kv=kv, qo=qo, last=None, indices=None,
                         total_kv=kv[0][-1], custom_mask=custom_mask,
                         packed_custom_mask=packed_custom_mask)
        if self._use_cuda_graph:
            self._fill_graph_buffers(kv_indptr, qo_indptr, None)
        self._arm(given, scalars, q_tokens)

    begin_forward = plan

    def run(self, q, k, v, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None):
        """Prefill: q [total_qo, H, D]; k, v [total_kv, H_KV, D] (NHD) or [H_KV, total_kv, D]
        (HND). Returns o [total_qo, H, D] (and lse [total_qo, H])."""
        st = self._state
        if st is not None and st.hot is not None and not args:  # the C Runner (_hot.py)
            r = st.hot(q, (k, v), out, lse, return_lse, q_scale, k_scale, v_scale)
            if r is not NotImplemented:
                return r
        if args:
            raise TypeError(f"run() takes no extra positional arguments, got {len(args)}")
        st = self._require_plan()
        cfg = st.cfg
        try:
            key = (_meta(k), _meta(v))
            kp, vp = k.data_ptr(), v.data_ptr()
        except AttributeError:
            key = kp = vp = None
        info = cfg.seen_kv.get(key)
        if info is None or info[7] < st.total_kv:
            info = _remember(cfg.seen_kv, key, self._ragged_info(st, k, v))
        return self._run(st, q, kp, vp, info, out=out, lse=lse, return_lse=return_lse,
                         q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, window_left=None)

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def _ragged_info(self, st, k, v):
        cfg, torch = st.cfg, self._torch
        nhd = self._kv_layout == "NHD"
        n_dim, h_dim = (0, 1) if nhd else (1, 0)
        for name, t in (("k", k), ("v", v)):
            _check_tensor(torch, name, t, 3, self.device, cfg.kv_dtype)
            if t.size(h_dim) != cfg.H_KV or t.size(2) != cfg.D or t.size(n_dim) < st.total_kv:
                doc = "[total_kv, H_KV, D]" if nhd else "[H_KV, total_kv, D]"
                raise ValueError(f"{name} must be {doc} with H_KV={cfg.H_KV}, D={cfg.D} and at "
                                 f"least {st.total_kv} rows, got {tuple(t.shape)}")
        return (0, _stride(k, n_dim), _stride(k, h_dim), 0, _stride(v, n_dim), _stride(v, h_dim),
                None, min(k.size(n_dim), v.size(n_dim)))

    def forward(self, q, k, v, causal=False, pos_encoding_mode="NONE",
                use_fp16_qk_reduction=False, window_left=-1, logits_soft_cap=None,
                sm_scale=None, rope_scale=None, rope_theta=None):
        """Deprecated in FlashInfer (use run()): these attention arguments replace the
        plan()'s, here and for later runs (the batch is planned again when they change it),
        then run()."""
        return self._forward(self.run, self._forward_changes(
            causal, pos_encoding_mode, use_fp16_qk_reduction, window_left, logits_soft_cap,
            sm_scale, rope_scale, rope_theta), q, k, v)

    def forward_return_lse(self, q, k, v, causal=False, pos_encoding_mode="NONE",
                           use_fp16_qk_reduction=False, window_left=-1, logits_soft_cap=None,
                           sm_scale=None, rope_scale=None, rope_theta=None):
        """forward() returning (o, lse), as FlashInfer's deprecated method of the name."""
        return self._forward(self.run, self._forward_changes(
            causal, pos_encoding_mode, use_fp16_qk_reduction, window_left, logits_soft_cap,
            sm_scale, rope_scale, rope_theta), q, k, v, return_lse=True)


def _older_order(data_type, rope_theta, seq_lens, fixed_split_size):
    """Whether decode plan() arguments look shifted by an older FlashInfer positional order
    (vLLM's 21: data_type 13th, so sm_scale lands on data_type, non_blocking on rope_theta,
    fixed_split_size on seq_lens, disable_split_kv on fixed_split_size)."""
    def number(x):
        return isinstance(x, (bool, int, float))

    return (number(data_type) or isinstance(rope_theta, bool) or number(seq_lens)
            or isinstance(fixed_split_size, bool))


# FlashInfer prefill plan() keywords kiln has no use for: refused unless None / 0 / False.
_FLASHINFER_PREFILL_EXTRAS = frozenset((
    "prefix_len_ptr", "token_pos_in_items_ptr", "token_pos_in_items_len", "max_item_len_ptr",
    "seq_lens", "seq_lens_q", "block_tables", "max_token_per_sequence", "max_sequence_kv",
    "v_indptr", "o_indptr",
))


def _refuse_prefill_extras(head_dim_qk, head_dim_vo, extra):
    head_dim_vo = _check.integer(head_dim_vo, "head_dim_vo", none=True)
    if head_dim_vo is not None and head_dim_vo != head_dim_qk:
        raise NotImplementedError(f"head_dim_vo={head_dim_vo} != head_dim_qk={head_dim_qk}: "
                                  "kiln's kernels have one head dim")
    unknown = sorted(set(extra) - _FLASHINFER_PREFILL_EXTRAS)
    if unknown:
        raise TypeError(f"plan() got unexpected keyword arguments: {', '.join(unknown)}")
    given = sorted(k for k, v in extra.items()
                   if v is not None and not (isinstance(v, (bool, int)) and not v))
    if given:
        raise NotImplementedError(f"plan() arguments kiln does not support: {', '.join(given)}")
