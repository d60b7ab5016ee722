"""Models served inside a share of the daemon's memory budget by the streaming runtime (``memory = "stream"``
in a model's config.toml).

Such a model holds one arena of its share and re-reads the weights that do not fit from its streaming
store on every request (``runtime.stream``). When the budget changes (``set_budget``, the cgroup's
``memory.max``/``memory.high`` read again at every look, a config reload) the daemon gives each streamed
model its new share: the memory plan is made again (slicing kept), and the arena swapped between requests
(never under one); a share below what its slicing needs has it sliced again (``reslice``) while it serves.
Importing the ONNX file and writing the store is the one step outside the budget; the log says so.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterable

from ..planner.flex import BudgetTooSmall
from ..runtime.model import Model
from ..runtime.stream import StreamingExecutor

log = logging.getLogger("inferd.server")

#: the share given to a streamed model when the daemon has no budget: nothing streamed
UNLIMITED = 1 << 50


class StreamedModel(Model):
    """A ``Model`` over a ``StreamingExecutor``: ``set_budget`` re-plans it for a new share."""

    streamed = True
    #: the budget its slicing was chosen for (0: none: unsliced, which fits any share down to its minimum)
    compiled_for = 0

    @property
    def executor(self) -> StreamingExecutor:
        return self._exec

    def set_budget(self, nbytes: int) -> dict[str, float]:
        return self._exec.set_budget(nbytes, wait=False)

    @property
    def budget(self) -> int:
        return int(self._exec.budget)

    def min_budget(self) -> int:
        """The smallest share this model's slicing runs in (computed once: the slicing does not change)."""
        if getattr(self, "_min", None) is None:
            self._min = int(self._exec.min_budget())
        return int(self._min)

    @property
    def memory_breakdown(self) -> dict[str, int]:
        return dict(self._exec.memory_breakdown)


#: where a model streamed on the GPU is placed: its arena is host memory (the loaders read into it), so it counts
#: against the host budget wherever the GPU's own memory is (``budget.on_device`` is false for it)
VULKAN_STREAM = "vulkan-stream"


def load_streamed(path: str | os.PathLike, budget: int, work: str | os.PathLike, name: str | None = None,
                  batch: int = 1, device: str = "cpu", **kw: Any) -> StreamedModel:
    """``path`` compiled for the streaming runtime in a child process (outside the budget: the whole model),
    then run here inside ``budget`` bytes (0: no budget), on the CPU or (``device`` "vulkan") the process's
    Vulkan device. ``BudgetTooSmall`` names the size it needs."""
    from ..runtime.stream_compile import compile_streamed, open_streamed

    t0 = time.perf_counter()
    mname = name or Path(path).stem
    facts = None
    if device == "vulkan":
        from ..vulkan.device import get_device
        from ..vulkan.stream import device_facts

        kw["device"] = dev = get_device()
        facts = device_facts(dev)  # the child compiles for this device without opening one
    log.info("model %s: compiling %s for streaming%s in a child process, outside the memory budget", mname, path,
             " on the GPU" if facts else "")
    skel = compile_streamed(path, budget, work, batch=batch, vulkan=facts)
    ex = open_streamed(skel, budget, **kw)
    m = StreamedModel(mname, ex.graph, ex, VULKAN_STREAM if facts else "cpu", time.perf_counter() - t0)
    m.compiled_for = int(budget)
    log.info("model %s: streamed within %d bytes (arena %d, %d bytes read per request, configuration %s)",
             mname, ex.budget, ex.arena.nbytes, ex.streamed_bytes, getattr(ex, "config", None))
    return m


