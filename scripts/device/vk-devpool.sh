#!/bin/bash
# Issue 8 on the GPU machine: a Vulkan cold load's steps with and without the device pool (DEVICE_POOL_MB 0 / 64,
# alternating process by process, ROUNDS times), squeezenet1_1 and mobilenetv2 packages compiled here. Run from
# the repo root after `source .gl/run.sh`; raw output on stdout.
set -u
[ "${VK_OK:-0}" = 1 ] || { echo "no Vulkan device: nothing run"; exit 1; }
python3 -c "from inferd.zoo import write_zoo; write_zoo('/tmp/dz', ['squeezenet1_1', 'mobilenetv2'])"
for m in squeezenet1_1 mobilenetv2; do
  python3 -m inferd.cli compile /tmp/dz/$m.onnx --device vulkan --out /tmp/dp/$m > /dev/null 2>&1
done
for round in $(seq 1 "${ROUNDS:-2}"); do
  for m in squeezenet1_1 mobilenetv2; do
    for pool in 0 64; do
      echo "=== $m pool $pool round $round"
      DEVICE_POOL_MB=$pool python3 scripts/device/_vk_cold_phases.py /tmp/dp/$m 5 2>&1 | cut -c1-200
    done
  done
done
