#!/bin/bash
# The Vulkan test files on the GPU, then issue 8's Vulkan cold from the package with the daemon's cold-load
# rehearsal (inferd.runtime.rehearsal) and without it, in one call. Run from the repo root after
# `source .gl/run.sh`; writes $OUT/device_tests.log and $OUT/*cold_vulkan*. About 8 minutes with the native build.
# SKIP_TESTS=1: the bench alone; ARMS="no-rehearse rehearse": the other order.
set -u
OUT=${OUT:-/tmp/rehearse-ab-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  t=$(date +%s)
  timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_vulkan_*.py \
      tests/test_precision.py tests/test_quant_vulkan.py tests/test_rehearsal.py > "$OUT/device_tests.log" 2>&1
  echo "tests rc=$? in $(( $(date +%s) - t )) s"; tail -3 "$OUT/device_tests.log"
  grep -E "^FAILED|^ERROR" "$OUT/device_tests.log" | head -20
fi
for arm in ${ARMS:-rehearse no-rehearse}; do
  extra=""; [ $arm = no-rehearse ] && extra="--no-rehearse"
  timeout "${BENCH_TIMEOUT:-150}" python3 -m inferd.cli bench cold --device vulkan $extra \
      --models "${MODELS:-squeezenet1_1,mobilenetv2,resnet50}" --repeat 3 --no-ncnn --no-plots --no-refined --no-reload \
      --out "$OUT" --tag "h100_$arm" --work /tmp/cw 2>&1 | tail -2
  grep -E "^\| " "$OUT"/*cold_vulkan_h100_$arm.md 2>/dev/null | head -6
done
