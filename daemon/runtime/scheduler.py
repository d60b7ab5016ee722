"""The cold runtime's scheduler: preparation tasks on loader threads, executions in order, stealing.

One :class:`LoaderPool` per process (the daemon's loader threads) serves every cold load under way:
each :class:`ColdRun` brings the plan's queues (one per planned loader, plus the executor's), and the
pool's workers take tasks from the runs round-robin, so several cold loads share the threads fairly.
A worker owns the queues whose index is congruent to its own; with stealing on, a worker whose
queues are empty takes the *head* of the queue with the most predicted work left (the task the
executor needs soonest from the thread most behind), as NNV12 describes, and the executor thread
itself takes a task it is about to wait for if nobody has started it.

Work that overlaps here releases the GIL: ``preadv``, the store's XXH3 checksum, numpy's
tensordot/copies and the native (cffi) packing and kernels.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..errors import InferdError
from ..planner.plan import ColdPlan
from . import window

log = logging.getLogger("inferd.runtime.scheduler")

PENDING, RUNNING, DONE, FAILED, CANCELLED = range(5)


class ColdLoadError(InferdError):
    """Preparing a layer failed during a cold load."""


@dataclass
class Task:
    pos: int                    # position in the plan
    queue: int                  # planned thread (queue index)
    predicted_s: float
    state: int = PENDING
    thread: str = ""
    t0: float = 0.0
    t1: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    error: BaseException | None = None
    stolen: bool = False
    by_worker: bool = False


@dataclass(frozen=True)
class Event:
    """One bar of the cold timeline: ``kind`` is 'prepare', 'execute' or 'wait'."""

    thread: str
    kind: str
    layer: str
    t0: float
    t1: float


PrepareFn = Callable[[int], Mapping[str, float]]


#: a helper that defers to requests (``ColdRun.wait_ready``'s ``defer``) looks again at a task it left this often
DEFER_POLL_S = 0.01


class ColdRun:
    """One cold load: the plan's preparation tasks, their state, and the timeline."""

    def __init__(self, plan: ColdPlan, prepare: PrepareFn, name: str = "model") -> None:
        self.plan = plan
        self.name = name
        self._prepare = prepare
        self.steal = plan.options.steal
        self.tasks = [Task(pos, lp.loader, lp.prep_s) for pos, lp in enumerate(plan.layers)]
        self.queues: list[list[int]] = plan.queues()
        self._heads = [0] * len(self.queues)
        # per queue, the predicted seconds of its pending tasks, kept as tasks leave PENDING: summing them at every
        # steal, under the lock the executor waits on, was quadratic (shufflenetv2's 140 layers: 7652 sums)
        self._pending_s = [sum(self.tasks[p].predicted_s for p in q) for q in self.queues]
        self.cond = threading.Condition()
        self.t_start = time.perf_counter()
        self.events: list[Event] = []
        self.cancelled = False
        self._left = len(self.tasks)
        #: pool workers preparing for this run right now, at most the plan's loader count: more would
        #: take cores from the executor, which the plan gave them to
        self.active = 0
        self.max_active = plan.loaders

    # ---------------------------------------------------------------- task selection (under cond)
    def _next_in(self, q: int) -> int | None:
        qq = self.queues[q]
        h = self._heads[q]
        while h < len(qq) and self.tasks[qq[h]].state != PENDING:
            h += 1
        self._heads[q] = h
        return qq[h] if h < len(qq) else None

    def _left_in(self, q: int) -> float:
        return self._pending_s[q]

    def claim(self, worker: int, n_workers: int) -> Task | None:
        """A pending task for pool worker ``worker``: its own queues first, then (stealing) the head of the
        queue with the most work left, the executor's included."""
        if self.cancelled or self.active >= self.max_active:
            return None
        own = [q for q in range(self.plan.loaders) if q % max(n_workers, 1) == worker % max(n_workers, 1)]
        for q in own:
            p = self._next_in(q)
            if p is not None:
                return self._take(p, stolen=False)
        if not self.steal:
            return None
        best, best_left = None, 0.0
        for q in range(len(self.queues)):
            p = self._next_in(q)
            if p is None:
                continue
            left = self._left_in(q) + 1e-9
            if best is None or left > best_left:
                best, best_left = p, left
        return self._take(best, stolen=True) if best is not None else None

    def _take(self, pos: int, stolen: bool, worker: bool = True) -> Task:
        t = self.tasks[pos]
        t.state = RUNNING
        self._pending_s[t.queue] -= t.predicted_s
        t.stolen = stolen
        t.by_worker = worker
        if worker:
            self.active += 1
        return t

    def has_work(self) -> bool:
        return not self.cancelled and self._left > 0 and any(self._next_in(q) is not None for q in range(len(self.queues)))

    # ---------------------------------------------------------------- doing a task
    def run_task(self, t: Task) -> None:
        t.thread = threading.current_thread().name
        t.t0 = time.perf_counter()
        try:
            t.phases = dict(self._prepare(t.pos))
            state = DONE
        except BaseException as e:  # reported to the executor when it reaches this layer
            t.error = e
            state = FAILED
            # a load cancelled under a task (the model closed) fails it on purpose: not worth a warning
            log.log(logging.DEBUG if self.cancelled else logging.WARNING, "%s: preparing layer %s failed: %s: %s",
                    self.name, self.plan.layers[t.pos].name, type(e).__name__, e)
        t.t1 = time.perf_counter()
        with self.cond:
            t.state = state
            self._left -= 1
            if t.by_worker:
                self.active -= 1
            self.events.append(Event(t.thread, "prepare", self.plan.layers[t.pos].name, t.t0, t.t1))
            self.cond.notify_all()

    def cancel(self) -> None:
        with self.cond:
            self.cancelled = True
            for t in self.tasks:
                if t.state == PENDING:
                    t.state = CANCELLED
                    self._pending_s[t.queue] -= t.predicted_s
                    self._left -= 1
            self.cond.notify_all()

    def wait_quiet(self, timeout: float) -> bool:
        """Wait until no loader thread is preparing a layer (after ``cancel``: the tasks under way finish or
        fail; the model then lets go of its memory with nobody writing into it). False on timeout."""
        with self.cond:
            return self.cond.wait_for(lambda: self.active == 0, timeout)

    # ---------------------------------------------------------------- the executor's side
    def wait_ready(self, pos: int, defer: Callable[[], bool] | None = None) -> float:
        """Block until layer ``pos`` is prepared, preparing it on this thread if nobody has started it, unless
        ``defer()`` says to leave it (then asked again every ``DEFER_POLL_S`` while the task waits).
        Returns the seconds spent waiting (not preparing)."""
        t = self.tasks[pos]
        w0: float | None = None
        while True:
            with self.cond:
                if t.state == PENDING and (self.steal or self.plan.options.executor_prepares
                                           or t.queue == self.plan.loaders) and not (defer is not None and defer()):
                    self._take(pos, stolen=t.queue != self.plan.loaders, worker=False)
                    mine = True
                else:
                    mine = False
            if mine:
                self.run_task(t)
            with self.cond:
                if t.state in (PENDING, RUNNING) and w0 is None:
                    w0 = time.perf_counter()
                while t.state == RUNNING or (t.state == PENDING and defer is None):
                    self.cond.wait(0.5)
                if t.state == PENDING:  # deferred: look again shortly
                    self.cond.wait(DEFER_POLL_S)
                    continue
                waited = 0.0
                if w0 is not None:
                    w1 = time.perf_counter()
                    waited = w1 - w0
                    self.events.append(Event(threading.current_thread().name, "wait", self.plan.layers[pos].name,
                                             w0, w1))
                break
        if t.state == FAILED:
            lp = self.plan.layers[pos]
            if isinstance(t.error, InferdError):  # already says what and where (a damaged store, a bad kernel)
                raise t.error
            raise ColdLoadError(f"{self.name}: preparing layer {lp.name!r} ({lp.op}, kernel {lp.kernel}, "
                                f"reads {lp.source}) failed: {type(t.error).__name__}: {t.error}") from t.error
        if t.state == CANCELLED:
            raise ColdLoadError(f"{self.name}: the cold load was cancelled")
        return waited

    def ready(self, pos: int) -> bool:
        return self.tasks[pos].state == DONE

    def idle_before(self, t: float) -> float:
        """How long before ``t`` every task had been prepared (0 while any was not): a load's time that went by
        waiting for its caller, not preparing."""
        with self.cond:
            done = [k.t1 for k in self.tasks if k.t1 > 0]
        return max(0.0, t - max(done)) if done and len(done) == len(self.tasks) else 0.0

    def wait_all(self, defer: Callable[[], bool] | None = None) -> None:
        """Every task prepared (the caller helps with what nobody has started, unless ``defer()``)."""
        for pos in range(len(self.tasks)):
            self.wait_ready(pos, defer)

    def record(self, kind: str, pos: int, t0: float, t1: float) -> None:
        with self.cond:
            self.events.append(Event(threading.current_thread().name, kind, self.plan.layers[pos].name, t0, t1))

    def note(self, kind: str, what: str, t0: float, t1: float, thread: str | None = None) -> None:
        """Side work of the load for the timeline ('read': a streaming read's piece, 'prefault'), no layer's;
        ``thread``: the thread that did it (default: the caller)."""
        with self.cond:
            self.events.append(Event(thread or threading.current_thread().name, kind, what, t0, t1))

    def breakdown(self) -> dict[str, Any]:
        """Seconds per phase summed over tasks, waiting and executing on the executor, and per-thread work."""
        with self.cond:
            ev = list(self.events)
            tasks = list(self.tasks)
        out: dict[str, Any] = {"read_s": 0.0, "transform_s": 0.0, "pipeline_s": 0.0, "execute_s": 0.0, "waiting_s": 0.0}
        for t in tasks:
            for k in ("read_s", "transform_s", "pipeline_s"):
                out[k] += float(t.phases.get(k, 0.0))
        for e in ev:
            if e.kind == "execute":
                out["execute_s"] += e.t1 - e.t0
            elif e.kind == "wait":
                out["waiting_s"] += e.t1 - e.t0
        out["stolen"] = sum(1 for t in tasks if t.stolen)
        out["tasks"] = len(tasks)
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in out.items()}

    def timeline(self) -> list[dict[str, Any]]:
        with self.cond:
            ev = list(self.events)
        return [{"thread": e.thread, "kind": e.kind, "layer": e.layer, "t0": round(e.t0 - self.t_start, 6),
                 "t1": round(e.t1 - self.t_start, 6)} for e in sorted(ev, key=lambda e: e.t0)]


