"""referee_common.py — what every part of the referee (referee.py) shares: the shapes, the three
timings of a call (CUDA-graph replay, back-to-back host calls, eager with events), the rotation of
input copies, the rel-L2 cross-check and the results table every suite adds its rows to."""
import math
import statistics
import time

import torch

from clocks import CLOCKS


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
    """GPU µs per call by CUDA-graph replay (see the file comment), and the SM clock while the
    bursts ran (clocks.py: {} where no sample fell in them)."""
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
    t0 = time.time()
    for _ in range(BURSTS):
        a, b = _ev(), _ev()
        a.record()
        for _ in range(REPLAYS):
            g.replay()
        b.record()
        b.synchronize()
        per.append(a.elapsed_time(b) * 1e3 / (REPLAYS * copies))
    clock = CLOCKS.window(t0, time.time())
    del g
    return statistics.median(per), clock


def fresh_memory():
    """Release what the caching allocator keeps of earlier points before a point allocates its
    inputs, so every point's tensors (each library's) come from fresh allocations as in a new
    process. Session 53 (H100): kiln's paged decode at B256 x 512 read 181.6 us on a fresh pool
    and 188.5 on one carved from the nine earlier decode points' freed blocks, and 196.5-198.0
    in the referee's runs before this (docs/perf.md, "Session 53")."""
    import gc
    gc.collect()
    torch.cuda.empty_cache()


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
            row["gpu_us"], clock = time_graph(fn, copies)
            row.update(clock)
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
