#!/bin/bash
# Issues 13 and 10 in one device call: _echo_after_gpu.py (does a process that used the GPU do a pyzmq round trip
# slower, and what did the driver change in it) with the model on the GPU, on the CPU and none, then issue-10.sh
# (the Vulkan predictor trained here and benched on held-out variants). Run from the repo root after
# `source .gl/run.sh`; about 8 minutes with TRAIN_MIN=2.5 BENCH_MIN=3. Results: $OUT/results.tgz and the logs.
set -u
OUT=${OUT:-/tmp/oute}; mkdir -p "$OUT/results"
python3 -c "from inferd.zoo import write_zoo; write_zoo('/tmp/ez', ['squeezenet1_1'])" > /dev/null 2>&1
for mode in vulkan none cpu vulkan; do
  echo "== $mode" >> "$OUT/results/echo.log"
  timeout 90 python3 scripts/device/_echo_after_gpu.py $mode /tmp/ez/squeezenet1_1.onnx >> "$OUT/results/echo.log" 2>&1
done
OUT="$OUT/p10" TRAIN_MIN=${TRAIN_MIN:-2.5} BENCH_MIN=${BENCH_MIN:-3} bash scripts/device/issue-10.sh
cp -r "$OUT/p10/results/." "$OUT/results/" 2>/dev/null
cp "$OUT"/p10/*.log "$OUT"/p10/machine.txt "$OUT"/p10/predictor_show.json "$OUT/results/" 2>/dev/null
tar -czf "$OUT/results.tgz" -C "$OUT" results && rm -rf "$OUT/p10"
cut -c1-400 "$OUT/results/echo.log"
