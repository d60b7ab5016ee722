"""Where warm Vulkan time goes, per shader (GPU timestamps of the last run), for zoo models in the precision
arms fp32, fp16w (fp16 weights, fp32 arithmetic) and fp16 (fp16 arithmetic: cooperative matrices where the
device has them). Usage: python3 scripts/device/_warm_profile.py resnet50 vgg16 [--top N]; prints only."""
import sys
import time

import numpy as np

from inferd.bench.precision_bench import ARMS, load_options
from inferd.frontend import import_model
from inferd.vulkan.model import VulkanModel
from inferd.zoo import build


def main(names: list[str], top: int) -> None:
    for name in names:
        g = import_model(build(name))
        x = {g.inputs[0].name: np.random.default_rng(0).standard_normal(tuple(g.inputs[0].shape)).astype(np.float32)}
        for arm in ARMS:
            kw = load_options(arm)
            m = VulkanModel(g, profile=True, **kw)
            for _ in range(5):
                m.run(x)
            prof = m.last_profile()
            m.close()
            m = VulkanModel(g, **kw)
            t_end = time.perf_counter() + 1.0  # a burst that brings the GPU to its running clock
            while time.perf_counter() < t_end:
                m.run(x)
            ts = []
            for _ in range(50):
                t = time.perf_counter()
                m.run(x)
                ts.append(time.perf_counter() - t)
            m.close()
            tot = sum(p["ms"] for p in prof)
            print(f"== {name} {arm}: wall p50 {np.median(ts) * 1e3:.3f} ms, GPU sum {tot:.3f} ms, "
                  f"{len(prof)} dispatches")
            by: dict[str, list] = {}
            for p in prof:
                by.setdefault(p["shader"], [0, 0.0])
                by[p["shader"]][0] += 1
                by[p["shader"]][1] += p["ms"]
            print("   by shader:", {k: (v[0], round(v[1], 3)) for k, v in sorted(by.items(), key=lambda kv: -kv[1][1])})
            for p in sorted(prof, key=lambda p: -p["ms"])[:top]:
                print(f'   {p["ms"]:7.3f} {p["node"][:30]:30} {p["kernel"]:16} {p["shader"]:16} {p["groups"]}')


if __name__ == "__main__":
    args = sys.argv[1:]
    top = 8
    if "--top" in args:
        i = args.index("--top")
        top = int(args[i + 1])
        del args[i:i + 2]
    main(args or ["resnet50", "vgg16"], top)
