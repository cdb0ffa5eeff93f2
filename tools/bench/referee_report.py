"""referee_report.py — the referee's summary (kiln against the best peer per point, by GPU
time; kiln's share of the measured ceilings; host time per call) and its CSV, JSON and markdown
files."""
import json

from clocks import describe
from referee_common import RES


# ---- the report --------------------------------------------------------------------------------

PEERS = ("FlashInfer", "FlashInfer-tc", "FA2", "cuDNN", "Flex", "FlashInfer paged")


def ceilings():
    """(read GB/s, matmul TFLOP/s) measured in this run: kiln's tuned read kernel (else torch's
    x.max()) and torch's bf16 matmul."""
    read = RES.ceil.get("kiln_read")
    mm = None
    for r in RES.rows:
        if r["suite"] == "ceilings" and r.get("rate"):
            if r["point"].startswith("streaming read, torch") and not read:
                read = r["rate"]
            if r["point"].startswith("bf16 matmul"):
                mm = r["rate"]
    return read, mm


def clock(row):
    """The row's clock while its GPU time was measured (clocks.py), or '—'."""
    return describe({k: row[k] for k in ("sm_mhz", "power_w", "power_capped") if k in row}) or "—"


def summary():
    """kiln / best peer per point, by GPU time (ratio > 1: kiln is faster), and kiln's share of
    the measured ceiling (GB/s: the streaming read; TFLOP/s: the bf16 matmul)."""
    read, mm = ceilings()
    lines = ["", "### kiln against the best peer, by GPU time (CUDA-graph replay)", "",
             f"Ceilings in this run: streaming read {read or 0:.0f} GB/s, bf16 matmul {mm or 0:.0f} TFLOP/s.", "",
             "| suite | point | kiln µs | best peer | peer µs | kiln / best | kiln rate | % of ceiling | clock: kiln / peer |",
             "|---|---|---|---|---|---|---|---|---|"]
    by = {}
    for r in RES.rows:
        by.setdefault((r["suite"], r["point"]), []).append(r)
    for (suite, point), rows in by.items():
        k = [r for r in rows if r["lib"] in ("kiln", "kiln paged", "kiln single") and r.get("gpu_us")]
        for kr in k:
            peers = [r for r in rows if r["lib"] in PEERS and r.get("gpu_us") and not r["check"].startswith("MISMATCH")
                     and (("paged" in r["lib"]) == ("paged" in kr["lib"]) or r["lib"] in ("FA2", "cuDNN", "Flex"))]
            ceil = read if kr["unit"] == "GB/s" else mm
            share = f"{100 * kr['rate'] / ceil:.1f}" if ceil and kr.get("rate") else ""
            name = point + (" (paged)" if "paged" in kr["lib"] else " (single)" if "single" in kr["lib"] else "")
            if not peers:
                lines.append(f"| {suite} | {name} | {kr['gpu_us']:.1f} | — | | | {kr['rate']:.0f} {kr['unit']} | {share} "
                             f"| {clock(kr)} |")
                continue
            best = min(peers, key=lambda r: r["gpu_us"])
            ratio = best["gpu_us"] / kr["gpu_us"]
            lines.append(f"| {suite} | {name} | {kr['gpu_us']:.1f} | {best['lib']} | {best['gpu_us']:.1f} | "
                         f"{ratio:.2f} | {kr['rate']:.0f} {kr['unit']} | {share} | {clock(kr)} / {clock(best)} |")
    lines += ["", "### Host time per call (µs; run: back-to-back, no sync; plan: each call then a drain)", "",
              "| suite | point | lib | host µs/call | eager µs/call | GPU µs |", "|---|---|---|---|---|---|"]
    for r in RES.rows:
        if r.get("host_us") is not None and r["suite"] != "ceilings":
            f = lambda k: f"{r[k]:.1f}" if r.get(k) is not None else "—"
            lines.append(f"| {r['suite']} | {r['point']} | {r['lib']} | {f('host_us')} | {f('eager_us')} | {f('gpu_us')} |")
    return "\n".join(lines)


def write_files(text, csv_path, json_path, md_path):
    """The rows as CSV (a metadata line first), the whole run as JSON, the summary as markdown;
    each only when its path is given."""
    if csv_path:
        keys = ["suite", "point", "lib", "unit", "gpu_us", "rate", "host_us", "eager_us", "check", "copies",
                "sm_mhz", "power_w", "power_capped", "error"]
        with open(csv_path, "w") as f:
            f.write("# " + json.dumps(RES.meta) + "\n" + ",".join(keys) + "\n")
            for r in RES.rows:
                f.write(",".join('"' + str(r.get(k, "") if r.get(k) is not None else "").replace('"', "'") + '"'
                                 for k in keys) + "\n")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(dict(meta=RES.meta, ceilings=RES.ceil, rows=RES.rows), f, indent=1)
    if md_path:
        with open(md_path, "w") as f:
            f.write(text + "\n")
