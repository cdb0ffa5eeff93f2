#!/usr/bin/env python3
"""report.py — docs/perf.md's tables and plots, made from the referee's JSON files only.

    python3 tools/bench/report.py [--update docs/perf.md] [--plots docs/perf] RUN.json [RUN.json ...]

Each RUN.json is what `tools/bench/referee.py --json` wrote in one process. A suite present in a
later file replaces that suite's rows from the earlier files, so every table's rows come from
one run (its caption names the run). --update rewrites each block of docs/perf.md that sits
between `<!-- referee:NAME -->` and `<!-- /referee -->` (NAME: a table below) and leaves the
prose around them alone; without it the tables are printed. --plots writes PNGs (matplotlib).
"""
import argparse
import json
import os
import re
import sys

PEERS = ("FlashInfer", "FlashInfer-tc", "FA2", "cuDNN", "Flex")


def load(paths):
    """{suite: (run label, rows, ceilings, run's suites)}, later files winning per suite; and each
    run's metadata. A table that reads a second suite (a ceiling, the bf16 decode beside fp8, the
    plain prefill beside the variants) takes it from the same run, never from another lease."""
    suites, metas = {}, []
    for i, p in enumerate(paths):
        d = json.load(open(p))
        label = f"run {i + 1} ({os.path.basename(p)}, {d['meta'].get('date', '?')})"
        metas.append((label, d["meta"], d.get("ceilings", {})))
        by = {}
        for r in d["rows"]:
            by.setdefault(r["suite"], []).append(r)
        for s, rows in by.items():
            suites[s] = (label, rows, d.get("ceilings", {}), by)
    return suites, metas


NO_RUN = ("", [], {}, {})  # a suite no run measured: no label, rows, ceilings or sibling suites


def same_run(suites, suite, other):
    """The rows of suite `other` from the run that gave `suite` ([] where that run has none)."""
    entry = suites.get(suite)
    return entry[3].get(other, []) if entry else []


def rows_of(suites, suite):
    return suites.get(suite, NO_RUN)[1]


def cell(r, what="gpu_us"):
    if r is None:
        return "—"
    if r.get(what) is None:
        c = r.get("check", "")
        return "failed" if c == "failed" else ("not built" if c == "not run" else "—")
    return f"{r[what]:.1f}"


def rate(r):
    return f"{r['rate']:.0f}" if r and r.get("rate") else "—"


def by_point(rows):
    pts = {}
    for r in rows:
        pts.setdefault(r["point"], {})[r["lib"]] = r
    return pts


def best_peer(libs, peers=PEERS):
    c = [libs[p] for p in peers if p in libs and libs[p].get("gpu_us") and not libs[p]["check"].startswith("MISMATCH")]
    return min(c, key=lambda r: r["gpu_us"]) if c else None


def ceilings_of(suites, suite):
    """(read GB/s, matmul TFLOP/s) measured in the run that gave `suite`, None where it measured none."""
    entry = suites.get(suite)
    if not entry:
        return None, None
    rows = entry[3].get("ceilings", [])
    read = entry[2].get("kiln_read") if rows else None
    mm = next((r["rate"] for r in rows if r["point"].startswith("bf16 matmul") and r.get("rate")), None)
    return read, mm


def t_ceilings(suites):
    label, rows, ceil, _ = suites.get("ceilings", NO_RUN)
    out = [f"From {label}.", "", "| ceiling | GB/s or TFLOP/s | how |", "|---|---|---|"]
    for r in rows:
        how = r.get("check") if r["lib"] == "kiln" else "torch, CUDA-graph replay"
        out.append(f"| {r['point']} | {rate(r)} {r['unit']} | {how} |")
    return out


