"""The co-execution planner's inputs: per layer its CPU and GPU costs at the split points, from the latency
predictor's per-kernel models (``inferd.predictor.cost.PredictedCost``: a GPU unit's features include its
dispatch, so workgroup-count jumps and kernel switches show), the roofline where a device has no predictor,
or measured times (``measured``, what ``inferd bench coexec`` calibrates with).

Each part of a split is costed as the layer it is (``split_ops.make_part``) with the kernel the engine gives
it, so a part crossing a kernel's applicability (a 1x1 fast path, a depthwise part of one channel) is costed
as the kernel that really runs.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ..ir import Graph
from ..ops.base import Kernel, Layer, choose_kernel
from ..planner.split import LayerCosts, SplitPlan, plan_split
from .split_ops import make_part, split_shape

log = logging.getLogger("inferd.coexec.costs")

#: ops that are never placed on their own (they follow the layer before them)
SMALL_OPS = frozenset({"Relu", "Clip", "Add", "Mul", "Sub", "Div", "Sigmoid", "HardSigmoid", "HardSwish",
                       "MaxPool", "AveragePool", "GlobalAveragePool", "Flatten", "Reshape", "Transpose",
                       "Concat", "Identity", "Dropout", "BatchNormalization", "Softmax", "LeakyRelu", "Tanh",
                       "Gelu", "Erf", "Pow", "Sqrt", "ReduceMean", "Squeeze", "Unsqueeze", "Gather"})

#: a CostFn answers the seconds one layer takes with one kernel on one side
CostFn = Callable[[Layer, Kernel], float]


@dataclass
class Unit:
    """One node the engine runs: its layer, the GPU default kernel."""

    layer: Layer
    gpu_kernel: Kernel


def graph_units(graph: Graph, caps: Any = None, kernels: Mapping[str, str] | None = None) -> tuple[list[Unit], Any]:
    """The nodes the co-executed model runs (folded and alias nodes dropped), with their GPU default, and the
    constants (folded ones included)."""
    from ..vulkan.executor import fold_constants, select_nodes
    from ..vulkan.kernel import Caps

    caps = caps or Caps()
    _, consts, kept, _ = fold_constants(graph)
    pg = Graph(graph.name, kept, graph.inputs, graph.outputs, consts, graph.infos, graph.opset)  # type: ignore[arg-type]
    out = []
    for c in select_nodes(graph, pg, caps, kernels or {}):
        if c.default is not None:
            out.append(Unit(c.layer, c.default))
    return out, consts


def split_points(channels: int, unit: int, max_points: int = 33) -> tuple[int, ...]:
    """Admissible GPU channel counts to cost: all when few, else ``max_points`` spread evenly (0 and C)."""
    n = channels // unit
    if n + 1 <= max_points:
        return tuple(range(0, channels + 1, unit))
    pts = {int(round(i * n / (max_points - 1))) * unit for i in range(max_points)}
    return tuple(sorted(pts | {0, channels}))


def part_kernels(layer: Layer, consts: Mapping[str, Any], g: int, caps: Any, gpu_default: Kernel
                 ) -> tuple[tuple[Layer, Kernel] | None, tuple[Layer, Kernel] | None]:
    """(GPU part layer, kernel), (CPU part layer, kernel) of a split at ``g`` (None for an empty side)."""
    from collections import ChainMap

    from ..vulkan.executor import default_kernel

    sh = split_shape(layer)
    assert sh is not None
    gp = cp = None
    if g > 0:
        if g == sh.channels:
            gp = (layer, gpu_default)
        else:
            p = make_part(layer, consts, 0, g, "gpu")
            pl = p.layer(layer_infos(layer, p), ChainMap(p.constants, consts))
            k = gpu_default if gpu_default.applies(pl) else default_kernel(pl, caps)
            gp = (pl, k)
    if g < sh.channels:
        if g == 0:
            cp = (layer, choose_kernel(layer, "cpu"))
        else:
            p = make_part(layer, consts, g, sh.channels, "cpu")
            pl = p.layer(layer_infos(layer, p), ChainMap(p.constants, consts))
            cp = (pl, choose_kernel(pl, "cpu"))
    return gp, cp


def layer_infos(layer: Layer, part: Any) -> dict[str, Any]:
    infos = {t.name: t for t in layer.inputs if t is not None}
    infos.update({t.name: t for t in layer.outputs})
    infos.update(part.infos)
    return infos


def layer_costs(units: Sequence[Unit], consts: Mapping[str, Any], cpu_cost: CostFn, gpu_cost: CostFn,
                caps: Any = None, max_points: int = 33) -> list[LayerCosts]:
    """The planner's input for ``units``: every layer's CPU and GPU time at its split points."""
    from ..vulkan.kernel import Caps

    caps = caps or Caps()
    out = []
    for u in units:
        layer = u.layer
        sh = split_shape(layer)
        t_gpu = gpu_cost(layer, u.gpu_kernel)
        if sh is None:
            t_cpu = cpu_cost(layer, choose_kernel(layer, "cpu"))
            out.append(LayerCosts.single(layer.name, layer.op, t_cpu, t_gpu, layer.op in SMALL_OPS))
            continue
        pts = split_points(sh.channels, sh.unit, max_points)
        cs, gs = [], []
        for g in pts:
            gp, cp = part_kernels(layer, consts, g, caps, u.gpu_kernel)
            gs.append(gpu_cost(*gp) if gp is not None else 0.0)
            cs.append(cpu_cost(*cp) if cp is not None else 0.0)
        out.append(LayerCosts(layer.name, layer.op, sh.channels, pts, tuple(cs), tuple(gs)))
    return out


def predictor_costs(graph: Graph, consts: Mapping[str, Any], threads: int, cpu_fp: Mapping[str, str] | None = None,
                    gpu_fp: Mapping[str, str] | None = None) -> tuple[CostFn, CostFn, str]:
    """Cost functions from this machine's predictors ('cpu' and 'vulkan'), the roofline where one is missing;
    and a word on the source ('predicted', 'roofline' or 'predicted+roofline')."""
    from ..planner.cost import DeviceRates, RooflineCost
    from ..predictor import load_for
    from ..predictor.cost import PredictedCost

    fns = []
    srcs = []
    for dev, fp, gpu in (("cpu", cpu_fp, False), ("vulkan", gpu_fp, True)):
        pred = load_for(dev, fp) if fp is not None else None
        if pred is not None:
            pc = PredictedCost(pred, threads=1 if gpu else threads, constants=consts)
            fns.append(lambda layer, k, pc=pc: pc.cost(layer, k, "exec").seconds)
            srcs.append("predicted")
        else:
            rc = RooflineCost(DeviceRates(), gpu=gpu)
            fns.append(lambda layer, k, rc=rc: rc.cost(layer, k, "exec").seconds)
            srcs.append("roofline")
    src = srcs[0] if srcs[0] == srcs[1] else "+".join(sorted(set(srcs)))
    return fns[0], fns[1], src


def plan_graph(graph: Graph, cpu_cost: CostFn | None = None, gpu_cost: CostFn | None = None, caps: Any = None,
               sync_s: float = 10e-6, threads: int = 1, fingerprints: tuple[Any, Any] = (None, None),
               max_points: int = 33, min_gain: float = 0.10) -> tuple[SplitPlan, str]:
    """The co-execution plan of ``graph`` and where its costs came from."""
    units, consts = graph_units(graph, caps)
    src = "given"
    if cpu_cost is None or gpu_cost is None:
        c, g, src = predictor_costs(graph, consts, threads, *fingerprints)
        cpu_cost = cpu_cost or c
        gpu_cost = gpu_cost or g
    lcs = layer_costs(units, consts, cpu_cost, gpu_cost, caps, max_points)
    return plan_split(lcs, sync_s=sync_s, min_gain=min_gain), src


def format_plan(plan: SplitPlan, source: str = "") -> str:
    lines = [f"co-execution plan ({source} costs): predicted {plan.predicted_s * 1e3:.3f} ms; CPU only "
             f"{plan.cpu_only_s * 1e3:.3f} ms, GPU only {plan.gpu_only_s * 1e3:.3f} ms, ideal split bound "
             f"{plan.bound_s * 1e3:.3f} ms; {plan.splits} split layers, sync {plan.sync_s * 1e6:.1f} us each",
             f"{'layer':32s} {'op':14s} {'side':6s} {'CPU ch':>12s} {'T_cpu ms':>9s} {'T_gpu ms':>9s} {'planned':>9s}"]
    for lay in plan.layers:
        ch = f"{lay.channels - lay.gpu_channels}/{lay.channels}" if lay.channels else "-"
        lines.append(f"{lay.name[:32]:32s} {lay.op[:14]:14s} {lay.side:6s} {ch:>12s} {lay.t_cpu * 1e3:9.3f} "
                     f"{lay.t_gpu * 1e3:9.3f} {lay.t_pred * 1e3:9.3f}")
    return "\n".join(lines)
