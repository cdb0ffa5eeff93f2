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
# A cold cache spends most of the suite compiling one variant after another: first run every GPU
# test in a process of its own, $KILN_PREWARM (default 16) at a time, into the shared cache (its
# compile leases keep two processes from building one kernel), each recording the kernels it asked
# for; gpu.manifest is their union, for `kiln warm` on a later machine. KILN_PREWARM=0 skips it.
if [ "${KILN_PREWARM:-16}" != 0 ]; then
    mkdir -p "$OUT/prewarm"
    t0=$SECONDS
    build/bin/kiln-tests --gpu --list | sed -n 's/ (gpu)$//p' |
        xargs -P "${KILN_PREWARM:-16}" -I{} sh -c \
            'KILN_RECORD="$1/prewarm/$2.manifest" timeout 300 build/bin/kiln-tests --gpu "$2" \
                > "$1/prewarm/$2.log" 2>&1' sh "$OUT" {}
    cat "$OUT"/prewarm/*.manifest 2> /dev/null | grep -v '^#' | sort -u > "$OUT/gpu.manifest"
    echo "prewarm: $((SECONDS - t0)) s, $(wc -l < "$OUT/gpu.manifest") kernels recorded"
fi
timeout 330 build/bin/kiln-tests --gpu > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: $(tail -1 "$OUT/gpu_tests.log")"
KILN_LIB=$PWD/build/lib/libkiln.so timeout 120 python3 -m unittest discover -s python/tests > "$OUT/python.log" 2>&1
echo "python: $(tail -1 "$OUT/python.log")"
timeout 90 tools/scripts/demo.sh build/bin/kiln > "$OUT/demo.log" 2>&1
echo "demo: exit $?"
grep -E "^    [a-z].*(cases|variants|diff)" "$OUT/gpu_tests.log"
