#!/bin/bash
# Issue 8 on the GPU machine: Vulkan cold with the model's pipelines resident (as a daemon makes them at its
# start) and without, in one bench run, with ncnn's default options (fp16) and fp32 beside them, caches primed and
# (--first-start) empty, for squeezenet1_1 (ncnn's conversion comes converted in .gl/cw, made here by pnnx: the
# device lacks it, and the carried tree may not exceed 64 MiB); mobilenetv2 and resnet50 without ncnn; then,
# while time is left (LOADERS1=0: not), squeezenet1_1 and mobilenetv2 planned for one loader thread.
# Run from the repo root after `source .gl/run.sh`; results under $RES. Budget: DEADLINE seconds (default 480).
set -u
[ "${VK_OK:-0}" = 1 ] || { echo "no Vulkan device: nothing run"; exit 1; }
RES=${RES:-/tmp/vkres}; mkdir -p "$RES"
export INFERD_PNNX=/bin/true   # conversions are reused from .gl/cw; none is made here
end=$(( $(date +%s) + ${DEADLINE:-480} ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout $(( end - $(date +%s) - 200 )) python3 -m inferd.cli bench cold --device vulkan --models squeezenet1_1 \
  --repeat 3 --first-start --no-refined --no-plots --work "$PWD/.gl/cw" --out "$RES" --tag h200 2>&1 | tail -4
left=$(( end - $(date +%s) ))
if [ $left -gt 60 ]; then
  timeout $(( left - 10 )) python3 -m inferd.cli bench cold --device vulkan --models mobilenetv2,resnet50 --repeat 3 --no-ncnn \
    --no-refined --no-plots --work /tmp/cw50 --out "$RES" --tag h200_more 2>&1 | tail -3
fi
left=$(( end - $(date +%s) ))
if [ $left -gt 100 ] && [ "${LOADERS1:-1}" = 1 ]; then  # one loader thread against the plan's two (GPU_LOADERS)
  timeout $(( left - 10 )) python3 -m inferd.cli bench cold --device vulkan --models squeezenet1_1,mobilenetv2 --repeat 3 \
    --no-ncnn --no-refined --no-plots --loaders 1 --work /tmp/cw1 --out "$RES" --tag h200_loaders1 2>&1 | tail -3
fi
for f in "$RES"/*.md; do echo "== $f"; grep -A6 "^| model | inferd cold ms | ncnn fp16" "$f" | cut -c1-400; done
