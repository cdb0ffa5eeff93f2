#!/usr/bin/env python3
"""plot.py — PNGs for docs/perf/ from the CSVs of one device run (device_run.sh batch):
  batch_decode_bw.png       decode GB/s vs L_KV, one panel per batch size: kiln (bf16, fp8 KV)
                            and each peer; the copy and streaming-read ceilings as lines
  batch_prefill_tflops.png  causal prefill TFLOP/s vs S: single requests (B = 1) and batches of
                            16384 tokens (B x S), kiln ragged / paged and each peer
  batch_cascade.png         shared-prefix decode: plain vs cascade time per batch size
Each figure is stamped with the GPU, driver, NVRTC, kiln, torch, FlashInfer versions and the date
from the CSVs' "# ..." metadata lines. Needs matplotlib only (runs on a dev box:
`python3 -m venv /tmp/mpl && /tmp/mpl/bin/pip install matplotlib`).

Usage: plot.py --kiln-batch OUT/kiln_batch.csv [--peers-batch OUT/peers_batch.csv]
               [--kiln OUT/kiln.csv] [--peers OUT/peers.csv] [--out docs/perf]
"""
import argparse
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    """(metadata dict, rows as dicts) of a CSV whose first lines may be '# tool key=value ...'."""
    meta, lines = {}, []
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                for tok in line[1:].split()[1:]:
                    if "=" in tok:
                        k, v = tok.split("=", 1)
                        meta[k] = v.replace("_", " ") if k == "gpu" else v
            elif line.strip():
                lines.append(line)
    return meta, list(csv.DictReader(lines))


def stamp(fig, km, pm):
    parts = [pm.get("gpu", km.get("gpu", "?")), f"{km.get('arch', '')} {km.get('sms', '')} SMs".strip(),
             f"driver {km.get('driver', '?')}", f"NVRTC {km.get('nvrtc', '?')}", f"kiln {km.get('kiln', '?')}"]
    if pm:
        parts += [f"torch {pm.get('torch', '?')}", f"cuDNN {pm.get('cudnn', '?')}"]
        if "flashinfer" in pm:
            parts.append(f"FlashInfer {pm['flashinfer']}")
    parts.append(km.get("date", pm.get("date", "")))
    fig.text(0.01, 0.005, ", ".join(p for p in parts if p), fontsize=7, color="0.35")


def colors(labels):
    """One fixed color per label across every panel (kiln first, in strong colors)."""
    labels = sorted(labels, key=lambda l: (not l.startswith("kiln"), l))
    cmap = plt.get_cmap("tab20")
    return {l: cmap(i % 20) for i, l in enumerate(labels)}


def fnum(r, k):
    try:
        return float(r[k])
    except (KeyError, ValueError):
        return float("nan")


