#!/bin/bash
# device_run.sh — what one lease on the GPU machine runs, in stages, logs under $OUT.
#   tests:  kiln info, the GPU tests (full grid), the Python tests, make demo's tour
#   bench:  kiln-bench (CSV + table) and the peers in the same process run (peers.py)
# usage (on the GPU machine, from the repo root, after `. .gpu/env.sh`):
#   tools/bench/device_run.sh tests|bench|all
set -u
OUT=${OUT:-/tmp/kiln-out}
mkdir -p "$OUT"
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-cache} KILN_TEST_CACHE=${KILN_TEST_CACHE:-/tmp/kiln-cache}
export PYTHONUNBUFFERED=1
mkdir -p "$KILN_CACHE_DIR"
stage=${1:-all}
summary=()
if [ "$stage" = tests ] || [ "$stage" = all ]; then
    build/bin/kiln info > "$OUT/info.log" 2>&1
    timeout 330 build/bin/kiln-tests --gpu > "$OUT/gpu_tests.log" 2>&1
    summary+=("gpu tests: $(tail -1 "$OUT/gpu_tests.log")")
    KILN_LIB=$PWD/build/lib/libkiln.so timeout 120 python3 -m unittest discover -s python/tests > "$OUT/python.log" 2>&1
    summary+=("python: $(tail -1 "$OUT/python.log")")
    timeout 90 tools/demo.sh build/bin/kiln > "$OUT/demo.log" 2>&1
    summary+=("demo: exit $?")
    grep -E "^    [a-z].*(cases|variants|diff)" "$OUT/gpu_tests.log"
fi
if [ "$stage" = bench ] || [ "$stage" = all ]; then
    timeout 200 build/bin/kiln-bench --csv "$OUT/kiln.csv" > "$OUT/bench.md" 2>&1
    summary+=("bench: exit $?")
    timeout 300 python3 tools/bench/peers.py --csv "$OUT/peers.csv" 2>&1 | grep -v Warning > "$OUT/peers.md"
    summary+=("peers: done")
    cat "$OUT/bench.md" "$OUT/peers.md"
fi
printf '%s\n' "${summary[@]}"
