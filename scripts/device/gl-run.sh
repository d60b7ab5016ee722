# Copied to .gl/run.sh by scripts/device/make-gl.sh; sourced first on a lent GPU machine.
# Set up a lent GPU machine from the carried .gl: the Vulkan loader, glslangValidator, the wheels, a working
# NVIDIA ICD, the native build, and `inferd` importable from the checkout (HEAD) or from .gl/base (a baseline
# tree sharing the same native build). Sets VK_OK=1 when a Vulkan device came up.
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
if [ -f .gl/bin/glslangValidator.gz ]; then gunzip -f .gl/bin/glslangValidator.gz && chmod +x .gl/bin/glslangValidator; fi
export PATH=$PWD/.gl/bin:$PATH
python3 -m pip install -q --no-index --no-deps .gl/wheels/*.whl 2>&1 | tail -2
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/nvidia/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
export INFERD_SHADER_DIR=$PWD/shaders
mkdir -p /tmp/pp/head /tmp/pp/base
ln -sfn $PWD/daemon /tmp/pp/head/inferd; ln -sfn $PWD/client /tmp/pp/head/inferd_client
ln -sfn $PWD/.gl/base/daemon /tmp/pp/base/inferd; ln -sfn $PWD/.gl/base/client /tmp/pp/base/inferd_client
export PYTHONPATH=/tmp/pp/head
VK_OK=0
for icd in ${VK_DRIVER_FILES:-} ${VK_ICD_FILENAMES:-} /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json \
    /usr/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json \
    $(find / -xdev \( -path /proc -o -path /sys \) -prune -o -name 'nvidia_icd*.json' -print 2>/dev/null | head -4); do
  [ -f "$icd" ] || continue
  if VK_DRIVER_FILES=$icd VK_ICD_FILENAMES=$icd python3 -c "from inferd.vulkan.device import get_device; print('vulkan:', get_device().name)" 2>/tmp/vkprobe.log; then
    export VK_DRIVER_FILES=$icd VK_ICD_FILENAMES=$icd; VK_OK=1; echo "ICD $icd"; break
  fi
  echo "ICD $icd failed: $(tail -1 /tmp/vkprobe.log)"; cat "$icd" | tr -d '\n' | cut -c1-300; echo
done
if [ $VK_OK = 0 ]; then
  ls -la /usr/local/nvidia /usr/local/nvidia/lib64 2>&1 | head -20; ldconfig -p | grep -i "nvidia\|vulkan" | head
  VK_LOADER_DEBUG=error,driver python3 -c "from inferd.vulkan.device import get_device; get_device()" 2>&1 | head -30
else
  # the extension built here and carried (.gl/native, abi3 and runtime-dispatched: no CPU flags of this
  # host) saves the 80-120 s build; built here when it is absent or does not load
  if [ -f .gl/native/_native.abi3.so ] && cp .gl/native/_native.abi3.so daemon/ \
      && python3 -c "import sys, inferd.native as n; sys.exit(not n.AVAILABLE)" 2>/dev/null; then
    echo "native: carried build"
  else
    t=$(date +%s); python3 setup.py -q build_ext --inplace > /tmp/build.log 2>&1 || tail -20 /tmp/build.log
    echo "native build $(( $(date +%s) - t )) s"
  fi
  mkdir -p .gl/base/daemon; cp daemon/_native*.so .gl/base/daemon/
fi
export VK_OK  # (scripts run with bash read it)
