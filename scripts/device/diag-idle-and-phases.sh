#!/bin/bash
# Issues 13 and 8 on the GPU machine: which threads burn CPU while a process that ran Vulkan models is idle
# (_vk_idle_threads.py); the VAD chunk's daemon round trip from a bench process with and without the GPU models
# loaded before it (`inferd bench recurrent --models vad_lstm`, --no-vulkan); the Vulkan cold phase split of
# squeezenet1_1 with the device pool (as vk-devpool.sh). Run from the repo root after `source .gl/run.sh`.
set -u
[ "${VK_OK:-0}" = 1 ] || { echo "no Vulkan device: nothing run"; exit 1; }
OUT=${OUT:-/tmp/outdiag}; mkdir -p "$OUT"
timeout 120 python3 scripts/device/_vk_idle_threads.py 2>&1 | tail -12
for v in cpu vk cpu vk; do
  a=""; [ $v = cpu ] && a=--no-vulkan
  rm -rf "$OUT/r"; timeout 150 python3 -m inferd.cli bench recurrent --models vad_lstm $a --out "$OUT/r" > "$OUT/r$v.log" 2>&1
  echo "== recurrent, GPU models loaded first: $v"
  grep -h "daemon round trip\|spin_us = 500" "$OUT"/r/*.md | cut -c1-260
done
python3 -c "from inferd.zoo import write_zoo; write_zoo('/tmp/dz', ['squeezenet1_1'])"
python3 -m inferd.cli compile /tmp/dz/squeezenet1_1.onnx --device vulkan --out /tmp/dp/squeezenet1_1 > /dev/null 2>&1
(cd scripts/device && DEVICE_POOL_MB=64 timeout 120 python3 _vk_cold_phases.py /tmp/dp/squeezenet1_1 5 2>&1 | cut -c1-220)
