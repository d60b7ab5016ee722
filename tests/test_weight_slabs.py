"""Weight slabs (``inferd.vulkan.slabs``): where layers' weights are placed in a few device allocations, with a
stand-in device that only counts allocations (no GPU needed)."""
from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from inferd.vulkan.kernel import ALIGN, align_up
from inferd.vulkan.slabs import WeightSlabs

MiB = 1 << 20


@dataclass(eq=False)
class _Region:
    size: int
    label: str


class _Dev:
    def __init__(self) -> None:
        self.live: list[_Region] = []
        self.made = 0

    def allocate_region(self, size: int, label: str) -> _Region:
        r = _Region(int(size), label)
        self.live.append(r)
        self.made += 1
        return r

    def free_region(self, r: _Region) -> None:
        self.live.remove(r)


def _held(dev: _Dev) -> int:
    return sum(r.size for r in dev.live)


def test_a_late_large_layer_fills_the_first_slab_instead_of_an_allocation_of_its_own() -> None:
    # squeezenet1_1's shape on lavapipe: 10 MiB expected, small layers first, then two large ones whose size
    # exceeds half of what is still expected (they went to allocations of their own: 14.3 MiB for 10.0)
    dev = _Dev()
    sizes = [MiB // 64] * 64 + [int(2.25 * MiB), int(1.97 * MiB)]
    expected = sum(align_up(s, ALIGN) for s in sizes)
    s = WeightSlabs(dev, expected)
    got = [s.take(n, f"l{i}") for i, n in enumerate(sizes)]
    s.close()
    assert len(dev.live) == 1 and _held(dev) <= align_up(expected, 1 << 16)
    spans = sorted((off, off + align_up(n, ALIGN)) for (_r, off), n in zip(got, sizes))
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # no two layers share a byte


def test_released_ranges_are_taken_again_and_an_emptied_slab_goes() -> None:
    dev = _Dev()
    s = WeightSlabs(dev, 4 * MiB)
    old = [s.take(MiB, f"a{i}") for i in range(4)]
    s.close()
    assert dev.made == 1 and _held(dev) == 4 * MiB
    # a warm switch, layer by layer: the new weights first, then the old range given back
    new = []
    for i, (r, off) in enumerate(old):
        new.append(s.take(MiB, f"w{i}"))
        s.give(r, off, MiB)
    # the first new layer found no room (a range of its own); each later one took the hole its predecessor
    # left, where each would have had an allocation of its own (8 MiB held at the end of the switch)
    assert dev.made == 2 and _held(dev) == 5 * MiB
    assert [r is old[0][0] for r, _ in new] == [False, True, True, True]
    # an allocation goes with the last range placed in it
    for r, off in new:
        s.give(r, off, MiB)
    assert dev.live == []


def test_random_takes_and_gives_never_overlap_and_free_every_allocation_at_the_end() -> None:
    rng = random.Random(7)
    dev = _Dev()
    s = WeightSlabs(dev, 8 * MiB)
    live: dict[int, tuple[_Region, int, int]] = {}
    for step in range(600):
        if live and rng.random() < 0.45:
            k = rng.choice(list(live))
            r, off, n = live.pop(k)
            s.give(r, off, n)
        else:
            n = rng.choice([256, 4000, 70_000, MiB // 3, 3 * MiB])
            r, off = s.take(n, f"l{step}")
            assert off % ALIGN == 0 and off + n <= r.size
            live[step] = (r, off, n)
        by: dict[int, list[tuple[int, int]]] = {}
        for r, off, n in live.values():
            by.setdefault(id(r), []).append((off, off + align_up(n, ALIGN)))
        for spans in by.values():
            spans.sort()
            assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
        assert all(any(r is q for q in dev.live) for r, _o, _n in live.values())
    s.close()
    for r, off, n in list(live.values()):
        s.give(r, off, n)
    assert dev.live == []


@pytest.mark.parametrize("size", [MiB, 40 * MiB])
def test_a_range_given_without_its_place_still_frees_its_allocation(size: int) -> None:
    # (the older call, give(region) alone: the range is not reused, the allocation still goes with its last layer)
    dev = _Dev()
    s = WeightSlabs(dev, size)
    r, _off = s.take(size, "only")
    s.close()
    s.give(r)
    assert dev.live == []
