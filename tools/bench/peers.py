#!/usr/bin/env python3
"""peers.py — times kiln's peers on the GPU machine, on the shapes tools/bench/bench.c uses:
torch SDPA with the FlashAttention-2 and cuDNN backends, and FlexAttention (torch.compile'd),
bf16, H = 32, H_KV = 8, D = 128 unless noted. CUDA-event timing, warm-up, median of 30,
rotating input copies so L2 does not hold them. Prints a markdown table; --csv writes CSV.

Usage: python3 tools/bench/peers.py [--quick] [--csv FILE] [--no-flex]
       python3 tools/bench/peers.py --batch [--quick] [--csv FILE] [--no-flex] [--flex-decode]
               [--only NAME] [--max-gib N] [--flashinfer [--fi-ok FILE]]
       python3 tools/bench/peers.py --fi-compile-only --fi-ok FILE [--fi-all] [--fi-deadline S]
--batch runs the batch peers of tools/bench/peers_batch.py (the shapes of kiln-bench --batch).
CSV files start with a "# peers key=value ..." metadata line (GPU, torch, FlashInfer, date) that
tools/bench/plot.py reads.
"""
import argparse
import datetime
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

H, H_KV = 32, 8


def timeit(fn, inputs, reps=30, warm=3):
    for i in range(warm):
        fn(*inputs[i % len(inputs)])
    torch.cuda.synchronize()
    ts = []
    for i in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        args = inputs[i % len(inputs)]
        a.record()
        fn(*args)
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def make(B, L_Q, L_KV, D, copies):
    out = []
    for _ in range(copies):
        q = torch.randn(B, H, L_Q, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, H_KV, L_KV, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, H_KV, L_KV, D, device="cuda", dtype=torch.bfloat16)
        out.append((q, k, v))
    return out


def copies_for(nbytes):
    return max(1, min(8, math.ceil((256 << 20) / max(nbytes, 1))))


