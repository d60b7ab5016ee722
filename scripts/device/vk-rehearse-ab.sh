# run on the device after `source .gl/run.sh`: inferd bench cold (Vulkan) at HEAD and at .gl/base, alternating
set -u
OUTD=${OUT:-/tmp/out}
for i in 1 2; do
  for arm in head base; do
    PYTHONPATH=/tmp/pp/$arm timeout 200 python3 -m inferd.cli bench cold --device vulkan --models squeezenet1_1,mobilenetv2 \
      --repeat 3 --no-ncnn --no-plots --no-refined --no-reload --out $OUTD/$arm$i --tag h100_$arm 2>&1 | grep -E "inferd cold|wrote" | cut -c1-200
  done
done
