"""Does a first write into freshly mapped device memory pay page faults on this device? (issue 8 diagnostic)
Times the first and second 16 MiB memmove into a new region and into a range of the device pool, a byte-per-page
prefault of a new region, MADV_POPULATE_WRITE on one, and allocate_region's own time."""
import ctypes
import mmap
import time

import numpy as np

from inferd.vulkan import devpool
from inferd.vulkan.device import get_device

devpool.configure(64 << 20)
dev = get_device()
print("device", dev.name, "type", dev.device_type, "pool", dev.pool.stats() if dev.pool else None)
T = time.perf_counter
src = np.random.default_rng(0).integers(0, 255, 16 << 20, np.uint8)


def first_second(r, label):
    ts = []
    for _ in range(3):
        t = T()
        ctypes.memmove(r.mapped.ctypes.data, src.ctypes.data, r.mapped.size)
        ts.append((T() - t) * 1e3)
    print(f"  {label}: 16 MiB memmove first/second/third ms", [round(x, 2) for x in ts])


for host_pool_first in (False,):
    t = T()
    r = dev.allocate_region(16 << 20, "own")
    print("own region alloc ms", round((T() - t) * 1e3, 2), "pool", r.pool is not None)
    first_second(r, "own region")
    dev.free_region(r)
    devpool.configure(0)
t = T()
r = dev.allocate_region(16 << 20, "fresh")
print("fresh region alloc ms", round((T() - t) * 1e3, 2), "pool", r.pool is not None)
t = T()
r.mapped[::mmap.PAGESIZE] = 0
print("  byte per page prefault ms", round((T() - t) * 1e3, 2))
first_second(r, "prefaulted region")
dev.free_region(r)
r = dev.allocate_region(16 << 20, "fresh2")
try:
    from inferd.runtime.pagecache import can_populate, populate_steps
    t = T()
    ok = populate_steps(r.mapped, stop=lambda: False) if can_populate() else None
    print("  MADV_POPULATE_WRITE ok", ok, "ms", round((T() - t) * 1e3, 2))
except Exception as e:
    print("  populate failed", type(e).__name__, e)
first_second(r, "populated region")
dev.free_region(r)
# the pool's own ranges, as a model's slabs and arena take them
for i in range(2):
    t = T()
    r = dev.allocate_region(16 << 20, "pooled")
    print(f"pooled region {i} alloc ms", round((T() - t) * 1e3, 2), "pool", r.pool is not None)
    first_second(r, f"pooled region {i}")
    dev.free_region(r)
for size in (1 << 20, 6 << 20):
    for host in (False, True):
        t = T()
        r = dev.allocate_region(size, "x", host=host)
        print(f"alloc {size >> 20} MiB host={host} ms", round((T() - t) * 1e3, 3), "pool", r.pool is not None)
        dev.free_region(r)
