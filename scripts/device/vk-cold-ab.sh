#!/bin/bash
# Issue 8 on the GPU machine: Vulkan cold from the package, this tree (head) against a baseline tree (.gl/base,
# `git archive <commit> daemon client`, sharing head's native build), alternating base/head while time is left.
# Run from the repo root after `source .gl/run.sh` (scripts/device/make-gl.sh builds .gl); results under $RES. Budget: DEADLINE seconds (default 420).
set -u
[ "${VK_OK:-0}" = 1 ] || { echo "no Vulkan device: nothing run"; exit 1; }
RES=${RES:-/tmp/vkab}; mkdir -p "$RES"
# the device brings back at most 8 files of $OUT: every result goes into one tarball there, rewritten after each run
pack() { [ -n "${OUT:-}" ] && tar czf "$OUT/.results.tgz" -C "$RES" . && mv "$OUT/.results.tgz" "$OUT/results.tgz"; }
MODELS=${MODELS:-squeezenet1_1,mobilenetv2}
end=$(( $(date +%s) + ${DEADLINE:-420} ))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# the tag names the card that ran (a call for an H200 may get an H100)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o "H[0-9][0-9]*" | head -1 | tr A-Z a-z); gpu=${gpu:-gpu}
round=1
while [ $(( end - $(date +%s) )) -gt 200 ]; do
  for tree in base head; do
    PYTHONPATH=/tmp/pp/$tree timeout 150 python3 -m inferd.cli bench cold --device vulkan --models "$MODELS" \
      --repeat 3 --no-ncnn --no-refined --no-plots ${EXTRA:-} --out "$RES" --tag "${gpu}_${tree}_$round" --work "/tmp/cw_$tree" 2>&1 | tail -2
    pack  # after every run: a call cut at its limit still brings back what ran
    if grep -q "n/a (n/a-n/a)" "$RES"/*"${gpu}_${tree}_$round.md"; then
      grep -A3 "^Notes" "$RES"/*"${gpu}_${tree}_$round.md" | cut -c1-400; exit 1
    fi
  done
  round=$(( round + 1 ))
done
for f in "$RES"/*.md; do echo "== $f"; grep -E "^\| (squeezenet1_1|mobilenetv2|resnet50) " "$f" | head -4; done
