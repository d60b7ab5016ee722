# cProfile of one Vulkan cold load on the calling thread (inferd.load + the first run), page cache dropped; argv: pkg
import cProfile, io, os, pstats, sys, time
import numpy as np
import inferd
import importlib, pkgutil
import inferd.ops
import inferd.package, inferd.runtime.cold, inferd.vulkan.cold, inferd.vulkan.executor, inferd.vulkan.host  # noqa
# as the cold bench's child (a daemon that is up): every module the load would import lazily, imported now
for mi in pkgutil.iter_modules(inferd.ops.__path__):
    if mi.name.endswith("_vulkan"):
        importlib.import_module("inferd.ops." + mi.name)
from inferd.bench.cold_bench import evict
from inferd.vulkan import device as D
D.get_device()
pkg = sys.argv[1]
evict([pkg])  # drop_caches where allowed, and every file of the package
pr = cProfile.Profile()
t0 = time.perf_counter()
pr.enable()
m = inferd.load(pkg, device="vulkan")
t1 = time.perf_counter()
pr.disable()
feeds = {i.name: np.random.rand(*i.shape).astype(i.dtype) for i in m.inputs}
m.run(feeds)
t2 = time.perf_counter()
cr = getattr(getattr(m, "_cold", None), "run", None)
print(f"load() {1e3 * (t1 - t0):.1f} ms, cold {1e3 * (t2 - t0):.1f} ms, plan start {1e3 * (cr.t_start - t0) if cr else -1:.1f} ms")
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("cumtime").print_stats(int(os.environ.get("NPROF", 30)))
print(s.getvalue()[:7000])
m.close()
