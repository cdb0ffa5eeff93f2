#!/bin/sh
# demo.sh — the tour `make demo` runs: `kiln info`; warm docs/demo.manifest into the default
# cache ($KILN_CACHE_DIR, else ~/.cache/kiln) for the GPU's arch, or for sm_90a,sm_80 when
# there is no GPU; `kiln ls`; and, only with a GPU, `kiln check` of every manifest line at a
# couple of kv lengths. Every step runs even after a failure; the exit status is non-zero if
# any step failed.
#
# usage: tools/scripts/demo.sh [path/to/kiln]      (default: build/bin/kiln)
set -uf

KILN=${1:-build/bin/kiln}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MANIFEST=$ROOT/docs/demo.manifest
KV_LENS=577,4096
failed=0

# Run one kiln command, echoing it first; remember a failure and go on.
step() {
    printf '\n$ kiln %s\n' "$*"
    "$KILN" "$@"
    rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "demo: 'kiln $*' failed (exit $rc)" >&2
        failed=1
    fi
}

if [ ! -x "$KILN" ]; then
    echo "demo: $KILN is not an executable (run make first)" >&2
    exit 2
fi

step info
gpus=$("$KILN" info --gpu-count 2>/dev/null) || gpus=0

if [ "${gpus:-0}" -gt 0 ]; then
    echo "demo: $gpus GPU(s): warming for the GPU's own arch"
    step warm "$MANIFEST"
else
    echo "demo: no GPU: warming for sm_90a and sm_80 (compile-only); the checks are skipped"
    step warm --arch sm_90a,sm_80 "$MANIFEST"
fi

step ls

if [ "${gpus:-0}" -gt 0 ]; then
    # One check per manifest line: comments and blank lines dropped, the spec one argument.
    specs=$(sed -e 's/#.*//' -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' -e '/^$/d' "$MANIFEST")
    old_ifs=$IFS
    IFS='
'
    for spec in $specs; do
        IFS=$old_ifs
        case "$spec" in
        *op=merge*) step check "$spec" ;;
        *kv=paged* | *kv=ragged*)
            # a batch of 17 requests of random lengths (some empty); pages of 16 when paged;
            # prefill rows per request at random, decode one row each
            opts="--batch 17 --kv-dist uniform:0:2048"
            case "$spec" in *kv=paged*) opts="$opts --page-size 16" ;; esac
            case "$spec" in *op=prefill*) opts="$opts --qo-dist uniform:0:300" ;; esac
            # shellcheck disable=SC2086 # $opts is a list of words
            step check "$spec" $opts ;;
        *) step check "$spec" --kv-len "$KV_LENS" ;;
        esac
    done
    IFS=$old_ifs
fi

if [ "$failed" -ne 0 ]; then
    echo "demo: some steps failed" >&2
    exit 1
fi
echo
echo "demo: all steps passed"
