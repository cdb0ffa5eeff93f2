"""peers_batch.py — kiln's batch peers on the shapes of `kiln-bench --batch` (tools/bench/batch.c),
run through `peers.py --batch`. bf16, H = 32, H_KV = 8, D = 128 unless noted; CUDA-event
timing, 3 warm-ups, median of 30, inputs rotated through copies where one copy's working set is
under 256 MiB (as kiln-bench does).

Peers:
  FA2 / cuDNN   torch SDPA on the contiguous equivalent: decode q [B, H, 1, D] against k, v
                [B, H_KV, L, D] with enable_gqa=True (GQA handled by the backend; where a backend
                refuses enable_gqa, K and V are repeated to H heads and the row says "rep");
                prefill q, k, v [B, H(_KV), S, D], is_causal=True (bottom-right = top-left
                when L_Q = L_KV). No fp8 KV in SDPA: fp8 points have FlashInfer only.
  Flex          torch.compile'd flex_attention, prefill always; decode with --flex-decode (one
                recompile per shape: slow, and MISSION.md saw it fall back silently).
  FlashInfer    (--flashinfer) BatchDecodeWithPagedKVCacheWrapper (CUDA-core and, for bf16 d128,
                use_tensor_cores=True), BatchPrefillWithPagedKVCacheWrapper and
                BatchPrefillWithRaggedKVCacheWrapper, MultiLevelCascadeAttentionWrapper; page 16,
                NHD, pages shuffled in the pool like kiln-bench's. Its kernels are JIT-compiled by
                nvcc: `--fi-compile-only` compiles every config once (a deadline stops before
                the next config) and writes the configs that worked to --fi-ok; the timed run
                uses only those.

Every peer is first checked against a float64 reference on a small shape (B 3, L 300); a
mismatch marks its rows. Decode GB/s counts K + V + q + o; prefill TFLOP/s 4·D·visible pairs·H
(causal: S(S+1)/2 pairs per request and head).
"""
import math
import os
import random
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

H, H_KV, PAGE = 32, 8, 16
ROTATE = 256 << 20
MAX_COPIES = 128
DEC_B, DEC_L = (1, 16, 64, 256), (512, 4096, 32768)
PRE_BS = ((1, 1024), (16, 1024), (1, 4096), (4, 4096), (1, 16384))
CASCADE_PREFIX, CASCADE_PRIVATE = 32768, 512
FP8 = torch.float8_e4m3fn


def host_len(b):
    """Lengths of the host-overhead batch; the same formula as batch.c."""
    return 512 + (b * 7919) % 7681


def copies_for(nbytes):
    return 1 if nbytes >= ROTATE else min(MAX_COPIES, math.ceil(ROTATE / max(nbytes, 1)))


def timeit(fn, copies, reps=30, warm=3):
    for i in range(warm):
        fn(i % copies)
    torch.cuda.synchronize()
    ts = []
    for i in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(i % copies)
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


# ---- reference and checks ------------------------------------------------------------------

def reference(q, k, v, causal):
    """q [B, H, Lq, D], k/v [B, H_KV, L, D] -> float64 o [B, H, Lq, D]; bottom-right causal."""
    q, k, v = q.double(), k.double(), v.double()
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        lq, lk = q.shape[2], k.shape[2]
        i = torch.arange(lq, device=q.device)[:, None]
        j = torch.arange(lk, device=q.device)[None, :]
        s = s.masked_fill(j > i + lk - lq, float("-inf"))
    return torch.softmax(s, -1) @ v


def rel_err(out, ref):
    out = out.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out - ref).norm() / ref.norm()).item()


def verdict(err, tol=2e-2):
    return "ok" if err <= tol else f"MISMATCH({err:.1e})"


