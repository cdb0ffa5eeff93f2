#!/bin/bash
# fuzz.sh — run kiln's libFuzzer targets (make fuzz builds them into BUILD/bin/fuzz-*).
#
#   tools/scripts/fuzz.sh BUILD SECONDS [NAME...]
#
# Each target runs SECONDS from its seeds (tests/fuzz/corpus/NAME, read only) with a working
# corpus in BUILD/corpus/NAME that later runs start from; an input that crashes it, leaks or
# times out (10 s) is written to BUILD/crashes/NAME/ and the run ends with status 1 after every
# target has run. A crash is replayed by running the binary on the file:
#   BUILD/bin/fuzz-NAME BUILD/crashes/NAME/crash-...
set -u
build=${1:?usage: fuzz.sh BUILD SECONDS [NAME...]}
secs=${2:?usage: fuzz.sh BUILD SECONDS [NAME...]}
shift 2
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
    for b in "$build"/bin/fuzz-*; do [ -x "$b" ] && names+=("${b##*/fuzz-}"); done
fi
[ ${#names[@]} -gt 0 ] || { echo "fuzz.sh: no fuzz-* binaries in $build/bin (make fuzz builds them)"; exit 2; }
here=$(cd "$(dirname "$0")/../.." && pwd)
# the targets' scratch files (a cache, a manifest) under the build directory, not /tmp
export KILN_FUZZ_TMP=$(cd "$build" && pwd)/tmp
mkdir -p "$KILN_FUZZ_TMP"
status=0
for n in "${names[@]}"; do
    bin=$build/bin/fuzz-$n
    [ -x "$bin" ] || { echo "fuzz.sh: no $bin"; status=2; continue; }
    mkdir -p "$build/corpus/$n" "$build/crashes/$n"
    seeds=$here/tests/fuzz/corpus/$n
    [ -d "$seeds" ] || seeds=
    echo "fuzz-$n: $secs s"
    # -close_fd_mask=2: the readers' own messages on stderr (bad input is expected) stay quiet;
    # libFuzzer's report of a crash still prints
    "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 -close_fd_mask=2 -print_final_stats=1 \
        -artifact_prefix="$build/crashes/$n/" "$build/corpus/$n" ${seeds:+"$seeds"} > "$build/fuzz-$n.log" 2>&1
    rc=$?
    grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|^#[0-9]+ +DONE" "$build/fuzz-$n.log" | tr '\n' ' '
    echo
    if [ $rc -ne 0 ]; then
        echo "fuzz-$n: FAILED (exit $rc); the input is in $build/crashes/$n/, the report in $build/fuzz-$n.log:"
        grep -E "ERROR|SUMMARY|fuzz_|runtime error" "$build/fuzz-$n.log" | head -8
        status=1
    fi
done
exit $status
