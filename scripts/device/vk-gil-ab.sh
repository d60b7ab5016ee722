#!/bin/bash
# The executor's Vulkan calls with the GIL held (issue 8): Vulkan cold from the package, base tree against head
# (vk-cold-ab.sh), then a small resident model's warm run with a spinning Python thread, base and head, twice.
# Run from the repo root after `source .gl/run.sh`. Results under $RES.
set -u
RES=${RES:-/tmp/vkgil}; mkdir -p "$RES"
RES=$RES DEADLINE=${DEADLINE:-400} bash scripts/device/vk-cold-ab.sh
for r in 1 2; do
  for tree in base head; do
    echo "== warm, $tree $r"
    PYTHONPATH=/tmp/pp/$tree timeout 60 python3 scripts/device/_vk_warm_gil.py 2>&1 | grep -v WARN | tail -2
  done
done | tee "$RES/warm_gil.txt"
