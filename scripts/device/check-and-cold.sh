#!/bin/bash
# The Vulkan test files on a real GPU (the tree's correctness there, after CPU-side changes), then issue 8's
# Vulkan cold from the package (no ncnn; the reload arm included). Run from the repo root after
# `source .gl/run.sh`; writes $OUT/device_tests.log and $OUT/*cold_vulkan*. Budget: < 9 minutes as it is; with
# little device time left, MODELS=squeezenet1_1,mobilenetv2 TEST_TIMEOUT=200 BENCH_TIMEOUT=130: < 6 minutes.
set -u
OUT=${OUT:-/tmp/check-cold-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
t=$(date +%s)
timeout "${TEST_TIMEOUT:-230}" python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_vulkan_*.py tests/test_precision.py \
    tests/test_quant_vulkan.py tests/test_coexec.py tests/test_coexec_api.py > "$OUT/device_tests.log" 2>&1
echo "tests rc=$? in $(( $(date +%s) - t )) s"; tail -3 "$OUT/device_tests.log"; grep -E "^FAILED|^ERROR" "$OUT/device_tests.log" | head -20
timeout "${BENCH_TIMEOUT:-270}" python3 -m inferd.cli bench cold --device vulkan \
    --models "${MODELS:-squeezenet1_1,mobilenetv2,resnet50}" --repeat 3 --no-ncnn --no-plots --out "$OUT" \
    --tag "${TAG:-gpu}" --work /tmp/cw 2>&1 | tail -6
cat "$OUT"/*cold_vulkan*.md 2>/dev/null | grep -E "^\| " | head -20
