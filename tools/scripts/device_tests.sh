#!/bin/bash
# device_tests.sh — what a GPU lease runs to check kiln, logs under $OUT (default /tmp/kiln-out):
# `kiln info`, the GPU tests, the Python tests on the GPU, and make demo's tour.
# Run from the repository root on the GPU machine after `. .gpu/env.sh`, with build/ built.
# The speed figures are tools/bench/referee.sh's job (docs/perf.md).
#
# A cold cache spends most of a serial suite compiling one variant after another, so every GPU
# test runs in a process of its own and every Python test file in another, $KILN_JOBS (default
# 16) at a time, sharing one cache (its compile leases keep two processes from building one
# kernel). Each GPU test records the kernels it asked for; $OUT/gpu.manifest is their union, for
# `kiln warm` on a later machine; $OUT/python.manifest the Python tests' kernels beyond it.
# KILN_JOBS=1 runs them one after another.
#   KILN_SEED_CACHE=FILE.tar.xz  unpack a carried cache (kernels.db, e.g. warmed here with
#                                `kiln warm --arch sm_90a`) into $KILN_CACHE_DIR first
#   KILN_TEST_TIMEOUT=S          the limit for one test process (default 300)
#   KILN_DEMO=0                  skip the demo
#   KILN_PY=0                    skip the Python tests (a short lease: the C GPU tests alone)
set -u
OUT=${OUT:-/tmp/kiln-out}
JOBS=${KILN_JOBS:-16}
LIMIT=${KILN_TEST_TIMEOUT:-300}
mkdir -p "$OUT/gpu" "$OUT/python"
OUT=$(cd "$OUT" && pwd)
# the C tests' cache (KILN_TEST_CACHE) is the seeded one unless named apart: session 36 set
# KILN_CACHE_DIR alone, and the C tests compiled every kernel again into /tmp/kiln-cache
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-cache}
export KILN_TEST_CACHE=${KILN_TEST_CACHE:-$KILN_CACHE_DIR}
export PYTHONUNBUFFERED=1 KILN_LIB=$PWD/build/lib/libkiln.so PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$KILN_CACHE_DIR"
if [ -n "${KILN_SEED_CACHE:-}" ]; then
    # the seed replaces the cache whole: a WAL (and its index, and the hit log) left by an
    # earlier run on this machine would be applied to the seed's kernels.db and corrupt it
    # (session 52: every put of four tests then failed, and they timed out recompiling)
    rm -f "$KILN_CACHE_DIR"/kernels.db "$KILN_CACHE_DIR"/kernels.db-*
    python3 -c 'import lzma, shutil, sys, tarfile
with tarfile.open(fileobj=lzma.open(sys.argv[1])) as t: t.extractall(sys.argv[2])' \
        "$KILN_SEED_CACHE" "$KILN_CACHE_DIR" && echo "seed cache: $(du -sh "$KILN_CACHE_DIR" | cut -f1)"
fi
build/bin/kiln info > "$OUT/info.log" 2>&1
t0=$SECONDS

# The C GPU tests: "N passed, N failed" closes each log.
# the longest tests first (the grids, the decode tunes over 300 requests), so that they are not
# the tail when the others finish: with their float64 references sharing the CPUs, the last of
# them decides when the suite ends
build/bin/kiln-tests --gpu --list | sed -n 's/ (gpu)$//p' > "$OUT/gpu/all.txt"
{ grep -E 'grid|_bulk|pack_groups|ksplit|_hx$' "$OUT/gpu/all.txt"
  grep -v -E 'grid|_bulk|pack_groups|ksplit|_hx$' "$OUT/gpu/all.txt"; } > "$OUT/gpu/cases.txt"
xargs -P "$JOBS" -I{} sh -c 'KILN_RECORD="$1/gpu/$3.manifest" timeout "$2" \
        build/bin/kiln-tests --gpu "$3" > "$1/gpu/$3.log" 2>&1' sh "$OUT" "$LIMIT" {} \
    < "$OUT/gpu/cases.txt" &
