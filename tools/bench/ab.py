#!/usr/bin/env python3
"""ab.py — kiln A/B runs by the referee's GPU timing (KILN_TUNE settings, or other builds).

Each setting runs in a process of its own, so that one lease can compare KILN_TUNE
configurations or two builds of libkiln.so (an old and a new one) on the same machine. A tuning aid: docs/perf.md's figures stay
the referee's (tools/bench/referee.py), which times the peers beside kiln.

GPU time as the referee measures it (referee_common.time_graph: a CUDA graph of one call per
rotated copy of the inputs, replayed in bursts, the median burst / calls), on the referee's
shapes (bf16, H 32, H_KV 8, D 128) through kiln's FlashInfer-shaped wrappers. No reference is
computed: the GPU tests check these kernels.

    python3 tools/bench/ab.py --tunes ';persist=0' --lib old=/path/to/libkiln.so --rounds 2 \\
        --points pre:4:4096:c,ppre:4:4096:c:16,single:16384:n,dec:64:4096

Points (c: causal, n: not):
    pre:B:S:c|n[:D]     ragged batch prefill, B requests of S tokens (BatchPrefillWithRaggedKVCacheWrapper)
    ppre:B:S:c|n:P      the same rows in shuffled pages of P tokens (BatchPrefillWithPagedKVCacheWrapper)
    single:S:c|n        single_prefill_with_kv_cache of S tokens
    win:B:S:W           ragged batch prefill, causal, a sliding window of W keys before each query
                        (window_left=W, the referee's window variant at 4:4096:1024)
    cap:B:S / snip:B:S  ragged batch prefill, causal, soft-cap 30: builtin (logits_soft_cap) / the
                        referee's snippet `cap * tanhf(logits / cap)` through the raw API
    bsr:S:P[:c]         a single request of S tokens under a block-sparse mask (64 x 64 blocks, each
                        kept with probability P %, the diagonal always; the referee's bsr suite is
                        bsr:4096:25), its tile map planned once; TFLOP/s of the kept blocks
    dec:B:L[:OPT...]    paged decode (page 16), B requests of L keys (BatchDecodeWithPagedKVCacheWrapper);
                        OPT: d64 / d256 (head dim, else 128), e4m3 / e5m2 (fp8 KV), split=P (plan's
                        fixed_split_size, P pages), nosplit (disable_split_kv), gN (group N,
                        1..64: 8 N query heads over the 8 KV heads; else 4)
--eager N runs each point's call N times in this process, untimed (a target for ncu).
--tunes: settings of KILN_TUNE separated by ';' (an empty one is the default; a word KILN_X=V in a
setting sets that environment variable instead, e.g. 'KILN_JOB_HEADS=4'); --lib NAME=PATH
adds a run of another library with no KILN_TUNE. $KILN_LIB is the library of the --tunes runs.
Prints each measurement as it comes, then a table: µs and TFLOP/s or GB/s, a column a setting,
one figure a round.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

from clocks import describe  # noqa: E402 — after the path


def prefill_inputs(B, S, D):
    from referee_common import H, H_KV, copies_for
    from referee_peers import rnd
    copies = copies_for(B * S * (H + 2 * H_KV) * D * 2 * 2)
    mk = lambda h: [rnd(B * S, h, D) for _ in range(copies)]
    return copies, mk(H), mk(H_KV), mk(H_KV)


def prefill_flops(B, S, causal, D):
    from referee_common import H
    pairs = S * (S + 1) // 2 if causal else S * S
    return 4.0 * D * pairs * H * B


def ragged_fn(qs, ks, vs, qo, D, **plan_kw):
    """run(copy) of kiln's ragged batch prefill wrapper planned over qo with plan_kw."""
    import kiln
    import referee_peers as rp
    from referee_common import BF16, H, H_KV
    w = kiln.BatchPrefillWithRaggedKVCacheWrapper(rp.kiln_ws(), "NHD")
    w.plan(qo, qo, H, H_KV, D, q_data_type=BF16, kv_data_type=BF16, **plan_kw)
    return lambda c: w.run(qs[c], ks[c], vs[c])


