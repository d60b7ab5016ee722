"""Memory pressure (PSI) as a source of budget changes.

The kernel's pressure stall information says when tasks wait on memory (reclaim, refaults, swap-in)
before the cgroup's limit is reached or an OOM kill happens. A PSI *trigger* (``some <stall us> <window us>``
written to ``memory.pressure``) makes the file poll ``POLLPRI`` whenever tasks stalled that long within
the window: the daemon watches its own cgroup's file (else the system-wide ``/proc/pressure/memory``) in
one thread and, on an event, caps the models' budget (where one is in force) below what they hold now, through the same path
as ``set_budget`` (streamed models re-plan into less, LRU models are evicted). While no event comes the
cap relaxes step by step until it no longer binds. Triggers need a kernel with PSI (4.20+) and, before
6.4, privileges for a window under 2 s or for the system-wide file; where writing one is refused the
daemon logs why once and runs without it (the cgroup's ``memory.max``/``memory.high`` are still read).

``PressureCap`` is pure bookkeeping (times passed in); ``PressureWatcher`` is the thread.
"""
from __future__ import annotations

import logging
import os
import select
import threading
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)

#: a trigger fires when tasks stalled on memory for STALL_US within WINDOW_US (2 s: the shortest window an
#: unprivileged process may ask for)
STALL_US = 150_000
WINDOW_US = 2_000_000


def pressure_path(proc: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup",
                  system: str = "/proc/pressure/memory") -> Path | None:
    """This process's cgroup v2 ``memory.pressure``, else the system-wide file, else None."""
    try:
        with open(proc) as fh:
            lines = fh.read().splitlines()
    except OSError:
        lines = []
    v2 = next((ln.split("::", 1)[1] for ln in lines if ln.startswith("0::")), None)
    if v2 is not None:
        p = Path(f"{root}{v2.rstrip('/')}/memory.pressure")
        if p.is_file():
            return p
    p = Path(system)
    return p if p.is_file() else None


def open_trigger(path: Path | str, stall_us: int = STALL_US, window_us: int = WINDOW_US) -> tuple[int | None, str]:
    """A PSI trigger fd on ``path`` (poll it for ``POLLPRI``), or None and why it could not be set."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    except OSError as e:
        return None, f"cannot open {path}: {e.strerror or e}"
    try:
        os.write(fd, f"some {int(stall_us)} {int(window_us)}\0".encode())
    except OSError as e:
        os.close(fd)
        return None, f"a trigger on {path} was refused: {e.strerror or e}"
    return fd, ""


class PressureCap:
    """The budget cap pressure events impose. An event caps the models at ``shrink`` times what they hold
    then (or the cap already in force, if lower), never below ``floor``; each ``quiet_s`` without an event
    raises the cap by ``grow``; once it exceeds ``ceiling`` (the budget without it) it is dropped."""

    def __init__(self, shrink: float = 0.8, grow: float = 1.25, quiet_s: float = 30.0, floor: int = 1 << 20) -> None:
        if not 0 < shrink < 1 or grow <= 1 or quiet_s <= 0:
            raise ValueError("PressureCap needs 0 < shrink < 1, grow > 1 and quiet_s > 0")
        self.shrink, self.grow, self.quiet_s, self.floor = shrink, grow, quiet_s, floor
        self.cap: int | None = None
        self.since = 0.0  # when the cap last changed
        self.events = 0

    def event(self, now: float, held: int) -> int:
        """A pressure event at ``now`` while the models hold ``held`` bytes: the new cap."""
        want = max(self.floor, int(held * self.shrink))
        self.cap = want if self.cap is None else min(self.cap, want)
        self.since = now
        self.events += 1
        return self.cap

    def current(self, now: float, ceiling: int = 0) -> int | None:
        """The cap at ``now`` (None: none), relaxed for every quiet period since it last changed; dropped once
        above ``ceiling`` (0: no ceiling; then it is dropped after it has grown past 8 times the floor)."""
        if self.cap is None:
            return None
        while now - self.since >= self.quiet_s:
            self.cap = int(self.cap * self.grow)
            self.since += self.quiet_s
            if (ceiling > 0 and self.cap >= ceiling) or (ceiling <= 0 and self.cap >= 8 * self.floor
                                                          and now - self.since >= self.quiet_s * 8):
                self.cap = None
                return None
        return self.cap


def apply_cap(limit: int, cap: int | None) -> int:
    """``limit`` tightened to ``cap``. A daemon without any budget (0: none configured, no cgroup limit) keeps
    none: pressure shrinks a budget that is in force, it does not impose one the operator did not ask for."""
    if cap is None or limit <= 0:
        return limit
    return min(limit, cap)


class PressureWatcher:
    """One thread polling a trigger fd for ``POLLPRI``; ``on_event`` runs in that thread (keep it short: set
    a flag and wake the main loop). ``stop`` ends it. The fd is closed when the thread ends."""

    def __init__(self, fd: int, on_event: Callable[[], None], name: str = "inferd-psi", min_gap_s: float = 1.0) -> None:
        self.fd = fd
        self.on_event = on_event
        #: after an event the next is not looked at for this long: a trigger fires at most once a window
        #: anyway, and a source that stays raised (or a storm) must not spin the thread
        self.min_gap_s = min_gap_s
        self._r, self._w = os.pipe()
        self.events = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        p = select.poll()
        p.register(self.fd, select.POLLPRI)
        p.register(self._r, select.POLLIN)
        gap = select.poll()
        gap.register(self._r, select.POLLIN)
        try:
            while True:
                for fd, ev in p.poll():
                    if fd == self._r:
                        return
                    if ev & (select.POLLERR | select.POLLNVAL | select.POLLHUP):
                        log.warning("memory pressure trigger gone (its cgroup removed?): no longer watched")
                        return
                    if ev & select.POLLPRI:
                        self.events += 1
                        try:
                            self.on_event()
                        except Exception:  # the watcher outlives a failing callback
                            log.exception("memory pressure callback failed")
                        if gap.poll(int(self.min_gap_s * 1000)):
                            return  # stopped meanwhile
        finally:
            os.close(self.fd)
            os.close(self._r)

    def stop(self, timeout: float = 2.0) -> None:
        try:
            os.write(self._w, b"x")
        except OSError:
            pass
        self._thread.join(timeout)
        os.close(self._w)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


def start(on_event: Callable[[], None], path: Path | str | None = None, stall_us: int = STALL_US,
          window_us: int = WINDOW_US) -> tuple[PressureWatcher | None, str]:
    """Watch ``path`` (default: ``pressure_path()``); None and the reason when PSI is absent or not permitted."""
    p = Path(path) if path is not None else pressure_path()
    if p is None:
        return None, "no memory.pressure file (a kernel without PSI, or no cgroup v2)"
    fd, why = open_trigger(p, stall_us, window_us)
    if fd is None:
        return None, why
    return PressureWatcher(fd, on_event), str(p)