c_pid=$!
# The Python test files, each its own unittest process: every file with the C Runner
# (python/kiln/hot.c) required where make built it, and the files that run the batch wrappers
# once more on the ctypes path alone (KILN_HOT=0), which is the fall-back without it.
hot=; [ -e build/lib/_kiln_hot.abi3.so ] && hot=1
if [ "${KILN_PY:-1}" != 0 ]; then
    { ls python/tests/test_*.py | xargs -n1 basename | sed "s/\.py\$/-hot$hot/"
      ls python/tests/test_{batch_torch,graph,ops,prefix,sparse,wrapper_semantics,fi_attributes}.py |
          xargs -n1 basename | sed 's/\.py$/-hot0/'; } > "$OUT/python/files.txt"
else
    : > "$OUT/python/files.txt"
fi
xargs -P "$JOBS" -I{} sh -c 'f=${3%-hot*} hot=${3##*-hot}; cd python/tests &&
        KILN_HOT=$hot KILN_RECORD="$1/python/$3.manifest" timeout "$2" python3 -m unittest -v "$f" \
            > "$1/python/$3.log" 2>&1;
        echo "rc=$?" >> "$1/python/$3.log"' sh "$OUT" "$LIMIT" {} \
    < "$OUT/python/files.txt" &
wait $c_pid
cat "$OUT"/gpu/*.manifest 2> /dev/null | grep -v '^#' | sort -u > "$OUT/gpu.manifest"
passed=0 failed=0
while read -r c; do
    last=$(tail -1 "$OUT/gpu/$c.log" 2> /dev/null)
    if [[ $last =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
        passed=$((passed + BASH_REMATCH[1])) failed=$((failed + BASH_REMATCH[2]))
        [ "${BASH_REMATCH[2]}" = 0 ] || echo "gpu FAIL: $c"
    else
        failed=$((failed + 1))
        echo "gpu FAIL: $c (no summary line: timed out or crashed)"
    fi
done < "$OUT/gpu/cases.txt"
[ -s "$OUT/gpu/cases.txt" ] || { failed=1; echo "gpu FAIL: no GPU test listed ($(head -1 "$OUT/info.log"); see info.log)"; }
echo "gpu tests: $passed passed, $failed failed ($((SECONDS - t0)) s, $(wc -l < "$OUT/gpu.manifest") kernels recorded)"
wait
pyok=0 pybad=0
while read -r f; do
    if grep -q '^rc=0$' "$OUT/python/$f.log"; then pyok=$((pyok + 1)); else
        pybad=$((pybad + 1))
        echo "python FAIL: $f: $(grep -E '^(FAILED|OK|Ran)' "$OUT/python/$f.log" | tr '\n' ' ')"
    fi
done < "$OUT/python/files.txt"
if [ "${KILN_PY:-1}" != 0 ]; then
    echo "python: $pyok files OK, $pybad failed ($(cat "$OUT"/python/*.log | grep -c '\.\.\. ok$') tests ok," \
        "$(cat "$OUT"/python/*.log | grep -c '\.\.\. skipped') skipped; $((SECONDS - t0)) s)"
    # the kernels the Python tests asked for that the C tests did not: what a seed made from
    # tests/gpu.manifest alone leaves them to compile on the GPU machine (tests/python.manifest)
    cat "$OUT"/python/*.manifest 2> /dev/null | grep -v '^#' | sort -u |
        comm -23 - "$OUT/gpu.manifest" > "$OUT/python.manifest"
    echo "python: $(wc -l < "$OUT/python.manifest") kernels beyond the C tests' (python.manifest)"
else
    echo "python: not run (KILN_PY=0)"
fi
if [ "${KILN_DEMO:-1}" != 0 ]; then
    timeout 90 tools/scripts/demo.sh build/bin/kiln > "$OUT/demo.log" 2>&1
    echo "demo: exit $?"
fi
cat "$OUT"/gpu/*.log 2> /dev/null | grep -E "^    [a-z].*(cases|variants|diff)"
