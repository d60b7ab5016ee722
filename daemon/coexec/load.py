"""``inferd.load(path, device="cpu+vulkan", split=...)``: a model co-executed by the CPU and the Vulkan device.

``split``: {node name or op type: fraction of output channels on the CPU} (0: all GPU, 1: all CPU; for a
layer that cannot split, the side with the larger share); layers not named follow the planner
(``inferd.planner.split`` over the latency predictor's per-kernel costs, the roofline where a device has no
predictor). No Vulkan device: the model loads on the CPU, with a warning. A device whose memory the CPU cannot
share (``CoexecUnsupported``) or a model with host steps: on the GPU alone, with a warning.

The CPU halves run on the calling thread with the native pool bounded by ``threads`` (the daemon's
``coexec_threads``), so that a co-executed model does not take every core from the models beside it.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Mapping

from ..ir import Graph
from ..vulkan import available as vulkan_available

log = logging.getLogger("inferd.coexec")

DEVICE = "cpu+vulkan"


class CoexecWarning(UserWarning):
    """A cpu+vulkan model loaded on one side only (no GPU, or memory the CPU cannot share)."""


def coexec_threads(threads: int | None = None) -> int:
    """CPU threads co-execution may take: ``threads``, else ``INFERD_COEXEC_THREADS``, else half the usable cores
    (the other half feeds the GPU, whose driver threads run on the host too on lavapipe)."""
    from .. import native

    if threads:
        return max(1, int(threads))
    env = os.environ.get("INFERD_COEXEC_THREADS", "").strip()
    if env:
        return max(1, int(env))
    return max(1, native.num_threads() // 2)


def plan_for(graph: Graph, split: Mapping[str, Any] | None, device: Any, threads: int,
             sync_s: float = 10e-6) -> tuple[dict[str, Any], Any, str]:
    """(sides for ``CoexecModel``, the planner's ``SplitPlan``, its cost source): the planner's choice for every
    layer, then ``split``'s entries (node names win over op types) on top."""
    from ..package import fingerprint
    from .costs import plan_graph

    caps = None
    gpu_fp = None
    if device is not None:
        from ..vulkan.kernel import Caps

        c = device.caps
        caps = Caps(c.subgroup_size, c.max_shared_bytes, c.max_workgroup_invocations, c.max_workgroup_count,
                    c.vendor_id, c.device_type)
        gpu_fp = device.fingerprint()
    plan, src = plan_graph(graph, caps=caps, sync_s=sync_s, threads=threads,
                           fingerprints=(fingerprint("cpu"), gpu_fp))
    sides: dict[str, Any] = dict(plan.sides())
    if split:
        for lay in plan.layers:
            want = split.get(lay.name, split.get(lay.op))
            if want is not None:
                sides[lay.name] = float(want) if not isinstance(want, str) else want
    return sides, plan, src


class CoexecFallback(Exception):
    """This model cannot co-execute here; ``device`` is the one it should run on alone, ``reason`` why."""

    def __init__(self, device: str, reason: str) -> None:
        super().__init__(reason)
        self.device, self.reason = device, reason


def build(path: Any, split: Mapping[str, Any] | None = None, batch: int = 1, kernels: dict[str, str] | None = None,
          name: str | None = None, threads: int | None = None, sync: str = "fence",
          shapes: Mapping[str, Any] | None = None) -> tuple[str, Any, Any]:
    """(name, graph, CoexecModel) for ``path``; raises :class:`CoexecFallback` when it must run on one side.
    ``inferd.load(device="cpu+vulkan")`` wraps the engine in its Model (this module does not import the
    runtime that imports it)."""
    from ..frontend import import_template, specialize

    if not vulkan_available():
        raise CoexecFallback("cpu", "no Vulkan device here; the model runs on the CPU only")
    from .engine import CoexecModel, CoexecUnsupported

    in_memory = not isinstance(path, (str, os.PathLike))
    template = import_template(path, batch=batch, shapes=shapes)
    graph = specialize(template)
    mname = name or (template.name if in_memory else Path(path).stem)
    from ..vulkan.device import get_device

    dev = get_device()
    nthreads = coexec_threads(threads)
    try:
        sides, plan, src = plan_for(graph, split, dev, nthreads)
        cm = CoexecModel(graph, sides, device=dev, kernels=kernels, sync=sync, threads=nthreads)
    except CoexecUnsupported as e:
        raise CoexecFallback("vulkan", f"{e}; the model runs on the GPU only") from e
    cm.plan = plan
    cm.plan_source = src
    return mname, graph, cm


def summary(model: Any) -> dict[str, Any] | None:
    """What ``inferctl status`` shows of a co-executed model: split layers, CPU-only and GPU-only counts."""
    cm = getattr(model, "coexec", None)
    if cm is None:
        return None
    ps = cm.placements
    return {"split": sum(p.side == "split" for p in ps), "cpu": sum(p.side == "cpu" for p in ps),
            "gpu": sum(p.side == "gpu" for p in ps), "cost_source": getattr(cm, "plan_source", ""),
            "split_layers": [p.name for p in ps if p.side == "split"][:20]}


def info_report(path: Any, batch: int = 1, split: Mapping[str, Any] | None = None, as_json: bool = False,
                threads: int | None = None) -> str:
    """``inferd info MODEL --device cpu+vulkan``: the co-execution plan (per layer side, split, predicted times),
    without loading the weights onto either side."""
    import json

    from ..frontend import import_template, specialize
    from .costs import format_plan

    graph = specialize(import_template(path, batch=batch))
    dev = None
    if vulkan_available():
        from ..vulkan.device import get_device

        dev = get_device()
    nthreads = coexec_threads(threads)
    sides, plan, src = plan_for(graph, split, dev, nthreads)
    if as_json:
        d = plan.to_dict()
        d.update(model=str(path), device=DEVICE, cost_source=src, gpu=dev is not None, cpu_threads=nthreads,
                 sides={k: v for k, v in sides.items()})
        return json.dumps(d, indent=1)
    head = "" if dev is not None else "no Vulkan device here: the model would run on the CPU only\n"
    overridden = [k for k in (split or {})]
    tail = f"\noverridden by --split: {overridden}" if overridden else ""
    return head + format_plan(plan, src) + tail
