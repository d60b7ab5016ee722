#!/bin/bash
# Issue 9's Vulkan half on a real GPU: the streaming test file (every zoo model inside budgets against
# onnxruntime, budget changes under load, fallback and slicing, the daemon), then `inferd bench memory --device
# vulkan` (no ncnn: the device image has none). Run from the repo root after `source .gl/run.sh`; writes
# $OUT/stream_tests.log and $OUT/*memory_vulkan*. Budget: TEST_TIMEOUT + BENCH_TIMEOUT (default 200 + 330 s).
set -u
OUT=${OUT:-/tmp/stream-vk-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
t=$(date +%s)
timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_stream_vulkan.py \
    > "$OUT/stream_tests.log" 2>&1
echo "tests rc=$? in $(( $(date +%s) - t )) s"; tail -3 "$OUT/stream_tests.log"; grep -E "^FAILED|^ERROR" "$OUT/stream_tests.log" | head -20
timeout "${BENCH_TIMEOUT:-330}" python3 -m inferd.cli bench memory --device vulkan \
    --models "${MODELS:-resnet50,mobilenetv2,vit_tiny}" --points "${POINTS:-6}" --repeat 5 --no-ncnn \
    --out "$OUT" --tag "${TAG:-memory_vulkan_gpu}" --work /tmp/mw 2>&1 | tail -4
grep -E "^## |^preloading|^weights" "$OUT"/*memory_vulkan*.md 2>/dev/null | head -20
