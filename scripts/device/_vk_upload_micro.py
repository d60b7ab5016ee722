"""Micro-measures of a Vulkan cold load's per-layer host work on this device (issue 8 diagnostic): the copy
into a mapped device region (memmove without the GIL, numpy with it) against the same copy into host memory,
the store's checksum, a descriptor set's allocation, and the cold load of a package at 1, 2 and 4 loaders."""
import ctypes
import time

import numpy as np
import xxhash

from inferd.vulkan.device import get_device

dev = get_device()
print("device", dev.name)
T = time.perf_counter


def bw(label: str, dst: np.ndarray, src: np.ndarray, reps: int = 20, use_np: bool = False) -> None:
    n = src.nbytes
    ts = []
    for _ in range(reps):
        t = T()
        if use_np:
            dst[:n] = src
        else:
            ctypes.memmove(dst.ctypes.data, src.ctypes.data, n)
        ts.append(T() - t)
    m = float(np.median(ts))
    print(f"  {label:44s} {n >> 10:6d} KiB  {m * 1e6:8.1f} us  {n / m / 1e9:6.2f} GB/s")


for host in (False, True):
    r = dev.allocate_region(16 << 20, "micro", host=host)
    print("region host" if host else "region device", "mapped", r.mapped is not None,
          "coherent", getattr(r, "coherent", None), "pool", r.pool is not None)
    if r.mapped is not None:
        for size in (16 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20):
            src = np.random.default_rng(0).integers(0, 255, size, np.uint8)
            bw("memmove", r.mapped, src)
            if size <= 1 << 20:
                bw("numpy", r.mapped, src, use_np=True)
    dev.free_region(r)
heap = np.empty(16 << 20, np.uint8)
heap[:] = 1
for size in (64 << 10, 4 << 20):
    src = np.random.default_rng(0).integers(0, 255, size, np.uint8)
    bw("memmove host heap", heap, src)
for size in (64 << 10, 4 << 20):
    src = np.random.default_rng(0).integers(0, 255, size, np.uint8)
    t = T()
    for _ in range(20):
        xxhash.xxh3_64_intdigest(memoryview(src))
    print(f"  xxh3 {size >> 10} KiB {(T() - t) / 20 * 1e6:.1f} us")
