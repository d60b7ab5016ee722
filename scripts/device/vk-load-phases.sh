#!/bin/bash
# Issue 8 on the GPU machine: where a Vulkan cold load's time goes (scripts/device/load-phases.py), never seen and
# registered, per model; then one cProfile'd registered load per model. Run from the repo root after
# `source .gl/run.sh`. Prints everything (no files).
set -u
[ "${VK_OK:-0}" = 1 ] || { echo "no Vulkan device: nothing run"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
MODELS=${MODELS:-squeezenet1_1,mobilenetv2,resnet18}
W=/tmp/vkphases; mkdir -p $W
python3 -c "from inferd import zoo; zoo.write_zoo('$W', '$MODELS'.split(','))" 2>&1 | tail -1
for m in ${MODELS//,/ }; do
  python3 -m inferd.cli compile $W/$m.onnx --device vulkan --out $W/$m.pkg 2>&1 | tail -1 | cut -c1-200
  # a first load fills the pipeline and driver caches and records the binds, as a daemon's earlier start had
  PRIME=1 python3 scripts/device/load-phases.py $W/$m.pkg vulkan never 2>&1 | head -1
done
for m in ${MODELS//,/ }; do
  for mode in never registered never registered; do python3 scripts/device/load-phases.py $W/$m.pkg vulkan $mode 2>&1 | tail -30; done
done
for m in ${MODELS//,/ }; do PROFILE=1 python3 scripts/device/load-phases.py $W/$m.pkg vulkan registered 2>&1 | tail -62; done
