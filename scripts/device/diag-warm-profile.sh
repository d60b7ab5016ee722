#!/bin/bash
# Where warm Vulkan time goes (per dispatch GPU timestamps) for resnet50 and vgg16, fp32 and fp16, and the
# cooperative-matrix extensions the driver offers. Run after `bash .gl/run.sh`; prints only.
python3 - <<'PY'
import time, numpy as np, vulkan as vk
from inferd.zoo import build
from inferd.frontend import import_model
from inferd.vulkan.model import VulkanModel
from inferd.vulkan.device import get_device
d = get_device()
pd = d.physical if hasattr(d, "physical") else None
try:
    exts = sorted(e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(d.physical, None))
    print("coop exts:", [e for e in exts if "cooperative" in e or "float16" in e or "16bit" in e or "integer_dot" in e])
except Exception as e:
    print("ext query failed", e, [a for a in dir(d) if not a.startswith("__")][:60])
for name in ["resnet50", "vgg16"]:
    g = import_model(build(name))
    x = np.random.default_rng(0).standard_normal(tuple(g.inputs[0].shape)).astype(np.float32)
    for prec in ["fp32", "fp16"]:
        kw = {} if prec == "fp32" else {"precision": "fp16"}
        m = VulkanModel(g, profile=True, **kw)
        for _ in range(5): m.run({g.inputs[0].name: x})
        prof = m.last_profile()
        m.close()
        m = VulkanModel(g, **kw)
        for _ in range(10): m.run({g.inputs[0].name: x})
        ts = []
        for _ in range(30):
            t = time.perf_counter(); m.run({g.inputs[0].name: x}); ts.append(time.perf_counter() - t)
        m.close()
        tot = sum(p["ms"] for p in prof)
        print(f"== {name} {prec}: wall p50 {np.median(ts)*1e3:.3f} ms, GPU sum {tot:.3f} ms, dispatches {len(prof)}")
        by = {}
        for p in prof:
            by.setdefault(p["shader"], [0, 0.0]); by[p["shader"]][0] += 1; by[p["shader"]][1] += p["ms"]
        print("   by shader:", {k: (v[0], round(v[1], 3)) for k, v in sorted(by.items(), key=lambda kv: -kv[1][1])})
        for p in sorted(prof, key=lambda p: -p["ms"])[:10]:
            print(f'{p["ms"]:8.3f} {p["node"][:34]:34} {p["kernel"]:18} {p["shader"]:16} {p["groups"]}')
PY