def point_fn(f):
    """(fn(copy), copies, work, unit) of one point's words f."""
    import kiln
    import referee_peers as rp
    from referee_common import BF16, H, H_KV, PAGE, copies_for
    kind = f[0]
    if kind in ("pre", "ppre"):
        B, S, causal = int(f[1]), int(f[2]), f[3] == "c"
        D = int(f[4]) if kind == "pre" and len(f) > 4 else 128
        copies, qs, ks, vs = prefill_inputs(B, S, D)
        qo = [i * S for i in range(B + 1)]
        if kind == "pre":
            fn = ragged_fn(qs, ks, vs, qo, D, causal=causal)
        else:
            P = int(f[4])
            old, rp.PAGE = rp.PAGE, P  # paged_from_ragged pages by the module's PAGE
            try:
                kp, vp, indptr, indices, last = rp.paged_from_ragged(B, S, ks, vs)
            finally:
                rp.PAGE = old
            w = kiln.BatchPrefillWithPagedKVCacheWrapper(rp.kiln_ws(), "NHD")
            w.plan(qo, indptr.tolist(), indices, last.tolist(), H, H_KV, D, P, causal=causal,
                   q_data_type=BF16, kv_data_type=BF16)
            fn = lambda c: w.run(qs[c], (kp[c], vp[c]))
        return fn, copies, prefill_flops(B, S, causal, D), "TFLOP/s"
    if kind == "win":
        B, S, W = int(f[1]), int(f[2]), int(f[3])
        copies, qs, ks, vs = prefill_inputs(B, S, 128)
        qo = [i * S for i in range(B + 1)]
        pairs = sum(min(i + 1, W + 1) for i in range(S))
        fn = ragged_fn(qs, ks, vs, qo, 128, causal=True, window_left=W)
        return fn, copies, 4.0 * 128 * pairs * H * B, "TFLOP/s"
    if kind in ("cap", "snip"):
        import referee_suites as rs
        from referee_common import SOFTCAP
        B, S = int(f[1]), int(f[2])
        copies, qs, ks, vs = prefill_inputs(B, S, 128)
        qo = [i * S for i in range(B + 1)]
        if kind == "snip":
            fn = rs.kiln_snippet_softcap(qs, ks, vs, qo, B * S, 128)
        else:
            fn = ragged_fn(qs, ks, vs, qo, 128, causal=True, logits_soft_cap=SOFTCAP)
        return fn, copies, prefill_flops(B, S, True, 128), "TFLOP/s"
    if kind == "single":
        S, causal = int(f[1]), f[2] == "c"
        copies, qs, ks, vs = prefill_inputs(1, S, 128)
        fn = lambda c: kiln.single_prefill_with_kv_cache(qs[c], ks[c], vs[c], causal=causal)
        return fn, copies, prefill_flops(1, S, causal, 128), "TFLOP/s"
    if kind == "bsr":
        import random
        import torch
        S, P, causal, R, D = int(f[1]), int(f[2]), len(f) > 3 and f[3] == "c", 64, 128
        nb = (S + R - 1) // R
        rng = random.Random(11)
        indptr, indices = [0], []
        for r in range(nb):
            indices += [c for c in range(nb) if c == r or (c < r or not causal) and rng.random() < P / 100]
            indptr.append(len(indices))
        copies, qs, ks, vs = prefill_inputs(1, S, D)
        mask = "mask=causal " if causal else ""
        kern = kiln.default_context().kernel(kiln.Variant(
            f"op=prefill dtype=bf16 head_dim={D} group={H // H_KV} {mask}mask_data=bsr"))
        ip = torch.tensor(indptr, dtype=torch.int32, device="cuda")
        ix = torch.tensor(indices, dtype=torch.int32, device="cuda")
        n = kern.prefill_mask_plan_size(S, S)
        tmap = torch.empty(max(n, 1), dtype=torch.uint8, device="cuda")
        stream = lambda: torch.cuda.current_stream().cuda_stream

        args = lambda c, o: rp.kiln_bsr_args(qs[c], ks[c], vs[c], o, ip, ix, S, R, tmap, n)

        o0 = torch.empty(S, H, D, device="cuda", dtype=BF16)
        kern.prefill_mask_plan(args(0, o0), stream())  # planned once, outside any capture

        def fn(c):
            o = torch.empty(S, H, D, device="cuda", dtype=BF16)
            kern.single_prefill(args(c, o), stream())
            return o
        return fn, copies, 4.0 * D * len(indices) * R * R * H, "TFLOP/s"
    if kind == "dec":
        import torch
        B, L, D = int(f[1]), int(f[2]), 128
        kv_dt, kw, hq = BF16, {}, H
        for o in f[3:]:
            if o in ("d64", "d256"):
                D = int(o[1:])
            elif o[:1] == "g" and o[1:].isdigit() and 1 <= int(o[1:]) <= 64:
                hq = H_KV * int(o[1:])
            elif o in ("e4m3", "e5m2"):
                kv_dt = torch.float8_e4m3fn if o == "e4m3" else torch.float8_e5m2
            elif o.startswith("split="):
                kw["fixed_split_size"] = int(o[6:])
            elif o == "nosplit":
                kw["disable_split_kv"] = True
            elif o:
                raise ValueError(f"unknown dec option {o!r}")
        es = 1 if kv_dt != BF16 else 2
        nbytes = B * L * H_KV * D * es * 2 + B * hq * D * 2 * 2
        copies = copies_for(nbytes)
        pk = rp.PagedKV([L] * B, D, kv_dt, copies)
        qs = [rp.rnd(B, hq, D) for _ in range(copies)]
        w = kiln.BatchDecodeWithPagedKVCacheWrapper(rp.kiln_ws(), "NHD")
        w.plan(pk.indptr_h, pk.indices, pk.last_h, hq, H_KV, D, PAGE, q_data_type=BF16,
               kv_data_type=kv_dt, **kw)
        return (lambda c: w.run(qs[c], (pk.k[c], pk.v[c]))), copies, nbytes, "GB/s"
    raise ValueError(f"unknown point kind {kind!r}")


