#!/bin/bash
# Issue 10: the latency predictor on the H100 (Vulkan). Trains the Vulkan predictor on this machine, then runs
# `inferd bench predictor --device vulkan` on held-out variants (whole-model warm within +-10% for >= 95%;
# cold phases within +-20% for >= 90% of units; one whole-model prediction <= 5 ms; training <= 20 min) and
# the predictor tests (the Vulkan one included). Run from the repo root after `bash .gl/run.sh` (inferd
# importable); about 9 minutes with the defaults (one device command may run 10); results under $OUT/
# (results/: the bench's md, json and 7 plots).
# TRAIN_MIN / BENCH_MIN change the budgets (e.g. TRAIN_MIN=15 in a run of its own to judge the 20-min goal).
# A training longer than one call allows beside the bench: SKIP_BENCH=1 in one call (the predictor comes back as
# $OUT/predictor/vulkan.ipred), then PRED=<that file, carried> in the next, which benches it without training.
set -u
OUT=${OUT:-/tmp/out10}; mkdir -p "$OUT/results"
TRAIN_MIN=${TRAIN_MIN:-3.5}
BENCH_MIN=${BENCH_MIN:-3.5}
export INFERD_PREDICTOR_DIR="$OUT/predictor"   # not the user's cache: this run's predictor only
mkdir -p "$INFERD_PREDICTOR_DIR"
{ python3 -c "import os, platform; print(platform.node(), os.cpu_count(), 'loadavg', os.getloadavg())"
  nvidia-smi --query-gpu=name,driver_version,utilization.gpu --format=csv,noheader 2>/dev/null; date -u; } \
  > "$OUT/machine.txt"
if [ -n "${PRED:-}" ]; then
  cp "$PRED" "$INFERD_PREDICTOR_DIR/vulkan.ipred" && echo "trained in an earlier call: $PRED" > "$OUT/train.log"
else
  timeout $(python3 -c "print(int($TRAIN_MIN * 60 + 60))") python3 -m inferd.cli predictor train --device vulkan \
    --minutes "$TRAIN_MIN" --out "$INFERD_PREDICTOR_DIR/vulkan.ipred" --quiet > "$OUT/train.log" 2>&1
  echo "train rc=$? loadavg $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/train.log"
fi
if [ -n "${SKIP_BENCH:-}" ]; then
  python3 -m inferd.cli predictor show "$INFERD_PREDICTOR_DIR/vulkan.ipred" --device vulkan > "$OUT/predictor_show.json" 2>&1
  tail -n 3 "$OUT"/*.log; exit 0
fi
timeout $(python3 -c "print(int($BENCH_MIN * 60 + 60))") python3 -m inferd.cli bench predictor --device vulkan \
  --predictor "$INFERD_PREDICTOR_DIR/vulkan.ipred" --minutes "$BENCH_MIN" --tag "${TAG:-10_$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr " " "_" | tr -cd "[:alnum:]_" | cut -c1-24)}" --out "$OUT/results" \
  > "$OUT/bench.log" 2>&1
echo "bench rc=$? loadavg $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/bench.log"
# the predictor tests last, in what time is left (the Vulkan one measures a model on this GPU)
timeout 45 python3 -m pytest -q -x -p no:cacheprovider tests/test_predictor.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?" >> "$OUT/tests.log"
python3 -m inferd.cli predictor show "$INFERD_PREDICTOR_DIR/vulkan.ipred" --device vulkan > "$OUT/predictor_show.json" 2>&1
date -u >> "$OUT/machine.txt"
tar -czf "$OUT/results.tgz" -C "$OUT" results && rm -rf "$OUT/results"  # one file back: a call returns at most 8
tail -n 3 "$OUT"/*.log