class LoaderPool:
    """The process's preparing threads. Started lazily; the daemon sizes it with ``set_size``."""

    def __init__(self, n: int) -> None:
        self.n = max(1, int(n))
        self._runs: list[ColdRun] = []
        self._rr = 0
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._stop = False

    def _ensure_locked(self) -> None:
        with self._cond:
            self._ensure()

    def _ensure(self) -> None:
        while len(self._threads) < self.n:
            w = len(self._threads)
            th = threading.Thread(target=self._worker, args=(w,), name=f"inferd-loader-{w}", daemon=True)
            self._threads.append(th)
            th.start()

    def submit(self, run: ColdRun) -> None:
        with self._cond:
            self._ensure()
            self._runs.append(run)
            self._cond.notify_all()

    def _pick(self, w: int) -> tuple[ColdRun, Task] | None:
        runs = [r for r in self._runs if not r.cancelled and r._left > 0]
        self._runs = runs
        if not runs:
            return None
        k = len(runs)
        for j in range(k):
            r = runs[(self._rr + j) % k]
            with r.cond:
                t = r.claim(w, self.n)
            if t is not None:
                self._rr = (self._rr + j + 1) % k
                return r, t
        return None

    def _worker(self, w: int) -> None:
        while True:
            with self._cond:
                got = None
                while not self._stop:
                    got = self._pick(w)
                    if got is not None:
                        break
                    if not self._cond.wait(0.2):
                        window.expire()  # a cold window whose load was never run nor closed lapses
                if self._stop:
                    return
            assert got is not None
            run, task = got
            run.run_task(task)
            # not kept in this frame while the thread waits for the next load: the run holds its model's backend,
            # whose memory an eviction or a close must free now
            got = run = task = None  # type: ignore[assignment]

    def set_size(self, n: int) -> None:
        with self._cond:
            self.n = max(1, int(n))
            self._ensure()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()


