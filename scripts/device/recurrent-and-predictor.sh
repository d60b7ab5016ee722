#!/bin/bash
# Issues 13 and 10 in one device call: `inferd bench recurrent` (the recurrent zoo warm on this host's CPU and
# on the GPU, one VAD chunk through the daemon against a bare pyzmq echo, the client's spin on and off), then
# issue-10.sh (the Vulkan predictor trained here and benched on held-out variants, whole-model prediction time
# included). Run from the repo root after `source .gl/run.sh`; about 9 minutes with TRAIN_MIN=2.5 BENCH_MIN=3.
# Results: $OUT/results.tgz (the benches' md, json and plots) and the logs.
set -u
OUT=${OUT:-/tmp/out13}; mkdir -p "$OUT/results"
t0=$(date +%s)
timeout 120 python3 -m inferd.cli bench recurrent --out "$OUT/results" > "$OUT/recurrent.log" 2>&1
echo "recurrent rc=$? $(( $(date +%s) - t0 )) s" >> "$OUT/recurrent.log"
OUT="$OUT/p10" TRAIN_MIN=${TRAIN_MIN:-2.5} BENCH_MIN=${BENCH_MIN:-3} bash scripts/device/issue-10.sh
cp -r "$OUT/p10/results/." "$OUT/results/" 2>/dev/null
cp "$OUT"/p10/*.log "$OUT"/p10/machine.txt "$OUT/results/" 2>/dev/null
tar -czf "$OUT/results.tgz" -C "$OUT" results && rm -rf "$OUT/results" "$OUT/p10"
tail -2 "$OUT/recurrent.log"
