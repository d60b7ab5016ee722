"""How fast a layer's weights are copied into the device's mapped weight memory, by each way the upload path could
copy: numpy's slice assignment (the path under 4 MiB, GIL held), ctypes.memmove (GIL released), libc's memmove
through ctypes.PyDLL (GIL held). Prints us per copy and GB/s per size, the region's memory flags, and the same
copies into host memory for reference. Usage: python3 scripts/device/upload-copy.py"""
from __future__ import annotations

import ctypes
import time

import numpy as np

from inferd.vulkan.device import get_device

dev = get_device()
held_memmove = ctypes.PyDLL(None).memmove  # called with the GIL held (PyDLL)
held_memmove.restype = ctypes.c_void_p
held_memmove.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
sizes = [16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20]
region = dev.allocate_region(16 << 20, "weights")
host = np.zeros(16 << 20, np.uint8)
print("device", dev.name, "| region mapped:", region.mapped is not None, "| coherent:", getattr(region, "coherent", None))
src = np.random.default_rng(0).integers(0, 255, 4 << 20, dtype=np.uint8)


def bench(dst: np.ndarray, label: str) -> None:
    for n in sizes:
        s = src[:n]
        out = []
        for how in ("numpy", "memmove", "held"):
            ts = []
            for i in range(60):
                off = (i % 3) * n
                t = time.perf_counter()
                if how == "numpy":
                    dst[off:off + n] = s
                elif how == "memmove":
                    ctypes.memmove(dst.ctypes.data + off, s.ctypes.data, n)
                else:
                    held_memmove(dst.ctypes.data + off, s.ctypes.data, n)
                ts.append(time.perf_counter() - t)
            t = float(np.median(ts[5:]))
            out.append(f"{how} {t * 1e6:8.1f} us {n / t / 1e9:5.1f} GB/s")
        print(f"{label:7s} {n >> 10:5d} KB  " + "  |  ".join(out))


if region.mapped is not None:
    bench(region.mapped, "device")
bench(host, "host")
