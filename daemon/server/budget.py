"""One memory budget across the daemon's models, at the granularity of whole models.

The daemon keeps the sum of its resident models' memory (weights, arenas, shape variants: what each
model's ``memory_bytes`` counts) within ``memory_budget``: when a load or a smaller budget pushes it over,
the least recently used models are unloaded first; a pinned model stays, and so does a model with requests
queued or running, or one being loaded. A model that cannot fit even with every evictable model gone is
not loaded: its requests are answered UNAVAILABLE with the size it needs. Unloaded models load again on
their next request. (Slicing a model to run inside less than its size, and streaming its weights, is
the memory planner's job; this module decides which models stay.)

``plan`` is pure: the daemon hands it a snapshot and carries out what it returns.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Resident:
    """A loaded model, as the budget sees it."""

    name: str
    nbytes: int
    last_used: float  # monotonic seconds of its last request (or load)
    pinned: bool = False
    busy: bool = False  # requests queued or running, or being loaded: never evicted under them


@dataclass(frozen=True)
class Verdict:
    """What to unload (least recently used first) and, when that is not enough, by how many bytes the
    models that must stay (pinned, busy, ``keep``) plus ``need`` still exceed the budget."""

    evict: tuple[str, ...]
    short_by: int = 0

    @property
    def fits(self) -> bool:
        return self.short_by <= 0


def plan(resident: Sequence[Resident], budget: int, need: int = 0, keep: str | None = None) -> Verdict:
    """The models to unload so that the rest plus ``need`` bytes fit ``budget`` (0: no budget). ``keep``
    (the model being admitted) is never chosen. Fewest evictions in LRU order: the oldest go first and
    eviction stops as soon as the rest fit."""
    if budget <= 0:
        return Verdict(())
    total = need + sum(r.nbytes for r in resident)
    if total <= budget:
        return Verdict(())
    out = []
    for r in sorted(resident, key=lambda r: r.last_used):
        if total <= budget:
            break
        if r.pinned or r.busy or r.name == keep or r.nbytes <= 0:
            continue
        out.append(r.name)
        total -= r.nbytes
    return Verdict(tuple(out), max(0, total - budget))


def describe_shortfall(name: str, need: int, budget: int, held: int) -> str:
    """Why ``name`` is not loaded: what it needs against what the budget leaves."""
    return (f"model {name!r} needs {need} bytes ({need / 2**20:.1f} MiB, measured at its last load) but the memory "
            f"budget of {budget} bytes ({budget / 2**20:.1f} MiB) leaves {max(0, budget - held)} once the pinned and "
            f"busy models ({held} bytes) are counted; raise the budget to at least {held + need} bytes "
            f"(`inferctl budget {held + need}`) or unload others")
