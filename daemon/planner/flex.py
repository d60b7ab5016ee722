"""Preload-aware memory planning under a budget (FlexNN's 2-D packing): a pure function.

The arena is a rectangle: x is layer time (compute steps 0..L-1), y is the address in a buffer of
``budget`` bytes. Every tensor is a box: an activation lives from the step that writes it to the last
step that reads it; a layer's intermediates (workspaces) live during its step only; a layer's streamed
weights live from the step their load may begin to the step that computes with them. Moving that start
earlier is *preloading*: the loader thread reads layer i's weights while earlier layers compute.

Placement (FlexNN, section 4): activations first, alternately at the two ends of the buffer (so the
middle stays free for weights); then layer by layer its weights as early as they fit (the earliest start
not before the previous layer's: the loader works in layer order), then its intermediates; a layer whose
intermediates no longer fit is placed again without preloading; a layer that fails even so means the
budget is too small, and ``BudgetTooSmall`` says by how many bytes (``min_budget`` finds the smallest).

Two boxes overlap in address only if their time intervals are disjoint, so a load that starts at step s
overwrites only data whose last reader ran before s: the runtime's dependency ``comp(s - 1) < load(i)``
(``FlexPlan.load_after``) is all it needs. Weights that stay resident across inferences live the whole
run; where the budget allows, the planner keeps resident the weights that save the most stall per byte.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ..errors import InferdError
from .memory import Buffer, align_up


class BudgetTooSmall(InferdError):
    """The budget cannot hold a layer's working set; ``need`` is the smallest budget that does (when known)."""

    def __init__(self, msg: str, budget: int, need: int) -> None:
        super().__init__(msg)
        self.budget = budget
        self.need = need

    @property
    def short_by(self) -> int:
        return max(0, self.need - self.budget)


@dataclass(frozen=True)
class LayerMem:
    """One compute step as the planner sees it."""

    name: str
    weights: int = 0      # bytes of streamed weights this step reads (0: none)
    workspace: int = 0    # bytes of intermediates live during this step only
    compute_s: float = 0.0  # predicted compute time (for the resident choice; 0: unknown)


@dataclass(frozen=True)
class Box:
    """A placed tensor: ``size`` bytes at ``offset``, live from step ``first`` to ``last`` inclusive."""

    name: str
    kind: str  # "activation" | "weights" | "workspace" | "resident"
    offset: int
    size: int
    first: int
    last: int

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(frozen=True)
class FlexPlan:
    budget: int
    alignment: int
    steps: int
    boxes: tuple[Box, ...]
    #: per step: the offset of its streamed or resident weights (-1: none)
    weight_offset: tuple[int, ...]
    #: per step: the step whose compute must finish before this step's weights load (-1: the run's start);
    #: equal to the step itself minus one when the layer was not preloaded
    load_after: tuple[int, ...]
    #: per step: whether its weights stay resident across runs
    resident: tuple[bool, ...]
    preload: bool
    #: highest address any box reaches (<= budget)
    peak: int
    offsets: Mapping[str, int] = field(default_factory=dict)  # activation name -> offset

    @property
    def resident_bytes(self) -> int:
        return sum(b.size for b in self.boxes if b.kind == "resident")

    @property
    def streamed_bytes(self) -> int:
        return sum(b.size for b in self.boxes if b.kind == "weights")

    @property
    def preloaded(self) -> int:
        """How many layers load before the step before their own (overlapped with earlier compute)."""
        return sum(1 for i, a in enumerate(self.load_after) if not self.resident[i] and self.weight_offset[i] >= 0
                   and a < i - 1)

    def workspace_offset(self, step: int) -> int:
        for b in self.boxes:
            if b.kind == "workspace" and b.first == step:
                return b.offset
        return -1