def shares(streamed: Iterable[tuple[str, int]], room: int) -> dict[str, int]:
    """Split ``room`` bytes among streamed models (name, minimum budget of its current slicing): each its
    minimum and the rest in proportion to the minimums; below their sum, parts in that proportion (the models
    are sliced again for them). ``room`` <= 0: no budget (each unlimited)."""
    items = list(streamed)
    if room <= 0:
        return {n: UNLIMITED for n, _ in items}
    total = sum(m for _, m in items) or 1
    if room < total:  # below the current slicings' minimums: each its part, and those parts slice again
        return {n: room * m // total for n, m in items}
    return {n: m + (room - total) * m // total for n, m in items}


def rebudget(slots: Iterable[Any], limit: int) -> None:
    """Give every loaded streamed model its share of ``limit`` (0: none) beside the other models' bytes."""
    slots = list(slots)
    stream = [s for s in slots if getattr(s.model, "streamed", False)]
    if not stream:
        return
    others = sum(s.resident_bytes() for s in slots if s.model is not None and s not in stream)
    room = limit - others if limit > 0 else 0
    mins = {s.name: s.model.min_budget() for s in stream}
    want = shares(mins.items(), room)
    if 0 < room < sum(mins.values()):  # below the current slicings: each is sliced again for its part
        log.warning("the memory budget leaves %d bytes for the streamed models, whose slicings need at least %d "
                    "bytes (%s)", room, sum(mins.values()),
                    ", ".join(f"{n} needs at least {m}" for n, m in mins.items()))
    for s in stream:
        share = want[s.name]
        if share == s.model.budget or (room <= 0 and s.model.budget >= UNLIMITED):
            continue
        try:
            r = s.model.set_budget(share)
        except BudgetTooSmall as e:
            # this slicing does not fit the share: slice again for the room there is now (the model serves on its
            # current plan meanwhile); once per share, not at every budget look
            if s.resliced_for != share:
                s.resliced_for = share
                log.warning("model %s: %s; slicing it again for %d bytes", s.name, e, share)
                reslice(s)
            continue
        log.info("model %s: memory re-planned for a share of %d bytes", s.name, share)
        if r.get("streams") and s.model.compiled_for <= 0 < share < UNLIMITED and not s.sliced_for_budget:
            # loaded with no budget, so unsliced; now its weights stream: a slicing chosen for a budget (its
            # heaviest layers sliced where the plan then runs faster) serves it better, once
            s.sliced_for_budget = True
            log.info("model %s: compiled without a memory budget, it now reads weights on every run within %d "
                     "bytes; slicing it for a budget", s.name, share)
            reslice(s)


def reslice(slot: Any) -> None:
    """Slice ``slot``'s streamed model again for the room the budget leaves it now. The compile (a child process:
    seconds) runs on a thread of its own while the model serves on its current plan; the slot's worker swaps the
    new one in between two requests (on the worker, the compile held every request of the model behind it). One
    at a time per model; a failure leaves the current one serving."""
    if slot.reslicing:
        return
    slot.reslicing = True

    def work() -> None:
        t0 = time.perf_counter()
        try:
            model, note = slot.load_model()
        except Exception as e:  # the model serves on as it is; the next budget change tries again
            log.warning("model %s: slicing it again failed, serving on its current plan: %s: %s", slot.name,
                        type(e).__name__, e)
        else:
            if not slot.swap_in(model, note, time.perf_counter() - t0):
                model.close()
        finally:
            slot.reslicing = False

    threading.Thread(target=work, name=f"inferd-reslice-{slot.name}", daemon=True).start()


def load_for_slot(server: Any, slot: Any, path: str, batch: int, device: str = "cpu") -> StreamedModel:
    """The daemon's load of a streamed model: the other streamed models shrink to their minimum, this one
    gets what the budget leaves beside them and the whole models; the next budget look re-splits the room."""
    limit = server.budget_now()
    others = [s for s in server.slots.values() if s is not slot and s.model is not None]
    room = 0
    if limit > 0:
        held = 0
        for s in others:
            if getattr(s.model, "streamed", False):
                m = s.model.min_budget()
                try:
                    s.model.set_budget(m)
                except BudgetTooSmall:
                    m = s.model.budget
                held += m
            else:
                held += s.resident_bytes()
        room = max(1, limit - held)
    # beside the package cache, not in it (its eviction would take the stores)
    work = Path(server.config.cache_dir) / "stream"
    return load_streamed(path, room, work, name=slot.name, batch=batch, device=device)


def need_bytes(slot: Any) -> int:
    """What the budget must leave ``slot``: a streamed model shrinks to its minimum, a whole one holds
    what it measured (0: not loaded)."""
    m = slot.model
    if m is not None and getattr(m, "streamed", False):
        slot.stream_min = m.min_budget()
        return int(slot.stream_min)
    return int(slot.resident_bytes())


def admit_need(slot: Any) -> int:
    """The bytes an on-demand load of ``slot`` needs: a streamed model's minimum as at its last load
    (unknown the first time: 0), else its measured size."""
    if slot.entry.config.memory == "stream":
        return int(getattr(slot, "stream_min", 0) or 0)
    return int(slot.known_bytes)
