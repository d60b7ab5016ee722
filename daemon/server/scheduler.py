"""Per-model serving: state machine, fair priority queue with cap and deadlines, one worker thread.

Fair share: within a priority, a model's queue serves its clients round-robin (FIFO within one
client), and :class:`ClientShares` caps the requests one client has queued or running across all
models, so one client flooding a model cannot push the others' requests back.

Threads: the main (ZeroMQ) thread submits jobs and control tasks and sweeps expired deadlines;
each model's worker thread loads, runs and unloads that model, so a model's ``run`` is never
re-entered while different models run concurrently. Models on the shared Vulkan device take the
global :class:`DeviceLock` around every device use. Lock order: never hold a slot's condition
while waiting for the device lock.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from inferd_client import protocol as P

from .repository import ModelEntry

if TYPE_CHECKING:
    from .replies import ReplySender

log = logging.getLogger("inferd.server")

UNLOADED = "UNLOADED"
LOADING = "LOADING"
READY = "READY"
UNAVAILABLE = "UNAVAILABLE"
#: a fault took the model's device (or its store) away; its requests wait, or run on the CPU fallback
RECOVERING = "RECOVERING"

QUEUED, TAKEN, DONE = 0, 1, 2

# devices whose use goes through the DeviceLock ("vulkan-stream": a model streamed on the GPU, streamed.VULKAN_STREAM)
_SHARED_DEVICES = frozenset({"vulkan", "auto", "cpu+vulkan", "vulkan-stream"})

Loader = Callable[..., Any]


class DeviceLock:
    """The lock for the one shared Vulkan device. Waiters go by (model priority, request priority),
    then arrival, so an urgent request does not wait behind a queue of background work."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._held = False
        self._waiters: list[tuple[int, int, int]] = []
        self._seq = itertools.count()

    @contextmanager
    def hold(self, model_priority: int = 0, priority: int = 0) -> Iterator[None]:
        with self._cond:
            if not self._held and not self._waiters:
                self._held = True
            else:
                me = (-model_priority, -priority, next(self._seq))
                heapq.heappush(self._waiters, me)
                while self._held or self._waiters[0] != me:
                    self._cond.wait()
                heapq.heappop(self._waiters)
                self._held = True
        try:
            yield
        finally:
            with self._cond:
                self._held = False
                self._cond.notify_all()


@dataclass(eq=False)
class Job:
    ident: bytes
    req_id: P.RequestId
    feeds: dict[str, np.ndarray] | None
    priority: int
    deadline: float | None  # time.monotonic() value
    t_recv: float
    seq: int
    outputs: list[str] | None = None
    state: int = QUEUED
    sig: Any = None  # the signature (slot.inputs list) the feeds were checked against at submit
    client: str = ""  # fair-share key (see ClientShares); "" counts against no cap
    retried: bool = False  # run once more after a device fault (inference is idempotent); never twice
    inline: bool = False  # run by the serving thread itself (``inline_max_us``), not the model's worker
    wire_inline: bool = False  # its tensors came inside the header: small outputs go back that way too
    settled: bool = False  # slot freed and share released for this run (see ModelSlot._settle)


MAX_RETRY_HINT_S = 10.0


