#!/bin/bash
# Issue 20, int8 on Vulkan: the quantised-kernel tests on the GPU, bench quant (inferd int8 and fp32 on the GPU,
# onnxruntime int8/fp32 on the host CPU), and a per-dispatch GPU profile of the int8 models (where the time goes).
# Run from the repo root with the Vulkan loader and wheels set up (see the device tool's README); writes $OUT.
set -u
OUT=${OUT:-/tmp/issue20-int8}; mkdir -p "$OUT"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_quant_vulkan.py tests/test_mixed_placement.py 2>&1 \
    | tee "$OUT/tests.log" | tail -4
timeout 200 python3 -m inferd.cli bench quant --device vulkan --models "${MODELS:-squeezenet1_1,mobilenetv2,resnet18}" \
    --schemes qdq_s8s8,qdq_u8s8_pc --repeat 60 --cold-repeat 1 --out "$OUT" 2>&1 | grep "^|"
timeout 100 python3 - <<'PY'
import collections, numpy as np, onnx
from inferd.frontend import import_model
from inferd.vulkan.model import VulkanModel
from inferd.zoo import write_zoo, quant as zq
import os
for name in os.environ.get("MODELS", "squeezenet1_1,mobilenetv2,resnet18").split(","):
    src = write_zoo("/tmp/i20zoo", [name])[name]
    q = zq.quantized(src, "qdq_s8s8")
    feeds = zq.calibration_feeds(q, n=1, seed=7)[0]
    for tag, path in (("int8", q), ("fp32", src.with_name(f"{src.stem}.pre.onnx"))):
        with VulkanModel(import_model(path), profile=True) as m:
            for _ in range(20):
                m.run(feeds)
            prof = m.last_profile()
        by = collections.Counter()
        for d in prof:
            by[d["kernel"]] += d["ms"]
        print(name, tag, "GPU ms %.3f by kernel:" % sum(by.values()), {k: round(v, 3) for k, v in by.most_common()})
PY
