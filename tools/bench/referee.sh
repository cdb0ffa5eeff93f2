#!/bin/bash
# referee.sh — the whole referee (tools/bench/referee.py) in one GPU call, logs under $OUT.
#
#   tools/bench/referee.sh [all|fi|run] [referee.py options, e.g. --quick or --only decode]
#     fi    install FlashInfer from .whl/ (tools/bench/fetch_flashinfer.sh, run on a machine with
#           PyPI) into $FI_SITE with pip --no-index, then JIT-build its configs in FI_PROCS
#           parallel processes (each config on a small shape; no build starts after FI_DEADLINE
#           seconds); the configs that built are listed in $FI_OK
#     run   referee.py with FlashInfer (the configs in $FI_OK) when it is importable
#     all   fi, then run (the default; `make bench-gpu` runs this)
# FlashInfer's JIT cache ($FLASHINFER_WORKSPACE_BASE, default .fi-cache/) lives on the GPU
# machine only while it stays warm: `fi` and `run` in separate calls need back-to-back calls.
# Run from the repository root after `. .gpu/env.sh` (or wherever libclang is found), with
# build/ built. Environment: OUT (default /tmp/kiln-out), FI_SITE (.fi-site), FI_PROCS (3),
# FI_DEADLINE (300), FI_CONFIGS (a comma list, default referee.FI_CONFIGS), KILN_CACHE_DIR (default /tmp/kiln-cache).
set -u
OUT=${OUT:-/tmp/kiln-out}
mkdir -p "$OUT"
stage=${1:-all}
[ $# -gt 0 ] && shift
export PYTHONUNBUFFERED=1
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-cache}
export KILN_LIB=${KILN_LIB:-$PWD/build/lib/libkiln.so}
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
FI_SITE=${FI_SITE:-$PWD/.fi-site}
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-$PWD/.fi-cache}
FI_OK=${FI_OK:-$FLASHINFER_WORKSPACE_BASE/fi_ok.txt}
mkdir -p "$KILN_CACHE_DIR" "$FLASHINFER_WORKSPACE_BASE"
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH="$FI_SITE/bin:$CUDA_HOME/bin:$PATH"

fi_importable() {
    PYTHONPATH="$FI_SITE:$PYTHONPATH" python3 -c "import flashinfer" > /dev/null 2>&1
}

fi_install() {
    fi_importable && return 0
    [ -d .whl ] || { echo "referee: no .whl/ (run tools/bench/fetch_flashinfer.sh where PyPI is reachable)"; return 1; }
    mkdir -p "$FI_SITE"
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$FI_SITE" --upgrade .whl/*.whl \
        > "$OUT/fi_install.log" 2>&1
    # the ninja wheel's script lands under bin/ of the target
    find "$FI_SITE" -path '*ninja/data/bin/ninja' -exec chmod +x {} \; 2> /dev/null
    fi_importable || { echo "referee: FlashInfer does not import (see fi_install.log)"; return 1; }
}

fi_build() {
    : > "$FI_OK"
    local cfgs procs=${FI_PROCS:-3} i=0
    cfgs=${FI_CONFIGS:-$(python3 -c "import sys; sys.path.insert(0, 'tools/bench'); import referee; print(' '.join(referee.FI_CONFIGS))")}
    cfgs=${cfgs//,/ }
    local -a part=()
    for c in $cfgs; do part[$((i % procs))]+="${part[$((i % procs))]:+,}$c"; i=$((i + 1)); done
    local pids=()
    for ((p = 0; p < procs; p++)); do
        [ -n "${part[$p]:-}" ] || continue
        MAX_JOBS=$(($(nproc) / procs + 1)) PYTHONPATH="$FI_SITE:$PYTHONPATH" \
            python3 tools/bench/referee.py --fi-compile-only --fi-configs "${part[$p]}" --fi-ok "$FI_OK" \
            --fi-deadline "${FI_DEADLINE:-300}" > "$OUT/fi_build_$p.log" 2>&1 &
        pids+=($!)
    done
    wait "${pids[@]}"
    cat "$OUT"/fi_build_*.log | grep -E "built|FAILED|skipped|not importable"
    echo "FlashInfer configs built: $(wc -l < "$FI_OK") of $(echo $cfgs | wc -w)"
}

if [ "$stage" = fi ] || [ "$stage" = all ]; then
    t0=$SECONDS
    fi_install && fi_build
    echo "fi: $((SECONDS - t0)) s"
fi
if [ "$stage" = run ] || [ "$stage" = all ]; then
    fiopt=()
    fi_importable && fiopt=(--flashinfer --fi-ok "$FI_OK")
    PYTHONPATH="$FI_SITE:$PYTHONPATH" python3 tools/bench/referee.py "${fiopt[@]}" \
        --csv "$OUT/referee.csv" --json "$OUT/referee.json" --md "$OUT/referee_summary.md" "$@" \
        > "$OUT/referee.log" 2>&1  # straight to the file: a timeout must not lose a pipe's buffer
    rc=$?
    cat "$OUT/referee_summary.md" 2> /dev/null || tail -40 "$OUT/referee.log"
    echo "referee: exit $rc"
fi
