"""Executor v0 for the CPU: sequential, every activation a view into one preallocated arena.

All views, kernels and transformed weights are prepared at load, so a warm run is a loop of
kernel calls with no allocation beyond what numpy does inside a kernel.
"""
from __future__ import annotations

import functools
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .. import native
from ..errors import BackendError, InputError, ShapeError
from ..fileio import VECTOR_ALIGN, aligned_bytes, cache_aligned
from ..frontend.shapes import check_dims
from ..ir import Graph, Subgraph, TensorInfo
from ..ops import control as _control
from ..ops.base import (Kernel, Layer, bounded_view, choose_kernel, kernels_for, layer_at, op_spec, raw_params,
                        run_at_run_shapes)
from ..ops.tensor import copies_call
from ..backends.base import forget_raw
from ..planner.memory import MemoryPlan, plan_graph_memory
from . import bindrec


@dataclass
class Step:
    layer: Layer
    kernel: Kernel
    inputs: list[np.ndarray | None]
    outputs: list[np.ndarray]
    params: dict[str, np.ndarray]
    alias: bool
    #: the kernel's pre-bound call (Kernel.bind), or None: run() goes through kernel.run
    bound: Callable[[], None] | None = None
    #: ``bound`` rebuilt from the package's recorded bind (``runtime.bindrec``), not bound
    replayed: bool = False

    def call(self) -> Callable[[], None]:
        if self.bound is not None:
            return self.bound
        return functools.partial(self.kernel.run, self.layer, self.inputs, self.params, self.outputs)


def forced_for(layer: Layer, kernels: dict[str, str] | None) -> str | None:
    """A forced kernel by node name (exact) or op type; node names win."""
    if not kernels:
        return None
    return kernels.get(layer.name, kernels.get(layer.op))


def select_kernels(graph: Graph, backend: str = "cpu", kernels: dict[str, str] | None = None) -> list[tuple[Layer, Kernel]]:
    """Kernel per node. A kernel forced by node name must apply (``KernelError`` otherwise); one forced
    by op type is used wherever it applies and the default elsewhere (a 3x3 kernel forced on "Conv"
    leaves the 1x1 convs alone). An unknown kernel name is always an error."""
    out = []
    for node in graph.nodes:
        layer = Layer.of(node, graph)
        forced = forced_for(layer, kernels)
        k = choose_kernel(layer, backend, forced) if forced is None or layer.name in (kernels or {}) else None
        if k is None:
            named = [c for c in kernels_for(layer.op, backend) if c.name == forced]
            if not named:
                choose_kernel(layer, backend, forced)  # raises: names the op and the known kernels
            k = named[0] if named[0].applies(layer) else choose_kernel(layer, backend)
        out.append((layer, k))
    return out


def candidate_kernels(layer: Layer, backend: str, forced: str | None, by_name: bool) -> tuple[list[Kernel], Kernel]:
    """The kernels a planner may choose for ``layer`` and its warm default. A kernel forced by node name
    is the only candidate; one forced by op type is where it applies. Reference-speed kernels
    (priority >= 90) are candidates only where nothing faster applies."""
    if forced is not None and by_name:
        k = choose_kernel(layer, backend, forced)
        return [k], k
    if forced is not None:
        named = [c for c in kernels_for(layer.op, backend) if c.name == forced]
        if not named:
            choose_kernel(layer, backend, forced)  # raises: names the op and the known kernels
        if named[0].applies(layer):
            return [named[0]], named[0]
    default = choose_kernel(layer, backend)
    ok = [k for k in kernels_for(layer.op, backend) if k.applies(layer)]
    fast = [k for k in ok if k.priority < 90]
    cands = fast if fast else ok
    if default not in cands:
        cands = [default] + cands
    return cands, default


def bounded_call(step: Step, dyn: dict[str, np.ndarray]) -> Callable[[], None]:
    """A data-dependent node's run: its kernel writes into the arena buffers planned at the outputs' bounds and
    says how much of them this run's values fill; those views are what later nodes and the caller read."""
    layer, k, ins, p, outs = step.layer, step.kernel, step.inputs, step.params, step.outputs
    names = [o for o in layer.node.outputs if o]

    bound = k.bind_bounded(layer, ins, p, outs)
    run = bound if bound is not None else functools.partial(k.run_bounded, layer, ins, p, outs)

    def call() -> None:
        for name, buf, shape in zip(names, outs, run()):
            dyn[name] = bounded_view(buf, shape)

    return call


@dataclass
class LoadStats:
    transform_s: float = 0.0
    plan_s: float = 0.0
    kernels: dict[str, int] = field(default_factory=dict)


