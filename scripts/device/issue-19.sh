#!/bin/bash
# Issue 19, testbed (b): CPU-GPU co-execution on the H100 machine (16 cores + the GPU). Run from the repo root
# after `bash .gl/run.sh`; < 4 minutes; results under $OUT/.
#  1. the tests of split execution on this device (a discrete GPU: the CPU cannot share its activations cheaply,
#     so cpu+vulkan must fall back to the GPU alone, with a warning, and answer right);
#  2. inferd bench coexec --testbed none: cpu+vulkan against GPU only on the zoo models (goal: <= 1.02x);
#  3. the same bench on lavapipe pinned to 1 core next to the CPU kernels on another (testbed (a) on this
#     machine's cores), for the layer sets, sync overhead and end to end.
set -u
OUT=${OUT:-/tmp/out19}; mkdir -p "$OUT/results"
export INFERD_TESTING=1
python3 -m pytest -q -x -p no:cacheprovider tests/test_split_planner.py > "$OUT/tests.log" 2>&1
echo "planner tests rc=$?" >> "$OUT/tests.log"
# cpu+vulkan on a discrete GPU: loads (GPU alone, warning naming why) and answers like onnxruntime
python3 - >> "$OUT/tests.log" 2>&1 <<'PY'
import tempfile, warnings, numpy as np, onnx, onnxruntime as ort, inferd
from inferd.zoo import build
d = tempfile.mkdtemp(); p = d + "/resnet18.onnx"; onnx.save(build("resnet18"), p)
x = {"input": np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)}
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    m = inferd.load(p, device="cpu+vulkan")
got = m.run(x)["output"]; want = ort.InferenceSession(p).run(None, x)[0]
err = float(np.abs(got - want).max() / np.abs(want).max())
print("cpu+vulkan on this device ->", m.device, "| warnings:", [str(i.message)[:120] for i in w], "| rel err", err)
assert err < 1e-3
PY
echo "fallback check rc=$?" >> "$OUT/tests.log"
timeout 90 python3 -m inferd.cli bench coexec --testbed none --reps 7 \
  --models resnet18,mobilenetv2,vit_tiny,detnet_dyn,squeezenet1_1 --out "$OUT/results" \
  > "$OUT/bench_b.log" 2>&1; echo "rc=$?" >> "$OUT/bench_b.log"
# testbed (a) on the H100 machine's CPU: lavapipe (if installed) on core 1, the CPU kernels on core 0
if VK_ICD_FILENAMES=$(ls /usr/share/vulkan/icd.d/lvp_icd*.json 2>/dev/null | head -1) && [ -n "$VK_ICD_FILENAMES" ]; then
  VK_ICD_FILENAMES=$VK_ICD_FILENAMES LP_NUM_THREADS=0 timeout 100 python3 -m inferd.cli bench coexec --testbed a \
    --max-layers 8 --grid 6 --reps 5 --models resnet18,mobilenetv2,vit_tiny --out "$OUT/results" --tag _h100cpu \
    > "$OUT/bench_a_h100.log" 2>&1; echo "rc=$?" >> "$OUT/bench_a_h100.log"
else
  echo "no lavapipe ICD on this machine: testbed (a) skipped" > "$OUT/bench_a_h100.log"
fi
tail -5 "$OUT"/*.log
