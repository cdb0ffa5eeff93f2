"""pyhost.py — the Python layer's own cost per plan() / run() of kiln's batch decode wrapper.

What it measures: the wall clock of BatchDecodeWithPagedKVCacheWrapper.plan() and .run() with
every libkiln.so call that needs a GPU replaced by a stub that returns OK (kernel get, plan
create / workspace size / plan / describe in Python; kiln_plan_run by a C function that returns
0, compiled here with cc, so that run() makes a real foreign call) and torch's CUDA queries
(current stream, current device, capture state) answered without a GPU, on torch CPU tensors.
run() is measured on both of its paths: "hot", the C Runner of kiln/hot.c (where `make` built
build/lib/_kiln_hot.abi3.so), and "ctypes", the Python path alone (KILN_HOT=0's); then, on the
hot path, the other calls engines make each step (forward() with the last call's arguments,
fast_decode_plan at page size 1, a causal paged prefill plan()). The
shape is the referee's host suite (tools/bench/referee.py --only host): decode paged, H 32,
H_KV 8, D 128, page 16, bf16, lengths 512..8192, indptr and last_page_len as int32 CPU
tensors, plan() then run() back to back.

What it does not measure: the work of the real library's calls (the stubs return at once),
the CUDA driver's launch, torch's CUDA caching allocator (torch.empty here is
a CPU allocation), nor a real device's synchronisation. The GPU figure is the referee's:
tools/bench/referee.py --only host on the H200.

    KILN_LIB=build/lib/libkiln.so python tools/bench/pyhost.py [--calls N] [--rounds R]

The package is imported from python/ next to this file unless $PYHOST_PACKAGE names another
directory holding a kiln package (to measure an older tree the same way).
"""

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.environ.get("PYHOST_PACKAGE") or os.path.join(HERE, "..", "..", "python"))

import torch  # noqa: E402

import kiln  # noqa: E402
from kiln import _hot, _lib  # noqa: E402

H, H_KV, PAGE, D = 32, 8, 16, 128


def _set_out(ref, value):
    """Write value into the object a ctypes.byref() points at (an output parameter)."""
    ref._obj.value = value
    return 0


def _set_two(ref_a, ref_b, a, b):
    ref_a._obj.value, ref_b._obj.value = a, b
    return 0


# The C calls that need a GPU, by name.
STUBS = {
    "kiln_kernel_get": lambda ctx, variant, out: _set_out(out, 0x1000),
    "kiln_plan_create": lambda kernel, opts, out: _set_out(out, 0x2000),
    "kiln_plan_destroy": lambda plan: None,
    "kiln_plan_workspace_size": lambda plan, batch, total, out: _set_out(out, 1 << 20),
    "kiln_plan_workspace_sizes": lambda plan, batch, total, a, b: _set_two(a, b, 64 << 10,
                                                                           1 << 20),
    "kiln_plan_schedule": lambda plan, shape, ws, nbytes, stream: 0,
    "kiln_plan_schedule_scratch": lambda plan, shape, ws, nbytes, sc, sc_bytes, stream: 0,
    "kiln_plan_run": None,  # a C function returning 0 (c_noop)
    "kiln_plan_describe": lambda plan, info: 0,
}


