"""One memory budget across the daemon's models, at the granularity of whole models.

The daemon keeps the sum of its resident models' memory (weights, arenas, shape variants: what each
model's ``memory_bytes`` counts) within ``memory_budget``: when a load or a smaller budget pushes it over,
the least recently used models are unloaded first; a pinned model stays, and so does a model with requests
queued or running, or one being loaded. A model that cannot fit even with every evictable model gone is
not loaded: its requests are answered UNAVAILABLE with the size it needs. Unloaded models load again on
their next request. (Slicing a model to run inside less than its size, and streaming its weights, is
the memory planner's job; this module decides which models stay.)

A discrete GPU has its own budget (``device_memory_budget``, default: the largest device-local heap the device
reports): models placed on Vulkan are planned against it, the others against the host budget, by the same
``plan`` (least recently used first, pinned, busy and the model being admitted kept). A device whose memory is
the host's (an integrated GPU such as a Jetson's, lavapipe) has no budget of its own: the board has one memory,
and its Vulkan models count against the host budget with the others (``device_memory_budget``, where set, caps
them besides).

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


def describe_shortfall(name: str, need: int, budget: int, held: int, device: bool = False) -> str:
    """Why ``name`` is not loaded: what it needs against what the budget (``device``: the GPU's) leaves."""
    if device:
        return (f"model {name!r} needs {need} bytes ({need / 2**20:.1f} MiB) of device memory, measured at its last "
                f"load, but the device memory budget of {budget} bytes ({budget / 2**20:.1f} MiB) leaves "
                f"{max(0, budget - held)} once the pinned and busy models on the device ({held} bytes) are counted; "
                f"the minimum device budget it needs is {held + need} bytes (set device_memory_budget to at least "
                f"that) or unload others")
    return (f"model {name!r} needs {need} bytes ({need / 2**20:.1f} MiB, measured at its last load) but the memory "
            f"budget of {budget} bytes ({budget / 2**20:.1f} MiB) leaves {max(0, budget - held)} once the pinned and "
            f"busy models ({held} bytes) are counted; raise the budget to at least {held + need} bytes "
            f"(`inferctl budget {held + need}`) or unload others")


def on_device(device: str | None, shares_host: bool = False) -> bool:
    """Whether a model placed on ``device`` holds its memory on the GPU, apart from the host's (its own budget
    there): a Vulkan placement on a device whose memory is not the host's (``shares_host``: an integrated GPU,
    lavapipe). CPU and co-executed models (``cpu+vulkan``, whose weights live on both sides) count against the
    host budget."""
    return device == "vulkan" and not shares_host


def device_budget(configured: int, available: int | None) -> int:
    """The device memory budget: the configured one, else what the device reports available (0: unknown,
    no budget), never above what it reports."""
    if available is None or available <= 0:
        return configured
    return available if configured <= 0 else min(configured, available)


#: cgroup v1 reports "no limit" as a page-rounded 2**63 - 1
_V1_UNLIMITED = 1 << 62


def cgroup_memory_limit(proc: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """The memory limit of this process's cgroup: the tighter of v2's ``memory.max`` and ``memory.high``
    (the point where the kernel starts reclaiming), else v1's ``memory.limit_in_bytes``; None when there
    is none or it cannot be read. Read again at every look: systemd and container runtimes change it live."""
    try:
        with open(proc) as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    v2 = next((ln.split("::", 1)[1] for ln in lines if ln.startswith("0::")), None)
    v1 = next((ln.split(":", 2)[2] for ln in lines if ln.split(":", 2)[1:2] == ["memory"]), None)
    found: list[int] = []
    if v2 is not None:
        for base in (root, root + "/unified"):
            for name in ("memory.max", "memory.high"):
                try:
                    with open(f"{base}{v2.rstrip('/')}/{name}") as fh:
                        v = fh.read().strip()
                except OSError:
                    continue
                if v and v != "max" and v.isdigit():
                    found.append(int(v))
    if not found and v1 is not None:
        try:
            with open(f"{root}/memory{v1.rstrip('/')}/memory.limit_in_bytes") as fh:
                v = int(fh.read().strip())
            if v < _V1_UNLIMITED:
                found.append(v)
        except (OSError, ValueError):
            pass
    return min(found) if found else None


def effective_budget(configured: int, cgroup_limit: int | None, overhead: int) -> int:
    """The budget the models get: the configured one (0: none), tightened to what the cgroup leaves once the
    process's own memory beyond its models (interpreter, libraries, driver: ``overhead``) is counted."""
    if cgroup_limit is None:
        return configured
    room = max(1, cgroup_limit - max(0, overhead))
    return room if configured <= 0 else min(configured, room)
