"""sparse.py — FlashInfer's block-sparse attention wrappers: BlockSparseAttentionWrapper and
VariableBlockSparseAttentionWrapper.

BlockSparseAttentionWrapper: one request, q [M, H, D] against k, v [N, H_KV, D]; the mask is a
BSR matrix of R x C blocks (block row r lists its column blocks in
indices[indptr[r] .. indptr[r + 1])). FlashInfer runs it as a paged prefill: block row r is a
request of R query rows whose pages are its listed column blocks (page_size C), so causal,
RoPE and ALiBi positions are those of the *gathered* keys. kiln takes two routes:
  - plain (not causal, no per-block mask, no position encoding): one single-request prefill
    with kiln's BSR mask data (mask_data=bsr) and a tile map from kiln_prefill_tile_map, so
    unlisted blocks are skipped; the visible keys are exactly FlashInfer's;
  - causal, mask / packed_mask, ROPE_LLAMA, ALIBI: FlashInfer's own mapping onto
    BatchPrefillWithPagedKVCacheWrapper (which reproduces its gathered-position semantics;
    kiln's single-request causal would be the global one instead).
VariableBlockSparseAttentionWrapper: per-KV-head masks with variable block sizes, q [H, L_Q, D],
k, v [H_KV, L_KV, D]. kiln's BSR has one block shape and one pattern for all heads, so this
wrapper uses FlashInfer's mapping too: every (KV head, block row) is a request of one head
group over the tokens of its selected column blocks, gathered as pages of one token.
"""

import math

from . import _check, _lib
from .attention import default_context
from .batch import BatchPrefillWithPagedKVCacheWrapper, batch_variant, dtype_word
from .core import Context
from .page import _torch

_BACKENDS = ("auto", "fa2", "fa3")  # FlashInfer's generic backends: kiln picks its own kernel


def _backend(backend):
    _check.text(backend, "backend")
    if backend not in _BACKENDS:
        raise NotImplementedError(f"backend={backend!r}: kiln has no {backend} backend (auto, "
                                  "fa2 and fa3 are accepted and mean kiln's own kernels)")
    return backend


def _workspace(buf):
    if buf is None or not hasattr(buf, "data_ptr") or not hasattr(buf, "device"):
        raise TypeError("float_workspace_buffer must be a CUDA tensor (torch.uint8 is usual), "
                        f"not {type(buf).__name__}")
    return buf


def _host(values, name):
    if values is None:
        raise ValueError(f"{name} is required (the BSR arrays of the mask)")
    if hasattr(values, "tolist"):
        if hasattr(values, "detach"):
            values = values.detach().cpu()
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a 1-D sequence of integers")
    return [_check.integer(v, f"{name}[{i}]") for i, v in enumerate(values)]


def _check_qkv(torch, name, t, shape, dtype, device):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must be {tuple(shape)}, got {tuple(t.shape)}")
    if t.dtype != dtype or t.device != device:
        raise ValueError(f"{name} is {t.dtype} on {t.device}; the plan says {dtype} on {device}")
    if t.numel() and (t.stride(-1) != 1 or t.data_ptr() % 16 or any(
            t.size(d) > 1 and (t.stride(d) * t.element_size()) % 16 for d in range(t.dim() - 1))):
        raise ValueError(f"{name}: the last dim must be contiguous, the data 16-byte aligned and "
                         f"the other strides multiples of 16 bytes (strides {t.stride()})")


def _stride(t, d):
    return t.stride(d) if t.size(d) > 1 else 0  # 0: the dense default


def _refuse_vsa(**extras):
    given = sorted(k for k, v in extras.items() if v is not None)
    if given:
        raise ValueError(f"{', '.join(given)}: only FlashInfer's VSA / cake backends take these; "
                         "kiln has neither (use indptr / indices)")


class _BsrState:
    """The plain route's plan: the kernel, the BSR arrays and tile map on the device."""

    __slots__ = ("kernel", "indptr", "indices", "tile_map", "sm_scale", "softcap")


