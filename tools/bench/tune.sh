#!/bin/bash
# tune.sh — times one bench point under several KILN_TUNE tile configurations (each config is
# part of the kernel key, so every row is its own cached kernel). Run on the GPU machine.
# usage: tools/bench/tune.sh POINT "CONFIG" ["CONFIG"...]     e.g.
#        tools/bench/tune.sh "prefill causal" "" "warps=8" "warps=4 mt=2 qregs=0"
set -u
point=$1
shift
for cfg in "$@"; do
    printf '%-28s ' "[${cfg:-default}]"
    KILN_TUNE="$cfg" build/bin/kiln-bench --only "$point" 2>&1 | grep '^| '"$point"' ' | tr '\n' ' '
    echo
done
