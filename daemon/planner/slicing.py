"""Bottleneck-aware slicing and kernel fallback (FlexNN, section 3): pure functions over a graph.

A few layers set a model's peak memory: fully connected layers and Winograd convs by their weights,
im2col convs by their column buffer. Under a budget they cannot meet:

* a conv falls back to a kernel that needs less (Winograd F(4,3) -> F(2,3) -> im2col: the transformed
  weights shrink from 4x to 1.8x to 1x the raw ones, at the price of a column buffer);
* a weight-dominated layer (Gemm, MatMul with constant weights, group-1 Conv) is sliced by output
  channel into sub-layers, as few as fit, each reading its slice of the weights; a Concat joins their
  outputs (small next to the weights they stand for).

``slice_graph`` rewrites the graph (weight slices are views: nothing is copied until a store is written);
``fit_config`` searches the fallbacks and slice counts for a budget; ``step_memory`` sizes a graph's
steps for ``planner.flex``. The same fused attributes (bias, activation) carry over to every slice;
a node with a fused residual is left whole.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from ..ir import Graph, Node, TensorInfo
from ..ops.base import Kernel, Layer, choose_kernel
from .flex import BudgetTooSmall, LayerMem, lower_bound, plan_budget, plan_flex, simulate
from .memory import Buffer, align_up, graph_buffers

#: what a conv falls back to when its memory sets the peak (each needs less weight memory than the last)
FALLBACK = {"winograd43": "winograd23", "winograd23": "im2col"}
#: input slicing keeps at least this many channels per range
IN_SLICE_MIN = 16
SLICE_SEP = "#slice"
#: the Concat that joins a node's output slices: the node's name and this
CONCAT_SUFFIX = "#concat"


@dataclass(frozen=True)
class MemConfig:
    """Kernel overrides (node name -> kernel) and slice counts (node name -> slices) for a budget."""

    kernels: Mapping[str, str] = field(default_factory=dict)
    slices: Mapping[str, int] = field(default_factory=dict)
    #: convs sliced by input channel (node name -> ranges): their kernel is ``im2col_cs``
    in_slices: Mapping[str, int] = field(default_factory=dict)

    def key(self) -> str:
        return ";".join([f"k:{n}={k}" for n, k in sorted(self.kernels.items())] +
                        [f"s:{n}={s}" for n, s in sorted(self.slices.items())] +
                        [f"i:{n}={s}" for n, s in sorted(self.in_slices.items())])

    def to_dict(self) -> dict[str, dict]:
        return {"kernels": dict(self.kernels), "slices": dict(self.slices), "in_slices": dict(self.in_slices)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "MemConfig":
        d = d or {}
        return cls(dict(d.get("kernels", {})), dict(d.get("slices", {})), dict(d.get("in_slices", {})))


def sliceable(graph: Graph, node: Node) -> int:
    """How many output channels ``node`` can be split over (0: it cannot be sliced)."""
    if node.attrs.get("residual") or len(node.inputs) < 2 or node.inputs[1] not in graph.constants:
        return 0
    w = graph.constants[node.inputs[1]]
    if node.op == "Conv" and int(node.attrs.get("group", 1)) == 1 and w.ndim >= 3:
        return int(w.shape[0])
    if node.op == "Gemm" and not node.attrs.get("transA", 0) and w.ndim == 2:
        return int(w.shape[0] if node.attrs.get("transB", 0) else w.shape[1])
    if node.op == "MatMul" and w.ndim == 2 and len(node.inputs) == 2:
        return int(w.shape[1])
    return 0


def _bounds(n: int, s: int, quantum: int = 8) -> list[tuple[int, int]]:
    """``s`` ranges covering [0, n), multiples of ``quantum`` wide where possible (SIMD-friendly)."""
    step = max(quantum, align_up(-(-n // s), quantum)) if n >= quantum * s else -(-n // s)
    out, a = [], 0
    while a < n:
        out.append((a, min(n, a + step)))
        a += step
    return out


def slice_graph(graph: Graph, slices: Mapping[str, int], in_slices: Mapping[str, int] | None = None) -> Graph:
    """``graph`` with each node of ``slices`` (count > 1) split by output channel into sub-nodes named
    ``<node>#slice<j>`` joined by a Concat named ``<node>#concat`` that writes the node's own output, and
    each conv of ``in_slices`` marked (attribute ``_in_slices``) for the input-channel-sliced im2col."""
    if in_slices and any(v > 1 for v in in_slices.values()):
        nodes_in = [Node(n.name, n.op, list(n.inputs), list(n.outputs), {**n.attrs, "_in_slices": int(in_slices[n.name])})
                    if in_slices.get(n.name, 1) > 1 and n.op == "Conv" else n for n in graph.nodes]
        g0 = Graph(graph.name, nodes_in, list(graph.inputs), list(graph.outputs), dict(graph.constants),
                   dict(graph.infos), graph.opset, dict(graph.dims))
        g0.runtime_shaped = set(graph.runtime_shaped)
        graph = g0
    if not any(s > 1 for s in slices.values()):
        return graph
    consts = dict(graph.constants)
    infos = dict(graph.infos)
    nodes: list[Node] = []
    for node in graph.nodes:
        s = int(slices.get(node.name, 1))
        n_out = sliceable(graph, node) if s > 1 else 0
        if n_out == 0:
            nodes.append(node)
            continue
        w = graph.constants[node.inputs[1]]
        out = node.outputs[0]
        oinfo = graph.infos[out]
        axis = 1 if node.op in ("Conv", "Gemm") else len(oinfo.shape) - 1
        trans_b = bool(node.attrs.get("transB", 0))
        attrs = {k: v for k, v in node.attrs.items() if k != "_absorbed"}
        parts = []
        for j, (a, b) in enumerate(_bounds(n_out, s)):
            if node.op == "Conv" or (node.op == "Gemm" and trans_b):
                wj = w[a:b]
            else:
                wj = w[:, a:b]
            wn = f"{node.inputs[1]}{SLICE_SEP}{j}"
            consts[wn] = wj
            infos[wn] = TensorInfo(wn, tuple(wj.shape), wj.dtype)
            ins = [node.inputs[0], wn]
            for extra in node.inputs[2:3]:
                if not extra:
                    ins.append("")
                    continue
                c = graph.constants.get(extra)
                if c is not None and c.size == n_out:
                    cj = c.reshape(-1)[a:b].reshape(c.shape[:-1] + (b - a,)) if c.ndim else c
                    cn = f"{extra}{SLICE_SEP}{j}"
                    consts[cn] = cj
                    infos[cn] = TensorInfo(cn, tuple(cj.shape), cj.dtype)
                    ins.append(cn)
                else:
                    ins.append(extra)
            on = f"{out}{SLICE_SEP}{j}"
            shape = list(oinfo.shape)
            shape[axis] = b - a
            infos[on] = TensorInfo(on, tuple(shape), oinfo.dtype)
            nodes.append(Node(f"{node.name}{SLICE_SEP}{j}", node.op, ins, [on], dict(attrs)))
            parts.append(on)
        nodes.append(Node(f"{node.name}{CONCAT_SUFFIX}", "Concat", parts, [out], {"axis": axis, "_opset": graph.opset}))
    g = Graph(graph.name, nodes, list(graph.inputs), list(graph.outputs), consts, infos, graph.opset,
              dict(graph.dims))
    g.runtime_shaped = set(graph.runtime_shaped)
    return g


def _conv_cin(graph: Graph, node: Node) -> int:
    """Input channels of a group-1 conv with constant weights (0: anything else)."""
    if node.op != "Conv" or int(node.attrs.get("group", 1)) != 1 or len(node.inputs) < 2 \
            or node.inputs[1] not in graph.constants:
        return 0
    w = graph.constants[node.inputs[1]]
    return int(w.shape[1]) if w.ndim >= 3 else 0


def _kernel(layer: Layer, kernels: Mapping[str, str]) -> Kernel:
    base = layer.name.split(SLICE_SEP)[0]
    forced = kernels.get(base)
    if forced is not None:
        try:
            return choose_kernel(layer, "cpu", forced)
        except Exception:
            pass  # a slice the forced kernel does not apply to keeps the default
    return choose_kernel(layer, "cpu")


@dataclass(frozen=True)
class KernelMemory:
    """What the slicing asks of a backend's kernels: the kernel a layer runs with the overrides, its workspace
    bytes, and a kernel of the layer that needs less memory (weights and workspace; None: none)."""

    kernel: Callable[[Layer, Mapping[str, str]], Kernel]
    workspace: Callable[[Layer, Kernel, int], int]
    fallback: Callable[[Layer, Kernel], "str | None"]
    #: the kernel of a conv sliced by input channel (None: the backend does not slice so)
    in_slice_kernel: str | None = None


def _cpu_workspace(layer: Layer, k: Kernel, alignment: int) -> int:
    return sum(align_up(4 * int(n), alignment) for n in k.scratch_floats(layer).values())


def _cpu_fallback(layer: Layer, k: Kernel) -> str | None:
    return FALLBACK.get(k.name) if layer.op == "Conv" else None


CPU_KERNELS = KernelMemory(_kernel, _cpu_workspace, _cpu_fallback, "im2col_cs")


def step_memory(graph: Graph, kernels: Mapping[str, str] | None = None,
                small: int = 16 << 10, alignment: int = 64, km: KernelMemory = CPU_KERNELS
                ) -> tuple[list[LayerMem], list[Buffer], list[Kernel]]:
    """Per step: the weights a kernel reads (transformed size; parameters above ``small`` bytes, which is
    what the streaming runtime streams) and its workspace; the activation buffers; the kernels (``km``: the
    backend's)."""
    layers, ks = [], []
    for node in graph.nodes:
        layer = Layer.of(node, graph)
        k = km.kernel(layer, kernels or {})
        w = k.transformed_nbytes(layer) if layer.const_inputs else 0
        if w and w <= small:
            w = 0
        layers.append(LayerMem(node.name, align_up(w, alignment) if w else 0, km.workspace(layer, k, alignment)))
        ks.append(k)
    acts, _aliases = graph_buffers(graph)
    return layers, acts, ks


def _live_at(layers: Sequence[LayerMem], acts: Sequence[Buffer], t: int) -> tuple[int, int]:
    a = sum(b.size for b in acts if b.first <= t <= b.last)
    return a, layers[t].weights + layers[t].workspace


def fit_config(graph: Graph, budget: int, *, base: MemConfig | None = None, max_rounds: int = 200,
               alignment: int = 64, km: KernelMemory = CPU_KERNELS) -> MemConfig:
    """The least change to ``base`` (default: none) that lets the graph plan into ``budget`` bytes: repeatedly
    take the step that sets the peak and, if its own weights and workspace dominate, fall its kernel back to one
    that needs less or slice its weights (doubling the count: as few slices as fit). ``BudgetTooSmall`` when
    the peak step is dominated by activations or cannot be cut further. ``km``: the backend's kernels (CPU's by
    default)."""
    cfg = base or MemConfig()
    kernels = dict(cfg.kernels)
    slices = dict(cfg.slices)
    in_slices = dict(cfg.in_slices)
    by_name = {n.name: n for n in graph.nodes}
    for _ in range(max_rounds):
        g = slice_graph(graph, slices, in_slices)
        layers, acts, ks = step_memory(g, kernels, alignment=alignment, km=km)
        try:
            plan_flex(layers, acts, budget, preload=False, alignment=alignment)
            return MemConfig(dict(kernels), dict(slices), dict(in_slices))
        except BudgetTooSmall:
            pass
        # the step with the most live bytes whose own part can still shrink
        order = sorted(range(len(layers)), key=lambda t: -sum(_live_at(layers, acts, t)))
        changed = False
        for t in order:
            act, own = _live_at(layers, acts, t)
            if own == 0 or own < act // 4:
                continue
            name = layers[t].name.split(SLICE_SEP)[0]
            node = by_name.get(name)
            if node is None:
                continue
            k = ks[t].name
            fb = km.fallback(Layer.of(g.nodes[t], g), ks[t])
            if fb is not None:
                kernels[name] = fb
                changed = True
                break
            # an im2col conv whose column buffer dominates: slice its input channels (doubling, while each
            # range keeps at least IN_SLICE_MIN channels: narrower GEMMs lose their efficiency)
            cin = _conv_cin(graph, node)
            if node.op == "Conv" and km.in_slice_kernel and k in ("im2col", km.in_slice_kernel) and cin \
                    and SLICE_SEP not in layers[t].name and layers[t].workspace > layers[t].weights:
                si = in_slices.get(name, 1) * 2
                if cin // si >= IN_SLICE_MIN:
                    in_slices[name] = si
                    kernels[name] = km.in_slice_kernel
                    changed = True
                    break
            n_out = sliceable(graph, node)
            s = slices.get(name, 1)
            if n_out and s * 2 <= max(1, n_out // 8) and layers[t].weights >= layers[t].workspace:
                slices[name] = s * 2
                changed = True
                break
        if not changed:
            lb = lower_bound(layers, acts, alignment)
            raise BudgetTooSmall(f"{graph.name}: memory budget {budget} bytes ({budget / 2**20:.2f} MiB) is too small "
                                 f"even with slicing and kernel fallback: the peak step needs at least {lb} bytes "
                                 f"({lb / 2**20:.2f} MiB)", budget, lb)
    raise BudgetTooSmall(f"{graph.name}: no slicing found for {budget} bytes in {max_rounds} rounds", budget, 0)


#: counts ``faster_config`` tries for a layer, and the share of simulated time a change must save to be kept (the
#: simulation reads at the disk's rate; a real read of a small slice also pays its latency)
FASTER_COUNTS = (2, 4, 8)
FASTER_MIN_GAIN = 0.03
#: the uniform slicings ``faster_config`` tries: every layer whose weights pass budget / d, for each d here, cut
#: into slices of at most that size
FASTER_DIVISORS = (4, 8, 16)
#: the output channels a slice of ``faster_config``'s keeps at least: a narrower GEMM runs below the rate its
#: share of the layer's time assumes
FASTER_MIN_CHANNELS = 32
#: what one more step costs a streamed run beyond its share of compute (the executor's turn, the loader's
#: hand-over, a Concat's copy): a slicing pays it per step it adds, so that the simulation, which has no such
#: cost, does not cut a layer into pieces for a gain they eat
STEP_COST_S = 40e-6


def slice_base(name: str) -> str:
    """The unsliced graph's node a sliced graph's node ``name`` comes from (a slice, or the Concat joining them)."""
    name = name.split(SLICE_SEP)[0]
    return name[:-len(CONCAT_SUFFIX)] if name.endswith(CONCAT_SUFFIX) else name


#: the graph the runtime runs for a sliced graph and its kernel overrides (the CPU's blocked layout,
#: ``runtime.stream_compile``), None where it runs the graph as it is
Layout = Callable[[Graph, dict[str, str]], "Graph | None"]


def _timed_steps(g: Graph, kernels: Mapping[str, str], compute_s: Mapping[str, float], alignment: int
                 ) -> tuple[list[LayerMem], list[Buffer]]:
    """Sliced graph ``g`` (or its layout's form) sized for ``planner.flex``, each step timed from ``compute_s`` per
    node of the unsliced graph (a slice takes its share; the Concat too: its node's time is spread over the slices
    and it)."""
    layers, acts, _ks = step_memory(g, kernels, alignment=alignment)
    base = [slice_base(lm.name) for lm in layers]
    parts: dict[str, int] = {}
    for b in base:
        parts[b] = parts.get(b, 0) + 1
    return [replace(lm, compute_s=float(compute_s.get(b, 0.0)) / parts[b]) for lm, b in zip(layers, base)], acts


def simulated_run_s(graph: Graph, cfg: MemConfig, budget: int, compute_s: Mapping[str, float], read_bw: float, *,
                    alignment: int = 64, weight_alignment: int = 4096, layout: Layout | None = None) -> float:
    """Seconds one run of ``graph`` sliced as ``cfg`` takes at best inside ``budget`` bytes (``flex.simulate`` of
    the plan the streaming runtime would make: preloading, residency), from ``compute_s`` per node of the
    unsliced graph (a slice takes its share) and the disk's ``read_bw``; infinite where ``cfg`` does not fit.
    ``layout``: the graph the runtime runs, as the compile writes it: in that form where it fits the budget, else
    as it is (resnet50's blocked convs read 98 MiB of weights where the NCHW kernels' Winograd reads 127)."""
    g = slice_graph(graph, cfg.slices, cfg.in_slices)
    kernels = dict(cfg.kernels)
    laid = layout(g, kernels) if layout is not None else None
    for form in ([laid] if laid is not None else []) + [g]:
        layers, acts = _timed_steps(form, kernels, compute_s, alignment)
        try:
            plan = plan_budget(layers, acts, budget, preload=True, read_bw=read_bw, alignment=alignment,
                               weight_alignment=weight_alignment)
        except BudgetTooSmall:
            continue
        return simulate(plan, layers, read_bw)
    return math.inf


def faster_config(graph: Graph, budget: int, base: MemConfig, compute_s: Mapping[str, float], read_bw: float, *,
                  candidates: int = 3, counts: Sequence[int] = FASTER_COUNTS, min_gain: float = FASTER_MIN_GAIN,
                  divisors: Sequence[int] = FASTER_DIVISORS, step_cost_s: float = STEP_COST_S,
                  alignment: int = 64, layout: Layout | None = None) -> MemConfig:
    """``base`` (a configuration that fits ``budget``: ``fit_config``'s) with its weight-heavy layers sliced
    further where that makes the run inside the budget faster (``simulated_run_s``, plus ``step_cost_s`` for each
    step a slicing adds). Why: ``fit_config`` slices only until the budget fits, for memory. A layer's weights
    are one box, and under a budget that holds a third to two thirds of the weights the largest (mobilenetv2's
    5 MB classifier) can neither stay resident nor be read ahead in the gaps the earlier layers leave: its whole
    read waits at its step, every run. In slices, some stay resident and the rest are read ahead piece by piece
    (measured at 11.6 MiB, reads from disk: 10.4 -> 7.3 ms).

    Two searches, each change kept only where it saves at least ``min_gain`` of the time: first every layer whose
    weights pass ``budget / d`` cut into slices of at most that size, for each ``d`` in ``divisors`` (a model
    whose weights outweigh the budget many times over has more than a few such layers: resnet50 under 10-14 MiB
    reads layer3's and layer4's 20 convs of 1-9 MB in the gaps a few MB leave; simulated 62.0-64.2 -> 57.4-57.7 ms,
    measured at 13.82 MiB from disk 64.8-72.1 -> 60.9-67.4 ms, where the three heaviest alone gained nothing:
    bench results 2026-12-07zn), then greedily over the ``candidates`` layers with the
    most weights, each the count in ``counts`` that saves most. A slice keeps ``FASTER_MIN_CHANNELS`` output
    channels or more. ``compute_s``: seconds per node of the unsliced graph; ``layout``: as for
    ``simulated_run_s``."""
    if read_bw <= 0 or not any(v > 0 for v in compute_s.values()):
        return base

    def nbytes(node: Node) -> int:
        return sum(int(graph.constants[i].nbytes) for i in node.inputs[1:] if i in graph.constants)

    def most(node: Node) -> int:
        return max(1, sliceable(graph, node) // FASTER_MIN_CHANNELS)

    steps0 = sum(base.slices.values())  # a node in c slices is c + 1 steps (its Concat): c more than whole

    def cost(cfg: MemConfig) -> float:
        t = simulated_run_s(graph, cfg, budget, compute_s, read_bw, alignment=alignment, layout=layout)
        added = sum(cfg.slices.values()) - steps0
        return t + step_cost_s * max(0, added)

    nodes = sorted((n for n in graph.nodes if sliceable(graph, n) and n.name not in base.in_slices),
                   key=lambda n: (-nbytes(n), n.name))
    best, t_best = base, cost(base)
    if not math.isfinite(t_best):
        return base
    pick, t_pick = best, t_best * (1 - min_gain)
    for d in divisors:
        cap = budget / d
        slices = dict(best.slices)
        for node in nodes:
            w = nbytes(node)
            if w <= cap:
                break  # (heaviest first)
            c = min(most(node), math.ceil(w / cap))
            if c > slices.get(node.name, 1):
                slices[node.name] = c
        if slices == dict(best.slices):
            continue
        cfg = MemConfig(dict(best.kernels), slices, dict(best.in_slices))
        t = cost(cfg)
        if t < t_pick:
            pick, t_pick = cfg, t
    if pick is not best:
        best, t_best = pick, t_pick
    for node in nodes[:candidates]:
        cur = best.slices.get(node.name, 1)
        pick, t_pick = best, t_best * (1 - min_gain)
        for c in counts:
            if c <= cur or c > most(node):
                continue
            cfg = MemConfig(dict(best.kernels), {**best.slices, node.name: c}, dict(best.in_slices))
            t = cost(cfg)
            if t < t_pick:
                pick, t_pick = cfg, t
        if pick is not best:
            best, t_best = pick, t_pick
    return best


def min_fit_budget(graph: Graph, lo: int = 1 << 20, hi: int | None = None, tol: float = 0.02, *,
                   km: KernelMemory = CPU_KERNELS, alignment: int = 64) -> tuple[int, MemConfig]:
    """The smallest budget (within ``tol``) ``fit_config`` finds a configuration for, and that configuration."""
    def ok(b: int) -> MemConfig | None:
        try:
            return fit_config(graph, b, km=km, alignment=alignment)
        except BudgetTooSmall:
            return None

    if hi is None:
        hi = lo
        while ok(hi) is None:
            lo = hi
            hi *= 2
    best = ok(hi)
    assert best is not None
    while hi - lo > max(4096, int(hi * tol)):
        mid = (lo + hi) // 2
        c = ok(mid)
        if c is not None:
            hi, best = mid, c
        else:
            lo = mid
    return hi, best
