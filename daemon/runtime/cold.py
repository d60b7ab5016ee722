"""The cold runtime: carries out a :class:`~inferd.planner.plan.ColdPlan` on any :class:`ColdBackend`.

Loading starts the plan's preparation tasks on the process's loader pool and returns at once. The
first run executes layer i as soon as layer i's own preparation is done (the executor prepares a
layer itself rather than wait for it when nobody has started it). After the first answer the model
is on the warm path; where the plan's cold kernel is not the warm one, the warm switch prepares the
warm kernels in the background and swaps them in between requests.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Mapping

import numpy as np

from ..backends.base import ColdBackend, WeightSource
from ..ops.base import Kernel, Layer, choose_kernel
from ..planner.cost import kernel_transforms
from ..planner.plan import ColdPlan
from .scheduler import IO_WORKERS, ColdRun, Worker, foreground, loader_pool, worker

log = logging.getLogger("inferd.runtime.cold")


class ColdLoad:
    """One model brought up by its plan. ``first_run`` answers the first request; ``wait_loaded`` just
    finishes the load (for callers that want a fully loaded model before any input exists)."""

    def __init__(self, backend: ColdBackend, plan: ColdPlan, weights: WeightSource, name: str = "model",
                 layers: list[Layer] | None = None) -> None:
        self.backend = backend
        self.plan = plan
        self.weights = weights
        self.name = name
        self.layers = layers if layers is not None else backend.layers()
        if len(self.layers) != len(plan.layers):
            raise ValueError(f"{name}: plan has {len(plan.layers)} layers, the graph {len(self.layers)}")
        self.t0 = time.perf_counter()
        self.run = ColdRun(plan, self._prepare, name)
        self.done = False
        self.stats: dict[str, Any] = {}
        self._finalized = False
        self._finalize_lock = threading.Lock()
        self._prefault: threading.Event | None = None
        pool = loader_pool()  # with its io, aux and idle workers: this load starts no thread
        run = self.run

        def on_read(off: int, n: int, t0: float, t1: float, thread: str | None = None) -> None:
            run.note("read", f"{n >> 10} KB at {off >> 10} KB", t0, t1, thread)

        # reads in flight (or already, where the stored plan let them start before the backend's set-up)
        weights.start_stream(self.layers, plan, [worker(n) for n in IO_WORKERS], on_read=on_read)
        pool.submit(run)
        prefault = getattr(backend, "prefault", None)
        if prefault is not None:
            # beside the reads: page faults of the arena and workspaces are CPU work the disk waits out
            kernels = [lp.kernel for lp in plan.layers]
            self._prefault = worker("aux").submit(lambda: self._run_prefault(prefault, kernels))

    def _run_prefault(self, fn: Callable[..., None], *args: Any) -> None:
        t0 = time.perf_counter()
        try:
            fn(*args)
        except Exception as e:  # only a speed-up: the first run faults them in itself
            log.debug("%s: prefault failed: %s", self.name, e)
        self.run.note("prefault", "", t0, time.perf_counter())

    def _prepare(self, pos: int) -> Mapping[str, float]:
        lp = self.plan.layers[pos]
        layer = self.layers[pos]
        arrays, read_s = self.weights.read(layer, lp) if lp.source != "none" else ({}, 0.0)
        phases = dict(self.backend.prepare(pos, lp, arrays))
        if lp.source == "raw":
            self.weights.release_raw(layer)
        phases["read_s"] = read_s
        return phases

    def _finalize(self) -> None:
        with self._finalize_lock:
            if not self._finalized:
                self.backend.finalize()
                self._finalized = True

    def _finalize_quietly(self) -> None:
        try:
            self._finalize()
        except Exception as e:  # the backend's next run finalizes itself and reports what is wrong then
            log.debug("%s: deferred finalize failed: %s", self.name, e)

    def first_run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Execute the first request as the layers become ready."""
        run = self.run
        t_first = time.perf_counter()
        # preparation that ended before this request came: the model waited, not the request
        idle = run.idle_before(t_first)
        if not self.plan.options.pipeline:
            run.wait_all()
        if self._prefault is not None and not getattr(self.backend, "prefault_concurrent", lambda: False)():
            self._prefault.wait()  # it writes into what this run is about to use
        self.backend.begin(feeds)
        n = len(self.plan.layers)
        # a backend that can run several prepared layers as one call (the CPU's native steps) runs every layer that
        # is ready at once: the executor then takes the GIL back once per run, not after every layer from a loader
        # thread that holds it (2-core VM, mobilenetv2 and efficientnet_b0: the executions 17-26% shorter, 15% fewer
        # context switches; the cold time, which the loader's preparation bounds, within its noise)
        many = getattr(self.backend, "execute_run", None)
        pos = 0
        while pos < n:
            run.wait_ready(pos)
            hi = pos + 1
            if many is not None:
                while hi < n and run.ready(hi):
                    hi += 1
            t0 = time.perf_counter()
            if hi - pos > 1:
                for j, t1 in zip(range(pos, hi), many(pos, hi)):
                    run.record("execute", j, t0, t1)
                    t0 = t1
            else:
                self.backend.execute(pos, hi < n and not run.ready(hi))
                run.record("execute", pos, t0, time.perf_counter())
            pos = hi
        out = self.backend.end()
        # leaving the window re-enables the collector, and the collection it put off would run at the
        # next allocation, on this answer's way out: let the idle worker leave it, after the answer
        after_answer(self._release_window)
        if getattr(self.backend, "defer_finalize", False):
            # recording the warm path (and saving the pipeline cache) is not on the way to this answer:
            # the idle worker does it, or the next run does if it comes first (the backend's run checks)
            after_answer(self._finalize_quietly)
        else:
            self._finalize()
        self._end_stream()
        t_end = time.perf_counter()
        self.done = True
        self.stats = {"cold_s": round(t_end - self.t0 - idle, 6), "first_run_s": round(t_end - t_first, 6),
                      "idle_before_request_s": round(idle, 6),
                      "predicted_s": round(self.plan.predicted_s, 6), **run.breakdown(),
                      **getattr(self, "stats_stream", {})}
        self._backend_stats()
        return out

    def _backend_stats(self) -> None:
        load_stats = getattr(self.backend, "load_stats", None) or {}
        made = load_stats.get("pipelines_created")
        if made is not None:  # GPU: pipelines this load had to create (none where the device held them all)
            self.stats["pipelines_created"] = int(made)
        if "binds_replayed" in load_stats:  # layers rebuilt from the package's recorded binds, not bound or worked out
            self.stats["binds_replayed"] = int(load_stats["binds_replayed"])

    def observed(self) -> dict[tuple[str, str, str], float]:
        """Costs this cold run measured, keyed as a profile's: transforms at load, first executions."""
        out: dict[tuple[str, str, str], float] = {}
        for t in self.run.tasks:
            lp = self.plan.layers[t.pos]
            tr = float(t.phases.get("transform_s", 0.0))
            if lp.source == "raw" and tr > 0:
                out[(lp.name, lp.kernel, "transform")] = tr
        names = {lp.name: lp for lp in self.plan.layers}
        if getattr(self.backend, "gpu", False):
            return out  # a GPU layer's execute() only records commands: its time is not the layer's
        for e in self.run.timeline():
            if e["kind"] == "execute" and e["layer"] in names:
                lp = names[e["layer"]]
                out[(lp.name, lp.kernel, "exec_cold")] = e["t1"] - e["t0"]
        return out

    def _end_stream(self) -> None:
        st = self.weights.stream
        if st is not None:
            self.stats_stream = {"stream_read_s": round(st.read_s, 6), "stream_bytes": st.bytes,
                                 "stream_chunks": len(st.chunks), "stream_from": st.origin}
            st.release()
            self.weights.stream = None

    def _release_window(self) -> None:
        """Leave the cold window (``runtime.window``) the package's opening entered: the answer is out."""
        release = getattr(self.weights.store, "release_window", None)
        if release is not None:
            release()

    def wait_loaded(self) -> None:
        run = self.run
        idle = run.idle_before(time.perf_counter())  # as first_run's: not the load's time
        run.wait_all()
        self._end_stream()
        if self._prefault is not None:
            self._prefault.wait()
        self._finalize()
        self._release_window()
        self.done = True
        if not self.stats:
            # a daemon finishes a preloaded model's load on its idle worker, behind other models' loads: the
            # time it waited there is not this load's ("cold 13480.9 ms (predicted 2.4 ms)" for a model ready
            # in 2.1 s, before)
            self.stats = {"cold_s": round(time.perf_counter() - self.t0 - idle, 6),
                          "idle_before_finish_s": round(idle, 6), "predicted_s": round(self.plan.predicted_s, 6),
                          **run.breakdown()}
            self._backend_stats()

    def cancel(self) -> None:
        self.run.cancel()
        self._release_window()
        st = self.weights.stream
        if st is not None:
            st.release()

    def wait_stopped(self, timeout: float = 10.0) -> bool:
        """After ``cancel``: wait until no loader thread prepares a layer, the prefault is over and no streaming read
        is under way, so that a closing model drops memory nobody writes into any more, and all of it. False on
        timeout."""
        ok = self.run.wait_quiet(timeout)
        if self._prefault is not None:  # its workspaces, made beside the load, go with it
            ok = self._prefault.wait(timeout) and ok
        st = self.weights.stream
        return (st.wait_stopped(timeout) if st is not None else True) and ok

    # ------------------------------------------------------------------ the warm switch
    def warm_switches(self) -> list[tuple[int, str]]:
        return [(pos, lp.warm_kernel) for pos, lp in enumerate(self.plan.layers) if lp.warm_kernel]

    def plan_switches(self, plan: ColdPlan) -> list[tuple[int, str]]:
        """The layers whose kernel now is not ``plan``'s warm choice (a re-plan of the same model: its layers
        by name in the same order; another model's plan switches nothing)."""
        current = getattr(self.backend, "kernel_params", None)
        if current is None or [lp.name for lp in plan.layers] != [lp.name for lp in self.plan.layers]:
            return []
        out = []
        for pos, lp in enumerate(plan.layers):
            want = lp.warm_kernel or lp.kernel
            now = current(pos)
            if now is not None and now[0].name != want:
                out.append((pos, want))
        return out

    def prepare_warm(self, backend_name: str, switches: list[tuple[int, str]] | None = None
                     ) -> list[tuple[int, Kernel, dict[str, np.ndarray]]]:
        """The warm kernels' params of every layer whose cold kernel is not its warm one (background work), or of
        ``switches`` (position, kernel). A cold kernel whose weights are of the warm one's form
        (``Kernel.weights_form``) hands over its very arrays: nothing is read or transformed again."""
        out = []
        current = getattr(self.backend, "kernel_params", None)
        for pos, kname in self.warm_switches() if switches is None else switches:
            layer = self.layers[pos]
            k = choose_kernel(layer, backend_name, kname)
            now = current(pos) if current is not None else None
            if now is not None and k.takes_weights_of(now[0]):
                params = now[1]
            elif self.weights.has_transformed(layer.name, kname):
                params = self.weights.transformed(layer, kname)
            else:
                raw = self.weights.raw(layer)
                params = k.transform(layer, raw) if kernel_transforms(k) else dict(raw)
                self.weights.release_raw(layer)
            out.append((pos, k, params))
        return out


