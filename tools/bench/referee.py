#!/usr/bin/env python3
"""referee.py — the one harness behind every speed figure in docs/perf.md.

Every library runs in this one process, on identical inputs, and every call is timed three ways:

  GPU time    a CUDA graph holding `copies` calls, one per rotated copy of the inputs (so the
              working set exceeds L2 and no call reads what the previous one left there),
              replayed REPLAYS (>= 50) times between two events; the median of BURSTS (>= 5)
              bursts, divided by the calls in a burst. Host overhead is absent by construction.
  host time   the wall clock of N eager calls issued back to back with no sync, divided by N
              (median of rounds; the stream is drained between rounds, untimed).
  eager time  events recorded around one eager call, then a sync: what an engine without CUDA
              graphs sees (host time shows up here whenever it exceeds the GPU time). Median.

Libraries (the names used in every table):
  kiln          kiln's Python package (FlashInfer-shaped wrappers over libkiln.so; the raw
                kiln.Plan / Kernel API for the snippet and block-sparse points)
  FlashInfer    flashinfer-python (carried wheels, JIT-compiled with the machine's nvcc): its
                CUDA-core decode, FlashInfer-tc its tensor-core decode, its default ("auto")
                prefill backend (FA3 on sm_90 where it applies)
  FA2, cuDNN    torch SDPA with the FLASH_ATTENTION / CUDNN_ATTENTION backend, on contiguous
                copies of the same K/V (gathered from kiln's pages), enable_gqa=True
  Flex          torch.compile(flex_attention), one compile per shape, block masks for masks

Every peer's output is compared with kiln's on the same inputs (rel-L2 ||x - kiln|| / ||kiln||);
a failure to build, capture or run is printed in the row, never dropped.

Shapes: bf16, H 32, H_KV 8 (G 4), D 128 unless a row says otherwise; decode KV paged in pages of
16 (NHD, pages shuffled in the pool). Decode GB/s counts K + V + q + o bytes; prefill TFLOP/s
counts 4 * D * visible (query, key) pairs * H.

usage (on a GPU machine, from the repository root):
  python3 tools/bench/referee.py [--quick] [--only SUITE,...] [--csv F] [--md F] [--json F]
         [--kiln-bench build/bin/kiln-bench] [--flashinfer] [--fi-ok F] [--no-flex]
  python3 tools/bench/referee.py --fi-compile-only --fi-configs KEY,... --fi-ok F
SUITE: ceilings decode fp8 decode-d prefill prefill-d variants bsr cascade host
tools/bench/referee.sh runs the whole thing (FlashInfer install and JIT included).
"""
import argparse
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

H, H_KV, PAGE = 32, 8, 16
G = H // H_KV
BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn
ROTATE_BYTES = 256 << 20  # rotate input copies until a burst touches this much (L2: 60 MB)
MAX_COPIES = 64
REPLAYS, BURSTS = 50, 5
EAGER_CALLS = 20
TOL = 2e-2  # rel-L2 between two bf16 implementations of the same attention

DEC_B, DEC_L = (1, 16, 64, 256), (512, 4096, 32768)
PRE_BS = ((1, 1024), (16, 1024), (4, 4096), (1, 16384))
CASCADE_PREFIX, CASCADE_PRIVATE = 32768, 512
SOFTCAP = 30.0
WINDOW = 1024


# ---- timing ------------------------------------------------------------------------------------

def _ev():
    return torch.cuda.Event(enable_timing=True)


def time_eager(fn, copies):
    """Events around one eager call, then a sync; median µs."""
    ts = []
    for i in range(EAGER_CALLS):
        a, b = _ev(), _ev()
        a.record()
        fn(i % copies)
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)


def time_host(fn, copies, gpu_us_hint):
    """Wall clock of n back-to-back eager calls without a sync, / n; median of 5 rounds, µs."""
    n = int(min(64, max(8, 100e3 / max(gpu_us_hint, 1.0))))
    ts = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(n):
            fn(i % copies)
        t1 = time.perf_counter()
        ts.append((t1 - t0) * 1e6 / n)
    torch.cuda.synchronize()
    return statistics.median(ts)


