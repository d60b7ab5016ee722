"""Layers' weights carved out of a few large device allocations.

Why: a cold load used to make one ``vkAllocateMemory`` + ``vkMapMemory`` per layer, from every loader
thread at once. On the H100 (host-visible device-local memory through the BAR) those calls take about
a millisecond each and the driver serialises them: a sampling profile of a mobilenetv2 cold load put a
quarter of the loader threads' time there. Here a layer takes a 256-byte-aligned range of the current
slab; a slab is sized from what the model's weights are expected to need, so few allocations are made
and little is left over. A layer takes the first free range that holds it in any slab held (first fit over
each slab's free extents, ``runtime.extents``); only a layer that fits nowhere opens a new slab, or, when its
weights exceed half of a new slab, gets an allocation of its own. Why first fit over every slab, where each
layer used to go to the newest slab or to an allocation of its own: slabs are sized from what is still
expected, so the new-slab size shrinks as the load goes on, and a large late layer (taken out of order by
the loader threads) went to an allocation of its own while the first slab still had room for it: squeezenet1_1
held 14.3 MiB of allocations for 10.0 MiB of weights. A released layer's range is free again for the next
(a warm kernel switch releases the old kernel's weights layer by layer: the next layer's warm weights can
take that hole instead of a new slab).

A slab is freed when the last layer placed in it is released (another input shape of the model may still
bind a layer's range after its own backend closed: the holders count, not the backend), unless it is the
newest one while the load may still place layers.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ..runtime.extents import Extents
from .kernel import ALIGN, align_up

if TYPE_CHECKING:
    from .device import Region, VulkanDevice

MIN_SLAB = 1 << 20
MAX_SLAB = 64 << 20


class WeightSlabs:
    def __init__(self, dev: "VulkanDevice", expected: int, label: str = "weights") -> None:
        """``expected``: the bytes the model's weights should take in all (an estimate: the planner's
        kernel choice and a warm switch change it); slabs follow it down, between 1 and 64 MiB."""
        self.dev = dev
        self.label = label
        self._lock = threading.Lock()
        self._left = max(0, int(expected))
        self._open: "Region | None" = None  # the newest slab: kept while empty, until close()
        self._refs: dict[int, int] = {}
        self._regions: dict[int, "Region"] = {}
        self._free: dict[int, Extents] = {}  # each slab's free ranges (allocations of one layer have none)

    def take(self, size: int, label: str) -> tuple["Region", int]:
        """A range of ``size`` bytes: (region, offset)."""
        size = align_up(max(int(size), 4), ALIGN)
        with self._lock:
            self._left = max(0, self._left - size)
            for k, ext in self._free.items():  # the slabs in the order they were made
                off = ext.take(size, ALIGN)
                if off is not None:
                    self._refs[k] += 1
                    return self._regions[k], off
            slab = self._slab_size(size)
            if size > slab // 2:
                r = self.dev.allocate_region(size, f"{self.label}:{label}")
                self._hold(r, 1)
                return r, 0
            self._retire_open()
            r = self._open = self.dev.allocate_region(slab, f"{self.label}:slab{len(self._free)}")
            self._hold(r, 1)
            ext = self._free[id(r)] = Extents(r.size)
            return r, int(ext.take(size, ALIGN))  # (the first range of an empty slab: offset 0)

    def give(self, region: "Region", offset: int | None = None, size: int | None = None) -> None:
        """Release the range of ``size`` bytes at ``offset`` of ``region`` (as ``take`` gave it: a slab's range
        is free for the next layer only when both are given); the allocation goes when nothing placed in it is
        held and it is not the newest slab of a load still placing layers."""
        with self._lock:
            k = id(region)
            if k not in self._refs:
                return
            ext = self._free.get(k)
            if ext is not None and offset is not None and size is not None:
                ext.give(int(offset), align_up(max(int(size), 4), ALIGN))
            self._refs[k] -= 1
            if self._refs[k] <= 0 and region is not self._open:
                self._drop(region)

    def has_earlier_room(self, region: "Region", size: int) -> bool:
        """Whether a slab made before ``region`` (any slab, for an allocation of one layer) has a free range of
        ``size`` bytes: where ``take`` would now place a range held in ``region``."""
        size = align_up(max(int(size), 4), ALIGN)
        with self._lock:
            for k, ext in self._free.items():
                if k == id(region):
                    return False
                if ext.largest_free >= size:  # (every free range starts ALIGN-aligned: all sizes are multiples)
                    return True
            return False

    def close(self) -> None:
        """No more ranges will be taken: the slab being filled goes if nothing is placed in it."""
        with self._lock:
            self._retire_open()

    @property
    def regions(self) -> list["Region"]:
        """The allocations held now (each counted once, whatever number of layers it holds)."""
        with self._lock:
            return list(self._regions.values())

    def _slab_size(self, size: int) -> int:
        """A new slab's size: what is still expected, the range asked for included, within the bounds."""
        return max(MIN_SLAB, min(MAX_SLAB, align_up(self._left + size, 1 << 16)))

    def _hold(self, r: "Region", n: int) -> None:
        self._refs[id(r)] = n
        self._regions[id(r)] = r

    def _retire_open(self) -> None:
        r = self._open
        self._open = None
        if r is not None and self._refs.get(id(r), 0) <= 0:
            self._drop(r)

    def _drop(self, r: "Region") -> None:
        self._refs.pop(id(r), None)
        self._regions.pop(id(r), None)
        self._free.pop(id(r), None)
        self.dev.free_region(r)
