"""The user-facing model object: ``inferd.load(path, device=...)``."""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:
    import onnx

from .. import cache, faults
from ..errors import BackendError, PackageOptionsError, PackageUnsupported, WeightsStoreError
from ..ir import Graph, TensorInfo
from ..planner.plan import ColdPlan, PlanOptions
from . import heap
from .cpu import check_feeds
from .scheduler import foreground
from .threads import ThreadChoice

if TYPE_CHECKING:
    from .cold import ColdLoad

log = logging.getLogger(__name__)


@dataclass
class Variant:
    """A dynamic model prepared at one more input shape: its own graph, arena (and on a GPU its recorded
    commands) over the weights of the model's first shape."""

    shapes: dict[str, tuple[int, ...]]
    graph: Graph
    backend: Any
    prepare_s: float
    shared: int  # layers whose weights it binds from the first shape
    own: int

    @property
    def memory_bytes(self) -> int:
        return int(self.backend.memory_bytes)


#: shape variants a dynamic model keeps besides its first shape, by default (least recently used dropped)
DEFAULT_MAX_VARIANTS = 4

#: ``Model.wait_prepared`` leaves the layers to running requests for at most this long
PREPARED_DEFER_S = 1.0
#: idle-time refinement put off by a busy foreground tries again after this long, doubling up to a minute
REFINE_RETRY_S = 5.0


