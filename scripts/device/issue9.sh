#!/usr/bin/env bash
# Issue 9 (memory budget), second pass: `inferd bench memory` on the GPU machine's CPU, a quiet host, where the
# latency goals (<= 1.15 x max(warm, read time), below on-demand) can be judged without the 2-core VM's shared
# load (piecewise loads, compute-thread reads, joined preadv since the first pass); then the device memory budget
# on the real GPU: what the device reports (the default budget) and tests/test_device_budget.py (Vulkan-placed
# models kept inside their own budget, LRU, pinned, busy, UNAVAILABLE with the minimum device budget).
# Run from the repo root after `bash .gl/run.sh` has set PYTHONPATH; writes under $OUT/; < 6 minutes.
set -u
OUT=${OUT:-/tmp/issue9-out}
mkdir -p "$OUT"
python3 -c "import os, platform; print(platform.node(), os.cpu_count(), os.getloadavg())" > "$OUT/issue9_machine.txt"
timeout 200 python3 -m inferd.cli bench memory --models resnet50,mobilenetv2 --points 8 --repeat 7 \
    --no-ncnn --no-daemon --out "$OUT" --tag memory_cpu_gpuhost_9 || echo "bench: exit $?" >> "$OUT/issue9_machine.txt"
timeout 30 python3 -c "
from inferd.vulkan.device import VulkanDevice, VulkanConfig
d = VulkanDevice(VulkanConfig.from_env(None)); print('device memory report', d.memory_report(), d._heaps, d._heap_local); d.close()
" >> "$OUT/issue9_machine.txt" 2>&1
timeout 120 python3 -m pytest -q tests/test_device_budget.py > "$OUT/issue9_device_budget_tests.txt" 2>&1 \
    || echo "device budget tests: exit $?" >> "$OUT/issue9_machine.txt"
ls -l "$OUT" >> "$OUT/issue9_machine.txt"