class StubbedLib:
    """The real libkiln.so for every call but the ones in STUBS."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        if name in STUBS:
            return STUBS[name]
        return getattr(self._real, name)


class FakeStream:
    cuda_stream = 0


def c_noops():
    """The stubs of kiln_plan_run and kiln_plan_schedule_scratch: C functions that return 0
    (`int noop(...) { return 0; }`), compiled with cc into a temporary library, declared as
    the real ones are, so that run() and the decode plan()'s C path make real foreign calls."""
    d = tempfile.mkdtemp(prefix="pyhost-")
    src, so = os.path.join(d, "noop.c"), os.path.join(d, "noop.so")
    with open(src, "w") as f:
        f.write("int noop(void *p, const void *a, void *s) { (void)p; (void)a; (void)s; "
                "return 0; }\n"
                "int noop7(void *p, const void *s, unsigned long long w, unsigned long wb, "
                "unsigned long long c, unsigned long cb, void *st) { (void)p; (void)s; "
                "(void)w; (void)wb; (void)c; (void)cb; (void)st; return 0; }\n")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", so, src], check=True)
    out = []
    for name, real_name in (("noop", "kiln_plan_run"), ("noop7", "kiln_plan_schedule_scratch")):
        fn = getattr(ctypes.CDLL(so), name)
        real = getattr(_lib.lib(), real_name)
        fn.restype, fn.argtypes = real.restype, real.argtypes
        out.append(fn)
    return out