class Model:
    """A loaded model. ``run`` is not re-entrant (one arena per shape); the daemon serialises runs per model.

    A model loaded by a cold plan returns from ``load`` while its layers are still being prepared:
    the first ``run`` executes each layer as soon as it is ready (``cold_stats`` then holds the
    breakdown), and the warm switch, if the plan has one, follows in the background.

    A model with dynamic input dimensions (``dims``) is loaded at its first shape (the plan's); a run at
    another shape prepares a ``Variant`` for it once (the shape planned, the weights shared) and keeps at
    most ``max_variants`` of them."""

    def __init__(self, name: str, graph: Graph, executor: Any, device: str, load_s: float,
                 cold: "ColdLoad | None" = None, on_close: Any = None,
                 recover: "Callable[[], Model | None] | None" = None, template: Graph | None = None,
                 make_backend: "Callable[[Graph], Any] | None" = None) -> None:
        self.name = name
        self.graph = graph
        #: the graph every input shape is specialised from (None: a static model)
        self.template = template if template is not None and template.dynamic else None
        self._make_backend = make_backend
        self._variants: "OrderedDict[tuple[tuple[int, ...], ...], Variant]" = OrderedDict()
        self.max_variants = DEFAULT_MAX_VARIANTS
        #: per input, the largest size each dimension may take (None: unbounded)
        self.bounds: dict[str, tuple[int, ...]] | None = None
        self._exec = executor
        self.device = device
        self.load_s = load_s
        self._lock = threading.Lock()
        self._cold = cold
        self._on_close = on_close
        self.plan = cold.plan if cold is not None else None
        self.cold_stats: dict[str, Any] = {}
        #: the cold load whose answer ``_after_cold`` has taken in (its stats, its warm switch started): until then
        #: ``warm`` is False, though the load may say it is done
        self._settled: "ColdLoad | None" = None
        #: set when the warm switch (if any) is done; likewise the refinement of the package's plan
        self.warm_done: threading.Event | None = None
        self.refine_done: threading.Event | None = None
        #: set by close(): a refinement not started yet is skipped (it would profile a model that is gone);
        #: one under way holds ``_refining``, which close() waits for
        self._closing = threading.Event()
        self._refining = threading.Lock()
        self._warm_guard = threading.Lock()  # a warm switch's start against close() (_warm_switch_may_start)
        self._warm_begun = threading.Event()
        self._refine_retry: threading.Timer | None = None
        #: rebuilds the model from a fresh package when its store turns out damaged mid-load
        self._recover = recover
        #: folds a cold run's observations into the package's profile (and plan) in idle time
        self._refine: "Callable[[dict[tuple[str, str, str], float]], Any] | None" = None
        #: records the CPU layers' binds into the package after its cold load (``runtime.bindrec``), in idle time
        self._record_binds: Callable[[], Any] | None = None
        #: set once that recording ran (or was skipped at close); None: nothing to record
        self.binds_done: threading.Event | None = None
        self._broken: BaseException | None = None
        #: the compiled package the model was loaded from (None: compiled in memory); the cache
        #: never evicts it while the model is loaded
        self.package: Path | None = None
        #: the precision plan in force (inferd.planner.precision.PrecisionPlan): the backend's, or a CPU
        #: package's recorded one
        self.precision: Any = getattr(executor, "precision", None)
        #: a small CPU model's warm runs on the calling thread alone when that measures faster than the pool
        self.thread_choice = ThreadChoice.for_device(device)

    @property
    def inputs(self) -> list[TensorInfo]:
        """The inputs at the model's first shape (``dims`` has the dynamic dimensions)."""
        return list(self.graph.inputs)

    @property
    def dims(self) -> dict[str, tuple[int | str, ...]]:
        """Per input, its dimensions: a name where the dimension is dynamic."""
        t = self.template
        return {i.name: tuple(t.dims.get(i.name, i.shape)) if t is not None else tuple(i.shape) for i in self.inputs}

    @property
    def variants(self) -> list[Variant]:
        """The shapes prepared besides the first, least recently used first. Read without the run lock (one
        C-level copy), so that a status request never waits for a long run."""
        return list(tuple(self._variants.values()))

    @property
    def outputs(self) -> list[TensorInfo]:
        return list(self.graph.outputs)

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.graph.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.graph.outputs]

    @property
    def memory_bytes(self) -> int:
        """The first shape's weights and arena, plus each variant's arena (and any weights it could not share)."""
        return int(self._exec.memory_bytes) + sum(v.memory_bytes for v in self.variants)

    @property
    def memory_breakdown(self) -> dict[str, int]:
        """``arena_bytes`` and ``weights_bytes`` over the first shape and every variant (whose weights are
        mostly the first shape's, bound not copied)."""
        out = {"arena_bytes": 0, "weights_bytes": 0}
        for b in [self._exec] + [v.backend for v in self.variants]:
            part = getattr(b, "memory_breakdown", None)
            for k, v in (part or {"arena_bytes": int(getattr(b, "memory_bytes", 0))}).items():
                out[k] = out.get(k, 0) + int(v)
        return out

    @property
    def kernels(self) -> dict[str, str]:
        """node name -> kernel name chosen for it."""
        names = getattr(self._exec, "kernel_names", None)
        if isinstance(names, dict):
            return dict(names)
        planned = {lp.name: lp.kernel for lp in self.plan.layers} if self.plan is not None else {}
        # a layer not prepared yet runs the planned kernel; a prepared one what it was built with
        return {layer.name: (k.name if k is not None else planned[layer.name])
                for layer, k in getattr(self._exec, "choice", [])}

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._closing.is_set():
            raise BackendError(f"{self.name}: the model was closed")
        t = self.template
        if t is not None:
            feeds = check_feeds(t.inputs, feeds, self.name, t.dims, self.bounds)
            key = tuple(tuple(feeds[i.name].shape) for i in t.inputs)
            if key != tuple(tuple(i.shape) for i in self.graph.inputs):
                with self._lock:
                    return self._variant(key).backend.run(feeds)
        else:
            feeds = check_feeds(self.graph.inputs, feeds, self.name)
        with self._lock, foreground:
            if self._broken is not None:
                raise BackendError(f"{self.name}: the model failed to load ({self._broken}); load it again")
            faults.check("backend.run")
            cold = self._cold
            if cold is None or cold.done:
                tc = self.thread_choice
                if tc is None or (tc.in_trial() and not self.warm):
                    return self._exec.run(feeds)
                return tc.run(self._exec.run, feeds)
            try:
                out = cold.first_run(feeds)
            except (WeightsStoreError, OSError) as e:  # a damaged store, or a disk failing under the read
                cold.cancel()
                fresh = self._recover() if self._recover is not None else None
                if fresh is None:
                    self._broken = e
                    raise
                log.warning("%s: %s; rebuilt its package and loaded it again", self.name, e)
                self._adopt(fresh)
                cold = self._cold
                assert cold is not None
                try:
                    out = cold.first_run(feeds)
                except (WeightsStoreError, OSError) as e2:  # damaged right after a rebuild: the disk is failing
                    cold.cancel()
                    self._broken = e2
                    raise
            self._after_cold(cold)
            return out

    def prepare(self, shapes: "Sequence[Mapping[str, Sequence[int]]]") -> list[Variant]:
        """Prepare the model at each of ``shapes`` (input name -> shape) now rather than at the first run
        that brings it; ``InputError`` for a shape the model does not take."""
        t = self.template
        out = []
        for s in shapes:
            if t is None:
                check_feeds(self.graph.inputs, {i.name: _shaped(i, s.get(i.name, i.shape)) for i in self.graph.inputs},
                            self.name)
                continue
            feeds = {i.name: _shaped(i, s.get(i.name, i.shape)) for i in t.inputs}
            check_feeds(t.inputs, feeds, self.name, t.dims, self.bounds)
            key = tuple(tuple(int(x) for x in feeds[i.name].shape) for i in t.inputs)
            if key != tuple(tuple(i.shape) for i in self.graph.inputs):
                with self._lock:
                    out.append(self._variant(key))
        return out

    def _variant(self, key: tuple[tuple[int, ...], ...]) -> Variant:
        """The variant of input shapes ``key``, prepared now if it is not kept (caller holds the lock)."""
        v = self._variants.get(key)
        if v is not None:
            self._variants.move_to_end(key)
            return v
        if self._broken is not None:
            raise BackendError(f"{self.name}: the model failed to load ({self._broken}); load it again")
        cold = self._cold
        if cold is not None and not cold.done:  # its weights are what every other shape shares
            cold.wait_loaded()
            self._after_cold(cold)
        assert self.template is not None and self._make_backend is not None
        from ..errors import InputError, ShapeError
        from ..frontend import specialize

        t0 = time.perf_counter()
        shapes = {i.name: s for i, s in zip(self.template.inputs, key)}
        try:
            g = specialize(self.template, shapes)
        except ShapeError as e:
            raise InputError(f"{self.name}: {e}") from e
        backend = self._make_backend(g)
        try:
            counts = backend.adopt(self._exec)
        except BaseException:
            close = getattr(backend, "close", None)
            if close is not None:
                close()
            raise
        v = Variant(shapes, g, backend, time.perf_counter() - t0, counts["shared"], counts["own"])
        self._variants[key] = v
        while len(self._variants) > max(0, self.max_variants):
            _k, old = self._variants.popitem(last=False)
            _close(old.backend)
        log.info("model %s: prepared shape %s in %.1f ms (%d layers share the weights, %d own)", self.name,
                 shapes, v.prepare_s * 1e3, v.shared, v.own)
        return v

    def _drop_variants(self) -> None:
        while self._variants:
            _k, v = self._variants.popitem()
            _close(v.backend)

    def _adopt(self, other: "Model") -> None:
        """Take over ``other``'s executor and cold load (a rebuilt package), releasing ours."""
        self._drop_variants()
        close = getattr(self._exec, "close", None)
        if close is not None:
            close()
        if self._on_close is not None:
            self._on_close()
        self.graph, self._exec, self._cold, self._on_close = other.graph, other._exec, other._cold, other._on_close
        self.plan, self.package = other.plan, other.package
        # the refinement after the first run re-plans over what the store holds: the rebuilt store's, not the
        # damaged one's (whose plan could read transformed weights the rebuilt store does not hold)
        self._refine, other._refine = other._refine, None
        self._record_binds, other._record_binds = other._record_binds, None
        self._recover = None  # once: a package that is damaged again right after its rebuild is an error
        other._on_close = None
        other._cold = None
        self.thread_choice = ThreadChoice.for_device(self.device)

    def wait_prepared(self) -> None:
        """Block until every layer of a cold load under way is prepared (read, transformed, its pipeline built):
        the loader threads' work, which needs neither this model's lock nor the device's queue; ``wait_loaded``
        then only finishes. Idle-time work (the daemon's finish of a load no request waits on, on the idle worker
        at nice 19): for up to ``PREPARED_DEFER_S`` the layers nobody has started are prepared here only while no
        request runs. A request that comes meanwhile prepares what its first run reaches on its own thread; this
        one had taken each next layer ahead of it, and the request waited for every one at nice 19's share of a
        busy board's cores. Bounded: the idle worker is one queue, and a steady stream of other requests must
        not hold the warm switches and finishes behind this one."""
        cold = self._cold
        if cold is not None and not cold.done:
            until = time.monotonic() + PREPARED_DEFER_S
            cold.run.wait_all(defer=lambda: foreground.busy() and time.monotonic() < until)

    def wait_loaded(self) -> "Model":
        """Finish a cold load without running (the first run then runs warm)."""
        with self._lock:
            cold = self._cold
            if cold is not None and not cold.done:
                cold.wait_loaded()
                self._after_cold(cold)
        return self

    def _after_cold(self, cold: "ColdLoad") -> None:
        self.cold_stats = dict(cold.stats)
        log.info("model %s: cold %.1f ms (predicted %.1f ms)", self.name, cold.stats.get("cold_s", 0) * 1e3,
                 cold.plan.predicted_s * 1e3)
        from .cold import after_answer, start_warm_switch

        after = getattr(self._exec, "after_first_run", None)
        if after is not None:
            after_answer(after)
        if self._record_binds is not None:
            # before the warm switch (the same idle worker, in order): the records are of the plan's kernels
            record, self._record_binds = self._record_binds, None
            closing = self._closing
            self.binds_done = after_answer(lambda: None if closing.is_set() else record())
        self._warm_begun = threading.Event()
        self.warm_done = start_warm_switch(cold, self.device, self._lock, self.cold_stats.update,
                                           may_start=self._warm_switch_may_start)
        self._settled = cold
        if self._refine is not None:
            refine = self._refine
            self._refine = None
            closing, refining = self._closing, self._refining
            from .profiler import IdleBusy

            done = threading.Event()  # set once refined, failed or abandoned at close: not at a put-off

            def job(delay: float = REFINE_RETRY_S) -> None:
                with refining:  # taken before the check: close() either sees it held or the job sees closing
                    try:
                        if not closing.is_set():
                            # (what the run observed is gathered here too: 0.4 ms of a small model's answer
                            # otherwise)
                            new = refine(cold.observed())
                            if new is not None and not closing.is_set():
                                self._follow_plan(cold, new)
                    except IdleBusy as e:
                        if not closing.is_set():
                            log.debug("model %s: idle-time profiling put off %.0f s: %s", self.name, delay, e)
                            # requests left no quiet moment: again later, the idle worker left to the rest
                            retry = threading.Timer(delay, lambda: after_answer(lambda: job(min(2 * delay, 60.0))))
                            retry.daemon = True
                            self._refine_retry = retry  # cancelled by close(): it holds the store's index
                            retry.start()
                            return
                    except Exception:
                        log.exception("model %s: refining the package's plan failed", self.name)
                    done.set()
                # the refinement's profiling backend and any kernels its plan switched out are freed now
                heap.schedule(f"refining model {self.name}")

            self.refine_done = done
            after_answer(job)
        # behind the warm switch and the refinement on the idle worker: the cold kernels' weights and the load's
        # buffers they freed
        heap.schedule(f"the cold load of model {self.name}")

    def _warm_switch_may_start(self) -> bool:
        """The warm switch's job, at its turn: go on (and be waited for by ``close``) unless the model is closing."""
        with self._warm_guard:  # against close(): one of the two sees the other
            if self._closing.is_set():
                return False
            self._warm_begun.set()
            return True

    def _follow_plan(self, cold: "ColdLoad", plan: Any) -> None:
        """Switch the running kernels to a refined plan's warm choices (idle time, on the refinement's worker):
        a model planned from predictions kept the predicted kernels until its next load, which a daemon's model
        may not see for weeks. The layers are prepared outside the run lock and swapped under it, as the warm
        switch does; a failure keeps the kernels that serve now."""
        if self.warm_done is not None and not self.warm_done.is_set():
            log.debug("model %s: warm switch still under way; the refined plan applies at the next load", self.name)
            return
        switches = cold.plan_switches(plan)
        if not switches:
            return
        from .cold import log_swap_failure, swap_in

        try:
            n, _prep, _swap = swap_in(cold, self.device, self._lock, switches, stop=self._closing.is_set)
        except Exception as e:  # the kernels that serve now stay: slower, still correct
            log_swap_failure(cold, "switching to the refined plan's kernels failed, keeping the current ones", e)
            return
        if n:
            self.cold_stats["refined_switch_layers"] = n
            log.info("model %s: %d layers switched to the refined plan's kernels", self.name, n)
            self.thread_choice = ThreadChoice.for_device(self.device)  # other kernels: measured afresh

    @property
    def warm(self) -> bool:
        """Whether runs take the warm path now: the cold load has answered and its warm switch, if any, is done."""
        cold = self._cold
        if cold is not None and not (cold.done and self._settled is cold):
            # a load that finished in idle time is done before _after_cold has its stats and warm switch:
            # status read then said warm with no cold stats (seen once in CI)
            return False
        ev = self.warm_done
        return ev is None or ev.is_set()

    def wait_warm(self, timeout: float | None = None) -> bool:
        """Block until the model runs on its warm path; returns whether it does. A cold load that has not
        answered yet is finished first (``wait_loaded``): the warm switch starts only after it, so waiting
        before the first run would otherwise return at once and leave the switch to run under the caller's
        next runs. ``timeout`` bounds the wait for the switch."""
        cold = self._cold
        if cold is not None and not cold.done:
            self.wait_loaded()
        ev = self.warm_done
        return ev.wait(timeout) if ev is not None else True

    def close(self) -> None:
        self._closing.set()
        cold = self._cold
        if cold is not None and not cold.done:
            cold.cancel()
            cold.wait_stopped(10)  # no layer still prepared, no read still filling what close() drops
        ev = self.warm_done  # a switch under way finishes first: it swaps kernels in under the lock
        with self._warm_guard:  # (one still queued sees ``_closing`` when its turn comes and does nothing)
            under_way = self._warm_begun.is_set()
        if ev is not None and under_way:
            ev.wait(30)
        # a refinement under way (idle-time profiling builds a backend of its own) finishes too: its memory
        # would otherwise outlive the model, counted against a budget that believes it freed. One still queued
        # behind other idle work is not waited for: it sees ``_closing`` and does nothing.
        if self._refining.acquire(timeout=60):
            self._refining.release()
        retry = self._refine_retry
        if retry is not None:
            retry.cancel()
            self._refine_retry = None
        if self.refine_done is not None:
            self.refine_done.set()  # abandoned: nobody waits on a refinement of a closed model
        with self._lock:
            self._drop_variants()
            close = getattr(self._exec, "close", None)
            if close is not None:
                close()
            for g in (self.graph, self.template):
                release = getattr(getattr(g, "constants", None), "release", None)
                if release is not None:
                    release()
            if self._on_close is not None:
                self._on_close()
                self._on_close = None
        heap.schedule(f"closing model {self.name}")

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        ins = ", ".join(f"{t.name}{list(t.shape)}:{np.dtype(t.dtype).name}" for t in self.inputs)
        return f"<inferd.Model {self.name} on {self.device} ({ins})>"


