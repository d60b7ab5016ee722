"""Compiled model package: a directory holding ``plan.bin`` and ``weights.store``.

``plan.bin`` (magic, version, sha256): the graph IR, the small constants inline, the device
fingerprint, the profile measured on that device and the cold-start plan, which is authoritative:
the cold runtime reads and prepares exactly what it says. ``weights.store``: every large raw
constant, plus the transformed weights the plan reads (cold and warm kernels), written in the order
the loaders need them.

``inferd compile`` writes it; ``inferd.load(dir)`` and the daemon's package cache read it. A package
that is damaged, or was made for another device, engine version, batch or kernel choice, is a cache
miss: rebuilt from its source, never used.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import threading
import logging
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import msgpack
import numpy as np

from . import __version__, faults
from dataclasses import dataclass

from .backends.base import LazyConstants, WeightSource, transformed_key
from .errors import (BackendError, InferdError, PackageOptionsError, PackageUnsupported, StalePackageError,
                     WeightsStoreError)
from .frontend.shapes import specialize
from .fileio import FRAME_HEAD, FrameError, atomic_write, frame_checksum, framed
from .ir import Graph, Node, Overlay, Renamed, Subgraph, TensorInfo, dtype_from_tag, dtype_tag
from .ops.base import Layer, choose_kernel, raw_params
from .planner.cold import GPU_LOADERS, cold_layers, plan_cold
from .planner.cost import DeviceRates, Profile, ProfiledCost, RooflineCost, calibrated_roofline, kernel_transforms
from .planner.layout import (LayoutPlan, absorb_transposes, apply_layout, fuse_l2_normalize, fuse_scale_gain,
                             plan_layout)
from .planner.memory import MemoryPlan, memory_from_record, memory_record
from .planner.plan import ColdPlan, PlanOptions
from .planner.precision import FP32, VULKAN_HALF_OPS, LayerFacts, PrecisionPlan
from .runtime.window import hold as hold_window
from .store import (FileMemo, HeadRead, StoreStream, StoreWriter, WeightsStore, file_sha256, file_version,
                    index_cached)

log = logging.getLogger(__name__)

PLAN_MAGIC = b"INFDPLAN"
#: 4: plan.bin records the precision plan (and which raw constants the store holds in fp16); 5: the CPU graph
#: absorbs Transposes into MatMuls and fuses F.normalize, so a CPU plan's layers are other nodes than before; 6: the
#: CPU layout blocks standalone activations that keep zero at zero (layout kind "unary"): fewer conversions; 7: the
#: import folds a per-channel Mul after a Linear's Transpose into its weights (a ConvNeXt block loses a node)
PLAN_VERSION = 7
_PLAN_HEAD = FRAME_HEAD
_EXT_NDARRAY, _EXT_TUPLE, _EXT_SUBGRAPH = 1, 2, 3


def _default(o: Any) -> Any:
    if isinstance(o, np.ndarray):
        return msgpack.ExtType(_EXT_NDARRAY, msgpack.packb([dtype_tag(o.dtype), list(o.shape), o.tobytes()], use_bin_type=True))
    if isinstance(o, tuple):
        return msgpack.ExtType(_EXT_TUPLE, msgpack.packb(list(o), default=_default, use_bin_type=True))
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, Subgraph):  # a control-flow body, nested bodies in its nodes' attributes
        return msgpack.ExtType(_EXT_SUBGRAPH, msgpack.packb(
            [o.name, node_records(o.nodes),
             [[name, dtype_tag(dt), None if dims is None else list(dims)] for name, dt, dims in o.inputs],
             o.outputs, o.constants, o.outer], default=_default, use_bin_type=True))
    raise TypeError(f"cannot serialise {type(o).__name__}")


def _hook(found: list[Any] | None) -> Callable[[int, bytes], Any]:
    """``_ext_hook`` for msgpack, appending to ``found`` where it is given."""
    return _ext_hook if found is None else (lambda c, b: _ext_hook(c, b, found))


def _ext_hook(code: int, data: bytes, found: list[Any] | None = None) -> Any:
    """msgpack's hook for inferd's types; ``found``: every array and control-flow body made is appended to it."""
    if code == _EXT_NDARRAY:
        dt, shape, buf = msgpack.unpackb(data, raw=False)
        out: Any = np.frombuffer(buf, dtype=dtype_from_tag(dt)).reshape(shape).copy()
    elif code == _EXT_TUPLE:
        return tuple(msgpack.unpackb(data, raw=False, ext_hook=_hook(found), strict_map_key=False))
    elif code == _EXT_SUBGRAPH:
        name, nodes, ins, outs, consts, outer = msgpack.unpackb(data, raw=False, ext_hook=_hook(found),
                                                                strict_map_key=False)
        out = Subgraph(name, nodes_of(nodes),
                       [(r[0], dtype_from_tag(r[1]), None if r[2] is None else tuple(r[2])) for r in ins], list(outs),
                       dict(consts), list(outer))
    else:
        return msgpack.ExtType(code, data)
    if found is not None:
        found.append(out)
    return out


def node_records(nodes: Sequence[Node]) -> list[list[Any]]:
    """Nodes as plan.bin (and a stream compile's file) records them: [name, op, inputs, outputs, attributes]."""
    return [[n.name, n.op, n.inputs, n.outputs, n.attrs] for n in nodes]


def nodes_of(records: Sequence[Sequence[Any]]) -> list[Node]:
    """``node_records`` read back."""
    return [_node(r) for r in records]


def _node(r: Sequence[Any]) -> Node:
    # Node's fields set directly: its dataclass __init__ (two default factories among them) was most of an open's
    # node parse, once per node before the first layer runs
    n = _new(Node)
    n.__dict__.update(name=r[0], op=r[1], inputs=list(r[2]), outputs=list(r[3]), attrs=dict(r[4]), domain="",
                      bodies={}, notes={})
    return n


def _info(t: TensorInfo) -> list[Any]:
    return [t.name, list(t.shape), dtype_tag(t.dtype)]


_new = object.__new__


def _uninfo(r: list[Any]) -> TensorInfo:
    # TensorInfo's fields set directly: the frozen dataclass's __init__ (an object.__setattr__ per field) took
    # half of this, and an open makes one per tensor (vit_tiny: ~600)
    t = _new(TensorInfo)
    d = t.__dict__
    d["name"] = r[0]
    d["shape"] = tuple(r[1])
    d["dtype"] = dtype_from_tag(r[2])
    return t


def fingerprint(device: str) -> dict[str, str]:
    """The device a package's plan, profile and transformed weights were made for."""
    if device == "cpu":
        from .runtime.profiler import cpu_fingerprint

        return cpu_fingerprint()
    try:
        from .vulkan.device import get_device

        return get_device().fingerprint()
    except Exception as e:  # no Vulkan here: the package cannot be valid for it
        return {"backend": device, "engine": __version__, "error": f"{type(e).__name__}: {e}"}


#: constants up to this size travel inside plan.bin (one read at open); larger ones are the loader's
INLINE_MAX = 16 << 10
#: but a weight that only layers reading transformed weights take goes to the store above this size: a cold load
#: never reads it, and every open parsed it (mobilenetv2: 71 such weights, 225 KB of its 304 KB plan.bin, ~1 ms of
#: a 2-core VM's open)
INLINE_MAX_ANY = 1 << 10
#: a layer whose cold run reads one kernel's transformed weights gets its warm kernel's stored too only up to this
#: size: a larger one would be a second full copy of the layer (vgg16 fp16's classifier: raw, the cold kernel's and
#: the warm kernel's, 196 MiB each: stored bytes 0.71x fp32's), and the warm switch transforms it from raw in idle
#: time when the store lacks it (``ColdLoad.prepare_warm``)
WARM_COPY_MAX_BYTES = 8 << 20


def transformed_only(plan: ColdPlan, layers: dict[str, tuple[Layer, Any]]) -> set[str]:
    """The constants that only layers whose ``plan`` reads transformed weights take (none other reads them raw)."""
    out: set[str] = set()
    other: set[str] = set()
    for lp in plan.layers:
        got = layers.get(lp.name)
        if got is not None:
            (out if lp.source == "transformed" else other).update(got[0].const_names)
    return out - other


def compile_model(src: str | os.PathLike, out_dir: str | os.PathLike, device: str = "cpu", batch: int = 1,
                  kernels: dict[str, str] | None = None, transformed: bool = True,
                  options: PlanOptions | None = None, loaders: int | None = None,
                  profile: bool | str = True, shapes: dict[str, tuple[int, ...]] | None = None,
                  precision: str = "fp32", fp32_layers: tuple[str, ...] | list[str] = (),
                  fp16_arithmetic: bool = False) -> Path:
    """Import ``src``, profile it on this device, plan its cold start and write the package to ``out_dir``.

    ``profile="auto"``: when this device has a valid trained latency predictor, plan from its predictions
    at once and leave the profiling to idle time (the package records ``costs: "predicted"``; the model
    loaded from it profiles and re-plans after its first run); otherwise profile now.

    ``transformed`` False (or ``options.cache`` False) plans every layer to read raw weights. The
    store holds every raw constant (any plan can be served from it) and the transformed weights the
    plan reads, cold and warm kernels both, laid out in the order the loaders read them."""
    from .frontend import import_template, specialize

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    template = import_template(src, batch=batch, shapes=shapes)
    graph = specialize(template)  # the plan's shape: a dynamic model's other shapes share its weights
    if device == "vulkan" and graph.runtime_shaped:
        raise PackageUnsupported(f"{src}: tensors {sorted(graph.runtime_shaped)[:3]} are shaped at run time; a Vulkan "
                                 "package plans static shapes, so this model is split between Vulkan and the CPU in "
                                 "memory instead", template)
    opt = options or PlanOptions()
    if not transformed:
        opt = PlanOptions(**{**opt.to_dict(), "cache": False})
    # the CPU's layout plan is part of the package's plan: a load applies it rather than planning it again
    layout = cpu_layout(graph, kernels) if device == "cpu" else None
    backend = make_backend(graph, device, kernels, run_graph=cpu_graph(graph, kernels, layout) if layout else None,
                           precision=precision, fp32_layers=tuple(fp32_layers), fp16_arithmetic=fp16_arithmetic)
    fp = backend_fingerprint(backend, device)
    entries = backend.candidates()
    # the control-flow bodies' kernels first: measured once here, so that the profile times a body's build as a load
    # of this package does it (with the recorded picks), not with their measurement
    choices = _body_choices(backend, device)
    prof = None
    pred = device_predictor(device, fp) if profile in ("auto", False) else None
    if profile == "auto" and pred is None:
        profile = True
    if profile is True:
        from .runtime.profiler import measure_rates

        rates = measure_rates(src)
        prof = backend_profile(backend, device, entries, graph.constants, rates, fp)
    plan = make_plan(backend, entries, prof, opt, loaders, predictor=pred, constants=graph.constants)
    sha = file_sha256(src)
    _write_package(out, template, graph, plan, prof, fp, entries, sha, str(Path(src).resolve()), batch, device,
                   kernels, costs="profiled" if prof is not None else ("predicted" if pred is not None else "roofline"),
                   precision=backend_precision(backend, device, precision, graph, prof, tuple(fp32_layers)),
                   layout=layout, memory=memory_record(backend.plan, backend.graph) if device == "cpu" else None,
                   body_choices=choices)
    close = getattr(backend, "close", None)
    if close is not None:
        close()
    return out


def _body_choices(backend: Any, device: str) -> list[list[Any]]:
    """The CPU's kernel picks for the control-flow bodies of ``backend``'s graph (``runtime.cpu.body_choices``)."""
    if device != "cpu" or not any(n.bodies for n in backend.graph.nodes):
        return []
    from .runtime.cpu import body_choices

    return body_choices(backend.graph)


def make_backend(graph: Graph, device: str, kernels: dict[str, str] | None = None,
                 run_graph: Graph | None = None, **options: Any) -> Any:
    """The cold backend of ``device`` for ``graph``, with nothing prepared yet. ``run_graph``: the CPU's run
    graph where the caller has it (an opened package's, from its stored layout plan), with ``memory``, the
    activations' plan stored with it. Other options are the Vulkan backend's; the CPU computes in fp32 whatever
    ``precision`` says (fp16 is its package's storage)."""
    if device == "cpu":
        from .runtime.cpu import CpuExecutor

        return CpuExecutor(run_graph if run_graph is not None else cpu_graph(graph, kernels), kernels=kernels,
                           lazy=True, memory=options.get("memory") if run_graph is not None else None)
    try:
        from .vulkan.cold import VulkanColdBackend
    except ImportError as e:
        raise BackendError(f"the Vulkan backend is not available: {e}") from e
    return VulkanColdBackend(graph, kernels=kernels, **options)


def cpu_layout(graph: Graph, kernels: dict[str, str] | None = None) -> LayoutPlan | None:
    """The layout plan the CPU backend runs ``graph`` with (planner/layout.py: runs of convs on channel-blocked
    tensors where that is faster); None where ``INFERD_CPU_LAYOUT=nchw`` keeps every tensor NCHW (an ablation:
    what blocking gains; a package compiled the other way is then stale)."""
    if os.environ.get("INFERD_CPU_LAYOUT", "auto").strip().lower() == "nchw":
        return None
    return plan_layout(graph, kernels)


def cpu_graph(graph: Graph, kernels: dict[str, str] | None = None, layout: LayoutPlan | None = None) -> Graph:
    """The graph the CPU backend runs: ``graph`` with its layout plan applied (``layout``: a plan made before,
    a package's; else planned here), the Transposes around its MatMuls of two activations absorbed into them and
    its F.normalize patterns fused (both planned from the graph alone, so a package need not record them)."""
    if os.environ.get("INFERD_CPU_LAYOUT", "auto").strip().lower() != "nchw":
        plan = layout if layout is not None else cpu_layout(graph, kernels)
        if plan is not None:
            graph = apply_layout(graph, plan)
    return fuse_l2_normalize(absorb_transposes(fuse_scale_gain(graph, kernels), kernels), kernels)


def backend_precision(backend: Any, device: str, precision: Any, graph: Graph, prof: Profile | None,
                      fp32_layers: tuple[str, ...] = ()) -> PrecisionPlan:
    """The precision plan a package records: the Vulkan backend's own; on the CPU, fp16 raw weights for the
    layers where reading half the bytes and widening them beats reading fp32 (``cpu_fp16_wins``)."""
    plan = getattr(backend, "precision", None)
    if isinstance(plan, PrecisionPlan):
        return plan
    if isinstance(precision, PrecisionPlan):
        return precision
    from .planner.precision import cpu_precision

    rates = prof.rates if prof is not None else DeviceRates()
    return cpu_precision(str(precision), graph_facts(graph), rates, fp32_layers)


def graph_facts(graph: Graph) -> list[LayerFacts]:
    """Per node with float constant inputs: their bytes and largest magnitude (reads every weight)."""
    out = []
    for n in graph.nodes:
        arrs = [np.asarray(graph.constants[i]) for i in n.inputs if i and i in graph.constants]
        arrs = [a for a in arrs if a.dtype.kind == "f" and a.size]
        if arrs:
            out.append(LayerFacts(n.name, sum(a.nbytes for a in arrs), max(float(np.max(np.abs(a))) for a in arrs)))
    return out


def fp16_constants(graph: Graph, plan: PrecisionPlan, device: str = "cpu") -> set[str]:
    """The raw float32 constants an fp16 package stores in fp16 (widened when read): those read only by fp16
    layers (on Vulkan only by ops whose kernels read fp16 weights: their transform rounds them anyway)."""
    if plan.precision != "fp16" or graph is None:
        return set()
    keep = {n for n, _ in plan.fp32_layers}
    users: dict[str, set[str]] = {}
    ops: dict[str, set[str]] = {}
    for n in graph.nodes:
        for i in n.inputs:
            if i and i in graph.constants:
                users.setdefault(i, set()).add(n.name)
                ops.setdefault(i, set()).add(n.op)
    return {c for c, us in users.items() if not us & keep and np.dtype(graph.infos[c].dtype) == np.float32
            and (device == "cpu" or ops[c] <= set(VULKAN_HALF_OPS))}


def backend_fingerprint(backend: Any, device: str) -> dict[str, str]:
    fp = getattr(backend, "fingerprint", None)
    return dict(fp()) if callable(fp) else fingerprint(device)


def backend_profile(backend: Any, device: str, entries: list[Any], constants: Any, rates: Any,
                    fp: dict[str, str], stop: Callable[[], bool] | None = None,
                    between_requests: bool = False) -> Profile:
    prof = getattr(backend, "profile", None)
    if callable(prof):
        return prof(entries, rates)
    from .runtime.profiler import profile_layers

    return profile_layers(entries, constants, rates, fp, backend=device, stop=stop, between_requests=between_requests)


def device_predictor(device: str, fp: dict[str, str]) -> Any:
    """This device's trained latency predictor (None: none, or damaged or stale, which the log reports)."""
    from .predictor import load_for

    return load_for(device, fp)


def make_plan(backend: Any, entries: list[Any], prof: Profile | None, options: PlanOptions,
              loaders: int | None = None, stored: Callable[[str, str], bool] | None = None,
              predictor: Any = None, constants: Any = None) -> ColdPlan:
    """The cold plan from measured costs where there are some, the latency predictor's elsewhere (when
    ``predictor`` is given), the roofline where neither knows. Pure but for reading ``backend``'s facts."""
    from .runtime.scheduler import default_loaders

    gpu = bool(getattr(backend, "gpu", False))
    fallback: Any
    if predictor is not None:
        from . import native
        from .predictor.cost import PredictedCost

        fallback = PredictedCost(predictor, threads=1 if gpu else native.num_threads(), constants=constants,
                                 rates=prof.rates if prof is not None else None)
    elif prof is not None:
        fallback = calibrated_roofline(prof, entries, gpu)
    else:
        fallback = RooflineCost(DeviceRates(), gpu=gpu)
    cost = ProfiledCost(prof, fallback) if prof is not None else fallback
    n = (min(default_loaders(), GPU_LOADERS) if gpu else default_loaders()) if loaders is None else int(loaders)
    # on the CPU the executor thread is one of the preparing threads (it prepares when it would idle)
    n = max(0, n - 1) if not gpu else max(1, n)
    filled = bool(getattr(backend, "pipeline_cache_filled", lambda: True)()) if gpu else True
    layers = cold_layers(entries, cost, gpu=gpu, pipeline_cache_filled=filled, cache=options.cache, stored=stored)
    return plan_cold(layers, n, backend.name, options, gpu=gpu, host_cores=bool(getattr(backend, "host_cores", False)))


def _write_package(out: Path, template: Graph, graph: Graph, plan: ColdPlan, prof: Profile | None,
                   fp: dict[str, str], entries: list[Any], sha: str, src: str, batch: int, device: str,
                   kernels: dict[str, str] | None, costs: str = "profiled",
                   precision: PrecisionPlan = FP32, layout: LayoutPlan | None = None,
                   memory: dict[str, Any] | None = None, body_choices: list[list[Any]] | None = None) -> None:
    """``template``: what plan.bin records (a dynamic model's shape computations stay nodes); ``graph``: the
    template at the plan's shape, whose layers the plan and the transformed weights are made for; ``layout``:
    the CPU's layout plan of ``graph`` (None: NCHW throughout, or not the CPU); ``memory``: the CPU's
    activation plan of its run graph (``planner.memory.memory_record``)."""
    tconsts = template.constants
    by_name = {layer.name: (layer, ks) for layer, ks, _d in entries}
    unread = transformed_only(plan, by_name)  # by a cold load: plan.bin need not carry them
    inline = {n: a for n, a in tconsts.items()
              if a.nbytes <= INLINE_MAX_ANY or (a.nbytes <= INLINE_MAX and n not in unread)}
    written: set[str] = set()
    # fp16: the raw constants of fp16 layers stored in fp16 (widened to fp32 when read: LazyConstants)
    half = fp16_constants(graph, precision, device)

    def transformed_params(layer: Layer, kname: str) -> dict[str, np.ndarray]:
        k = next((k for k in by_name[layer.name][1] if k.name == kname), None) or choose_kernel(layer, device, kname)
        raw = raw_params(layer, graph.constants)
        return k.transform(layer, raw)

    with StoreWriter(out / "weights.store", sha, __version__, fp) as w:
        def put_raw(layer: Layer) -> None:
            for i in layer.const_inputs:
                n = layer.node.inputs[i]
                if n in tconsts and n not in inline and n not in written:  # others are folded per shape
                    w.add("", n, tconsts[n].astype(np.float16) if n in half else tconsts[n])
                    written.add(n)

        def put_transformed(layer: Layer, kname: str) -> None:
            tk = transformed_key(device, kname)
            params = transformed_params(layer, kname)
            # the CPU computes in fp32: an fp16 layer's transformed weights are stored fp16, widened when read
            narrow = device == "cpu" and bool(precision.layer_mode(layer.name))
            for key, arr in params.items():
                if isinstance(arr, np.ndarray):
                    if narrow and arr.dtype == np.float32:
                        arr = arr.astype(np.float16)
                    w.add(layer.name, key, arr, kernel=tk, variant="transformed")

        # 1. what the cold run reads, in the order it needs it
        for lp in plan.read_order():
            layer = by_name[lp.name][0]
            if lp.source == "transformed":
                put_transformed(layer, lp.kernel)
            elif lp.source == "raw":
                put_raw(layer)
        # 2. every other raw constant (other plans, forced kernels), 3. the warm switch's weights
        for n, a in tconsts.items():
            if n not in inline and n not in written:
                w.add("", n, a.astype(np.float16) if n in half else a)
                written.add(n)
        for lp in plan.layers:
            if lp.warm_kernel and by_name[lp.name][0].const_inputs:
                layer = by_name[lp.name][0]
                k = choose_kernel(layer, device, lp.warm_kernel)
                second = lp.source == "transformed" and lp.warm_kernel != lp.kernel
                big = second and k.transformed_nbytes(layer) > WARM_COPY_MAX_BYTES
                if kernel_transforms(k) and k.storable and not big:
                    put_transformed(layer, lp.warm_kernel)
    with WeightsStore(out / "weights.store") as store:  # what a load of it reads, found as the load finds it
        big = {e.tensor: e for e in store.find("", kernel="", variant="raw")}
        ws = WeightSource(LazyConstants(inline, store, big), store, device)
        stream = stream_record(ws.planned_entries([layer for layer, _ks, _d in entries], plan))
    write_plan(out / "plan.bin", {
        # what the cold plan reads, in its order: an open starts reading it before parsing the graph
        "stream": stream,
        "engine_version": __version__, "model_sha256": sha, "source": src, "batch": batch, "device": device,
        "name": template.name, "opset": template.opset, "kernels": dict(kernels or {}),
        "inputs": [_info(t) for t in template.inputs], "outputs": [_info(t) for t in template.outputs],
        "dims": {k: list(v) for k, v in template.dims.items()},
        "infos": [_info(t) for t in template.infos.values()],
        # tensors shaped at run time (data-dependent ops and what reads them): a static template is not shaped anew
        "runtime_shaped": sorted(template.runtime_shaped),
        "nodes": node_records(template.nodes),
        "inline": inline,
        "fingerprint": fp,
        "plan": plan.to_dict(),
        "profile": prof.to_dict() if prof is not None else None,
        # where the plan's costs came from: "profiled", or "predicted"/"roofline" (profiled later, in idle time)
        "costs": costs,
        "precision": precision.to_dict(),
        "fp16_raw": sorted(n for n in half if n in tconsts and n not in inline),
        # planning the layout took 5-10 ms of a small model's 20-50 ms cold load when every open did it
        "layout": None if layout is None else {"blocked": list(layout.blocked), "kinds": list(layout.kinds)},
        # and planning the activations' arena 0.6-5 ms more (squeezenet1_1 to vit_tiny, 2-core VM)
        "memory": memory,
        # and shaping a dynamic template anew 2 ms more (mobilenetv2 at N=1)
        "at_shape": _shaped_record(template, graph),
        # the kernels measured best for the control-flow bodies: a cold load in a fresh process measured them
        "body_choices": body_choices or [],
    })


def _shaped_record(template: Graph, graph: Graph) -> dict[str, Any] | None:
    """``graph`` (``template`` shaped at the plan's shape) as plan.bin records it, so that an open need not run
    shape inference again, control-flow bodies included (a template read back has them unshaped: vad's open spent
    4 of its 5 ms shaping its two If bodies); None for a static template without bodies (it is its own shaped
    graph), for tensors shaped at run time, and where shaping made a constant too large to inline."""
    has_bodies = any(n.bodies for n in graph.nodes)
    if (graph is template and not has_bodies) or graph.runtime_shaped:
        return None
    tconsts = template.constants
    folded: dict[str, np.ndarray] = {}
    for n in graph.nodes:
        for i in n.inputs:
            if i and i not in tconsts and i in graph.constants:
                a = np.asarray(graph.constants[i])
                if a.nbytes > INLINE_MAX:
                    return None
                folded[i] = a
    bodies = _bodies_record(graph.nodes, {id(v): k for k, v in tconsts.items()}) if has_bodies else {}
    if bodies is None:
        return None
    return {"inputs": [_info(t) for t in graph.inputs], "outputs": [_info(t) for t in graph.outputs],
            "infos": [_info(t) for t in graph.infos.values()],
            "nodes": node_records(graph.nodes), "folded": folded,
            "bodies": bodies}


def _bodies_record(nodes: list[Node], ids: dict[int, str]) -> dict[str, dict[str, Any]] | None:
    """The shaped bodies of ``nodes`` (node name -> body key -> record), None where one cannot be recorded. A body's
    constant that is one of the template's (by identity: shaping passes the enclosing graph's arrays in as they are)
    is recorded by that name and read from the store when first used; others are inlined up to ``INLINE_MAX``."""
    out: dict[str, dict[str, Any]] = {}
    for n in nodes:
        if not n.bodies:
            continue
        recs: dict[str, Any] = {}
        for key, b in n.bodies.items():
            if b.runtime_shaped:
                return None
            consts: dict[str, np.ndarray] = {}
            refs: dict[str, str] = {}
            for k, v in b.constants.items():
                src = ids.get(id(v))
                if src is not None:
                    refs[k] = src
                elif np.asarray(v).nbytes <= INLINE_MAX:
                    consts[k] = np.asarray(v)
                else:
                    return None
            nested = _bodies_record(b.nodes, ids)
            if nested is None:
                return None
            recs[key] = {"name": b.name, "opset": b.opset, "inputs": [_info(t) for t in b.inputs],
                         "outputs": [_info(t) for t in b.outputs], "infos": [_info(t) for t in b.infos.values()],
                         "nodes": node_records(b.nodes),
                         "consts": consts, "refs": refs, "bodies": nested}
        out[n.name] = recs
    return out


def _with_bodies(nodes: list[Node], recs: dict[str, Any], base: Any) -> None:
    """Give ``nodes`` their recorded shaped bodies (``_bodies_record``), their template constants read from ``base``
    when first used. ``WeightsStoreError`` where a record does not hold together."""
    by_name = {n.name: n for n in nodes}
    for name, bodies in recs.items():
        node = by_name.get(name)
        if node is None:
            raise WeightsStoreError(f"a recorded body belongs to node {name!r}, which the graph lacks")
        shaped = {}
        for key, r in bodies.items():
            bnodes = nodes_of(r["nodes"])
            infos = {x[0]: _uninfo(x) for x in r["infos"]}
            refs = dict(r["refs"])
            lost = [src for src in refs.values() if src not in base]
            missing = [i for x in bnodes for i in x.inputs if i and i not in infos]
            if lost or missing:
                raise WeightsStoreError(f"body {key!r} of node {name!r} reads unknown tensors {(lost + missing)[:5]}")
            consts = Overlay(dict(r["consts"]), Renamed(base, refs)) if refs else dict(r["consts"])
            g = Graph(r["name"], bnodes, [_uninfo(x) for x in r["inputs"]], [_uninfo(x) for x in r["outputs"]],
                      consts, infos, int(r["opset"]))
            _with_bodies(bnodes, r.get("bodies") or {}, base)  # (references name the template's constants)
            shaped[key] = g
        node.bodies = shaped


def _shaped_graph(d: dict[str, Any], template: Graph) -> Graph:
    """The template at its own (the plan's) shape: from plan.bin's record where it has one for these input
    shapes, else shaped here."""
    rec = d.get("at_shape")
    if rec is None or [_uninfo(r) for r in rec["inputs"]] != list(template.inputs):
        return specialize(template)
    nodes = nodes_of(rec["nodes"])
    infos = {r[0]: _uninfo(r) for r in rec["infos"]}
    missing = [i for n in nodes for i in n.inputs if i and i not in infos]
    if missing:
        raise WeightsStoreError(f"the recorded shaped graph references unknown tensors {missing[:5]}")
    consts = Overlay(dict(rec["folded"]), template.constants)
    _with_bodies(nodes, rec.get("bodies") or {}, consts)
    return Graph(template.name, nodes, [infos[t.name] for t in template.inputs],
                 [_uninfo(r) for r in rec["outputs"]], consts, infos, template.opset, dict(template.dims))


def stream_record(entries: Any) -> list[list[str]]:
    """plan.bin's ``stream``: the keys of the store entries a cold plan reads (``WeightSource.planned_entries``),
    as a stream reads them."""
    return [list(k) for k in StoreStream.order(entries)]


#: plan.bin's keys written first, in this order: an open parses them (and starts reading the store) before the rest
_PLAN_FIRST = ("stream", "plan")


def write_plan(path: Path, d: dict[str, Any]) -> None:
    """``plan.bin``: magic, version and sha256 of the msgpack body, written atomically. The body is one map whose
    first keys are ``_PLAN_FIRST`` (where present): ``stream``, the store entries the cold plan reads in its order,
    then ``plan``: a cold open starts reading with these two parsed, before the graph (``_read_plan``)."""
    d = {**{k: d[k] for k in _PLAN_FIRST if k in d}, **{k: v for k, v in d.items() if k not in _PLAN_FIRST}}
    body = msgpack.packb(d, default=_default, use_bin_type=True)
    atomic_write(path, framed(PLAN_MAGIC, PLAN_VERSION, body))


def _plan_head(path: Path, data: bytes) -> bytes:
    """The checksum plan.bin's header records, from its first bytes ``data``; ``WeightsStoreError`` when the header
    is missing or not this engine's plan format."""
    try:
        return frame_checksum(data, PLAN_MAGIC, PLAN_VERSION, "plan")
    except FrameError as e:
        raise WeightsStoreError(f"{path}: {e}") from None


def check_plan_head(path: Path) -> None:
    """plan.bin's header only (magic and format version): whether a package is worth opening. The open checks
    the rest (checksum, parse) and a load rebuilds what fails there."""
    try:
        with open(path, "rb") as f:
            head = f.read(_PLAN_HEAD.size)
    except OSError as e:
        raise WeightsStoreError(f"{path}: unreadable plan: {e}") from e
    _plan_head(path, head)


def read_plan(path: Path) -> dict[str, Any]:
    return _read_plan(path)[0]


#: plan.bin files an open parsed (checksum verified), by path, while the file is the same one (``file_version``):
#: a daemon that dropped a model (its memory budget, an unload, an idle timeout) and loads it again skips the
#: read, the checksum and the parsing, and its stream of the stored plan's reads starts at once (squeezenet1_1 on
#: the CPU, page cache dropped, in-process reloads: ``load()`` 4.9 -> 3.7 ms, the first answer 14.5 -> 12.8 ms).
#: What it holds is shared by every load of the package: its arrays are made read-only, and a plan with control-flow
#: bodies (``Subgraph``, which a load may lower in place) is not kept. 0 turns it off. Bounded in plans and in
#: plan.bin bytes (a parse holds a few times its file's bytes: a board's memory, outside every model's budget).
PARSED_PLANS_MAX = 32
PARSED_PLANS_MAX_BYTES = 16 << 20
#: path of plan.bin -> (its dict, ColdPlan, Profile | None)
_parsed = FileMemo()


def _frozen(found: Sequence[Any]) -> bool:
    """Make the arrays a parse ``found`` read-only; False where it made a control-flow body (not to be shared).
    (From the parse's own list: a walk over the whole dict took 0.5-2.8 ms on the zoo's plans.)"""
    if any(isinstance(o, Subgraph) for o in found):
        return False
    for o in found:
        o.flags.writeable = False
    return True


def _open_plan(path: Path, early: "Callable[[ColdPlan, Any], None] | None"
               ) -> tuple[dict[str, Any], ColdPlan, ProfileRef | None]:
    """``_read_plan`` for an open, through ``_parsed``. Only the open's own reading goes through it:
    ``read_plan``'s callers (the refinement) change the dict they get."""
    if PARSED_PLANS_MAX <= 0:
        return _read_plan(path, early, lazy_profile=True)  # type: ignore[return-value]
    try:
        version = file_version(os.stat(path))
    except OSError:
        return _read_plan(path, early, lazy_profile=True)  # type: ignore[return-value]  # (it says what is wrong)
    key = str(path)
    got = _parsed.get(key, version)
    if got is not None:
        if early is not None:
            early(got[1], got[0].get("stream"))
        return got
    found: list[Any] = []
    got = _read_plan(path, early, found, lazy_profile=True)
    # (frozen only where kept: the arrays of a plan not kept stay the caller's to change)
    if _parsed.admits(version[2], PARSED_PLANS_MAX, PARSED_PLANS_MAX_BYTES) and _frozen(found):
        _parsed.put(key, version, got, version[2], PARSED_PLANS_MAX, PARSED_PLANS_MAX_BYTES)
    return got


def parsed_stats() -> dict[str, int]:
    """What ``_parsed`` holds: plans and their plan.bin bytes (a daemon's status reports it beside its memory)."""
    n, nbytes = _parsed.stats()
    return {"plans": n, "plan_file_bytes": nbytes}


def forget_parsed(pkg: Path) -> None:
    """Drop the parse ``_parsed`` keeps of ``pkg``'s plan.bin (a package that is removed)."""
    _parsed.drop(str(pkg / "plan.bin"))


def parsed_cached(pkg: Path) -> bool:
    """Whether ``pkg``'s plan.bin, as it is on disk now, is parsed in ``_parsed`` (an open then reads none of its
    metadata: plan.bin here, the store's index in ``store.index_cached``)."""
    try:
        version = file_version(os.stat(pkg / "plan.bin"))
    except OSError:
        return False
    return _parsed.holds(str(pkg / "plan.bin"), version)


class ProfileRef:
    """plan.bin's profile, parsed at its first ``get`` from the bytes the open kept: a cold load that follows the
    stored plan wants it only for the refinement after its answer (its parse and ``Profile.from_dict`` were 5-8% of
    an open's main-thread time: shufflenetv2_x1_0 and vit_tiny, 2-core VM). A parse that fails is a damaged
    package seen late: ``get`` raises ``WeightsStoreError`` as the open would have. Shared by every open of a parse
    ``_parsed`` keeps (parsed once, under its lock)."""

    __slots__ = ("_raw", "_path", "_value", "_lock")

    def __init__(self, raw: bytes, path: Path) -> None:
        self._raw = raw
        self._path = path
        self._value: Profile | None = None
        self._lock = threading.Lock()

    def get(self) -> Profile:
        v = self._value
        if v is not None:
            return v
        with self._lock:  # (one parse: another thread's may be under way, the bytes dropped after it)
            if self._value is None:
                try:
                    self._value = Profile.from_dict(msgpack.unpackb(self._raw, raw=False, ext_hook=_ext_hook,
                                                                    strict_map_key=False))
                except Exception as e:
                    raise WeightsStoreError(f"{self._path}: unreadable plan: profile: {type(e).__name__}: {e}") from e
                self._raw = b""
            return self._value


def _read_plan(path: Path, early: "Callable[[ColdPlan, Any], None] | None" = None, found: list[Any] | None = None,
               lazy_profile: bool = False) -> tuple[dict[str, Any], ColdPlan, "Profile | ProfileRef | None"]:
    """plan.bin's dict with its cold plan and profile parsed (a plan that does not parse is a damaged one).
    ``early(plan, stream)``: called as soon as the cold plan is parsed, with the ``stream`` entry where it came
    before (None otherwise), while the rest of the map is still to parse (checksum verified first). ``found``:
    the arrays and control-flow bodies parsed are appended to it. ``lazy_profile``: the profile comes back as a
    ``ProfileRef`` over its bytes, and the dict holds no ``profile`` key (an open's)."""
    data = path.read_bytes() if path.is_file() else b""
    sha = _plan_head(path, data)
    body = data[_PLAN_HEAD.size:]
    if hashlib.sha256(body).digest() != sha:
        raise WeightsStoreError(f"{path}: plan checksum mismatch (corrupted file)")
    d: dict[str, Any] = {}
    plan: ColdPlan | None = None
    try:
        u = msgpack.Unpacker(raw=False, ext_hook=_hook(found), strict_map_key=False, max_buffer_size=max(1, len(body)))
        u.feed(body)
        left = u.read_map_header()
        while left and plan is None:  # up to the plan (the first keys: ``_PLAN_FIRST``)
            k = u.unpack()
            d[k] = u.unpack()
            left -= 1
            if k == "plan":
                plan = ColdPlan.from_dict(d[k])
    except Exception as e:
        raise WeightsStoreError(f"{path}: unreadable plan: {type(e).__name__}: {e}") from e
    if plan is not None and early is not None:
        early(plan, d.get("stream"))
    prof: Profile | ProfileRef | None = None
    try:
        for _ in range(left):
            k = u.unpack()
            if lazy_profile and k == "profile":
                at = u.tell()
                u.skip()
                raw = body[at:u.tell()]
                if raw != b"\xc0":  # (msgpack's nil: a package compiled without measuring)
                    prof = ProfileRef(raw, path)
                continue
            d[k] = u.unpack()
        if plan is None:
            plan = ColdPlan.from_dict(d["plan"])
        if not lazy_profile and d.get("profile") is not None:
            prof = Profile.from_dict(d["profile"])
    except WeightsStoreError:
        raise
    except Exception as e:
        raise WeightsStoreError(f"{path}: unreadable plan: {type(e).__name__}: {e}") from e
    return d, plan, prof


def fingerprint_diff(made: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The keys two device fingerprints disagree on, sorted."""
    return sorted(k for k in set(made) | set(current) if made.get(k) != current.get(k))


def check_fingerprint(pkg: Path, plan: dict[str, Any], current: dict[str, str]) -> None:
    """``WeightsStoreError`` when the package was made for another device or engine version."""
    made = plan.get("fingerprint") or {}
    diff = fingerprint_diff(made, current)
    if plan.get("engine_version") != __version__:
        diff = ["engine"] + [d for d in diff if d != "engine"]
    if diff:
        what = ", ".join(f"{k}: {made.get(k)!r}, here {current.get(k)!r}" for k in diff[:4])
        raise StalePackageError(f"{pkg}: made for another device or engine ({what})")


@dataclass
class OpenPackage:
    """A package opened for a cold load: the graph (large constants still on disk), its plan and
    profile, and the open weights store (closed by the loader when the load is done)."""

    path: Path
    graph: Graph  # at the plan's shape
    template: Graph  # what a dynamic model's other shapes are specialised from (``graph`` for a static one)
    plan: ColdPlan
    profile_ref: ProfileRef | None  # ``profile``, parsed when first asked for
    store: WeightsStore
    meta: dict[str, Any]
    run_graph: Graph  # what the backend runs: on the CPU ``graph`` with the package's layout plan applied
    memory: MemoryPlan | None = None  # the CPU's activation plan of ``run_graph`` (None: planned at load)
    #: the reads of the stored plan, under way since plan.bin's first keys were parsed (``open_package``'s
    #: ``stream``); the load takes it on (``WeightSource.start_stream_early``) or releases it
    stream: "StoreStream | None" = None

    @property
    def profile(self) -> Profile | None:
        """The package's measured profile (None: compiled without measuring); ``WeightsStoreError`` if it does not
        parse."""
        return None if self.profile_ref is None else self.profile_ref.get()


def open_package(pkg: Path, device: str = "cpu", batch: int = 1, kernels: dict[str, str] | None = None,
                 current: dict[str, str] | None = None, precision: str | None = None,
                 cold: bool = False, stream: "Callable[[ColdPlan], Any] | None" = None) -> OpenPackage:
    """Validate ``pkg`` for this device and open it; ``WeightsStoreError`` (or its subclass
    ``StalePackageError``) when it is damaged, for another model, device, engine, batch or kernels;
    ``PackageOptionsError`` when ``precision`` is given and the package was compiled for another.
    ``cold``: opened for a cold load, whose first weights are read ahead from here (``store.HeadRead``).
    ``stream(plan)``: the I/O workers to stream the stored plan's reads on, from the moment it is parsed (None:
    the load will not follow that plan): the open's own parsing (2-5 ms of Python on the 2-core VM) then runs
    beside the disk (``OpenPackage.stream``)."""
    # the cold window (no GC pause, a short GIL switch interval) runs from here to the first answer:
    # the store carries the hold, the cold load releases it (or the store's close does)
    window = hold_window()
    try:
        return _open_package(pkg, device, batch, kernels, current, precision, window, cold, stream)
    except BaseException:
        window.release()
        raise


#: the tail of a weights store that holds its index (the index follows the blobs)
_INDEX_TAIL = 256 << 10


def binds_files(device: str | None) -> tuple[str, ...]:
    """The recorded-binds file a load on ``device`` reads in a package: the CPU executor's (``runtime.bindrec``) or
    the Vulkan backend's (``vulkan.binds``); None: both."""
    from .runtime.bindrec import FILE as BINDS
    from .vulkan.binds import FILE as VK_BINDS

    return (BINDS,) if device == "cpu" else (VK_BINDS,) if device == "vulkan" else (BINDS, VK_BINDS)


def prefetch_metadata(pkg: Path, parsed: bool = False, device: str | None = None) -> None:
    """Ask the kernel for every small read an open makes, at once: ``plan.bin``, the store's header and
    its index (at the file's end), the recorded binds of ``device``'s backend (the CPU's ``runtime.bindrec``,
    Vulkan's ``vulkan.binds``; None: both), instead of disk round trips one after another. ``parsed``: the plan
    and the index are parsed in this process already (a reopen): only the binds, which every load reads again.
    Best effort."""
    # only the file the load's backend reads: asking for the other backend's, which a package seldom holds, is a
    # lookup of a missing name in a directory dropped from the cache (0.06-0.6 ms alone on the 2-core VM; within
    # the noise of a whole CPU load, 14 alternating pairs)
    small: tuple[tuple[str, int | None], ...] = tuple((n, None) for n in binds_files(device))
    if not parsed:
        small = (("plan.bin", None), ("weights.store", _INDEX_TAIL), *small)
    for name, tail in small:
        try:
            fd = os.open(pkg / name, os.O_RDONLY)
        except OSError:
            continue  # the open proper reports it
        try:
            if tail is None:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            else:
                size = os.fstat(fd).st_size
                os.posix_fadvise(fd, 0, 4096, os.POSIX_FADV_WILLNEED)
                os.posix_fadvise(fd, max(0, size - tail), tail, os.POSIX_FADV_WILLNEED)
        except (OSError, AttributeError):
            pass
        finally:
            os.close(fd)


def _open_package(pkg: Path, device: str, batch: int, kernels: dict[str, str] | None,
                  current: dict[str, str] | None, precision: str | None, window: Any,
                  cold: bool = False, stream_io: "Callable[[ColdPlan], Any] | None" = None) -> OpenPackage:
    head = None
    if cold:
        from .runtime.scheduler import worker

        # on the loader pool's first io worker: the stream's readers run there later, after it
        head = HeadRead(pkg / "weights.store", worker("io").submit)
    # a reopen (a model the budget or an unload dropped) reads its binds from the disk all the same: 1.2-4.5 ms of a
    # Vulkan mobilenetv2's load() on the 2-core VM when that read came when the backend asked for it
    prefetch_metadata(pkg, parsed=parsed_cached(pkg) and index_cached(pkg / "weights.store"), device=device)
    early = _EarlyStream(pkg, head, window, stream_io)
    try:
        return _open_parsed(pkg, device, batch, kernels, current, precision, window, head, early)
    except BaseException:
        early.release()
        raise


class _EarlyStream:
    """An open's stream of its stored plan's reads, started (``__call__``, from ``_read_plan``) as soon as plan.bin's
    ``stream`` and ``plan`` keys are parsed, with the store it opened for it."""

    def __init__(self, pkg: Path, head: HeadRead | None, window: Any,
                 stream_io: "Callable[[ColdPlan], Any] | None") -> None:
        self.pkg, self.head, self.window, self.stream_io = pkg, head, window, stream_io
        self.store: WeightsStore | None = None
        self.stream: StoreStream | None = None

    def __call__(self, plan: ColdPlan, keys: Any) -> None:
        from .runtime.pagecache import resident_fraction

        io = self.stream_io(plan) if self.stream_io is not None and keys else None
        if io is None:
            return
        # (the head read's worker has counted it by now, as a rule: counting here costs 0.2-0.3 ms)
        path = self.pkg / "weights.store"
        share = self.head.resident if self.head is not None else None
        if share is None:
            share = resident_fraction(path)
        if share >= 0.5:
            # a store in the page cache has no disk latency to hide, and reads beside the open's parsing slow it
            # (mobilenetv2's open 4-5 -> 8-9 ms with its reads under way, 2-core VM): the load starts them after
            # the open (a cached mobilenetv2, load + first run: 14.5-16.6 ms so, 15.8-17.4 ms from the open)
            return
        # direct, as the store decides from the same share (which it would count again where the head has not)
        self.store = WeightsStore(path, direct=True, head=self.head)
        self.store.window = self.window
        try:
            entries = [self.store.entries[tuple(k)] for k in keys]
        except (KeyError, TypeError) as e:  # a list of another store: the load finds its entries itself
            log.debug("%s: plan.bin's stream lists entries its store lacks (%s)", self.pkg, e)
            return
        self.stream = StoreStream(self.store, entries, io=io, origin="open")

    def release(self) -> None:
        if self.stream is not None:
            self.stream.release()
        if self.store is not None:
            self.store.close()


def _open_parsed(pkg: Path, device: str, batch: int, kernels: dict[str, str] | None,
                 current: dict[str, str] | None, precision: str | None, window: Any, head: HeadRead | None,
                 early: _EarlyStream) -> OpenPackage:
    d, plan, prof = _open_plan(pkg / "plan.bin", early)
    made = PrecisionPlan.from_dict(d["precision"]).requested if d.get("precision") else "fp32"
    if precision is not None and precision != made:
        raise PackageOptionsError(f"{pkg}: package compiled for precision {made!r}, asked for {precision!r}; "
                                  f"recompile it with --precision {precision}")
    if int(d["batch"]) != batch:
        raise PackageOptionsError(f"{pkg}: package compiled for batch {d['batch']}, asked for batch {batch}; "
                                f"recompile with --batch {batch}")
    if d.get("device") != device:
        raise StalePackageError(f"{pkg}: package compiled for device {d.get('device')!r}, asked for {device!r}")
    if kernels and dict(kernels) != dict(d.get("kernels") or {}):
        raise PackageOptionsError(f"{pkg}: package planned with kernels {d.get('kernels')}, asked for {kernels}; "
                                  f"recompile it with those --kernel options")
    if current is not None:
        check_fingerprint(pkg, d, current)
    if device == "cpu" and current is not None and d.get("body_choices"):  # (a validated package only)
        from .runtime.cpu import seed_body_choices

        seed_body_choices(d["body_choices"])
    if early.store is None:  # (a failed open closes it with the early stream's: _open_package)
        early.store = WeightsStore(pkg / "weights.store", direct=None, head=head)
        early.store.window = window
    store, stream = early.store, early.stream
    if store.model_sha256 != d["model_sha256"]:
        raise WeightsStoreError(f"{pkg}: weights store belongs to model {store.model_sha256[:12]}, "
                                f"plan to {d['model_sha256'][:12]}")
    inline: dict[str, np.ndarray] = dict(d["inline"])
    big = {e.tensor: e for e in store.find("", kernel="", variant="raw")}
    nodes = nodes_of(d["nodes"])
    infos = {r[0]: _uninfo(r) for r in d["infos"]}
    consts = LazyConstants(inline, store, big, widen=set(d.get("fp16_raw") or ()))
    template = Graph(d["name"], nodes, [_uninfo(r) for r in d["inputs"]], [_uninfo(r) for r in d["outputs"]],
                     consts, infos, int(d["opset"]),  # type: ignore[arg-type]
                     {k: tuple(v) for k, v in (d.get("dims") or {}).items()})
    template.runtime_shaped = set(d.get("runtime_shaped") or ()) & set(infos)
    missing = {i for nd in nodes for i in nd.inputs if i} - infos.keys()
    if missing:
        raise WeightsStoreError(f"{pkg}: plan references unknown tensors {sorted(missing)[:5]}")
    try:
        graph = _shaped_graph(d, template)
    except InferdError as e:
        raise WeightsStoreError(f"{pkg}: the recorded graph does not take its own shape: {e}") from e
    # the plan's layers are the backend's: on the CPU, the graph with its layout plan applied
    run_graph = _stored_run_graph(pkg, graph, d, kernels) if device == "cpu" else graph
    memory = _stored_memory(pkg, run_graph, d) if device == "cpu" else None
    run_nodes = run_graph.nodes
    if len(plan.layers) != len(run_nodes) or any(lp.name != n.name for lp, n in zip(plan.layers, run_nodes)):
        if device == "cpu" and len(plan.layers) != len(graph.nodes) and len(run_nodes) == len(graph.nodes):
            raise StalePackageError(f"{pkg}: compiled with the CPU's blocked layout, which INFERD_CPU_LAYOUT "
                                    f"turns off here")
        raise WeightsStoreError(f"{pkg}: the cold plan does not match the graph's nodes")
    held = {(e.layer, e.kernel) for e in store.entries.values() if e.variant == "transformed"}
    for lp in plan.layers:
        if lp.source == "transformed" and (lp.name, transformed_key(device, lp.kernel)) not in held:
            raise WeightsStoreError(f"{pkg}: the plan reads transformed weights of {lp.name!r} "
                                    f"({lp.kernel}) that the store does not hold")
    # (every constant is in the plan or the store by construction: ``consts`` is made of the two)
    return OpenPackage(pkg, graph, template, plan, prof, store, d, run_graph, memory, stream)


def _stored_run_graph(pkg: Path, graph: Graph, d: dict[str, Any], kernels: dict[str, str] | None) -> Graph:
    """The CPU's run graph of an opened package: its stored layout plan applied (a package written before
    plans recorded it: planned here)."""
    rec = d.get("layout")
    if rec is None:
        return cpu_graph(graph, kernels or d.get("kernels"))
    try:
        layout = LayoutPlan(tuple(str(n) for n in rec["blocked"]), tuple(str(k) for k in rec["kinds"]))
        names = {n.name for n in graph.nodes}
        if len(layout.blocked) != len(layout.kinds) or not set(layout.blocked) <= names:
            raise ValueError("its nodes are not the graph's")
        return cpu_graph(graph, kernels, layout)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise WeightsStoreError(f"{pkg}: the stored layout plan does not fit the graph: {e}") from e


def _stored_memory(pkg: Path, run_graph: Graph, d: dict[str, Any]) -> MemoryPlan | None:
    """The CPU's activation plan an opened package stores for ``run_graph`` (None: a package written before
    plans recorded it, planned at load)."""
    rec = d.get("memory")
    if rec is None:
        return None
    try:
        return memory_from_record(rec, run_graph)
    except (KeyError, TypeError, ValueError) as e:
        raise WeightsStoreError(f"{pkg}: the stored memory plan does not fit the graph: {e}") from e


#: a package's plan is re-made from observed cold runs at most this often: one noisy run on a busy
#: board must not set off a chain of re-plans
MAX_REFINEMENTS = 2


def refine_package(pkg: Path, backend: Any, current: ColdPlan, profile: Profile | None,
                   observed: dict[tuple[str, str, str], float], stored: Callable[[str, str], bool],
                   min_gain: float = 0.10, reads: "Callable[[ColdPlan], Any] | None" = None) -> ColdPlan | None:
    """Fold what a cold run observed into ``pkg``'s profile and re-plan over the representations its
    store holds; rewrite ``plan.bin`` (atomically) when the new plan is predicted faster by more than
    ``min_gain`` under the refined costs, at most ``MAX_REFINEMENTS`` times per package. Returns the new
    plan, or None when the stored one stays. ``reads(plan)``: the store entries ``plan`` reads, in its order
    (plan.bin's ``stream``; without it the new plan.bin has none, and its loads find them after the open)."""
    if profile is None or not observed:
        return None
    d = read_plan(pkg / "plan.bin")
    if int(d.get("refinements", 0)) >= MAX_REFINEMENTS:
        return None
    merged = profile.merged(observed)
    entries = backend.candidates()
    new = make_plan(backend, entries, merged, current.options, current.loaders + (0 if backend.gpu else 1),
                    stored=stored)
    old = _repredict(current, entries, merged, backend)
    if new.predicted_s >= old * (1 - min_gain):
        return None
    list_plan_pipelines(backend, current, new)  # before the plan that runs them is written
    d["refinements"] = int(d.get("refinements", 0)) + 1
    d["plan"] = new.to_dict()
    d["profile"] = merged.to_dict()
    _set_stream(d, reads, new)
    write_plan(pkg / "plan.bin", d)
    log.info("%s: plan refined from an observed cold run: predicted %.1f -> %.1f ms", pkg, old * 1e3,
             new.predicted_s * 1e3)
    return new


def _set_stream(d: dict[str, Any], reads: "Callable[[ColdPlan], Any] | None", plan: ColdPlan) -> None:
    """plan.bin's ``stream`` for ``plan`` (none where ``reads`` cannot say: an open then starts no stream)."""
    d.pop("stream", None)
    if reads is not None:
        try:
            d["stream"] = stream_record(reads(plan))
        except Exception as e:  # only a speed-up of the next open
            log.debug("the entries a refined plan reads: %s", e)


def list_plan_pipelines(backend: Any, ran: ColdPlan, plan: ColdPlan) -> int:
    """List (and make) the pipelines of ``plan``'s cold kernels where they differ from those of ``ran``, the plan the
    backend's load ran, on a GPU backend: the package's next load runs them, in a daemon whose start made resident
    only what the device's list holds (the kernels ``ran`` used are listed already). Without this a restarted
    daemon's cold load created the pipelines of each layer a refinement had moved to a kernel only the profiler
    had timed. Returns the layers listed; a layer that fails is left to the next load, which creates what it
    lacks."""
    note = getattr(backend, "note_pipelines", None)
    if note is None:
        return 0
    before = {lp.name: lp.kernel for lp in ran.layers}
    done = 0
    for lp in plan.layers:
        if lp.kernel and lp.kernel != before.get(lp.name):
            try:
                note(lp.index, lp.kernel)
                done += 1
            except Exception as e:  # only a speed-up of the next load
                log.debug("listing the pipelines of %s (%s) failed: %s", lp.name, lp.kernel, e)
    return done


def profile_package(pkg: Path, device: str, current: ColdPlan, stored: Callable[[str, str], bool],
                    stop: Callable[[], bool] | None = None) -> ColdPlan | None:
    """Idle-time work for a package planned from predictions: profile its model on this device (a backend of its
    own, so the loaded model keeps serving), store the profile and re-plan from it over the representations the
    store holds. Returns the new plan (None when the package already has a profile or changed meanwhile).
    Raises ``runtime.profiler.IdleBusy`` when requests leave it no quiet moment or ``stop()`` turns true:
    nothing is stored then, and the caller may try again later."""
    d = read_plan(pkg / "plan.bin")
    if d.get("profile") is not None or d.get("costs") != "predicted":
        return None
    op = open_package(pkg, device=device, batch=int(d["batch"]), kernels=d.get("kernels") or None)
    op.store.release_window()  # seconds of idle-time profiling: no cold load is waiting on this
    try:
        from .runtime.profiler import measure_rates

        backend = make_backend(op.graph, device, d.get("kernels") or None,
                               run_graph=op.run_graph if device == "cpu" else None)
        try:
            fp = backend_fingerprint(backend, device)
            entries = backend.candidates()
            prof = backend_profile(backend, device, entries, op.graph.constants, measure_rates(), fp, stop,
                                   between_requests=True)
            new = make_plan(backend, entries, prof, current.options,
                            current.loaders + (0 if backend.gpu else 1), stored=stored,
                            predictor=device_predictor(device, fp), constants=op.graph.constants)
            list_plan_pipelines(backend, current, new)  # as refine_package does, before the plan is written
            ws = WeightSource(op.graph.constants, op.store, device)
            layers = backend.layers()
        finally:
            close = getattr(backend, "close", None)
            if close is not None:
                close()
    finally:
        op.store.close()
    d2 = read_plan(pkg / "plan.bin")
    if d2.get("model_sha256") != d.get("model_sha256") or d2.get("profile") is not None:
        return None
    d2["profile"] = prof.to_dict()
    d2["plan"] = new.to_dict()
    d2["costs"] = "profiled"
    _set_stream(d2, lambda p: ws.planned_entries(layers, p), new)  # (the store's index outlives its close)
    write_plan(pkg / "plan.bin", d2)
    log.info("%s: profiled in idle time; plan predicted %.1f ms -> %.1f ms from measured costs", pkg,
             current.predicted_s * 1e3, new.predicted_s * 1e3)
    return new


def _repredict(plan: ColdPlan, entries: list[Any], prof: Profile, backend: Any) -> float:
    """``plan``'s predicted cold latency under ``prof``'s costs (its own choices, same time model)."""
    from .planner.cold import simulate

    cost = ProfiledCost(prof, calibrated_roofline(prof, entries, bool(backend.gpu)))
    layers = cold_layers(entries, cost, gpu=bool(backend.gpu), cache=True)
    choice = []
    for lp, L in zip(plan.layers, layers):
        idx = [i for i, c in enumerate(L.candidates) if c.kernel == lp.kernel and c.source == lp.source]
        if not idx:
            return float("inf")
        choice.append(idx[0])
    return simulate(layers, choice, plan.loaders, exec_blocks=not backend.gpu,
                    exec_prepares=plan.options.executor_prepares and not backend.gpu,
                    assign=[lp.loader for lp in plan.layers]).makespan


def load_package(pkg: Path, device: str = "cpu", batch: int = 1) -> Graph:
    """The package's graph with every constant in memory (tools that want the whole graph at once)."""
    op = open_package(pkg, device=device, batch=batch)
    op.store.release_window()  # a tool reading the whole graph, not a cold load
    try:
        consts = {n: np.asarray(op.graph.constants[n]) for n in op.graph.constants}
    finally:
        op.store.close()
    g = op.graph
    return Graph(g.name, g.nodes, g.inputs, g.outputs, consts, g.infos, g.opset)


def package_key(src: Path, batch: int, device: str, extra: str = "") -> str:
    """Cache key of a compiled package: the source file's identity (path, size, mtime) and the options.

    Stat-based like ccache's direct mode, so a cold load does not hash the whole model; the plan
    still records the model's sha256, and an edited file gets a new mtime, hence a new package.
    """
    st = src.stat()
    ident = f"{src.resolve()}|{st.st_size}|{st.st_mtime_ns}|{batch}|{device}|{__version__}|{PLAN_VERSION}|{extra}"
    return hashlib.sha256(ident.encode()).hexdigest()[:32]


def cached_package_path(src: str | os.PathLike, cache_root: str | os.PathLike, batch: int = 1, device: str = "cpu",
                        kernels: dict[str, str] | None = None, shapes: dict[str, tuple[int, ...]] | None = None,
                        precision: str = "fp32", fp32_layers: tuple[str, ...] | list[str] = (),
                        fp16_arithmetic: bool = False) -> Path:
    """Where ``cached_package`` keeps the package of ``src`` compiled with these options (whether or not it is
    there): the source's content and the options in the directory's name."""
    src = Path(src)
    extra = json.dumps([kernels or {}, {k: list(v) for k, v in (shapes or {}).items()}], sort_keys=True)
    if precision != "fp32":  # fp32 keeps the key it always had
        extra += f"|precision={precision}|fp32_layers={sorted(fp32_layers)}"
        extra += "" if fp16_arithmetic else "|fp32-arith"
    return Path(cache_root) / f"{src.stem}-{package_key(src, batch, device, extra)}"


def cached_package(src: str | os.PathLike, cache_root: str | os.PathLike, batch: int = 1,
                   device: str = "cpu", kernels: dict[str, str] | None = None,
                   shapes: dict[str, tuple[int, ...]] | None = None, rebuild: bool = False,
                   write: bool = True, precision: str = "fp32", fp32_layers: tuple[str, ...] | list[str] = (),
                   fp16_arithmetic: bool = False) -> Path | None:
    """The compiled package of ``src`` under ``cache_root``, compiled now if missing, not of this engine's plan
    format or ``rebuild`` is asked (the caller found it stale or damaged). Only plan.bin's header is read here:
    its checksum and parse are the open's (``open_package``), which a load runs next and which rebuilds what
    fails there, and reading the whole plan twice cost every load through the cache 0.3-1.7 ms on the 2-core
    VM (a cold one its disk read too, before the open's prefetch of the store). With ``write`` False (the cache
    cannot be written now), None instead of compiling."""
    src = Path(src)
    root = Path(cache_root)
    pkg = cached_package_path(src, root, batch, device, kernels, shapes, precision, fp32_layers, fp16_arithmetic)
    if not rebuild and parsed_cached(pkg):
        return pkg  # its header was checked when that version was parsed: no disk read for a reload
    if (pkg / "plan.bin").is_file() and not rebuild:
        try:
            check_plan_head(pkg / "plan.bin")
            return pkg
        except WeightsStoreError as e:
            log.warning("compiled package %s is unusable (%s); recompiling", pkg, e)
    if not write:
        return None
    root.mkdir(parents=True, exist_ok=True)
    with _compile_lock(pkg):
        # a daemon registering this model in idle time and a request loading it may both get here: the second
        # waits for the first's compile and takes its package (compiling again would cost seconds for nothing)
        if not rebuild and (pkg / "plan.bin").is_file():
            try:
                check_plan_head(pkg / "plan.bin")
                return pkg
            except WeightsStoreError:
                pass
        # a model met for the first time is planned from predictions when this device has a predictor: no
        # profiling on the registration path; the model profiles in idle time (profile_package)
        return _compile_into(src, pkg, device=device, batch=batch, kernels=kernels, shapes=shapes, profile="auto",
                             precision=precision, fp32_layers=tuple(fp32_layers), fp16_arithmetic=fp16_arithmetic)


#: one lock per package path this process has compiled (a daemon compiles a few: kept, not dropped)
_compile_locks: dict[str, threading.Lock] = {}
_compile_locks_mu = threading.Lock()


def _compile_lock(pkg: Path) -> threading.Lock:
    """Held while this process compiles ``pkg``."""
    with _compile_locks_mu:
        return _compile_locks.setdefault(str(pkg), threading.Lock())


#: CPU packages compiled in a child process (``runtime.childcompile``): a serving process's setting, which the daemon
#: turns on at its start (``compile_in_children``)
_in_children = False


def compile_in_children(on: bool = True) -> None:
    """Compile the packages a cache lacks (``cached_package``) in child processes from now on, where the device is
    the CPU: a daemon's, whose clients would otherwise wait out the compile's ``import onnx`` (see
    ``runtime.childcompile``). Vulkan packages are still compiled here (a child would open a device of its own)."""
    global _in_children
    _in_children = on


def _compile_into(src: Path, pkg: Path, **kw: Any) -> Path:
    """Compile into a temp directory beside ``pkg`` and rename it into place."""
    tmp = pkg.parent / f".{pkg.name}.tmp{os.getpid()}.{threading.get_ident()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if _in_children and kw.get("device") == "cpu" and not faults.enabled:
            # (under the fault seam the compile stays here: a test's injected faults count this process's calls)
            from .runtime.childcompile import ChildFailed, compile_package

            try:
                compile_package(src, tmp, kw)
            except ChildFailed as e:
                log.warning("compiling %s in a child process failed (%s); compiling it in this one", src, e)
                shutil.rmtree(tmp, ignore_errors=True)
                compile_model(src, tmp, **kw)
        else:
            compile_model(src, tmp, **kw)
        shutil.rmtree(pkg, ignore_errors=True)
        os.replace(tmp, pkg)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    from .runtime import heap

    if heap.enabled():
        # now, on this thread: the compile's profiling left its buffers in the heap, and a daemon's first start
        # compiles its models one after another (each the next's peak otherwise)
        heap.trim(f"compiling {src.name}")
    return pkg


def rebuild_package(pkg: Path, device: str = "cpu", batch: int = 1, kernels: dict[str, str] | None = None) -> Path:
    """Recompile ``pkg`` in place from the ONNX file it records, if that file is still the same model."""
    try:
        d = read_plan(pkg / "plan.bin")
    except WeightsStoreError as e:
        raise WeightsStoreError(f"{pkg}: damaged and its source is unknown ({e}); compile it again") from e
    src = Path(str(d.get("source", "")))
    if not src.is_file() or file_sha256(src) != d.get("model_sha256"):
        raise StalePackageError(f"{pkg}: stale or damaged, and its source {str(src)!r} is gone or changed; "
                                f"compile it again with 'inferd compile'")
    # a dynamic model is planned again at the shape it was planned at
    shapes = {r[0]: tuple(r[1]) for r in d.get("inputs") or []} if d.get("dims") else None
    made = PrecisionPlan.from_dict(d["precision"]) if d.get("precision") else None
    return _compile_into(src, pkg, device=device, batch=batch, kernels=kernels or d.get("kernels") or None,
                         shapes=shapes, precision=made.requested if made else "fp32",
                         fp32_layers=tuple(n for n, why in made.fp32_layers if why == "override") if made else (),
                         fp16_arithmetic=made is None or made.precision != "fp16" or made.arithmetic == "fp16"
                         or not made.features_dict.get("shaderFloat16", False))
