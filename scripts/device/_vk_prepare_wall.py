"""Where a Vulkan cold load's preparation goes, as wall time (GIL waits included) summed over the loader threads
(issue 8 diagnostic): in-process cold loads of one package (page cache dropped before each; the parsed plan kept, as
a daemon's reload), in a daemon's state (device pool POOL MiB, default 64, and resident pipelines), the last load
timed through wrappers of the prepare path's parts. argv: a package compiled for vulkan."""
import collections
import ctypes  # noqa: F401 - the wrapped memmove is device.py's ctypes.memmove
import os
import resource
import sys
import threading
import time

import numpy as np

import inferd
from inferd.bench.cold_bench import evict
from inferd.bench.common import daemon_state
from inferd.runtime.codepages import import_load_path
from inferd.vulkan import cold as VC
from inferd.vulkan import device as VD
from inferd.vulkan import import_load_path as vulkan_load_path
from inferd.vulkan import raw as VR
from inferd.vulkan import shaders as VSH
from inferd.vulkan import slabs as VS

import_load_path()
vulkan_load_path()
acc: dict[str, float] = collections.defaultdict(float)
cnt: collections.Counter = collections.Counter()
lock = threading.Lock()
on = {"v": False}
cpu: dict[str, float] = collections.defaultdict(float)  # thread CPU inside (wall - CPU: waits, the GIL's included)
faults: collections.Counter = collections.Counter()  # minor page faults of the calling thread inside
by: collections.Counter = collections.Counter()  # calls per (key, main thread or a loader)


def wrap(obj, name, key=None):
    f = getattr(obj, name)
    key = key or f"{getattr(obj, '__name__', obj)}.{name}"

    def w(*a, **k):
        if not on["v"]:
            return f(*a, **k)
        t, c = time.perf_counter(), time.thread_time()
        flt = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        try:
            return f(*a, **k)
        finally:
            flt = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - flt
            c, t = time.thread_time() - c, time.perf_counter() - t
            who = "main" if threading.current_thread() is threading.main_thread() else "loader"
            with lock:
                acc[key] += t
                cnt[key] += 1
                cpu[key] += c
                faults[key] += flt
                by[(key, who)] += 1
    setattr(obj, name, w)


for n in ("prepare", "_replay", "_upload"):
    wrap(VC.VulkanColdBackend, n)
for n in ("upload", "pipelines", "flush"):
    wrap(VD.VulkanDevice, n)
for n in ("create_buffer_view", "allocate_descriptor_sets", "update_descriptor_sets"):
    wrap(VR, n)
wrap(VS.WeightSlabs, "take")
wrap(VD.ctypes, "memmove", "ctypes.memmove")
wrap(VC, "bind_descriptors")
wrap(VC, "_meta")
wrap(VSH.ShaderCache, "get_many")
path = sys.argv[1]
m = inferd.load(path, device="vulkan")
feeds = {i.name: np.random.rand(*i.shape).astype(np.float32) for i in m.inputs}
m.run(feeds)
time.sleep(2)  # the binds are recorded after the answer
m.close()
del m
daemon_state("vulkan", int(os.environ.get("POOL", "64")) << 20, 128, 0, claim_cores=True, rehearse=True)
files = [os.path.join(path, f) for f in os.listdir(path)]
for r in range(4):
    evict(files)
    time.sleep(0.3)
    on["v"] = r == 3
    t0 = time.perf_counter()
    m = inferd.load(path, device="vulkan")
    m.run(feeds)
    t = time.perf_counter() - t0
    cs = dict(m.cold_stats)
    m.close()
    del m
print(path, "cold ms", round(t * 1e3, 2), {k: v for k, v in cs.items() if isinstance(v, (int, float))})
for k, v in sorted(acc.items(), key=lambda kv: -kv[1]):
    print(f"  {k:50s} n {cnt[k]:4d} sum {v * 1e3:8.2f} ms  per {v / cnt[k] * 1e6:8.1f} us  cpu {cpu[k] * 1e3:7.2f} ms"
          f"  faults {faults[k]:6d}  main/loader {by[(k, 'main')]}/{by[(k, 'loader')]}")