def install_stubs():
    real = _lib.lib()
    STUBS["kiln_plan_run"], STUBS["kiln_plan_schedule_scratch"] = c_noops()
    _lib._lib = StubbedLib(real)
    torch.cuda.current_stream = lambda device=None: FakeStream()
    torch.cuda.current_device = lambda: 0
    torch.cuda.is_current_stream_capturing = lambda: False
    torch._C._cuda_getCurrentRawStream = lambda index: 0
    torch._C._cuda_getDevice = lambda: 0
    torch._C._cuda_isCurrentStreamCapturing = lambda: False
    # the wrappers accept a CPU workspace once their CUDA check is stubbed (an older tree has
    # none to stub: PYHOST_PACKAGE points at a copy whose check admits "cpu")
    import importlib

    for name in ("kiln._wrapper", "kiln.batch"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(mod, "_require_cuda"):
            mod._require_cuda = lambda device, what: None


def setup(B):
    lens = [512 + (b * 7919) % 7681 for b in range(B)]
    npages = [(n + PAGE - 1) // PAGE for n in lens]
    indptr = [0]
    for n in npages:
        indptr.append(indptr[-1] + n)
    last = [n - (p - 1) * PAGE for n, p in zip(lens, npages)]
    total = indptr[-1]
    ctx = kiln.Context(no_device=True, no_cache=True)
    ws = torch.empty(16 << 20, dtype=torch.uint8)
    w = kiln.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", context=ctx)
    indptr_h = torch.tensor(indptr, dtype=torch.int32)
    last_h = torch.tensor(last, dtype=torch.int32)
    indices = torch.randperm(total).to(torch.int32)
    k = torch.empty((total, PAGE, H_KV, D), dtype=torch.bfloat16)
    v = torch.empty((total, PAGE, H_KV, D), dtype=torch.bfloat16)
    q = torch.empty((B, H, D), dtype=torch.bfloat16)

    def plan():
        w.plan(indptr_h, indices, last_h, H, H_KV, D, PAGE, q_data_type=torch.bfloat16,
               kv_data_type=torch.bfloat16)

    def run():
        return w.run(q, (k, v))

    return ctx, plan, run, w


def use_path(path):
    """Make the next plan()'s run() go through the C Runner ("hot") or the ctypes path."""
    _hot._state = None
    if path == "ctypes":
        _hot._state = (None, "off (pyhost.py: the ctypes path)")
    elif _hot.module() is None:
        raise SystemExit(f"pyhost: no C Runner to measure: {_hot.status()}")


def measure(calls, rounds, B, path):
    use_path(path)
    ctx, plan, run, _ = setup(B)
    plan()
    run()  # warm: kernels, plan objects, caches
    tp, tr = [], []
    for _ in range(rounds):
        for _ in range(calls):
            t0 = time.perf_counter()
            plan()
            t1 = time.perf_counter()
            run()
            t2 = time.perf_counter()
            tp.append((t1 - t0) * 1e6)
            tr.append((t2 - t1) * 1e6)
    ctx.close()
    return tp, tr


def engine_calls(B):
    """The other calls engines make every step, on the hot path's build: forward() with the
    arguments of the last one (SGLang, every layer), fast_decode_plan at page size 1 (SGLang's
    CUDA-graph decode) and a causal paged prefill plan() (requests of 1..300 query rows)."""
    use_path("hot")
    ctx, plan, _, w = setup(B)
    plan()
    q = torch.empty((B, H, D), dtype=torch.bfloat16)
    lens = [512 + (b * 7919) % 7681 for b in range(B)]
    tok = [0]
    for n in lens:
        tok.append(tok[-1] + n)
    tok_h = torch.tensor(tok, dtype=torch.int32)
    ids = torch.arange(tok[-1], dtype=torch.int32)
    g = kiln.BatchDecodeWithPagedKVCacheWrapper(torch.empty(16 << 20, dtype=torch.uint8), "NHD",
                                                context=ctx)
    ones = torch.ones(B, dtype=torch.int32)

    def fdp():
        kiln.fast_decode_plan(g, tok_h, ids, ones, H, H_KV, D, 1, q_data_type=torch.bfloat16,
                              global_override_indptr_cpu=tok_h)

    pages = [(n + PAGE - 1) // PAGE for n in lens]
    qo, pg, last = [0], [0], []
    for b, (n, p) in enumerate(zip(lens, pages)):
        qo.append(qo[-1] + 1 + (b * 31) % 300)
        pg.append(pg[-1] + p)
        last.append(n - (p - 1) * PAGE)
    pw = kiln.BatchPrefillWithPagedKVCacheWrapper(torch.empty(16 << 20, dtype=torch.uint8), "NHD",
                                                  context=ctx)
    qo_h, pg_h, last_h = (torch.tensor(x, dtype=torch.int32) for x in (qo, pg, last))
    pids = torch.arange(pg[-1], dtype=torch.int32)

    def prefill_plan():
        pw.plan(qo_h, pg_h, pids, last_h, H, H_KV, D, PAGE, causal=True,
                q_data_type=torch.bfloat16)

    kv = (torch.empty((pg[-1], PAGE, H_KV, D), dtype=torch.bfloat16),) * 2
    calls = [("forward (same arguments)", lambda: w.forward(q, kv, sm_scale=D ** -0.5)),
             ("fast_decode_plan, page 1", fdp), ("prefill plan (paged, causal)", prefill_plan)]
    for _, f in calls:  # warm: configs, plans, Runners
        f()
    out = []
    for name, f in calls:
        ts = []
        for _ in range(5):
            for _ in range(200):
                t0 = time.perf_counter()
                f()
                ts.append((time.perf_counter() - t0) * 1e6)
        out.append((name, sorted(ts)))
    ctx.close()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200, help="plan + run pairs per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--paths", default="hot,ctypes",
                    help="run()'s paths to measure, comma-separated: hot (the C Runner), ctypes")
    a = ap.parse_args()
    install_stubs()
    print(f"kiln package: {os.path.dirname(kiln.__file__)}; torch {torch.__version__}, CPU tensors, "
          "GPU calls stubbed (Python layer only)")
    print("| call | path | B | median µs | min µs | p90 µs |")
    print("|---|---|---|---|---|---|")
    for path in a.paths.split(","):
        for B in (1, 256):
            tp, tr = measure(a.calls, a.rounds, B, path)
            for name, ts in (("plan", tp), ("run", tr)):
                ts.sort()
                print(f"| {name} | {path} | {B} | {statistics.median(ts):.1f} | {ts[0]:.1f} | "
                      f"{ts[len(ts) * 9 // 10]:.1f} |", flush=True)
    if "hot" in a.paths.split(","):
        for B in (1, 256):
            for name, ts in engine_calls(B):
                print(f"| {name} | hot | {B} | {statistics.median(ts):.1f} | {ts[0]:.1f} | "
                      f"{ts[len(ts) * 9 // 10]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