def _close(backend: Any) -> None:
    close = getattr(backend, "close", None)
    if close is not None:
        close()


def _shaped(info: TensorInfo, shape: Sequence[int]) -> np.ndarray:
    """A stand-in feed of ``shape`` (no memory) for validating shapes alone."""
    return np.broadcast_to(np.zeros((), info.dtype), tuple(int(x) for x in shape))


def _load_coexec(path: Any, batch: int, kernels: dict[str, str] | None, name: str | None, shapes: Any,
                 options: dict[str, Any]) -> "Model":
    """``device="cpu+vulkan"``: the co-execution engine in a Model, or the model on the one side it can use
    (with a warning saying why)."""
    import warnings

    from ..coexec.load import DEVICE, CoexecFallback, CoexecWarning, build

    t0 = time.perf_counter()
    try:
        mname, graph, cm = build(path, split=options.pop("split", None), batch=batch, kernels=kernels, name=name,
                                 threads=options.pop("coexec_threads", None), shapes=first_shapes(shapes))
    except CoexecFallback as e:
        msg = f"device 'cpu+vulkan': {e.reason}"
        warnings.warn(msg, CoexecWarning, stacklevel=3)
        log.warning(msg)
        return load(path, device=e.device, batch=batch, kernels=kernels, name=name, shapes=shapes)
    m = Model(mname, graph, cm, DEVICE, time.perf_counter() - t0)
    m.coexec = cm  # type: ignore[attr-defined]
    return m