def t_decode(suites, suite, libs=("kiln", "FlashInfer", "FlashInfer-tc", "cuDNN", "FA2", "Flex")):
    label, rows, _, _ = suites.get(suite, NO_RUN)
    read, _ = ceilings_of(suites, suite)
    pts = by_point(rows)
    out = [f"From {label}. GPU µs per call (CUDA-graph replay); kiln / best = best peer's time over kiln's "
           "(> 1: kiln faster); % of read: of the same run's streaming-read ceiling"
           + ("" if read else " (this run measured none)") + ".", "",
           "| point | " + " | ".join(libs) + " | best peer | kiln / best | kiln GB/s | % of read |",
           "|" + "---|" * (len(libs) + 5)]
    for p, ls in pts.items():
        k, b = ls.get("kiln"), best_peer(ls)
        ratio = f"{b['gpu_us'] / k['gpu_us']:.2f}" if k and b and k.get("gpu_us") else "—"
        share = f"{100 * k['rate'] / read:.1f}" if k and k.get("rate") and read else "—"
        out.append(f"| {p} | " + " | ".join(cell(ls.get(x)) for x in libs) +
                   f" | {b['lib'] if b else '—'} | {ratio} | {rate(k)} | {share} |")
    return out


def t_fp8(suites):
    label, rows, _, _ = suites.get("fp8", NO_RUN)
    bf = by_point(same_run(suites, "fp8", "decode"))
    out = [f"From {label} (the bf16 column from the same run's decode suite). GPU µs per call; "
           "fp8 speed-up = kiln bf16 time / kiln fp8 time (tokens/s ratio).", "",
           "| point | kiln fp8 | FlashInfer fp8 | kiln / FlashInfer | kiln bf16 | fp8 speed-up | kiln fp8 GB/s |",
           "|---|---|---|---|---|---|---|"]
    for p, ls in by_point(rows).items():
        k, f = ls.get("kiln"), ls.get("FlashInfer")
        kb = bf.get(p.replace(" e4m3", ""), {}).get("kiln")
        vs = f"{f['gpu_us'] / k['gpu_us']:.2f}" if k and f and f.get("gpu_us") else "—"
        up = f"{kb['gpu_us'] / k['gpu_us']:.2f}" if k and kb and kb.get("gpu_us") else "—"
        out.append(f"| {p} | {cell(k)} | {cell(f)} | {vs} | {cell(kb)} | {up} | {rate(k)} |")
    return out


def t_prefill(suites, suite):
    libs = ("kiln", "kiln paged", "FlashInfer", "FlashInfer paged", "cuDNN", "FA2", "Flex")
    label, rows, _, _ = suites.get(suite, NO_RUN)
    _, mm = ceilings_of(suites, suite)
    out = [f"From {label}. TFLOP/s by GPU time (CUDA-graph replay); kiln / best = best peer's time over "
           "kiln's (paged: against the peers' paged or contiguous rows); % of matmul: of the same run's bf16 "
           "matmul" + ("" if mm else " (this run measured none)") + ".", "",
           "| point | " + " | ".join(libs) + " | best peer | kiln / best | paged / best | % of matmul |",
           "|" + "---|" * (len(libs) + 5)]
    for p, ls in by_point(rows).items():
        k, kp = ls.get("kiln"), ls.get("kiln paged")
        b = best_peer(ls, ("FlashInfer", "FA2", "cuDNN", "Flex"))
        bp = best_peer(ls, ("FlashInfer paged", "FA2", "cuDNN", "Flex"))
        ratio = f"{b['gpu_us'] / k['gpu_us']:.2f}" if k and b and k.get("gpu_us") else "—"
        pr = f"{bp['gpu_us'] / kp['gpu_us']:.2f}" if kp and bp and kp.get("gpu_us") else "—"
        share = f"{100 * k['rate'] / mm:.1f}" if k and k.get("rate") and mm else "—"
        out.append(f"| {p} | " + " | ".join(rate(ls.get(x)) if ls.get(x, {}).get("rate") else cell(ls.get(x))
                                           for x in libs) + f" | {b['lib'] if b else '—'} | {ratio} | {pr} | {share} |")
    return out