def decode_plot(kb, pb, km, pm, out):
    bs = sorted({int(r["B"]) for r in kb if r["name"] in ("batch decode", "batch decode fp8")})
    if not bs:
        return None
    fig, axes = plt.subplots(1, len(bs), figsize=(4.2 * len(bs), 4), sharey=True, squeeze=False)
    series = {}  # label -> {B: [(L, GB/s)]}
    for r in kb:
        if r["name"] in ("batch decode", "batch decode fp8") and r["check"] != "MISMATCH":
            lab = "kiln" + (" fp8" if "fp8" in r["name"] else "")
            series.setdefault(lab, {}).setdefault(int(r["B"]), []).append((int(r["L_KV"]), fnum(r, "GBps")))
    for r in pb:
        if r["name"] in ("batch decode", "batch decode fp8"):
            lab = r["peer"] + (" fp8" if "fp8" in r["name"] else "")
            series.setdefault(lab, {}).setdefault(int(r["B"]), []).append((int(r["L_KV"]), fnum(r, "GBps")))
    copy, read_ = float(km.get("copy_GBps", "nan")), float(km.get("read_GBps", "nan"))
    col = colors(series)
    for ax, B in zip(axes[0], bs):
        for lab, byb in sorted(series.items()):
            pts = sorted(byb.get(B, []))
            if pts:
                style = "-" if lab.startswith("kiln") else "--"
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=3,
                        lw=2.2 if lab.startswith("kiln") else 1.2, label=lab, color=col[lab])
        for y, lab in ((copy, "copy"), (read_, "streaming read")):
            if y == y:
                ax.axhline(y, color="0.5", ls=":", lw=1)
                ax.text(0.01, y, f"{lab} {y:.0f}", fontsize=7, va="bottom", color="0.4",
                        transform=ax.get_yaxis_transform())
        ax.set_xscale("log", base=2)
        ax.set_title(f"B = {B}")
        ax.set_xlabel("L_KV (tokens per request)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("GB/s (K + V + q + o)")
    handles = {}
    for ax in axes[0]:
        for h, l in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(l, h)
    axes[0][-1].legend(handles.values(), handles.keys(), fontsize=7, loc="lower right")
    fig.suptitle("Batch decode, paged KV (page 16), H 32 / H_KV 8, D 128")
    stamp(fig, km, pm)
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    path = os.path.join(out, "batch_decode_bw.png")
    fig.savefig(path, dpi=130)
    return path


def prefill_plot(kb, pb, km, pm, out, ks=(), ps=()):
    """ks / ps: rows of the single-request CSVs (kiln-bench, peers.py without --batch): their
    'prefill causal' points join the B = 1 panel as 'kiln single' and '<peer> single'."""
    rows = [("kiln single", 1, int(r["L_Q"]), fnum(r, "TFLOPs")) for r in ks if r["name"] == "prefill causal"]
    rows += [(r["peer"] + " single", 1, int(r["L_Q"]), fnum(r, "TFLOPs")) for r in ps if r["name"] == "prefill causal"]
    rows += [("kiln " + r["name"].replace("batch prefill ", "").replace(" causal", ""), int(r["B"]), int(r["L_Q"]),
             fnum(r, "TFLOPs")) for r in kb if r["name"].startswith("batch prefill") and "causal" in r["name"]
            and r["check"] != "MISMATCH"]
    for r in pb:
        if r["name"].startswith("batch prefill") and "causal" in r["name"]:
            kind = r["name"].replace("batch prefill ", "").replace(" causal", "").replace("causal", "")
            lab = r["peer"] + (f" {kind.strip()}" if kind.strip() else "")
            rows.append((lab, int(r["B"]), int(r["L_Q"]), fnum(r, "TFLOPs")))
    if not rows:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    col = colors({r[0] for r in rows})
    for ax, title, sel in ((axes[0], "single request (B = 1)", lambda B, S: B == 1),
                           (axes[1], "batch of 16384 tokens (B x S)", lambda B, S: B * S == 16384)):
        for lab in sorted({r[0] for r in rows}):
            pts = sorted((S, t) for l, B, S, t in rows if l == lab and sel(B, S))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "-" if lab.startswith("kiln") else "--", marker="o",
                        ms=3, lw=2.2 if lab.startswith("kiln") else 1.2, label=lab, color=col[lab])
        ax.set_xscale("log", base=2)
        ax.set_title(title)
        ax.set_xlabel("S (tokens per request)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("TFLOP/s (causal: S(S+1)/2 pairs)")
    handles = {}
    for ax in axes:
        for h, l in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(l, h)
    axes[1].legend(handles.values(), handles.keys(), fontsize=7)
    fig.suptitle("Causal prefill, bf16, H 32 / H_KV 8, D 128")
    stamp(fig, km, pm)
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    path = os.path.join(out, "batch_prefill_tflops.png")
    fig.savefig(path, dpi=130)
    return path


def cascade_plot(kb, pb, km, pm, out):
    bars = [(f"kiln {r['name'].replace('cascade plain', 'plain').replace('cascade', 'cascade')}", int(r["B"]),
             fnum(r, "ms")) for r in kb if r["name"] in ("cascade", "cascade plain")]
    bars += [(f"{r['peer']} {'plain' if r['name'] == 'cascade plain' else 'cascade'}", int(r["B"]), fnum(r, "ms"))
             for r in pb if r["name"] in ("cascade", "cascade plain")]
    if not bars:
        return None
    bs = sorted({b for _, b, _ in bars})
    labs = sorted({l for l, _, _ in bars})
    fig, ax = plt.subplots(figsize=(7, 4))
    w = 0.8 / len(labs)
    for i, lab in enumerate(labs):
        xs = [j + i * w for j, B in enumerate(bs) if any(l == lab and b == B for l, b, _ in bars)]
        ys = [next(ms for l, b, ms in bars if l == lab and b == B) for B in bs
              if any(l == lab and b == B for l, b, _ in bars)]
        ax.bar(xs, ys, w, label=lab)
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(bs))], [f"B = {B}" for B in bs])
    ax.set_ylabel("ms per decode step")
    ax.set_title("Shared prefix 32768 + private 512 tokens per request, decode")
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    stamp(fig, km, pm)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path = os.path.join(out, "batch_cascade.png")
    fig.savefig(path, dpi=130)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln-batch", required=True)
    ap.add_argument("--peers-batch")
    ap.add_argument("--kiln", help="kiln-bench's single-request CSV (adds 'kiln single' prefill)")
    ap.add_argument("--peers", help="peers.py's single-request CSV")
    ap.add_argument("--out", default="docs/perf")
    a = ap.parse_args()
    km, kb = read(a.kiln_batch)
    pm, pb = read(a.peers_batch) if a.peers_batch else ({}, [])
    ks = read(a.kiln)[1] if a.kiln else []
    ps = read(a.peers)[1] if a.peers else []
    os.makedirs(a.out, exist_ok=True)
    print(decode_plot(kb, pb, km, pm, a.out) or "decode: no rows")
    print(prefill_plot(kb, pb, km, pm, a.out, ks, ps) or "prefill: no rows")
    print(cascade_plot(kb, pb, km, pm, a.out) or "cascade: no rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
