#!/usr/bin/env python3
"""readme_examples.py — run the README's console examples and compare the *shape* of their output.

    tests/readme_examples.py KILN_BINARY REPO_ROOT SCRATCH_DIR [--verbose]
    tests/readme_examples.py --self-test

Every ```console block of README.md is read; each `$ kiln ...` line (and `$ for ...; do kiln
...` loops, which feed later examples) that runs without a GPU is run in SCRATCH_DIR with a
fresh $HOME there (no ~/.cache yet: the default cache, as on a new machine). --verbose prints
every command's output (to refresh the README's figures). --self-test checks the comparison
itself on lines that must and must not match. What follows the command up to the next `$` line
is its expected output; a `...` line stands for any number of lines. Lines are compared by
shape, not by value: keys, archs, numbers, times, paths and the values of key=value words are
replaced by classes, so what is compared is the column headers, field names, words and line
count. A README key or key prefix given to a later command (`kiln show 26d8`) is replaced by the
same-length prefix of the key the run produced in its place. `$ cat FILE` blocks write FILE.

Not run: `kiln check` (needs a GPU) and `--sass` without cuobjdump. `--arch all` is run as
`--arch sm_80,sm_90a` (the shape is the same; 11 archs would cost minutes on a 2-core box).
A command whose expected output starts with `kiln <cmd>:` is an error example: it must exit
non-zero, and its stderr is compared; other commands must exit 0 and their stdout is compared.

Exit 0 when every example matches, 1 otherwise (each mismatch printed with both texts).
"""
import os
import re
import shlex
import shutil
import subprocess
import sys

KEY = re.compile(r"\b[0-9a-f]{32}\b")
SHAPES = [
    (re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\b"), "<T>"),
    (re.compile(r"\b[0-9a-f]{32}\b"), "<K>"),
    (re.compile(r"(\w+)=(\"(?:[^\"\\]|\\.)*\"|\S+)"), r"\1=<V>"),
    (re.compile(r"(?<![\w/])(?:/|\./|\w[\w.-]*/)[\w./-]*"), "<P>"),
    (re.compile(r"\bsm_\w+"), "<A>"),
    (re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])"), "<N>"),
    (re.compile(r"(?<![\w.])-(?![\w-])"), "<N>"),  # '-': a number ptxas did not report
    (re.compile(r"<A>(?: <A>)+"), "<A>+"),
    (re.compile(r"\s+"), " "),
]


def shape(line):
    s = line.rstrip()
    if re.match(r"^(driver|gpu)\b", s):  # the machine's GPUs: only the field is compared
        return s.split(":")[0].split(" ")[0] + ": <GPU>"
    for rx, rep in SHAPES:
        s = rx.sub(rep, s)
    return s.strip()


def collapse_gpu(shapes):
    out = []
    for s in shapes:
        if s == "gpu: <GPU>" and out and out[-1] == s:
            continue
        out.append(s)
    return out


def matches(want, got):
    """want may hold '...' (any number of lines)."""
    if not want:
        return not got
    if want[0] == "...":
        return any(matches(want[1:], got[i:]) for i in range(len(got) + 1))
    return bool(got) and want[0] == got[0] and matches(want[1:], got[1:])


