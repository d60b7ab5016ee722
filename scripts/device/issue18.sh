#!/bin/bash
# Issue 18 on the GPU machine (after `bash .gl/run.sh` has set up PYTHONPATH and Vulkan): mixed placement on a
# real driver (nodes without a Vulkan kernel on the CPU between GPU segments, host-visible activations through
# resizable BAR), the data-dependent ops, and the detection nodes vs onnxruntime on that machine's CPU.
# Finishes in well under 4 minutes; results under $OUT/.
set -u
OUT=${OUT:-/tmp/issue18}; mkdir -p "$OUT"
python3 -m pytest -q -p no:cacheprovider tests/test_mixed_placement.py tests/test_datadep.py tests/test_ops_contrib.py \
  > "$OUT/issue18_tests.log" 2>&1; echo "tests rc=$?" | tee -a "$OUT/issue18_tests.log"
tail -3 "$OUT/issue18_tests.log"
timeout 150 python3 -m inferd.cli bench ops --repeat 60 --out "$OUT" 2>&1 | tail -12