class CpuExecutor:
    """The CPU backend: one arena for the activations, one bound native call per layer.

    Built whole (``lazy=False``: every layer transformed and bound now) or layer by layer by the cold
    runtime (``prepare`` from loader threads, ``execute`` in order), which is the ``ColdBackend`` contract.
    """

    name = "cpu"
    gpu = False
    #: consecutive native layers run as one C call (native.fuse_calls); False: one Python call per layer (A/B
    #: timings, and the tests that check the two agree)
    fuse_steps = True

    def __init__(self, graph: Graph, kernels: dict[str, str] | None = None,
                 params: dict[str, dict[str, np.ndarray]] | None = None, *,
                 choice: Sequence[tuple[Layer, Kernel]] | None = None, lazy: bool = False,
                 memory: MemoryPlan | None = None) -> None:
        """``params`` may carry already transformed weights per layer (from a weights store); ``choice``
        fixes the kernel per node (a cold plan's); ``lazy`` leaves the layers for ``prepare``; ``memory``: the
        activations' plan made for ``graph`` before (a package's), else planned here."""
        self.graph = graph
        self.stats = LoadStats()
        self._forced = kernels
        # a cold load leaves the slow way (threadpoolctl, with the GIL held) to after its first answer
        native.claim_cores(slow_ok=not lazy)
        t0 = time.perf_counter()
        self.plan: MemoryPlan = memory if memory is not None else plan_graph_memory(graph)
        self.arena = aligned_bytes(max(self.plan.total, 1), VECTOR_ALIGN)  # (the host pool's, where there is one)
        self.stats.plan_s = time.perf_counter() - t0
        self.views: dict[str, np.ndarray] = {}
        #: values of the tensors shaped at run time (``graph.runtime_shaped``), this run's
        self._dyn: dict[str, np.ndarray] = {}
        consts, aliases, offsets, arena = graph.constants, self.plan.aliases, self.plan.offsets, self.arena
        for name, info in graph.infos.items():
            if name in consts:
                continue
            off = offsets.get(aliases.get(name, name))
            if off is None:
                continue
            # one constructor rather than slice, view and reshape: a cold load makes a view per tensor before
            # its first layer runs (shufflenetv2: ~300)
            self.views[name] = np.ndarray(info.shape, info.dtype, arena, off)
        if choice is not None:
            self.choice: list[tuple[Layer, Kernel | None]] = list(choice)
        elif lazy:  # the cold plan names each layer's kernel; prepare() looks it up
            self.choice = [(Layer.of(n, graph), None) for n in graph.nodes]
        else:
            self.choice = list(select_kernels(graph, "cpu", kernels))
        self.steps: list[Step | None] = [None] * len(self.choice)
        #: recorded binds of the package this executor loads (``runtime.bindrec``): a layer with one is rebuilt
        #: from it rather than bound; set before the cold load starts preparing
        self.binds: dict[str, bindrec.Record] | None = None
        self._arena_at = bindrec.address(self.arena)
        self._shared: set[int] = set()  # layers whose weights another shape of the model owns (adopt)
        self._calls: list[Callable[[], None]] = []
        self._step_calls: list[Callable[[], None]] = []
        self.inputs: list[TensorInfo] = list(graph.inputs)
        self.outputs: list[TensorInfo] = list(graph.outputs)
        # resolved once, so a run does no lookups: per input (name, its buffer's item assignment, dtype; an
        # input no node reads has no buffer), per output (name, its array; None: shaped at run time, read from
        # that run's values)
        self._feed_sets: list[tuple[str, Callable[..., None], np.dtype]] = [
            (t.name, self.views[t.name].__setitem__, np.dtype(t.dtype)) for t in self.inputs if t.name in self.views]
        #: graph inputs read only by layers that can read them from the caller's array (``_direct_inputs``):
        #: (name, its arena view, those layers' retargets); and what each was last pointed at
        self._direct: list[tuple[str, np.ndarray, list[Callable[[np.ndarray], None]]]] = []
        self._target: dict[str, np.ndarray] = {}
        self._out_srcs: list[tuple[str, np.ndarray | None]] = [
            (t.name, None if t.name in graph.runtime_shaped else
             graph.constants[t.name] if t.name in graph.constants else self.views[t.name]) for t in self.outputs]
        if not lazy:
            t0 = time.perf_counter()
            for pos, (layer, k) in enumerate(self.choice):
                assert k is not None
                p = params.get(layer.name) if params is not None else None
                self._build(pos, k, None if p is not None else self._raw(layer), p)
            self.stats.transform_s = time.perf_counter() - t0
            self.finalize()

    # ------------------------------------------------------------------ the ColdBackend contract
    def layers(self) -> list[Layer]:
        return [layer for layer, _k in self.choice]

    def candidates(self) -> list[tuple[Layer, list[Kernel], Kernel]]:
        out = []
        for layer in self.layers():
            forced = forced_for(layer, self._forced)
            cands, default = candidate_kernels(layer, "cpu", forced, layer.name in (self._forced or {}))
            out.append((layer, cands, default))
        return out

    def _raw(self, layer: Layer) -> dict[str, np.ndarray]:
        return raw_params(layer, self.graph.constants)

    def _build(self, pos: int, k: Kernel, raw: dict[str, np.ndarray] | None,
               params: dict[str, np.ndarray] | None) -> Step:
        layer = self.choice[pos][0]
        graph = self.graph
        spec = op_spec(layer.op)
        # only output 0 shares the input's memory: a node with more outputs (Dropout's mask) must run
        alias = bool(spec and spec.alias and layer.node.inputs and layer.node.inputs[0] not in graph.constants
                     and len([o for o in layer.node.outputs if o]) == 1)
        if params is not None:
            p = params
        else:  # transformed here from raw: on cache lines, as the store's reads are (the kernels load 64-byte vectors)
            p = k.transform(layer, raw if raw is not None else self._raw(layer))
            p = {n: cache_aligned(a) for n, a in p.items()}
        ins = [None if (not n or n in graph.constants) else self.views[n] for n in layer.node.inputs]
        outs = [self.views[o] for o in layer.node.outputs if o]
        step = Step(layer, k, ins, outs, p, alias)
        rs = graph.runtime_shaped
        if rs and spec is not None and spec.bounded is not None and any(o in rs for o in layer.node.outputs if o) \
                and not any(n in rs for n in layer.node.inputs if n):
            step.alias = False  # data-dependent outputs: the kernel fills their planned bounds in the arena
            step.bound = bounded_call(step, self._dyn)
        elif rs and any(n in rs for n in list(layer.node.inputs) + list(layer.node.outputs) if n):
            step.alias = False
            step.bound = self._runtime_shaped_call(layer, k, p)
        elif not alias:
            rec = self.binds.get(layer.name) if self.binds else None
            got = bindrec.replay(rec, k.name, self.arena, self._arena_at, p, lambda: k.bind(layer, ins, p, outs)) \
                if rec is not None else None
            step.replayed = got is not None
            step.bound = got if got is not None else k.bind(layer, ins, p, outs)
        self.choice[pos] = (layer, k)
        self.steps[pos] = step
        self.stats.kernels[k.name] = self.stats.kernels.get(k.name, 0) + 1
        return step

    def _runtime_shaped_call(self, layer: Layer, k: Kernel | None = None,
                             params: dict[str, np.ndarray] | None = None) -> Callable[[], None]:
        """A node reading or writing tensors whose shape only the run tells: its chosen kernel ``k`` with the
        weights it transformed at load, where the run's shapes leave that transform valid (``at_run_shapes``), else
        the numpy oracle on the values, or a data-dependent op's CPU kernel (``run_at_run_shapes``; those tensors
        live in ``self._dyn``, not in the arena); its other outputs go to their arena views."""
        node, graph = layer.node, self.graph
        rs = graph.runtime_shaped
        dyn = self._dyn
        kernel_run = at_run_shapes(layer, k, params, graph.constants) if k is not None and params is not None \
            else None

        def call() -> None:
            vals = [None if not n else dyn[n] if n in rs else graph.constants[n] if n in graph.constants
                    else self.views[n] for n in node.inputs]
            got = kernel_run(vals) if kernel_run is not None else None
            for o, r in zip(node.outputs, got if got is not None else run_at_run_shapes(node, vals)):
                if not o:
                    continue
                if o in rs:
                    dyn[o] = np.asarray(r)
                else:
                    np.copyto(self.views[o], r)

        return call

    def prepare(self, pos: int, lp: Any, arrays: dict[str, np.ndarray]) -> dict[str, float]:
        layer = self.choice[pos][0]
        # the plan's kernel as named: a plan is made from kernels that applied to these layers (a package's for this
        # device and engine, its fingerprint checked); asking each again, here and in prefault, cost shufflenetv2's
        # 140 layers 2.3 ms of CPU a cold load (2-core VM), half of it under the executor's feet
        k = choose_kernel(layer, "cpu", lp.kernel, check=False)
        t0 = time.perf_counter()
        if lp.source == "transformed":
            self._build(pos, k, None, arrays)
        else:
            self._build(pos, k, arrays, None)
        return {"transform_s": time.perf_counter() - t0}

    def adopt(self, donor: "CpuExecutor") -> dict[str, int]:
        """Prepare every layer from ``donor``, the same model at another input shape: its transformed weights
        (the very arrays: one copy for every shape) where its transform reads nothing that changed, with this
        shape's default kernel where that kernel takes weights of the same form (``Kernel.weights_form``), else
        with the donor's kernel where it applies here; the other layers get their default kernel, transformed
        from the raw constants. Then ``finalize``. Returns how many layers shared and how many did not."""
        theirs = {s.layer.name: s for s in donor.steps if s is not None}
        shared = own = 0
        for pos, (layer, _k) in enumerate(self.choice):
            s = theirs.get(layer.name)
            forced = forced_for(layer, self._forced)
            _c, k = candidate_kernels(layer, "cpu", forced, layer.name in (self._forced or {}))
            if s is not None and layer.const_inputs and \
                    s.kernel.transform_key(s.layer) == s.kernel.transform_key(layer):
                # this shape's default kernel where it takes the donor's weights as they are (the same form);
                # else the donor's kernel where it applies here
                same_form = k.takes_weights_of(s.kernel) and k.transform_key(layer) == s.kernel.transform_key(layer)
                use = k if same_form else s.kernel if s.kernel.applies(layer) else None
                if use is not None:
                    self._build(pos, use, None, s.params)
                    self._shared.add(pos)
                    shared += 1
                    continue
            self._build(pos, k, None, None)
            if layer.const_inputs:
                forget_raw(self.graph.constants, layer)
                own += 1
        self.finalize()
        return {"shared": shared, "own": own}

    def prefault(self, kernels: Sequence[str]) -> None:
        """Fault in the arena and the first run's kernel workspaces (``kernels``: per layer, the cold
        run's kernel) on the calling thread, off the executor's critical path; ``begin`` adopts them."""
        from ..ops.conv import prefault_scratch
        from .hostpool import fault_in

        sizes: dict[int, int] = {}
        for (layer, _k), name in zip(self.choice, kernels):
            try:
                k = choose_kernel(layer, "cpu", name, check=False)
            except Exception:
                continue  # prepare will report it
            for slot, n in k.scratch_floats(layer).items():
                sizes[slot] = max(sizes.get(slot, 0), n)
        scratch = prefault_scratch(sizes)  # first: small, and what begin() adopts if it is there
        if getattr(self, "_closed", False):  # closed meanwhile (this runs beside the load): nothing to keep
            return
        self._scratch = scratch
        # the arena last, faulted in without writing where the kernel can (the executor may be running
        # in it already: ColdLoad waits for this only where zeros must be written instead); not the host
        # pool's, faulted in at the daemon's start: walking its pages again took mobilenetv2's 6.5 MB arena
        # 1-2.7 ms of a core the loader and the executor wanted
        fault_in(self.arena)

    def prefault_concurrent(self) -> bool:
        """Whether ``prefault`` may run beside a run: it only faults pages in, writing nothing."""
        from .pagecache import can_populate

        return can_populate()

    @property
    def load_stats(self) -> dict[str, Any]:
        """What the cold load's preparation did: ``binds_replayed``, the layers rebuilt from the package's recorded
        binds rather than bound."""
        return {"binds_replayed": sum(1 for s in self.steps if s is not None and s.replayed)}

    def begin(self, feeds: dict[str, np.ndarray]) -> None:
        self._check_open()
        scratch = getattr(self, "_scratch", None)
        if scratch:
            from ..ops.conv import adopt_scratch

            adopt_scratch(scratch)
            self._scratch = None
        self._put_feeds(feeds)

    def _put_feeds(self, feeds: dict[str, np.ndarray]) -> None:
        direct = self._direct
        if direct:
            for name, view, retargets in direct:
                a = feeds[name]
                if type(a) is not np.ndarray or a.dtype != view.dtype or a.shape != view.shape or \
                        not a.flags.c_contiguous or not a.flags.aligned:
                    a = view  # copied below; its readers read it where they were bound to
                if self._target.get(name) is not a:
                    for r in retargets:
                        r(a)
                    self._target[name] = a
        # item assignment where a feed has the input's type (copyto(casting="no") raises for the others)
        for name, put, dt in self._feed_sets:
            a = feeds[name]
            if direct and self._target.get(name) is a:
                continue  # read where the caller has it
            if getattr(a, "dtype", None) == dt:
                put(Ellipsis, a)
            else:
                np.copyto(self.views[name], a, casting="no")

    def execute(self, pos: int, flush: bool = False) -> None:
        step = self.steps[pos]
        assert step is not None, f"layer {pos} executed before it was prepared"
        if not step.alias:
            step.call()()

    def execute_run(self, lo: int, hi: int) -> list[float]:
        """Execute layers ``lo`` to ``hi`` - 1 (all prepared) as few calls as their native steps allow
        (``native.run_timed``); ``time.perf_counter()`` at the end of each (a layer that aliases its input: that of
        the one before)."""
        t = time.perf_counter()
        calls = []
        for pos in range(lo, hi):
            step = self.steps[pos]
            assert step is not None, f"layer {pos} executed before it was prepared"
            if not step.alias:
                calls.append(step.call())
        done = iter(native.run_timed(calls))
        out = []
        for pos in range(lo, hi):
            if not self.steps[pos].alias:  # type: ignore[union-attr]
                t = next(done)
            out.append(t)
        return out

    def end(self) -> dict[str, np.ndarray]:
        dyn = self._dyn
        return {name: (np.array(dyn[name]) if src is None else src.copy()) for name, src in self._out_srcs}

    def after_first_run(self) -> None:
        """Idle-time work once a cold load has answered: hold numpy's BLAS to one thread where the load could
        not set it directly (threadpoolctl scans every loaded library: 7-18 ms with the GIL held, too long for
        the answer path); a no-op where it did."""
        native.claim_cores()

    def finalize(self) -> None:
        missing = [self.choice[i][0].name for i, s in enumerate(self.steps) if s is None]
        if missing:
            raise RuntimeError(f"layers not prepared: {missing[:5]}")
        self._step_calls = [s.call() for s in self.steps if s is not None and not s.alias]
        self._calls = native.fuse_calls(self._step_calls) if self.fuse_steps else list(self._step_calls)
        self._direct = self._direct_inputs()
        self._target = {}  # a rebuilt layer reads its arena view: every reader is pointed anew by the next run

    def _direct_inputs(self) -> list[tuple[str, np.ndarray, list[Callable[[np.ndarray], None]]]]:
        """The graph inputs that every reader can read from the caller's array (its bound call's ``retarget``,
        as its input 0): ``run`` points them at the feed instead of copying it into the arena, as onnxruntime
        reads the caller's buffer (MobileNetV2's 224x224 image: a 600 KB copy, 1.5-3% of a warm run on two
        cores). Not an input that is also an output, nor one any other layer reads or aliases."""
        readers: dict[str, list[tuple[int, Step]]] = {}
        names = {t.name for t in self.inputs if t.name in self.views}
        for s in self.steps:
            if s is None:
                continue
            for i, n in enumerate(s.layer.node.inputs):
                if n in names:
                    readers.setdefault(n, []).append((i, s))
        outs = {t.name for t in self.outputs}
        out = []
        for t in self.inputs:
            rs = readers.get(t.name)
            if not rs or t.name not in names or t.name in outs or t.name in self.graph.runtime_shaped:
                continue
            if all(i == 0 and not s.alias and s.bound is not None and hasattr(s.bound, "retarget") for i, s in rs):
                out.append((t.name, self.views[t.name], [getattr(s.bound, "retarget") for _i, s in rs]))
        return out

    def _use_views(self) -> None:
        """Point the direct inputs' readers back at the arena (a caller that fills the views itself)."""
        for name, view, retargets in self._direct:
            if self._target.get(name) is not view:
                for r in retargets:
                    r(view)
                self._target[name] = view

    def kernel_params(self, pos: int) -> tuple[Kernel, dict[str, np.ndarray]] | None:
        """Layer ``pos``'s kernel and transformed params now (None before it is prepared)."""
        s = self.steps[pos]
        return None if s is None else (s.kernel, s.params)

    def swap(self, pos: int, kernel: Kernel, params: dict[str, np.ndarray]) -> None:
        """Replace layer ``pos``'s kernel (the warm switch); the caller holds the model's run lock."""
        old = self.steps[pos]
        # the warm switch's params: read from the store, or transformed from raw where the store has none
        self._build(pos, kernel, None, {n: cache_aligned(a) for n, a in params.items()})
        self._shared.discard(pos)
        if old is not None:
            self.stats.kernels[old.kernel.name] = self.stats.kernels.get(old.kernel.name, 1) - 1
        self.finalize()

    def close(self) -> None:
        """Let go of the arena, the weights and the bound kernels now. A closed model is often still reachable
        through reference cycles (its cold load's callbacks, its idle-time jobs) that only the collector breaks,
        and a daemon's full collections are rare: an unloaded resnet18 kept its 119 MB of the host pool in use,
        so the next loads fell back to fresh memory. Runs after this raise."""
        self._closed = True
        self._calls, self._step_calls, self._direct, self._feed_sets, self._out_srcs = [], [], [], [], []
        self._target, self._dyn, self.views = {}, {}, {}
        self.steps = [None] * len(self.steps)
        self._scratch = None
        self.arena = np.empty(0, np.uint8)

    def _check_open(self) -> None:
        if getattr(self, "_closed", False):
            raise BackendError("the model was closed")

    @property
    def memory_breakdown(self) -> dict[str, int]:
        """``arena_bytes`` (activations) and ``weights_bytes`` (transformed weights this executor owns)."""
        arena = int(self.arena.nbytes)
        return {"arena_bytes": arena, "weights_bytes": self.memory_bytes - arena}

    @property
    def memory_bytes(self) -> int:
        """The arena and the weights this executor owns (not those it shares with another shape's)."""
        return int(self.arena.nbytes + sum(a.nbytes for pos, s in enumerate(self.steps)
                                           if s is not None and pos not in self._shared
                                           for a in s.params.values() if isinstance(a, np.ndarray)))

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not self._calls:
            self._check_open()
        self._put_feeds(feeds)
        for call in self._calls:
            call()
        return self.end()

    def bind_run(self, sources: Mapping[str, np.ndarray | None], dests: Sequence[tuple[str, np.ndarray]],
                 after: Callable[[str], None] | None = None) -> Callable[[], None] | None:
        """A run over fixed buffers as one call (a control-flow body inside its node's arena, a co-executed
        model's CPU region): each graph input copied from ``sources[name]``, the kernels, each (output name,
        buffer) of ``dests`` filled (a list: a body may give one tensor as two outputs); no feeds dict,
        no checks and no result arrays per run (``run`` makes those for a caller whose arrays change). None when
        a buffer does not have the planned shape and type, or a tensor is shaped at run time. ``after``: called
        with each layer's name once it ran (a traced run, for per-layer timings)."""
        if self.graph.runtime_shaped:
            return None
        ins = []
        for t in self.inputs:
            src = sources.get(t.name)
            if src is None or tuple(src.shape) != tuple(t.shape) or src.dtype != t.dtype:
                return None
            if t.name in self.views:  # an input no node reads has no buffer
                ins.append((self.views[t.name], src))
        outs = []
        for name, dst in dests:
            src = self.graph.constants[name] if name in self.graph.constants else self.views.get(name)
            if src is None or src.shape != dst.shape or src.dtype != dst.dtype:
                return None
            outs.append((dst, src))
        copy_in, copy_out = copies_call(ins), copies_call(outs)
        use_views = self._use_views
        if after is not None:
            named = list(zip(self._step_calls, [s.layer.name for s in self.steps if s is not None and not s.alias]))

            def traced() -> None:
                use_views()
                copy_in()
                for c, name in named:
                    c()
                    after(name)
                copy_out()
            return traced

        def call() -> None:
            use_views()
            copy_in()
            for c in self._calls:
                c()
            copy_out()
        return call

    def run_timed(self, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list[float]]:
        """``run`` with a timer around every layer (seconds per graph node; 0 for views): for per-layer
        benchmarks, slower than ``run`` by the timer calls."""
        self.begin(feeds)
        times = [0.0] * len(self.steps)
        clock = time.perf_counter
        for pos, s in enumerate(self.steps):
            if s is not None and not s.alias:
                call = s.call()
                t = clock()
                call()
                times[pos] = clock() - t
        return self.end(), times


