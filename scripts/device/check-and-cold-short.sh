#!/bin/bash
# A shorter check-and-cold.sh for a session with little device time left: the Vulkan test files, then issue 8's
# Vulkan cold from the package for squeezenet1_1 and mobilenetv2 (reload arm included; no ncnn). Run from the repo
# root after `source .gl/run.sh`; writes $OUT/device_tests.log and $OUT/*cold_vulkan*. Budget: < 6 minutes.
set -u
OUT=${OUT:-/tmp/check-cold-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
t=$(date +%s)
timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_vulkan_*.py tests/test_precision.py \
    tests/test_quant_vulkan.py tests/test_coexec.py tests/test_coexec_api.py > "$OUT/device_tests.log" 2>&1
echo "tests rc=$? in $(( $(date +%s) - t )) s"; tail -3 "$OUT/device_tests.log"; grep -E "^FAILED|^ERROR" "$OUT/device_tests.log" | head -20
timeout 130 python3 -m inferd.cli bench cold --device vulkan --models squeezenet1_1,mobilenetv2 --repeat 3 \
    --no-ncnn --no-plots --out "$OUT" --tag ${TAG:-gpu} --work /tmp/cw 2>&1 | tail -6
cat "$OUT"/*cold_vulkan*.md 2>/dev/null | grep -E "^\| " | head -20
