#!/bin/bash
# Issue 8 on the GPU machine: where the host time of a Vulkan cold load goes (scripts/device/_vk_host_prof.py),
# for squeezenet1_1 and mobilenetv2 packages compiled here. Run from the repo root after `source .gl/run.sh`.
set -u
[ "${VK_OK:-0}" = 1 ] || { echo "no Vulkan device: nothing run"; exit 1; }
lscpu | grep -E "Model name|^CPU\(s\)|MHz" | head -4
python3 -c "from inferd.zoo import write_zoo; write_zoo('/tmp/dz', ['squeezenet1_1', 'mobilenetv2'])"
for m in squeezenet1_1 mobilenetv2; do
  python3 -m inferd.cli compile /tmp/dz/$m.onnx --device vulkan --out /tmp/dp/$m > /dev/null 2>&1
  echo "=== $m"; python3 scripts/device/_vk_host_prof.py /tmp/dp/$m 5 2>&1 | cut -c1-160
done