def time_graph(fn, copies):
    """GPU µs per call by CUDA-graph replay (see the file comment)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # torch wants work on a side stream before a capture
        fn(0)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in range(copies):
            fn(c)
    g.replay()
    torch.cuda.synchronize()
    per = []
    for _ in range(BURSTS):
        a, b = _ev(), _ev()
        a.record()
        for _ in range(REPLAYS):
            g.replay()
        b.record()
        b.synchronize()
        per.append(a.elapsed_time(b) * 1e3 / (REPLAYS * copies))
    del g
    return statistics.median(per)


def copies_for(nbytes):
    return max(1, min(MAX_COPIES, math.ceil(ROTATE_BYTES / max(nbytes, 1))))


def rel_l2(x, ref):
    x, ref = x.double(), ref.double()
    if not torch.isfinite(x).all():
        return float("inf")
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def short(e):
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:160] if msg else ''}"


# ---- results -----------------------------------------------------------------------------------

class Results:
    """Every row measured, the ceilings, and the run's metadata; prints as it goes."""

    def __init__(self):
        self.rows = []
        self.meta = {}
        self.ceil = {}

    def add(self, row):
        self.rows.append(row)
        rate = f"{row['rate']:.1f}" if row.get("rate") else ""
        f = lambda k: f"{row[k]:.1f}" if row.get(k) is not None else "—"
        print(f"| {row['suite']} | {row['point']} | {row['lib']} | {f('gpu_us')} | {rate} {row['unit']} | "
              f"{f('host_us')} | {f('eager_us')} | {row['check']} | {row.get('error', '')} |", flush=True)


RES = Results()


def measure(suite, point, unit, work, contenders, copies, ref_lib="kiln"):
    """Time every contender three ways and cross-check it against ref_lib's output.
    contenders: [(lib, fn(c) -> output, canon(output) -> tensor in the reference layout)];
    work: bytes (GB/s) or FLOPs (TFLOP/s) of one call."""
    ref = None
    outs = {}
    for lib, fn, canon in contenders:
        row = dict(suite=suite, point=point, lib=lib, unit=unit, gpu_us=None, host_us=None, eager_us=None,
                   rate=None, check="", copies=copies)
        try:
            for c in range(copies):  # warm-up: JIT, autotune, module loads
                fn(c)
            torch.cuda.synchronize()
            outs[lib] = canon(fn(0))
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 — a peer that fails is a row, not a crash
            row["error"] = "run failed: " + short(e)
            row["check"] = "failed"
            RES.add(row)
            torch.cuda.synchronize()
            continue
        errs = []
        try:
            row["eager_us"] = time_eager(fn, copies)
        except Exception as e:  # noqa: BLE001
            errs.append("eager: " + short(e))
        try:
            row["host_us"] = time_host(fn, copies, row["eager_us"] or 10.0)
        except Exception as e:  # noqa: BLE001
            errs.append("host: " + short(e))
        try:
            row["gpu_us"] = time_graph(fn, copies)
            row["rate"] = work / (row["gpu_us"] * 1e-6) / (1e9 if unit == "GB/s" else 1e12)
        except Exception as e:  # noqa: BLE001
            errs.append("graph: " + short(e))
        if errs:
            row["error"] = "; ".join(errs)
        if lib == ref_lib:
            ref = outs[lib]
            row["check"] = "reference"
        elif ref is not None:
            err = rel_l2(outs[lib], ref)
            row["check"] = f"ok {err:.1e}" if err <= TOL else f"MISMATCH {err:.1e}"
            row["rel_l2"] = err
        else:
            row["check"] = "no reference"
        RES.add(row)
        torch.cuda.synchronize()
    outs.clear()
    torch.cuda.empty_cache()


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


# ---- suites ------------------------------------------------------------------------------------

def decode_point(suite, B, L, D, kv_dtype, a):
    import kiln
    elt = 1 if kv_dtype == FP8 else 2
    nbytes = B * L * H_KV * D * elt * 2 + B * H * D * 2 * 2
    copies = copies_for(nbytes)
    point = f"B{B} x {L}" + ("" if D == 128 else f" d{D}") + (" e4m3" if kv_dtype == FP8 else "")
    pk = PagedKV([L] * B, D, kv_dtype, copies)
    qs = [rnd(B, H, D) for _ in range(copies)]
    w = kiln.BatchDecodeWithPagedKVCacheWrapper(kiln_ws(), "NHD")
    w.plan(pk.indptr_h, pk.indices, pk.last_h, H, H_KV, D, PAGE, q_data_type=BF16, kv_data_type=kv_dtype)
    ident = lambda o: o
    cont = [("kiln", lambda c: w.run(qs[c], (pk.k[c], pk.v[c])), ident)]
    dt = "fp8" if kv_dtype == FP8 else "bf16"
    for tc in (False, True):
        key = f"decode{'-tc' if tc else ''}:d{D}:{dt}"
        if tc and (D != 128 or dt != "bf16"):
            continue
        name = "FlashInfer" + ("-tc" if tc else "")
        if FI.has(key):
            fw = fi_decode(pk, D, kv_dtype, tc)
            cont.append((name, lambda c, fw=fw: fw.run(qs[c], (pk.k[c], pk.v[c])), ident))
        else:
            RES.add(dict(suite=suite, point=point, lib=name, unit="GB/s", check="not run", error=FI.missing(key)))
    dense = None
    if kv_dtype != FP8:
        dense = ([q.view(B, H, 1, D) for q in qs], [pk.dense_all(x) for x in pk.k], [pk.dense_all(x) for x in pk.v])
        fl = None
        if not a.no_flex and suite == "decode":
            try:
                fl = flex_fn(1, L)
            except Exception as e:  # noqa: BLE001
                RES.add(dict(suite=suite, point=point, lib="Flex", unit="GB/s", check="failed", error=short(e)))
        cont += torch_peers(False, *dense, lambda o: o.reshape(B, H, D), fl)
    measure(suite, point, "GB/s", nbytes, cont, copies)


