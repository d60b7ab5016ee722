#!/bin/bash
# Where a small model's Vulkan cold load spends its time (issue 8): the host-side micro-measures
# (_vk_upload_micro.py), then per model a sampling profile per thread of cold loads from its package in a
# daemon's state, at each loader count of LOADER_COUNTS. Run after .gl/run.sh.
set -e
W=/tmp/vkcp; rm -rf $W; mkdir -p $W
timeout 60 python3 scripts/device/_vk_upload_micro.py 2>&1 | tail -30
for M in ${MODELS:-squeezenet1_1 mobilenetv2}; do
  python3 -c "import onnx; from inferd.zoo import build; onnx.save(build('$M'), '$W/$M.onnx')"
  python3 -m inferd.cli compile $W/$M.onnx --out $W/$M.pkg --device vulkan > /dev/null
  for L in ${LOADER_COUNTS:-default}; do
    echo "=== $M loaders $L"
    [ "$L" = default ] && L=
    LOADERS=$L timeout 120 python3 scripts/device/_vk_cold_prof.py $W/$M.pkg ${ROUNDS:-3} 2>&1 | grep -v "warm switch" \
      | grep -v "^  *[0-9]* inferd-io"
  done
done
