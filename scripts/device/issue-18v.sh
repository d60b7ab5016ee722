#!/bin/bash
# Issue 18 (helper 18v) on the GPU machine (after `bash .gl/run.sh` has set up PYTHONPATH and Vulkan): the Vulkan
# kernels added for the hot-path operators on a real driver, where the attention/Einsum lowering takes matmul.comp
# (shared-memory tiles) instead of lavapipe's matmul_reg.comp: each against the numpy oracle and onnxruntime, and the
# ONNX node tests of those ops run on the device. Finishes in a few minutes; results under $OUT/.
set -u
OUT=${OUT:-/tmp/issue-18v}; mkdir -p "$OUT"
K="groupnorm or rmsnorm or simplified or skip_ or layernorm or instancenorm or ms_ or mod_ or logic or trilu"
K="$K or depth or gridsample or cumsum or attention or mha or einsum or softmax or rotary or gather or transformer_block"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
python3 -m pytest -q -p no:cacheprovider tests/test_vulkan_ops.py -k "$K" > "$OUT/vulkan_ops.log" 2>&1
echo "vulkan_ops rc=$?" | tee -a "$OUT/vulkan_ops.log"; tail -3 "$OUT/vulkan_ops.log"
python3 -m pytest -q -s -p no:cacheprovider tests/test_onnx_backend.py -k on_vulkan > "$OUT/node_tests.log" 2>&1
echo "node_tests rc=$?" | tee -a "$OUT/node_tests.log"; grep "node tests on Vulkan" "$OUT/node_tests.log"; tail -3 "$OUT/node_tests.log"
python3 -m pytest -q -p no:cacheprovider tests/test_mixed_placement.py > "$OUT/mixed.log" 2>&1
echo "mixed rc=$?" | tee -a "$OUT/mixed.log"; tail -2 "$OUT/mixed.log"
