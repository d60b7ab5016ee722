"""Deterministic profiles of a Vulkan cold load's host work (issue 8 diagnostic): cProfile of ``inferd.load``
(the setup before the plan starts) and of every layer's ``prepare`` on its loader thread (``LOADERS``: their
number; default the plan's), the load finished without running. On Python >= 3.12 (cProfile on sys.monitoring, one
profiler for every thread) two loads are profiled whole instead. argv: pkg [sort]. Page cache dropped per load."""
import cProfile
import os
import pstats
import sys
import threading
import time

import inferd
import inferd.vulkan.cold as vc
import inferd.vulkan.executor  # noqa: F401
import inferd.vulkan.host  # noqa: F401
from inferd.bench.common import daemon_state
from inferd.bench.cold_bench import evict

pkg = sys.argv[1]
LOADERS = int(os.environ["LOADERS"]) if os.environ.get("LOADERS") else None  # default: the plan's
sort = sys.argv[2] if len(sys.argv) > 2 else "tottime"
daemon_state("vulkan", 64 << 20, 128, 256 << 20, claim_cores=True)
lock = threading.Lock()
prep_prof: list[cProfile.Profile] = []
durs: list[float] = []
orig = vc.VulkanColdBackend.prepare
on = [False]


GLOBAL = sys.version_info >= (3, 12)  # cProfile on sys.monitoring: one profiler, every thread


def prepare(self, pos, lp, arrays):  # type: ignore[no-untyped-def]
    if GLOBAL and on[0]:
        t0 = time.perf_counter()
        try:
            return orig(self, pos, lp, arrays)
        finally:
            with lock:
                durs.append(time.perf_counter() - t0)
    if not on[0]:
        return orig(self, pos, lp, arrays)
    pr = cProfile.Profile()
    t0 = time.perf_counter()
    pr.enable()
    try:
        return orig(self, pos, lp, arrays)
    finally:
        pr.disable()
        with lock:
            durs.append(time.perf_counter() - t0)
            prep_prof.append(pr)


vc.VulkanColdBackend.prepare = prepare
load_prof = cProfile.Profile()
all_prof = cProfile.Profile()  # Python >= 3.12: loads 4 and 5 whole, every thread
ts = []
for i in range(6):
    evict([pkg], mode="fadvise")
    on[0] = i >= 2
    whole = GLOBAL and i >= 4
    t0 = time.perf_counter()
    if whole:
        all_prof.enable()
    elif on[0]:
        load_prof.enable()
    m = inferd.load(pkg, device="vulkan", loaders=LOADERS)
    if on[0] and not whole:
        load_prof.disable()
    ts.append((time.perf_counter() - t0) * 1e3)
    m.wait_loaded()
    if whole:
        all_prof.disable()
    m.close()
print("load() ms", [round(t, 1) for t in ts])
print(f"prepare: {len(durs)} calls, {sum(durs) / 4 * 1e3:.2f} ms a load, "
      f"{sum(durs) / max(1, len(durs)) * 1e6:.0f} us a layer")
print("== inferd.load (%d loads)" % (2 if GLOBAL else 4))
pstats.Stats(load_prof).sort_stats("cumtime").print_stats(28)
if GLOBAL:
    print("== two whole loads (every thread), by tottime")
    pstats.Stats(all_prof).sort_stats("tottime").print_stats(30)
    print("== two whole loads (every thread), by cumtime")
    pstats.Stats(all_prof).sort_stats("cumtime").print_stats(45)
    sys.exit(0)
print("== prepare (4 loads)")
st = pstats.Stats(prep_prof[0])
for p in prep_prof[1:]:
    st.add(p)
st.sort_stats(sort).print_stats(28)
