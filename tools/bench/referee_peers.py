"""referee_peers.py — the referee's inputs and the libraries it times: random bf16 tensors, paged
K/V in shuffled pools, kiln's workspaces, FlashInfer (where importable, its JIT built once before
timing), torch SDPA (FA2, cuDNN) and Flex."""
import os
import random
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from referee_common import BF16, FP8, H, H_KV, PAGE, RES, SOFTCAP, WINDOW, short


# ---- inputs ------------------------------------------------------------------------------------

def rnd(*shape, dtype=BF16):
    return torch.empty(*shape, device="cuda", dtype=BF16).uniform_(-1, 1).to(dtype)


def dev_i32(x):
    return torch.tensor(x, dtype=torch.int32, device="cuda")


class PagedKV:
    """B requests of the given lengths in a pool of shuffled pages (NHD [pages, PAGE, H_KV, D]),
    `copies` pools with the same page table."""

    def __init__(self, lens, D, dtype, copies, seed=1):
        self.lens = list(lens)
        npages = [(L + PAGE - 1) // PAGE for L in lens]
        self.total = sum(npages)
        perm = list(range(self.total))
        random.Random(seed).shuffle(perm)
        self.perm = perm
        self.indptr_h = [0]
        for n in npages:
            self.indptr_h.append(self.indptr_h[-1] + n)
        self.last_h = [L - (n - 1) * PAGE for L, n in zip(lens, npages)]
        self.indptr, self.indices, self.last = dev_i32(self.indptr_h), dev_i32(perm), dev_i32(self.last_h)
        self.k = [rnd(self.total, PAGE, H_KV, D, dtype=dtype) for _ in range(copies)]
        self.v = [rnd(self.total, PAGE, H_KV, D, dtype=dtype) for _ in range(copies)]

    def dense(self, pool, b):
        """Request b's rows as [H_KV, L, D] (bf16)."""
        pages = torch.tensor(self.perm[self.indptr_h[b]:self.indptr_h[b + 1]], device="cuda")
        x = pool.view(torch.uint8)[pages].view(pool.dtype).to(BF16)
        return x.reshape(-1, H_KV, pool.shape[-1])[:self.lens[b]].transpose(0, 1)

    def dense_all(self, pool):
        """[B, H_KV, L, D] for equal lengths (SDPA's contiguous equivalent)."""
        B, L, D = len(self.lens), self.lens[0], pool.shape[-1]
        out = torch.empty(B, H_KV, L, D, device="cuda", dtype=BF16)
        for b in range(B):
            out[b] = self.dense(pool, b)
        return out


def paged_from_ragged(B, S, copies_k, copies_v, seed=3):
    """Scatter each copy's ragged rows [B*S, H_KV, D] into shuffled pages of one page table;
    returns (k pools, v pools, indptr, indices, last_page_len), device tensors."""
    npg = (S + PAGE - 1) // PAGE
    total = B * npg
    perm = list(range(total))
    random.Random(seed).shuffle(perm)
    idx = torch.tensor(perm, device="cuda")
    kp, vp = [], []
    for kr, vr in zip(copies_k, copies_v):
        D = kr.shape[-1]
        pad = npg * PAGE - S
        for src, dst_list in ((kr, kp), (vr, vp)):
            x = src.view(B, S, H_KV, D)
            if pad:
                x = torch.cat([x, torch.zeros(B, pad, H_KV, D, device="cuda", dtype=src.dtype)], 1)
            pool = torch.empty(total, PAGE, H_KV, D, device="cuda", dtype=src.dtype)
            pool[idx] = x.reshape(total, PAGE, H_KV, D)
            dst_list.append(pool)
    indptr = dev_i32([b * npg for b in range(B + 1)])
    last = dev_i32([S - (npg - 1) * PAGE] * B)
    return kp, vp, indptr, idx.to(torch.int32), last



# ---- the libraries -----------------------------------------------------------------------------

def kiln_bsr_args(q, k, v, o, indptr, indices, S, R, tile_map=None, tile_map_bytes=0):
    """kiln.AttnArgs of a single request of S tokens (q [S, H, D], k / v [S, H_KV, D], o like q)
    under a block-sparse mask of R x R blocks (int32 device tensors indptr, indices), with its
    tile map where one is given."""
    import math
    import kiln
    D = q.shape[-1]
    x = kiln.AttnArgs()
    x.q, x.k, x.v, x.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
    x.num_qo_heads, x.qo_len, x.kv_len = H, S, S
    x.q_stride_n, x.q_stride_h, x.o_stride_n, x.o_stride_h = H * D, D, H * D, D
    x.k_stride_n, x.k_stride_h, x.v_stride_n, x.v_stride_h = H_KV * D, D, H_KV * D, D
    x.bsr_indptr, x.bsr_indices, x.bsr_r, x.bsr_c = indptr.data_ptr(), indices.data_ptr(), R, R
    x.params.sm_scale = 1.0 / math.sqrt(D)
    if tile_map is not None:
        x.tile_map, x.tile_map_bytes = tile_map.data_ptr(), tile_map_bytes
    return x


def kiln_ws():
    """A float workspace for one kiln wrapper or plan. Never shared: a kiln plan keeps its
    schedule in its workspace, so a second wrapper planned on the same buffer overwrites the
    first one's (FlashInfer's wrappers may share one; kiln's may not yet)."""
    return torch.empty(512 << 20, dtype=torch.uint8, device="cuda")


class FI:
    """FlashInfer, where importable; `ok` is the set of configs whose JIT build succeeded."""
    fi = None
    ok = None
    why = ""

    @classmethod
    def load(cls, ok_path):
        try:
            import flashinfer
            cls.fi = flashinfer
            cls.ws = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
            RES.meta["flashinfer"] = flashinfer.__version__
            if ok_path and os.path.exists(ok_path):
                cls.ok = set(x.strip() for x in open(ok_path) if x.strip())
        except Exception as e:  # noqa: BLE001
            cls.why = "FlashInfer not importable: " + short(e)
            print(cls.why)

    @classmethod
    def has(cls, key):
        return cls.fi is not None and (cls.ok is None or key in cls.ok)

    @classmethod
    def missing(cls, key):
        return cls.why or f"FlashInfer config {key} did not build (see the compile log)"


def fi_decode(pk, D, kv_dtype, tc):
    w = FI.fi.BatchDecodeWithPagedKVCacheWrapper(FI.ws, "NHD", use_tensor_cores=tc)
    w.plan(pk.indptr, pk.indices, pk.last, H, H_KV, D, PAGE, q_data_type=BF16, kv_data_type=kv_dtype)
    return w


def fi_ragged(D, causal, qo, kv, **kw):
    w = FI.fi.BatchPrefillWithRaggedKVCacheWrapper(FI.ws, "NHD")
    w.plan(qo, kv, H, H_KV, D, causal=causal, q_data_type=BF16, kv_data_type=BF16, **kw)
    return w


def fi_paged(D, causal, qo, indptr, indices, last):
    w = FI.fi.BatchPrefillWithPagedKVCacheWrapper(FI.ws, "NHD")
    w.plan(qo, indptr, indices, last, H, H_KV, D, PAGE, causal=causal, q_data_type=BF16, kv_data_type=BF16)
    return w


def sdpa_fn(backend, causal):
    def f(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    return f


_flex = None


def flex_fn(L_Q, L_KV, causal=False, window=None, score_mod=None, mask_mod=None):
    """torch.compile'd flex_attention for one shape (bottom-right causal / window)."""
    global _flex
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    if _flex is None:
        import torch._dynamo
        torch._dynamo.config.cache_size_limit = 1024  # a recompile limit would fall back silently
        _flex = torch.compile(flex_attention, dynamic=False)
    off = L_KV - L_Q
    mm = mask_mod
    if mm is None and (causal or window is not None):
        def mm(b, h, q, kv):
            vis = q + off >= kv
            if window is not None:
                vis = vis & (kv >= q + off - window)
            return vis
    bm = create_block_mask(mm, None, None, L_Q, L_KV) if mm is not None else None
    return lambda q, k, v: _flex(q, k, v, score_mod=score_mod, block_mask=bm, enable_gqa=True)


def torch_peers(causal, qs, ks, vs, canon, flex=None):
    """FA2, cuDNN (and Flex when given) on [B, H(_KV), L, D] copies."""
    out = []
    for name, be in (("FA2", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION)):
        f = sdpa_fn(be, causal)
        out.append((name, lambda c, f=f: f(qs[c], ks[c], vs[c]), canon))
    if flex is not None:
        out.append(("Flex", lambda c: flex(qs[c], ks[c], vs[c]), canon))
    return out



# ---- FlashInfer's JIT, once, before timing -----------------------------------------------------

FI_CONFIGS = ["decode:d128:bf16", "ragged:d128", "paged:d128", "decode-tc:d128:bf16", "decode:d128:fp8",
              "ragged-softcap:d128", "ragged:d64", "ragged:d256", "decode:d64:bf16", "decode:d256:bf16",
              "ragged-window:d128", "ragged-alibi:d128", "bsr:d128"]


def fi_build(key):
    """Build (JIT) one FlashInfer config by running it on a small shape."""
    kind, d = key.split(":")[:2]
    D = int(d[1:])
    if kind.startswith("decode"):
        dt = FP8 if key.endswith("fp8") else BF16
        pk = PagedKV([300, 37], D, dt, 1)
        w = fi_decode(pk, D, dt, kind == "decode-tc")
        w.run(rnd(2, H, D), (pk.k[0], pk.v[0]))
    elif kind.startswith("ragged"):
        extra = {"ragged-softcap": dict(logits_soft_cap=SOFTCAP), "ragged-alibi": dict(pos_encoding_mode="ALIBI"),
                 "ragged-window": dict(window_left=WINDOW)}.get(kind, {})
        qo = dev_i32([0, 300, 337])
        w = fi_ragged(D, True, qo, qo, **extra)
        w.run(rnd(337, H, D), rnd(337, H_KV, D), rnd(337, H_KV, D))
    elif kind == "paged":
        pk = PagedKV([300, 37], D, BF16, 1)
        w = fi_paged(D, True, dev_i32([0, 300, 337]), pk.indptr, pk.indices, pk.last)
        w.run(rnd(337, H, D), (pk.k[0], pk.v[0]))
    elif kind == "bsr":
        w = FI.fi.BlockSparseAttentionWrapper(FI.ws)
        w.plan(dev_i32([0, 1, 2]), dev_i32([0, 1]), 128, 128, 64, 64, H, H_KV, D, q_data_type=BF16,
               kv_data_type=BF16, o_data_type=BF16)
        w.run(rnd(128, H, D), rnd(128, H_KV, D), rnd(128, H_KV, D))
    torch.cuda.synchronize()


def fi_compile_only(keys, ok_path, deadline):
    t0 = time.time()
    FI.load(None)
    if FI.fi is None:
        return 1
    for key in keys:
        if time.time() - t0 > deadline:
            print(f"  {key}: skipped (deadline {deadline} s)", flush=True)
            continue
        t = time.time()
        try:
            fi_build(key)
            print(f"  {key}: built in {time.time() - t:.0f} s", flush=True)
            with open(ok_path, "a") as f:
                f.write(key + "\n")
        except Exception as e:  # noqa: BLE001
            print(f"  {key}: FAILED after {time.time() - t:.0f} s: {short(e)}", flush=True)
    return 0
