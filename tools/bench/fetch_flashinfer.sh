#!/bin/bash
# fetch_flashinfer.sh — run on a development machine (it has PyPI; the GPU machine has none):
# downloads FlashInfer and the pure-Python packages it imports that torch 2.11 does not bring,
# for CPython 3.12 on manylinux x86_64 (Ubuntu 24.04 on the GPU machine), into .whl/ (ignored
# by git), and prints the total size. tools/bench/referee.sh installs them there with
#   pip --no-index --no-deps --target .fi-site .whl/*.whl     (its `fi` stage)
#
# Size: the device tool carries ignored paths of at most 64 MiB in all. flashinfer-python
# 0.7.x is a 100 MB wheel (and imports cuda-python, cuda-tile, nccl4py, cutlass-dsl at import
# time), so the default is 0.6.0 (7.5 MB, same BatchDecode/BatchPrefill/cascade wrapper API);
# override with FLASHINFER_VERSION=... . The multi-GB flashinfer-jit-cache / -cubin wheels are
# never fetched: FlashInfer JIT-compiles its kernels with the GPU machine's nvcc.
#
# Packages, and why each (checked against 0.6.0's module-level imports):
#   flashinfer-python   the peer itself (py3-none-any, kernels as sources + JIT)
#   apache-tvm-ffi      flashinfer.jit's binding layer (binary wheel, cp312)
#   ninja               FlashInfer's JIT drives nvcc through ninja (binary wheel)
#   nvidia-ml-py        pynvml, imported by flashinfer.utils
#   requests (+ urllib3 idna charset-normalizer certifi)   flashinfer.artifacts
#   packaging einops tabulate click tqdm   small imports of the package and its CLI
# torch brings filelock, jinja2, typing-extensions and triton already.
set -eu
cd "$(dirname "$0")/../.."
VER=${FLASHINFER_VERSION:-0.6.0}
DEST=.whl
mkdir -p "$DEST"
PIP=${PIP:-pip}
common=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64
        --platform manylinux_2_17_x86_64 --platform any -d "$DEST")
pkgs=("flashinfer-python==$VER" "apache-tvm-ffi<0.2" ninja nvidia-ml-py requests urllib3 idna
      charset-normalizer certifi "packaging>=24.2" einops tabulate click tqdm)
for p in "${pkgs[@]}"; do
    "$PIP" download -q "${common[@]}" "$p" || { echo "fetch_flashinfer: $p failed" >&2; exit 1; }
done
ls "$DEST"/*.whl > /dev/null
echo "FlashInfer $VER wheels in $DEST/:"
ls -l "$DEST"/*.whl | awk '{printf "  %9.2f MiB  %s\n", $5 / 1048576, $9}'
total=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
mib=$(awk -v b="$total" 'BEGIN { printf "%.1f", b / 1048576 }')
echo "total: $mib MiB (device carry limit: 64 MiB for every carried ignored path together)"
if [ "$total" -gt $((48 << 20)) ]; then
    echo "fetch_flashinfer: WARNING: over 48 MiB; with build/ and .gpu/ it will not fit one carry" >&2
fi