def at_run_shapes(layer: Layer, k: Kernel, params: dict[str, np.ndarray], constants: Mapping[str, np.ndarray]
                  ) -> Callable[[Sequence[np.ndarray | None]], list[np.ndarray] | None] | None:
    """How a node shaped at run time runs its chosen kernel ``k`` at the run's shapes with the weights ``k``
    transformed at load (``params``): a function of the node's values returning its outputs, or None (from it:
    this run's shapes do not suit ``k``) where the oracle must run instead. Only for a kernel of weights that do
    not depend on the shapes that vary (its ``transform_key`` the same at the run's shapes, or no transform of its
    constants at all): a detector's box head, a Gemm over the proposals, ran in numpy's single-threaded BLAS, and
    its RoIAlign in the Python oracle.
    Not for the data-dependent ops (``run_at_run_shapes`` runs their kernels) nor the numpy kernels (the oracle
    is what they run). The layer at each distinct input shape is worked out once."""
    spec = op_spec(layer.op)
    if spec is None or spec.bounded is not None or k.name == "numpy" or not layer.outputs:
        return None
    node = layer.node
    key0 = k.transform_key(layer)
    # a kernel that keeps its constants as they are (the default ``transform``) takes this node's own at any shape
    # (a detector's RoiAlign over the run's proposals had run in the numpy oracle: 102 ms of fasterrcnn's 217)
    raw = type(k).transform is Kernel.transform
    consts = {n: constants[n] for n in node.inputs if n and n in constants}
    cache: dict[tuple[Any, ...], Layer | None] = {}

    def run(vals: Sequence[np.ndarray | None]) -> list[np.ndarray] | None:
        shapes = tuple(None if v is None else (tuple(np.shape(v)), np.asarray(v).dtype.str) for v in vals)
        lay = cache[shapes] if shapes in cache else _at(shapes, vals)
        if lay is None:
            return None
        bufs = [np.empty(t.shape, t.dtype) for t in lay.outputs]
        k.run(lay, [None if i in lay.const_inputs else v for i, v in enumerate(vals)], params, bufs)
        return bufs

    def _at(shapes: tuple[Any, ...], vals: Sequence[np.ndarray | None]) -> Layer | None:
        lay: Layer | None = None
        try:
            cand = layer_at(node, vals, layer.const_inputs, consts)
            if len(cand.outputs) == len(layer.outputs) and k.applies(cand) and (raw or k.transform_key(cand) == key0):
                lay = cand
        except Exception:  # (a shape the kernel's checks refuse: the oracle reports what is wrong)
            lay = None
        if len(cache) >= 16:
            cache.clear()
        cache[shapes] = lay
        return lay

    return run


