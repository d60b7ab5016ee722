"""Where a Vulkan model's resident weight bytes go, per precision: for each zoo model and arm, load it from a
compiled package (as inferd.load in the daemon), run it, and list the weight allocations (slabs and own
regions: size, live bytes placed in them) and per layer the kernel and its weight bytes, at the first answer
and again after the warm switch. Usage: python3 scripts/device/_resident.py WORK model[,model] [arm,...]."""
import sys

import numpy as np

import inferd
from inferd.bench.precision_bench import ARMS, load_options
from inferd.zoo import build


def layers(b) -> dict[str, tuple[str, int]]:
    out = {}
    for s, p in zip(b._slots, b._prepared):
        if p is None or s.kind != "kernel":
            continue
        try:
            n = int(p.kernel.transformed_nbytes(s.layer))
        except Exception:
            n = -1
        out[s.node.name] = (p.kernel.name, n)
    return out


def show(tag: str, m) -> dict[str, tuple[str, int]]:
    b = m._exec
    regs = b.weight_regions
    per = layers(b)
    live = sum(n for _, n in per.values() if n > 0)
    print(f"  {tag}: weights_bytes {sum(r.size for r in regs) / 2**20:.1f} MiB in {len(regs)} allocations, "
          f"live (sum of the layers' transformed bytes) {live / 2**20:.1f} MiB")
    return per


def main(work: str, models: list[str], arms: list[str]) -> None:
    import onnx
    for name in models:
        src = f"{work}/{name}.onnx"
        onnx.save(build(name), src)
        res = {}
        for arm in arms:
            m = inferd.load(src, device="vulkan", cache_dir=f"{work}/pk_{arm}", **load_options(arm))
            m.close()  # the first load compiles the package; the second is the one measured
            m = inferd.load(src, device="vulkan", cache_dir=f"{work}/pk_{arm}", **load_options(arm))
            x = np.random.default_rng(0).standard_normal(tuple(m.inputs[0].shape)).astype(np.float32)
            m.run({m.inputs[0].name: x})
            print(f"== {name} {arm}")
            first = show("first answer", m)
            m.wait_loaded()
            for _ in range(3):
                m.run({m.inputs[0].name: x})
            m.wait_warm(60)
            warm = show("after the warm switch", m)
            res[arm] = warm
            moved = {k: (first[k], warm[k]) for k in warm if k in first and first[k] != warm[k]}
            for k, (a, b) in list(moved.items())[:12]:
                print(f"    switched {k[:30]:30} {a[0]} {a[1] / 2**20:.2f} -> {b[0]} {b[1] / 2**20:.2f} MiB")
            m.close()
        if "fp32" in res:
            for arm in arms:
                if arm == "fp32":
                    continue
                print(f"  {name}: layers whose {arm} bytes exceed half their fp32 bytes (kernel fp32 -> {arm}):")
                tot32 = sum(v[1] for v in res["fp32"].values())
                totx = sum(v[1] for v in res[arm].values())
                print(f"    sum {tot32 / 2**20:.1f} -> {totx / 2**20:.1f} MiB ({totx / max(tot32, 1):.3f})")
                for k, (kn, n) in res[arm].items():
                    k32, n32 = res["fp32"].get(k, ("?", 0))
                    if n32 > 0 and n > 0.55 * n32 and n > (1 << 18):
                        print(f"    {k[:30]:30} {k32} {n32 / 2**20:.2f} -> {kn} {n / 2**20:.2f} MiB")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",") if len(sys.argv) > 3 else list(ARMS))