def _vulkan_available() -> bool:
    from ..vulkan import available

    return available()


def first_shapes(shapes: Any) -> Any:
    """The first of ``load``'s ``shapes`` (one mapping, or a list of them), or None."""
    if not shapes:
        return None
    return dict(shapes) if isinstance(shapes, Mapping) else dict(shapes[0])


def resolve_device(device: str) -> str:
    if device not in ("cpu", "vulkan", "auto"):
        raise ValueError(f"device must be 'cpu', 'vulkan' or 'auto', got {device!r}")
    if device == "auto":
        return "vulkan" if _vulkan_available() else "cpu"
    return device


def _shapes_list(shapes: Any) -> list[dict[str, Any]]:
    """``load``'s ``shapes`` (one mapping, a list of them, or None) as a list."""
    return [dict(shapes)] if isinstance(shapes, Mapping) else [dict(s) for s in (shapes or [])]


@dataclass(frozen=True)
class _PackageKey:
    """What names a model's package in a cache: the device, batch, forced kernels, first shape and precision
    options. One place for ``load`` and ``register``, so a registered package is the one the load then opens."""

    device: str
    batch: int
    kernels: dict[str, str] | None
    shapes: dict[str, tuple[int, ...]] | None
    precision: str
    fp32_layers: tuple[str, ...]
    fp16_arithmetic: bool

    @staticmethod
    def of(dev: str, batch: int, kernels: dict[str, str] | None, todo: list[dict[str, Any]],
           options: Mapping[str, Any]) -> "_PackageKey":
        from ..planner.precision import check_precision

        # precision ("fp32", "fp16", "auto"; with fp32_layers, precision_guard) is planned by the backend from
        # the device's features, or read from a package's plan
        asked = options.get("precision")
        first = {k: tuple(int(x) for x in v) for k, v in todo[0].items()} if todo else None
        return _PackageKey(dev, batch, kernels, first, check_precision(str(asked)) if asked is not None else "fp32",
                           tuple(options.get("fp32_layers") or ()), bool(options.get("fp16_arithmetic", False)))

    def path(self, src: Path, cache_dir: Path) -> Path:
        from ..package import cached_package_path

        return cached_package_path(src, cache_dir, self.batch, self.device, self.kernels, self.shapes,
                                   self.precision, self.fp32_layers, self.fp16_arithmetic)

    def package(self, src: Path, cache_dir: Path, rebuild: bool = False, write: bool = True) -> Path | None:
        from ..package import cached_package

        return cached_package(src, cache_dir, batch=self.batch, device=self.device, kernels=self.kernels,
                              shapes=self.shapes, rebuild=rebuild, write=write, precision=self.precision,
                              fp32_layers=self.fp32_layers, fp16_arithmetic=self.fp16_arithmetic)


