#!/bin/bash
# device_tests.sh — what a GPU lease runs to check kiln, logs under $OUT (default /tmp/kiln-out):
# `kiln info`, the GPU tests (kiln-tests --gpu), the Python tests on the GPU, and make demo's tour.
# Run from the repository root on the GPU machine after `. .gpu/env.sh`, with build/ built.
# The speed figures are tools/bench/referee.sh's job (docs/perf.md).
set -u
OUT=${OUT:-/tmp/kiln-out}
mkdir -p "$OUT"
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-cache} KILN_TEST_CACHE=${KILN_TEST_CACHE:-/tmp/kiln-cache}
export PYTHONUNBUFFERED=1
mkdir -p "$KILN_CACHE_DIR"
build/bin/kiln info > "$OUT/info.log" 2>&1
timeout 330 build/bin/kiln-tests --gpu > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: $(tail -1 "$OUT/gpu_tests.log")"
KILN_LIB=$PWD/build/lib/libkiln.so timeout 120 python3 -m unittest discover -s python/tests > "$OUT/python.log" 2>&1
echo "python: $(tail -1 "$OUT/python.log")"
timeout 90 tools/demo.sh build/bin/kiln > "$OUT/demo.log" 2>&1
echo "demo: exit $?"
grep -E "^    [a-z].*(cases|variants|diff)" "$OUT/gpu_tests.log"
