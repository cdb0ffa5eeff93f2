#!/bin/bash
# device_run.sh — what one lease on the GPU machine runs, in stages, logs under $OUT.
#   tests:       kiln info, the GPU tests (full grid), the Python tests, make demo's tour
#   bench:       kiln-bench (CSV + table) and the peers in the same process run (peers.py)
#   batch:       batch-kiln then batch-peers
#   batch-kiln:  kiln-bench --batch (decode sweep, prefill, cascade, host overhead)
#   batch-peers: peers.py --batch; with FI=1 also FlashInfer (from .whl/, see fi-install; its
#                kernels compiled by fi-compile first unless $FI_OK already lists them)
#   fi-install:  install .whl/ (tools/bench/fetch_flashinfer.sh, run on a dev box) into
#                $FI_SITE with pip --no-index (falls back to unzipping the wheels)
#   fi-compile:  JIT-compile and check FlashInfer's configs once (peers.py --fi-compile-only,
#                no new compile after FI_DEADLINE seconds); writes $FI_OK
#   fi-batch:    all of it in one call (the machine is handed back 30 s after a call, taking
#                the JIT cache with it): fi-install, fi-compile, kiln-bench --batch, then
#                peers.py --batch with FlashInfer. H200, 2026-11-29: install 12 s, the four
#                default bf16 d128 configs 113 s, kiln-bench 78 s, peers 54 s
# usage (on the GPU machine, from the repo root, after `. .gpu/env.sh`):
#   tools/bench/device_run.sh tests|bench|batch|batch-kiln|batch-peers|fi-install|fi-compile|fi-batch|all
# One device call runs at most 10 minutes: with FlashInfer, run `fi-install` + `fi-compile` in
# one call and `FI=1 ... batch` in the next (the machine keeps .fi-site/ and .fi-cache/, both
# ignored, while it stays warm).
# environment: OUT (logs, default /tmp/kiln-out); FI=1 (FlashInfer peers); FI_ALL=1 (its
#   d64/d256 decode configs too); FI_CONFIGS (comma list for peers.py --fi-configs, e.g.
#   decode:d128:bf16,decode-tc:d128:bf16); FI_DEADLINE (seconds, default 420); QUICK=1 (the short
#   sweeps); FI_SITE (default $PWD/.fi-site); FLASHINFER_WORKSPACE_BASE (its JIT cache,
#   default $PWD/.fi-cache); FI_OK (configs that compiled, default $FLASHINFER_WORKSPACE_BASE/fi_ok.txt).
set -u
OUT=${OUT:-/tmp/kiln-out}
mkdir -p "$OUT"
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-cache} KILN_TEST_CACHE=${KILN_TEST_CACHE:-/tmp/kiln-cache}
export PYTHONUNBUFFERED=1
mkdir -p "$KILN_CACHE_DIR"
FI_SITE=${FI_SITE:-$PWD/.fi-site}
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-$PWD/.fi-cache}
FI_OK=${FI_OK:-$FLASHINFER_WORKSPACE_BASE/fi_ok.txt}
mkdir -p "$FLASHINFER_WORKSPACE_BASE"
stage=${1:-all}
summary=()

fi_env() {
    export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
    export PYTHONPATH="$FI_SITE${PYTHONPATH:+:$PYTHONPATH}" PATH="$FI_SITE/bin:$CUDA_HOME/bin:$PATH"
    export MAX_JOBS=${MAX_JOBS:-$(nproc)}
}

