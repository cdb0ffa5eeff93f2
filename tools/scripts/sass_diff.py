#!/usr/bin/env python3
"""sass_diff.py — which kernels a change of kiln's templates or code generation really changed.

Any change to a template changes every kernel's key, so a cache built before it and one built
after it share no key. This tool pairs the kernels of two caches by their key material without
the `templates:` line (the spec, the config, NVRTC, the arch and the options), disassembles both
cubins with cuobjdump and compares their instructions. A kernel whose SASS is the same is the
same program: the GPU tests that passed on the old one hold for the new one, and a GPU lease
need only run the tests of the kernels that differ.

    python3 tools/scripts/sass_diff.py OLD/kernels.db NEW/kernels.db [--list N] [--only REGEX]
        [--jobs N] [--cuobjdump PATH]

OLD and NEW are cache databases (`make gpu-seed` leaves one in build/seed/, and a seed archive
unpacks to one). Prints how many kernels were compared, how many have identical SASS, the
differing ones grouped by operation and logits transform (with or without a snippet), and up to
N differing specs with their instruction counts. cuobjdump: --cuobjdump, else $KILN_CUOBJDUMP
(as `kiln show --sass` reads it), else cuobjdump on PATH or in /usr/local/cuda/bin (NVIDIA's
nvidia-cuda-cuobjdump wheel has one where the toolkit lacks it).

Exit status: 0 compared (identical or not), 1 a failure (a database or cuobjdump), 2 bad usage.
"""
import argparse
import hashlib
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

INSN = re.compile(r"/\*[0-9a-f]{4,}\*/")


def cuobjdump_path(given):
    for c in (given, os.environ.get("KILN_CUOBJDUMP"), shutil.which("cuobjdump"),
              "/usr/local/cuda/bin/cuobjdump"):
        if c and os.access(c, os.X_OK):
            return c
    return None


def load(path):
    """{pairing key: (row key, spec)} of a cache database (the cubins stay in it: cubin())."""
    if not os.path.isfile(path):
        raise OSError(f"{path}: no such file")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT key, key_material, spec FROM kernels").fetchall()
    finally:
        db.close()
    out = {}
    for key, km, spec in rows:
        pair = "\n".join(line for line in km.split("\n") if not line.startswith("templates:"))
        out[pair] = (key, spec)
    return out


_local = threading.local()


def cubin(path, key):
    """The cubin of row `key` of database `path`, read through this thread's connection."""
    dbs = _local.__dict__.setdefault("dbs", {})
    if path not in dbs:
        dbs[path] = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    return dbs[path].execute("SELECT cubin FROM kernels WHERE key = ?", (key,)).fetchone()[0]


def sass(tool, cubin):
    """(digest, instruction count) of a cubin's SASS."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        name = f.name
    try:
        r = subprocess.run([tool, "-sass", name], capture_output=True, text=True)
    finally:
        os.unlink(name)
    if r.returncode != 0:
        raise RuntimeError(f"{tool} -sass failed ({r.returncode}): {r.stderr.strip()[:200]}")
    lines = [line.strip() for line in r.stdout.split("\n") if INSN.search(line)]
    if not lines:
        raise RuntimeError(f"{tool} -sass printed no instructions")
    return hashlib.sha1("\n".join(lines).encode()).hexdigest(), len(lines)


def group(spec):
    op = re.search(r"\bop=(\w+)", spec)
    logits = re.search(r"\blogits=(\w+)", spec)
    tag = f"op={op.group(1) if op else '?'} logits={logits.group(1) if logits else 'none'}"
    return tag + (" with a logits snippet" if "logits_expr=" in spec else "") + (
        " with a mask snippet" if "mask_expr=" in spec else "")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--list", type=int, default=10, metavar="N", help="differing specs to print")
    ap.add_argument("--only", metavar="REGEX", help="compare only specs matching REGEX")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--cuobjdump", metavar="PATH")
    a = ap.parse_args(argv)
    tool = cuobjdump_path(a.cuobjdump)
    if not tool:
        print("sass_diff: no cuobjdump (--cuobjdump, $KILN_CUOBJDUMP, PATH, /usr/local/cuda/bin)",
              file=sys.stderr)
        return 1
    try:
        old, new = load(a.old), load(a.new)
        only = re.compile(a.only) if a.only else None
    except (OSError, sqlite3.Error, re.error) as e:
        print(f"sass_diff: {e}", file=sys.stderr)
        return 1
    keys = sorted(k for k in set(old) & set(new) if not only or only.search(old[k][1]))
    print(f"{len(old)} kernels in {a.old}, {len(new)} in {a.new}; {len(keys)} in both"
          + (f" matching {a.only!r}" if only else ""))

    def compare(k):
        return k, sass(tool, cubin(a.old, old[k][0])), sass(tool, cubin(a.new, new[k][0]))

    same, differ = 0, {}
    try:
        with ThreadPoolExecutor(max(1, a.jobs)) as ex:
            for k, (ho, no), (hn, nn) in ex.map(compare, keys):
                if ho == hn:
                    same += 1
                else:
                    differ.setdefault(group(old[k][1]), []).append((old[k][1], no, nn))
    except (RuntimeError, sqlite3.Error) as e:
        print(f"sass_diff: {e}", file=sys.stderr)
        return 1
    n_diff = sum(len(v) for v in differ.values())
    print(f"{len(keys)} compared: {same} with identical SASS, {n_diff} differ")
    for tag, v in sorted(differ.items()):
        print(f"  {len(v):5d} differ: {tag}")
    shown = 0
    for tag, v in sorted(differ.items()):
        for spec, no, nn in v:
            if shown >= a.list:
                break
            print(f"    {spec}: {no} -> {nn} instructions")
            shown += 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
