#!/bin/bash
# Where a Vulkan cold load's time goes on the GPU machine (issue 8): per thread, the Python frames a sampler saw
# (sys._current_frames every 0.5 ms) and the main thread's cProfile of inferd.load up to the plan's start.
# Run from the repo root after `source .gl/run.sh`; prints only. Budget: < 3 minutes.
set -u
W=/tmp/dvc; rm -rf $W; mkdir -p $W
for M in squeezenet1_1 mobilenetv2; do
  python3 -c "
import onnx; from inferd.zoo import build
onnx.save(build('$M'), '$W/$M.onnx')"
  python3 -m inferd.cli compile $W/$M.onnx --out $W/$M.pkg --device vulkan > /dev/null 2>&1
  python3 scripts/device/_diag_sample.py $W/$M.pkg 4 > /dev/null 2>&1   # fills the pipeline and SPIR-V caches
  echo "=== $M"
  timeout 60 python3 scripts/device/_diag_sample.py $W/$M.pkg 4 2>&1 | grep -v "warm switch" | sed -n '/cold_ms/p;/== ours/,$p' | head -40
  timeout 60 python3 scripts/device/_setup_profile.py $W/$M.pkg 2>&1 | head -45
done
