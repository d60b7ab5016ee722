"""Where a cold load's time goes before its plan starts: ``inferd.load`` of a compiled package, in the state of a
daemon that is up (``bench.common.daemon_state``), files evicted, never seen or registered (``inferd.register``),
then its first run. Prints each step of ``load()`` (open, backend set-up and its parts, binds, ColdLoad) with when
it began and how long it took, then the run's ``cold_stats``. Usage:
    python3 scripts/device/load-phases.py PKG cpu|vulkan never|registered [rounds]
Each round is a fresh process (run it in a loop): the numbers are of a first load."""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable

import numpy as np

pkg, device, mode = sys.argv[1], sys.argv[2], sys.argv[3]
from inferd.runtime.codepages import import_load_path  # noqa: E402

import_load_path()
if device == "vulkan":
    from inferd.vulkan import import_load_path as vulkan_load_path

    vulkan_load_path()
import inferd  # noqa: E402
from inferd.bench.common import daemon_state  # noqa: E402

daemon_state(device, 64 << 20, 256 if device == "vulkan" else 0, 256 << 20, claim_cores=True, rehearse=True)
if mode == "registered":
    inferd.register(pkg, device=device)
marks: list[tuple[str, float, float]] = []
T0 = [0.0]


def wrap(owner: Any, name: str, label: str) -> None:
    f: Callable[..., Any] = getattr(owner, name)

    def timed(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            marks.append((label, (t - T0[0]) * 1e3, (time.perf_counter() - t) * 1e3))
    setattr(owner, name, timed)


import inferd.backends.base as BB  # noqa: E402
import inferd.package as P  # noqa: E402
import inferd.runtime.bindrec as B  # noqa: E402
import inferd.runtime.cold as C  # noqa: E402

for owner, name in [(P, "open_package"), (P, "make_backend"), (B, "load"), (C.ColdLoad, "__init__"),
                    (BB.WeightSource, "start_stream_early"), (P, "_open_plan"), (P, "WeightsStore")]:
    wrap(owner, name, name)
if device == "vulkan":
    import inferd.vulkan.cold as VC
    from inferd.vulkan import device as VD

    for owner, name in [(VC, "fold_constants"), (VC, "select_nodes"), (VC, "plan_activations"), (VC, "HostIO"),
                        (VC, "WeightSlabs"), (VC, "DescriptorArena"), (VC, "kernel_caps"), (VC, "_import_kernels"),
                        (VD.vk, "vkCreateCommandPool"), (VD.vk, "vkCreateFence"), (VD.VulkanDevice, "allocate_region"),
                        (VD.VulkanDevice, "register_model")]:
        if hasattr(owner, name):
            wrap(owner, name, name)
for root, _, fs in os.walk(pkg):
    for f in fs:
        fd = os.open(os.path.join(root, f), os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
prof = None
if os.environ.get("PROFILE"):  # cProfile of the load and the first run (its own overhead inflates both)
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
T0[0] = t0 = time.perf_counter()
m = inferd.load(pkg, device=device)
t1 = time.perf_counter()
feeds = {i.name: np.random.rand(*i.shape).astype(np.float32) for i in m.graph.inputs}
m.run(feeds)
t2 = time.perf_counter()
if prof is not None:
    prof.disable()
print(f"{os.path.basename(pkg.rstrip('/'))} {mode} {device}: load() {(t1 - t0) * 1e3:.2f} ms, "
      f"cold {(t2 - t0) * 1e3:.1f} ms")
for label, at, took in sorted(marks, key=lambda x: x[1]):
    print(f"   {label:22s} at {at:7.2f} took {took:7.2f}")
ls = getattr(getattr(m._cold, "backend", None), "load_stats", {})
print("   load_stats", json.dumps({k: (round(v * 1e3, 3) if isinstance(v, float) else v) for k, v in ls.items()}))
print("   cold_stats", json.dumps({k: (round(v * 1e3, 3) if isinstance(v, float) else v)
                                  for k, v in m.cold_stats.items() if isinstance(v, (int, float))}))
if os.environ.get("PRIME"):
    # a priming load, as a daemon's earlier one: its idle-time work done (binds recorded, plan refined, the warm
    # path recorded and the pipeline cache and the device's pipeline list saved) before the process ends
    m.wait_warm(60)
    for ev in (getattr(m, "binds_done", None), getattr(m, "refine_done", None)):
        if ev is not None:
            ev.wait(60)
    m.close()
    if device == "vulkan":
        from inferd.vulkan.device import close_shared_device

        close_shared_device()
    sys.exit(0)
tl = m._cold.run.timeline()
ex = [e for e in tl if e["kind"] in ("execute", "wait")]
if ex:
    print("   executor:", " ".join(f"{e['kind'][0]}{(e['t1'] - e['t0']) * 1e3:.2f}" for e in ex))
    last_read = max((e["t1"] for e in tl if e["kind"] == "read"), default=0.0)
    print(f"   plan clock: first execute {ex[0]['t0'] * 1e3:.2f}, last execute end {ex[-1]['t1'] * 1e3:.2f}, "
          f"last read end {last_read * 1e3:.2f} ms")
if prof is not None:
    import io
    import pstats
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(28)
        print("\n".join(ln[:150] for ln in out.getvalue().splitlines()[6:]))
os._exit(0)