@dataclass(frozen=True)
class Registration:
    """What ``register`` did for one model."""

    #: the package its loads will open (None: its loads take no package: an ONNX file without a cache, a model
    #: co-executed on the CPU and the GPU, a model the cache cannot hold)
    package: Path | None
    #: the package was compiled (or rebuilt: stale, damaged) now
    compiled: bool
    #: the package was profiled on this device now (it had been planned from predictions)
    profiled: bool
    #: its plan and store index are parsed in this process now (a load skips reading and parsing them)
    parsed: bool
    seconds: float
    note: str = ""


def register(path: "str | os.PathLike", device: str = "cpu", batch: int = 1,
             kernels: dict[str, str] | None = None,
             shapes: "Mapping[str, Sequence[int]] | Sequence[Mapping[str, Sequence[int]]] | None" = None,
             cache_dir: str | os.PathLike | None = None, profile: bool = False,
             stop: "Callable[[], bool] | None" = None, **options: Any) -> Registration:
    """Make a model's first ``load`` (same arguments) read nothing but its weights: what a daemon does for the
    models of its repository before anyone asks for them. Its package is compiled into ``cache_dir`` where it is
    missing, stale or damaged (planned from predictions, as a first load would), validated for this device, and
    its plan and store index are parsed into the process's memos (``package._parsed``, ``store._indexes``: on the
    2-core VM the first ``load()`` of the zoo's models 2-8 ms shorter, in ``inferd bench cold``'s registered rounds;
    the whole cold answer less so, its reads starting at the open either way). No weight is read. ``profile``: a package
    planned from predictions is also profiled on this device now (seconds of CPU, between requests only: see
    ``package.profile_package``; ``stop()`` true gives up), so that the first load follows measured costs.

    Raises what the load would (a broken ONNX file, a package for options the cache cannot give); a package that
    cannot be rebuilt is reported so, and its load fails the same way."""
    from ..backends.base import transformed_key
    from ..package import fingerprint, open_package, parsed_cached, profile_package, rebuild_package

    t0 = time.perf_counter()
    if device == "cpu+vulkan":
        return Registration(None, False, False, False, 0.0, "co-executed: planned at each load, no package")
    dev = resolve_device(device)
    key = _PackageKey.of(dev, batch, kernels, _shapes_list(shapes), options)
    src = Path(path)
    compiled = False
    if src.is_dir():
        pkg: Path | None = src
        rebuild: Callable[[], Path | None] = lambda: rebuild_package(src, device=dev, batch=batch, kernels=kernels)
    elif cache_dir is not None and src.is_file():
        cdir = cache.holder(cache_dir)
        at = key.path(src, Path(cache_dir))
        had = (at / "plan.bin").is_file()
        try:
            pkg = key.package(src, Path(cache_dir), write=cdir.writable())
        except PackageUnsupported as e:
            return Registration(None, False, False, False, time.perf_counter() - t0, f"not cached: {e}")
        if pkg is None:
            return Registration(None, False, False, False, time.perf_counter() - t0,
                                f"the cache {cdir.root} is {cdir.state}: nothing compiled")
        compiled = not had
        rebuild = lambda: key.package(src, Path(cache_dir), rebuild=True, write=cdir.writable())  # noqa: E731
    else:
        return Registration(None, False, False, False, 0.0, "no package cache: compiled at each load")

    current = fingerprint(dev)

    def opened() -> Any:
        op = open_package(pkg, device=dev, batch=batch, kernels=kernels, current=current,
                          precision=options.get("precision"))
        op.store.close()  # (its index stays parsed; nothing else of it is wanted)
        return op

    try:
        op = opened()
    except PackageOptionsError:
        raise
    except WeightsStoreError as e:
        log.warning("compiled package %s is unusable (%s); rebuilding it", pkg, e)
        pkg = rebuild()
        if pkg is None:
            raise WeightsStoreError(f"{src}: its package is unusable ({e}) and the cache cannot be written now") from e
        compiled = True
        op = opened()
    profiled, note = False, ""
    if profile and op.meta.get("costs") == "predicted":
        from .profiler import IdleBusy

        held = {(e.layer, e.kernel) for e in op.store.entries.values() if e.variant == "transformed"}
        try:
            new = profile_package(pkg, dev, op.plan, lambda layer, k: (layer, transformed_key(dev, k)) in held,
                                  stop=stop)
        except IdleBusy:  # the model's own load profiles it after its first answer, as without registration
            new, note = None, "profiling put off: requests left no quiet moment, or it was stopped"
        if new is not None:
            profiled = True
            opened()  # plan.bin was rewritten: parse the new one
    return Registration(pkg, compiled, profiled, parsed_cached(pkg), time.perf_counter() - t0, note)


