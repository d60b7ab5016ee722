#!/bin/bash
# A/B of the Vulkan streaming runtime's fence watcher on one GPU host: `inferd bench memory --device vulkan` with
# VulkanStreamingExecutor.watch_fences False (the host polls) then True, alternating ROUNDS times. Run from the repo
# root after `source .gl/run.sh`; writes $OUT/*memory_vulkan_{poll,watch}_r*.
set -u
OUT=${OUT:-/tmp/watch-ab-out}; mkdir -p "$OUT"
for r in $(seq 1 "${ROUNDS:-1}"); do
  for arm in poll watch; do
    w=$([ "$arm" = watch ] && echo True || echo False)
    timeout "${BENCH_TIMEOUT:-120}" python3 -c "
import sys
import inferd.vulkan.stream as s
s.VulkanStreamingExecutor.watch_fences = $w
from inferd.bench.memory_bench import main
sys.exit(main(sys.argv[1:]))" --device vulkan --models "${MODELS:-mobilenetv2,resnet50}" --points "${POINTS:-4}" \
        --repeat 5 --no-ncnn --out "$OUT" --tag "memory_vulkan_${arm}_r$r" --work /tmp/mw > "$OUT/$arm-r$r.log" 2>&1
    echo "$arm r$r rc=$?"
  done
done
