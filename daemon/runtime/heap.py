"""Giving the heap's freed memory back to the system after the events that free a lot of it.

Why: glibc's ``free`` keeps what it frees for the process's next allocations; only the top of the main heap
goes back on its own, and every loader and worker thread allocates from a heap (an arena) of its own. A cold
load's buffers, a warm switch's replaced weights, a compile's profiling runs and a closed model's leftovers all
stayed in the RSS for the life of the daemon. A daemon serving four zoo models (2-core VM, its 256 MiB host pool)
held 125-170 MiB more on the CPU after its first start, which compiled them, 55 MiB more after a start from
their packages and 150-160 MiB more on lavapipe after a first start than with the trims
(``bench/results/2026-12-05v_heap_trim_zen4.md``); a trim took 2-13 ms the first time, under 1 ms later. On a
board the budget is what is left beside the RSS.

So after a cold load settles (its warm switch done) and after a model is closed (unloaded, evicted) a trim is
scheduled on the idle worker once the foreground is quiet, as the other after-answer work; scheduled trims
coalesce: one is queued at a time. A compile trims at once on its own thread (``package._compile_into``): a
daemon's first start compiles its models one after another, and each compile's leftovers had raised the next one's
peak (lavapipe, four zoo models: 970-982 MiB, 787-797 with these trims). ``ctypes`` releases the GIL for the
call; other threads' allocations wait only for the arena being trimmed. Off by default in a library process (the
host application owns its heap); the daemon turns it on (``heap_trim``). A C library without ``malloc_trim``
(musl): nothing is done.
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from typing import Any, Callable

log = logging.getLogger("inferd.runtime.heap")

_lock = threading.Lock()
_enabled = False
_pending = False
_fn: Callable[[int], int] | None | bool = False  # False: not looked up yet; None: the C library has none
_stats: dict[str, Any] = {"trims": 0, "released_bytes": 0, "last_released_bytes": 0, "last_ms": 0.0, "last_reason": ""}


def configure(enabled: bool) -> bool:
    """Turn the scheduled trims on or off; returns whether they can happen (on, and the C library has them)."""
    global _enabled
    _enabled = bool(enabled)
    return _enabled and _malloc_trim() is not None


def enabled() -> bool:
    return _enabled


def _malloc_trim() -> Callable[[int], int] | None:
    global _fn
    if _fn is False:
        try:
            f = ctypes.CDLL(None).malloc_trim  # the process's C library (glibc has it, musl does not)
            f.argtypes = [ctypes.c_size_t]
            f.restype = ctypes.c_int
            _fn = f
        except (AttributeError, OSError):
            _fn = None
    return _fn if _fn is not False else None  # type: ignore[return-value]


def process_rss() -> int:
    """This process's resident set in bytes: ``/proc/self/statm``, else psutil; 0 when neither answers."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:
        return 0


def trim(reason: str = "") -> int | None:
    """Give the heap's free memory back now; returns the RSS bytes that went (None: no ``malloc_trim`` here)."""
    f = _malloc_trim()
    if f is None:
        return None
    before = process_rss()
    t0 = time.perf_counter()
    f(0)
    ms = (time.perf_counter() - t0) * 1e3
    released = max(0, before - process_rss())
    with _lock:
        _stats["trims"] += 1
        _stats["released_bytes"] += released
        _stats["last_released_bytes"] = released
        _stats["last_ms"] = round(ms, 3)
        _stats["last_reason"] = reason
    if released >= 8 << 20:
        log.info("gave %.1f MiB of freed heap back to the system after %s (%.1f ms)", released / 2**20,
                 reason or "a trim", ms)
    return released


def schedule(reason: str) -> threading.Event | None:
    """A trim on the idle worker once the answer under way is out (``cold.after_answer``), unless trims are off or
    one is already queued (it will see this one's free memory too). Returns the queued trim's event, or None."""
    global _pending
    if not _enabled or _malloc_trim() is None:
        return None
    with _lock:
        if _pending:
            return None
        _pending = True

    def job() -> None:
        global _pending
        with _lock:
            _pending = False
        trim(reason)

    from .cold import after_answer

    return after_answer(job)


def stats() -> dict[str, Any]:
    """What trims have given back so far (``inferctl status --json``: ``memory.heap``)."""
    with _lock:
        return {"enabled": _enabled and _malloc_trim() is not None, **_stats}