def t_variants(suites):
    label, rows, _, _ = suites.get("variants", NO_RUN)
    plain = by_point(same_run(suites, "variants", "prefill")).get("4 x 4096", {}).get("kiln")
    out = [f"From {label}; the plain kernel from the same run's prefill suite (its 4 x 4096 causal row: "
           f"{rate(plain)} TFLOP/s).", "",
           "| variant (4 x 4096 causal) | kiln TFLOP/s | FlashInfer | Flex | kiln / plain (TFLOP/s) | kiln / Flex |",
           "|---|---|---|---|---|---|"]
    for p, ls in by_point(rows).items():
        k, f, fl = ls.get("kiln"), ls.get("FlashInfer"), ls.get("Flex")
        # by TFLOP/s: a window or a mask leaves fewer pairs to compute than the plain kernel
        vp = f"{k['rate'] / plain['rate']:.2f}" if k and plain and k.get("rate") and plain.get("rate") else "—"
        vf = f"{k['rate'] / fl['rate']:.2f}" if k and fl and fl.get("rate") and k.get("rate") else "—"
        out.append(f"| {p.replace('4 x 4096 ', '')} | {rate(k)} | {rate(f) if f and f.get('rate') else cell(f)} | "
                   f"{rate(fl)} | {vp} | {vf} |")
    return out


def t_bsr(suites):
    label, rows, _, _ = suites.get("bsr", NO_RUN)
    out = [f"From {label}. TFLOP/s count the visible pairs only; µs are GPU time.", "",
           "| point | lib | GPU µs | TFLOP/s | check |", "|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['point']} | {r['lib']} | {cell(r)} | {rate(r)} | {r['check']} |")
    return out


def t_cascade(suites):
    label, rows, _, _ = suites.get("cascade", NO_RUN)
    out = [f"From {label}. GPU µs per call; GB/s count the unique K/V bytes (the prefix once).", "",
           "| point | kiln cascade | FlashInfer cascade | kiln / FlashInfer | kiln plain decode | cuDNN (contiguous, "
           "prefix copied per request) | FA2 (same) |", "|---|---|---|---|---|---|---|"]
    for p, ls in by_point(rows).items():
        k, f = ls.get("kiln"), ls.get("FlashInfer")
        vs = f"{f['gpu_us'] / k['gpu_us']:.2f}" if k and f and f.get("gpu_us") and k.get("gpu_us") else "—"
        out.append(f"| {p} | {cell(k)} | {cell(f)} | {vs} | {cell(ls.get('kiln plain decode'))} | "
                   f"{cell(ls.get('cuDNN'))} | {cell(ls.get('FA2'))} |")
    return out


def t_host(suites):
    out = []
    for suite in ("decode", "prefill"):
        label, rows, _, _ = suites.get(suite, NO_RUN)
        pts = by_point(rows)
        libs = ("kiln", "FlashInfer", "cuDNN", "FA2", "Flex") if suite == "decode" else (
            "kiln", "kiln paged", "FlashInfer", "FlashInfer paged", "cuDNN", "FA2", "Flex")
        out += [f"{suite} run() host µs per call (back-to-back, no sync), then eager µs per call (events + sync), "
                f"from {label}:", "", "| point | " + " | ".join(f"{x} host" for x in libs) + " | " +
                " | ".join(f"{x} eager" for x in libs) + " |", "|" + "---|" * (2 * len(libs) + 1)]
        for p, ls in pts.items():
            out.append(f"| {p} | " + " | ".join(cell(ls.get(x), "host_us") for x in libs) + " | " +
                       " | ".join(cell(ls.get(x), "eager_us") for x in libs) + " |")
        out.append("")
    label, rows, _, _ = suites.get("host", NO_RUN)
    out += [f"plan() and run() wall clock per call, each pair followed by a drain (untimed), from {label}:", "",
            "| call | lib | median µs | spread |", "|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['point']} | {r['lib']} | {cell(r, 'host_us')} | {r['check']} |")
    return out