class ClientShares:
    """Requests in flight (queued or running) per client, against one cap for every client.

    The serving thread acquires, whichever thread ends the request releases; hence the lock."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._lock = threading.Lock()
        self._n: dict[str, int] = {}
        self._retry_at: dict[str, float] = {}  # monotonic time up to which retries are already booked

    def acquire(self, client: str) -> bool:
        if not client:
            return True
        with self._lock:
            n = self._n.get(client, 0)
            if n >= self.cap:
                return False
            self._n[client] = n + 1
            return True

    def retry_after(self, client: str, interval_s: float) -> float:
        """The retry hint (ms) for a refused request: one service interval after the retries already
        booked for this client. A burst's refusals get 1, 2, 3 ... intervals, so a client that follows
        the hints comes back at the pace it is served instead of all at once."""
        now = time.monotonic()
        with self._lock:
            # Bounded: a client that ignores the hints would otherwise book itself ever further out.
            at = min(max(now, self._retry_at.get(client, 0.0)) + interval_s, now + MAX_RETRY_HINT_S)
            self._retry_at[client] = at
        return (at - now) * 1e3

    def release(self, client: str) -> None:
        if not client:
            return
        with self._lock:
            n = self._n.get(client, 0) - 1
            if n > 0:
                self._n[client] = n
            else:
                self._n.pop(client, None)  # idle clients leave no entry behind
                if self._retry_at.get(client, 0.0) <= time.monotonic():
                    self._retry_at.pop(client, None)

    def inflight(self, client: str) -> int:
        with self._lock:
            return self._n.get(client, 0)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._n)


class FairQueue:
    """Queued jobs: higher priority first; within a priority, clients in turn (round-robin, newly
    active clients first), each client's jobs in arrival order. Jobs that left early (expired,
    cancelled) stay until they are met or :meth:`compact` drops them."""

    def __init__(self) -> None:
        self._levels: dict[int, OrderedDict[str, deque[Job]]] = {}
        self._prios: list[int] = []  # heap of -priority, one per non-empty level
        self.entries = 0  # jobs held, left ones included

    def _queue_of(self, job: Job) -> tuple["OrderedDict[str, deque[Job]]", deque[Job], bool]:
        """The level of ``job``'s priority, its client's queue there, and whether that queue is new."""
        level = self._levels.get(job.priority)
        if level is None:
            level = self._levels[job.priority] = OrderedDict()
            heapq.heappush(self._prios, -job.priority)
        q = level.get(job.client)
        if q is None:
            q = level[job.client] = deque()
            return level, q, True
        return level, q, False

    def push(self, job: Job) -> None:
        level, q, new = self._queue_of(job)
        if new:
            # A client with nothing queued goes first, before those with a backlog (fq_codel's "new
            # flows"): a client sending one request at a time waits for the run in progress only,
            # not for one more turn of a flooding client.
            level.move_to_end(job.client, last=False)
        q.append(job)
        self.entries += 1

    def push_front(self, job: Job) -> None:
        """Put ``job`` back first in line within its priority (a run that hit a device fault goes again
        before anything that came after it)."""
        level, q, _new = self._queue_of(job)
        q.appendleft(job)
        level.move_to_end(job.client, last=False)
        self.entries += 1

    def pop(self) -> Job | None:
        """The next job to run (marked TAKEN), or None."""
        prios, levels = self._prios, self._levels
        while prios:
            prio = -prios[0]
            level = levels[prio]
            while level:
                client = next(iter(level))
                q = level[client]
                while q:
                    job = q.popleft()
                    self.entries -= 1
                    if job.state == QUEUED:
                        if q:
                            level.move_to_end(client)  # its next job waits for every other client's turn
                        else:
                            del level[client]
                        job.state = TAKEN
                        return job
                del level[client]
            del levels[prio]
            heapq.heappop(prios)
        return None

    def jobs(self) -> Iterator[Job]:
        for level in self._levels.values():
            for q in level.values():
                yield from q

    def active_clients(self) -> int:
        return sum(len(level) for level in self._levels.values())

    def clear(self) -> None:
        self._levels.clear()
        self._prios.clear()
        self.entries = 0

    def compact(self) -> None:
        for prio in list(self._levels):
            level = self._levels[prio]
            for client in list(level):
                q = deque(j for j in level[client] if j.state == QUEUED)
                if q:
                    level[client] = q
                else:
                    del level[client]
            if not level:
                del self._levels[prio]
        self._prios = [-p for p in self._levels]
        heapq.heapify(self._prios)
        self.entries = sum(len(q) for level in self._levels.values() for q in level.values())


def _pct(samples: deque[float]) -> dict[str, float]:
    if not samples:
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0}
    a = np.fromiter(samples, dtype=np.float64, count=len(samples)) * 1e3
    p50, p99 = np.percentile(a, [50, 99])
    return {"mean": round(float(a.mean()), 4), "p50": round(float(p50), 4), "p99": round(float(p99), 4)}


@dataclass
class Stats:
    """Counters of one model. ``requests`` = accepted into the queue; every accepted request ends in
    exactly one of ok / failed / expired / cancelled."""

    requests: int = 0
    ok: int = 0
    failed: int = 0
    expired: int = 0
    cancelled: int = 0
    rejected: int = 0
    loads: int = 0
    load_failures: int = 0
    faults: int = 0
    retried: int = 0
    recoveries: int = 0
    on_fallback: int = 0
    last_load_s: float = 0.0
    queue_s: deque[float] = field(default_factory=lambda: deque(maxlen=2048))
    compute_s: deque[float] = field(default_factory=lambda: deque(maxlen=2048))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def incr(self, name: str) -> None:
        """One counter up by one: the per-request path, without ``add``'s keyword dict."""
        with self.lock:
            setattr(self, name, getattr(self, name) + 1)

    def add(self, **counts: int) -> None:
        with self.lock:
            for k, v in counts.items():
                setattr(self, k, getattr(self, k) + v)

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            q, c = list(self.queue_s), list(self.compute_s)
            d = {k: getattr(self, k) for k in ("requests", "ok", "failed", "expired", "cancelled", "rejected",
                                                "loads", "load_failures", "faults", "retried", "recoveries",
                                                "on_fallback")}
            d["last_load_s"] = round(self.last_load_s, 4)
        d["failures"] = d["failed"] + d["expired"] + d["cancelled"] + d["rejected"]
        d["queue_ms"] = _pct(deque(q))
        d["compute_ms"] = _pct(deque(c))
        return d