def suite_decode(a, suite):
    if suite == "decode-d":
        for D in (64, 256):
            decode_point(suite, 64, 4096, D, BF16, a)
        return
    kv_dtype = FP8 if suite == "fp8" else BF16
    for B in DEC_B:
        for L in DEC_L:
            if a.quick and (B, L) not in ((1, 4096), (64, 4096), (256, 4096), (16, 32768)):
                continue
            decode_point(suite, B, L, 128, kv_dtype, a)


def prefill_point(suite, B, S, D, causal, a, variant=None, paged=True, sdpa=True):
    """Ragged (and paged) batch prefill of B requests of S tokens (L_Q = L_KV = S)."""
    import kiln
    pairs = S * (S + 1) // 2 if causal else S * S
    if variant == "window":
        pairs = sum(min(i + 1, WINDOW + 1) for i in range(S))
    flops = 4.0 * D * pairs * H * B
    nbytes = (2 * B * H * S * D + 2 * B * H_KV * S * D) * 2
    copies = copies_for(nbytes)
    point = f"{B} x {S}" + ("" if D == 128 else f" d{D}") + ("" if causal else " non-causal") + (
        f" {variant}" if variant else "")
    qs = [rnd(B * S, H, D) for _ in range(copies)]
    ks = [rnd(B * S, H_KV, D) for _ in range(copies)]
    vs = [rnd(B * S, H_KV, D) for _ in range(copies)]
    qo = [i * S for i in range(B + 1)]
    qo_d = dev_i32(qo)
    kw, fkw = {}, {}
    score = None
    if variant == "softcap":
        kw = fkw = dict(logits_soft_cap=SOFTCAP)
        score = lambda s, b, h, q, kv: SOFTCAP * torch.tanh(s / SOFTCAP)
    elif variant == "snippet softcap":
        score = lambda s, b, h, q, kv: SOFTCAP * torch.tanh(s / SOFTCAP)
    elif variant == "alibi":
        kw = fkw = dict(pos_encoding_mode="ALIBI")
        slopes = kiln.alibi_slopes(H, "cuda")
        score = lambda s, b, h, q, kv: s + slopes[h] * (kv - q).to(s.dtype)
    elif variant == "window":
        kw = fkw = dict(window_left=WINDOW)
    w = kiln.BatchPrefillWithRaggedKVCacheWrapper(kiln_ws(), "NHD")
    w.plan(qo, qo, H, H_KV, D, causal=causal, q_data_type=BF16, kv_data_type=BF16, **kw)
    ident = lambda o: o
    cont = [("kiln", lambda c: w.run(qs[c], ks[c], vs[c]), ident)]
    if variant == "snippet softcap":
        cont = [("kiln", kiln_snippet_softcap(qs, ks, vs, qo, B * S, D), ident)]
        w = None
    fkey = f"ragged{'-' + variant if variant in ('softcap', 'alibi', 'window') else ''}:d{D}"
    if variant != "snippet softcap":
        if FI.has(fkey):
            fw = fi_ragged(D, causal, qo_d, qo_d, **fkw)
            cont.append(("FlashInfer", lambda c, fw=fw: fw.run(qs[c], ks[c], vs[c]), ident))
        else:
            RES.add(dict(suite=suite, point=point, lib="FlashInfer", unit="TFLOP/s", check="not run",
                         error=FI.missing(fkey)))
    if paged and variant is None and causal:
        kp, vp, indptr, indices, last = paged_from_ragged(B, S, ks, vs)
        pw = kiln.BatchPrefillWithPagedKVCacheWrapper(kiln_ws(), "NHD")
        pw.plan(qo, indptr.tolist(), indices, last.tolist(), H, H_KV, D, PAGE, causal=causal, q_data_type=BF16,
                kv_data_type=BF16)
        cont.append(("kiln paged", lambda c: pw.run(qs[c], (kp[c], vp[c])), ident))
        if FI.has(f"paged:d{D}"):
            fpw = fi_paged(D, causal, qo_d, indptr, indices, last)
            cont.append(("FlashInfer paged", lambda c: fpw.run(qs[c], (kp[c], vp[c])), ident))
        else:
            RES.add(dict(suite=suite, point=point, lib="FlashInfer paged", unit="TFLOP/s", check="not run",
                         error=FI.missing(f"paged:d{D}")))
    bhsd = lambda x, h: x.view(B, S, h, D).transpose(1, 2).contiguous()
    canon = lambda o: o.transpose(1, 2).reshape(B * S, H, D)
    tq, tk, tv = [bhsd(x, H) for x in qs], [bhsd(x, H_KV) for x in ks], [bhsd(x, H_KV) for x in vs]
    fl = None
    if not a.no_flex:
        try:
            window = WINDOW if variant == "window" else None
            if variant == "softcap" or variant == "snippet softcap" or variant == "alibi" or variant == "window":
                fl = flex_fn(S, S, causal=causal, window=window, score_mod=score)
            else:
                fl = flex_fn(S, S, causal=causal)
        except Exception as e:  # noqa: BLE001
            RES.add(dict(suite=suite, point=point, lib="Flex", unit="TFLOP/s", check="failed", error=short(e)))
    if sdpa and variant is None:
        cont += torch_peers(causal, tq, tk, tv, canon, fl)
    elif fl is not None:
        cont.append(("Flex", lambda c: fl(tq[c], tk[c], tv[c]), canon))
    measure(suite, point, "TFLOP/s", flops, cont, copies)