def paged_pool(kv_lens, D, dtype, copies=1, seed=0, shared_prefix_pages=None):
    """A pool of shuffled pages holding each request's K and V, FlashInfer's NHD layout
    [pages, PAGE, H_KV, D]; returns (k_pools, v_pools, indptr, indices, last, k_dense, v_dense)
    where *_dense [B, H_KV, L, D] are the same values contiguous (for references; only built
    when small)."""
    npages = [(L + PAGE - 1) // PAGE for L in kv_lens]
    total = sum(npages)
    rng = random.Random(seed)
    perm = list(range(total))
    rng.shuffle(perm)
    indptr = [0]
    for n in npages:
        indptr.append(indptr[-1] + n)
    last = [L - (n - 1) * PAGE for L, n in zip(kv_lens, npages)]
    kp, vp = [], []
    for c in range(copies):
        kp.append(torch.empty(total, PAGE, H_KV, D, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1).to(dtype))
        vp.append(torch.empty(total, PAGE, H_KV, D, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1).to(dtype))
    dev = lambda x: torch.tensor(x, dtype=torch.int32, device="cuda")
    return kp, vp, dev(indptr), dev(perm), dev(last), perm, indptr


def dense_of(pool, perm, indptr, b, L):
    """Request b's K (or V) from a pool as [H_KV, L, D]."""
    pages = torch.tensor(perm[indptr[b]:indptr[b + 1]], device="cuda")
    x = pool.view(torch.uint8)[pages].view(pool.dtype).to(torch.bfloat16)  # gathers bytes: fp8 too
    return x.reshape(-1, H_KV, pool.shape[-1])[:L].permute(1, 0, 2)


# ---- torch peers ---------------------------------------------------------------------------

def sdpa(backend, causal):
    def f(q, k, v):
        with sdpa_kernel(backend):
            try:
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
            except RuntimeError:
                g = q.shape[1] // k.shape[1]
                return F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1),
                                                      is_causal=causal)
    return f


def gqa_note(backend, q, k, v):
    """'' when the backend takes enable_gqa, 'rep' when it needs repeated K/V."""
    with sdpa_kernel(backend):
        try:
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            return ""
        except RuntimeError:
            return "rep"
        except Exception:  # noqa: BLE001 — a note, never a failure
            return "?"


_flex = None


def flex(causal, L_Q, L_KV):
    global _flex
    from torch.nn.attention.flex_attention import flex_attention, create_block_mask
    if _flex is None:
        import torch._dynamo
        torch._dynamo.config.cache_size_limit = 256  # one compile per shape, never a silent fallback
        _flex = torch.compile(flex_attention, dynamic=False)
    bm = create_block_mask(lambda b, h, q, kv: q + (L_KV - L_Q) >= kv, None, None, L_Q, L_KV) if causal else None
    return lambda q, k, v: _flex(q, k, v, block_mask=bm, enable_gqa=True)


# ---- FlashInfer ----------------------------------------------------------------------------

class FI:
    """FlashInfer wrappers, created once per config key; `ok` limits them to configs that
    compiled (from --fi-ok)."""

    def __init__(self, ok=None):
        import flashinfer
        self.fi = flashinfer
        self.version = flashinfer.__version__
        self.ws = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
        self.ok = ok

    def allowed(self, key):
        return self.ok is None or key in self.ok

    def decode(self, D, kv_dtype, tc, B, kv_lens, indptr, indices, last):
        w = self.fi.BatchDecodeWithPagedKVCacheWrapper(self.ws, "NHD", use_tensor_cores=tc)
        w.plan(indptr, indices, last, H, H_KV, D, PAGE, q_data_type=torch.bfloat16, kv_data_type=kv_dtype)
        return w

    def prefill_paged(self, D, causal, qo_indptr, indptr, indices, last):
        w = self.fi.BatchPrefillWithPagedKVCacheWrapper(self.ws, "NHD")
        w.plan(qo_indptr, indptr, indices, last, H, H_KV, D, PAGE, causal=causal, q_data_type=torch.bfloat16,
               kv_data_type=torch.bfloat16)
        return w

    def prefill_ragged(self, D, causal, qo_indptr, kv_indptr):
        w = self.fi.BatchPrefillWithRaggedKVCacheWrapper(self.ws, "NHD")
        w.plan(qo_indptr, kv_indptr, H, H_KV, D, causal=causal, q_data_type=torch.bfloat16,
               kv_data_type=torch.bfloat16)
        return w