class Worker:
    """A persistent thread running submitted jobs in order. A cold load hands its side work (the
    streaming read, page prefaulting, idle-time work after the answer) to workers made with the loader
    pool, since starting a thread inside a load waits for the GIL: ~4 ms each beside busy loaders."""

    def __init__(self, name: str, nice: int = 0) -> None:
        self.name = name
        self._jobs: "queue.SimpleQueue[tuple[Callable[[], Any], threading.Event]]" = queue.SimpleQueue()
        self._nice = nice
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        if self._nice:
            try:  # Linux: a thread's own nice value
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self._nice)
            except (OSError, AttributeError):
                pass
        while True:
            fn, done = self._jobs.get()
            try:
                fn()
            except Exception as e:  # jobs report their own errors; this keeps the worker alive
                log.warning("%s: job failed: %s: %s", self.name, type(e).__name__, e)
            finally:
                done.set()
                # the finished job's closure (a cold load, its backend and weights) must not live on in this frame
                # until the next job comes
                fn = None  # type: ignore[assignment]

    def submit(self, fn: Callable[[], Any]) -> threading.Event:
        done = threading.Event()
        self._jobs.put((fn, done))
        return done


class Foreground:
    """Whether any model of this process is running a request, and since when none is: idle-time work (the
    profiling of a package planned from predictions, on the 'idle' worker) measures only in the quiet between
    requests. Without this it held the native thread pool under the requests, which then ran inline on one
    thread (mobilenetv2 5.2 -> 10.7 ms for the seconds the profiling took)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._active = 0
        self._last_end = 0.0

    def busy(self) -> bool:
        """Whether a request is running now."""
        return self._active > 0

    def __enter__(self) -> "Foreground":
        with self._cv:
            self._active += 1
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cv:
            self._active -= 1
            self._last_end = time.monotonic()
            self._cv.notify_all()

    def wait_quiet(self, quiet_s: float = 0.05, timeout: float | None = None) -> bool:
        """Block until no request runs and none has for ``quiet_s``; False if ``timeout`` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while True:
                now = time.monotonic()
                rest = self._last_end + quiet_s - now
                if self._active == 0 and rest <= 0:
                    return True
                if deadline is not None and now >= deadline:
                    return False
                wait = rest if self._active == 0 else 0.05
                if deadline is not None:
                    wait = min(wait, max(0.0, deadline - now))
                self._cv.wait(wait)