def idle_worker() -> Worker:
    """The process's lowest-priority worker (requests on other threads come first)."""
    return worker("idle")


#: work after an answer starts once no request has run for this long. Started at once, the idle worker took the
#: GIL from the answer's own way out (the rest of ``Model.run``, the caller's reply): 1-4 ms of a cold answer on
#: the 2-core VM. Its priority (nice 19) does not help there: the GIL, not a core, is what both wait for.
AFTER_ANSWER_QUIET_S = 0.002


def after_answer(fn: Callable[[], Any]) -> threading.Event:
    """Run ``fn`` on the idle worker once the answer is out (the foreground quiet for ``AFTER_ANSWER_QUIET_S``;
    at most 0.1 s later under a stream of requests, so that the cold window is always left)."""
    def job() -> None:
        foreground.wait_quiet(AFTER_ANSWER_QUIET_S, timeout=0.1)
        fn()

    return idle_worker().submit(job)


def start_warm_switch(cold: ColdLoad, backend_name: str, lock: threading.Lock,
                      on_done: Callable[[dict[str, Any]], None] | None = None,
                      may_start: Callable[[], bool] | None = None) -> threading.Event | None:
    """Prepare the warm kernels in idle time and swap them in under ``lock`` (between runs). ``may_start()``, asked
    when the job's turn comes, false: nothing is done (the model is closing; it waits only for a switch under way,
    not for one queued behind other idle work: it had waited for that work, up to 30 s, and a daemon's shutdown
    gave up on its model threads after 10)."""
    if not cold.warm_switches() or not cold.plan.options.warm_switch:
        return None

    def work() -> None:
        if may_start is not None and not may_start():
            return
        try:
            n, prep_s, swap_s = swap_in(cold, backend_name, lock)
            info = {"warm_switch_layers": n, "warm_prepare_s": round(prep_s, 6), "warm_swap_s": round(swap_s, 6)}
        except Exception as e:  # the cold kernels keep serving: slower, still correct
            log_swap_failure(cold, "warm switch failed, keeping the cold kernels", e)
            info = {"warm_switch_error": f"{type(e).__name__}: {e}"}
        if on_done is not None:
            on_done(info)

    return after_answer(work)


