"""The cold-start planner: per layer a kernel, a read source and a preparing thread, so that the
first run's last layer finishes as early as possible. Pure: graph facts and costs in, a frozen
:class:`~inferd.planner.plan.ColdPlan` out.

The model of time (:func:`simulate`): layers execute in graph order on the executor (the CPU pool,
or the GPU queue); layer i executes once layer i-1 has and its own preparation is done. A
preparation is a read (bytes from the store; the disk is one shared resource, so reads of different
threads queue behind each other), then a transform and, on a GPU, a pipeline creation on the thread
that read. On the CPU the executor thread prepares a layer itself when it would otherwise sit idle
waiting for it.

Compared with NNV12's Algorithm 1 (kept here as :func:`plan_nnv12`, the baseline): preparation is
assigned in the order the executor needs it rather than balanced by total load, the disk is
modelled as shared (NNV12 bundles read and transform as if reads scaled with cores), the executor
thread prepares when it would idle, and kernels and read sources are chosen by a local search on
the simulated makespan, seeded with NNV12's own choice so it never ends worse than it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..ops.base import Kernel, Layer
from .cost import RANKING_SOURCES, CostModel, kernel_transforms, raw_nbytes
from .plan import ColdPlan, LayerPlan, PlanOptions

#: preparing threads a GPU plan gets by default. A GPU layer's preparation is mostly Python driving the
#: Vulkan binding (pipelines, descriptors, uploads), which holds the GIL: past a few threads they only
#: take turns, every layer then finishes late and the executor cannot start early. Measured on the H100
#: (2026-11-24, caches filled, page cache dropped): squeezenet1_1 cold 68 ms with 16 loaders, 70 with 4,
#: 52 with 2; mobilenetv2 94 / 99 / 86; resnet50, whose reads are larger, 156 with 16 and 142 with 4. Again on an
#: H200 (2026-12-03, after the per-layer calls went through raw cffi; 4 loaders then 2, one host, median of 3
#: rounds each): squeezenet1_1 36.4 -> 34.1 ms, mobilenetv2 47.1 -> 43.8, resnet50 83.8 -> 73.0. Then 2 -> 1 on the
#: H100 (2026-12-07, the reads on their own I/O threads, the executor taking over what the loader has not begun;
#: packages compiled for each count, three cold loads a median, 2026-12-07zj): squeezenet1_1 22.3 -> 18.1 ms,
#: mobilenetv2 31.5 -> 29.5 and 29.7 -> 27.9 (one more pair in the other order); in the same runs' other rounds
#: (registered, binds not recorded, pipelines not resident) one loader was ahead in 6 of 9, and in last session's
#: one pair (mobilenetv2 32.0 -> 23.0, squeezenet1_1 19.4 -> 17.6). A layer's preparation was mostly waiting for
#: the GIL (2026-12-07zi: 390-410 us of wall time a layer, a few tens of it work).
GPU_LOADERS = 1


@dataclass(frozen=True)
class Candidate:
    """One way to bring a layer up: a kernel and what to read for it, with its predicted costs."""

    kernel: str
    source: str           # "raw" | "transformed" | "none"
    read_s: float
    transform_s: float
    pipeline_s: float
    exec_s: float
    read_bytes: int = 0
    cost_source: str = "roofline"
    #: warm execution (``exec_s`` is the first run's, which cold runs refine)
    warm_s: float = -1.0

    @property
    def warm(self) -> float:
        return self.exec_s if self.warm_s < 0 else self.warm_s

    @property
    def prep_s(self) -> float:
        return self.read_s + self.transform_s + self.pipeline_s


@dataclass(frozen=True)
class ColdLayer:
    index: int
    name: str
    op: str
    candidates: tuple[Candidate, ...]
    #: kernel of the warm default (fastest warm), the one a warm switch moves to
    warm_kernel: str


def layer_candidates(layer: Layer, kernels: Sequence[Kernel], cost: CostModel, gpu: bool = False,
                     pipeline_cache_filled: bool = True, cache: bool = True,
                     stored: Callable[[str, str], bool] | None = None) -> tuple[Candidate, ...]:
    """Every (kernel, read source) pair for ``layer`` with its costs. ``kernels`` are the applicable ones;
    ``stored(layer, kernel)``, when given, says which transformed weights a store already holds."""
    out: list[Candidate] = []
    pipe_phase = "pipeline_filled" if pipeline_cache_filled else "pipeline_empty"
    has_weights = raw_nbytes(layer) > 0
    for k in kernels:
        warm = cost.cost(layer, k, "exec")
        ex = cost.cost(layer, k, "exec_cold")
        if ex.source == "roofline" and warm.source != "roofline":
            ex = warm  # no cold run observed yet: the measured warm time is the better guess
        pipe = cost.cost(layer, k, pipe_phase).seconds if gpu else 0.0
        if not has_weights:
            out.append(Candidate(k.name, "none", 0.0, 0.0, pipe, ex.seconds, 0, ex.source, warm.seconds))
            continue
        rr = cost.cost(layer, k, "read_raw")
        tr = cost.cost(layer, k, "transform") if kernel_transforms(k) else None
        out.append(Candidate(k.name, "raw", rr.seconds, tr.seconds if tr else 0.0, pipe, ex.seconds,
                             raw_nbytes(layer), ex.source, warm.seconds))
        if cache and tr is not None and k.storable and (stored is None or stored(layer.name, k.name)):
            rt = cost.cost(layer, k, "read_transformed")
            out.append(Candidate(k.name, "transformed", rt.seconds, 0.0, pipe, ex.seconds,
                                 k.transformed_nbytes(layer), ex.source, warm.seconds))
    return tuple(out)


def cold_layers(entries: Sequence[tuple[Layer, Sequence[Kernel], Kernel]], cost: CostModel, gpu: bool = False,
                pipeline_cache_filled: bool = True, cache: bool = True,
                stored: Callable[[str, str], bool] | None = None) -> list[ColdLayer]:
    """The planner's view of a model: per node (graph order) its candidates with costs. The warm
    kernel is the one with the least execution time where it was measured or predicted by a model of its own
    op, the default elsewhere: a predictor trained on convolutional networks priced vit_tiny's attention
    projections (a MatMul with bias and residual, 197 rows) from the Gemm classifiers' models and chose the
    unpacked GEMM, 0.33 ms against 0.10 packed, 12 times a run."""
    out = []
    for idx, (layer, kernels, default) in enumerate(entries):
        cands = layer_candidates(layer, kernels, cost, gpu, pipeline_cache_filled, cache, stored)
        warm = default.name
        measured = [c for c in cands if c.cost_source in RANKING_SOURCES]
        if len({c.kernel for c in measured}) > 1:
            warm = min(measured, key=lambda c: c.warm).kernel
        out.append(ColdLayer(idx, layer.name, layer.op, cands, warm))
    return out


def non_dominated(cands: Sequence[Candidate]) -> tuple[Candidate, ...]:
    """Drop candidates that are no better than another in both preparation and execution (NNV12's filter)."""
    keep = []
    for c in cands:
        if not any((o.prep_s <= c.prep_s and o.exec_s <= c.exec_s and (o.prep_s < c.prep_s or o.exec_s < c.exec_s))
                   for o in cands):
            keep.append(c)
    # equal twins: keep the first
    seen: set[tuple[float, float]] = set()
    out = []
    for c in keep:
        key = (c.prep_s, c.exec_s)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return tuple(out)


# ----------------------------------------------------------------------------------- the time model

@dataclass
class _State:
    free: list[float]   # when each loader thread is next free
    disk: float         # when the disk is next free
    t: float            # when the executor is next free


@dataclass(frozen=True)
class Schedule:
    makespan: float
    loader: tuple[int, ...]      # per layer: loader index, or ``loaders`` for the executor thread
    ready: tuple[float, ...]     # per layer: end of its preparation
    exec_end: tuple[float, ...]


def _step(st: _State, c: Candidate, loaders: int, exec_blocks: bool, exec_prepares: bool,
          pipeline: bool, forced: int | None = None) -> tuple[int, float]:
    """Place one layer's preparation and execution; returns (thread, end of preparation). Mutates ``st``.
    ``forced``: the thread to prepare on (a given assignment) instead of the earliest to finish."""
    if c.prep_s <= 0.0:
        who, ready = loaders, st.t
    elif forced is not None:
        if forced >= loaders:  # the executor thread
            es = max(st.t, st.disk)
            ready = es + c.prep_s
            st.disk = es + c.read_s
            if exec_blocks:
                st.t = ready
        else:
            rs = max(st.free[forced], st.disk)
            ready = rs + c.prep_s
            st.disk = rs + c.read_s
            st.free[forced] = ready
        who = forced
    else:
        j = min(range(loaders), key=st.free.__getitem__) if loaders else -1
        end_j = float("inf")
        if j >= 0:
            rs = max(st.free[j], st.disk)
            end_j = rs + c.read_s + c.transform_s + c.pipeline_s
        end_e = float("inf")
        if exec_prepares:
            es = max(st.t, st.disk)
            end_e = es + c.read_s + c.transform_s + c.pipeline_s
        if end_e < end_j:
            who, ready = loaders, end_e
            st.disk = max(st.t, st.disk) + c.read_s
            if exec_blocks:
                st.t = end_e
        else:
            who, ready = j, end_j
            st.disk = max(st.free[j], st.disk) + c.read_s
            st.free[j] = end_j
    if pipeline:
        st.t = max(st.t, ready) + c.exec_s
    return who, ready


def simulate(layers: Sequence[ColdLayer], choice: Sequence[int], loaders: int, *, exec_blocks: bool = True,
             exec_prepares: bool = True, pipeline: bool = True, assign: Sequence[int] | None = None) -> Schedule:
    """Predicted schedule of ``choice`` (candidate index per layer). ``exec_blocks``: the executor is a
    CPU thread that cannot prepare while it executes (False on a GPU, whose host thread stays free).
    ``assign``: a fixed preparing thread per layer (each thread works through its layers in order)."""
    st = _State([0.0] * loaders, 0.0, 0.0)
    who: list[int] = []
    ready: list[float] = []
    ends: list[float] = []
    for i, (layer, ci) in enumerate(zip(layers, choice)):
        c = layer.candidates[ci]
        w, r = _step(st, c, loaders, exec_blocks, exec_prepares and exec_blocks, pipeline,
                     None if assign is None else assign[i])
        who.append(w)
        ready.append(r)
        ends.append(st.t)
    if not pipeline:
        t = max([0.0] + ready)
        ends = []
        for layer, ci in zip(layers, choice):
            t += layer.candidates[ci].exec_s
            ends.append(t)
        st.t = t
    return Schedule(st.t, tuple(who), tuple(ready), tuple(ends))


def _makespan_from(layers: Sequence[ColdLayer], choice: list[int], start: int, states: list[_State],
                   rest: list[tuple[float, float]], loaders: int, exec_blocks: bool, exec_prepares: bool,
                   limit: float, current: float) -> float:
    """Makespan of ``choice`` simulated from layer ``start`` on, given the current choice's states before
    each layer and ``rest[k]``: the execution and read seconds of layers k.. under it. A trial stops as soon
    as it cannot beat ``limit`` (the executor still has every later layer to run, the disk every later read)
    or its state equals the current schedule's (the rest is that schedule: its makespan is ``current``);
    both keep the search near-linear on long models instead of simulating every suffix to its end."""
    state = states[start]
    st = _State(list(state.free), state.disk, state.t)
    n = len(layers)
    for i in range(start, n):
        _step(st, layers[i].candidates[choice[i]], loaders, exec_blocks, exec_prepares, True)
        if i + 1 < n:
            later_exec, later_read = rest[i + 1]
            if st.t + later_exec >= limit or st.disk + later_read >= limit:
                return limit  # no better
        elif st.t >= limit:
            return st.t
        if i + 1 < n:
            ref = states[i + 1]
            if st.t == ref.t and st.disk == ref.disk and st.free == ref.free:
                return current
    return st.t


def _suffix_sums(layers: Sequence[ColdLayer], choice: list[int]) -> list[tuple[float, float]]:
    """Per layer k: the execution and read seconds of layers k.. under ``choice``."""
    out: list[tuple[float, float]] = [(0.0, 0.0)] * len(layers)
    e = r = 0.0
    for k in range(len(layers) - 1, -1, -1):
        c = layers[k].candidates[choice[k]]
        e += c.exec_s
        r += c.read_s
        out[k] = (e, r)
    return out


def _local_search(layers: Sequence[ColdLayer], choice: list[int], loaders: int, exec_blocks: bool,
                  exec_prepares: bool, max_passes: int = 4) -> list[int]:
    """Change one layer's candidate at a time while the makespan falls (prefix states cached)."""
    n = len(layers)
    ep = exec_prepares and exec_blocks
    for _ in range(max_passes):
        improved = False
        # states before each layer under the current choice
        states: list[_State] = []
        st = _State([0.0] * loaders, 0.0, 0.0)
        for i in range(n):
            states.append(_State(list(st.free), st.disk, st.t))
            _step(st, layers[i].candidates[choice[i]], loaders, exec_blocks, ep, True)
        best = st.t
        rest = _suffix_sums(layers, choice)
        for i in range(n):
            if len(layers[i].candidates) < 2:
                continue
            cur = choice[i]
            changed = False
            for ci in range(len(layers[i].candidates)):
                if ci == cur:
                    continue
                choice[i] = ci
                m = _makespan_from(layers, choice, i, states, rest, loaders, exec_blocks, ep, best * (1 - 1e-9), best)
                if m < best * (1 - 1e-9):
                    best, cur, changed = m, ci, True
            choice[i] = cur
            if changed:
                improved = True
                # the states after layer i changed with its choice: refresh them for the layers after it
                st = _State(list(states[i].free), states[i].disk, states[i].t)
                for k in range(i, n):
                    if k > i:
                        states[k] = _State(list(st.free), st.disk, st.t)
                    _step(st, layers[k].candidates[choice[k]], loaders, exec_blocks, ep, True)
                rest = _suffix_sums(layers, choice)
        if not improved:
            break
    return choice


def _warm_choice(layers: Sequence[ColdLayer]) -> list[int]:
    """The warm default kernel, read the cheapest way."""
    out = []
    for L in layers:
        idx = [i for i, c in enumerate(L.candidates) if c.kernel == L.warm_kernel] or list(range(len(L.candidates)))
        out.append(min(idx, key=lambda i: L.candidates[i].prep_s))
    return out


def plan_nnv12(layers: Sequence[ColdLayer], loaders: int, *, exec_blocks: bool = True) -> list[int]:
    """NNV12's kernel choice (Algorithm 1, simplified): per layer the non-dominated candidate minimising
    its own preparation shared over the loaders plus its execution. Returns candidate indices."""
    out = []
    for L in layers:
        nd = non_dominated(L.candidates)
        best = min(nd, key=lambda c: c.prep_s / max(loaders, 1) + c.exec_s)
        out.append(L.candidates.index(best))
    return out


def assign_nnv12(layers: Sequence[ColdLayer], choice: Sequence[int], loaders: int) -> list[int]:
    """NNV12's placement: layer 0's preparation on the executor's core, the others spread over the
    loaders by load (greedy least-loaded, then moves from the most to the least loaded thread while
    that lowers the maximum), each thread working through its layers in order."""
    n = len(layers)
    if loaders <= 0:
        return [0] * n  # only the executor: callers pass ``loaders`` = 0 as the executor's index
    prep = [layers[i].candidates[choice[i]].prep_s for i in range(n)]
    assign = [loaders] * n
    load = [0.0] * loaders
    for i in range(1, n):
        j = min(range(loaders), key=load.__getitem__)
        assign[i] = j
        load[j] += prep[i]
    for _ in range(4 * n):
        hi = max(range(loaders), key=load.__getitem__)
        lo = min(range(loaders), key=load.__getitem__)
        best = None
        for i in range(1, n):
            if assign[i] == hi and load[lo] + prep[i] < load[hi]:
                if best is None or prep[i] < prep[best]:
                    best = i
        if best is None:
            break
        assign[best] = lo
        load[hi] -= prep[best]
        load[lo] += prep[best]
    return assign


def nnv12_makespan(layers: Sequence[ColdLayer], loaders: int, *, gpu: bool = False) -> float:
    """NNV12's plan (choice and placement) under this module's time model: the baseline to beat."""
    nd = [ColdLayer(L.index, L.name, L.op, non_dominated(L.candidates), L.warm_kernel) for L in layers]
    choice = plan_nnv12(nd, loaders, exec_blocks=not gpu)
    return simulate(nd, choice, loaders, exec_blocks=not gpu, exec_prepares=False,
                    assign=assign_nnv12(nd, choice, loaders)).makespan


def plan_cold(layers: Sequence[ColdLayer], loaders: int, backend: str = "cpu",
              options: PlanOptions | None = None, *, gpu: bool = False, host_cores: bool = False) -> ColdPlan:
    """The cold-start plan for ``layers`` (graph order) with ``loaders`` preparing threads besides the executor.

    ``gpu``: executions run on a device queue, so the host thread that submits them stays free to
    prepare; ``host_cores``: that device computes on the host's own cores (lavapipe), so its executions
    take the cores from the loaders as a CPU executor's do."""
    opt = options or PlanOptions()
    loaders = max(int(loaders), 0 if (opt.executor_prepares and not gpu) else 1)
    exec_blocks = not gpu or host_cores
    ep = opt.executor_prepares and not gpu

    def allowed(L: ColdLayer) -> ColdLayer:
        cands = L.candidates
        if not opt.cache:
            cands = tuple(c for c in cands if c.source != "transformed") or cands
        if not opt.select:
            cands = tuple(c for c in cands if c.kernel == L.warm_kernel) or cands
        if opt.force_source:
            cands = tuple(c for c in cands if c.source in (opt.force_source, "none")) or cands
        return ColdLayer(L.index, L.name, L.op, non_dominated(cands), L.warm_kernel)

    use = [allowed(L) for L in layers]
    if opt.pipeline:
        seeds = [_warm_choice(use), plan_nnv12(use, loaders, exec_blocks=exec_blocks),
                 [min(range(len(L.candidates)), key=lambda i, L=L: L.candidates[i].prep_s + L.candidates[i].exec_s)
                  for L in use]]
        best_choice, best_m = seeds[0], float("inf")
        for s in seeds:
            m = simulate(use, s, loaders, exec_blocks=exec_blocks, exec_prepares=ep).makespan
            if m < best_m:
                best_choice, best_m = list(s), m
        choice = _local_search(use, best_choice, loaders, exec_blocks, ep)
    else:
        # without overlap the best a layer can do is the least preparation + execution on its own
        choice = [min(range(len(L.candidates)), key=lambda i, L=L: L.candidates[i].prep_s / max(loaders, 1)
                      + L.candidates[i].exec_s) for L in use]
    assign = None
    if opt.pipeline and exec_blocks:
        # the baseline's own placement wins now and then (it is the search's seed, not its bound)
        base_choice = plan_nnv12(use, loaders, exec_blocks=exec_blocks)
        base_assign = assign_nnv12(use, base_choice, loaders)
        ours = simulate(use, choice, loaders, exec_blocks=exec_blocks, exec_prepares=ep).makespan
        theirs = simulate(use, base_choice, loaders, exec_blocks=exec_blocks, exec_prepares=False,
                          assign=base_assign).makespan
        if theirs < ours:
            choice, assign = base_choice, base_assign
    sched = simulate(use, choice, loaders, exec_blocks=exec_blocks, exec_prepares=ep and assign is None,
                     pipeline=opt.pipeline, assign=assign)
    counters = [0] * (loaders + 1)
    plans = []
    for i, (L, ci) in enumerate(zip(use, choice)):
        c = L.candidates[ci]
        who = sched.loader[i]
        plans.append(LayerPlan(L.index, L.name, L.op, c.kernel, c.source, who, counters[who],
                               "" if L.warm_kernel == c.kernel else L.warm_kernel,
                               c.read_s, c.transform_s, c.pipeline_s, c.exec_s, sched.ready[i], sched.exec_end[i],
                               c.cost_source))
        counters[who] += 1
    warm = 0.0
    for L in use:
        ws = [c.warm for c in L.candidates if c.kernel == L.warm_kernel]
        warm += min(ws) if ws else min(c.warm for c in L.candidates)
    read = sum(L.candidates[ci].read_s for L, ci in zip(use, choice))
    return ColdPlan(backend, loaders, tuple(plans), sched.makespan, warm, read, opt)
