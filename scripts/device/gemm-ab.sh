#!/bin/bash
# A/B of two builds of the native GEMM on linear-layer shapes (x @ W + b, W prepacked), beside onnxruntime's Gemm
# in the same process: copy the two builds' _native.abi3.so (stripped: strip --strip-debug) and a cffi wheel for
# the machine's Python under .dev/ (git-ignored; carry it), then `bash scripts/device/gemm-ab.sh`. Prints per
# build, ISA level (1 AVX2, 2 AVX-512) and shape the GFLOP/s of both; tables under $OUT.
set -u
OUT=${OUT:-/tmp/gemm-ab}; mkdir -p "$OUT"
D=.dev
if ls $D/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $D/whl/*.whl && export PYTHONPATH=/tmp/site
fi
lscpu | grep -E "Model name|^CPU\(s\)|L1d|L2" ; grep -o -E "avx512f|avx2" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
export ROUNDS=${ROUNDS:-2} NRUN=${NRUN:-150}
for r in 1 2; do for v in old new; do for l in 1 2; do
  taskset -c 2,3 python3 scripts/device/_gemm_ab.py $D/nat_$v.so $l 2
done; done; done 2>&1 | tee "$OUT/gemm_th2.txt"
