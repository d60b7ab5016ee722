"""How many pool threads a small model's warm runs take: the whole native pool, or the calling thread alone.

A run of a tenth of a millisecond gains little from a second thread and pays for it: the worker's wake-up at
each parallel layer, and after the run its spin (``pool.c``: 200 us) on a core the apps want. Measured on the
2-core VM, the zoo's VAD chunk: 84 us on one thread against 101 us on two in process (one bench run; another
gave 85 against 80), and in the daemon 102 us against 114-129 us, where the daemon's CPU per chunk fell from 380
to 280 us. Which wins moves with the model and the machine's load, so it is measured, not assumed: the first
``TRIAL`` warm runs of each kind alternate in blocks (``BLOCK``), the faster median is kept, and the trial is run
again every ``RETRY`` runs (``SOON`` after a tie given to one thread on runs the pool should shorten). A model
whose runs are longer than ``MAX_S`` keeps the pool without trials (there the pool wins by far, and a trial run
on one thread would cost a user a slow answer): the trial's first block runs on the pool, and a pool median past
``MAX_S`` ends the trial there, before any run goes to one thread (resnet50's int8 model ran its first 64 warm runs
half on one thread, 22 ms against 13, before this).

Pure bookkeeping plus ``native.set_caller_threads`` (a per-thread cap: another thread's runs keep the pool).
"""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from .. import native


class ThreadChoice:
    """One model's choice; used under the model's run lock (no locking of its own)."""

    TRIAL = 32
    #: the trial alternates blocks of this many runs, the first of each not timed: a choice is timed in its steady
    #: state (a pool run right after a one-thread run found the worker still spinning, where back-to-back pool
    #: runs spaced out by a daemon's round trip find it asleep; strictly alternating runs told the daemon's VAD
    #: 105 against 105 us, its steady state is 107 against 111)
    BLOCK = 8
    #: runs between trials: a choice made while the VM had lent the second core away (the pool then no faster than
    #: one thread: the CRNN's pool 958 against 867 us alone, 558 against 843 a minute later) is kept this long. At
    #: 4096, a 32 ms audio stream kept it for two minutes (a recurrent bench run measured the CRNN the same with two
    #: threads as with one, 0.89 ms, 1.56x onnxruntime: a choice of one thread, kept); a trial costs at most its 32
    #: runs on the worse side
    RETRY = 1024
    #: one thread wins a tie within this fraction: it leaves the other cores to the apps (the pool's worker spins
    #: 200 us after each run; the VAD chunk's daemon CPU per chunk fell from 380 to 280 us on one thread), and a
    #: trial's median of 28 runs a side does not tell a few percent apart on a shared board
    TIE = 0.05
    #: runs longer than this (the pool's median in a trial) never try one thread again
    MAX_S = 1e-3
    #: a trial that gives one thread the tie on runs this long (where a second thread, when it is there, takes a
    #: third off the run) is tried again after ``SOON`` runs, not ``RETRY``: the second core was most likely away for
    #: the trial. On the 2-core VM the CRNN's pool ran 780-850 us, the same as one thread, for its first 15-20 runs
    #: of a trial and 480-640 us after (the idle vCPU given back late); a trial that ended before then kept one
    #: thread for the next 1024 runs, 1.7x onnxruntime's time where the pool then ran 1.07x
    LONG_S = 250e-6
    SOON = 128

    def __init__(self, pool: int) -> None:
        self.pool = pool
        self.cap = 0  # 0: the whole pool
        self._times: tuple[list[float], list[float]] = ([], [])
        self._runs = 0
        self._start = 0  # the run the current (or next) trial starts at
        self._off = pool <= 1
        #: the last trial's medians (us), for status
        self.decided: dict[str, float] | None = None

    @classmethod
    def for_device(cls, device: str) -> "ThreadChoice | None":
        if device != "cpu" or not native.AVAILABLE or native.num_threads() <= 1:
            return None
        return cls(native.num_threads())

    def next_cap(self) -> int:
        """The cap for the next run: 1 (this thread alone) or 0 (the pool)."""
        if self._off:
            return 0
        phase = self._runs - self._start
        if 0 <= phase < 2 * self.TRIAL:
            return (phase // self.BLOCK) & 1
        return self.cap

    def in_trial(self) -> bool:
        return not self._off and 0 <= self._runs - self._start < 2 * self.TRIAL

    def record(self, cap: int, seconds: float) -> None:
        if self._off:
            return
        phase = self._runs - self._start
        self._runs += 1
        if not 0 <= phase < 2 * self.TRIAL:
            return
        if phase % self.BLOCK:
            self._times[1 if cap == 1 else 0].append(seconds)
        if phase == self.BLOCK - 1 and not cap:  # the first block (the pool's) is done
            pool = float(np.median(self._times[0]))
            if pool > self.MAX_S:
                self.cap, self._off, self._times = 0, True, ([], [])
                self.decided = {"pool_us": round(pool * 1e6, 1)}
                return
        if phase == 2 * self.TRIAL - 1:
            pool, alone = (float(np.median(t)) for t in self._times)
            self.cap = 1 if alone <= pool * (1 + self.TIE) else 0
            self.decided = {"alone_us": round(alone * 1e6, 1), "pool_us": round(pool * 1e6, 1)}
            self._times = ([], [])
            tie = self.cap and alone >= pool and pool >= self.LONG_S
            self._start += self.SOON if tie else self.RETRY
            if pool > self.MAX_S and not self.cap:
                self._off = True

    def run(self, fn: Callable[[Any], Any], arg: Any) -> Any:
        """``fn(arg)`` under the cap this choice gives (the trial's times recorded, every run counted)."""
        if self._off:
            return fn(arg)
        cap = self.next_cap()
        prev = native.caller_threads() if cap else 0
        if cap:
            native.set_caller_threads(1)
        t = time.perf_counter()
        try:
            out = fn(arg)
        finally:
            if cap:
                native.set_caller_threads(prev)
        self.record(cap, time.perf_counter() - t)
        return out

    def info(self) -> dict[str, Any]:
        return {"threads": 1 if self.cap else self.pool, "pool": self.pool, **(self.decided or {})}
