"""referee_suites.py — the referee's suites, one function per suite in SUITES: ceilings, paged
decode (bf16, fp8, head dims), batch prefill, variants, block-sparse, cascade and host overhead.
Each point measures kiln and its peers on identical inputs (referee_common.measure)."""
import math
import os
import random
import re
import subprocess
import time

import torch

from referee_common import (BF16, CASCADE_PREFIX, CASCADE_PRIVATE, DEC_B, DEC_L, FP8, G, H, H_KV, PAGE,
    PRE_BS, RES, SOFTCAP, WINDOW, copies_for, fresh_memory, measure, short)
from referee_peers import (FI, PagedKV, dev_i32, fi_decode, fi_paged, fi_ragged, flex_fn, kiln_bsr_args, kiln_ws,
    paged_from_ragged, rnd, torch_peers)


# ---- suites ------------------------------------------------------------------------------------

def decode_point(suite, B, L, D, kv_dtype, a):
    fresh_memory()
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
    """Ragged (and paged) batch prefill of B requests of S tokens (L_Q = L_KV = S); at B = 1
    also kiln's single-request prefill ("kiln single")."""
    fresh_memory()
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
    if B == 1 and variant is None:  # the single-request API on the same request (its own grid)
        cont.append(("kiln single",
                     lambda c: kiln.single_prefill_with_kv_cache(qs[c], ks[c], vs[c], causal=causal), ident))
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
            if tile_map and "buf" not in maps:  # planned once, outside any capture: the mask is fixed
                n = kern.prefill_mask_plan_size(S, S)
                maps["buf"] = torch.empty(max(n, 1), dtype=torch.uint8, device="cuda")
                kern.prefill_mask_plan(kiln_bsr_args(qs[c], ks[c], vs[c], o, ip_d, ix_d, S, R, maps["buf"], n),
                                       stream())
            buf = maps["buf"] if tile_map else None
            x = kiln_bsr_args(qs[c], ks[c], vs[c], o, ip_d, ix_d, S, R, buf, buf.numel() if tile_map else 0)
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
    fresh_memory()
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
        kv = (pk.k[0], pk.v[0])  # made once: indexing the pool is not the library's call
        for name, w in libs:
            tp, tr = [], []
            for i in range(210):
                t0 = time.perf_counter()
                w.plan(indptr_h, pk.indices, last_h, H, H_KV, D, PAGE, q_data_type=BF16, kv_data_type=BF16)
                t1 = time.perf_counter()
                w.run(q, kv)
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
                m = re.match(r"\| (decode paged|prefill paged causal) \| (kiln_plan_schedule|kiln_plan_run) \| (\d+) \| "
                             r"([\d.]+) \| ([\d.]+) \| ([\d.]+) \|", line)
                if m:
                    RES.add(dict(suite=suite, point=f"{m[1]} B{m[3]} {m[2][len('kiln_plan_'):]}", lib="kiln C API", unit="µs",
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
                # the paged decode's read pattern (page 16, 8 KV heads, d128) without its arithmetic
                for lay in ("nhd", "hnd"):
                    m3 = re.search(rf"paged_{lay}_read_GBps=(\d+)", r.stdout)
                    if m3 and float(m3[1]) > 0:
                        RES.add(dict(suite=suite, lib="kiln", unit="GB/s", rate=float(m3[1]),
                                     point=f"paged read, page 16, {lay.upper()}, kiln's kernel (events per launch)",
                                     check="kiln-bench --ceilings"))
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
