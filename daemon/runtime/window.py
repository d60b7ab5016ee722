"""The cold window: process-wide interpreter settings held from a package's opening to its first answer.

Two interpreter defaults sit on a cold load's critical path, both measured on the 2-core machine:

* the cyclic garbage collector: opening a package allocates tens of thousands of small objects (the
  plan, the graph, the index), and in a fresh library process that set off a full collection over
  every imported module's objects in the middle of the load (17.5 ms for squeezenet1_1 and resnet18,
  against a 31 ms cold). The daemon ``gc.freeze()``-es its start-up heap, a library process does not;
  pausing the collector for the window moves that collection after the answer, where it costs nobody.
* the GIL switch interval (5 ms): a loader, the streaming-read worker and the executor hand the GIL to
  one another at every Python step between their native calls; a thread that wants it waits up to
  the interval for a thread running Python to let go (the streaming read started 2.7 ms after it was
  submitted). A short interval for the window lets them interleave as the plan assumes.

Holds nest (several cold loads at once); the last release puts the process's own settings back. A hold
that nobody releases (a model loaded and never run nor closed) lapses after ``MAX_HOLD_S``: any later
hold or release, and the loader pool's idle workers, check the deadlines.
"""
from __future__ import annotations

import gc
import sys
import threading
import time

#: the switch interval inside the window: short enough that a waiting thread gets the GIL within a
#: fraction of a layer's time, long enough that two threads running Python do not thrash it
SWITCH_INTERVAL_S = 0.0005
#: a hold lapses after this long: a cold load that takes longer is not held up by a collection's ms
MAX_HOLD_S = 5.0

_lock = threading.Lock()
_holds: dict[int, float] = {}  # hold id -> deadline (monotonic)
_next_id = 0
_saved: tuple[bool, float] | None = None  # (gc enabled, switch interval) before the first hold


class Hold:
    """One cold load's share of the window; ``release`` is idempotent."""

    __slots__ = ("_id",)

    def __init__(self, hid: int) -> None:
        self._id = hid

    def release(self) -> None:
        with _lock:
            _holds.pop(self._id, None)
            _expire_locked()

    @property
    def held(self) -> bool:
        return self._id in _holds


def hold(max_s: float = MAX_HOLD_S) -> Hold:
    """Enter the window (pausing the cyclic GC, shortening the switch interval) until ``release``."""
    global _next_id, _saved
    with _lock:
        _expire_locked()
        if not _holds:
            _saved = (gc.isenabled(), sys.getswitchinterval())
            gc.disable()
            sys.setswitchinterval(min(SWITCH_INTERVAL_S, _saved[1]))
        _next_id += 1
        _holds[_next_id] = time.monotonic() + max_s
        return Hold(_next_id)


def expire() -> None:
    """Drop holds past their deadline (and leave the window when none is left)."""
    with _lock:
        _expire_locked()


def active() -> bool:
    with _lock:
        return bool(_holds)


def _expire_locked() -> None:
    global _saved
    now = time.monotonic()
    for hid in [h for h, d in _holds.items() if d <= now]:
        del _holds[hid]
    if not _holds and _saved is not None:
        enabled, interval = _saved
        _saved = None
        sys.setswitchinterval(interval)
        if enabled:
            gc.enable()
