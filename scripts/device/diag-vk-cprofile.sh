#!/bin/bash
# cProfile of a Vulkan cold load's setup and of its layers' prepare (issue 8). Run after .gl/run.sh.
set -e
W=/tmp/vkcp; mkdir -p $W
for M in ${MODELS:-squeezenet1_1 mobilenetv2}; do
  if [ ! -d $W/$M.pkg ]; then
    python3 -c "import onnx; from inferd.zoo import build; onnx.save(build('$M'), '$W/$M.onnx')"
    python3 -m inferd.cli compile $W/$M.onnx --out $W/$M.pkg --device vulkan > /dev/null
  fi
  echo "=== $M"
  timeout 120 python3 scripts/device/_vk_cold_cprofile.py $W/$M.pkg 2>&1 | grep -v "warm switch" \
    | sed 's#/tmp/pp/head/inferd/##; s#/usr/local/lib/python3[0-9.]*/dist-packages/##' | cut -c1-150
done