def load(path: "str | os.PathLike | bytes | onnx.ModelProto", device: str = "cpu", batch: int = 1,
         kernels: dict[str, str] | None = None,
         shapes: "Mapping[str, Sequence[int]] | Sequence[Mapping[str, Sequence[int]]] | None" = None,
         name: str | None = None, cache_dir: str | os.PathLike | None = None,
         cold: PlanOptions | None = None, loaders: int | None = None, max_variants: int | None = None,
         max_shape: Mapping[str, Sequence[int]] | None = None, **options: Any) -> Model:
    """Load an ONNX model (or a compiled package directory) for ``device`` ('cpu', 'vulkan', 'auto').

    ``kernels`` forces kernels: {node name or op type: kernel name}. With ``cache_dir``, an ONNX file
    is compiled once (profiled and planned on this device) into a package there and later loads read
    the package. Every load follows a cold plan: the call returns while layers are still being
    prepared and the first ``run`` overlaps with that preparation; ``Model.wait_loaded()`` finishes
    the load without running. ``cold`` switches cold-start techniques off (ablations).

    A model with dynamic input dimensions runs at any shape it accepts. ``shapes`` (input name -> shape,
    or a list of them) are the shapes to prepare: the first is the one the model is planned and loaded
    at (unset: the batch at ``batch``, other dynamic dimensions at 224), the others are prepared after
    the load; any other shape is prepared at its first run. ``max_variants`` bounds the shapes kept besides
    the first; ``max_shape`` bounds each input's dimensions (a run beyond them is refused)."""
    if device == "cpu+vulkan":  # CPU-GPU co-execution (inferd.coexec): its own load path, no package
        return _load_coexec(path, batch, kernels, name, shapes, options)
    t0 = time.perf_counter()
    dev = resolve_device(device)
    in_memory = not isinstance(path, (str, os.PathLike))
    opt = cold or PlanOptions()
    todo = _shapes_list(shapes)
    key = _PackageKey.of(dev, batch, kernels, todo, options)
    first = key.shapes

    def finish(m: Model) -> Model:
        if max_variants is not None:
            m.max_variants = max(0, int(max_variants))
        if max_shape:
            m.bounds = {k: tuple(int(x) for x in v) for k, v in max_shape.items()}
            m.prepare([{i.name: i.shape for i in m.inputs}])  # the first shape must be within them too
        if len(todo) > 1:
            m.prepare(todo[1:])
        return m

    if not in_memory and Path(path).is_dir():
        return finish(_from_package(Path(path), dev, batch, kernels, name or Path(path).name, opt, loaders, options,
                                    t0))
    if cache_dir is not None and not in_memory and Path(path).is_file():
        src = Path(path)
        cdir = cache.holder(cache_dir)

        def in_memory_model() -> Model:
            return _from_source(src, dev, batch, kernels, first, name, opt, loaders, options, time.perf_counter())

        def rebuild() -> Path:
            if not cdir.writable():
                raise WeightsStoreError(f"the cache {cdir.root} is {cdir.state}: not rebuilding there")
            try:
                return key.package(src, Path(cache_dir), rebuild=True)  # type: ignore[return-value]
            except OSError as e:
                cdir.report(e, f"rebuilding the package of {src.name}")
                raise WeightsStoreError(f"rebuilding the package of {src} failed: {e}") from e
        try:
            # a cache that failed lately is not written (each try would compile twice); reading a
            # package already there still works on a read-only one
            pkg = key.package(src, Path(cache_dir), write=cdir.writable())
            if pkg is not None:
                cache.touch(pkg)
                return finish(_from_package(pkg, dev, batch, kernels, name or src.stem, opt, loaders, options, t0,
                                            rebuild, in_memory_model))
        except PackageOptionsError:
            raise
        except PackageUnsupported as e:
            log.info("not cached: %s", e)
            return finish(_from_source(path, dev, batch, kernels, first, name, opt, loaders, options, t0, in_memory,
                                       e.template))
        except WeightsStoreError as e:
            log.warning("package cache for %s unusable (%s); loading the ONNX file", path, e)
        except OSError as e:
            if not src.is_file():
                raise
            cdir.report(e, f"compiling {src.name} into the cache")
    return finish(_from_source(path, dev, batch, kernels, first, name, opt, loaders, options, t0, in_memory))


def _from_source(path: Any, dev: str, batch: int, kernels: dict[str, str] | None,
                 shapes: Mapping[str, Sequence[int]] | None, name: str | None, opt: PlanOptions,
                 loaders: int | None, options: dict[str, Any], t0: float, in_memory: bool = False,
                 template: Graph | None = None) -> Model:
    """The model compiled in memory from its ONNX source (no cache involved), planned at ``shapes``; ``template``:
    the source already imported at these ``batch`` and ``shapes``."""
    from ..frontend import import_template, specialize

    if template is None:
        template = import_template(path, batch=batch, shapes=shapes)
    mname = name or (template.name if in_memory else Path(path).stem)
    graph = specialize(template)
    if dev == "vulkan" and graph.runtime_shaped:
        split = _runtime_split_model(mname, graph, kernels, opt, loaders, options, t0,
                                     template if template.dynamic else None)
        if split is not None:
            return split
    return _planned_model(mname, graph, dev, kernels, opt, loaders, options, t0, None, None, template)


