#!/bin/bash
# Build the .gl bundle (ignored by git) that a lent GPU machine is set up from: the Vulkan loader and the GLVND
# libraries NVIDIA's ICD needs (without libglvnd0/libglx0 the loader finds libGLX_nvidia.so.0 but cannot get its
# vkCreateInstance: VkErrorIncompatibleDriver), glslangValidator, the wheels the device image lacks (for its
# Python 3.12), the set-up script, and optionally a baseline tree for A/B runs (BASE=<commit>).
# Run from the repo root on this machine (after a build of the native extension here); then pass carry=[".gl"]
# and begin the command with `source .gl/run.sh`.
set -eu
mkdir -p .gl/bin .gl/wheels /tmp/amd64/partial
o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
apt-get $o update > /dev/null 2>&1 || true
(cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 2>&1 | grep -v "^W:" | tail -1)
# gzipped (7.5 -> ~2 MB): the tree and .gl share the 64 MiB a device call carries; gl-run.sh unpacks it
gzip -9c "$(command -v glslangValidator)" > .gl/bin/glslangValidator.gz
pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 -d .gl/wheels cffi pyzmq msgpack xxhash vulkan pycparser psutil
cp scripts/device/gl-run.sh .gl/run.sh
# this checkout's native extension, stripped (abi3: it loads in the device's Python 3.12): gl-run.sh uses it
# instead of building one there (80-120 s of device time); NATIVE=0 leaves it out
if [ "${NATIVE:-1}" = 1 ] && [ -f daemon/_native.abi3.so ]; then
  mkdir -p .gl/native; strip -o .gl/native/_native.abi3.so daemon/_native.abi3.so
fi
if [ -n "${BASE:-}" ]; then rm -rf .gl/base; mkdir -p .gl/base; git archive "$BASE" daemon client | tar -x -C .gl/base; fi
du -sh .gl
