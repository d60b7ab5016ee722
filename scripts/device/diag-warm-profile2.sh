#!/bin/bash
# Warm Vulkan time per dispatch with the kernels the package path chose (inferd.load), fp32 and fp16.
python3 - <<'PY'
import time, tempfile, numpy as np
import inferd
from inferd.zoo import build
from inferd.frontend import import_model
from inferd.vulkan.model import VulkanModel
import onnx
work = tempfile.mkdtemp()
for name in ["resnet50", "vgg16"]:
    mp = f"{work}/{name}.onnx"; onnx.save(build(name), mp)
    g = import_model(build(name))
    x = np.random.default_rng(0).standard_normal(tuple(g.inputs[0].shape)).astype(np.float32)
    for prec in ["fp32", "fp16"]:
        m = inferd.load(mp, device="vulkan", cache_dir=f"{work}/pk", precision=prec)
        m.run({m.inputs[0].name: x}); m.wait_loaded()
        for _ in range(3): m.run({m.inputs[0].name: x})
        m.wait_warm(60)
        ts = []
        for _ in range(50):
            t = time.perf_counter(); m.run({m.inputs[0].name: x}); ts.append(time.perf_counter() - t)
        ks = m.kernels
        m.close()
        kw = {} if prec == "fp32" else {"precision": "fp16"}
        vm = VulkanModel(g, kernels={k: v for k, v in ks.items() if v != "alias"}, profile=True, **kw)
        for _ in range(20): vm.run({g.inputs[0].name: x})
        prof = vm.last_profile(); vm.close()
        tot = sum(p["ms"] for p in prof)
        print(f"== {name} {prec}: package warm p50 {np.median(ts)*1e3:.3f} min {np.min(ts)*1e3:.3f} ms; profiled GPU sum {tot:.3f} ms, dispatches {len(prof)}")
        by = {}
        for p in prof:
            by.setdefault(p["kernel"] + "/" + p["shader"], [0, 0.0]); by[p["kernel"] + "/" + p["shader"]][0] += 1; by[p["kernel"] + "/" + p["shader"]][1] += p["ms"]
        print("   by kernel/shader:", {k: (v[0], round(v[1], 3)) for k, v in sorted(by.items(), key=lambda kv: -kv[1][1])})
        for p in sorted(prof, key=lambda p: -p["ms"])[:8]:
            print(f'{p["ms"]:8.3f} {p["node"][:34]:34} {p["kernel"]:18} {p["shader"]:16} {p["groups"]}')
PY
