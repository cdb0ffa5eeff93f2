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
counts 4 * D * visible (query, key) pairs * H. Beside each GPU time: the mean SM clock, power and
the share of samples with a power throttle reason while it was measured (clocks.py: nvidia-smi
every 50 ms; none for timings shorter than that), since a power-capped clock, not the kernel,
can be what a figure shows.

usage (on a GPU machine, from the repository root):
  python3 tools/bench/referee.py [--quick] [--only SUITE,...] [--csv F] [--md F] [--json F]
         [--kiln-bench build/bin/kiln-bench] [--flashinfer] [--fi-ok F] [--no-flex]
  python3 tools/bench/referee.py --fi-compile-only --fi-configs KEY,... --fi-ok F
SUITE: ceilings decode fp8 decode-d prefill prefill-d variants bsr cascade host
tools/bench/referee.sh runs the whole thing (FlashInfer install and JIT included).

This file is the command line; the parts live beside it: referee_common.py (shapes, the three
timings, the results table), referee_peers.py (inputs, the libraries, FlashInfer's JIT),
referee_suites.py (the suites), referee_report.py (the summary and the output files) and
clocks.py (the clock samples).
"""
import argparse
import json
import sys
import time

import torch

from clocks import CLOCKS
from referee_common import BURSTS, EAGER_CALLS, REPLAYS, RES, ROTATE_BYTES, short
from referee_peers import FI, FI_CONFIGS, fi_compile_only  # noqa: F401 — referee.sh reads FI_CONFIGS
from referee_report import summary, write_files
from referee_suites import SUITES


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
    from kiln import _hot
    p = torch.cuda.get_device_properties(0)
    RES.meta.update(gpu=p.name, sms=p.multi_processor_count, torch=torch.__version__, cuda=torch.version.cuda,
                    cudnn=torch.backends.cudnn.version(), kiln=kiln.version(), nvrtc=kiln.nvrtc_version(),
                    kiln_run_path=_hot.status(),
                    date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), quick=a.quick,
                    method=f"graph {REPLAYS} replays x {BURSTS} bursts, rotate {ROTATE_BYTES >> 20} MiB; "
                           f"host: back-to-back calls no sync; eager: events + sync, {EAGER_CALLS} calls")
    why = CLOCKS.start()
    RES.meta.update(clocks=f"nvidia-smi every {CLOCKS.period_ms} ms: {CLOCKS.query}" if not why else why)
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
    CLOCKS.stop()
    text = summary()
    print(text)
    print(f"\nreferee: {len(RES.rows)} rows in {time.time() - t0:.0f} s")
    write_files(text, a.csv, a.json, a.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