def fi_key(kind, D, dt="bf16"):
    return f"{kind}:d{D}:{dt}"


# in the order compiled: a deadline drops the last ones first
FI_CONFIGS_DEFAULT = [fi_key("decode", 128), fi_key("decode-tc", 128), fi_key("prefill-ragged", 128),
                      fi_key("prefill-paged", 128), fi_key("decode", 128, "fp8"), fi_key("cascade", 128)]
FI_CONFIGS_ALL = FI_CONFIGS_DEFAULT + [fi_key("decode", 64), fi_key("decode", 256), fi_key("decode", 64, "fp8"),
                                       fi_key("decode", 256, "fp8")]


def fi_check(fi, key):
    """Run config `key` on a small shape and compare with the reference; returns the verdict."""
    kind, d, dt = key.split(":")
    D = int(d[1:])
    kv_dtype = FP8 if dt == "fp8" else torch.bfloat16
    lens = [300, 37, 129]
    B = len(lens)
    kp, vp, indptr, indices, last, perm, ip = paged_pool(lens, D, kv_dtype)
    k, v = kp[0], vp[0]
    kd = [dense_of(k, perm, ip, b, L).to(torch.bfloat16) for b, L in enumerate(lens)]
    vd = [dense_of(v, perm, ip, b, L).to(torch.bfloat16) for b, L in enumerate(lens)]
    errs = []
    if kind in ("decode", "decode-tc", "cascade"):
        q = torch.randn(B, H, D, device="cuda", dtype=torch.bfloat16)
        w = fi.decode(D, kv_dtype, kind == "decode-tc", B, lens, indptr, indices, last)
        o = w.run(q, (k, v))
        if kind == "cascade":
            o2, lse2 = w.run(q, (k, v), return_lse=True)
            o3 = o2.clone()
            fi.fi.merge_state_in_place(o3, lse2.clone(), o2, lse2)  # a state merged with itself is itself
            o = o3
        for b in range(B):
            errs.append(rel_err(o[b][None, :, None], reference(q[b][None, :, None], kd[b][None], vd[b][None], False)))
    else:
        S = lens
        qol = [0] + list(itertools_accumulate(S))
        qo = torch.tensor(qol, dtype=torch.int32, device="cuda")
        q = torch.randn(sum(S), H, D, device="cuda", dtype=torch.bfloat16)
        if kind == "prefill-paged":
            o = fi.prefill_paged(D, True, qo, indptr, indices, last).run(q, (k, v))
        else:
            kr = torch.cat([x.permute(1, 0, 2) for x in kd]).contiguous()
            vr = torch.cat([x.permute(1, 0, 2) for x in vd]).contiguous()
            o = fi.prefill_ragged(D, True, qo, qo).run(q, kr, vr)
        for b in range(B):
            qb = q[qol[b]:qol[b + 1]].permute(1, 0, 2)[None]
            errs.append(rel_err(o[qol[b]:qol[b + 1]].permute(1, 0, 2)[None], reference(qb, kd[b][None], vd[b][None], True)))
    return verdict(max(errs), 6e-2 if dt == "fp8" else 2e-2)


def itertools_accumulate(xs):
    s = 0
    for x in xs:
        s += x
        yield s