def check_feeds(inputs: Sequence[TensorInfo], feeds: dict[str, np.ndarray], model: str = "model",
                dims: "Mapping[str, Sequence[int | str]] | None" = None,
                bounds: "Mapping[str, Sequence[int]] | None" = None) -> dict[str, np.ndarray]:
    """Validate a feed dict against the model's inputs; ``InputError`` says what was expected and what came.
    ``dims``: a dynamic model's declared dimensions (a name where any size goes), ``bounds`` their limits."""
    if dims is None and type(feeds) is dict and len(feeds) == len(inputs):
        # the common case, checked in one pass: every input there as an array of its type and shape
        for t in inputs:
            a = feeds.get(t.name)
            if type(a) is not np.ndarray or a.dtype != t.dtype or a.shape != tuple(t.shape):
                break
        else:
            return dict(feeds)
    if not isinstance(feeds, dict):
        raise InputError(f"{model}: inputs must be a dict of name -> array, got {type(feeds).__name__}")
    expected = {t.name: t for t in inputs}
    unknown = [k for k in feeds if k not in expected]
    if unknown:
        raise InputError(f"{model}: unknown input name(s) {unknown}; expected {sorted(expected)}")
    missing = [k for k in expected if k not in feeds]
    if missing:
        raise InputError(f"{model}: missing input(s) {missing}; expected {sorted(expected)}")
    out = {}
    for name, t in expected.items():
        a = feeds[name]
        if not isinstance(a, np.ndarray):
            try:
                a = np.asarray(a)
            except Exception as e:
                raise InputError(f"{model}: input {name!r} is not array-like ({type(feeds[name]).__name__})") from e
        if a.dtype != t.dtype:
            raise InputError(f"{model}: input {name!r} expects dtype {np.dtype(t.dtype).name}, got {a.dtype.name}")
        if dims is not None and name in dims:
            try:
                check_dims(name, dims[name], a.shape, (bounds or {}).get(name))
            except ShapeError as e:
                raise InputError(f"{model}: {e}") from None
        elif tuple(a.shape) != tuple(t.shape):
            raise InputError(f"{model}: input {name!r} expects shape {list(t.shape)}, got {list(a.shape)}")
        out[name] = a
    return out


