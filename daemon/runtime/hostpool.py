"""The daemon's host memory pool: one anonymous mapping faulted in once, from which cold loads take the memory
they write (streamed weights, transformed weights, activation arenas) and to which it returns when the arrays
using it are gone.

Why: a cold load writes tens of megabytes into memory the kernel has just handed out, and every page of it
faults on first touch. On the 2-core VM the faults of freshly freed memory cost up to 2.4 ms per MB (the host
backs the page again), charged to whichever thread touched it: resnet18's streaming reads spent 60-140 ms of CPU
in them during a 120-250 ms cold load, beside the executor. From memory faulted in once (at the daemon's start,
in the background), the same load took 0.73x the time, mobilenetv2 0.84x, squeezenet1_1 0.89x (alternating in
fresh processes, page cache dropped). On a board without a hypervisor a fault costs less (zeroing the page and the
fault itself, ~0.2 ms per MB) but is paid in the same place.

The pool is memory the daemon holds whether or not a model uses it: its size is a setting (``host_pool``),
reported by ``inferctl status``. An allocation it cannot serve comes from numpy as before.
"""
from __future__ import annotations

import collections
import logging
import mmap
import threading
import time
from typing import Any

import numpy as np

from .. import fileio
from .extents import Extents

log = logging.getLogger("inferd.runtime.hostpool")

#: allocations below this come from numpy: small arrays would fragment the pool for nothing (their pages are
#: few, and malloc reuses them)
MIN_BYTES = 64 << 10
#: the pool hands out whole pages (every alignment a caller asks for, 64 bytes or a 4 KB block, divides it)
PAGE = mmap.PAGESIZE


