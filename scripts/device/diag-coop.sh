#!/bin/bash
# Matrix-unit convs (fp16 arithmetic) vs fp32 and fp16 weights on the package path; GPU clock ramped first,
# arms interleaved, min and median of many runs.
python3 - <<'PY'
import time, tempfile, numpy as np, onnx
import inferd
from inferd.zoo import build
from inferd.vulkan.device import get_device
print("features", get_device().features)
work = tempfile.mkdtemp()
arms = [("fp32", {"precision": "fp32"}), ("fp16w", {"precision": "fp16"}), ("fp16coop", {"precision": "fp16", "fp16_arithmetic": True})]
for name in ["resnet50", "vgg16", "resnet18", "mobilenetv2"]:
    mp = f"{work}/{name}.onnx"; onnx.save(build(name), mp)
    ms, x = {}, None
    for a, kw in arms:
        m = inferd.load(mp, device="vulkan", cache_dir=f"{work}/pk", **kw)
        if x is None:
            x = np.random.default_rng(0).standard_normal(tuple(m.inputs[0].shape)).astype(np.float32)
        m.run({m.inputs[0].name: x}); m.wait_loaded()
        for _ in range(3): m.run({m.inputs[0].name: x})
        m.wait_warm(60)
        ms[a] = m
    outs = {a: list(m.run({m.inputs[0].name: x}).values())[0] for a, m in ms.items()}
    t_end = time.perf_counter() + 1.0
    while time.perf_counter() < t_end:
        ms["fp32"].run({ms["fp32"].inputs[0].name: x})
    ts = {a: [] for a in ms}
    for _ in range(40):
        for a, m in ms.items():
            t = time.perf_counter(); m.run({m.inputs[0].name: x}); ts[a].append(time.perf_counter() - t)
    r = {a: (1e3 * np.median(v), 1e3 * np.min(v)) for a, v in ts.items()}
    ref = outs["fp32"]
    line = " ".join(f"{a}: p50 {r[a][0]:.3f} min {r[a][1]:.3f} ({r[a][0] / r['fp32'][0]:.2f}x) err {np.abs(outs[a]-ref).max()/np.abs(ref).max():.1e};" for a in ms)
    print(f"== {name}: {line}")
    print("   kernels coop:", {k: v for k, v in ms["fp16coop"].kernels.items() if "gemm" in v or "1x1" in v or "wino" in v}.__len__(), sorted(set(ms["fp16coop"].kernels.values())))
    for m in ms.values(): m.close()
PY