def fi_compile(ok_path, configs, deadline_s):
    """Compile (JIT) and check every config once; write the ones that work to ok_path."""
    t0 = time.time()
    fi = FI()
    print(f"FlashInfer {fi.version}: compiling {len(configs)} configs (deadline {deadline_s} s)", flush=True)
    good = []
    for key in configs:
        if time.time() - t0 > deadline_s:
            print(f"  {key}: skipped (deadline)", flush=True)
            continue
        t = time.time()
        try:
            v = fi_check(fi, key)
            torch.cuda.synchronize()
            print(f"  {key}: {time.time() - t:.1f} s, check {v}", flush=True)
            if v == "ok":
                good.append(key)
        except Exception as e:  # noqa: BLE001 — a config that fails to build is reported, not fatal
            print(f"  {key}: failed after {time.time() - t:.1f} s: {type(e).__name__}: {str(e)[:300]}", flush=True)
        with open(ok_path, "w") as f:  # after every config: a killed run keeps what compiled
            f.write("".join(k + "\n" for k in good))
    print(f"FlashInfer: {len(good)} of {len(configs)} configs ready ({time.time() - t0:.0f} s)")


# ---- the suites ----------------------------------------------------------------------------

class Out:
    def __init__(self):
        self.rows = []

    def row(self, name, B, L_Q, L_KV, peer, ms, gbs, tf, check, note=""):
        self.rows.append((name, B, L_Q, L_KV, peer + (f" ({note})" if note else ""), ms, gbs, tf, check))
        print(f"| {name} | {B} | {L_Q} | {L_KV} | {peer}{' (' + note + ')' if note else ''} | {ms:.4f} | "
              f"{gbs:.0f} | {tf:.1f} | {check} |", flush=True)

    def fail(self, name, B, L_Q, L_KV, peer, e):
        print(f"| {name} | {B} | {L_Q} | {L_KV} | {peer} | failed: {type(e).__name__}: {str(e)[:100]} | | | |",
              flush=True)


def torch_checks(flex_decode):
    """Small-shape verdicts of the torch peers, decode and causal prefill."""
    res = {}
    B, L, D = 3, 300, 128
    q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, H_KV, L, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, H_KV, L, D, device="cuda", dtype=torch.bfloat16)
    qp = torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16)
    for pname, be in (("FA2", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION)):
        for op, qq, causal in (("decode", q, False), ("prefill", qp, True)):
            try:
                res[(pname, op)] = verdict(rel_err(sdpa(be, causal)(qq, k, v), reference(qq, k, v, causal)))
            except Exception as e:  # noqa: BLE001
                res[(pname, op)] = f"failed: {type(e).__name__}"
    for op, qq, causal in (("decode", q, False), ("prefill", qp, True)):
        if op == "decode" and not flex_decode:
            continue
        try:
            res[("Flex", op)] = verdict(rel_err(flex(causal, qq.shape[2], L)(qq, k, v), reference(qq, k, v, causal)))
        except Exception as e:  # noqa: BLE001
            res[("Flex", op)] = f"failed: {type(e).__name__}"
    return res


