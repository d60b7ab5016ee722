#!/bin/bash
# Issue 8 on the GPU machine: Vulkan cold from the package in variants of this tree, alternating while time is left:
# VARIANTS is a list of NAME:ENV:LOADERS (ENV a comma-separated list of VAR=value or "-", LOADERS a number or "-").
# Run from the repo root after `source .gl/run.sh`; results under $RES. Budget: DEADLINE seconds (default 420).
set -u
[ "${VK_OK:-0}" = 1 ] || { echo "no Vulkan device: nothing run"; exit 1; }
RES=${RES:-/tmp/vkvar}; mkdir -p "$RES"
# the device brings back at most 8 files of $OUT: every result goes into one tarball there, rewritten after each run
pack() { [ -n "${OUT:-}" ] && tar czf "$OUT/.results.tgz" -C "$RES" . && mv "$OUT/.results.tgz" "$OUT/results.tgz"; }
MODELS=${MODELS:-squeezenet1_1,mobilenetv2}
VARIANTS=${VARIANTS:-"default:-:- one:-:1"}
end=$(( $(date +%s) + ${DEADLINE:-420} ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o "H[0-9][0-9]*" | head -1 | tr A-Z a-z); gpu=${gpu:-gpu}
round=1
while [ $(( end - $(date +%s) )) -gt 200 ]; do
  for v in $VARIANTS; do
    IFS=: read -r name envs loaders <<< "$v"
    extra=(); [ "$loaders" = "-" ] || extra=(--loaders "$loaders")
    e=(); [ "$envs" = "-" ] || IFS=, read -r -a e <<< "$envs"
    env "${e[@]}" timeout 150 python3 -m inferd.cli bench cold --device vulkan --models "$MODELS" --repeat 3 --no-ncnn \
      --no-refined --no-reload --no-plots "${extra[@]}" --out "$RES" --tag "${gpu}_${name}_$round" --work "/tmp/cw_$name" 2>&1 | tail -1
    pack  # after every run: a call cut at its limit still brings back what ran
  done
  round=$(( round + 1 ))
done
for f in "$RES"/*.md; do echo "== $f"; grep -E "^\| (squeezenet1_1|mobilenetv2|resnet50) " "$f" | sed -n '2p;4p' | cut -c1-200; done
