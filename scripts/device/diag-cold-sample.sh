#!/bin/bash
set -e
W=/tmp/dcp4; rm -rf $W; mkdir -p $W
python3 -c "
import onnx; from inferd.zoo import build
onnx.save(build('mobilenetv2'), '$W/mobilenetv2.onnx')"
python3 -m inferd.cli compile $W/mobilenetv2.onnx --out $W/mobilenetv2.pkg --device vulkan > /dev/null
python3 scripts/device/_diag_sample.py $W/mobilenetv2.pkg 16 > /dev/null 2>&1
for L in 16 4; do
  timeout 60 python3 scripts/device/_diag_sample.py $W/mobilenetv2.pkg $L 2>&1 | grep -v "warm switch" | sed -n '/cold_ms/p;/== ours/,$p' | grep -v 'loader .*scheduler.py:_worker:2..$' | head -45
done
