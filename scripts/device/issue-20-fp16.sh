#!/bin/bash
# Issue 20 (fp16 half) on the H100: resnet50 and vgg16, inferd fp32 vs inferd fp16 vs ncnn with its default
# fp16 options (warm, cold from the package, stored/resident bytes, error). Run from the repo root after
# `bash .gl/run.sh`; writes $OUT/precision_*.json|md (one pair per model) and $OUT/features.txt.
# Budget: < 4 minutes (each model bounded separately so one slow conversion cannot eat the other's time).
set -u
OUT=${OUT:-/tmp/issue20-out}; mkdir -p "$OUT"
W=/tmp/issue20-work; rm -rf "$W"; mkdir -p "$W"
python3 - > "$OUT/features.txt" 2>&1 <<'PY'
import logging; logging.basicConfig(level=logging.INFO)
from inferd.vulkan.device import get_device
from inferd.planner.precision import plan_precision
d = get_device()
print(d.name, d.features)
print(plan_precision("auto", "vulkan", d.features).summary())
PY
cat "$OUT/features.txt" | tail -2
# arms: fp32, fp16 (fp16 weights + fp16 tile sums: shaderFloat16), fp16w (fp16 weights, fp32 arithmetic; resnet50
# only, for time)
# resnet50: ~1 min; vgg16 (550 MB of weights, pnnx conversion included): ~2 min
timeout 95 python3 -m inferd.cli bench precision --device vulkan --models resnet50 --arms fp32,fp16,fp16w --warm 30 --rounds 2 \
    --out "$OUT" --tag ${TAG:-h100}_resnet50 --work "$W/r50" 2>&1 | tail -4
timeout ${VGG_T:-135} python3 -m inferd.cli bench precision --device vulkan --models vgg16 --arms ${VGG_ARMS:-fp32,fp16} --warm 20 --rounds 1 \
    --out "$OUT" --tag ${TAG:-h100}_vgg16 --work "$W/vgg" 2>&1 | tail -4
cat "$OUT"/*precision_${TAG:-h100}_*.md 2>/dev/null | grep "^|"
rm -rf "$W"