class _Arena:
    """Boxes placed so far, with first-fit search from either end of the budget."""

    def __init__(self, budget: int, alignment: int) -> None:
        self.budget = budget
        self.alignment = alignment
        self.boxes: list[Box] = []
        self._t: list[tuple[int, int, int, int]] = []  # (offset, end, first, last) of each box: fast to scan

    def _busy(self, first: int, last: int) -> list[tuple[int, int]]:
        return sorted([(o, e) for o, e, f, l in self._t if l >= first and f <= last])

    def truncate(self, n: int) -> None:
        del self.boxes[n:]
        del self._t[n:]

    def find(self, size: int, first: int, last: int, top: bool = False, align: int = 0) -> int | None:
        """The lowest (``top``: highest) offset aligned to ``align`` (default: the arena's) where ``size``
        bytes are free for [first, last]."""
        al = align or self.alignment
        size = align_up(max(size, 1), al)
        busy = self._busy(first, last)
        if not top:
            cur = 0
            for o, e in busy:
                if o - cur >= size:
                    return cur
                if e > cur:
                    cur = -(-e // al) * al
            return cur if cur + size <= self.budget else None
        hi = self.budget
        for o, e in sorted(busy, key=lambda p: -p[1]):
            if e <= hi:
                cand = (hi - size) // al * al
                if cand >= e:
                    return cand
            hi = min(hi, o)
        cand = (hi - size) // al * al
        return cand if cand >= 0 else None

    def put(self, name: str, kind: str, size: int, first: int, last: int, offset: int, align: int = 0) -> Box:
        b = Box(name, kind, offset, align_up(max(size, 1), align or self.alignment), first, last)
        self.boxes.append(b)
        self._t.append((b.offset, b.end, first, last))
        return b


def plan_flex(layers: Sequence[LayerMem], activations: Sequence[Buffer], budget: int, *, preload: bool = True,
              resident: Sequence[int] = (), max_preload: int | None = None, alignment: int = 64,
              weight_alignment: int = 0) -> FlexPlan:
    """Place ``activations`` (lifetimes in step indices; -1 = before the first step, ``len(layers)`` = after
    the last) and each layer's weights and workspace inside ``budget`` bytes. ``resident``: steps whose
    weights stay in the arena across runs. ``max_preload``: how many steps ahead a load may start (None:
    any). ``weight_alignment``: of the weight boxes (e.g. 4096, for ``O_DIRECT`` reads straight into them;
    default ``alignment``). Raises ``BudgetTooSmall`` when something does not fit."""
    wal = max(weight_alignment, alignment)
    if budget <= 0:
        raise BudgetTooSmall(f"memory budget must be positive, got {budget}", budget, 1)
    L = len(layers)
    ar = _Arena(budget, alignment)
    res = set(resident)
    w_off = [-1] * L
    after = [i - 1 for i in range(L)]

    def short(what: str, i: int) -> BudgetTooSmall:
        return BudgetTooSmall(f"memory budget {budget} bytes ({budget / 2**20:.2f} MiB) is too small: {what} of "
                              f"step {i} ({layers[i].name if 0 <= i < L else '-'}) does not fit", budget, 0)

    # resident weights live across runs: the bottom of the buffer, before anything else
    for i in sorted(res):
        if layers[i].weights <= 0:
            continue
        o = ar.find(layers[i].weights, -1, L, align=wal)
        if o is None:
            raise short("resident weights", i)
        ar.put(layers[i].name, "resident", layers[i].weights, -1, L, o, align=wal)
        w_off[i] = o
        after[i] = -1
    # activations: longest-lived and largest first, each at whichever end leaves it closer to its edge
    acts: dict[str, int] = {}
    for b in sorted(activations, key=lambda b: (-(b.last - b.first), -b.size, b.name)):
        lo = ar.find(b.size, b.first, b.last, top=False)
        hi = ar.find(b.size, b.first, b.last, top=True)
        if lo is None and hi is None:
            raise short(f"activation {b.name!r} ({b.size} bytes)", b.first)
        if hi is None or (lo is not None and lo + b.size <= budget - hi):
            o = lo
        else:
            o = hi
        assert o is not None
        ar.put(b.name, "activation", b.size, b.first, b.last, o)
        acts[b.name] = o
    prev_start = 0
    for i, lm in enumerate(layers):
        mark = len(ar.boxes)
        tries = [True, False] if preload else [False]
        placed = False
        for pre in tries:
            ar.truncate(mark)
            start = i
            if lm.weights > 0 and i not in res:
                o = None
                if pre:
                    # the earliest start that fits: a later start frees a superset of addresses, so
                    # fitting is monotone in it and a binary search finds the earliest
                    lo = min(max(prev_start, 0 if max_preload is None else i - max_preload), i)
                    o = ar.find(lm.weights, i, i, align=wal)
                    if o is not None:
                        start, hi_s = i, i
                        while lo < hi_s:
                            mid = (lo + hi_s) // 2
                            om = ar.find(lm.weights, mid, i, align=wal)
                            if om is not None:
                                hi_s, start, o = mid, mid, om
                            else:
                                lo = mid + 1
                else:
                    o = ar.find(lm.weights, i, i, align=wal)
                if o is None:
                    continue
                ar.put(lm.name, "weights", lm.weights, start, i, o, align=wal)
                w_off[i] = o
                after[i] = start - 1
            if lm.workspace > 0:
                o = ar.find(lm.workspace, i, i)
                if o is None:
                    continue
                ar.put(lm.name, "workspace", lm.workspace, i, i, o)
            placed = True
            break
        if not placed:
            raise short(f"weights ({lm.weights} bytes) and workspace ({lm.workspace} bytes)", i)
        if lm.weights > 0 and i not in res:
            prev_start = after[i] + 1
    peak = max((b.end for b in ar.boxes), default=0)
    return FlexPlan(budget, alignment, L, tuple(ar.boxes), tuple(w_off), tuple(after),
                    tuple(i in res for i in range(L)), preload, peak, acts)


def lower_bound(layers: Sequence[LayerMem], activations: Sequence[Buffer], alignment: int = 64) -> int:
    """No plan fits below this: the most bytes live at one step (activations, that step's weights and
    workspace), each rounded to the alignment."""
    L = len(layers)
    best = 0
    for t in range(-1, L + 1):
        live = sum(align_up(max(b.size, 1), alignment) for b in activations if b.first <= t <= b.last)
        if 0 <= t < L:
            lm = layers[t]
            live += (align_up(lm.weights, alignment) if lm.weights else 0) + \
                (align_up(lm.workspace, alignment) if lm.workspace else 0)
        best = max(best, live)
    return best


def min_budget(layers: Sequence[LayerMem], activations: Sequence[Buffer], *, preload: bool = False,
               alignment: int = 64, tol: float = 0.005, weight_alignment: int = 0) -> int:
    """The smallest budget (within ``tol`` relative) for which ``plan_flex`` succeeds with nothing resident."""
    lo = lower_bound(layers, activations, alignment)
    hi = lo

    def ok(b: int) -> bool:
        try:
            plan_flex(layers, activations, b, preload=preload, alignment=alignment,
                      weight_alignment=weight_alignment)
            return True
        except BudgetTooSmall:
            return False

    # every budget tried is aligned and the one returned was tried: first fit is not monotone in the budget
    # (a larger arena can place a tensor where it later blocks another), so an untried neighbour of a
    # feasible budget may not be feasible
    hi = align_up(hi, alignment)
    while not ok(hi):
        lo = hi
        hi = align_up(int(hi * 1.25) + alignment, alignment)
    if hi == lower_bound(layers, activations, alignment):
        return hi
    while hi - lo > max(alignment, int(hi * tol)):
        mid = align_up((lo + hi) // 2, alignment)
        if mid >= hi:
            break
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def resident_order(layers: Sequence[LayerMem], read_bw: float = 0.0) -> list[int]:
    """Steps with weights, best candidates for residency first: the most read time saved per byte kept.

    Keeping a layer's weights resident saves reading them every run; with a known disk bandwidth and
    compute times, a load that hides behind the previous step's compute costs nothing, so the saving is
    the stall it would cause (read time beyond the preceding compute), per byte. Without times every
    byte saves the same read: smaller layers first (more layers off the loader's queue per byte)."""
    cand = [i for i, lm in enumerate(layers) if lm.weights > 0]
    if read_bw > 0 and any(lm.compute_s > 0 for lm in layers):
        def gain(i: int) -> float:
            hide = layers[i - 1].compute_s if i > 0 else 0.0
            return max(0.0, layers[i].weights / read_bw - hide) / layers[i].weights
        return sorted(cand, key=lambda i: (-gain(i), layers[i].weights, i))
    return sorted(cand, key=lambda i: (layers[i].weights, i))


def plan_budget(layers: Sequence[LayerMem], activations: Sequence[Buffer], budget: int, *, preload: bool = True,
                keep_resident: bool = True, read_bw: float = 0.0, max_preload: int | None = None,
                alignment: int = 64, weight_alignment: int = 0) -> FlexPlan:
    """The plan the runtime uses: ``plan_flex`` with as many of the best resident candidates as still fit.
    Raises ``BudgetTooSmall`` with the smallest feasible budget when even nothing resident does not fit."""
    try:
        base = plan_flex(layers, activations, budget, preload=preload, max_preload=max_preload, alignment=alignment,
                         weight_alignment=weight_alignment)
    except BudgetTooSmall as e:
        need = min_budget(layers, activations, alignment=alignment, weight_alignment=weight_alignment)
        raise BudgetTooSmall(f"{e}; the smallest budget that fits is {need} bytes ({need / 2**20:.2f} MiB), "
                             f"short by {need - budget} bytes ({(need - budget) / 2**20:.2f} MiB)",
                             budget, need) from None
    if not keep_resident:
        return base
    timed = read_bw > 0 and any(lm.compute_s > 0 for lm in layers)
    best = _with_resident(layers, activations, budget, base, resident_order(layers, read_bw), preload=preload,
                          max_preload=max_preload, alignment=alignment, weight_alignment=weight_alignment)
    if timed:
        # with times known the plan's own schedule can be judged (``run_s``: the simulation, each streamed step
        # charged ``STREAMED_STEP_S``): when the first choice leaves the run well above max(compute, reading),
        # other residencies are tried too and the fastest plan kept
        t_best = run_s(best, layers, read_bw)
        k_gain = sum(best.resident)
        floor = max(sum(lm.compute_s for lm in layers), best.streamed_bytes / read_bw)
        if t_best > 1.05 * floor:
            kw = dict(preload=preload, max_preload=max_preload, alignment=alignment, weight_alignment=weight_alignment)
            with_w = [i for i, lm in enumerate(layers) if lm.weights > 0]
            # the largest layers first (fewer, bigger loads kept off the loader's queue: resnet50 with its measured
            # times, 63 ms against 71 at 103 MiB), and the smallest first (the fewest streamed steps: mobilenetv2
            # at 17.5 MiB streamed 29 small layers, 2.7 MiB, and ran 0.4-0.8 ms over its warm time with no wait
            # for a read, 2026-12-07zl, where streaming its classifier alone costs the same compute and reads)
            for order in (sorted(with_w, key=lambda i: (-layers[i].weights, i)),
                          sorted(with_w, key=lambda i: (layers[i].weights, i))):
                other = _with_resident(layers, activations, budget, base, order, **kw)
                t_other = run_s(other, layers, read_bw)
                if t_other < t_best:
                    best, t_best = other, t_other
            # fewer resident weights: a byte kept resident is a byte the loader can no longer preload into, and
            # where compute hides the reading (vit_tiny at 8.5 MiB: 16 MiB to read in 8 ms, 29 ms of compute)
            # the deepest preloading beats the most residency (simulated 28.6 ms against 33.2). Only for a clear
            # gain: the simulation reads at the disk's rate, and a real read of a small layer pays its latency
            # too, which favours the plan that reads fewer bytes
            fewer, t_fewer = _fewest_stalls(layers, activations, budget, base, resident_order(layers, read_bw),
                                            k_gain, read_bw, **kw)
            if t_fewer < 0.95 * t_best:
                best = fewer
    return best


#: what a streamed step costs the executor beyond its compute: the end of a fused run of native steps, the wait
#: for its weights (met at once when they are in), the loader's hand-off. mobilenetv2 at 17.5 MiB, 29 small layers
#: streamed with no wait for a read: 0.4 ms over its warm run from the page cache, 0.8 ms from the disk (14-26 us a
#: step, 2026-12-07zl)
STREAMED_STEP_S = 20e-6


def run_s(plan: FlexPlan, layers: Sequence[LayerMem], read_bw: float, step_s: float = STREAMED_STEP_S) -> float:
    """``simulate`` with each streamed step (weights read every run) charged ``step_s`` more compute: what the
    planner compares plans by (``simulate`` alone, the floor a plan leaves, has no such cost)."""
    streamed = set(_streamed_steps(plan, layers))
    comp = [lm.compute_s + (step_s if i in streamed else 0.0) for i, lm in enumerate(layers)]
    return simulate(plan, layers, read_bw, comp)


def _streamed_steps(plan: FlexPlan, layers: Sequence[LayerMem]) -> list[int]:
    """The steps whose weights ``plan`` reads every run (placed, not resident), in step order."""
    return [i for i in range(plan.steps) if plan.weight_offset[i] >= 0 and not plan.resident[i]
            and layers[i].weights > 0]


def _fewest_stalls(layers: Sequence[LayerMem], activations: Sequence[Buffer], budget: int, base: FlexPlan,
                   order: Sequence[int], k_max: int, read_bw: float, **kw: object) -> tuple[FlexPlan, float]:
    """The plan with the longest prefix of ``order`` resident (shorter than ``k_max``, the longest that fits)
    whose run (``run_s``) stays within 1% of ``base``'s (the plan with nothing resident), and that time: the
    residency that costs no preloading. Bisected: the simulated time grows with the resident prefix once its
    bytes start to crowd out the preloads."""
    t_none = run_s(base, layers, read_bw)
    target = 1.01 * t_none
    lo, hi = 0, k_max
    best: tuple[FlexPlan, float] | None = None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            p = plan_flex(layers, activations, budget, resident=order[:mid], **kw)  # type: ignore[arg-type]
            t = run_s(p, layers, read_bw)
        except BudgetTooSmall:
            p, t = None, float("inf")
        if p is not None and t <= target:
            lo, best = mid, (p, t)
        else:
            hi = mid
    return best if best is not None else (base, t_none)


def _with_resident(layers: Sequence[LayerMem], activations: Sequence[Buffer], budget: int, base: FlexPlan,
                   order: Sequence[int], **kw: object) -> FlexPlan:
    """``plan_flex`` with the longest prefix of ``order`` resident that still fits (``base``: none)."""
    if not order:
        return base

    def attempt(k: int) -> FlexPlan | None:
        try:
            return plan_flex(layers, activations, budget, resident=order[:k], **kw)  # type: ignore[arg-type]
        except BudgetTooSmall:
            return None

    full = attempt(len(order))
    if full is not None:
        return full
    # the prefix length that fits is (nearly) monotone: bisect it
    lo, hi, best = 0, len(order), base
    while hi - lo > 1:
        mid = (lo + hi) // 2
        p = attempt(mid)
        if p is not None:
            lo, best = mid, p
        else:
            hi = mid
    return best


def time_lower_bound(layers: Sequence[LayerMem], activations: Sequence[Buffer], budget: int, read_bw: float,
                     compute_s: Sequence[float] | None = None) -> float:
    """Seconds below which no run of these steps fits in ``budget`` bytes, whatever the plan: any placement, any
    residency, reads of any size in any order at ``read_bw`` bytes/s, compute overlapping them perfectly.

    Why it holds: the weights of steps ``i`` and after that are in memory when step ``i`` begins share the budget
    with what step ``i`` needs itself (the activations live across it, its workspace), and, having been read
    before it began, also with what step ``i - 1`` held at its end (its activations, workspace and weights); the
    rest is still to be read. So a run takes at least ``compute(< i) + (weights(>= i) - room(i)) / read_bw`` for
    every ``i``, and at least its compute. Where this passes max(compute, all weights / read_bw), the bound a
    plan's reads are judged by, the budget itself forbids the overlap: resnet50 under 14 MiB must read most of its
    weights (layer3's and layer4's) after its first half has run, with no room to hold them earlier."""
    L = len(layers)
    comp = list(compute_s) if compute_s is not None else [lm.compute_s for lm in layers]
    if len(comp) != L or read_bw <= 0:
        raise ValueError("time_lower_bound needs one compute time per step and a positive read rate")
    live = [0] * (L + 1)
    for b in activations:
        lo, hi = max(b.first, 0), min(b.last, L - 1)
        if lo <= hi:
            live[lo] += b.size
            live[hi + 1] -= b.size
    best = sum(comp)
    before, acts, rest, held = 0.0, 0, sum(lm.weights for lm in layers), budget
    for i, lm in enumerate(layers):
        acts += live[i]
        room = max(0, min(held, budget - acts - lm.workspace))
        best = max(best, before + max(0, rest - room) / read_bw)
        before += comp[i]
        rest -= lm.weights
        held = max(0, budget - acts - lm.workspace - lm.weights)  # beside step i at its end, for the steps after
    return best


def simulate(plan: FlexPlan, layers: Sequence[LayerMem], read_bw: float,
             compute_s: Sequence[float] | None = None) -> float:
    """Seconds one run of ``plan`` takes at best with one loader reading whole layers in order at ``read_bw``
    bytes/s and the compute steps taking ``compute_s`` (default: the layers' own ``compute_s``): a load starts
    once the loader is free and step ``load_after`` has run; a step starts once the step before it has run
    and its weights are in. The floor this memory plan leaves, whatever the runtime does (the goal's bound,
    max(compute, reading), assumes every read can overlap compute, which a tight budget forbids)."""
    L = plan.steps
    comp = list(compute_s) if compute_s is not None else [lm.compute_s for lm in layers]
    if len(comp) != L or read_bw <= 0:
        raise ValueError("simulate needs one compute time per step and a positive read rate")
    order = _streamed_steps(plan, layers)
    done = [0.0] * L
    ready: dict[int, float] = {}
    loader_free = 0.0
    k = 0
    t = 0.0
    for i in range(L):
        while k < len(order) and plan.load_after[order[k]] < i:  # the loader, in layer order
            j = order[k]
            a = plan.load_after[j]
            loader_free = max(loader_free, done[a] if a >= 0 else 0.0) + layers[j].weights / read_bw
            ready[j] = loader_free
            k += 1
        t = max(t, ready.get(i, 0.0)) + comp[i]
        done[i] = t
    return t
