"""The co-execution planner: per layer CPU only, GPU only, or a split by output channels (pure).

Input: per layer (graph order) its predicted CPU and GPU times at the admissible split points (``LayerCosts``:
``cpu_s[i]`` is the CPU's time for the *CPU part* when the GPU takes ``points[i]`` channels, ``gpu_s[i]`` the
GPU's for its part; a layer that cannot split has the two end points only). Output: a ``SplitPlan`` that
minimises the predicted sum over layers of

* CPU only: T_cpu(C); GPU only: T_gpu(C);
* split at g: max(T_cpu(C - g), T_gpu(g)) + ``sync_s`` (the side finishing first polls for the other),

plus ``sync_s`` whenever consecutive layers change side (the consumer waits for the producer: a poll, or a
submit after the CPU's work), nothing between layers on the same side, and nothing after a split (both halves
have joined). A dynamic programme over (layer, side of its output) finds the optimum for a chain in graph
order; small layers (pooling, element-wise: ``small``) are not placed on their own but follow the layer
before them (the issue's rule: they never pay a switch for themselves). A split that does not beat the better
single side by ``min_gain`` (relative) is not taken: the predictor's error must not turn into a loss.

Transfers: on memory both sides share (lavapipe, integrated GPUs) a split moves nothing; ``transfer_s`` per
layer and side switch lets a caller price a planned copy (a discrete GPU without host-visible device memory).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

SIDES = ("cpu", "gpu", "split")


@dataclass(frozen=True)
class LayerCosts:
    name: str
    op: str
    channels: int                  # C (0: not splittable)
    points: tuple[int, ...]        # GPU channel counts considered, ascending, 0 and C included when splittable
    cpu_s: tuple[float, ...]       # CPU time of its part (C - points[i] channels)
    gpu_s: tuple[float, ...]       # GPU time of its part (points[i] channels)
    small: bool = False            # an element-wise / pooling layer: follows its neighbour
    transfer_s: float = 0.0        # a planned copy when the sides switch at this layer (0 on shared memory)

    @staticmethod
    def single(name: str, op: str, cpu_s: float, gpu_s: float, small: bool = False) -> "LayerCosts":
        """A layer that cannot split: CPU time and GPU time of the whole layer."""
        return LayerCosts(name, op, 0, (0, 1), (cpu_s, 0.0), (0.0, gpu_s), small)

    @property
    def t_cpu(self) -> float:
        return self.cpu_s[0]

    @property
    def t_gpu(self) -> float:
        return self.gpu_s[-1]


@dataclass(frozen=True)
class LayerSplit:
    name: str
    op: str
    side: str           # "cpu" | "gpu" | "split"
    channels: int
    gpu_channels: int   # channels [0, gpu_channels) on the GPU, the rest on the CPU
    t_cpu: float        # predicted: the whole layer on the CPU
    t_gpu: float        # ... on the GPU
    t_pred: float       # ... as planned (split: max of the parts + sync)
    t_cpu_part: float = 0.0
    t_gpu_part: float = 0.0

    @property
    def cpu_fraction(self) -> float:
        if self.side == "cpu":
            return 1.0
        if self.side == "gpu" or not self.channels:
            return 0.0
        return (self.channels - self.gpu_channels) / self.channels


@dataclass(frozen=True)
class SplitPlan:
    layers: tuple[LayerSplit, ...]
    predicted_s: float      # the plan's predicted latency (syncs included)
    cpu_only_s: float       # every layer on the CPU
    gpu_only_s: float       # every layer on the GPU
    sync_s: float
    bound_s: float          # the ideal split bound: sum over layers of Tc*Tg/(Tc+Tg)

    @property
    def splits(self) -> int:
        return sum(1 for lay in self.layers if lay.side == "split")

    def sides(self) -> dict[str, int | str]:
        """What ``CoexecModel`` takes: per layer 'cpu', 'gpu' or its CPU channel count."""
        out: dict[str, int | str] = {}
        for lay in self.layers:
            out[lay.name] = lay.side if lay.side != "split" else lay.channels - lay.gpu_channels
        return out

    def to_dict(self) -> dict[str, object]:
        return {"predicted_s": self.predicted_s, "cpu_only_s": self.cpu_only_s, "gpu_only_s": self.gpu_only_s,
                "sync_s": self.sync_s, "bound_s": self.bound_s, "splits": self.splits,
                "layers": [dict(lay.__dict__, cpu_fraction=lay.cpu_fraction) for lay in self.layers]}


def best_split(lc: LayerCosts, sync_s: float, min_gain: float = 0.0) -> tuple[int, float]:
    """(GPU channels, predicted time) of the best split point strictly inside (0, C), or (-1, inf)."""
    best, t_best = -1, float("inf")
    for g, tc, tg in zip(lc.points, lc.cpu_s, lc.gpu_s):
        if 0 < g < lc.channels:
            t = max(tc, tg) + sync_s
            if t < t_best:
                best, t_best = g, t
    single = min(lc.t_cpu, lc.t_gpu)
    if best < 0 or t_best > single * (1.0 - min_gain):
        return -1, float("inf")
    return best, t_best


def plan_split(layers: Sequence[LayerCosts], sync_s: float = 10e-6, min_gain: float = 0.10,
               allow_split: bool = True) -> SplitPlan:
    """The plan minimising the predicted latency (module docstring). ``min_gain``: a split must beat the better
    side by this fraction, and a layer placed on the processor that is slower for the whole model is charged
    this fraction more: deviations from running everything on the faster one must pay beyond the costs' error."""
    inf = float("inf")
    base_gpu = sum(lc.t_gpu for lc in layers) < sum(lc.t_cpu for lc in layers)
    # state: the side holding the last output: 0 cpu, 1 gpu, 2 both (after a split)
    cost = [0.0, 0.0, inf]
    back: list[list[tuple[int, str, int, float]]] = []
    for lc in layers:
        pen_cpu, pen_gpu = (1.0 + min_gain, 1.0) if base_gpu else (1.0, 1.0 + min_gain)
        opts: list[tuple[str, int, float, int]] = [("cpu", 0, lc.t_cpu * pen_cpu, 0),
                                                   ("gpu", lc.channels, lc.t_gpu * pen_gpu, 1)]
        if allow_split and lc.channels and not lc.small:
            g, t = best_split(lc, sync_s, min_gain)
            if g > 0:
                opts.append(("split", g, t, 2))
        new = [inf, inf, inf]
        bk: list[tuple[int, str, int, float]] = [(-1, "", 0, 0.0)] * 3
        for side, g, t, state in opts:
            for prev in range(3):
                if cost[prev] == inf:
                    continue
                if lc.small and prev != 2 and state != prev:
                    continue  # follows its neighbour
                switch = 0.0
                if state == 2:
                    switch = 0.0  # the split's own sync covers its handoff
                elif prev != 2 and prev != state:
                    switch = sync_s + lc.transfer_s
                c = cost[prev] + t + switch
                if c < new[state]:
                    new[state] = c
                    bk[state] = (prev, side, g, lc.t_cpu if side == "cpu" else lc.t_gpu if side == "gpu" else t)
        cost = new
        back.append(bk)
    state = min(range(3), key=lambda s: cost[s])
    total = cost[state]
    chosen: list[tuple[str, int, float]] = []
    for bk in reversed(back):
        prev, side, g, t = bk[state]
        chosen.append((side, g, t))
        state = prev
    chosen.reverse()
    out = []
    for lc, (side, g, t) in zip(layers, chosen):
        tcp = tgp = 0.0
        if side == "split":
            i = lc.points.index(g)
            tcp, tgp = lc.cpu_s[i], lc.gpu_s[i]
        out.append(LayerSplit(lc.name, lc.op, side, lc.channels, g if side != "cpu" else 0, lc.t_cpu, lc.t_gpu, t,
                              tcp, tgp))
    # the plan's predicted latency, without the margins: its layers' times and the syncs between sides
    total = 0.0
    prev_side = ""
    for lc, lay in zip(layers, out):
        total += lay.t_pred
        if lay.side != "split" and prev_side in ("cpu", "gpu") and prev_side != lay.side:
            total += sync_s + lc.transfer_s
        prev_side = lay.side
    cpu_only = sum(lc.t_cpu for lc in layers)
    gpu_only = sum(lc.t_gpu for lc in layers)
    bound = sum(lc.t_cpu * lc.t_gpu / (lc.t_cpu + lc.t_gpu) if lc.t_cpu + lc.t_gpu > 0 else 0.0 for lc in layers)
    return SplitPlan(tuple(out), total if layers else 0.0, cpu_only, gpu_only, sync_s, bound)