class HostPool:
    """``capacity`` bytes of anonymous memory; ``alloc`` returns uint8 arrays viewing it (first fit, whole pages),
    given back when the last array viewing them is collected. The mapping lives until the pool and every array
    it handed out are gone."""

    def __init__(self, capacity: int) -> None:
        from .. import native

        if native.ffi is None:
            raise RuntimeError("the host pool needs the native extension (cffi)")
        self._ffi = native.ffi
        self.capacity = max(PAGE, int(capacity) // PAGE * PAGE)
        self._mm = mmap.mmap(-1, self.capacity, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        fileio.advise_huge(self._mm)  # the arenas cut from it in huge pages where the kernel allows
        self._view = np.frombuffer(self._mm, np.uint8)
        self.base = int(self._view.ctypes.data)
        self._lock = threading.Lock()
        self._extents = Extents(self.capacity)
        # releases arrive from finalizers, which may run inside ``alloc`` (a collection while it holds the lock):
        # they only queue here, and the lock's holder folds them in
        self._released: collections.deque[tuple[int, int]] = collections.deque()
        self.fallbacks = 0
        self.prefaulted = 0
        self._prefault_thread: threading.Thread | None = None

    # ------------------------------------------------------------------ faulting in
    def prefault(self, background: bool = True) -> None:
        """Fault every page in for writing (``MADV_POPULATE_WRITE`` where the kernel has it, else a write per
        page), in steps; on a thread of its own unless ``background`` is False. Without the madvise it runs here,
        before anything is allocated: a write per page beside a caller's writes could undo them."""
        from .pagecache import can_populate

        if background and can_populate():
            t = threading.Thread(target=self._prefault, name="inferd-hostpool", daemon=True)
            self._prefault_thread = t
            t.start()
        else:
            self._prefault()

    def _prefault(self) -> None:
        from .pagecache import can_populate, populate_steps

        t0 = time.perf_counter()
        if not can_populate():
            self._view[::PAGE] = 0  # (only before any allocation: see prefault)
            self.prefaulted = self.capacity
        elif not populate_steps(self._view, progress=lambda n: setattr(self, "prefaulted", n)):
            # the rest faults on first use; writing it in instead could undo what a caller already wrote there
            log.warning("host pool: faulting in stopped at %d MiB (madvise failed)", self.prefaulted >> 20)
            return
        log.info("host pool: %d MiB faulted in in %.0f ms", self.capacity >> 20, (time.perf_counter() - t0) * 1e3)

    def wait_prefaulted(self, timeout: float | None = None) -> bool:
        t = self._prefault_thread
        if t is not None:
            t.join(timeout)
            return not t.is_alive()
        return self.prefaulted >= self.capacity

    # ------------------------------------------------------------------ allocation
    def alloc(self, nbytes: int) -> np.ndarray | None:
        """A uint8 array of ``nbytes`` starting on a page, or None when no free extent holds it."""
        size = max(PAGE, -(-int(nbytes) // PAGE) * PAGE)
        with self._lock:
            self._fold_released()
            off = self._extents.take(size)
            if off is None:
                self.fallbacks += 1
                return None
        ffi = self._ffi
        owner = ffi.gc(ffi.cast("char *", self.base + off), self._finalizer(off, size), size=size)
        return np.frombuffer(ffi.buffer(owner, size), np.uint8)[:nbytes]

    def _finalizer(self, off: int, size: int) -> Any:
        released = self._released
        # the block's owner keeps the mapping: an array must never outlive the memory it views. A pool dropped
        # while its arrays lived (a test's pool; a kernel workspace a thread keeps across models) was unmapped
        # under them, and the next kernel to use one segfaulted (the suite's rare worker crash, 2026-12)
        mm = self._mm

        def release(_cdata: Any, _mapping: mmap.mmap = mm) -> None:
            released.append((off, size))

        return release

    def _fold_released(self) -> None:
        """Merge queued releases into the free list (caller holds the lock)."""
        while self._released:
            self._extents.give(*self._released.popleft())

    def stats(self) -> dict[str, int]:
        with self._lock:
            self._fold_released()
            ext = self._extents
            return {"capacity_bytes": self.capacity, "in_use_bytes": ext.in_use, "high_water_bytes": ext.high_water,
                    "free_extents": len(ext.free), "largest_free_bytes": ext.largest_free,
                    "fallbacks": self.fallbacks, "prefaulted_bytes": self.prefaulted}


_pool: HostPool | None = None
_pool_lock = threading.Lock()


#: the pool takes at most this share of the machine's RAM, whatever the setting says
RAM_SHARE = 8


def install(capacity: int, background: bool = True) -> HostPool | None:
    """Give the process a host pool of ``capacity`` bytes (at most 1/RAM_SHARE of the RAM; 0: none) and fault it
    in. Once per process: a later call returns the pool there is (arrays may view it, so it is never unmapped)."""
    global _pool
    try:
        import psutil

        capacity = min(int(capacity), int(psutil.virtual_memory().total) // RAM_SHARE)
    except Exception:  # psutil missing or unreadable: the setting as it is
        pass
    with _pool_lock:
        if _pool is not None or capacity <= 0:
            return _pool
        try:
            pool = HostPool(capacity)
        except (RuntimeError, OSError, ValueError) as e:
            log.warning("no host pool (%s): cold loads allocate as they go", e)
            return None
        pool.prefault(background)
        _pool = pool
        fileio.pool_alloc = alloc
        return pool


def current() -> HostPool | None:
    return _pool


def faulted_in(a: np.ndarray) -> bool:
    """Whether ``a``'s memory is the pool's and already faulted in (a prefault of it would only walk its pages)."""
    pool = _pool
    if pool is None or a.nbytes == 0:
        return False
    start = int(a.__array_interface__["data"][0]) - pool.base
    return 0 <= start and start + a.nbytes <= pool.prefaulted


def fault_in(a: np.ndarray) -> None:
    """Fault ``a``'s pages in for writing, off the thread that will use it, where the pool has not already done
    so: with ``MADV_POPULATE_WRITE`` where the kernel has it (leaving its bytes as they are: safe beside a run
    already using it, so a failed madvise leaves the pages to fault on use), else by writing zeros."""
    from .pagecache import can_populate, populate

    if faulted_in(a):
        return
    if can_populate():
        populate(a)
    else:
        a.fill(0)


def alloc(nbytes: int) -> np.ndarray | None:
    """From the process's pool where there is one and ``nbytes`` is worth it; else None (the caller allocates)."""
    pool = _pool
    if pool is None or nbytes < MIN_BYTES:
        return None
    return pool.alloc(nbytes)