def tensor_sig(infos: Any, dims: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Name, dtype and shape of each tensor; with ``dims`` (a model's declared input dimensions), the inputs
    with a dynamic dimension also carry ``dims``: their dimensions with a name for each dynamic one (``shape``
    is then the shape the model was loaded at)."""
    out = []
    for t in infos:
        s: dict[str, Any] = {"name": t.name, "dtype": np.dtype(t.dtype).name, "shape": [int(d) for d in t.shape]}
        d = (dims or {}).get(t.name)
        if d is not None and any(isinstance(x, str) for x in d):
            s["dims"] = [x if isinstance(x, str) else int(x) for x in d]
        out.append(s)
    return out


def _fits(a: np.ndarray, s: dict[str, Any]) -> bool:
    """Whether ``a``'s shape is one the input described by ``s`` takes (bounds are the model's to check)."""
    dims = s.get("dims")
    if dims is None:
        return a.shape == s["tshape"]
    return a.ndim == len(dims) and all((isinstance(d, str) and x > 0) or x == d for d, x in zip(dims, a.shape))


class ModelSlot:
    """One repository model: state, queue, worker thread, stats."""

    def __init__(self, entry: ModelEntry, server: Any) -> None:
        self.name = entry.name
        self.entry = entry
        self.server = server
        self.state = UNLOADED
        self.reason = "not loaded yet"
        self.model: Any = None
        self.device: str | None = None
        #: where the last load placed it (kept across unloads: the budget it is admitted against next time)
        self.last_device: str | None = None
        #: the CPU model that serves while the primary recovers (``fallback = "cpu"``)
        self.fallback_model: Any = None
        #: held around every change of ``model``: the worker's loads and the server's recoveries
        self.load_lock = threading.Lock()
        self.inputs: list[dict[str, Any]] = []
        self._expected: dict[str, dict[str, Any]] = {}
        self.outputs: list[dict[str, Any]] = []
        self.on_demand = True  # cleared by an explicit unload, set again by an explicit load
        #: a new model is being made for this slot off its worker (``streamed.reslice``): not evictable meanwhile
        self.reslicing = False
        #: a streamed model loaded with no budget was sliced again once a budget came (``streamed.rebudget``)
        self.sliced_for_budget = False
        #: the share a streamed model whose slicing did not fit was last sliced again for (``streamed.rebudget``)
        self.resliced_for: int | None = None
        #: the memory budget's view: when it last served (monotonic s), what it weighed when fully prepared
        self.last_used = 0.0
        self.known_bytes = 0
        self.evictions = 0
        self._evict_reason: str | None = None
        self._measured = False  # the first answer after a load updates known_bytes (a cold load grows until then)
        # The condition's own lock, for the per-request path: ``with self._mutex`` enters it in C,
        # ``with self.cond`` goes through Condition's Python-level __enter__/__exit__.
        self._mutex = threading.RLock()
        self.cond = threading.Condition(self._mutex)
        self._queue = FairQueue()
        self._dl_heap: list[tuple[float, int, Job]] = []
        self.queued = 0
        self.busy = False
        self.running_since: float | None = None
        self._compute_ema: float | None = None  # seconds; decides whether runs may go inline
        self._control: deque[tuple[str, Any]] = deque()
        self._load_waiters: list[tuple[bytes, P.RequestId]] = []
        self._unload_waiters: list[tuple[bytes, P.RequestId]] = []
        self.stats = Stats()
        #: what preparing it for its first request did (``register``): None until asked
        self.registration: dict[str, Any] | None = None
        self._thread = threading.Thread(target=self._worker, name=f"inferd-model-{self.name}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ info

    @property
    def max_queue(self) -> int:
        return self.entry.config.max_queue or self.server.config.max_queue

    @property
    def fallback(self) -> str:
        f = self.entry.config.fallback
        return self.server.config.fallback if f is None else f

    @property
    def preload(self) -> bool:
        p = self.entry.config.preload
        return self.server.config.preload if p is None else p

    def memory_bytes(self) -> int:
        m = self.model
        if m is None:
            return 0
        try:
            return int(m.memory_bytes)
        except Exception:
            return 0

    def cold_stats(self) -> dict[str, Any]:
        """The last cold load's breakdown (read, transform, pipeline, execute, waiting), once it answered."""
        m = self.model
        st = getattr(m, "cold_stats", None) if m is not None else None
        return dict(st) if isinstance(st, dict) else {}

    def info(self) -> dict[str, Any]:
        cfg = self.entry.config
        return {
            "name": self.name, "state": self.state, "reason": self.reason, "path": self.entry.path,
            "device": self.device, "inputs": self.inputs, "outputs": self.outputs,
            "preload": self.preload, "pinned": cfg.pinned, "priority": cfg.priority, "max_queue": self.max_queue,
            "queued": self.queued, "memory_bytes": self.memory_bytes(), "variants": self.variants(),
            "warm": self.warm(), **self._coexec_info(),
            **self.threads_info(),
            **self.registration_info(),
        }

    def registration_info(self) -> dict[str, Any]:
        """What preparing it for its first request did (``register``), once asked."""
        r = self.registration
        return {"registration": dict(r)} if r is not None else {}

    def threads_info(self) -> dict[str, Any]:
        """How many threads a small CPU model's runs take (and its last trial's medians), once decided."""
        tc = getattr(self.model, "thread_choice", None)
        return {"threads": tc.info()} if tc is not None and tc.decided is not None else {}

    def warm(self) -> bool | None:
        """Whether the loaded model runs on its warm path (its warm switch done); None when not loaded."""
        m = self.model
        if m is None:
            return None
        try:
            return bool(getattr(m, "warm", True))
        except Exception:
            return None

    def _coexec_info(self) -> dict[str, Any]:
        """A model co-executed by the CPU and the GPU: its split layers (inferctl status shows them)."""
        if self.device != "cpu+vulkan" or self.model is None:
            return {}
        from ..coexec.load import summary

        s = summary(self.model)
        return {"coexec": s} if s else {}

    def variants(self) -> list[dict[str, Any]]:
        """The input shapes a dynamic model has prepared besides its first (least recently used first)."""
        m = self.model
        try:
            vs = getattr(m, "variants", ()) if m is not None else ()
            return [{"shapes": {k: list(v) for k, v in x.shapes.items()}, "memory_bytes": int(x.memory_bytes),
                     "prepare_ms": round(x.prepare_s * 1e3, 2), "shared_layers": x.shared, "own_layers": x.own}
                    for x in vs]
        except Exception:
            return []

    def settled(self) -> bool:
        return self.state != LOADING and not self._control

    def idle(self) -> bool:
        with self.cond:
            return self.queued == 0 and not self.busy and not self._control

    def leaving(self) -> bool:
        """Whether an unload is queued here (an eviction, an admin's, the slot's retirement): the budget counts it
        as gone."""
        with self.cond:
            return any(c[0] in ("unload", "exit") for c in self._control)

    # ------------------------------------------------------------------ main-thread API

    def request_load(self, waiter: tuple[bytes, P.RequestId] | None, reload: bool = False) -> dict[str, Any] | None:
        """Queue a load; returns the model info if nothing needs doing (already READY)."""
        with self.cond:
            self.on_demand = True
            if self.state == READY and not reload and not self._control:
                return self.info()
            if waiter is not None:
                self._load_waiters.append(waiter)
            if self.state == LOADING and not reload and any(t[0] == "load" for t in self._control):
                return None
            if self.state != READY:
                self.state, self.reason = LOADING, "loading"
            self._control.append(("load", reload))
            self.cond.notify()
        return None

    def memory_breakdown(self) -> dict[str, int]:
        """Arena and weight bytes of the loaded model (empty when unloaded or it does not say)."""
        m = self.model
        try:
            return dict(getattr(m, "memory_breakdown", {}) or {}) if m is not None else {}
        except Exception:
            return {}

    def resident_bytes(self) -> int:
        """What this model holds, or will once its cold load is complete (the budget plans with that)."""
        mem = self.memory_bytes()
        if self.model is not None and self._measured:
            self.known_bytes = mem
        return max(mem, self.known_bytes) if self.model is not None else 0

    def evict(self, reason: str) -> bool:
        """Unload to keep the memory budget, if nothing is queued or running here; the next request loads it
        again. Returns whether the unload was queued."""
        with self.cond:
            if self.state != READY or self.queued or self.busy or self._control or self.reslicing:
                return False
            self._evict_reason = reason
            self._control.append(("unload", None))
            self.cond.notify()
        return True

    def request_unload(self, waiter: tuple[bytes, P.RequestId] | None) -> dict[str, Any] | None:
        with self.cond:
            self.on_demand = False
            if self.state in (UNLOADED, UNAVAILABLE) and not self._control:
                self.state, self.reason = UNLOADED, "unloaded by request"
                return {"name": self.name, "state": self.state}
            if waiter is not None:
                self._unload_waiters.append(waiter)
            self._control.append(("unload", None))
            self.cond.notify()
        return None

    def retire(self, reason: str = "removed from the repository") -> None:
        """Unload, then end the worker thread (model removed from the repository, or daemon stopping)."""
        with self.cond:
            self._control.append(("exit", reason))
            self.cond.notify()

    def check_feeds(self, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], str | None]:
        """Map ``""`` to the single input and compare with the signature; (feeds, error message)."""
        sig = self.inputs
        if not sig:
            return feeds, None  # unknown until the first load; the model itself checks
        if len(feeds) == 1 and len(sig) == 1:
            # The common single-input case without building sets; mismatches take the long path
            # below for its full message.
            (name, a), = feeds.items()
            s0 = self._expected[sig[0]["name"]]
            if (name == "" or name == s0["name"]) and a.dtype == s0["np_dtype"] and _fits(a, s0):
                return (feeds if name else {s0["name"]: a}), None
        elif len(feeds) == len(sig):
            # Every input named and right (a stream's chunk): one pass, no sets; any mismatch takes the
            # long path below for its full message.
            for name, s in self._expected.items():
                a = feeds.get(name)
                if a is None or a.dtype != s["np_dtype"] or not _fits(a, s):
                    break
            else:
                return feeds, None
        if list(feeds) == [""]:
            if len(sig) != 1:
                return feeds, (f"model {self.name!r} has {len(sig)} inputs {[s['name'] for s in sig]}; "
                               f"an unnamed tensor needs a single-input model")
            feeds = {sig[0]["name"]: feeds[""]}
        expected = self._expected
        unknown = sorted(set(feeds) - set(expected))
        missing = sorted(set(expected) - set(feeds))
        if unknown or missing:
            return feeds, (f"model {self.name!r}: inputs {sorted(feeds)} do not match the expected "
                           f"{sorted(expected)} (unknown {unknown}, missing {missing})")
        for name, s in expected.items():
            a = feeds[name]
            if a.dtype != s["np_dtype"] or not _fits(a, s):
                if a.dtype == s["np_dtype"] and "dims" in s:  # say which dimension is wrong
                    from inferd.errors import ShapeError
                    from inferd.frontend.shapes import check_dims

                    try:
                        check_dims(name, s["dims"], a.shape)
                    except ShapeError as e:
                        return feeds, f"model {self.name!r}: {e}"
                want = "[" + ", ".join(str(d) for d in s["dims"]) + "]" if "dims" in s else str(s["shape"])
                return feeds, (f"model {self.name!r}: input {name!r} expects {s['dtype']}{want}, "
                               f"got {a.dtype.name}{list(a.shape)}")
        return feeds, None

    def submit(self, job: Job, inline: ReplySender | None = None) -> tuple[Any, ...] | None:
        """Queue a job; returns (code, message[, retry_after_ms]) instead when it cannot be accepted.

        With ``inline`` (the main thread's sender), a job for an idle CPU model whose runs are known
        to be short (``inline_max_us``) runs right here: it saves two thread hand-offs, which are
        most of the daemon's overhead for small models, and cannot delay other models by more
        than that bound.
        """
        self.last_used = time.monotonic()
        with self._mutex:
            if self.state == UNAVAILABLE:
                self.stats.incr("rejected")
                return P.UNAVAILABLE, f"model {self.name!r} is unavailable: {self.reason}"
            if self.state == UNLOADED and not self.on_demand:
                self.stats.incr("rejected")
                return P.UNAVAILABLE, f"model {self.name!r} was unloaded by request; load it again first"
            if self.state == UNLOADED:
                short = self.server.admit(self)  # room for it within the memory budget, others evicted
                if short:
                    self.stats.incr("rejected")
                    return P.UNAVAILABLE, short
            if job.feeds is not None and self.inputs:
                job.feeds, err = self.check_feeds(job.feeds)
                if err:
                    self.stats.incr("rejected")
                    return P.INVALID_ARG, err
                job.sig = self.inputs
            if job.outputs and self.outputs:
                known = {o["name"] for o in self.outputs}
                bad = [o for o in job.outputs if o not in known]
                if bad:
                    self.stats.incr("rejected")
                    return P.INVALID_ARG, f"model {self.name!r} has no output(s) {bad}; outputs are {sorted(known)}"
            shares: ClientShares = self.server.shares
            if not shares.acquire(job.client):
                self.stats.incr("rejected")
                # This client gets a run about once per round of the clients queued here.
                interval_s = self._retry_after_ms(1 + self._queue.active_clients()) / 1e3
                retry = max(1.0, shares.retry_after(job.client, interval_s))
                return (P.UNAVAILABLE, f"this client ({job.client}) already has {shares.cap} requests in flight "
                        f"(max_inflight_per_client); retry in about {retry:.0f} ms", retry)
            if self.queued >= self.max_queue:
                shares.release(job.client)
                self.stats.incr("rejected")
                retry = self._retry_after_ms(self.queued)
                return (P.UNAVAILABLE, f"queue of model {self.name!r} is full ({self.max_queue} requests waiting); "
                        f"retry in about {retry:.0f} ms", retry)
            stats = self.stats
            with stats.lock:
                stats.requests += 1
            limit = self.server.config.inline_max_us * 1e-6
            run_here = (inline is not None and self.state == READY and not self.queued and not self.busy
                        and not self._control and self.device == "cpu" and self._compute_ema is not None
                        and self._compute_ema <= limit)
            if run_here:
                self.busy = True
                job.state = TAKEN
                job.inline = True
            else:
                if self.state == UNLOADED:
                    self.state, self.reason = LOADING, "loading on demand"
                    self._control.append(("load", False))
                self._queue.push(job)
                if job.deadline is not None:
                    heapq.heappush(self._dl_heap, (job.deadline, job.seq, job))
                self.queued += 1
                if self._queue.entries > 2 * self.queued + 64 or len(self._dl_heap) > 2 * self.queued + 64:
                    self._compact()
                self.cond.notify()
        if run_here:
            assert inline is not None
            # No notify when it settles: only the main thread (running this) queues work, so the
            # worker has nothing new to see; waking it would cost a context switch per request.
            self._run_job(job, inline)
            self.server.after_inline_run(job.t_recv)
        return None

    def _retry_after_ms(self, runs_ahead: int) -> float:
        """When a slot should free up: about ``runs_ahead`` runs of this model (5 ms each until measured)."""
        ema = self._compute_ema if self._compute_ema is not None else 0.005
        return max(1.0, ema * 1e3 * max(1, runs_ahead))

    def _compact(self) -> None:
        self._queue.compact()
        self._dl_heap = [e for e in self._dl_heap if e[2].state == QUEUED]
        heapq.heapify(self._dl_heap)

    def next_deadline(self) -> float | None:
        with self.cond:
            while self._dl_heap and self._dl_heap[0][2].state != QUEUED:
                heapq.heappop(self._dl_heap)
            return self._dl_heap[0][0] if self._dl_heap else None

    def expire(self, now: float) -> list[Job]:
        """Take the queued jobs whose deadline has passed (answered DEADLINE_EXCEEDED, never run)."""
        out: list[Job] = []
        with self.cond:
            while self._dl_heap and (self._dl_heap[0][0] <= now or self._dl_heap[0][2].state != QUEUED):
                job = heapq.heappop(self._dl_heap)[2]
                if job.state == QUEUED:
                    job.state = DONE
                    job.feeds = None
                    self.queued -= 1
                    out.append(job)
        if out:
            self.stats.add(expired=len(out))
            for job in out:
                self.server.shares.release(job.client)
        return out

    def cancel_queued(self) -> list[Job]:
        with self.cond:
            return self._cancel_queued_locked()

    def _cancel_queued_locked(self) -> list[Job]:
        out = [j for j in self._queue.jobs() if j.state == QUEUED]
        shares = self.server.shares
        for job in out:
            job.state = DONE
            job.feeds = None
            shares.release(job.client)
        self._queue.clear()
        self._dl_heap.clear()
        self.queued = 0
        if out:
            self.stats.add(cancelled=len(out))
        return out

    # ------------------------------------------------------------------ worker thread

    def _worker(self) -> None:
        sender = self.server.reply_sender()
        try:
            while True:
                task: tuple[str, Any] | None = None
                job: Job | None = None
                with self.cond:
                    while not self._control and not (self._serving() and self.queued):
                        self.cond.wait()
                    if self._control:
                        task = self._control[0]
                    else:
                        job = self._pop_locked()
                        if job is not None:
                            self.busy = True
                if task is not None:
                    try:
                        if task[0] == "load":
                            self._do_load(sender, reload=bool(task[1]))
                        elif task[0] == "swap":
                            self._do_swap(sender, *task[1])
                        else:
                            self._do_unload(sender, final=task[0] == "exit", reason=task[1])
                    except Exception:  # never let the worker die: the slot would hang forever
                        log.exception("model %s: %s failed", self.name, task[0])
                    finally:
                        with self.cond:
                            self._control.popleft()
                        sender.event("state", self.name)
                    if task[0] == "exit":
                        return
                elif job is not None:
                    self._run_job(job, sender)
        finally:
            sender.close()

    def _serving(self) -> bool:
        return self.state == READY or (self.state == RECOVERING and self.fallback_model is not None)

    def _requeue(self, job: Job) -> None:
        """Put a job that hit a fault back at the head of its priority (its seq keeps its place)."""
        with self.cond:
            job.state = QUEUED
            self._queue.push_front(job)
            if job.deadline is not None:
                heapq.heappush(self._dl_heap, (job.deadline, job.seq, job))
            self.queued += 1
            self.cond.notify()
        self.server.note_deadline(job.deadline)

    def _pop_locked(self) -> Job | None:
        job = self._queue.pop()
        if job is not None:
            self.queued -= 1
        return job

    def _device_ctx(self, device: str | None, priority: int = 0) -> Any:
        if device in _SHARED_DEVICES:
            return self.server.device_lock.hold(self.entry.config.priority, priority)
        return nullcontext()

    def _run_job(self, job: Job, sender: ReplySender) -> None:
        job.settled = False
        try:
            self._run_job_inner(job, sender)
        finally:
            self._settle(job)

    def _settle(self, job: Job) -> None:
        """The run is over: free the slot and the client's share, once per run.

        A successful run settles before its reply leaves: a client that sends its next request on
        reading the reply must find the model idle (so it may go inline) and its share free, not
        race this thread's bookkeeping."""
        if job.settled:
            return
        job.settled = True
        with self._mutex:
            self.busy = False
            self.running_since = None
        if job.state != QUEUED:  # a job put back after a device fault is still in flight
            self.server.shares.release(job.client)

    def _run_job_inner(self, job: Job, sender: ReplySender) -> None:
        now = time.monotonic()
        if job.deadline is not None and now > job.deadline:
            self.stats.incr("expired")
            job.feeds = None
            sender.send(job.ident, P.encode_error(job.req_id, P.DEADLINE_EXCEEDED,
                        f"model {self.name!r}: deadline passed after {1e3 * (now - job.t_recv):.1f} ms in the queue; not run"))
            return
        feeds = job.feeds or {}
        job.feeds = None  # the deadline heap may keep the job a while: do not keep its tensors
        with self._mutex:
            on_fallback = self.state == RECOVERING and self.fallback_model is not None
            model = self.fallback_model if on_fallback else self.model
            device = "cpu" if on_fallback else self.device
        try:
            if job.sig is not self.inputs:  # not checked yet, or the model was reloaded since
                feeds, err = self.check_feeds(feeds)
                if err:
                    raise _Invalid(err)
            t_start = now if job.sig is self.inputs else time.monotonic()
            queue_s = t_start - job.t_recv
            self.running_since = t_start  # one attribute store: atomic, read by the main thread's stall check
            if model is None:
                raise _Gone()
            if device in _SHARED_DEVICES:
                with self._device_ctx(device, job.priority):
                    out = model.run(feeds)
            else:
                out = model.run(feeds)
            compute = time.monotonic() - t_start
            if job.outputs:
                missing = [o for o in job.outputs if o not in out]
                if missing:
                    raise _Invalid(f"model {self.name!r} has no output(s) {missing}; outputs are {sorted(out)}")
                out = {k: out[k] for k in job.outputs}
            frames = P.encode_reply(job.req_id, {"model": self.name, "device": device,
                                                 "queue_us": round(queue_s * 1e6, 1),
                                                 "compute_us": round(compute * 1e6, 1), "inline": job.inline,
                                                 "idle": job.inline and self.server.nothing_waiting(self)}, out,
                                   job.wire_inline)
        except _Invalid as exc:
            self.stats.add(failed=1)
            sender.send(job.ident, P.encode_error(job.req_id, P.INVALID_ARG, str(exc)))
            return
        except Exception as exc:
            kind = fault_kind(exc)
            # a run on a model that a recovery took away meanwhile failed for that reason alone
            gone = isinstance(exc, _Gone) or (model is not self.model and model is not self.fallback_model)
            if kind is not None or gone:
                if not gone:
                    self.stats.incr("faults")
                    self.server.on_fault(self, model, exc, kind)
                if not job.retried:
                    job.retried = True
                    job.feeds = feeds
                    self.stats.incr("retried")
                    self._requeue(job)
                    return
                self.stats.add(failed=1)
                sender.send(job.ident, P.encode_error(
                    job.req_id, P.UNAVAILABLE, f"model {self.name!r}: {type(exc).__name__}: {exc} (hit twice; the "
                    "daemon is recovering the device: retry later)", retry_after_ms=self.server.retry_after_ms()))
                return
            self.stats.add(failed=1)
            code, msg = _classify(self.name, exc)
            if code == P.INTERNAL:
                log.exception("model %s: run failed", self.name)
            sender.send(job.ident, P.encode_error(job.req_id, code, msg))
            return
        if not on_fallback:
            self._compute_ema = compute if self._compute_ema is None else 0.8 * self._compute_ema + 0.2 * compute
        with self.stats.lock:
            self.stats.ok += 1
            self.stats.on_fallback += on_fallback
            self.stats.queue_s.append(queue_s)
            self.stats.compute_s.append(compute)
        first = not self._measured  # its first answer: a cold load is complete, its weight now known
        self._measured = True
        self._settle(job)
        sender.send(job.ident, frames)
        if first:
            self.known_bytes = self.memory_bytes()
            sender.event("state", self.name)

    def _do_load(self, sender: ReplySender, reload: bool) -> None:
        with self.cond:
            if self.state == READY and not reload:
                waiters, self._load_waiters = self._load_waiters, []
                info = self.info()
            else:
                waiters, info = [], None
        if info is not None:
            for ident, rid in waiters:
                sender.send(ident, P.encode_reply(rid, info))
            return
        with self.load_lock:
            self._do_load_locked(sender)

    def load_options(self, device: str) -> dict[str, Any]:
        """The loader's keyword arguments from the model's config (its shapes, bounds, precision), where set."""
        cfg = self.entry.config
        dynamic: dict[str, Any] = {}
        if cfg.shapes:
            dynamic["shapes"] = [dict(s) for s in cfg.shapes]
        if cfg.max_shape:
            dynamic["max_shape"] = dict(cfg.max_shape)
        if cfg.precision:
            dynamic["precision"] = cfg.precision
        if cfg.fp32_layers:
            dynamic["fp32_layers"] = list(cfg.fp32_layers)
        if cfg.split and device == "cpu+vulkan":
            dynamic["split"] = dict(cfg.split)
        return dynamic

    def register(self) -> None:
        """Prepare this model for its first request in idle time, if it waits for one (not preloaded, not loaded):
        its package compiled where missing or stale, its plan and store index parsed, and with the daemon's
        ``register_profile`` its package profiled where it was planned from predictions (the loader's
        ``register``: ``inferd.register``). Its first request then reads only weights, and never compiles. What
        came of it is ``registration`` (``inferctl status``)."""
        srv = self.server
        reg = srv.registrar
        cfg = self.entry.config
        device = cfg.device or srv.config.device
        why = ("the daemon registers no models (register = false)" if reg is None
               else "preloaded" if self.preload
               else f"not loadable: {self.entry.error}" if self.entry.error
               else "streamed within the budget: compiled at its first load" if cfg.memory == "stream"
               else "co-executed on the CPU and the GPU: planned at each load" if device == "cpu+vulkan" else None)
        if why is not None:
            self.registration = {"state": "skipped", "reason": why}
            return
        entry = self.entry
        self.registration = {"state": "queued"}
        tried = self.stats.loads + self.stats.load_failures

        def stale() -> bool:
            # stopping, changed on disk, or loaded (or tried) since: its own load has done what this would
            return (srv.draining or self.entry is not entry or self.state != UNLOADED
                    or self.stats.loads + self.stats.load_failures != tried)

        def job() -> None:
            from ..runtime.scheduler import foreground

            # after the requests of the moment (a steady stream of them gives no quiet: then beside it, as the
            # compile would run beside the stream at the model's first request anyway)
            foreground.wait_quiet(timeout=2.0)
            if stale():
                self.registration = {"state": "skipped", "reason": "loaded, changed or stopping before its turn"}
                return
            self.registration = {"state": "running"}
            kw = {k: v for k, v in self.load_options(device).items() if k != "max_shape"}
            try:
                with self._device_ctx(device):  # (a compile profiles on the device as a load does)
                    r = reg(entry.path, device=device, batch=cfg.batch, cache_dir=srv.packages_dir, **kw)
                if srv.config.register_profile and r.package is not None and not stale():
                    # between requests only, outside the device's lock: the models that run meanwhile take it
                    p = reg(entry.path, device=device, batch=cfg.batch, cache_dir=srv.packages_dir, profile=True,
                            stop=stale, **kw)
                    r = replace(r, profiled=p.profiled, seconds=r.seconds + p.seconds)
            except Exception as exc:
                log.warning("model %s: registering it failed (its first request will load it from scratch): %s: %s",
                            self.name, type(exc).__name__, exc)
                self.registration = {"state": "failed", "error": f"{type(exc).__name__}: {exc}"}
                return
            self.registration = {"state": "done", "package": None if r.package is None else str(r.package),
                                 "compiled": r.compiled, "profiled": r.profiled, "parsed": r.parsed,
                                 "ms": round(r.seconds * 1e3, 1), **({"note": r.note} if r.note else {})}
            log.info("model %s: registered in %.0f ms (%s)", self.name, r.seconds * 1e3,
                     ", ".join([w for w, on in (("compiled", r.compiled), ("profiled", r.profiled),
                                                ("plan parsed", r.parsed)) if on]) or r.note or "nothing to do")

        from ..runtime.scheduler import worker

        worker("register").submit(job)

    def load_model(self) -> tuple[Any, str]:
        """Load the model on its device: (model, reason). A device fault at load (out of device memory,
        device lost) with ``fallback = "cpu"`` loads it on the CPU instead, the reason saying why."""
        entry = self.entry
        device = entry.config.device or self.server.config.device
        log.info("model %s: loading %s on %s", self.name, entry.path, device)
        if entry.error:
            raise RuntimeError(entry.error)
        try:
            cfg = entry.config
            dynamic = self.load_options(device)
            with self._device_ctx(device):
                return self.server.load(self, entry.path, device, cfg.batch, **dynamic), ""
        except Exception as exc:
            if fault_kind(exc) != "device" or self.fallback != "cpu" or device == "cpu":
                raise
            reason = f"on the CPU (fallback): loading on {device} failed: {type(exc).__name__}: {exc}"
            log.warning("model %s: %s", self.name, reason)
            self.server.record_event(self.name, "load_fallback", str(exc))
            return self.server.load(self, entry.path, "cpu", cfg.batch, **dynamic), reason

    def _do_load_locked(self, sender: ReplySender) -> None:
        t0 = time.perf_counter()
        try:
            model, note = self.load_model()
        except Exception as exc:
            reason = f"load failed: {type(exc).__name__}: {exc}"
            log.error("model %s: %s", self.name, reason)
            self.stats.add(load_failures=1)
            with self.cond:
                waiters, self._load_waiters = self._load_waiters, []
                if self.state == READY or (self.model is not None):
                    # A failed reload keeps serving the previous version.
                    self.state = READY
                    self.reason = f"reload failed, serving the previous version: {reason}"
                    cancelled: list[Job] = []
                else:
                    self.state, self.reason = UNAVAILABLE, reason
                    cancelled = self._cancel_queued_locked()
            for job in cancelled:
                sender.send(job.ident, P.encode_error(job.req_id, P.UNAVAILABLE, f"model {self.name!r}: {reason}"))
            for ident, rid in waiters:
                sender.send(ident, P.encode_error(rid, P.UNAVAILABLE, f"model {self.name!r}: {reason}"))
            return
        self._install(model, note, time.perf_counter() - t0, sender)

    def _install(self, model: Any, note: str, dt: float, sender: ReplySender) -> None:
        """``model`` (loaded in ``dt`` seconds) serves from now on, in place of the one before, which is closed."""
        old = self.model
        with self.cond:
            self.model = model
            self.device = str(getattr(model, "device", "?"))
            self.inputs = tensor_sig(model.inputs, getattr(model, "dims", None))
            self._expected = {s["name"]: {**s, "np_dtype": np.dtype(s["dtype"]), "tshape": tuple(s["shape"])}
                              for s in self.inputs}
            self.outputs = tensor_sig(model.outputs)
            self.state, self.reason = READY, note
            self._measured, self.last_used = False, time.monotonic()
            self._compute_ema = None
            self.stats.last_load_s = dt
            waiters, self._load_waiters = self._load_waiters, []
            info = self.info()
            self.cond.notify_all()
        self.stats.add(loads=1)
        log.info("model %s: ready on %s in %.3f s (%d bytes)", self.name, self.device, dt, self.memory_bytes())
        if old is not None:
            self._close(old)
        self._drop_fallback()
        for ident, rid in waiters:
            sender.send(ident, P.encode_reply(rid, info))
        if not self.queued:
            self._finish_in_idle_time(model)

    def swap_in(self, model: Any, note: str, dt: float) -> bool:
        """From another thread: ``model``, loaded there while this slot served on (a streamed model sliced again
        for a smaller share), to take over between requests. False when the slot no longer serves (unloaded,
        retired, or one of those asked for): the caller closes ``model``."""
        with self.cond:
            if self.state != READY or self.model is None or any(t[0] in ("unload", "exit") for t in self._control):
                return False
            self._control.append(("swap", (model, note, dt)))
            self.cond.notify()
        return True

    def _do_swap(self, sender: ReplySender, model: Any, note: str, dt: float) -> None:
        with self.load_lock:
            with self.cond:
                serving = self.state == READY and self.model is not None
            if serving:
                self._install(model, note, dt, sender)
                return
        self._close(model)  # no longer serving (a device fault's recovery took it meanwhile): nothing to take over

    def _finish_in_idle_time(self, model: Any) -> None:
        """A load no request waits on (a preload, a client's load): finish it, and its warm switch, in idle time.
        Its cold plan streams the load under a first request; with none coming, that request would otherwise
        still run the cold kernels, and the model would say it is warming until then."""
        finish = getattr(model, "wait_loaded", None)
        if finish is None:
            return
        from ..runtime.cold import after_answer

        def job() -> None:
            if self.model is not model:
                return  # unloaded or replaced meanwhile
            try:
                prepared = getattr(model, "wait_prepared", None)
                if prepared is not None:
                    # (seconds of pipeline creation on a cold GPU, and it waits while requests run: not under the
                    # device's lock)
                    prepared()
                with self._device_ctx(getattr(model, "device", None)):  # as its first run would hold it
                    finish()
            except Exception as exc:  # a model closed under it: the next request loads or fails on its own
                log.debug("model %s: finishing the load in idle time: %s: %s", self.name, type(exc).__name__, exc)

        after_answer(job)

    def _close(self, model: Any) -> None:
        try:
            with self._device_ctx(getattr(model, "device", None)):
                model.close()
        except Exception:
            log.exception("model %s: close failed", self.name)

    def _do_unload(self, sender: ReplySender, final: bool, reason: str | None = None) -> None:
        with self.load_lock:
            self._do_unload_locked(sender, final, reason)
        self._drop_fallback()

    def _do_unload_locked(self, sender: ReplySender, final: bool, reason: str | None = None) -> None:
        with self.cond:
            evicting, self._evict_reason = self._evict_reason, None
            if evicting and (final or self._unload_waiters or not self.on_demand):
                evicting = None  # an explicit unload or a retirement came too: that is what this is
            if evicting and self.queued:
                return  # a request came after the eviction was decided: keep serving (the budget looks again)
            model, self.model = self.model, None
            self.state = UNLOADED
            if evicting and not final:
                self.evictions += 1
                self.reason = evicting
            else:
                self.reason = (reason or "removed from the repository") if final else "unloaded by request"
            self.last_device = self.device or self.last_device
            self.device = None
            cancelled = self._cancel_queued_locked()
            waiters, self._unload_waiters = self._unload_waiters, []
            load_waiters, self._load_waiters = (self._load_waiters, []) if final else ([], self._load_waiters)
        for job in cancelled:
            sender.send(job.ident, P.encode_error(job.req_id, P.UNAVAILABLE, f"model {self.name!r} was {self.reason}"))
        if model is not None:
            self._close(model)
            log.info("model %s: %s", self.name, self.reason)
        for ident, rid in waiters:
            sender.send(ident, P.encode_reply(rid, {"name": self.name, "state": UNLOADED}))
        for ident, rid in load_waiters:
            sender.send(ident, P.encode_error(rid, P.UNAVAILABLE, f"model {self.name!r}: {self.reason}"))


    # ------------------------------------------------------------------ recovery (the server's thread)

    def begin_recovery(self, why: str) -> bool:
        """Stop using the model (its device failed); requests wait, or run on the fallback. False when
        the slot has nothing to recover (not loaded)."""
        with self.cond:
            if self.model is None or self.state not in (READY, RECOVERING):
                return False
            self.state, self.reason = RECOVERING, f"recovering: {why}"
            self.cond.notify_all()
        return True

    def load_fallback(self) -> None:
        """Bring up the CPU model that serves while the device recovers (when configured)."""
        if self.fallback != "cpu" or self.device == "cpu" or self.fallback_model is not None:
            return
        try:
            model = self.server.load(self, self.entry.path, "cpu", self.entry.config.batch)
        except Exception as exc:
            log.error("model %s: the CPU fallback failed to load: %s: %s", self.name, type(exc).__name__, exc)
            return
        with self.cond:
            if self.state != RECOVERING:  # the recovery ended meanwhile
                late = model
            else:
                late, self.fallback_model = None, model
                self.reason += "; serving on the CPU meanwhile"
                self.cond.notify_all()
        if late is not None:
            self._close(late)
        else:
            log.warning("model %s: serving on the CPU while the device recovers", self.name)

    def take_model(self) -> Any:
        """Detach the failed model (closed by the caller, with the device lock held)."""
        with self.cond:
            model, self.model = self.model, None
        return model

    def finish_recovery(self, sender: ReplySender) -> tuple[bool, str]:
        """Load the model again after its device was recreated; (ok, what happened)."""
        with self.load_lock:
            with self.cond:
                if self.state != RECOVERING:  # unloaded or retired meanwhile
                    return False, f"not recovered: {self.state}"
            try:
                model, note = self.load_model()
            except Exception as exc:
                reason = f"recovery failed: {type(exc).__name__}: {exc}"
                log.error("model %s: %s", self.name, reason)
                with self.cond:
                    fb, self.fallback_model = self.fallback_model, None
                    if fb is not None:
                        # the CPU model serves on as the model itself until a reload works
                        self.model, self.device = fb, "cpu"
                        self.state, self.reason = READY, f"on the CPU (fallback): {reason}"
                        cancelled: list[Job] = []
                    else:
                        self.state, self.reason = UNAVAILABLE, reason
                        cancelled = self._cancel_queued_locked()
                    self.cond.notify_all()
                for job in cancelled:
                    sender.send(job.ident, P.encode_error(job.req_id, P.UNAVAILABLE, f"model {self.name!r}: {reason}",
                                                          retry_after_ms=self.server.retry_after_ms()))
                return fb is not None, reason
            with self.cond:
                self.model = model
                self.device = str(getattr(model, "device", "?"))
                self.state, self.reason = READY, note
                self._compute_ema = None
                self.cond.notify_all()
        self.stats.incr("recoveries")
        self._drop_fallback()
        return True, note or "ok"

    def _drop_fallback(self) -> None:
        with self.cond:
            fb, self.fallback_model = (self.fallback_model, None) if self.state != RECOVERING else (None, None)
        if fb is not None:
            # a run on it may still be under way in this slot's worker: Model.close waits for it
            self._close(fb)


class _Invalid(Exception):
    pass


class _Gone(Exception):
    """The slot's model was taken away (a recovery) between picking the job and running it."""


def fault_kind(exc: BaseException) -> str | None:
    """'device' for a device fault (lost, out of memory, hung), 'cache' for a failing disk under a
    package, None for everything else (the model's own errors, bad input)."""
    try:
        from inferd.errors import DeviceFault, WeightsStoreError  # noqa: PLC0415 - engine import kept lazy
    except Exception:  # pragma: no cover
        return None
    if isinstance(exc, DeviceFault):
        return "device"
    if isinstance(exc, (OSError, WeightsStoreError)):
        return "cache"
    return None


def _classify(name: str, exc: Exception) -> tuple[str, str]:
    try:
        from inferd.errors import InputError  # noqa: PLC0415 - engine import kept lazy
    except Exception:  # pragma: no cover
        InputError = ValueError  # type: ignore[misc,assignment]  # noqa: N806
    if isinstance(exc, InputError):
        return P.INVALID_ARG, str(exc)
    return P.INTERNAL, f"model {name!r}: {type(exc).__name__}: {exc}"