def kiln_snippet_softcap(qs, ks, vs, qo, total, D):
    """kiln's raw batch API on a variant with a logits snippet: cap * tanhf(logits / cap)."""
    import kiln
    spec = (f"op=prefill dtype=bf16 head_dim={D} group={G} mask=causal kv=ragged params=cap:f32 "
            f"logits_expr=\"cap * tanhf(logits / cap)\"")
    kern = kiln.default_context().kernel(kiln.Variant(spec))
    plan = kern.plan(num_qo_heads=H)
    ws = kiln_ws()
    stream = torch.cuda.current_stream().cuda_stream
    plan.plan(qo, ws.data_ptr(), ws.numel(), stream, qo_indptr=qo)

    def run(c):
        o = torch.empty(total, H, D, device="cuda", dtype=BF16)
        args = kiln.BatchArgs()
        args.q, args.k, args.v, args.o = qs[c].data_ptr(), ks[c].data_ptr(), vs[c].data_ptr(), o.data_ptr()
        args.q_stride_n, args.q_stride_h = H * D, D
        args.o_stride_n, args.o_stride_h = H * D, D
        args.k_stride_n, args.k_stride_h = H_KV * D, D
        args.v_stride_n, args.v_stride_h = H_KV * D, D
        args.workspace, args.workspace_bytes = ws.data_ptr(), ws.numel()
        args.params.sm_scale = 1.0 / math.sqrt(D)
        args.params.user[0].f32 = SOFTCAP
        plan.run(args, torch.cuda.current_stream().cuda_stream)
        return o
    return run


def suite_prefill(a, suite):
    if suite == "prefill-d":
        for D in (64, 256):
            prefill_point(suite, 4, 4096, D, True, a, paged=False)
        return
    for B, S in PRE_BS:
        if a.quick and (B, S) not in ((4, 4096),):
            continue
        prefill_point(suite, B, S, 128, True, a)
        if not a.quick or (B, S) == (4, 4096):
            prefill_point(suite, B, S, 128, False, a, paged=False)


def suite_variants(a, suite):
    for v in ("softcap", "snippet softcap", "alibi", "window"):
        if a.quick and v not in ("softcap", "snippet softcap"):
            continue
        prefill_point(suite, 4, 4096, 128, True, a, variant=v, paged=False)