fi_install() {
    [ -d .whl ] || { echo "fi-install: no .whl/ (run tools/bench/fetch_flashinfer.sh on a dev box, carry .whl)"; return 1; }
    mkdir -p "$FI_SITE"
    if python3 -m pip --version > /dev/null 2>&1; then
        python3 -m pip install -q --no-index --find-links .whl --no-deps --target "$FI_SITE" --upgrade \
            --break-system-packages .whl/*.whl > "$OUT/fi_install.log" 2>&1 ||
            python3 -m pip install -q --no-index --find-links .whl --no-deps --target "$FI_SITE" --upgrade \
                .whl/*.whl >> "$OUT/fi_install.log" 2>&1
    else
        echo "no pip: unzipping the wheels" > "$OUT/fi_install.log"
        for w in .whl/*.whl; do python3 -m zipfile -e "$w" "$FI_SITE" >> "$OUT/fi_install.log" 2>&1; done
        # wheel scripts (ninja) land under *.data/scripts; put them on PATH
        mkdir -p "$FI_SITE/bin"
        for s in "$FI_SITE"/*.data/scripts/*; do [ -f "$s" ] && cp "$s" "$FI_SITE/bin/" && chmod +x "$FI_SITE/bin/$(basename "$s")"; done
        find "$FI_SITE" -path '*ninja/data/bin/ninja' -exec chmod +x {} \;
    fi
    fi_env
    python3 -c "import flashinfer, tvm_ffi; print('flashinfer', flashinfer.__version__)" >> "$OUT/fi_install.log" 2>&1
    local rc=$?
    command -v ninja >> "$OUT/fi_install.log" 2>&1 || echo "fi-install: no ninja on PATH" >> "$OUT/fi_install.log"
    tail -3 "$OUT/fi_install.log"
    return $rc
}

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
fi_ready() { # FlashInfer importable, installing it from .whl/ if needed
    fi_env
    python3 -c "import flashinfer" > /dev/null 2>&1 || { fi_install > /dev/null && python3 -c "import flashinfer" > /dev/null 2>&1; }
}

fi_compile() {
    local fiall=() dl=${FI_DEADLINE:-420}
    [ "${FI_ALL:-0}" = 1 ] && fiall=(--fi-all)
    [ -n "${FI_CONFIGS:-}" ] && fiall=(--fi-configs "$FI_CONFIGS")
    timeout $((dl + 150)) python3 tools/bench/peers.py --fi-compile-only --fi-ok "$FI_OK" \
        --fi-deadline "$dl" "${fiall[@]}" > "$OUT/fi_compile.log" 2>&1
    local rc=$?
    [ -f "$FI_OK" ] && cp "$FI_OK" "$OUT/fi_ok.txt"
    summary+=("flashinfer compile: exit $rc ($(tail -1 "$OUT/fi_compile.log"))")
    cat "$OUT/fi_compile.log"
}

q=(); [ "${QUICK:-0}" = 1 ] && q=(--quick)
if [ "$stage" = fi-install ]; then
    fi_install
    summary+=("fi-install: exit $?")
fi
if [ "$stage" = fi-compile ]; then
    if fi_ready; then fi_compile; else summary+=("flashinfer: not importable (see $OUT/fi_install.log)"); fi
fi
if [ "$stage" = fi-batch ]; then
    if fi_ready; then FI_DEADLINE=${FI_DEADLINE:-200} fi_compile > /dev/null; else summary+=("flashinfer: not importable"); fi
    export FI=1
fi
if [ "$stage" = batch ] || [ "$stage" = batch-kiln ] || [ "$stage" = all ] || [ "$stage" = fi-batch ]; then
    timeout 400 build/bin/kiln-bench --batch "${q[@]}" --csv "$OUT/kiln_batch.csv" > "$OUT/bench_batch.md" 2>&1
    summary+=("bench --batch: exit $?")
    cat "$OUT/bench_batch.md"
fi
if [ "$stage" = batch ] || [ "$stage" = batch-peers ] || [ "$stage" = all ] || [ "$stage" = fi-batch ]; then
    fiopt=()
    if [ "${FI:-0}" = 1 ]; then
        if fi_ready; then
            [ -s "$FI_OK" ] || fi_compile
            [ -s "$FI_OK" ] && fiopt=(--flashinfer --fi-ok "$FI_OK")
        else
            summary+=("flashinfer: not importable (see $OUT/fi_install.log)")
        fi
    fi
    timeout 500 python3 tools/bench/peers.py --batch "${q[@]}" "${fiopt[@]}" --csv "$OUT/peers_batch.csv" 2>&1 |
        grep -v Warning > "$OUT/peers_batch.md"
    summary+=("peers --batch: done")
    cat "$OUT/peers_batch.md"
fi
printf '%s\n' "${summary[@]}"