def decode_suite(a, out, fi, checks):
    points = []
    for dt in ("bf16", "fp8"):
        for B in DEC_B:
            for L in DEC_L:
                if a.quick and (B in (16, 256) or L == 512):
                    continue
                points.append((dt, 128, B, L))
    for dt in ("bf16", "fp8"):
        for D in (64, 256):
            points.append((dt, D, 64, 4096))
    for dt, D, B, L in points:
        name = "batch decode" + (" fp8" if dt == "fp8" else "") + ("" if D == 128 else f" d{D}")
        elt = 1 if dt == "fp8" else 2
        nbytes = B * L * H_KV * D * elt * 2 + B * H * D * 2 * 2
        copies = copies_for(nbytes)
        if nbytes * copies > a.max_gib * (1 << 30):
            print(f"| {name} | {B} | 1 | {L} | all | skipped: {nbytes * copies / 2**30:.1f} GiB | | | |")
            continue
        gb = lambda ms: nbytes / (ms * 1e-3) / 1e9
        if dt == "bf16":
            try:
                qs = [torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
                ks = [torch.randn(B, H_KV, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
                vs = [torch.randn(B, H_KV, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
                peers = [("FA2", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION)]
                for pname, be in peers:
                    try:
                        note = gqa_note(be, qs[0], ks[0], vs[0])
                        f = sdpa(be, False)
                        ms = timeit(lambda c: f(qs[c], ks[c], vs[c]), copies)
                        out.row(name, B, 1, L, pname, ms, gb(ms), 0, checks.get((pname, "decode"), ""), note)
                    except Exception as e:  # noqa: BLE001
                        out.fail(name, B, 1, L, pname, e)
                if a.flex_decode:
                    try:
                        f = flex(False, 1, L)
                        ms = timeit(lambda c: f(qs[c], ks[c], vs[c]), copies)
                        out.row(name, B, 1, L, "Flex", ms, gb(ms), 0, checks.get(("Flex", "decode"), ""))
                    except Exception as e:  # noqa: BLE001
                        out.fail(name, B, 1, L, "Flex", e)
                qs = ks = vs = None
            except torch.OutOfMemoryError as e:
                out.fail(name, B, 1, L, "SDPA", e)
        if fi is not None:
            kv_dtype = FP8 if dt == "fp8" else torch.bfloat16
            for kind, tc in (("decode", False), ("decode-tc", True)):
                key = fi_key(kind, D, dt)
                if not fi.allowed(key) or (tc and (dt != "bf16" or D != 128)):
                    continue
                try:
                    kp, vp, indptr, indices, last, _, _ = paged_pool([L] * B, D, kv_dtype, copies)
                    qs = [torch.randn(B, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
                    w = fi.decode(D, kv_dtype, tc, B, [L] * B, indptr, indices, last)
                    ms = timeit(lambda c: w.run(qs[c], (kp[c], vp[c])), copies)
                    out.row(name, B, 1, L, "FlashInfer" + ("-tc" if tc else ""), ms, gb(ms), 0, "ok")
                    kp = vp = qs = w = None
                except Exception as e:  # noqa: BLE001
                    out.fail(name, B, 1, L, "FlashInfer" + ("-tc" if tc else ""), e)
        torch.cuda.empty_cache()


def prefill_suite(a, out, fi, checks):
    D = 128
    for B, S in PRE_BS:
        if a.quick and (B, S) not in ((4, 4096), (16, 1024)):
            continue
        pairs = S * (S + 1) // 2
        flops = 4.0 * D * pairs * H * B
        nbytes = (2 * B * H * S * D + 2 * B * H_KV * S * D) * 2
        copies = copies_for(nbytes)
        tf = lambda ms: flops / (ms * 1e-3) / 1e12
        name = "batch prefill causal"
        qs = [torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        ks = [torch.randn(B, H_KV, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        vs = [torch.randn(B, H_KV, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        for pname, be in (("FA2", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION)):
            try:
                f = sdpa(be, True)
                ms = timeit(lambda c: f(qs[c], ks[c], vs[c]), copies)
                out.row(name, B, S, S, pname, ms, 0, tf(ms), checks.get((pname, "prefill"), ""),
                        gqa_note(be, qs[0][:, :, :16], ks[0][:, :, :16], vs[0][:, :, :16]))
            except Exception as e:  # noqa: BLE001
                out.fail(name, B, S, S, pname, e)
        if not a.no_flex:
            try:
                f = flex(True, S, S)
                ms = timeit(lambda c: f(qs[c], ks[c], vs[c]), copies)
                out.row(name, B, S, S, "Flex", ms, 0, tf(ms), checks.get(("Flex", "prefill"), ""))
            except Exception as e:  # noqa: BLE001
                out.fail(name, B, S, S, "Flex", e)
        if fi is not None:
            qo = torch.arange(0, (B + 1) * S, S, dtype=torch.int32, device="cuda")
            qf = [x.transpose(1, 2).reshape(B * S, H, D).contiguous() for x in qs]
            if fi.allowed(fi_key("prefill-ragged", D)):
                try:
                    kf = [x.transpose(1, 2).reshape(B * S, H_KV, D).contiguous() for x in ks]
                    vf = [x.transpose(1, 2).reshape(B * S, H_KV, D).contiguous() for x in vs]
                    w = fi.prefill_ragged(D, True, qo, qo)
                    ms = timeit(lambda c: w.run(qf[c], kf[c], vf[c]), copies)
                    out.row("batch prefill ragged causal", B, S, S, "FlashInfer", ms, 0, tf(ms), "ok")
                    kf = vf = w = None
                except Exception as e:  # noqa: BLE001
                    out.fail("batch prefill ragged causal", B, S, S, "FlashInfer", e)
            if fi.allowed(fi_key("prefill-paged", D)):
                try:
                    kp, vp, indptr, indices, last, _, _ = paged_pool([S] * B, D, torch.bfloat16, copies)
                    w = fi.prefill_paged(D, True, qo, indptr, indices, last)
                    ms = timeit(lambda c: w.run(qf[c], (kp[c], vp[c])), copies)
                    out.row("batch prefill paged causal", B, S, S, "FlashInfer", ms, 0, tf(ms), "ok")
                    kp = vp = w = None
                except Exception as e:  # noqa: BLE001
                    out.fail("batch prefill paged causal", B, S, S, "FlashInfer", e)
        qs = ks = vs = None
        torch.cuda.empty_cache()


def cascade_suite(a, out, fi):
    D = 128
    L = CASCADE_PREFIX + CASCADE_PRIVATE
    for B in (64, 256):
        if a.quick and B == 256:
            continue
        nbytes = 2 * (CASCADE_PREFIX + B * CASCADE_PRIVATE) * H_KV * D * 2 + B * H * D * 2 * 2
        gb = lambda ms: nbytes / (ms * 1e-3) / 1e9
        # SDPA: every request holds its own copy of the prefix (the contiguous equivalent)
        try:
            q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(B, H_KV, L, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(B, H_KV, L, D, device="cuda", dtype=torch.bfloat16)
            for pname, be in (("FA2", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION)):
                try:
                    f = sdpa(be, False)
                    ms = timeit(lambda c: f(q, k, v), 1)
                    out.row("cascade plain", B, 1, L, pname, ms, gb(ms), 0, "")
                except Exception as e:  # noqa: BLE001
                    out.fail("cascade plain", B, 1, L, pname, e)
            q = k = v = None
            torch.cuda.empty_cache()
        except torch.OutOfMemoryError as e:
            out.fail("cascade plain", B, 1, L, "SDPA", e)
        if fi is None or not fi.allowed(fi_key("cascade", D)):
            continue
        try:
            pre_pages, priv_pages = CASCADE_PREFIX // PAGE, CASCADE_PRIVATE // PAGE
            total = pre_pages + B * priv_pages
            perm = list(range(total))
            random.Random(7).shuffle(perm)
            kp = torch.empty(total, PAGE, H_KV, D, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1)
            vp = torch.empty_like(kp).uniform_(-1, 1)
            q = torch.randn(B, H, D, device="cuda", dtype=torch.bfloat16)
            dev = lambda x: torch.tensor(x, dtype=torch.int32, device="cuda")
            prefix, priv = perm[:pre_pages], perm[pre_pages:]
            plain_idx = []
            for b in range(B):
                plain_idx += prefix + priv[b * priv_pages:(b + 1) * priv_pages]
            ip = dev([b * (pre_pages + priv_pages) for b in range(B + 1)])
            w = fi.decode(D, torch.bfloat16, False, B, [L] * B, ip, dev(plain_idx), dev([PAGE] * B))
            ms = timeit(lambda c: w.run(q, (kp, vp)), 1)
            o_plain = w.run(q, (kp, vp))
            out.row("cascade plain", B, 1, L, "FlashInfer", ms, gb(ms), 0, "ok")
            mw = fi.fi.MultiLevelCascadeAttentionWrapper(2, fi.ws, "NHD")
            mw.plan([dev([0, B]), dev(list(range(B + 1)))],
                    [dev([0, pre_pages]), dev([b * priv_pages for b in range(B + 1)])],
                    [dev(prefix), dev(priv)], [dev([PAGE]), dev([PAGE] * B)],
                    H, H_KV, D, PAGE, q_data_type=torch.bfloat16)
            ms = timeit(lambda c: mw.run(q, (kp, vp)), 1)
            o_c = mw.run(q, (kp, vp))
            chk = verdict(rel_err(o_c, o_plain.double()))
            out.row("cascade", B, 1, L, "FlashInfer", ms, gb(ms), 0, chk)
            kp = vp = w = mw = None
            torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001
            out.fail("cascade", B, 1, L, "FlashInfer", e)


def host_suite(a, out, fi):
    """FlashInfer's plan() and run() wall clock per call, batch 256, the lengths of batch.c."""
    if fi is None or not fi.allowed(fi_key("decode", 128)):
        return
    B, D = 256, 128
    lens = [host_len(b) for b in range(B)]
    kp, vp, indptr, indices, last, _, _ = paged_pool(lens, D, torch.bfloat16)
    indptr, last = indptr.cpu(), last.cpu()  # host copies, as engines pass them: plan() need not sync
    q = torch.randn(B, H, D, device="cuda", dtype=torch.bfloat16)
    for tc in (False, True):
        if tc and not fi.allowed(fi_key("decode-tc", 128)):
            continue
        w = fi.fi.BatchDecodeWithPagedKVCacheWrapper(fi.ws, "NHD", use_tensor_cores=tc)
        tp, tr = [], []
        for i in range(1010):
            t0 = time.perf_counter()
            w.plan(indptr, indices, last, H, H_KV, D, PAGE, q_data_type=torch.bfloat16,
                   kv_data_type=torch.bfloat16)
            t1 = time.perf_counter()
            w.run(q, (kp[0], vp[0]))
            t2 = time.perf_counter()
            if i >= 10:
                tp.append((t1 - t0) * 1e6)
                tr.append((t2 - t1) * 1e6)
            if i % 16 == 15:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        tp.sort()
        tr.sort()
        peer = "FlashInfer" + ("-tc" if tc else "")
        print(f"| host plan decode paged | {B} | {peer} | median {tp[500]:.1f} µs, min {tp[0]:.1f}, p90 {tp[900]:.1f} |")
        print(f"| host run decode paged | {B} | {peer} | median {tr[500]:.1f} µs, min {tr[0]:.1f}, p90 {tr[900]:.1f} |")
        out.rows.append(("host plan decode paged", B, 1, 0, peer, tp[500] / 1e3, 0, 0, "us"))
        out.rows.append(("host run decode paged", B, 1, 0, peer, tr[500] / 1e3, 0, 0, "us"))


def run(a, meta):
    """The batch peers; returns the rows for the CSV."""
    out = Out()
    fi = None
    if a.flashinfer:
        ok = None
        if a.fi_ok and os.path.exists(a.fi_ok):
            ok = set(x.strip() for x in open(a.fi_ok) if x.strip())
        try:
            fi = FI(ok)
            meta["flashinfer"] = fi.version
            print(f"FlashInfer {fi.version}; configs: {sorted(ok) if ok is not None else 'all (compiled on use)'}")
        except Exception as e:  # noqa: BLE001
            print(f"FlashInfer unavailable: {type(e).__name__}: {e}")
    checks = torch_checks(a.flex_decode)
    print("checks (small shape vs float64):", ", ".join(f"{p} {o}: {v}" for (p, o), v in sorted(checks.items())))
    print("\n| point | B | L_Q | L_KV | peer | ms | GB/s | TFLOP/s | check |\n|---|---|---|---|---|---|---|---|---|")
    only = a.only
    if not only or only.startswith("batch decode"):
        decode_suite(a, out, fi, checks)
    if not only or only.startswith("batch prefill"):
        prefill_suite(a, out, fi, checks)
    if not only or only == "cascade":
        cascade_suite(a, out, fi)
    if not only or only == "host overhead":
        host_suite(a, out, fi)
    return out.rows