TABLES = {
    "ceilings": t_ceilings,
    "decode": lambda s: t_decode(s, "decode"),
    "decode-d": lambda s: t_decode(s, "decode-d", ("kiln", "FlashInfer", "cuDNN", "FA2")),
    "fp8": t_fp8,
    "prefill": lambda s: t_prefill(s, "prefill"),
    "prefill-d": lambda s: t_prefill(s, "prefill-d"),
    "variants": t_variants,
    "bsr": t_bsr,
    "cascade": t_cascade,
    "host": t_host,
}


def plots(suites, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    read, _ = ceilings_of(suites, "decode")
    _, mm = ceilings_of(suites, "prefill")
    pts = by_point(rows_of(suites, "decode"))
    fig, axes = plt.subplots(1, 4, figsize=(16, 4), sharey=True)
    for ax, B in zip(axes, (1, 16, 64, 256)):
        for lib in ("kiln", "FlashInfer", "cuDNN", "FA2", "Flex"):
            xs, ys = [], []
            for L in (512, 4096, 32768):
                r = pts.get(f"B{B} x {L}", {}).get(lib)
                if r and r.get("rate"):
                    xs.append(L)
                    ys.append(r["rate"])
            if xs:
                ax.plot(xs, ys, marker="o", label=lib)
        if read:
            ax.axhline(read, color="grey", linestyle="--", linewidth=1, label="streaming read")
        ax.set_xscale("log", base=2)
        ax.set_title(f"decode B = {B}")
        ax.set_xlabel("L_KV")
    axes[0].set_ylabel("GB/s by GPU time (graph replay)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "referee_decode.png"), dpi=90)
    plt.close(fig)
    pts = by_point(rows_of(suites, "prefill"))
    libs = ("kiln", "kiln paged", "FlashInfer", "FlashInfer paged", "cuDNN", "FA2", "Flex")
    names = list(pts)
    fig, ax = plt.subplots(figsize=(14, 4.5))
    w = 0.8 / len(libs)
    for i, lib in enumerate(libs):
        ys = [pts[p].get(lib, {}).get("rate") or 0 for p in names]
        ax.bar([j + i * w for j in range(len(names))], ys, w, label=lib)
    if mm:
        ax.axhline(mm, color="grey", linestyle="--", linewidth=1, label="bf16 matmul")
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(names))])
    ax.set_xticklabels(names, fontsize=8)
    ax.set_ylabel("TFLOP/s by GPU time (graph replay)")
    ax.legend(fontsize=8, ncol=4)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "referee_prefill.png"), dpi=90)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--update")
    ap.add_argument("--plots")
    a = ap.parse_args()
    suites, metas = load(a.runs)
    blocks = {name: "\n".join(f(suites)) for name, f in TABLES.items()}
    blocks["runs"] = "\n".join(
        f"- {label}: {m.get('gpu')} ({m.get('sms')} SMs), torch {m.get('torch')}, CUDA {m.get('cuda')}, "
        f"cuDNN {m.get('cudnn')}, FlashInfer {m.get('flashinfer', 'not loaded')}, kiln {m.get('kiln')}, "
        f"NVRTC {m.get('nvrtc')}; {m.get('method')}" for label, m, _ in metas)
    if a.update:
        text = open(a.update).read()
        def sub(m):
            name = m.group(1)
            if name not in blocks:
                sys.exit(f"report: {a.update} names an unknown table {name!r}")
            return f"<!-- referee:{name} -->\n{blocks[name]}\n<!-- /referee -->"
        text = re.sub(r"<!-- referee:([\w-]+) -->.*?<!-- /referee -->", sub, text, flags=re.S)
        open(a.update, "w").write(text)
    else:
        for name, b in blocks.items():
            print(f"<!-- referee:{name} -->\n{b}\n<!-- /referee -->\n")
    if a.plots:
        plots(suites, a.plots)
    return 0


if __name__ == "__main__":
    sys.exit(main())