class BlockSparseAttentionWrapper:
    """FlashInfer's BlockSparseAttentionWrapper(float_workspace_buffer, backend="auto", *,
    context=None, lse_base="2"). plan(indptr, indices, M, N, R, C, num_qo_heads, num_kv_heads,
    head_dim, mask=None, packed_mask=None, causal=False, pos_encoding_mode="NONE", ...,
    o_data_type="float16") then run(q [M, H, D], k [N, H_KV, D], v) -> o [M, H, D] in
    o_data_type (FlashInfer's default float16, whatever q is), and lse [M, H] (base 2 unless
    lse_base="e") with return_lse=True. N must be a multiple of C; indptr has ceil(M / R) + 1
    entries. mask (bool [nnz, R, C]) or packed_mask (FlashInfer's segment_packbits of it,
    bitorder "little") replaces causal, as in FlashInfer."""

    def __init__(self, float_workspace_buffer, backend="auto", *, context=None, lse_base="2"):
        self._backend = _backend(backend)
        self._context = _check.instance(context, "context", Context, none=True)
        self._lse_base = _check.choice(lse_base, "lse_base", ("2", "e"))
        self._set_workspace(float_workspace_buffer)
        self._paged = None  # BatchPrefillWithPagedKVCacheWrapper of the paged route
        self._bsr = None  # _BsrState of the plain route
        self._shape = None  # (M, N, R, C, H, H_KV, D, q dtype, kv dtype, o dtype)
        self.M = self.N = self.R = self.C = None

    def _set_workspace(self, buf):
        self._float_workspace_buffer = _workspace(buf)
        self.device = buf.device

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None):
        """Use another float workspace (plan again afterwards); the int buffer is ignored."""
        self._set_workspace(float_workspace_buffer)
        self._paged = None
        self._shape = None

    def plan(self, indptr, indices, M, N, R, C, num_qo_heads, num_kv_heads, head_dim, mask=None,
             packed_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, logits_soft_cap=None, sm_scale=None, rope_scale=None,
             rope_theta=None, q_data_type="float16", kv_data_type=None,
             o_data_type="float16", non_blocking=True, block_mask=None, kv_block_lens=None,
             q2k_indices=None, q2k_num=None, kv_splits=None, use_clc=None, q_scale=None,
             k_scale=None, v_scale=None):
        """Plan the block-sparse attention (FlashInfer's arguments; the VSA / cake ones raise
        ValueError, use_fp16_qk_reduction and non_blocking are ignored). Copies indptr and
        indices to the host once and checks them: each index in [0, N / C), no block listed
        twice in a row (FlashInfer would count its keys twice)."""
        _refuse_vsa(block_mask=block_mask, kv_block_lens=kv_block_lens, q2k_indices=q2k_indices,
                    q2k_num=q2k_num, kv_splits=kv_splits, use_clc=use_clc, q_scale=q_scale,
                    k_scale=k_scale, v_scale=v_scale)
        self._shape = None
        M = _check.integer(M, "M", 0, _check.INT_MAX)
        N = _check.integer(N, "N", 0, _check.INT_MAX)
        R = _check.integer(R, "R", 1, _check.INT_MAX)
        C = _check.integer(C, "C", 1, _check.INT_MAX)
        causal = _check.flag(causal, "causal")
        if N % C:
            raise ValueError(f"N={N} must be a multiple of C={C} (FlashInfer views k as "
                             f"[N / C, C, H_KV, D] pages)")
        masked = mask is not None or packed_mask is not None
        mode = str(pos_encoding_mode).upper() if isinstance(pos_encoding_mode, str) else None
        paged = causal or masked or mode != "NONE"
        # the variant's checks (heads, dtypes, soft-cap, position encoding) before any copy
        variant = batch_variant("prefill", "paged", num_qo_heads, num_kv_heads, head_dim,
                                pos_encoding_mode=pos_encoding_mode,
                                logits_soft_cap=logits_soft_cap, q_data_type=q_data_type,
                                kv_data_type=kv_data_type, o_data_type=o_data_type)
        if variant.kv_dtype != variant.q_dtype:
            raise NotImplementedError(f"kv_data_type={kv_data_type} differs from q_data_type: "
                                      "block-sparse fp8 KV (FlashInfer's fa3 path) is not "
                                      "supported")
        ptr = _host(indptr, "indptr")
        cols = _host(indices, "indices")
        MB, NB = -(-M // R), N // C
        rows = self._check_bsr(ptr, cols, MB, NB)
        torch = _torch()
        if paged:
            self._plan_paged(torch, ptr, indices, M, R, C, num_qo_heads, num_kv_heads, head_dim,
                             mask, packed_mask, causal and not masked, pos_encoding_mode,
                             logits_soft_cap, sm_scale, rope_scale, rope_theta, q_data_type,
                             kv_data_type, o_data_type)
            self._bsr = None
        else:
            self._plan_bsr(torch, rows, M, N, R, C, int(num_qo_heads), variant, sm_scale,
                           logits_soft_cap)
        self.M, self.N, self.R, self.C = M, N, R, C
        self._shape = (M, N, int(num_qo_heads), int(num_kv_heads), int(head_dim),
                       variant.q_dtype, variant.out_dtype)

    begin_forward = plan

    @staticmethod
    def _check_bsr(ptr, cols, MB, NB):
        """The rows' sorted column blocks; ValueError naming the row and the value."""
        if len(ptr) != MB + 1:
            raise ValueError(f"indptr has {len(ptr)} entries; M / R rounded up is {MB} block "
                             f"rows, so {MB + 1}")
        if ptr[0] != 0:
            raise ValueError(f"indptr[0] = {ptr[0]}: must be 0")
        if ptr[-1] > len(cols):
            raise ValueError(f"indptr[-1] = {ptr[-1]}, but indices has {len(cols)} entries")
        rows = []
        for r in range(MB):
            if ptr[r + 1] < ptr[r]:
                raise ValueError(f"indptr[{r + 1}] = {ptr[r + 1]} < indptr[{r}] = {ptr[r]}")
            row = sorted(cols[ptr[r]:ptr[r + 1]])
            for a, b in zip(row, row[1:]):
                if a == b:
                    raise ValueError(f"block row {r} lists column block {a} twice")
            if row and (row[0] < 0 or row[-1] >= NB):
                raise ValueError(f"block row {r}: column block {row[0] if row[0] < 0 else row[-1]}"
                                 f" is outside [0, N / C = {NB})")
            rows.append(row)
        return rows

    def _plan_paged(self, torch, ptr, indices, M, R, C, H, H_KV, D, mask, packed_mask, causal,
                    pos_encoding_mode, logits_soft_cap, sm_scale, rope_scale, rope_theta,
                    q_data_type, kv_data_type, o_data_type):
        """FlashInfer's mapping: block row r -> request of rows [r R, min((r + 1) R, M)) over
        the pages indices[indptr[r] .. indptr[r + 1]) of page_size C, full last pages."""
        MB = len(ptr) - 1
        qo = [min(r * R, M) for r in range(MB)] + [M]
        custom = None
        if packed_mask is None and mask is not None:
            custom = self._request_masks(torch, mask, ptr, qo, R, C)
        if self._paged is None:
            self._paged = BatchPrefillWithPagedKVCacheWrapper(
                self._float_workspace_buffer, "NHD", context=self._context,
                lse_base=self._lse_base)
        dev_indices = indices
        if not isinstance(indices, torch.Tensor):
            dev_indices = torch.tensor(indices, dtype=torch.int32, device=self.device)
        self._paged.plan(qo, ptr, dev_indices, [C] * MB, H, H_KV, D, C, custom_mask=custom,
                         packed_custom_mask=packed_mask, causal=causal,
                         pos_encoding_mode=pos_encoding_mode, sm_scale=sm_scale,
                         logits_soft_cap=logits_soft_cap, rope_scale=rope_scale,
                         rope_theta=rope_theta, q_data_type=q_data_type,
                         kv_data_type=kv_data_type, o_data_type=o_data_type)

    def _request_masks(self, torch, mask, ptr, qo, R, C):
        """FlashInfer's mask [nnz, R, C] as the requests' [qo_len, nnz_r * C] masks flattened
        back to back (block row r's blocks side by side; a short last block row keeps its
        first qo_len rows)."""
        nnz = ptr[-1]
        if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != (nnz, R, C):
            raise ValueError(f"mask must be a bool tensor [nnz, R, C] = [{nnz}, {R}, {C}], got "
                             f"{getattr(mask, 'shape', type(mask).__name__)}")
        m = mask.to(device=self.device, dtype=torch.bool)
        parts = []
        for r in range(len(ptr) - 1):
            rows = qo[r + 1] - qo[r]
            blocks = m[ptr[r]:ptr[r + 1]]  # [nnz_r, R, C]
            parts.append(blocks.transpose(0, 1).reshape(R, -1)[:rows].reshape(-1))
        return torch.cat(parts) if parts else m.new_zeros(0)

    def _plan_bsr(self, torch, rows, M, N, R, C, H, variant, sm_scale, logits_soft_cap):
        """The plain route: the BSR arrays on the device and the tile map of this pattern."""
        from .core import Variant

        if getattr(self.device, "type", None) != "cuda":
            raise ValueError(f"float_workspace_buffer must be a CUDA tensor, got one on "
                             f"{self.device}")
        v = Variant(op="prefill", q_dtype=variant.q_dtype, kv_dtype=variant.kv_dtype,
                    out_dtype=variant.out_dtype, head_dim=variant.head_dim,
                    group=variant.group, layout="nhd", mask="none", window=False,
                    logits=variant.logits, lse=True, mask_data="bsr")
        ctx = self._context if self._context is not None else default_context(self.device)
        st = _BsrState()
        scale = (1.0 / math.sqrt(variant.head_dim)) if sm_scale is None else _check.real(
            sm_scale, "sm_scale")
        if not scale > 0 or math.isinf(scale):
            raise ValueError(f"sm_scale={sm_scale}: must be a finite value > 0")
        st.sm_scale = scale
        st.softcap = float(logits_soft_cap or 0.0)
        ptr = [0]
        for row in rows:
            ptr.append(ptr[-1] + len(row))
        flat = [c for row in rows for c in row]
        st.indptr = torch.tensor(ptr, dtype=torch.int32, device=self.device)
        st.indices = torch.tensor(flat or [0], dtype=torch.int32, device=self.device)
        st.tile_map = None
        with torch.cuda.device(self.device):
            st.kernel = ctx.kernel(v)
            if M and N:
                nbytes = st.kernel.prefill_mask_plan_size(M, N)
                st.tile_map = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=self.device)
                a = self._bsr_args(st, H, M, N, R, C)
                # the tile-map kernel reads the mask data only; q, k, v, o and lse must be
                # non-zero for the shared launch checks, so the workspace stands in for them
                ws = self._float_workspace_buffer.data_ptr()
                a.q = a.k = a.v = a.o = a.lse = ws
                st.kernel.prefill_mask_plan(a, torch.cuda.current_stream(self.device).cuda_stream)
        self._bsr = st

    def _bsr_args(self, st, H, M, N, R, C):
        a = _lib.kiln_attn_args()
        a.num_qo_heads, a.qo_len, a.kv_len = H, M, N
        a.bsr_indptr, a.bsr_indices = st.indptr.data_ptr(), st.indices.data_ptr()
        a.bsr_r, a.bsr_c = R, C
        if st.tile_map is not None:
            a.tile_map, a.tile_map_bytes = st.tile_map.data_ptr(), st.tile_map.numel()
        a.params.sm_scale = st.sm_scale
        a.params.softcap = st.softcap
        a.params.lse_base2 = int(self._lse_base == "2")  # the kernel writes the LSE in this base
        return a

    def forward(self, q, k, v, scale_q=None, scale_k=None, scale_v=None,
                pos_encoding_mode="NONE", use_fp16_qk_reduction=False, logits_soft_cap=None,
                sm_scale=None, rope_scale=None, rope_theta=None):
        """FlashInfer's deprecated forward(): its arguments must match the plan (in kiln they
        belong to the plan); then run()."""
        if str(pos_encoding_mode).upper() != "NONE" or logits_soft_cap or sm_scale is not None \
                or rope_scale is not None or rope_theta is not None:
            raise NotImplementedError("forward() with pos_encoding_mode / logits_soft_cap / "
                                      "sm_scale / rope_*: pass them to plan() (kiln builds the "
                                      "kernel from them there), then call run()")
        return self.run(q, k, v, scale_q, scale_k, scale_v)

    def run(self, q, k, v, scale_q=None, scale_k=None, scale_v=None, out=None, lse=None,
            return_lse=False, enable_pdl=None):
        """q [M, H, D], k, v [N, H_KV, D] (the planned dtypes). Returns o [M, H, D] (o_data_type)
        and, with return_lse, lse [M, H] float32. enable_pdl is ignored; fp8 scales
        (scale_q / scale_k / scale_v) raise NotImplementedError."""
        if scale_q is not None or scale_k is not None or scale_v is not None:
            raise NotImplementedError("scale_q / scale_k / scale_v (fp8 block-sparse, "
                                      "FlashInfer's fa3 path) are not supported")
        return_lse = _check.flag(return_lse, "return_lse")
        if self._shape is None:
            raise RuntimeError("BlockSparseAttentionWrapper: call plan() before run()")
        M, N, H, H_KV, D, qd, od = self._shape
        torch = _torch()
        words = {"f16": torch.float16, "bf16": torch.bfloat16}
        _check_qkv(torch, "q", q, (M, H, D), words[qd], self.device)
        _check_qkv(torch, "k", k, (N, H_KV, D), words[qd], self.device)
        _check_qkv(torch, "v", v, (N, H_KV, D), words[qd], self.device)
        if self._bsr is None:
            pages = (k.view(N // self.C, self.C, H_KV, D), v.view(N // self.C, self.C, H_KV, D))
            return self._paged.run(q, pages, out=out, lse=lse, return_lse=return_lse)
        return self._run_bsr(torch, q, k, v, out, lse, return_lse, words[od])

    def _run_bsr(self, torch, q, k, v, out, lse, return_lse, o_dtype):
        M, N, H = self._shape[0], self._shape[1], self._shape[2]
        if out is None:
            out = torch.empty((M, H, q.size(2)), dtype=o_dtype, device=self.device)
        else:
            _check_qkv(torch, "out", out, (M, H, q.size(2)), o_dtype, self.device)
        if lse is None:
            lse = torch.empty((M, H), dtype=torch.float32, device=self.device)
        elif (not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (M, H)
              or lse.dtype != torch.float32 or lse.device != self.device
              or not lse.is_contiguous()):
            raise ValueError(f"lse must be a contiguous float32 tensor {(M, H)} on {self.device}")
        if M == 0:
            return (out, lse) if return_lse else out
        if N == 0:  # no key at all: every row sees nothing
            out.zero_()
            lse.fill_(float("-inf"))
            return (out, lse) if return_lse else out
        st = self._bsr
        a = self._bsr_args(st, H, M, N, self.R, self.C)
        a.q, a.k, a.v, a.o, a.lse = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                                     lse.data_ptr())
        a.q_stride_n, a.q_stride_h = _stride(q, 0), _stride(q, 1)
        a.o_stride_n, a.o_stride_h = _stride(out, 0), _stride(out, 1)
        a.k_stride_n, a.k_stride_h = _stride(k, 0), _stride(k, 1)
        a.v_stride_n, a.v_stride_h = _stride(v, 0), _stride(v, 1)
        with torch.cuda.device(self.device):
            st.kernel.single_prefill(a, torch.cuda.current_stream(self.device).cuda_stream)
        return (out, lse) if return_lse else out

    def end_forward(self):
        """Nothing to release (FlashInfer's old API)."""


class VariableBlockSparseAttentionWrapper:
    """FlashInfer's VariableBlockSparseAttentionWrapper(float_workspace_buffer, backend="auto",
    *, context=None, lse_base="2"). plan(block_mask_map [H_KV, MB, NB] bool, block_row_sz
    [H_KV, MB], block_col_sz [H_KV, NB], num_qo_heads, num_kv_heads, head_dim, causal=False,
    ...) then run(q [H, L_Q, D], k [H_KV, L_KV, D], v) -> o [H, L_Q, D] (q's dtype), and lse
    [H, L_Q] with return_lse=True. Each KV head's row (column) block sizes must add up to one
    L_Q (L_KV) shared by all heads. causal and llama RoPE see the gathered positions of each
    (head, block row), as in FlashInfer; ALiBi raises (FlashInfer passes no slopes here)."""

    def __init__(self, float_workspace_buffer, backend="auto", *, context=None, lse_base="2"):
        self._backend = _backend(backend)
        self._context = _check.instance(context, "context", Context, none=True)
        self._lse_base = _check.choice(lse_base, "lse_base", ("2", "e"))
        self._float_workspace_buffer = _workspace(float_workspace_buffer)
        self.device = float_workspace_buffer.device
        self._paged = None
        self._shape = None  # (H, H_KV, D, L_Q, L_KV, dtype word)

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None):
        """Use another float workspace (plan again afterwards); the int buffer is ignored."""
        self.__init__(float_workspace_buffer, self._backend, context=self._context,
                      lse_base=self._lse_base)

    def plan(self, block_mask_map, block_row_sz, block_col_sz, num_qo_heads, num_kv_heads,
             head_dim, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
             logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None,
             non_blocking=True, q_data_type="float16", kv_data_type=None):
        """Plan (FlashInfer's arguments; use_fp16_qk_reduction and non_blocking are ignored).
        Synchronises once (the selected blocks are listed on the host, as in FlashInfer)."""
        self._shape = None
        H = _check.integer(num_qo_heads, "num_qo_heads", 1, _check.INT_MAX)
        H_KV = _check.integer(num_kv_heads, "num_kv_heads", 1, _check.INT_MAX)
        if H % H_KV:
            raise ValueError(f"num_qo_heads={H} must be a multiple of num_kv_heads={H_KV}")
        if isinstance(pos_encoding_mode, str) and pos_encoding_mode.upper() == "ALIBI":
            raise NotImplementedError("pos_encoding_mode='ALIBI': FlashInfer's variable block-"
                                      "sparse run passes no ALiBi slopes, and kiln's regrouped "
                                      "heads would take the wrong ones")
        word = dtype_word(q_data_type, "q_data_type")
        if kv_data_type is not None and dtype_word(kv_data_type, "kv_data_type") != word:
            raise NotImplementedError(f"kv_data_type={kv_data_type} differs from q_data_type: "
                                      "not supported for block-sparse attention")
        torch = _torch()
        mask, rows, cols = self._check_blocks(torch, block_mask_map, block_row_sz, block_col_sz,
                                              H_KV)
        L_Q, L_KV = int(rows[0].sum()), int(cols[0].sum())
        qo = torch.cat([rows.new_zeros(1), torch.cumsum(rows.reshape(-1), 0)]).tolist()
        kv_indptr, kv_indices = self._gather(torch, mask, cols, L_KV)
        if self._paged is None:
            self._paged = BatchPrefillWithPagedKVCacheWrapper(
                self._float_workspace_buffer, "NHD", context=self._context,
                lse_base=self._lse_base)
        self._paged.plan(qo, kv_indptr, kv_indices, [1] * (len(qo) - 1), H // H_KV, 1,
                         head_dim, 1, causal=causal, pos_encoding_mode=pos_encoding_mode,
                         sm_scale=sm_scale, logits_soft_cap=logits_soft_cap,
                         rope_scale=rope_scale, rope_theta=rope_theta, q_data_type=q_data_type,
                         kv_data_type=q_data_type, o_data_type=q_data_type)
        self._shape = (H, H_KV, int(head_dim), L_Q, L_KV, word)

    begin_forward = plan

    def _check_blocks(self, torch, block_mask_map, block_row_sz, block_col_sz, H_KV):
        for name, t, ndim in (("block_mask_map", block_mask_map, 3),
                              ("block_row_sz", block_row_sz, 2),
                              ("block_col_sz", block_col_sz, 2)):
            if not isinstance(t, torch.Tensor) or t.dim() != ndim:
                raise ValueError(f"{name} must be a {ndim}-D tensor, got "
                                 f"{getattr(t, 'shape', type(t).__name__)}")
        MB, NB = block_row_sz.size(1), block_col_sz.size(1)
        if tuple(block_mask_map.shape) != (H_KV, MB, NB) or block_row_sz.size(0) != H_KV \
                or block_col_sz.size(0) != H_KV:
            raise ValueError(f"block_mask_map [H_KV, MB, NB], block_row_sz [H_KV, MB] and "
                             f"block_col_sz [H_KV, NB] disagree: {tuple(block_mask_map.shape)}, "
                             f"{tuple(block_row_sz.shape)}, {tuple(block_col_sz.shape)} "
                             f"(num_kv_heads={H_KV})")
        rows = block_row_sz.to(device=self.device, dtype=torch.int64)
        cols = block_col_sz.to(device=self.device, dtype=torch.int64)
        mask = block_mask_map.to(device=self.device, dtype=torch.bool)
        sums = torch.stack([rows.sum(1), cols.sum(1)])  # [2, H_KV]
        negative = bool(((rows < 0).any() | (cols < 0).any()).item())
        if negative:
            raise ValueError("block_row_sz and block_col_sz must be >= 0")
        if not bool((sums == sums[:, :1]).all().item()):
            raise ValueError(f"every KV head's blocks must cover one L_Q and one L_KV: row "
                             f"sums {sums[0].tolist()}, column sums {sums[1].tolist()}")
        return mask, rows, cols

    def _gather(self, torch, mask, cols, L_KV):
        """(kv_indptr host list, kv_indices int32 device): request (h, r) gathers the tokens of
        its selected column blocks, in column order, as token ids h * L_KV + offset."""
        dev = self.device
        lens = (mask * cols[:, None, :]).sum(-1).reshape(-1)  # tokens of each (h, r)
        indptr = torch.cat([lens.new_zeros(1), torch.cumsum(lens, 0)]).tolist()
        col_start = torch.cumsum(cols, 1) - cols  # [H_KV, NB]
        h, _, c = mask.nonzero(as_tuple=True)  # (h, r, c) in request order, columns ascending
        n = cols[h, c]
        base = h * L_KV + col_start[h, c]
        total = indptr[-1]
        if total == 0:
            return indptr, torch.zeros(1, dtype=torch.int32, device=dev)
        first = torch.repeat_interleave(torch.cumsum(n, 0) - n, n, output_size=total)
        ids = torch.repeat_interleave(base, n, output_size=total) + torch.arange(
            total, device=dev) - first
        return indptr, ids.to(torch.int32)

    def forward(self, q, k, v, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
                logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None):
        """FlashInfer's deprecated forward(): its arguments must match the plan; then run()."""
        if str(pos_encoding_mode).upper() != "NONE" or logits_soft_cap or sm_scale is not None \
                or rope_scale is not None or rope_theta is not None:
            raise NotImplementedError("forward() with pos_encoding_mode / logits_soft_cap / "
                                      "sm_scale / rope_*: pass them to plan(), then call run()")
        return self.run(q, k, v)

    def run(self, q, k, v, out=None, lse=None, return_lse=False, enable_pdl=None):
        """q [H, L_Q, D]; k, v [H_KV, L_KV, D]. Returns o [H, L_Q, D] and, with return_lse,
        lse [H, L_Q]. out / lse, when given, are in those returned shapes and are written
        (FlashInfer checks them against its internal [H_KV * L_Q, G, D] layout instead)."""
        return_lse = _check.flag(return_lse, "return_lse")
        if self._shape is None:
            raise RuntimeError("VariableBlockSparseAttentionWrapper: call plan() before run()")
        H, H_KV, D, L_Q, L_KV, word = self._shape
        torch = _torch()
        dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[word]
        for name, t, shape in (("q", q, (H, L_Q, D)), ("k", k, (H_KV, L_KV, D)),
                               ("v", v, (H_KV, L_KV, D))):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype != dtype:
                raise ValueError(f"{name} must be {dtype} {shape}, got "
                                 f"{getattr(t, 'dtype', None)} {getattr(t, 'shape', None)}")
        if out is not None and (not isinstance(out, torch.Tensor) or
                                tuple(out.shape) != (H, L_Q, D) or out.dtype != dtype):
            raise ValueError(f"out must be {dtype} [H, L_Q, D] = {(H, L_Q, D)}")
        if lse is not None and (not isinstance(lse, torch.Tensor) or
                                tuple(lse.shape) != (H, L_Q) or lse.dtype != torch.float32):
            raise ValueError(f"lse must be float32 [H, L_Q] = {(H, L_Q)}")
        G = H // H_KV
        # [H, L_Q, D] -> [(H_KV L_Q), G, D]: request (h, r) takes rows of kv head h's group
        q_r = q.reshape(H_KV, G, L_Q, D).permute(0, 2, 1, 3).reshape(H_KV * L_Q, G, D)
        pages = tuple(t.reshape(H_KV * L_KV, 1, 1, D) for t in (k, v))
        o_r, lse_r = self._paged.run(q_r.contiguous(), pages, return_lse=True)
        o = o_r.view(H_KV, L_Q, G, D).permute(0, 2, 1, 3).reshape(H, L_Q, D)
        if out is not None:
            out.copy_(o)
            o = out
        if not return_lse:
            return o
        s = lse_r.view(H_KV, L_Q, G).permute(0, 2, 1).reshape(H, L_Q)
        if lse is not None:
            lse.copy_(s)
            s = lse
        return o, s

    def end_forward(self):
        """Nothing to release (FlashInfer's old API)."""