def sdpa(backend, causal):
    def f(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    return f


def flex_variants(inputs, L_Q, L_KV, D, rows):
    """FlexAttention with score_mods / block masks for the variant points (causal, 4096)."""
    from torch.nn.attention.flex_attention import flex_attention, create_block_mask
    flex = torch.compile(flex_attention, dynamic=False)
    causal = create_block_mask(lambda b, h, q, kv: q >= kv, 1, 1, L_Q, L_KV)
    window = create_block_mask(lambda b, h, q, kv: (q >= kv) & (q - kv <= 1024), 1, 1, L_Q, L_KV)
    slopes = torch.tensor([2 ** (-8 * (h + 1) / H) for h in range(H)], device="cuda")

    def softcap(score, b, h, q, kv):
        return 30.0 * torch.tanh(score / 30.0)

    def alibi(score, b, h, q, kv):
        return score + slopes[h] * (kv - q)

    full = sum(min(L_KV, i + L_KV - L_Q + 1) for i in range(L_Q))
    win = sum(min(i, 1024) + 1 for i in range(L_Q))
    for vname, kw, pairs in (("softcap", dict(score_mod=softcap, block_mask=causal), full),
                             ("alibi", dict(score_mod=alibi, block_mask=causal), full),
                             ("window1024", dict(block_mask=window), win)):
        try:
            f = lambda q, k, v: flex(q, k, v, enable_gqa=True, **kw)
            ms = timeit(f, inputs)
            tf = 4.0 * D * pairs * H / (ms * 1e-3) / 1e12
            rows.append(("prefill causal " + vname, L_Q, L_KV, "Flex", ms, 0.0, tf))
            print(f"| prefill causal {vname} | {L_Q} | {L_KV} | Flex | {ms:.4f} | | {tf:.1f} |")
        except Exception as e:
            print(f"| prefill causal {vname} | {L_Q} | {L_KV} | Flex | failed: {type(e).__name__}: {str(e)[:80]} | | |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--csv")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--batch", action="store_true", help="batch peers (peers_batch.py)")
    ap.add_argument("--only", help="batch: one point name of kiln-bench --list --batch")
    ap.add_argument("--max-gib", type=float, default=100.0, help="batch: skip points over this many GiB")
    ap.add_argument("--flex-decode", action="store_true", help="batch: also Flex on decode (a compile per shape)")
    ap.add_argument("--flashinfer", action="store_true", help="batch: include FlashInfer (needs import flashinfer)")
    ap.add_argument("--fi-ok", help="FlashInfer configs that compiled (written by --fi-compile-only)")
    ap.add_argument("--fi-compile-only", action="store_true", help="JIT-compile and check FlashInfer's configs, then exit")
    ap.add_argument("--fi-all", action="store_true", help="also FlashInfer d64/d256 decode configs")
    ap.add_argument("--fi-configs", help="comma-separated FlashInfer configs to compile (kind:dD:dtype, e.g. "
                    "decode:d128:bf16,decode-tc:d128:bf16); default: the standard list")
    ap.add_argument("--fi-deadline", type=float, default=480.0, help="seconds; no new FlashInfer compile after it")
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    meta = {"gpu": torch.cuda.get_device_name().replace(" ", "_"), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "date": datetime.date.today().isoformat()}
    if a.fi_compile_only:
        import peers_batch
        peers_batch.fi_compile(a.fi_ok or "fi_ok.txt",
                               a.fi_configs.split(",") if a.fi_configs else
                               peers_batch.FI_CONFIGS_ALL if a.fi_all else peers_batch.FI_CONFIGS_DEFAULT, a.fi_deadline)
        return 0
    rows = []
    # ceilings
    x = torch.empty(1 << 30, device="cuda", dtype=torch.uint8)
    y = torch.empty_like(x)
    ms = timeit(lambda s, d: d.copy_(s), [(x, y)])
    copy_gbs = 2 * x.numel() / (ms * 1e-3) / 1e9
    del x, y
    m = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = timeit(lambda p, q: p @ q, [(m, m)], reps=10)
    mm_tf = 2 * 8192 ** 3 / (ms * 1e-3) / 1e12
    del m
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}: copy {copy_gbs:.0f} GB/s, bf16 matmul {mm_tf:.0f} TFLOP/s\n")
    meta["copy_GBps"], meta["matmul_TFLOPs"] = f"{copy_gbs:.0f}", f"{mm_tf:.0f}"
    if a.batch:
        import peers_batch
        brows = peers_batch.run(a, meta)
        if a.csv:
            with open(a.csv, "w") as f:
                f.write("# peers " + " ".join(f"{k}={v}" for k, v in meta.items()) + "\n")
                f.write("name,B,L_Q,L_KV,peer,ms,GBps,TFLOPs,check\n")
                for r in brows:
                    f.write("%s,%d,%d,%d,%s,%.5f,%.1f,%.2f,%s\n" % r)
        return 0
    points = [
        ("decode", 1, 1, 512, 128, False), ("decode", 1, 1, 4096, 128, False),
        ("decode", 1, 1, 32768, 128, False), ("decode d64", 1, 1, 32768, 64, False),
        ("decode d256", 1, 1, 32768, 256, False),
        ("prefill causal", 1, 1024, 1024, 128, True), ("prefill causal", 1, 4096, 4096, 128, True),
        ("prefill causal", 1, 16384, 16384, 128, True), ("prefill", 1, 4096, 4096, 128, False),
        ("prefill causal d64", 1, 4096, 4096, 64, True), ("prefill causal d256", 1, 4096, 4096, 256, True),
    ]
    backends = [("FA2", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION)]
    print("| point | L_Q | L_KV | peer | ms | GB/s | TFLOP/s |\n|---|---|---|---|---|---|---|")
    for name, B, L_Q, L_KV, D, causal in points:
        if a.quick and L_Q > 4096:
            continue
        nbytes = 2 * (2 * B * H * L_Q * D + 2 * B * H_KV * L_KV * D)
        inputs = make(B, L_Q, L_KV, D, copies_for(nbytes))
        pairs = sum(min(L_KV, i + L_KV - L_Q + 1) for i in range(L_Q)) if causal else L_Q * L_KV
        flops = 4.0 * D * pairs * H * B
        for pname, be in backends:
            try:
                ms = timeit(sdpa(be, causal), inputs)
            except Exception as e:  # a backend may not support a shape
                print(f"| {name} | {L_Q} | {L_KV} | {pname} | failed: {type(e).__name__} | | |")
                continue
            gbs, tf = nbytes / (ms * 1e-3) / 1e9, flops / (ms * 1e-3) / 1e12
            rows.append((name, L_Q, L_KV, pname, ms, gbs, tf))
            print(f"| {name} | {L_Q} | {L_KV} | {pname} | {ms:.4f} | {gbs:.0f} | {tf:.1f} |")
        if not a.no_flex and name.startswith("prefill") and D == 128:
            try:
                from torch.nn.attention.flex_attention import flex_attention, create_block_mask
                flex = torch.compile(flex_attention, dynamic=False)
                bm = create_block_mask(lambda b, h, q, kv: q >= kv, 1, 1, L_Q, L_KV) if causal else None
                f = lambda q, k, v: flex(q, k, v, block_mask=bm, enable_gqa=True)
                ms = timeit(f, inputs)
                gbs, tf = nbytes / (ms * 1e-3) / 1e9, flops / (ms * 1e-3) / 1e12
                rows.append((name, L_Q, L_KV, "Flex", ms, gbs, tf))
                print(f"| {name} | {L_Q} | {L_KV} | Flex | {ms:.4f} | {gbs:.0f} | {tf:.1f} |")
            except Exception as e:
                print(f"| {name} | {L_Q} | {L_KV} | Flex | failed: {type(e).__name__}: {str(e)[:80]} | | |")
        if not a.no_flex and name == "prefill causal" and L_Q == 4096:
            flex_variants(inputs, L_Q, L_KV, D, rows)
        del inputs
        torch.cuda.empty_cache()
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("# peers " + " ".join(f"{k}={v}" for k, v in meta.items()) + "\n")
            f.write("name,L_Q,L_KV,peer,ms,GBps,TFLOPs\n")
            for r in rows:
                f.write("%s,%d,%d,%s,%.5f,%.1f,%.2f\n" % r)


if __name__ == "__main__":
    sys.exit(main())
