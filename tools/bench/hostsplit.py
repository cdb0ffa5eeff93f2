#!/usr/bin/env python3
"""hostsplit.py — where the host time of a Python decode run() goes, on a GPU machine.

Back-to-back calls with no sync (the referee's host method), median of 7 rounds of 200, µs a
call, for the referee's host shape (decode paged, H 32, H_KV 8, D 128, page 16, bf16, lengths
512..8192) at B 1 and 256: the whole run(), run() with out= given (no output allocation), both
again on the ctypes path alone (a wrapper planned without the C Runner of kiln/hot.c), the
C call alone with the context held (plan._call) and without (ctypes), torch.empty of o, the
stream query, plan() after a drain and back to back, run() right after plan() (the referee's
order, where run() took 55 µs at B256), then both under cProfile (where the time goes: the
referee's plan() at B256 was twice what pyhost.py and kiln-bench add up to). The referee's host suite gives the totals beside the peers; this splits them. Host figures depend on the machine's CPU (two H100
machines differed 2x on the same calls, docs/perf/notes.md session 35): compare within a run.

    KILN_LIB=build/lib/libkiln.so python3 tools/bench/hostsplit.py
"""
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import torch  # noqa: E402

import kiln  # noqa: E402
from kiln import _hot  # noqa: E402
from referee_common import BF16, H, H_KV, PAGE  # noqa: E402
from referee_peers import PagedKV, kiln_ws, rnd  # noqa: E402

D = 128


def per_call(fn, n=200, rounds=7):
    ts = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        ts.append((time.perf_counter() - t0) * 1e6 / n)
        torch.cuda.synchronize()
    return statistics.median(ts)


def profile_calls(call, before=None, calls=200, top=18):
    """cProfile of call() after a drain (and before(), unprofiled) each time: the functions by
    own time."""
    pr = cProfile.Profile()
    for _ in range(calls):
        torch.cuda.synchronize()
        if before is not None:
            before()
        pr.enable()
        call()
        pr.disable()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main():
    print(f"the C Runner (run() in C): {_hot.status()}")
    print("| B | call | µs a call |\n|---|---|---|")
    profiles = []
    for B in (1, 256):
        lens = [512 + (b * 7919) % 7681 for b in range(B)]
        pk = PagedKV(lens, D, BF16, 1)
        q = rnd(B, H, D)
        w = kiln.BatchDecodeWithPagedKVCacheWrapper(kiln_ws(), "NHD")

        def plan():
            w.plan(pk.indptr_h, pk.indices, pk.last_h, H, H_KV, D, PAGE, q_data_type=BF16,
                   kv_data_type=BF16)

        plan()
        saved, _hot._state = _hot._state, (None, "off (hostsplit.py)")
        w0 = kiln.BatchDecodeWithPagedKVCacheWrapper(kiln_ws(), "NHD")  # the ctypes path
        w0.plan(pk.indptr_h, pk.indices, pk.last_h, H, H_KV, D, PAGE, q_data_type=BF16,
                kv_data_type=BF16)
        _hot._state = saved
        kv = (pk.k[0], pk.v[0])
        o = torch.empty(B, H, D, dtype=BF16, device="cuda")
        w.run(q, kv)
        w0.run(q, kv)
        w0.run(q, kv, out=o)
        st = w._require_plan()
        stream = torch.cuda.current_stream().cuda_stream
        fn, handle, ref = st.plan._fn_run, st.plan._handle, st.cfg.args_ref
        rows = [
            ("run()", lambda: w.run(q, kv)),
            ("run(out=o)", lambda: w.run(q, kv, out=o)),
            ("run() on the ctypes path (no C Runner)", lambda: w0.run(q, kv)),
            ("run(out=o) on the ctypes path", lambda: w0.run(q, kv, out=o)),
            ("kiln_plan_run, context held (plan._call)", lambda: st.plan._call(fn, ref, stream)),
            ("kiln_plan_run through ctypes alone", lambda: fn(handle, ref, stream)),
            ("torch.empty of o", lambda: torch.empty((B, H, D), dtype=BF16, device="cuda")),
            ("torch.cuda.current_stream().cuda_stream", lambda: torch.cuda.current_stream().cuda_stream),
            ("plan() back to back", plan),
        ]
        for name, f in rows:
            print(f"| {B} | {name} | {per_call(f, n=50 if f is plan else 200):.2f} |", flush=True)
        ts = []
        for _ in range(200):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            plan()
            ts.append((time.perf_counter() - t0) * 1e6)
        ts.sort()
        print(f"| {B} | plan() after a drain (median; min {ts[0]:.2f}) | {ts[100]:.2f} |", flush=True)
        tr = []  # the referee's host suite: plan(), run(), drain; run() took 55 us at B256 there
        for _ in range(200):
            torch.cuda.synchronize()
            plan()
            t0 = time.perf_counter()
            w.run(q, kv)
            tr.append((time.perf_counter() - t0) * 1e6)
        tr.sort()
        print(f"| {B} | run() right after plan(), after a drain (median; min {tr[0]:.2f}) | "
              f"{tr[100]:.2f} |", flush=True)
        profiles.append((B, "plan()", profile_calls(plan)))
        profiles.append((B, "run() right after plan()", profile_calls(lambda: w.run(q, kv), plan)))
        del pk, w, w0
    for B, what, text in profiles:
        print(f"\n{what} at B{B} after a drain, 200 calls under cProfile (its overhead inflates "
              f"the Python frames; the C calls' own times stand):\n{text}")


if __name__ == "__main__":
    main()
