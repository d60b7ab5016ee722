"""First-fit placement in one fixed range of bytes: the free list the daemon's pools share (the host pool's
anonymous mapping, the device pool's ``VkDeviceMemory``).

Why first fit over sorted free extents merged on release: a pool serves a few large requests per cold load
(arenas, weight slabs) and gets them back in any order when models unload; first fit keeps the low addresses
busy and the high ones in one piece, and merging on release keeps the list as short as the holes are few.
Not thread-safe: each pool holds its own lock around these calls.
"""
from __future__ import annotations

import bisect


class Extents:
    """Free extents ``(offset, size)`` of ``[0, capacity)``, sorted by offset, never adjacent."""

    def __init__(self, capacity: int) -> None:
        self.capacity = int(capacity)
        self.free: list[tuple[int, int]] = [(0, self.capacity)] if self.capacity > 0 else []
        self.in_use = 0
        self.high_water = 0

    def take(self, size: int, align: int = 1) -> int | None:
        """The offset (a multiple of ``align``) of ``size`` bytes taken from the first extent that holds them,
        or None. The bytes an alignment skips stay free."""
        size = int(size)
        if size <= 0:
            raise ValueError(f"extent of {size} bytes")
        for i, (off, n) in enumerate(self.free):
            start = -(-off // align) * align
            end = off + n
            if start + size > end:
                continue
            parts = [(off, start - off)] if start > off else []
            if start + size < end:
                parts.append((start + size, end - start - size))
            self.free[i:i + 1] = parts
            self.in_use += size
            self.high_water = max(self.high_water, self.in_use)
            return start
        return None

    def give(self, off: int, size: int) -> None:
        """Return ``size`` bytes at ``off`` (taken earlier) and merge them with their free neighbours."""
        free = self.free
        self.in_use -= size
        i = bisect.bisect_left(free, (off, 0))
        if i > 0 and free[i - 1][0] + free[i - 1][1] == off:  # joins the extent before it
            i -= 1
            off, size = free[i][0], free[i][1] + size
            del free[i]
        if i < len(free) and off + size == free[i][0]:  # and the one after it
            size += free[i][1]
            del free[i]
        free.insert(i, (off, size))

    @property
    def largest_free(self) -> int:
        return max((n for _o, n in self.free), default=0)