def examples(readme):
    """(command, expected output lines, cat target) per `$` line of every console block."""
    out, block, cur = [], False, None
    lines = open(readme, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```console"):
            block = True
        elif line.startswith("```"):
            block = False
            cur = None
        elif block and line.startswith("$ "):
            cmd = line[2:]
            while cmd.endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd[:-1] + " " + lines[i].strip()
            cur = [cmd, []]
            out.append(cur)
        elif block and cur is not None and line.strip() and not line.startswith("#"):
            cur[1].append(line)
        elif block and not line.strip():
            cur = None
        i += 1
    return out


def self_test():
    """The comparison must tell these apart (and must not tell the first ones apart)."""
    same = [
        ("26d8ee2c07d93380dc6aa886f33b74b5 sm_90a cached 1.0 ms regs=207 smem=81920 spill=0 op=prefill",
         "0123456789abcdef0123456789abcdef sm_80 cached 467.5 ms regs=96 smem=0 spill=8 op=decode"),
        ("cache: /root/.cache/kiln/kernels.db (schema 2)", "cache: /tmp/x/home/.cache/kiln/kernels.db (schema 2)"),
        ("archs: sm_80 sm_86 sm_90a", "archs: sm_80 sm_90a sm_100 sm_103 sm_120"),
        ("registers:   207", "registers:   -"),
        ("gpu: none (compile-only: no CUDA driver)", "gpu 0: NVIDIA H100, sm_90, 132 SMs, arch sm_90a"),
    ]
    differ = [
        ("removed 2", "deleted 2"),
        ("registers:   207", "regs:        207"),
        ("16 kernels: 14 compiled, 2 cached, 0 failed in 6.9 s (139.2 kernels/min)",
         "16 kernels: 14 compiled, 0 failed in 6.9 s (139.2 kernels/min)"),
        ("KEY  ARCH REGS SMEM SPILL CUBIN", "KEY  ARCH REGS SMEM CUBIN"),
        ("spec: op=decode dtype=f16", "spec: op=decode"),
    ]
    bad = [(a, b) for a, b in same if shape(a) != shape(b)] + [(a, b) for a, b in differ if shape(a) == shape(b)]
    bad += [] if matches(["a", "...", "b"], ["a", "x", "y", "b"]) and matches(["a", "..."], ["a"]) else [("...", "")]
    bad += [] if not matches(["a", "b"], ["a", "b", "c"]) and not matches(["a", "...", "b"], ["a", "c"]) else [("len", "")]
    for a, b in bad:
        print("self-test: wrong verdict on %r vs %r" % (a, b))
    print("self-test: %s" % ("ok" if not bad else "FAILED"))
    return 1 if bad else 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    verbose = "--verbose" in sys.argv
    kiln, root, scratch = os.path.abspath(sys.argv[1]), sys.argv[2], sys.argv[3]
    os.makedirs(os.path.join(scratch, "home"), exist_ok=True)
    os.makedirs(os.path.join(scratch, "docs"), exist_ok=True)
    shutil.copy(os.path.join(root, "docs/demo.manifest"), os.path.join(scratch, "docs"))
    bindir = os.path.join(scratch, "bin")
    os.makedirs(bindir, exist_ok=True)
    if not os.path.exists(os.path.join(bindir, "kiln")):
        os.symlink(kiln, os.path.join(bindir, "kiln"))
    env = dict(os.environ)
    for k in ("KILN_STRICT", "KILN_RECORD", "KILN_BASE_CACHE_DIR", "KILN_CACHE_MAX_BYTES", "XDG_CACHE_HOME"):
        env.pop(k, None)
    env.pop("KILN_CACHE_DIR", None)
    env.update(HOME=os.path.join(scratch, "home"), PATH=bindir + os.pathsep + env.get("PATH", ""))
    have_cuobjdump = bool(env.get("KILN_CUOBJDUMP")) or shutil.which("cuobjdump", path=env["PATH"] +
                                                                     ":/usr/local/cuda/bin") is not None
    keys = {}  # README key -> the key this run produced in its place
    ran = failed = skipped = 0
    for cmd, want in examples(os.path.join(root, "README.md")):
        words = shlex.split(cmd, comments=True)
        if not words:
            continue
        if words[0] == "cat" and len(words) == 2:  # the README shows a file: write it
            text = "\n".join(re.sub(r"\s+#.*$", "", w) for w in want) + "\n"
            open(os.path.join(scratch, words[1]), "w").write(text)
            continue
        loop = words[0] == "for"
        if words[0] != "kiln" and not loop:
            continue
        if "check" in words[:4] or (("--sass" in words) and not have_cuobjdump):
            print("skip (%s): $ %s" % ("needs a GPU" if "check" in words[:4] else "no cuobjdump", cmd))
            skipped += 1
            continue
        text = cmd.split(" #")[0] if loop else None
        # the README's keys and prefixes -> this run's
        def subst(w):
            if re.fullmatch(r"[0-9a-f]{1,32}", w):
                for rk, ak in keys.items():
                    if rk.startswith(w):
                        return ak[: len(w)]
            return w.replace("/tmp/", scratch + "/")
        if loop:
            text = text.replace("--arch all", "--arch sm_80,sm_90a")
            p = subprocess.run(["bash", "-c", text], cwd=scratch, env=env, capture_output=True, text=True)
        else:
            # an option's number (--limit 2) is no key prefix, however hex it looks
            words = [w if i and words[i - 1].startswith("--") and w.isdigit() else subst(w)
                     for i, w in enumerate(words)]
            for j, w in enumerate(words):
                if w == "all" and j and words[j - 1] == "--arch":
                    words[j] = "sm_80,sm_90a"
            words[0] = kiln
            p = subprocess.run(words, cwd=scratch, env=env, capture_output=True, text=True)
        ran += 1
        error_example = bool(want) and re.match(r"kiln \w+: ", want[0]) is not None
        got_text = p.stderr if error_example else p.stdout
        got = [l for l in got_text.split("\n") if l.strip()]
        ok = (p.returncode != 0) if error_example else (p.returncode == 0)
        why = "exit status %d" % p.returncode if not ok else ""
        if ok and want:
            ws = collapse_gpu([w.strip() if w.strip() == "..." else shape(w) for w in want])
            gs = collapse_gpu([shape(g) for g in got])
            if not matches(ws, gs):
                ok, why = False, "output shape differs"
                print("  want shapes:\n    " + "\n    ".join(ws))
                print("  got shapes:\n    " + "\n    ".join(gs))
            # remember which key the run produced where the README shows one
            if ok and "..." not in want:
                for w, g in zip(want, got):
                    rk, gk = KEY.findall(w), KEY.findall(g)
                    for a, b in zip(rk, gk):
                        keys.setdefault(a, b)
        print("%s: $ %s" % ("ok" if ok else "MISMATCH (%s)" % why, cmd))
        if verbose:
            print("    " + "\n    ".join((p.stdout + p.stderr).rstrip("\n").split("\n")))
        if not ok:
            failed += 1
            print("  README:\n    " + "\n    ".join(want))
            print("  stdout:\n    " + "\n    ".join(p.stdout.split("\n")))
            print("  stderr:\n    " + "\n    ".join(p.stderr.split("\n")[-8:]))
    print("README examples: %d run, %d mismatched, %d skipped" % (ran, failed, skipped))
    return 1 if failed or ran == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