def measured_choice(graph: Graph, reps: int = 3, budget_s: float = 0.2) -> list[tuple[Layer, Kernel]]:
    """Per node of ``graph`` the fastest of its candidate kernels, each measured alone on random inputs of the
    node's shapes (``profile_layers``); the default kernel where there is no choice or no measurement. For graphs
    that no cold plan covers, the control-flow bodies: their default picks follow rules measured on larger
    layers, and on a body's small ones the wrong pick cost most (vad's 129-channel conv: im2col's GEMM split over
    two threads 28 us, the banded kernel on one 13 us)."""
    # what was measured for the same layers (shapes, attributes, candidates) on as many threads is taken again:
    # a daemon that evicts a model under its budget and loads it again had measured its bodies every time (vad's
    # two If bodies: 5-10 ms of each of its ~10 ms cold loads); and a package brings what its compile measured
    _key, entries, choosing, picked, _kept = _measured_picks(graph, reps, budget_s)
    names = dict(zip((layer.name for layer, _c, _d in choosing), picked))
    out = []
    for layer, cands, default in entries:
        name = names.get(layer.name)
        out.append((layer, next((k for k in cands if k.name == name), default)))
    return out


def _measured_picks(graph: Graph, reps: int = 3, budget_s: float = 0.2
                    ) -> tuple[tuple[int, tuple[str, ...]], list[tuple[Layer, list[Kernel], Kernel]],
                               list[tuple[Layer, list[Kernel], Kernel]], list[str], bool]:
    """``measured_choice``'s work: ``graph``'s key, its entries and those with a choice (``_body_key``), the kernel
    names picked for the latter, and whether the picks are kept in ``_CHOSEN`` (measured now or before)."""
    from ..planner.cost import DeviceRates
    from .profiler import profile_layers

    key, entries, choosing = _body_key(graph)
    with _CHOSEN_LOCK:
        picked = _CHOSEN.get(key)
    if picked is not None:
        return key, entries, choosing, picked, True
    times = profile_layers(choosing, graph.constants, DeviceRates(), {}, reps=reps, budget_s=budget_s).times \
        if choosing else {}
    picked = []
    for layer, cands, default in choosing:
        timed = [(times[(layer.name, k.name, "exec")], k.priority, k) for k in cands
                 if (layer.name, k.name, "exec") in times]
        picked.append(min(timed, key=lambda t: t[:2])[2].name if timed else default.name)
    kept = bool(times) or not choosing
    if kept:
        with _CHOSEN_LOCK:  # kept only where something was measured (a stopped profile measures nothing)
            if len(_CHOSEN) >= 256:
                _CHOSEN.pop(next(iter(_CHOSEN)))
            _CHOSEN[key] = picked
    return key, entries, choosing, picked, kept