def split_setting(val):
    """A --tunes setting: its KILN_* words (KILN_JOB_HEADS=4, read by the library when a
    context is made) as environment variables, the rest as KILN_TUNE."""
    tune, extra = [], {}
    for w in val.replace(",", " ").split():
        if w.startswith("KILN_") and "=" in w:
            k, v = w.split("=", 1)
            extra[k] = v
        else:
            tune.append(w)
    return " ".join(tune), extra


def eager(points, n):
    """Each point's call n times in this process, synchronised, untimed: a profiler's target
    (ncu -k regex:kiln_main --launch-skip ... python3 ab.py --eager 3 --points ...)."""
    import torch
    for p in points:
        fn, _, _, _ = point_fn(p.split(":"))
        for _ in range(n):
            fn(0)
        torch.cuda.synchronize()
        print(f"{p}: {n} calls", flush=True)
    return 0


def child(points):
    """Measure every point in this process; one JSON line: point -> (µs, rate, unit, clock), the
    clock the SM ran at meanwhile (clocks.py; {} where none was sampled)."""
    import torch
    from clocks import CLOCKS
    from referee_common import time_graph
    CLOCKS.start()
    out = {}
    for p in points:
        try:
            fn, copies, work, unit = point_fn(p.split(":"))
            us, clock = time_graph(fn, copies)
            out[p] = (us, work / (us * 1e-6) / (1e9 if unit == "GB/s" else 1e12), unit, clock)
        except Exception as e:  # noqa: BLE001 — a point that fails is a row that says so
            out[p] = (None, None, f"{type(e).__name__}: {str(e)[:200]}", {})
        torch.cuda.empty_cache()
    CLOCKS.stop()
    print("AB_JSON " + json.dumps(out), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", required=True, help="comma list (see the file comment)")
    ap.add_argument("--tunes", default="", help="KILN_TUNE settings separated by ';'")
    ap.add_argument("--lib", action="append", default=[], help="NAME=PATH of another libkiln.so")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--eager", type=int, default=0,
                    help="run each point N times eagerly in this process and time nothing (for ncu)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.points.split(","))
    if a.eager:
        return eager(a.points.split(","), a.eager)
    configs = [("tune", t) for t in a.tunes.split(";")] + [("lib", x) for x in a.lib]
    res = {}
    for r in range(a.rounds):
        for kind, val in configs:
            env = dict(os.environ)
            if kind == "tune":
                name = val or "default"
                tune, extra = split_setting(val)
                env["KILN_TUNE"] = tune
                env.update(extra)
            else:
                name, path = val.split("=", 1)
                env["KILN_LIB"] = path
                env.pop("KILN_TUNE", None)
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--points", a.points],
                               env=env, capture_output=True, text=True)
            line = [x for x in p.stdout.splitlines() if x.startswith("AB_JSON ")]
            if not line:
                print(f"{name}: failed: {(p.stdout + p.stderr)[-600:]}", flush=True)
                continue
            for k, v in json.loads(line[0][8:]).items():
                res.setdefault(k, {}).setdefault(name, []).append(v)
                us, rate, unit, clock = v
                print(f"round {r} {name:>16} {k:>20}: " +
                      (f"{us:9.2f} us {rate:8.1f} {unit}  {describe(clock)}" if us else unit), flush=True)
    if not res:
        return 1
    names = list(next(iter(res.values())))
    print("\n| point | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
    for k, by in res.items():
        cells = [" / ".join(f"{v[0]:.1f} us {v[1]:.0f}" if v[0] else "failed" for v in by.get(n, [])) for n in names]
        print(f"| {k} | " + " | ".join(cells) + " |")
    print("\nSM clock while each was timed (mean MHz, a round each; clocks.py):\n\n| point | " +
          " | ".join(names) + " |\n|---|" + "---|" * len(names))
    for k, by in res.items():
        cells = [" / ".join(str(v[3].get("sm_mhz", "—")) if v[0] else "—" for v in by.get(n, [])) for n in names]
        print(f"| {k} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
