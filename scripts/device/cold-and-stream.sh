#!/bin/bash
# Issue 8 (Vulkan cold from the package, filled and empty caches) and issue 13 (the recurrent zoo on Vulkan and
# one VAD chunk through the daemon on this host's CPU) on the GPU machine. Run from the repo root after
# `source .gl/run.sh`; writes $OUT/*cold_vulkan*, $OUT/*recurrent*. Budget: < 9 minutes.
set -u
OUT=${OUT:-/tmp/cold-stream-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 330 python3 -m inferd.cli bench cold --device vulkan --models squeezenet1_1,mobilenetv2,resnet50 --repeat 3 \
    --no-ncnn --first-start --out "$OUT" --tag h200 --work /tmp/cw 2>&1 | tail -12
timeout 170 python3 -m inferd.cli bench recurrent --out "$OUT" 2>&1 | tail -4
cat "$OUT"/*.md 2>/dev/null | grep -E "^\| |^- " | head -60