def _split_executor(graph: Graph, kernels: dict[str, str] | None, opt: PlanOptions, loaders: int | None,
                    options: dict[str, Any], t0: float) -> Any:
    """``graph``'s static head loaded on Vulkan and its run-time shaped tail on the CPU engine
    (``inferd.runtime.split_runtime``); None when the graph does not split (the Vulkan backend then refuses it)."""
    from .cpu import CpuExecutor
    from .split_runtime import SplitExecutor, split_at_runtime_shapes

    split = split_at_runtime_shapes(graph)
    if split is None:
        return None
    head = _planned_model(split.head.name, split.head, "vulkan", kernels, opt, loaders, options, t0, None, None)
    try:
        # forced kernels name Vulkan kernels or nodes of the head; the tail takes the CPU engine's own choice
        tail = CpuExecutor(split.tail)
    except BaseException:
        head.close()
        raise
    return SplitExecutor(split, head, tail, [t.name for t in graph.outputs])


def _runtime_split_model(mname: str, graph: Graph, kernels: dict[str, str] | None, opt: PlanOptions,
                         loaders: int | None, options: dict[str, Any], t0: float,
                         template: Graph | None = None) -> Model | None:
    """A Vulkan model with a run-time shaped tail: split at its first shape, and with a dynamic ``template`` at
    each other shape it is run at (its variants; they do not share weights with the first: each head is its own
    Vulkan model)."""
    ex = _split_executor(graph, kernels, opt, loaders, options, t0)
    if ex is None:
        return None
    log.info("%s: %d nodes shaped at run time run on the CPU after the Vulkan part", mname, len(ex.split.tail.nodes))

    def variant(g: Graph) -> Any:
        v = _split_executor(g, kernels, opt, loaders, options, time.perf_counter())
        if v is None:
            raise BackendError(f"{mname}: at shape {[list(t.shape) for t in g.inputs]} the graph does not split into a "
                               "static Vulkan part and a CPU tail")
        return v
    return Model(mname, graph, ex, "vulkan", time.perf_counter() - t0, template=template,
                 make_backend=variant if template is not None else None)


def _from_package(pkg: Path, dev: str, batch: int, kernels: dict[str, str] | None, mname: str, opt: PlanOptions,
                  loaders: int | None, options: dict[str, Any], t0: float,
                  rebuild: "Callable[[], Path] | None" = None,
                  in_memory: "Callable[[], Model] | None" = None) -> Model:
    """A model from a compiled package, following its stored plan; a damaged or stale package is rebuilt
    (from its source) once, never used."""
    from ..package import fingerprint, open_package, rebuild_package
    from ..planner.precision import PrecisionPlan

    from .scheduler import IO_WORKERS, worker

    current = fingerprint(dev)
    asked = options.get("precision")

    def stream_io(stored: ColdPlan) -> Any:
        # the stored plan's reads start at the open, where this load follows that plan
        return [worker(n) for n in IO_WORKERS] if _follows(stored, dev, opt, loaders) else None

    try:
        op = open_package(pkg, device=dev, batch=batch, kernels=kernels, current=current, precision=asked, cold=True,
                          stream=stream_io)
    except PackageOptionsError:
        raise
    except WeightsStoreError as e:
        log.warning("compiled package %s is unusable (%s); rebuilding it", pkg, e)
        pkg = rebuild() if rebuild is not None else rebuild_package(pkg, device=dev, batch=batch, kernels=kernels)
        op = open_package(pkg, device=dev, batch=batch, kernels=kernels, current=current, precision=asked, cold=True,
                          stream=stream_io)
    stored_precision = PrecisionPlan.from_dict(op.meta["precision"]) if op.meta.get("precision") else None
    if stored_precision is not None and dev != "cpu":
        # the package's plan is authoritative: its precision too (no weights read to re-decide it)
        options = {k: v for k, v in options.items() if k not in ("fp32_layers", "precision_guard", "fp16_arithmetic")}
        options["precision"] = stored_precision
    plan = op.plan
    if not _follows(plan, dev, opt, loaders):
        plan = None  # re-planned from the package's profile by _planned_model
    elif opt != plan.options:  # run-time switches only (stealing, warm switch)
        plan = dataclasses.replace(plan, options=opt)
    model = _planned_model(mname, op.graph, dev, kernels, opt, loaders, options, t0, plan, op, op.template)
    model.package = op.path
    if model.precision is None:
        model.precision = stored_precision
    if op.profile_ref is not None:  # (its parse waits for the refinement, after the answer)
        from ..package import refine_package

        backend = model._exec
        stored = model._cold.weights.has_transformed if model._cold is not None else (lambda _l, _k: False)
        used = model.plan
        ws = model._cold.weights if model._cold is not None else None
        layers = model._cold.layers if model._cold is not None else None
        reads = (lambda p: ws.planned_entries(layers, p)) if ws is not None and layers is not None else None
        model._refine = lambda observed: refine_package(op.path, backend, used, op.profile, observed, stored,
                                                        reads=reads)
    elif op.meta.get("costs") == "predicted":  # ("roofline": compiled with --no-profile, measuring not wanted)
        from ..package import profile_package

        stored = model._cold.weights.has_transformed if model._cold is not None else (lambda _l, _k: False)
        used = model.plan
        # planned without measuring (at registration): measure in idle time, after the first run answered
        model._refine = lambda _observed: profile_package(op.path, dev, used, stored, stop=model._closing.is_set)

    source = str(op.meta.get("source", ""))

    def recover() -> Model | None:
        if rebuild is None and not Path(source).is_file():
            return None  # nothing to rebuild from: the damage stays an error
        try:
            fresh = rebuild() if rebuild is not None else rebuild_package(pkg, device=dev, batch=batch, kernels=kernels)
            return _from_package(fresh, dev, batch, kernels, mname, opt, loaders, options, time.perf_counter())
        except (WeightsStoreError, OSError) as e:
            if in_memory is None:
                raise
            # the cache cannot give a sound package now (a failing or full disk): the source can
            log.warning("%s: %s; compiling it in memory", mname, e)
            return in_memory()
    # a damaged store can be rebuilt where the package records an ONNX file that still exists; whether it
    # does is asked at the rebuild: here, after a dropped page cache, the stat waited 4-18 ms behind this
    # load's own reads
    if rebuild is not None or source:
        model._recover = recover
    return model


