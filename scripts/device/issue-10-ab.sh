#!/bin/bash
# Issue 10 on the H100, one call: trains the Vulkan predictor (TRAIN_MIN), times whole-model predictions at HEAD
# and at the base tree in .gl/base (`git archive <commit> daemon client | tar -x -C .gl/base`) on that predictor,
# alternating (scripts/device/_predtime.py: each held-out variant from a fresh cost model, dispatch cache
# cleared, median of 5), then `inferd bench predictor` at HEAD (BENCH_MIN). Run from the repo root after
# `source .gl/run.sh`; about 9 minutes with the defaults. Results under $OUT/.
set -u
OUT=${OUT:-/tmp/out10ab}; mkdir -p "$OUT/results"
TRAIN_MIN=${TRAIN_MIN:-2.5}
BENCH_MIN=${BENCH_MIN:-3}
export INFERD_PREDICTOR_DIR="$OUT/predictor"; mkdir -p "$INFERD_PREDICTOR_DIR"
P="$INFERD_PREDICTOR_DIR/vulkan.ipred"
{ python3 -c "import os, platform; print(platform.node(), os.cpu_count(), 'loadavg', os.getloadavg())"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null; date -u; } > "$OUT/machine.txt"
timeout $(python3 -c "print(int($TRAIN_MIN * 60 + 60))") python3 -m inferd.cli predictor train --device vulkan \
  --minutes "$TRAIN_MIN" --out "$P" --quiet > "$OUT/train.log" 2>&1
echo "train rc=$?" >> "$OUT/train.log"
for r in 1 2; do
  for arm in base head; do
    PYTHONPATH=/tmp/pp/$arm timeout 100 python3 scripts/device/_predtime.py "$P" 40 > "$OUT/predtime_${arm}_$r.txt" 2>&1
    echo "$arm $r: $(head -1 "$OUT/predtime_${arm}_$r.txt")"
  done
done | tee "$OUT/predtime_summary.txt"
timeout $(python3 -c "print(int($BENCH_MIN * 60 + 60))") python3 -m inferd.cli bench predictor --device vulkan \
  --predictor "$P" --minutes "$BENCH_MIN" --tag "${TAG:-10_h100}" --out "$OUT/results" > "$OUT/bench.log" 2>&1
echo "bench rc=$?" >> "$OUT/bench.log"
date -u >> "$OUT/machine.txt"
tar -czf "$OUT/results.tgz" -C "$OUT" results && rm -rf "$OUT/results"