def _body_key(graph: Graph) -> tuple[tuple[int, tuple[str, ...]], list[tuple[Layer, list[Kernel], Kernel]],
                                      list[tuple[Layer, list[Kernel], Kernel]]]:
    """``graph``'s key in ``_CHOSEN`` (threads, the keys of its layers with a choice), its layers with their candidates
    and default, and those with a choice."""
    entries = []
    for node in graph.nodes:
        layer = Layer.of(node, graph)
        cands, default = candidate_kernels(layer, "cpu", None, False)
        entries.append((layer, cands, default))
    choosing = [e for e in entries if len(e[1]) > 1]
    return (native.num_threads(), tuple(_choice_key(layer, cands) for layer, cands, _d in choosing)), entries, choosing


#: ``measured_choice``'s picks (kernel names of the layers with a choice) per (threads, those layers' keys)
_CHOSEN: dict[tuple[int, tuple[str, ...]], list[str]] = {}
_CHOSEN_LOCK = threading.Lock()


def _choice_key(layer: Layer, cands: Sequence[Kernel]) -> str:
    """One layer's part of a body's choice key: a string equal for equal op, attributes, shapes and candidates in
    any process (a package carries them): lists and tuples alike, arrays by content, nested bodies by name."""
    ins = tuple(tuple(i.shape) if i is not None else None for i in layer.inputs)
    return repr((layer.op, sorted((k, _canon(v)) for k, v in layer.attrs.items()), ins,
                 tuple(tuple(o.shape) for o in layer.outputs), tuple(layer.const_inputs), tuple(k.name for k in cands)))