def swap_in(cold: ColdLoad, backend_name: str, lock: threading.Lock,
            switches: list[tuple[int, str]] | None = None, stop: Callable[[], bool] | None = None
            ) -> tuple[int, float, float]:
    """Prepare the kernels of ``switches`` (position, kernel; default: the plan's warm switches) outside ``lock``
    and swap them in under it, between runs: the warm switch, and a refined plan's kernels (``Model``). Nothing is
    swapped once ``stop()`` is true. Returns (layers swapped, seconds preparing, seconds swapping); raises what
    preparing or swapping raised, the kernels that served before still in place for the layers not swapped."""
    t0 = time.perf_counter()
    ready = cold.prepare_warm(backend_name, switches)
    t1 = time.perf_counter()
    with lock:
        if stop is not None and stop():
            return 0, t1 - t0, 0.0
        for pos, k, params in ready:
            cold.backend.swap(pos, k, params)
        compact = getattr(cold.backend, "compact_weights", None)
        if compact is not None and ready:
            compact(ready)
    return len(ready), t1 - t0, time.perf_counter() - t1


def log_swap_failure(cold: ColdLoad, what: str, e: BaseException) -> None:
    """A failed swap's warning; a debug line where the backend was closed under it (a device closing at exit, a
    model collected), which stops it on purpose."""
    closed = bool(getattr(cold.backend, "closed", False))
    log.log(logging.DEBUG if closed else logging.WARNING, "%s: %s: %s: %s", cold.name, what, type(e).__name__, e)