#: the process's foreground: ``Model.run`` enters it, idle-time work waits for it to be quiet
foreground = Foreground()


_pool: LoaderPool | None = None
_pool_lock = threading.Lock()
_workers: dict[str, Worker] = {}


#: the workers a cold load's streaming read runs on: two reads in flight (``store.StoreStream``)
IO_WORKERS = ("io", "io2")


def worker(name: str) -> Worker:
    """The process's worker ``name``: 'io' and 'io2' (streaming reads), 'aux' (prefaulting), 'idle' (nice 19: the
    warm switch, refining plans, after a first answer) or 'register' (nice 19: a daemon's models prepared for their
    first request, seconds of compiling each, which would otherwise hold up the idle worker's warm switches)."""
    with _pool_lock:
        return _worker_locked(name)


def _worker_locked(name: str) -> Worker:
    w = _workers.get(name)
    if w is None:
        w = _workers[name] = Worker(f"inferd-{name}", nice=19 if name in ("idle", "register") else 0)
    return w


def default_loaders() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, int(os.environ.get("INFERD_LOADERS", "0") or 0) or cores)


def loader_pool() -> LoaderPool:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = LoaderPool(default_loaders())
            _pool._ensure_locked()
            for name in IO_WORKERS + ("aux", "idle"):
                _worker_locked(name)
        return _pool