def suite_bsr(a, suite):
    """Single-request prefill with a block-sparse mask (64 x 64 blocks, 25 % kept, the diagonal
    always), non-causal, 1 x 4096; kiln with and without its tile map, dense kiln beside it."""
    import kiln
    S, D, R = 4096, 128, 64
    nb = S // R
    rng = random.Random(11)
    blocks = [[c == r or rng.random() < 0.25 for c in range(nb)] for r in range(nb)]
    indptr, indices = [0], []
    for r in range(nb):
        indices += [c for c in range(nb) if blocks[r][c]]
        indptr.append(len(indices))
    kept = len(indices) / (nb * nb)
    flops = 4.0 * D * len(indices) * R * R * H
    nbytes = (2 * H * S * D + 2 * H_KV * S * D) * 2
    copies = copies_for(nbytes)
    qs, ks, vs = [rnd(S, H, D) for _ in range(copies)], [rnd(S, H_KV, D) for _ in range(copies)], [
        rnd(S, H_KV, D) for _ in range(copies)]
    ctx = kiln.default_context()
    kern = ctx.kernel(kiln.Variant(f"op=prefill dtype=bf16 head_dim={D} group={G} mask_data=bsr"))
    ip_d, ix_d = dev_i32(indptr), dev_i32(indices)
    stream = lambda: torch.cuda.current_stream().cuda_stream
    maps = {}

    def kiln_bsr(tile_map):
        def run(c):
            o = torch.empty(S, H, D, device="cuda", dtype=BF16)
            x = kiln.AttnArgs()
            x.q, x.k, x.v, x.o = qs[c].data_ptr(), ks[c].data_ptr(), vs[c].data_ptr(), o.data_ptr()
            x.num_qo_heads, x.qo_len, x.kv_len = H, S, S
            x.q_stride_n, x.q_stride_h, x.o_stride_n, x.o_stride_h = H * D, D, H * D, D
            x.k_stride_n, x.k_stride_h, x.v_stride_n, x.v_stride_h = H_KV * D, D, H_KV * D, D
            x.bsr_indptr, x.bsr_indices, x.bsr_r, x.bsr_c = ip_d.data_ptr(), ix_d.data_ptr(), R, R
            x.params.sm_scale = 1.0 / math.sqrt(D)
            if tile_map:
                if "buf" not in maps:  # planned once, outside any capture: the mask is fixed
                    n = kern.prefill_mask_plan_size(S, S)
                    maps["buf"] = torch.empty(max(n, 1), dtype=torch.uint8, device="cuda")
                    x.tile_map, x.tile_map_bytes = maps["buf"].data_ptr(), n
                    kern.prefill_mask_plan(x, stream())
                x.tile_map, x.tile_map_bytes = maps["buf"].data_ptr(), maps["buf"].numel()
            kern.single_prefill(x, stream())
            return o
        return run

    ident = lambda o: o

    def kiln_dense(c):
        return kiln.single_prefill_with_kv_cache(qs[c], ks[c], vs[c])

    kiln_bsr(True)(0)  # plan the tile map before any capture
    cont = [("kiln", kiln_bsr(True), ident), ("kiln (no tile map)", kiln_bsr(False), ident)]
    if FI.has("bsr:d128"):
        fw = FI.fi.BlockSparseAttentionWrapper(FI.ws)
        fw.plan(ip_d, ix_d, S, S, R, R, H, H_KV, D, q_data_type=BF16, kv_data_type=BF16, o_data_type=BF16)
        cont.append(("FlashInfer", lambda c: fw.run(qs[c], ks[c], vs[c]), ident))
    else:
        RES.add(dict(suite=suite, point=f"1 x 4096 bsr {kept:.0%}", lib="FlashInfer", unit="TFLOP/s", check="not run",
                     error=FI.missing("bsr:d128")))
    if not a.no_flex:
        try:
            bt = torch.tensor(blocks, device="cuda")
            fl = flex_fn(S, S, mask_mod=lambda b, h, q, kv: bt[q // R, kv // R])
            canon = lambda o: o.transpose(1, 2).reshape(S, H, D)
            tq = [x.view(1, S, H, D).transpose(1, 2).contiguous() for x in qs]
            tk = [x.view(1, S, H_KV, D).transpose(1, 2).contiguous() for x in ks]
            tv = [x.view(1, S, H_KV, D).transpose(1, 2).contiguous() for x in vs]
            cont.append(("Flex", lambda c: fl(tq[c], tk[c], tv[c]), canon))
        except Exception as e:  # noqa: BLE001
            RES.add(dict(suite=suite, point=f"1 x 4096 bsr {kept:.0%}", lib="Flex", unit="TFLOP/s", check="failed",
                         error=short(e)))
    RES.meta["bsr_kept"] = kept
    measure(suite, f"1 x 4096 bsr {kept:.0%}", "TFLOP/s", flops, cont, copies)
    # the dense kernel on the same data, FLOPs of the whole matrix: the speed-up to expect is 1 / kept
    measure(suite, "1 x 4096 dense", "TFLOP/s", 4.0 * D * S * S * H, [("kiln", kiln_dense, ident)], copies)


def suite_cascade(a, suite):
    """Decode over a shared prefix of CASCADE_PREFIX tokens plus CASCADE_PRIVATE per request."""
    for B in (64, 256):
        if not (a.quick and B == 256):
            cascade_point(suite, B)


def cascade_point(suite, B):
    import kiln
    D = 128
    pre, priv = CASCADE_PREFIX // PAGE, CASCADE_PRIVATE // PAGE
    total = pre + B * priv
    perm = list(range(total))
    random.Random(7).shuffle(perm)
    kp, vp = rnd(total, PAGE, H_KV, D), rnd(total, PAGE, H_KV, D)
    q = rnd(B, H, D)
    prefix, private = perm[:pre], perm[pre:]
    plain = []
    for b in range(B):
        plain += prefix + private[b * priv:(b + 1) * priv]
    L = CASCADE_PREFIX + CASCADE_PRIVATE
    nbytes = 2 * (CASCADE_PREFIX + B * CASCADE_PRIVATE) * H_KV * D * 2 + B * H * D * 4
    plan_args = ([dev_i32([0, B]), dev_i32(list(range(B + 1)))],
                 [dev_i32([0, pre]), dev_i32([b * priv for b in range(B + 1)])],
                 [dev_i32(prefix), dev_i32(private)], [dev_i32([PAGE]), dev_i32([PAGE] * B)])
    kw = kiln.MultiLevelCascadeAttentionWrapper(2, kiln_ws(), "NHD")
    kw.plan(*plan_args, H, H_KV, D, PAGE, q_data_type=BF16)
    kd = kiln.BatchDecodeWithPagedKVCacheWrapper(kiln_ws(), "NHD")
    kd.plan([b * (pre + priv) for b in range(B + 1)], dev_i32(plain), [PAGE] * B, H, H_KV, D, PAGE,
            q_data_type=BF16, kv_data_type=BF16)
    ident = lambda o: o
    cont = [("kiln", lambda c: kw.run(q, (kp, vp)), ident),
            ("kiln plain decode", lambda c: kd.run(q, (kp, vp)), ident)]
    if FI.has("paged:d128"):
        fw = FI.fi.MultiLevelCascadeAttentionWrapper(2, FI.ws, "NHD")
        fw.plan(*plan_args, H, H_KV, D, PAGE, q_data_type=BF16)
        cont.append(("FlashInfer", lambda c: fw.run(q, (kp, vp)), ident))
    else:
        RES.add(dict(suite=suite, point=f"B{B}", lib="FlashInfer", unit="GB/s", check="not run",
                     error=FI.missing("paged:d128")))
    # the contiguous equivalent: every request holds its own copy of the prefix
    try:
        pool_k, pool_v = kp, vp
        ids = torch.tensor(plain, device="cuda").view(B, -1)
        dk = pool_k[ids].view(B, L, H_KV, D).transpose(1, 2).contiguous()
        dv = pool_v[ids].view(B, L, H_KV, D).transpose(1, 2).contiguous()
        cont += torch_peers(False, [q.view(B, H, 1, D)], [dk], [dv], lambda o: o.reshape(B, H, D))
    except torch.OutOfMemoryError as e:
        RES.add(dict(suite=suite, point=f"B{B}", lib="SDPA", unit="GB/s", check="failed", error=short(e)))
    measure(suite, f"B{B} prefix {CASCADE_PREFIX} + {CASCADE_PRIVATE}", "GB/s", nbytes, cont, 1)


def suite_host(a, suite):
    """plan() and run() wall clock per call, decode paged at B 1 and B 256 (lengths 512..8192),
    the stream drained after each pair, untimed; kiln's C API through kiln-bench beside it."""
    import kiln
    D = 128
    for B in (1, 256):
        lens = [512 + (b * 7919) % 7681 for b in range(B)]
        pk = PagedKV(lens, D, BF16, 1)
        q = rnd(B, H, D)
        libs = [("kiln", kiln.BatchDecodeWithPagedKVCacheWrapper(kiln_ws(), "NHD"))]
        if FI.has("decode:d128:bf16"):
            libs.append(("FlashInfer", FI.fi.BatchDecodeWithPagedKVCacheWrapper(FI.ws, "NHD")))
        indptr_h, last_h = torch.tensor(pk.indptr_h, dtype=torch.int32), torch.tensor(pk.last_h, dtype=torch.int32)
        for name, w in libs:
            tp, tr = [], []
            for i in range(210):
                t0 = time.perf_counter()
                w.plan(indptr_h, pk.indices, last_h, H, H_KV, D, PAGE, q_data_type=BF16, kv_data_type=BF16)
                t1 = time.perf_counter()
                w.run(q, (pk.k[0], pk.v[0]))
                t2 = time.perf_counter()
                torch.cuda.synchronize()
                if i >= 10:
                    tp.append((t1 - t0) * 1e6)
                    tr.append((t2 - t1) * 1e6)
            for call, ts in (("plan", tp), ("run", tr)):
                ts.sort()
                row = dict(suite=suite, point=f"decode B{B} {call}", lib=name, unit="µs", gpu_us=None,
                           host_us=ts[len(ts) // 2], eager_us=None, check=f"min {ts[0]:.1f}, p90 {ts[len(ts) * 9 // 10]:.1f}")
                RES.add(row)
        del pk, libs
    kb = a.kiln_bench
    if kb and os.path.exists(kb):
        try:
            r = subprocess.run([kb, "--batch", "--only", "host overhead"], capture_output=True, text=True, timeout=120)
            for line in r.stdout.splitlines():
                m = re.match(r"\| (decode paged|prefill paged causal) \| (kiln_batch_plan|kiln_batch_run) \| (\d+) \| "
                             r"([\d.]+) \| ([\d.]+) \| ([\d.]+) \|", line)
                if m:
                    RES.add(dict(suite=suite, point=f"{m[1]} B{m[3]} {m[2][11:]}", lib="kiln C API", unit="µs",
                                 host_us=float(m[4]), check=f"min {m[5]}, p90 {m[6]}"))
        except Exception as e:  # noqa: BLE001
            RES.add(dict(suite=suite, point="C API", lib="kiln C API", unit="µs", check="failed", error=short(e)))


def torch_ceilings(suite):
    n = 2 << 30
    x = rnd(n // 2)
    y = torch.empty_like(x)
    measure(suite, "device-to-device copy (read + write)", "GB/s", 2 * n, [("torch", lambda c: y.copy_(x), lambda o: o)],
            1, ref_lib="torch")
    measure(suite, "streaming read, torch x.max()", "GB/s", n, [("torch", lambda c: x.max(), lambda o: o)], 1,
            ref_lib="torch")
    m = 8192
    A, B = rnd(m, m), rnd(m, m)
    measure(suite, "bf16 matmul 8192^3", "TFLOP/s", 2.0 * m ** 3, [("torch", lambda c: A @ B, lambda o: o)], 1,
            ref_lib="torch")


def suite_ceilings(a, suite):
    torch_ceilings(suite)
    torch.cuda.empty_cache()
    kb = a.kiln_bench
    if kb and os.path.exists(kb):
        try:
            r = subprocess.run([kb, "--ceilings"], capture_output=True, text=True, timeout=120)
            m2 = re.search(r"copy_GBps=(\d+) read_GBps=(\d+)", r.stdout)
            if m2:
                RES.ceil["kiln_copy"], RES.ceil["kiln_read"] = float(m2[1]), float(m2[2])
                RES.add(dict(suite=suite, point="streaming read, kiln's tuned kernel (events per launch)", lib="kiln",
                             unit="GB/s", rate=float(m2[2]), check="kiln-bench --ceilings"))
                RES.add(dict(suite=suite, point="device-to-device copy, cuMemcpyDtoD (events)", lib="kiln",
                             unit="GB/s", rate=float(m2[1]), check="kiln-bench --ceilings"))
            else:
                RES.add(dict(suite=suite, point="kiln ceilings", lib="kiln", unit="GB/s", check="failed",
                             error=(r.stdout + r.stderr)[-200:]))
        except Exception as e:  # noqa: BLE001
            RES.add(dict(suite=suite, point="kiln ceilings", lib="kiln", unit="GB/s", check="failed", error=short(e)))


SUITES = {
    "ceilings": suite_ceilings,
    "decode": suite_decode,
    "fp8": suite_decode,
    "decode-d": suite_decode,
    "prefill": suite_prefill,
    "prefill-d": suite_prefill,
    "variants": suite_variants,
    "bsr": suite_bsr,
    "cascade": suite_cascade,
    "host": suite_host,
}


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


# ---- the report --------------------------------------------------------------------------------

PEERS = ("FlashInfer", "FlashInfer-tc", "FA2", "cuDNN", "Flex", "FlashInfer paged")


def ceilings():
    """(read GB/s, matmul TFLOP/s) measured in this run: kiln's tuned read kernel (else torch's
    x.max()) and torch's bf16 matmul."""
    read = RES.ceil.get("kiln_read")
    mm = None
    for r in RES.rows:
        if r["suite"] == "ceilings" and r.get("rate"):
            if r["point"].startswith("streaming read, torch") and not read:
                read = r["rate"]
            if r["point"].startswith("bf16 matmul"):
                mm = r["rate"]
    return read, mm


def summary():
    """kiln / best peer per point, by GPU time (ratio > 1: kiln is faster), and kiln's share of
    the measured ceiling (GB/s: the streaming read; TFLOP/s: the bf16 matmul)."""
    read, mm = ceilings()
    lines = ["", "### kiln against the best peer, by GPU time (CUDA-graph replay)", "",
             f"Ceilings in this run: streaming read {read or 0:.0f} GB/s, bf16 matmul {mm or 0:.0f} TFLOP/s.", "",
             "| suite | point | kiln µs | best peer | peer µs | kiln / best | kiln rate | % of ceiling |",
             "|---|---|---|---|---|---|---|---|"]
    by = {}
    for r in RES.rows:
        by.setdefault((r["suite"], r["point"]), []).append(r)
    for (suite, point), rows in by.items():
        k = [r for r in rows if r["lib"] in ("kiln", "kiln paged") and r.get("gpu_us")]
        for kr in k:
            peers = [r for r in rows if r["lib"] in PEERS and r.get("gpu_us") and not r["check"].startswith("MISMATCH")
                     and (("paged" in r["lib"]) == ("paged" in kr["lib"]) or r["lib"] in ("FA2", "cuDNN", "Flex"))]
            ceil = read if kr["unit"] == "GB/s" else mm
            share = f"{100 * kr['rate'] / ceil:.1f}" if ceil and kr.get("rate") else ""
            name = point + (" (paged)" if "paged" in kr["lib"] else "")
            if not peers:
                lines.append(f"| {suite} | {name} | {kr['gpu_us']:.1f} | — | | | {kr['rate']:.0f} {kr['unit']} | {share} |")
                continue
            best = min(peers, key=lambda r: r["gpu_us"])
            ratio = best["gpu_us"] / kr["gpu_us"]
            lines.append(f"| {suite} | {name} | {kr['gpu_us']:.1f} | {best['lib']} | {best['gpu_us']:.1f} | "
                         f"{ratio:.2f} | {kr['rate']:.0f} {kr['unit']} | {share} |")
    lines += ["", "### Host time per call (µs; run: back-to-back, no sync; plan: each call then a drain)", "",
              "| suite | point | lib | host µs/call | eager µs/call | GPU µs |", "|---|---|---|---|---|---|"]
    for r in RES.rows:
        if r.get("host_us") is not None and r["suite"] != "ceilings":
            f = lambda k: f"{r[k]:.1f}" if r.get(k) is not None else "—"
            lines.append(f"| {r['suite']} | {r['point']} | {r['lib']} | {f('host_us')} | {f('eager_us')} | {f('gpu_us')} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the short sweep (about 3 minutes)")
    ap.add_argument("--only", default="", help="comma list of suites: " + " ".join(SUITES))
    ap.add_argument("--csv")
    ap.add_argument("--md")
    ap.add_argument("--json")
    ap.add_argument("--kiln-bench", default="build/bin/kiln-bench")
    ap.add_argument("--flashinfer", action="store_true", help="time FlashInfer too (importable, JIT built)")
    ap.add_argument("--fi-ok", help="file listing the FlashInfer configs that built")
    ap.add_argument("--fi-compile-only", action="store_true")
    ap.add_argument("--fi-configs", default=",".join(FI_CONFIGS))
    ap.add_argument("--fi-deadline", type=float, default=400)
    ap.add_argument("--no-flex", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("referee: no CUDA device", file=sys.stderr)
        return 2
    if a.fi_compile_only:
        return fi_compile_only([k for k in a.fi_configs.split(",") if k], a.fi_ok, a.fi_deadline)
    import kiln
    p = torch.cuda.get_device_properties(0)
    RES.meta.update(gpu=p.name, sms=p.multi_processor_count, torch=torch.__version__, cuda=torch.version.cuda,
                    cudnn=torch.backends.cudnn.version(), kiln=kiln.version(), nvrtc=kiln.nvrtc_version(),
                    date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), quick=a.quick,
                    method=f"graph {REPLAYS} replays x {BURSTS} bursts, rotate {ROTATE_BYTES >> 20} MiB; "
                           f"host: back-to-back calls no sync; eager: events + sync, {EAGER_CALLS} calls")
    if a.flashinfer:
        FI.load(a.fi_ok)
    else:
        FI.why = "FlashInfer not requested (--flashinfer)"
    print("# referee", json.dumps(RES.meta))
    print("\n| suite | point | lib | GPU µs | rate | host µs/call | eager µs/call | check | note |")
    print("|---|---|---|---|---|---|---|---|---|")
    only = [s for s in a.only.split(",") if s] or list(SUITES)
    t0 = time.time()
    for s in only:
        if s not in SUITES:
            print(f"referee: no suite {s!r} ({' '.join(SUITES)})", file=sys.stderr)
            return 2
        ts = time.time()
        try:
            SUITES[s](a, s)
        except Exception as e:  # noqa: BLE001 — a suite that breaks is reported, the rest still run
            import traceback
            traceback.print_exc()
            RES.add(dict(suite=s, point="(suite)", lib="-", unit="", check="failed", error=short(e)))
        print(f"<!-- suite {s}: {time.time() - ts:.0f} s -->", flush=True)
        torch.cuda.empty_cache()
    text = summary()
    print(text)
    print(f"\nreferee: {len(RES.rows)} rows in {time.time() - t0:.0f} s")
    if a.csv:
        keys = ["suite", "point", "lib", "unit", "gpu_us", "rate", "host_us", "eager_us", "check", "copies", "error"]
        with open(a.csv, "w") as f:
            f.write("# " + json.dumps(RES.meta) + "\n" + ",".join(keys) + "\n")
            for r in RES.rows:
                f.write(",".join('"' + str(r.get(k, "") if r.get(k) is not None else "").replace('"', "'") + '"'
                                 for k in keys) + "\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(meta=RES.meta, ceilings=RES.ceil, rows=RES.rows), f, indent=1)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