def _follows(plan: "ColdPlan", dev: str, opt: PlanOptions, loaders: int | None) -> bool:
    """Whether a load with options ``opt`` and ``loaders`` follows a package's stored ``plan`` (else it re-plans from
    the package's profile): the same planning switches and loader threads; run-time switches may differ."""
    planning = ("select", "cache", "pipeline", "executor_prepares", "force_source")
    return not (any(getattr(opt, f) != getattr(plan.options, f) for f in planning)
                or (loaders is not None and _loaders_for(dev, loaders) != plan.loaders))


def _loaders_for(dev: str, loaders: int) -> int:
    """Loader threads a plan gets for ``loaders`` threads in all (on the CPU the executor is one of them)."""
    return max(0, int(loaders) - 1) if dev == "cpu" else max(1, int(loaders))


def _planned_model(mname: str, graph: Graph, dev: str, kernels: dict[str, str] | None, opt: PlanOptions,
                   loaders: int | None, options: dict[str, Any], t0: float, plan: "ColdPlan | None",
                   op: Any, template: Graph | None = None) -> Model:
    from ..backends.base import WeightSource
    from ..package import make_backend, make_plan
    from . import bindrec
    from .cold import ColdLoad

    first = dict(options)
    if plan is not None and dev != "cpu":
        # the stored plan's kernels are the layers' only candidates: no kernel is asked whether it applies
        first["planned"] = {lp.name: tuple(k for k in (lp.kernel, lp.warm_kernel) if k) for lp in plan.layers}
    if op is not None and dev == "cpu":
        first["run_graph"] = op.run_graph  # the package's layout plan, applied when it was opened
        first["memory"] = op.memory  # and its activation plan
    ws = WeightSource(graph.constants, op.store if op is not None else None, dev)
    if plan is not None and op is not None:
        # the stored plan says what to read: the disk starts now, beside the backend's set-up, not after it
        from .scheduler import IO_WORKERS, worker

        ws.start_stream_early(op.run_graph, plan, [worker(n) for n in IO_WORKERS], started=op.stream)
    elif op is not None and op.stream is not None:
        op.stream.release()  # re-planned: the stored plan's reads are not this load's
    try:
        faults.check("backend.load")
        backend = make_backend(graph, dev, kernels, **first)
    except BaseException:
        ws.stop_stream()
        if op is not None:
            op.store.close()
        raise
    binds_key = None
    # recorded binds: the CPU executor's (``runtime.bindrec``) and the Vulkan backend's (``vulkan.binds``), each in
    # its own file of the package; another backend (a split model's) records none
    binds_file = getattr(backend, "binds_file", bindrec.FILE)
    binds_magic = getattr(backend, "binds_magic", bindrec.MAGIC)
    if plan is not None and op is not None and bindrec.enabled() and hasattr(backend, "binds"):
        binds_key = {**bindrec.key_of(op.meta), **getattr(backend, "binds_key", {})}
        backend.binds = bindrec.load(op.path, binds_key, binds_file, binds_magic)
    try:
        if plan is None:
            # planned here: from the package's profile (other options than its stored plan's) or from the
            # roofline (an in-memory model), over the transformed weights the store holds (none in memory)
            prof = op.profile if op is not None else None
            pred = None
            if prof is None:  # no measurements: the latency predictor's costs where this device has one
                from ..package import backend_fingerprint, device_predictor

                pred = device_predictor(dev, backend_fingerprint(backend, dev))
            plan = make_plan(backend, backend.candidates(), prof, opt, loaders, stored=ws.has_transformed,
                             predictor=pred, constants=graph.constants)
        cold = ColdLoad(backend, plan, ws, mname, backend.layers())
    except BaseException:
        ws.stop_stream()
        close = getattr(backend, "close", None)
        if close is not None:
            close()
        if op is not None:
            op.store.close()
        raise
    on_close = op.store.close if op is not None else None
    model = Model(mname, graph, backend, dev, time.perf_counter() - t0, cold=cold, on_close=on_close,
                  template=template, make_backend=lambda g: make_backend(g, dev, kernels, **options))
    if binds_key is not None:
        model._record_binds = lambda: _record_binds(op.path, binds_key, backend, binds_file, binds_magic)
    return model


def _record_binds(pkg: Path, key: dict[str, Any], backend: Any, file: str, magic: bytes) -> None:
    """Write the binds of a cold load's layers into its package where they differ from the ones it read (none,
    stale, or a refined plan's other kernels)."""
    from . import bindrec

    recs = backend.record_binds() if hasattr(backend, "record_binds") else bindrec.record(backend)
    if recs and recs != (backend.binds or {}) and bindrec.save(pkg, key, recs, file, magic):
        log.debug("%s: %d of %d layers' binds recorded in %s", pkg, len(recs), len(backend.layers()), file)