def _canon(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_canon(x) for x in v)
    if isinstance(v, np.ndarray):
        return ("array", v.dtype.str, tuple(v.shape), zlib.crc32(np.ascontiguousarray(v).tobytes()))
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, dict):
        return tuple(sorted((str(k), _canon(x)) for k, x in v.items()))
    if isinstance(v, (Subgraph, Graph)):
        return ("body", v.name, len(v.nodes))
    return v


def body_choices(graph: Graph) -> list[list[Any]]:
    """The kernels picked for the control-flow bodies of ``graph`` (nested ones too) as a package records them:
    [threads, [layer keys], [kernel names]] per body, measured here where this process has not measured them yet.
    A cold load takes them (``seed_body_choices``) instead of measuring: vad's two If bodies took 3-18 ms of a
    fresh process's 12-29 ms cold load measuring candidates (2-core VM)."""
    out: list[list[Any]] = []
    seen: set[Any] = set()

    def walk(g: Graph) -> None:
        for node in g.nodes:
            for body in node.bodies.values():
                if body.runtime_shaped:
                    continue
                key, _e, _c, picked, kept = _measured_picks(body)
                if kept and key not in seen:
                    seen.add(key)
                    out.append([key[0], list(key[1]), list(picked)])
                walk(body)
    walk(graph)
    return out


def seed_body_choices(records: Sequence[Sequence[Any]]) -> int:
    """Take a package's ``body_choices`` as measured here (how many were taken): a body with the same layers on as
    many threads then binds the recorded kernels without measuring. A record of another shape is skipped (the
    package's device fingerprint already vouches that the kernels exist and were measured on this machine)."""
    n = 0
    for rec in records:
        try:
            threads, keys, picked = int(rec[0]), tuple(str(k) for k in rec[1]), [str(p) for p in rec[2]]
        except (TypeError, ValueError, IndexError):
            continue
        if len(keys) != len(picked):
            continue
        with _CHOSEN_LOCK:
            if len(_CHOSEN) >= 256:
                _CHOSEN.pop(next(iter(_CHOSEN)))
            _CHOSEN[(threads, keys)] = picked
        n += 1
    return n


def body_executor(graph: Graph) -> CpuExecutor:
    """The executor of a control-flow body: planned once, its kernels picked by measuring (``measured_choice``)."""
    return CpuExecutor(graph, choice=measured_choice(graph))


# control-flow bodies run on this executor (the op module cannot import the runtime that imports it)
_control.set_body_executor(body_executor)
