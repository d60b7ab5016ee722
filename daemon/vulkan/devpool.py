"""The daemon's device memory pool: one ``VkDeviceMemory`` allocated (and mapped) when the device is created, from
which models' regions (activation arenas, weight slabs, workspaces) take aligned ranges, each a ``VkBuffer`` bound
at its offset, and to which the ranges return when the regions are freed.

Why: on the H200 a cold load's activation region took about 2.6 ms of CPU in ``vkAllocateMemory`` + ``vkMapMemory``
before its plan could start, and each weight slab as much on a loader thread (device-local memory the host maps
through the BAR; the driver clears and maps it per call). On lavapipe and unified-memory boards a new allocation
is fresh host memory whose pages fault on the load's first write (0.55-0.65 ms per MiB on the 2-core VM, against
0.02-0.05 written again). Binding a buffer at an offset of memory held since the start costs neither. ncnn's
``VkBlobAllocator`` keeps large blocks for the same reason.

The pool is memory the daemon holds whether or not a model uses it: its size is a setting (``device_pool``, none
by default outside the daemon), capped at an eighth of the heap it comes from, and ``inferctl status`` reports it.
Where host regions (a model's input/output staging) take another memory type (a discrete GPU's HOST_CACHED system
memory, pinned per allocation), a small second pool serves them. A region the pools cannot serve (full, another
memory type, non-coherent memory) gets its own allocation as before.
This module imports no Vulkan: a CPU-only daemon sets the size without loading a driver.
"""
from __future__ import annotations

import logging
import mmap
import threading
import time
from typing import Any

import numpy as np

from ..runtime.extents import Extents

log = logging.getLogger("inferd.vulkan")

#: the pool takes at most this share of its heap, whatever the setting says
HEAP_SHARE = 8
PAGE = mmap.PAGESIZE

_capacity = 0


def configure(capacity: int) -> None:
    """The pool size of devices created from now on (0: none). The daemon sets it at its start, before any device
    exists; a device recreated after a fault gets a pool of the same size."""
    global _capacity
    _capacity = max(0, int(capacity))


def capacity() -> int:
    return _capacity


def host_capacity(capacity: int) -> int:
    """The host regions' pool beside a device pool of ``capacity`` (where host regions take another memory type):
    an eighth of it, at most 16 MiB. Host regions are a model's input/output staging: small."""
    return min(capacity // 8, 16 << 20)


class DevicePool:
    """``size`` bytes of one memory type: ``take`` returns an aligned offset, ``give`` returns it."""

    def __init__(self, memory: Any, size: int, type_index: int, heap: int, flags: int,
                 mapped: np.ndarray | None, raw: Any) -> None:
        self.memory = memory
        self.size = int(size)
        self.type_index = type_index
        self.heap = heap
        self.flags = flags
        self.mapped = mapped
        self._raw = raw  # keeps the mapping's buffer object alive while views of it exist
        self._lock = threading.Lock()
        self._extents = Extents(self.size)
        self.regions = 0
        self.fallbacks = 0
        #: set once every page is faulted in (host memory only)
        self.prefault_ms: float | None = None
        self._prefault_thread: threading.Thread | None = None
        #: the pool is the process's memory (counted in its RSS once faulted in)
        self.host_memory = False
        self._stop = False

    def prefault(self, host_memory: bool = True) -> None:
        """Fault the mapped pages in. Host memory (lavapipe, a unified-memory board): in the background with
        ``MADV_POPULATE_WRITE``, which leaves bytes as they are and so may run beside a load that already writes
        its ranges; else, and for device memory the host maps through the BAR (``host_memory=False``: a discrete
        GPU's, where the populate is refused), by writing a byte per page here, before anything is placed.
        Why the BAR too: each first write to a page of it faults into the driver, ~0.75 us a page on the H100
        (a 16 MiB copy 4.5 ms the first time, 1.5 ms after), and a cold load's weight uploads into fresh slabs
        were those first writes, on the loader threads."""
        from ..runtime.pagecache import can_populate

        if self.mapped is None:
            return
        self.host_memory = host_memory
        if host_memory and can_populate():
            self._prefault_thread = threading.Thread(target=self._prefault, name="inferd-devpool", daemon=True)
            self._prefault_thread.start()
        else:
            t0 = time.perf_counter()
            self.mapped[::PAGE] = 0
            self.prefault_ms = (time.perf_counter() - t0) * 1e3

    def _prefault(self) -> None:
        from ..runtime.pagecache import populate_steps

        t0 = time.perf_counter()
        mapped = self.mapped
        if mapped is None or not populate_steps(mapped, stop=lambda: self._stop):
            return
        self.prefault_ms = (time.perf_counter() - t0) * 1e3
        log.info("device pool: %d MiB faulted in in %.0f ms", self.size >> 20, self.prefault_ms)

    def wait_prefaulted(self, timeout: float | None = None) -> bool:
        t = self._prefault_thread
        if t is not None:
            t.join(timeout)
            return not t.is_alive()
        return True

    def stop_prefault(self) -> None:
        """Before the memory is unmapped: a populate of unmapped pages would fault the process."""
        self._stop = True
        t = self._prefault_thread
        if t is not None:
            t.join()

    def take(self, size: int, align: int) -> int | None:
        with self._lock:
            off = self._extents.take(size, align)
            if off is None:
                self.fallbacks += 1
            else:
                self.regions += 1
            return off

    def give(self, off: int, size: int) -> None:
        with self._lock:
            self._extents.give(off, size)
            self.regions -= 1

    def stats(self) -> dict[str, Any]:
        with self._lock:
            ext = self._extents
            return {"capacity_bytes": self.size, "in_use_bytes": ext.in_use, "high_water_bytes": ext.high_water,
                    "regions": self.regions, "free_extents": len(ext.free), "largest_free_bytes": ext.largest_free,
                    "fallbacks": self.fallbacks, "mapped": self.mapped is not None, "host_memory": self.host_memory,
                    "prefault_ms": self.prefault_ms}
