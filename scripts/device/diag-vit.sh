#!/bin/bash
# vit_tiny warm on the H100: per-dispatch GPU time by kernel/shader, wall vs GPU sum, dispatch and barrier counts.
python3 - <<'PY'
import time, tempfile, numpy as np, onnx
import inferd
from inferd.zoo import build
from inferd.frontend import import_model
from inferd.vulkan.model import VulkanModel
from inferd.bench.common import ramp
work = tempfile.mkdtemp()
for name in ["vit_tiny"]:
    mp = f"{work}/{name}.onnx"; onnx.save(build(name), mp)
    g = import_model(build(name))
    x = np.random.default_rng(0).standard_normal(tuple(g.inputs[0].shape)).astype(np.float32)
    m = inferd.load(mp, device="vulkan", cache_dir=f"{work}/pk")
    m.run({m.inputs[0].name: x}); m.wait_loaded(); m.run({m.inputs[0].name: x}); m.wait_warm(60)
    ramp(lambda: m.run({m.inputs[0].name: x}))
    ts = []
    for _ in range(50):
        t = time.perf_counter(); m.run({m.inputs[0].name: x}); ts.append(time.perf_counter() - t)
    ks = m.kernels; m.close()
    vm = VulkanModel(g, kernels={k: v for k, v in ks.items() if v != "alias"}, profile=True)
    for _ in range(20): vm.run({g.inputs[0].name: x})
    prof = vm.last_profile(); st = vm.load_stats; vm.close()
    tot = sum(p["ms"] for p in prof)
    print(f"== {name}: package warm p50 {np.median(ts)*1e3:.3f} min {np.min(ts)*1e3:.3f} ms; GPU sum {tot:.3f} ms, dispatches {len(prof)}")
    by = {}
    for p in prof:
        k = p["kernel"] + "/" + p["shader"]
        by.setdefault(k, [0, 0.0]); by[k][0] += 1; by[k][1] += p["ms"]
    for k, v in sorted(by.items(), key=lambda kv: -kv[1][1])[:14]:
        print(f"  {v[1]:7.3f} ms {v[0]:4d}x  {k}")
    for p in sorted(prof, key=lambda p: -p["ms"])[:8]:
        print(f'{p["ms"]:8.3f} {p["node"][:40]:40} {p["kernel"]:18} {p["shader"]:16} {p["groups"]}')
    print("ops:", sorted({n.op for n in g.nodes}))
PY
