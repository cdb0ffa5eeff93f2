#!/bin/bash
# wgmma_tune.sh — on an H100 / H200, after `. .gpu/env.sh`, with build/ built: times the wgmma
# prefill family against the mma.sync family and its KILN_TUNE variants with `kiln check --time`
# (every timed run is also checked against the float64 reference), one line per run under $OUT.
#   main loop alone: one wave of long-KV CTAs (H 132, L_Q 128, L_KV 16384, non-causal)
#   the referee's shape: a ragged batch of 4 x 4096, causal and non-causal
# The figures are kiln's own launch timing (events around --time launches), a tuning aid: the
# referee (tools/bench/referee.sh) is what docs/perf.md quotes.
set -u
OUT=${OUT:-/tmp/kiln-out}
mkdir -p "$OUT"
K=build/bin/kiln
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-cache}
shapes=("--heads 132 --qo-len 128 --kv-len 16384"
        "mask=causal kv=ragged --batch 4 --heads 32 --qo-len 4096 --kv-len 4096"
        "kv=ragged --batch 4 --heads 32 --qo-len 4096 --kv-len 4096")
for tune in ${KILN_TUNES:-"wgmma=0" "" "load=1" "persist=1" "stages=2"}; do
    for sh in "${shapes[@]}"; do
        set -- $sh
        spec="op=prefill dtype=bf16 head_dim=${HEAD_DIM:-128} group=4"
        while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do spec="$spec $1"; shift; done
        line=$(KILN_TUNE=$tune timeout 60 $K check "$spec" "$@" --time 10 --seed 9 2>&1 | tail -1)
        printf 'KILN_TUNE=%-16s %s | %s\n' "$tune" "$sh" "$line" >> "$OUT/wgmma_tune.txt"
    done
done
cat "$OUT/wgmma_tune.txt"
