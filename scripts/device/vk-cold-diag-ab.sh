#!/bin/bash
# Vulkan cold loads of small models from their packages in a daemon's state (_vk_cold_prof.py, no sampling),
# this tree (head) against a baseline (.gl/base: made here from .gl/base.patch, the diff head -> base, when absent),
# alternating per round (ARMS: trees or tree:variant, default "base head"): cold ms and the backend's counters
# (upload_s: the loaders' copies into device memory).
# Run after .gl/run.sh. ROUNDS alternations of LOADS loads each (the first load of each is left out).
set -u
W=/tmp/vkcp; mkdir -p $W
if [ ! -f .gl/base/daemon/__init__.py ] && [ -f .gl/base.patch ]; then  # (gl-run.sh leaves the native build there)
  mkdir -p .gl/base && cp -r daemon client .gl/base/ && (cd .gl/base && patch -s -p1 -R < ../base.patch) || exit 2
fi
for M in ${MODELS:-squeezenet1_1 mobilenetv2}; do
  if [ ! -d $W/$M.pkg ]; then
    python3 -c "import onnx; from inferd.zoo import build; onnx.save(build('$M'), '$W/$M.onnx')"
    python3 -m inferd.cli compile $W/$M.onnx --out $W/$M.pkg --device vulkan > /dev/null
  fi
done
for r in $(seq 1 ${ROUNDS:-3}); do
  for arm in ${ARMS:-base head}; do  # an arm: a tree, or tree:VARIANT (_vk_cold_prof.py's)
    tree=${arm%%:*}; variant=${arm#*:}; [ "$variant" = "$arm" ] && variant=
    for M in ${MODELS:-squeezenet1_1 mobilenetv2}; do
      PYTHONPATH=/tmp/pp/$tree VARIANT=$variant SAMPLE=0 SUMMARY=1 timeout 120 python3 scripts/device/_vk_cold_prof.py \
        $W/$M.pkg ${LOADS:-4} > /tmp/vkab_run.log 2>&1 || { echo "$M $arm failed:"; tail -3 /tmp/vkab_run.log; }
      grep "^SUMMARY" /tmp/vkab_run.log | sed "s/^SUMMARY/$M $arm/"
    done
  done
done
