"""The cold-start plan: frozen, serialisable, the one thing the cold runtime obeys.

Per layer: the kernel the first run uses, what the loader reads for it (raw weights and transform
at load, or the kernel's transformed weights from the store), which loader thread prepares it and
in what order, the kernel a warm switch moves it to, and the predicted times behind the choice.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

#: What a loader reads for a layer: raw constants (transformed at load when the kernel needs it),
#: the kernel's transformed weights, or nothing (the layer has no weights).
READ_SOURCES = ("raw", "transformed", "none")


@dataclass(frozen=True)
class PlanOptions:
    """Switches of the cold-start techniques (each can be turned off for an ablation)."""

    #: choose kernels for cold latency (off: the warm default kernel everywhere)
    select: bool = True
    #: allow reading post-transformed weights from the store (off: transform every layer at load)
    cache: bool = True
    #: overlap preparation with execution (off: every layer prepared before the first executes)
    pipeline: bool = True
    #: idle loader threads take queued preparation from busy ones at run time
    steal: bool = True
    #: the executor thread prepares a layer itself when it would otherwise wait for it (CPU)
    executor_prepares: bool = True
    #: after the first answer, move layers whose cold kernel is not the warm one to the warm kernel
    warm_switch: bool = True
    #: "" lets the planner choose each layer's read source; "raw" or "transformed" forces it wherever
    #: the layer has that choice (tests and ablations)
    force_source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "PlanOptions":
        known = PlanOptions.__dataclass_fields__
        return PlanOptions(**{k: (str(v) if k == "force_source" else bool(v)) for k, v in d.items() if k in known})


@dataclass(frozen=True)
class LayerPlan:
    index: int          # position among the graph's nodes
    name: str
    op: str
    kernel: str         # kernel of the cold (first) run
    source: str         # one of READ_SOURCES
    loader: int         # preparing thread: 0..loaders-1, or ``loaders`` for the executor thread
    order: int          # position in that thread's queue
    warm_kernel: str    # kernel after the warm switch ("" = keep ``kernel``)
    read_s: float = 0.0
    transform_s: float = 0.0
    pipeline_s: float = 0.0
    exec_s: float = 0.0
    ready_s: float = 0.0       # predicted end of preparation
    exec_end_s: float = 0.0    # predicted end of execution
    cost_source: str = "roofline"

    @property
    def prep_s(self) -> float:
        return self.read_s + self.transform_s + self.pipeline_s


_new = object.__new__


def _layer_plan(r: Sequence[Any]) -> LayerPlan:
    """A LayerPlan from its ``ColdPlan.to_dict`` row, its fields set directly."""
    lp = _new(LayerPlan)
    lp.__dict__.update(index=int(r[0]), name=str(r[1]), op=str(r[2]), kernel=str(r[3]), source=str(r[4]),
                       loader=int(r[5]), order=int(r[6]), warm_kernel=str(r[7]), read_s=float(r[8]),
                       transform_s=float(r[9]), pipeline_s=float(r[10]), exec_s=float(r[11]), ready_s=float(r[12]),
                       exec_end_s=float(r[13]), cost_source=str(r[14]))
    return lp


@dataclass(frozen=True)
class ColdPlan:
    backend: str
    loaders: int
    layers: tuple[LayerPlan, ...]
    predicted_s: float          # predicted cold latency (last execution's end)
    warm_s: float               # predicted warm latency with the warm kernels
    read_s: float               # predicted time to read what the plan reads
    options: PlanOptions = field(default_factory=PlanOptions)

    @property
    def executor(self) -> int:
        """Queue index of the executor thread."""
        return self.loaders

    def queues(self) -> list[list[int]]:
        """Per preparing thread (loaders, then the executor), the plan positions of its layers in order."""
        qs: list[list[tuple[int, int]]] = [[] for _ in range(self.loaders + 1)]
        for pos, lp in enumerate(self.layers):
            qs[lp.loader].append((lp.order, pos))
        return [[p for _, p in sorted(q)] for q in qs]

    def read_order(self) -> list[LayerPlan]:
        """Layers in the order their preparations are predicted to finish: the order the store is
        written in and streamed in."""
        return sorted(self.layers, key=lambda lp: (lp.ready_s, lp.index))

    def by_name(self) -> dict[str, LayerPlan]:
        return {lp.name: lp for lp in self.layers}

    def with_options(self, **kw: bool) -> "ColdPlan":
        return replace(self, options=replace(self.options, **kw))

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "loaders": self.loaders, "predicted_s": self.predicted_s,
                "warm_s": self.warm_s, "read_s": self.read_s, "options": self.options.to_dict(),
                "layers": [[lp.index, lp.name, lp.op, lp.kernel, lp.source, lp.loader, lp.order, lp.warm_kernel,
                            lp.read_s, lp.transform_s, lp.pipeline_s, lp.exec_s, lp.ready_s, lp.exec_end_s,
                            lp.cost_source] for lp in self.layers]}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "ColdPlan":
        # (every field spelled out: a generator for the six floats made this 1.5x slower, and a cold load parses
        # every layer's row on its way to the first answer)
        # LayerPlan's fields stored directly (as package._uninfo does): the frozen dataclass's __init__ sets each of
        # the 15 through object.__setattr__, most of this parse's time
        layers = tuple([_layer_plan(r) for r in d["layers"]])
        for lp in layers:
            if lp.source not in READ_SOURCES:
                raise ValueError(f"layer {lp.name}: unknown read source {lp.source!r}")
            if not 0 <= lp.loader <= int(d["loaders"]):
                raise ValueError(f"layer {lp.name}: loader {lp.loader} outside 0..{d['loaders']}")
        return ColdPlan(str(d["backend"]), int(d["loaders"]), layers, float(d["predicted_s"]), float(d["warm_s"]),
                        float(d["read_s"]), PlanOptions.from_dict(d.get("options", {})))

    def summary(self) -> str:
        """One line per layer, for ``inferd info``."""
        lines = [f"cold plan ({self.backend}, {self.loaders} loader thread(s) + executor): predicted cold "
                 f"{self.predicted_s * 1e3:.1f} ms, warm {self.warm_s * 1e3:.1f} ms, reads {self.read_s * 1e3:.1f} ms; "
                 f"options {self.options.to_dict()}",
                 f"{'#':>4} {'layer':<28} {'op':<14} {'kernel':<12} {'reads':<11} {'thread':>6} "
                 f"{'read':>7} {'xform':>7} {'pipe':>7} {'exec':>7} {'ready':>8}  warm"]
        for lp in self.layers:
            who = "exec" if lp.loader == self.loaders else f"L{lp.loader}"
            lines.append(f"{lp.index:>4} {lp.name[:28]:<28} {lp.op[:14]:<14} {lp.kernel[:12]:<12} {lp.source:<11} "
                         f"{who:>6} {lp.read_s * 1e3:7.2f} {lp.transform_s * 1e3:7.2f} {lp.pipeline_s * 1e3:7.2f} "
                         f"{lp.exec_s * 1e3:7.2f} {lp.ready_s * 1e3:8.2f}  {lp.warm_kernel or '='}")
        return "\n".join(lines)
