"""The Vulkan cold backend: the ``ColdBackend`` contract (``inferd.backends.base``) on a Vulkan device.

Construction does only what every layer needs and nothing that needs weights: fold constant
subgraphs, select each node's candidate kernels, lay out and allocate the activations (a layer's
workspace is the largest any of its candidates needs), the IO views, the command pool and the fence.

``prepare(pos)`` brings one layer up from the arrays its plan entry reads, on a loader thread,
concurrently with other layers: the kernel's transform when the plan reads raw weights, its
dispatches, SPIR-V through the shader cache, its pipelines through the device's ``VkPipelineCache``
(created outside the device lock, so loaders compile in parallel), the layer's own weights
allocation (uploaded in place or through staging) and its descriptor sets.

The first run records each layer's dispatches into the current *segment* command buffer as soon as
the layer may execute, and submits the segment whenever the next layer is not prepared yet, so the
GPU runs the prepared prefix while the loaders still work on the rest; every segment but the first
starts with a barrier on the previous segments' writes. ``finalize`` records the whole-model command
buffer of the warm path (one submit per run); ``swap`` replaces one layer's kernel and re-records it.
"""
from __future__ import annotations

import hashlib
import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Mapping, Sequence

import msgpack
import numpy as np

from ..backends.base import forget_raw
from ..errors import BackendError, KernelError
from ..ir import Graph, Node, TensorInfo
from ..ops.base import Kernel, Layer, choose_kernel, raw_key
from ..ops.control import CONTROL_OPS
from ..planner.cost import DeviceRates, Profile
from ..planner.memory import align_up
from ..planner.plan import LayerPlan
from ..planner.precision import FP32, VULKAN_HALF_OPS, LayerFacts, PrecisionPlan, plan_precision
from . import binds as vkbinds
from . import raw
from .arena import SLICE_OPS, place_weights, plan_activations, workspace_name
from .device import Pipeline, Region, get_device, vk
from .executor import (Bound, DescriptorArena, DescriptorLease, HostIO, Locate, Recorder, _import_kernels,
                       bind_descriptors, bind_dispatches, copy_in_place, fold_constants, kernel_caps, select_nodes)
from .kernel import HFP_ATTR, WFP_ATTR, Dispatch, VulkanKernel, split_rows
from .shaders import ShaderCache, ShaderModule, norm_defines
from .slabs import WeightSlabs

log = logging.getLogger("inferd.vulkan.cold")


class _Placeholder(Kernel):
    """The planner's view of a node with no dispatch: nothing to read, transform or create."""

    backend = "vulkan"


class FoldKernel(_Placeholder):
    """A node evaluated on the host at construction: its outputs are constants."""

    name = "fold"


class AliasKernel(_Placeholder):
    """An alias op (Reshape, Flatten, ...): a view of its input, no buffer and no dispatch."""

    name = "alias"


class HostKernel(_Placeholder):
    """A node run on the host between command-buffer segments (``inferd.vulkan.host``)."""

    name = "host"


FOLD, ALIAS, HOST = FoldKernel(), AliasKernel(), HostKernel()
#: the kernel names a plan gives the nodes that run no kernel
PLACEHOLDERS = frozenset(k.name for k in (FOLD, ALIAS, HOST))


@dataclass(frozen=True)
class _Slot:
    """One graph node. ``layer`` is what the planner sees: a folded or alias node has no constant inputs
    (so no weights are read for it), a kernel node the layer its kernels run with."""

    pos: int
    node: Node
    kind: str  # "fold" | "alias" | "kernel" | "host"
    layer: Layer
    kernels: tuple[VulkanKernel, ...]
    default: Kernel
    #: offset of the layer's workspace in the activations region (None: no candidate needs one)
    ws: int | None


#: a resident model whose warm run's GPU part has finished within this long is waited for by polling its fence with the
#: GIL held (``VulkanDevice.wait_fence_polled``) for up to twice that plus ``POLL_SLACK_S``: the small models a board
#: runs on every audio chunk or frame, whose answer a blocking wait's GIL hand-back could delay by milliseconds
POLL_MAX_S = 300e-6
POLL_SLACK_S = 50e-6
#: params up to this size are kept on the host beside the device copy (dispatches read values such as axes)
_META_MAX = 4096
_ZEROS = bytes(16)  # backs every zero view (no dtype is wider)


def _zero_view(a: np.ndarray) -> np.ndarray:
    """A read-only all-zero array of ``a``'s shape and dtype holding no memory (what ``np.broadcast_to`` of a
    zero scalar gives, at a tenth of its cost: a cold load makes one per large parameter array)."""
    return np.ndarray(a.shape, a.dtype, _ZEROS, 0, (0,) * a.ndim)


def _meta(params: Mapping[str, Any]) -> dict[str, Any]:
    """What a prepared layer keeps of its params on the host: large arrays as zero-copy stand-ins of their shape."""
    return {k: (_zero_view(a) if isinstance(a, np.ndarray) and a.nbytes > _META_MAX else a) for k, a in params.items()}


@dataclass
class _Prepared:
    """What ``prepare`` made for one layer (released on a swap and at close)."""

    kernel: VulkanKernel
    bound: list[Bound] = field(default_factory=list)
    weights: Region | None = None
    #: where this layer's range starts in ``weights`` (a slab shared with other layers), and the slabs
    #: that take it back
    base: int = 0
    slabs: "WeightSlabs | None" = None
    wsize: int = 0  # the bytes taken there (given back with the range)
    dsets: DescriptorLease | None = None
    views: list[Any] = field(default_factory=list)
    #: where each param array sits in ``weights``
    place: dict[str, int] = field(default_factory=dict)
    #: the params ``dispatches`` read, large arrays as zero-copy stand-ins of their shape (another input
    #: shape of the model computes its dispatches from them and binds ``weights`` without a transform)
    meta: dict[str, Any] = field(default_factory=dict)
    #: the layer of another shape whose ``weights`` this one binds; ``users`` counts the holders of ours
    origin: "_Prepared | None" = None
    users: int = 1


class VulkanColdBackend:
    """A graph on a Vulkan device, brought up layer by layer by the cold runtime (or all at once by
    ``VulkanModel``). Options are ``VulkanModel``'s: ``device`` (default: the process's shared one),
    ``cache`` (a ``ShaderCache``, a directory, False for none), ``profile`` (GPU timestamps per
    dispatch of the warm path, read with ``last_profile``)."""

    name = "vulkan"
    gpu = True

    @property
    def host_cores(self) -> bool:
        """A CPU-type device (lavapipe) computes on the host's cores: the planner must not count its
        executions as free time for the loaders."""
        return self.caps.device_type == "cpu"

    def __init__(self, graph: Graph, kernels: Mapping[str, str] | None = None, device: Any = None,
                 cache: ShaderCache | str | bool | None = None, profile: bool = False,
                 precision: "str | PrecisionPlan" = "fp32", fp32_layers: Sequence[str] = (),
                 precision_guard: bool = True, fp16_arithmetic: bool = False,
                 planned: Mapping[str, Sequence[str]] | None = None) -> None:
        _import_kernels()
        #: node name -> the kernels a stored plan runs it with (cold, then warm): its only candidates (a node
        #: the plan folds, views or runs on the host is left to selection, which handles it without asking kernels)
        self._planned = None if planned is None else {
            n: ks for n, ks in planned.items() if ks and ks[0] not in PLACEHOLDERS}
        #: the precision asked (a name, planned at setup from the device's features) or already planned
        #: (a package's stored plan); ``precision`` is the plan in force after setup
        self._precision_ask = (precision, tuple(fp32_layers), bool(precision_guard), bool(fp16_arithmetic))
        self.precision: PrecisionPlan = FP32
        self.device = dev = device or get_device()
        if dev.closed:
            raise BackendError("the Vulkan device is closed")
        self.graph = graph
        self.load_stats: dict[str, Any] = {}
        self.timestamps = bool(profile) and dev.timestamps
        self.first_run_done = False
        self._lock = threading.RLock()  # runs, first-run recording, finalize, swaps, close
        self._stats_lock = threading.Lock()
        self._idle = threading.Condition()  # prepares under way: close waits for them
        self._active = 0
        self._closed = False
        self._slots: list[_Slot] = []
        self._prepared: list[_Prepared | None] = []
        self._regions: list[Region] = []
        self._cmd_pool: Any = None
        self._descriptors = DescriptorArena(dev)
        self._fence: Any = None
        self._query_pool: Any = None
        self._warm_cb: Any = None
        self._warm_submit: list[Any] | None = None
        self._warm_ran = False
        self._stale = False  # a swap changed a layer since the warm path was recorded
        #: the shortest wait for a warm run's fence seen so far: a run this short is polled for (``run``)
        self._fastest_wait = float("inf")
        self._bound: list[Bound] = []
        self._seg: Recorder | None = None
        self._seg_cbs: list[Any] = []
        self._hosts: dict[int, Any] = {}  # slot position -> HostStep
        #: the warm path with host steps: per segment its command buffer's submit info, then the host step after it
        self._warm_segments: list[tuple[list[Any], Any]] = []
        if cache is None or cache is True:
            self.shader_cache = dev.shader_cache
        elif cache is False:
            self.shader_cache = ShaderCache(None)
        elif isinstance(cache, ShaderCache):
            self.shader_cache = cache
        else:
            self.shader_cache = ShaderCache(cache)
        self.caps = kernel_caps(dev)
        try:
            self._setup(dict(kernels or {}))
        except BaseException:
            self._free()
            raise
        dev.register_model(self)

    def _setup(self, forced: Mapping[str, str]) -> None:
        T = time.perf_counter
        st = self.load_stats
        g = self.graph
        # refused before folding: a run-time shaped tensor has a placeholder shape, which folding would evaluate
        if g.runtime_shaped:
            raise BackendError(f"model {g.name}: tensors {sorted(g.runtime_shaped)[:3]} are shaped at run time "
                               f"(control flow whose output shapes depend on values); the Vulkan backend plans static "
                               f"shapes: run this model on the CPU")
        t = T()
        _, consts, kept, is_folded = fold_constants(g)
        self._consts = consts
        pg = Graph(g.name, kept, g.inputs, g.outputs, consts, g.infos, g.opset)  # type: ignore[arg-type]
        st["fold_s"] = T() - t
        from .host import HostStep, is_host_node

        planned = self._planned or {}

        def prefer(n: Node) -> tuple[str, ...]:  # the kernels this node was told to run on (forced or planned)
            want = forced.get(n.name, forced.get(n.op))
            return (want,) if want else tuple(planned.get(n.name, ()))

        def placed(n: Node) -> bool:
            # a stored plan's Vulkan kernels for this node: the package was compiled for this device and engine
            # (its fingerprint is checked) and placed the node on the device then; asking the kernels again cost
            # mobilenetv2 12 of its 56 ms of profiled setup on the H200 host, before the plan could start
            return n.name in planned and not (forced.get(n.name) or forced.get(n.op)) and n.op not in CONTROL_OPS

        host_names = {n.name for n in kept if not placed(n) and is_host_node(n, g, consts, prefer(n), self.caps)}
        dg = Graph(g.name, [n for n in kept if n.name not in host_names], g.inputs, g.outputs, consts, g.infos,
                   g.opset)  # type: ignore[arg-type]
        t = T()
        choices = iter(select_nodes(g, dg, self.caps, forced, self._planned))
        st["select_s"] = T() - t
        t = T()
        dev = self.device
        self._align = max(64, dev.caps.min_storage_align)
        listed = []
        for n in kept:
            listed.append(None if n.name in host_names else next(choices))
        ws = [(step, c.layer.name, max(k.workspace_nbytes(c.layer) for k in c.kernels))
              for step, c in enumerate(listed) if c is not None and c.kernels]
        self.plan = plan_activations(pg, ws, self._align)
        self.act_region = dev.allocate_region(max(self.plan.total, 256), "activations")
        self._regions.append(self.act_region)
        self.io = HostIO(dev, g, consts, self.plan, self.act_region)
        if host_names and self.act_region.mapped is None:
            raise BackendError(f"nodes {sorted(host_names)[:3]} run on the host (control flow, integer plumbing, nodes no Vulkan kernel runs) and "
                               f"need host-visible activations, which this device does not offer")
        self.precision = self._plan_precision(listed)
        step = 0
        for pos, (node, folded) in enumerate(zip(g.nodes, is_folded)):
            if folded:
                layer = replace(Layer.of(node, pg), const_inputs=())
                self._slots.append(_Slot(pos, node, "fold", layer, (), FOLD, None))
                continue
            c = listed[step]
            step += 1
            if c is None:
                layer = replace(Layer.of(node, pg), const_inputs=())
                self._slots.append(_Slot(pos, node, "host", layer, (), HOST, None))
                self._hosts[pos] = HostStep(node, g, consts, self._body_backend, self.caps, prefer(node))
            elif c.default is None:
                self._slots.append(_Slot(pos, node, "alias", replace(c.layer, const_inputs=()), (), ALIAS, None))
            else:
                layer = c.layer
                half_op = bool(layer.const_inputs) and layer.op in VULKAN_HALF_OPS
                mode = self.precision.layer_mode(layer.name) if half_op else 0
                if mode:  # the kernels read the layer's weight representation (and arithmetic) from it
                    extra = {WFP_ATTR: mode, **({HFP_ATTR: 1} if self.precision.layer_harith(layer.name) else {})}
                    layer = replace(layer, node=replace(layer.node, attrs={**layer.node.attrs, **extra}))
                self._slots.append(_Slot(pos, node, "kernel", layer, c.kernels, c.default,
                                         self.plan.offsets.get(workspace_name(c.layer.name))))
        self._prepared = [None] * len(self._slots)
        expected = 0
        for sl in self._slots:
            if sl.kind == "kernel":
                try:
                    expected += int(sl.default.transformed_nbytes(sl.layer))
                except Exception:  # an estimate only: slabs then start small and grow
                    pass
        self._slabs = WeightSlabs(dev, expected)
        d = dev.device
        self._cmd_pool = vk.vkCreateCommandPool(d, vk.VkCommandPoolCreateInfo(queueFamilyIndex=dev.queue_family), None)
        # created signalled: close() and begin() wait on it, also when the model never ran
        self._fence = dev.take_fence()
        st["alloc_s"] = T() - t
        st["activation_bytes"] = self.plan.total

    def _plan_precision(self, listed: Sequence[Any]) -> PrecisionPlan:
        """The precision plan in force: the one given, or planned from the device's features and the
        layers' weights (their magnitude decides which fp16 cannot hold)."""
        ask, fp32_layers, guard, arith = self._precision_ask
        if isinstance(ask, PrecisionPlan):
            plan = ask.on(self.device.features) if ask.precision == "fp16" else ask
        else:
            facts = []
            if ask != "fp32":
                for c in listed:
                    if c is None or not c.kernels or not c.layer.const_inputs:
                        continue
                    arrs = [np.asarray(self._consts[c.layer.node.inputs[i]]) for i in c.layer.const_inputs]
                    arrs = [a for a in arrs if a.dtype.kind == "f" and a.size]
                    nbytes = sum(a.nbytes for a in arrs)
                    absmax = max((float(np.max(np.abs(a))) for a in arrs), default=0.0)
                    facts.append(LayerFacts(c.layer.name, nbytes, absmax))
            plan = plan_precision(str(ask), "vulkan", self.device.features, facts, fp32_layers, guard, arith)
        if plan.precision != "fp32" or plan.requested != "fp32":
            log.info("%s on %s: %s", self.graph.name, self.device.name, plan.summary())
        return plan

    @classmethod
    def loaded(cls, graph: Graph, **options: Any) -> "VulkanColdBackend":
        """``graph`` brought up whole (every layer prepared, the warm path recorded), freed again if that fails."""
        b = cls(graph, **options)
        try:
            b.prepare_all()
            b.finalize()
        except BaseException:
            b.close()
            raise
        return b

    def _body_backend(self, body: Graph) -> "VulkanColdBackend":
        """A control-flow body brought up whole on this device (planned once at load, run when taken)."""
        return VulkanColdBackend.loaded(body, device=self.device, cache=self.shader_cache,
                                        precision=self.precision.requested if self.precision.precision == "fp16"
                                        else "fp32")

    # ------------------------------------------------------------------ the ColdBackend contract
    def layers(self) -> list[Layer]:
        return [s.layer for s in self._slots]

    def candidates(self) -> list[tuple[Layer, list[Kernel], Kernel]]:
        return [(s.layer, list(s.kernels) if s.kind == "kernel" else [s.default], s.default) for s in self._slots]

    def prepare(self, pos: int, lp: LayerPlan, arrays: dict[str, np.ndarray]) -> dict[str, float]:
        slot = self._slots[pos]
        if slot.kind != "kernel":
            return {"transform_s": 0.0, "pipeline_s": 0.0}
        kernel = self._kernel(slot, lp.kernel)
        T = time.perf_counter
        with self._working():
            t0 = T()
            params = dict(arrays) if lp.source == "transformed" else kernel.transform(slot.layer, self._raw(slot, arrays))
            transform_s = T() - t0
            rec = self.binds.get(slot.layer.name) if self.binds else None
            got = vkbinds.parse(rec, kernel.name, params) if rec is not None else None
            replayed = self._replay(slot, kernel, params, got) if got is not None else None
            if replayed is not None:
                prep, pipeline_s = replayed
            else:
                dispatches = self._dispatches(slot, kernel, params)[0]
                t0 = T()
                pipes = self._pipelines(dispatches)
                pipeline_s = T() - t0
                prep = self._place(slot, kernel, params, dispatches, pipes)
            self._prepared[pos] = prep
        self._add(transform_s=transform_s, binds_replayed=int(replayed is not None))
        return {"transform_s": transform_s, "pipeline_s": pipeline_s}

    # ------------------------------------------------------------------ recorded binds (``vulkan.binds``)
    #: the package's records of this backend's layers (layer name -> record), set by the loader before the cold
    #: load starts; None: none read
    binds: "dict[str, Any] | None" = None
    binds_file = vkbinds.FILE
    binds_magic = vkbinds.MAGIC

    @property
    def binds_key(self) -> dict[str, Any]:
        """What a record depends on beyond the package's plan: the activation arena this backend laid out (its
        size and every tensor's offset: a plan whose kernels changed without a new arena size, as a rewritten
        plan.bin's, moves tensors)."""
        offs = msgpack.packb([sorted(self.plan.offsets.items()), sorted(self.plan.aliases.items())])
        return {"arena": int(self.plan.total), "align": int(self._align),
                "offsets": hashlib.sha256(offs).hexdigest()[:32]}

    def record_binds(self) -> dict[str, Any]:
        """The records of the layers prepared so far (those that can have one): ``vulkan.binds``."""
        out: dict[str, Any] = {}
        for s, p in zip(self._slots, self._prepared):
            if s.kind != "kernel" or p is None or p.origin is not None:
                continue
            rec = vkbinds.record_layer(p.kernel.name, p.wsize, p.place, p.meta, p.bound, self.act_region, p.weights,
                                     p.base)
            if rec is not None:
                out[s.layer.name] = rec
        return out

    def _replay(self, slot: _Slot, kernel: VulkanKernel, params: Mapping[str, np.ndarray],
                rec: "vkbinds.Parsed") -> "tuple[_Prepared, float] | None":
        """Layer ``slot`` prepared from its record (its pipelines, weights, bound dispatches and descriptor sets,
        with no dispatch worked out and no binding resolved) and the seconds its pipelines took; None where the
        record does not fit the shaders' manifests or the arena (the caller prepares it the usual way)."""
        dev = self.device
        t0 = time.perf_counter()
        mods = self.shader_cache.get_many(rec.variants) if rec.variants else []
        act = self.act_region
        for m, (_g, _i, push, ranges) in zip(mods, rec.entries):
            man = m.manifest
            if len(ranges) != len(man.bindings) or len(push) != (man.push_size if man.push else 0):
                return None
            for space, off, n in ranges:
                if off < 0 or n <= 0 or off + n > (act.size if space == vkbinds.ACT else rec.wsize) \
                        or space not in (vkbinds.ACT, vkbinds.WEIGHTS):
                    return None
        counts: dict[str, int] = {}
        pipes = dev.pipelines([(m, sp) for m, sp in zip(mods, rec.specs)], counts) if mods else []
        pipeline_s = time.perf_counter() - t0
        self._add(pipeline_create_s=pipeline_s, pipelines_created=counts.get("created", 0),
                  pipeline_cache_hits=counts.get("cache_hits", 0))
        layer = slot.layer
        prep = _Prepared(kernel, place={k: off for k, _a, off in rec.arrays}, meta=_meta(params))
        try:
            self._upload(prep, self._slabs, rec.wsize, layer.name, [(off, a) for _k, a, off in rec.arrays])
            # (a weights range where the layer has none was refused above: its end lies past wsize 0)
            w, base, pos = prep.weights, prep.base, slot.pos
            for (groups, independent, push, ranges), m, pipe, sp in zip(rec.entries, mods, pipes, rec.specs):
                rs = [(act, off, n) if space == vkbinds.ACT else (w, base + off, n) for space, off, n in ranges]
                d = Dispatch(m.name, (), groups, dict(m.defines), sp, {}, independent)
                prep.bound.append(Bound(pos, layer, kernel, d, pipe, rs, push))
            prep.dsets = bind_descriptors(dev, prep.bound, prep.views, self._descriptors)
        except BaseException:
            self._release(prep)
            raise
        return prep, pipeline_s

    def _upload(self, prep: _Prepared, slabs: WeightSlabs, total: int, name: str,
                arrays: Sequence[tuple[int, np.ndarray]]) -> None:
        """A range of ``total`` bytes from ``slabs`` for ``prep``'s weights, ``arrays`` written at their offsets in it
        (none taken when ``total`` is 0)."""
        t = time.perf_counter()
        if total:
            region, prep.base = slabs.take(total, name)
            prep.weights, prep.slabs, prep.wsize = region, slabs, total
            self.device.upload([(region, prep.base + off, a) for off, a in arrays])
        self._add(upload_s=time.perf_counter() - t)

    def note_pipelines(self, pos: int, kernel_name: str) -> int:
        """Make (or find) the pipelines ``kernel_name`` runs layer ``pos`` with and list them as used (the device's
        pipeline list, what a daemon makes resident at its next start): a refined plan's cold kernels, which the
        next load of its package runs. Idle-time work; returns how many pipelines the kernel's dispatches take."""
        slot = self._slots[pos]
        if slot.kind != "kernel":
            return 0
        kernel = self._kernel(slot, kernel_name)
        with self._working():
            return len(self._pipelines(self._graph_dispatches(slot, kernel)[0], record=True))

    def begin(self, feeds: Mapping[str, np.ndarray]) -> None:
        with self._lock:
            self._check_open()
            self._drop_segments(wait=True)
            self.device.wait_fence(self._fence)
            self.io.write(feeds)

    def _host_step(self, pos: int) -> None:
        """Run host step ``pos`` on the activations (everything before it has completed)."""
        act, plan, infos = self.act_region, self.plan, self.graph.infos
        if not act.coherent:
            self.device.invalidate(act)

        def read(name: str) -> np.ndarray:
            t = infos[name]
            return np.array(act.view(plan.offset(name), t.shape, t.dtype))

        def write(name: str, a: np.ndarray) -> None:
            t = infos[name]
            if tuple(a.shape) != tuple(t.shape):
                raise BackendError(f"host step {self._slots[pos].node.name}: output {name!r} of shape "
                                   f"{list(a.shape)} where the plan has {list(t.shape)}")
            np.copyto(act.view(plan.offset(name), t.shape, t.dtype), a, casting="unsafe")

        self._hosts[pos].run(read, write)
        if not act.coherent:
            self.device.flush(act)

    def execute(self, pos: int, flush: bool = False) -> None:
        slot = self._slots[pos]
        if slot.kind == "host":
            # what comes before must have run: submit the segment so far and wait, then decide on the host
            self._segment()
            self.device.reset_fence(self._fence)
            self._submit_segment(self._fence)
            self.device.wait_fence(self._fence)
            self._host_step(pos)
            return
        if slot.kind == "kernel":
            prep = self._prepared[pos]
            if prep is None:
                raise RuntimeError(f"layer {slot.node.name!r} executed before it was prepared")
            if prep.bound:
                rec = self._segment()
                for b in prep.bound:
                    rec.dispatch(b)
        if flush and self._seg is not None and self._seg.count:
            self._submit_segment(None)

    def end(self) -> dict[str, np.ndarray]:
        with self._lock:
            rec = self._segment()
            self.io.epilogue(rec)
            self.device.reset_fence(self._fence)
            self._submit_segment(self._fence)
            self.device.wait_fence(self._fence)
            out = self.io.read()
            self._drop_segments(wait=False)
            self.first_run_done = True
            return out

    #: the cold runtime may finalize after the first answer, off its path (``run`` records if it has not)
    defer_finalize = True

    def finalize(self) -> None:
        """Record the warm path's command buffer (every layer, in order) and save the pipeline cache."""
        with self._lock:
            self._check_open()
            self._finalize_locked()

    def _finalize_locked(self) -> None:
        missing = [s.node.name for s in self._slots if s.kind == "kernel" and self._prepared[s.pos] is None]
        if missing:
            raise RuntimeError(f"layers not prepared: {missing[:5]}")
        self._record_warm()

    def _record_warm(self) -> None:
        T = time.perf_counter
        t = T()
        dev = self.device
        d = dev.device
        bound = [b for p in self._prepared if p is not None for b in p.bound]
        dev.wait_fence(self._fence)
        if self._warm_cb is not None:
            vk.vkFreeCommandBuffers(d, self._cmd_pool, 1, [self._warm_cb])
            self._warm_cb = self._warm_submit = None
        for submit, _pos in self._warm_segments:
            vk.vkFreeCommandBuffers(d, self._cmd_pool, 1, submit[0].pCommandBuffers)
        self._warm_segments = []
        if self._query_pool is not None:
            vk.vkDestroyQueryPool(d, self._query_pool, None)
            self._query_pool = None
        cb = vk.vkAllocateCommandBuffers(d, vk.VkCommandBufferAllocateInfo(
            commandPool=self._cmd_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        self._warm_cb = cb
        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo())
        if self.timestamps:
            self._query_pool = vk.vkCreateQueryPool(d, vk.VkQueryPoolCreateInfo(
                queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=len(bound) + 1), None)
            vk.vkCmdResetQueryPool(cb, self._query_pool, 0, len(bound) + 1)
        rec = Recorder(cb, self._query_pool, per_dispatch=True)
        self.io.prologue(rec)
        if self._query_pool is not None:
            rec.timestamp()
        self._warm_segments = []
        for slot, p in zip(self._slots, self._prepared):
            if slot.kind == "host":
                # the segment so far ends here; the host step runs once it completed; the next one follows it
                vk.vkEndCommandBuffer(cb)
                self._warm_segments.append(([vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cb])], slot.pos))
                cb = vk.vkAllocateCommandBuffers(d, vk.VkCommandBufferAllocateInfo(
                    commandPool=self._cmd_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
                vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo())
                barriers, query = rec.barriers, rec.query
                rec = Recorder(cb, self._query_pool, per_dispatch=True)
                rec.barriers, rec.query = barriers, query
                rec.full_barrier()
                continue
            if p is not None:
                for b in p.bound:
                    rec.dispatch(b)
        self.io.epilogue(rec)
        vk.vkEndCommandBuffer(cb)
        self._warm_submit = [vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cb])]
        self._bound = bound
        self._warm_ran = False
        self._stale = False
        st = self.load_stats
        st["record_s"] = T() - t
        st["dispatches"] = len(bound)
        st["barriers"] = rec.barriers
        st["pipelines"] = len({id(b.pipeline) for b in bound})
        st["weights_bytes"] = sum(r.size for r in self.weight_regions)
        t = T()
        dev.save_caches()
        dev.shader_cache.save_bundle()
        st["pipeline_cache_save_s"] = T() - t

    def swap(self, pos: int, kernel: Kernel, params: dict[str, np.ndarray]) -> None:
        """Replace layer ``pos``'s kernel (the warm switch; the caller holds the model's run lock). The warm
        command buffer is re-recorded once, at the next run, however many layers a switch swaps."""
        slot = self._slots[pos]
        if slot.kind != "kernel" or not isinstance(kernel, VulkanKernel):
            raise KernelError(f"layer {slot.node.name!r}: cannot switch to {kernel!r}")
        with self._lock:
            self._check_open()
            dispatches = self._dispatches(slot, kernel, params)[0]
            new = self._place(slot, kernel, dict(params), dispatches, self._pipelines(dispatches))
            self.device.wait_fence(self._fence)
            old, self._prepared[pos] = self._prepared[pos], new
            # the recorded warm path still names the old kernel's sets and weights: never submitted again
            self._stale = True
            if old is not None:
                self._release(old)

    def compact_weights(self, swapped: Sequence[tuple[int, Kernel, dict[str, np.ndarray]]]) -> int:
        """After a swap of several layers (the warm switch): place again, with the same kernel and params, each
        swapped layer whose weights went to an allocation made during the swap where a range its old kernel gave
        back now holds them; the emptied allocations go. Why: each new kernel's weights are placed before the
        old kernel's are given back, so a switch left the first slab full of holes and the new weights in
        allocations of their own (mobilenetv2 on lavapipe: 22.6 MiB held for 13.3 MiB of weights). Costs a
        second upload of those layers, in idle time. Returns the layers moved."""
        slabs = getattr(self, "_slabs", None)
        if slabs is None:
            return 0
        moved = 0
        # the largest first: a small layer placed first fit could split the one hole a large one fits in
        by_size = sorted(swapped, key=lambda s: -(getattr(self._prepared[s[0]], "wsize", 0) or 0))
        try:
            for pos, kernel, params in by_size:
                p = self._prepared[pos]
                # (a range another input shape's layer binds too stays where it is: moving it would hold it twice)
                if p is None or p.origin is not None or p.users > 1 or p.weights is None or p.slabs is not slabs \
                        or p.kernel is not kernel or not slabs.has_earlier_room(p.weights, p.wsize):
                    continue
                self.swap(pos, kernel, params)
                moved += 1
        finally:
            slabs.close()  # the allocation opened for the swap goes if nothing stayed in it
        return moved

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            self._check_open()
            if self._stale:
                self._record_warm()
            if self._warm_submit is None:
                if not self.first_run_done:
                    raise BackendError("the model is not loaded yet (finalize has not run)")
                self._finalize_locked()  # the deferred finalize has not come round yet: do it now
            t0 = time.perf_counter()
            dev = self.device
            self.io.write(feeds)
            for submit, pos in self._warm_segments:  # host steps: run each segment, then decide on the host
                dev.reset_fence(self._fence)
                dev.queue_submit(submit, self._fence)
                dev.wait_fence(self._fence)
                self._host_step(pos)
            dev.reset_fence(self._fence)
            dev.queue_submit(self._warm_submit, self._fence)
            fast = self._fastest_wait
            t = time.perf_counter()
            polled = dev.wait_fence_polled(self._fence, 2 * fast + POLL_SLACK_S if fast <= POLL_MAX_S else 0.0)
            waited = time.perf_counter() - t
            if (polled or fast > POLL_MAX_S) and waited < fast:
                # the quickest a run's GPU part was seen to finish (a blocked wait may add the GIL's hand-back: while
                # the poll is on, one that outlasted it is not counted)
                self._fastest_wait = waited
            out = self.io.read()
            self._warm_ran = True
            if not self.first_run_done:
                self.first_run_done = True
                self.load_stats["first_run_s"] = time.perf_counter() - t0
            return out

    __call__ = run

    # ------------------------------------------------------------------ facts for the planner
    def fingerprint(self) -> dict[str, str]:
        return self.device.fingerprint()

    def pipeline_cache_filled(self) -> bool:
        """Whether pipelines will come from a filled ``VkPipelineCache``: loaded from disk, or filled by
        pipelines this process already created."""
        return self.device.pipeline_cache.initial_bytes > 0 or self.device.stats["pipelines_created"] > 0

    def profile(self, entries: Sequence[tuple[Layer, Sequence[Kernel], Kernel]], rates: DeviceRates,
                budget_s: float = 5.0, reps: int = 2) -> Profile:
        """Measure, per layer that has weights or a choice and per candidate kernel: the transform, the
        creation of its pipelines through an empty and through the filled cache, and the layer's execution
        alone on random inputs (the first one by wall clock: it includes lazy shader compilation and first
        touch; warm ones by GPU timestamps where the queue has them).

        Every layer's default kernel is measured first, the other candidates while ``budget_s`` lasts
        (the rest keep the roofline): the daemon profiles at a model's first registration, and on
        lavapipe a 25 s budget held the demo's start for ~50 s. A pipeline is created once per model, so a layer is charged only
        for the pipelines no earlier layer running the same kernel needs; the pipeline rates of the
        roofline become the measured means per layer."""
        T = time.perf_counter
        times: dict[tuple[str, str, str], float] = {}
        #: (position, kernel) -> (pipeline keys, seconds per pipeline through an empty / the filled cache)
        pipes_of: dict[tuple[int, str], tuple[set[Any], float, float]] = {}
        dev = self.device
        work = [(s, k) for s, (layer, kernels, default) in zip(self._slots, entries)
                if s.kind == "kernel" and (layer.const_inputs or len(kernels) > 1) for k in kernels]
        work.sort(key=lambda sk: sk[1] is not sk[0].default)  # stable: defaults first, each pass in graph order
        t_start = T()
        for slot, k in work:
            if T() - t_start > budget_s:
                log.info("profiling stopped after %.1f s; the remaining candidates use the roofline", budget_s)
                break
            layer = slot.layer
            try:
                assert isinstance(k, VulkanKernel)
                raw = self._raw(slot, {})
                t0 = T()
                params = k.transform(layer, raw)
                times[(layer.name, k.name, "transform")] = T() - t0
                dispatches = split_rows(k.dispatches(layer, params, self.caps), self.caps)
                pipes = self._pipelines(dispatches, record=False)
                reqs = [(p.module, dict(d.spec)) for d, p in zip(dispatches, pipes)]
                keys = {dev.pipeline_key(m, s) for m, s in reqs}
                n = max(len(keys), 1)
                pipes_of[(slot.pos, k.name)] = (keys, dev.time_pipelines(reqs, empty=True) / n,
                                                dev.time_pipelines(reqs, empty=False) / n)
                first, warm = self._time_layer(slot, k, params, dispatches, pipes, reps)
                times[(layer.name, k.name, "exec_first")] = first
                times[(layer.name, k.name, "exec")] = warm
            except Exception as ex:  # a kernel that fails here is not a candidate the planner should trust
                log.warning("profiling %s with %s failed: %s: %s", layer.name, k.name, type(ex).__name__, ex)
        seen: dict[str, set[Any]] = {}
        per_layer: list[tuple[float, float]] = []
        for (pos, kname), (keys, e, f) in sorted(pipes_of.items()):
            new = len(keys - seen.setdefault(kname, set()))
            seen[kname] |= keys
            name = self._slots[pos].layer.name
            times[(name, kname, "pipeline_empty")] = new * e
            times[(name, kname, "pipeline_filled")] = new * f
            per_layer.append((new * e, new * f))
        if per_layer:
            rates = replace(rates, pipeline_empty_s=float(np.mean([e for e, _ in per_layer])),
                            pipeline_filled_s=float(np.mean([f for _, f in per_layer])))
        # the layers of one signature (repeated blocks) take one time per kernel: a pair its lesser, more their middle
        from ..runtime.profiler import pool_signatures

        pool_signatures([(s.layer, kernels, default) for s, (_l, kernels, default) in zip(self._slots, entries)
                         if s.kind == "kernel"], times)
        for slot in self._slots:
            if self._moves_nothing(slot):  # what it costs in the model (not in a scratch region): nothing
                for phase in ("exec", "exec_first", "pipeline_empty", "pipeline_filled"):
                    times[(slot.layer.name, slot.default.name, phase)] = 0.0
        return Profile("vulkan", self.fingerprint(), rates, times)

    def _dispatches(self, slot: _Slot, kernel: VulkanKernel, params: Mapping[str, np.ndarray]
                    ) -> tuple[list[Dispatch], int]:
        """``kernel``'s dispatches of ``slot`` in this model's arena, without the copies of a range onto itself
        (``executor.copy_in_place``: a Concat's or Split's part or a one-index Gather's output the memory plan put
        in place; no pipeline, no descriptor set, no barrier for them), and how many went."""
        ds = split_rows(kernel.dispatches(slot.layer, params, self.caps), self.caps)
        node, consts, plan = slot.layer.node, self._consts, self.plan
        keep = []
        for d in ds:
            if d.shader == "copy":
                try:
                    names = [(node.inputs if r.kind == "in" else node.outputs)[r.key] if r.kind in ("in", "out")
                             else "" for r in d.bindings]
                    ranges = [(self.act_region, plan.offset(n) + r.offset, 0) for n, r in zip(names, d.bindings)
                              if n and n not in consts]
                except (KeyError, IndexError, TypeError):  # a binding the arena does not hold: not in place
                    ranges = []
                if len(ranges) == len(d.bindings) and copy_in_place(d, ranges):
                    continue
            keep.append(d)
        return keep, len(ds) - len(keep)

    def _graph_dispatches(self, slot: _Slot, kernel: VulkanKernel) -> tuple[list[Dispatch], int]:
        """``_dispatches`` of ``kernel`` with its weights transformed from the graph's raw constants (no loader read
        them: the questions asked outside a load)."""
        return self._dispatches(slot, kernel, kernel.transform(slot.layer, self._raw(slot, {})))

    def _moves_nothing(self, slot: _Slot) -> bool:
        """Whether ``slot``'s only kernel records no dispatch here (every one a copy in place): the planner must
        not charge it a copy's execution or pipeline (the roofline scaled by other kernels' dispatches priced
        squeezenet1_1's eight in-place Concats at 1.5-9.6 ms each on lavapipe)."""
        k = slot.default
        if (slot.kind != "kernel" or slot.layer.op not in SLICE_OPS or len(slot.kernels) != 1
                or not isinstance(k, VulkanKernel)):
            return False
        try:
            keep, gone = self._graph_dispatches(slot, k)
        except Exception:  # a kernel that cannot say: it is priced as it runs
            return False
        return not keep and gone > 0

    # ------------------------------------------------------------------ what VulkanModel and tools read
    def prepare_all(self) -> None:
        """Prepare every layer with its default (or forced) kernel in batched stages: all transforms, one
        SPIR-V pass (parallel glslang on misses), one pipeline batch, then weights and descriptor sets."""
        self._prepare_staged(None)

    def adopt(self, donor: "VulkanColdBackend") -> dict[str, int]:
        """Prepare every layer from ``donor``, the same model at another input shape: its kernel and its
        weights on the device (bound, not copied: one copy for every shape) where that kernel applies here
        and its transform reads nothing that changed; the other layers get their default kernel, transformed
        from the raw constants. Then ``finalize``. Returns how many layers shared and how many did not."""
        counts = self._prepare_staged(donor)
        self.finalize()
        return counts

    def _prepare_staged(self, donor: "VulkanColdBackend | None") -> dict[str, int]:
        T = time.perf_counter
        st = self.load_stats
        t = T()
        theirs = {s.node.name: (s.layer, p) for s, p in zip(donor._slots, donor._prepared)
                  if p is not None and s.kind == "kernel"} if donor is not None else {}
        todo: list[tuple[_Slot, VulkanKernel, Mapping[str, np.ndarray], list[Dispatch], _Prepared | None]] = []
        shared = 0
        for s in self._slots:
            if s.kind != "kernel":
                continue
            donor_layer, p = theirs.get(s.node.name, (None, None))
            if p is not None and s.layer.const_inputs and any(k.name == p.kernel.name for k in s.kernels):
                pk = p.kernel
                if pk.transform_key(donor_layer) == pk.transform_key(s.layer):
                    kern = self._kernel(s, pk.name)
                    ds = self._dispatches(s, kern, p.meta)[0]
                    todo.append((s, kern, p.meta, ds, p.origin or p))
                    shared += 1
                    continue
            assert isinstance(s.default, VulkanKernel)
            params = s.default.transform(s.layer, self._raw(s, {}))
            forget_raw(self._consts, s.layer)
            ds = self._dispatches(s, s.default, params)[0]
            todo.append((s, s.default, params, ds, None))
        st["transform_s"] = T() - t
        t = T()
        sc = self.shader_cache
        before = (sc.compiled, sc.disk_hits)
        variants = [(d.shader, norm_defines(d.defines)) for _s, _k, _p, ds, _o in todo for d in ds]
        mods = dict(zip(variants, sc.get_many(variants))) if variants else {}
        st["shader_compile_s"] = T() - t
        st["shaders_compiled"] = sc.compiled - before[0]
        st["shaders_from_disk"] = sc.disk_hits - before[1]
        st["shader_variants"] = len(set(variants))
        t = T()
        reqs = [(mods[(d.shader, norm_defines(d.defines))], dict(d.spec)) for _s, _k, _p, ds, _o in todo for d in ds]
        counts: dict[str, int] = {}
        pipes = self.device.pipelines(reqs, counts) if reqs else []
        st["pipeline_create_s"] = T() - t
        st["pipelines_created"] = counts.get("created", 0)
        st["pipeline_cache_hits"] = counts.get("cache_hits", 0)
        k = 0
        for s, kern, params, ds, origin in todo:
            self._prepared[s.pos] = self._place(s, kern, params, ds, pipes[k:k + len(ds)], origin=origin)
            k += len(ds)
        return {"shared": shared, "own": sum(1 for s, *_r, o in todo if o is None and s.layer.const_inputs)}

    @property
    def kernel_names(self) -> dict[str, str]:
        """Node name -> Vulkan kernel ("alias" for ops that are views; folded nodes are not run)."""
        out = {}
        for s in self._slots:
            if s.kind == "host":
                out[s.node.name] = self._hosts[s.pos].placement if s.pos in self._hosts else "host"
            elif s.kind == "alias":
                out[s.node.name] = s.kind
            elif s.kind == "kernel":
                p = self._prepared[s.pos]
                out[s.node.name] = (p.kernel if p is not None else s.default).name
        return out

    @property
    def input_infos(self) -> list[TensorInfo]:
        """The inputs the host writes (an input folded into a constant is not among them)."""
        return [t for t, _ in self.io.inputs]

    @property
    def weight_regions(self) -> list[Region]:
        """The weight allocations this backend owns (not those it binds from another shape's), each once."""
        slabs = getattr(self, "_slabs", None)
        return slabs.regions if slabs is not None else []

    @property
    def memory_breakdown(self) -> dict[str, int]:
        """``arena_bytes`` (activations, workspaces, IO staging) and ``weights_bytes`` (the weight
        allocations this backend owns), device memory both."""
        weights = int(sum(r.size for r in self.weight_regions))
        return {"arena_bytes": self.memory_bytes - weights, "weights_bytes": weights}

    @property
    def memory_bytes(self) -> int:
        io = getattr(self, "io", None)
        own = io.own.size if io is not None and io.own is not None else 0
        return int(sum(r.size for r in self._regions) + own + sum(r.size for r in self.weight_regions))

    def last_profile(self) -> list[dict[str, Any]]:
        """GPU time of each dispatch in the last warm run (``profile=True`` only): time from the previous
        dispatch's end-of-compute timestamp to this one's, so barrier waits count to the dispatch after them."""
        if self._query_pool is None or not self._warm_ran:
            return []
        n = len(self._bound) + 1
        ts = self._timestamps(self._query_pool, n)
        period = self.device.timestamp_period
        return [{"node": b.layer.name, "op": b.layer.op, "kernel": b.kernel.name, "shader": b.dispatch.shader,
                 "groups": b.dispatch.groups, "ms": (ts[i + 1] - ts[i]) * period / 1e6} for i, b in enumerate(self._bound)]

    # ------------------------------------------------------------------ one layer
    def _kernel(self, slot: _Slot, name: str) -> VulkanKernel:
        for k in slot.kernels:
            if k.name == name:
                return k
        found = choose_kernel(slot.layer, "vulkan", name)  # raises KernelError naming the layer and kernel
        if not isinstance(found, VulkanKernel):
            raise KernelError(f"{name!r} is not a Vulkan kernel (layer {slot.node.name!r})")
        return found

    def _raw(self, slot: _Slot, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The layer's raw constants: what the loader read, else the graph's (folded ones live only here)."""
        out = {}
        for i in slot.layer.const_inputs:
            key = raw_key(i)
            out[key] = arrays[key] if key in arrays else self._consts[slot.node.inputs[i]]
        return out

    def _pipelines(self, dispatches: Sequence[Dispatch], record: bool = True) -> list[Pipeline]:
        """``record``: note them in the device's pipeline list (not for candidates the profiler only times)."""
        t = time.perf_counter()
        mods: list[ShaderModule] = self.shader_cache.get_many(
            [(d.shader, norm_defines(d.defines)) for d in dispatches]) if dispatches else []
        t1 = time.perf_counter()
        counts: dict[str, int] = {}
        pipes = self.device.pipelines([(m, dict(d.spec)) for d, m in zip(dispatches, mods)], counts,
                                      record=record) if mods else []
        self._add(shader_compile_s=t1 - t, pipeline_create_s=time.perf_counter() - t1,
                  pipelines_created=counts.get("created", 0), pipeline_cache_hits=counts.get("cache_hits", 0))
        return pipes

    def _place(self, slot: _Slot, kernel: VulkanKernel, params: Mapping[str, np.ndarray], dispatches: Sequence[Dispatch],
               pipes: Sequence[Pipeline], locate: Locate | None = None, ws: tuple[Region, int] | None = None,
               origin: _Prepared | None = None, slabs: WeightSlabs | None = None) -> _Prepared:
        """Weights into their own allocation (or ``origin``'s, the same layer of another input shape),
        every binding resolved, descriptor sets written. Activations live in the arena unless
        ``locate``/``ws`` say otherwise (the profiler's scratch)."""
        dev = self.device
        layer = slot.layer
        node = layer.node
        consts = self._consts
        # only arrays some dispatch binds (kernels also keep host-side values such as axes in params)
        keys: set[str] = set()
        for d in dispatches:
            for ref in d.bindings:
                if ref.kind == "param":
                    keys.add(str(ref.key))
                elif ref.kind == "in" and isinstance(ref.key, int) and ref.key < len(node.inputs) \
                        and node.inputs[ref.key] in consts:
                    keys.add(raw_key(ref.key))
        arrays = [(k, a) for k, a in params.items() if k in keys]
        place, total = place_weights([(k, a.nbytes) for k, a in arrays])
        if origin is not None and (place != origin.place or (origin.weights is None) != (total == 0)):
            raise BackendError(f"node {layer.name}: kernel {kernel.name} lays its weights out differently at this "
                               f"shape; they cannot be shared")
        if locate is None:
            act, plan, infos = self.act_region, self.plan, self.graph.infos

            def locate(t: str) -> tuple[Region, int, int]:
                return act, plan.offset(t), infos[t].nbytes
            ws = (act, slot.ws) if slot.ws is not None else None
        prep = _Prepared(kernel, place=place, meta=_meta(params))
        try:
            if origin is not None:
                origin.users += 1
                prep.origin, prep.weights, prep.base = origin, origin.weights, origin.base
            else:
                self._upload(prep, slabs or self._slabs, total, layer.name, [(place[k], a) for k, a in arrays])
            weights = {k: (prep.weights, prep.base + off) for k, off in place.items() if prep.weights is not None}
            prep.bound = bind_dispatches(dev, slot.pos, layer, kernel, dispatches, pipes, consts, locate, ws, params,
                                         weights)
            prep.dsets = bind_descriptors(dev, prep.bound, prep.views, self._descriptors)
        except BaseException:
            self._release(prep)
            raise
        return prep

    def _release(self, prep: _Prepared) -> None:
        dev = self.device
        if dev.closed or dev.device is None:
            return
        if prep.dsets is not None:
            self._descriptors.free(prep.dsets)
            prep.dsets = None
        raw.destroy_buffer_views(dev.device, prep.views)
        prep.views = []
        # weights are freed by their last holder: the layer of another shape may still bind them
        owner = prep.origin or prep
        if prep.weights is not None or prep.origin is not None:
            owner.users -= 1
            if owner.users <= 0:
                if owner.weights is not None and owner.slabs is not None:
                    owner.slabs.give(owner.weights, owner.base, owner.wsize)
                owner.weights = None
        prep.weights, prep.origin = None, None

    def _time_layer(self, slot: _Slot, kernel: VulkanKernel, params: Mapping[str, np.ndarray],
                    dispatches: Sequence[Dispatch], pipes: Sequence[Pipeline], reps: int) -> tuple[float, float]:
        """(first execution by wall clock, median warm execution) of one layer alone, on random inputs in
        a scratch region of its own."""
        dev = self.device
        layer = slot.layer
        infos = self.graph.infos
        names = list(dict.fromkeys(n for n in list(layer.node.inputs) + list(layer.node.outputs)
                                   if n and n not in self._consts))
        offs: dict[str, int] = {}
        end = 0
        for n in names:
            offs[n] = end
            end += align_up(max(infos[n].nbytes, 4), self._align)
        ws_off = end
        end += kernel.workspace_nbytes(layer)
        scratch = dev.allocate_region(max(end, 256), f"profile:{layer.name}")
        # the candidates' weights in allocations of their own, gone with the timing: not in the model's slabs
        tmp = WeightSlabs(dev, 0, "profile")
        prep: _Prepared | None = None
        try:
            rng = np.random.default_rng(0)
            feeds = []
            for n in layer.node.inputs:
                if n in offs:
                    info = infos[n]
                    a = (rng.standard_normal(info.shape).astype(info.dtype) if np.issubdtype(info.dtype, np.floating)
                         else np.zeros(info.shape, info.dtype))
                    feeds.append((scratch, offs[n], a))
            dev.upload(feeds)
            prep = self._place(slot, kernel, params, dispatches, pipes,
                               lambda t: (scratch, offs[t], infos[t].nbytes), (scratch, ws_off), slabs=tmp)
            first = self._timed_submit(prep.bound, 1, False)[0]
            warm = float(np.median(self._timed_submit(prep.bound, reps, dev.timestamps)))
            return first, warm
        finally:
            if prep is not None:
                self._release(prep)
            tmp.close()
            dev.free_region(scratch)

    def _timed_submit(self, bound: Sequence[Bound], reps: int, timestamps: bool) -> list[float]:
        """Seconds of each of ``reps`` back-to-back executions of ``bound``: GPU timestamps, else the wall
        clock of the whole submission shared out."""
        dev = self.device
        d = dev.device
        cb = vk.vkAllocateCommandBuffers(d, vk.VkCommandBufferAllocateInfo(
            commandPool=self._cmd_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        qp = None
        try:
            vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
            if timestamps:
                qp = vk.vkCreateQueryPool(d, vk.VkQueryPoolCreateInfo(queryType=vk.VK_QUERY_TYPE_TIMESTAMP,
                                                                      queryCount=reps + 1), None)
                vk.vkCmdResetQueryPool(cb, qp, 0, reps + 1)
            rec = Recorder(cb, qp)
            rec.full_barrier()
            for _ in range(reps):
                if qp is not None:
                    rec.timestamp()
                for b in bound:
                    rec.dispatch(b)
                rec.full_barrier()
            if qp is not None:
                rec.timestamp()
            vk.vkEndCommandBuffer(cb)
            t0 = time.perf_counter()
            dev.submit_and_wait(cb, self._fence)
            wall = time.perf_counter() - t0
            if qp is None:
                return [wall / reps] * reps
            ts = self._timestamps(qp, reps + 1)
            return [(ts[i + 1] - ts[i]) * dev.timestamp_period / 1e9 for i in range(reps)]
        finally:
            if qp is not None:
                vk.vkDestroyQueryPool(d, qp, None)
            vk.vkFreeCommandBuffers(d, self._cmd_pool, 1, [cb])

    def _timestamps(self, qp: Any, n: int) -> list[int]:
        buf = vk.ffi.new("uint64_t[]", n)
        res = vk.lib.vkGetQueryPoolResults(self.device.device, qp, 0, n, 8 * n, buf, 8,
                                           vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
        if res != vk.VK_SUCCESS:
            raise BackendError(f"vkGetQueryPoolResults failed ({res})")
        return [int(buf[i]) for i in range(n)]

    # ------------------------------------------------------------------ segments of the first run
    def _segment(self) -> Recorder:
        """The segment being recorded, started now if there is none (the first with the inputs' prologue,
        later ones behind a barrier on everything submitted before)."""
        if self._seg is None:
            cb = raw.allocate_command_buffer(self.device.device, self._cmd_pool)
            self._seg_cbs.append(cb)
            self._seg = rec = Recorder(cb)
            if len(self._seg_cbs) == 1:
                self.io.prologue(rec)
            else:
                rec.full_barrier()
        return self._seg

    def _submit_segment(self, fence: Any) -> None:
        """Submit the segment being recorded; only the last carries the fence (it signals once every
        earlier submission on the queue has completed too)."""
        assert self._seg is not None
        cb = self._seg.cb
        self._seg = None
        raw.end_command_buffer(cb)
        self.device.submit_buffers([cb], fence)

    def _drop_segments(self, wait: bool) -> None:
        """Free the first run's segment command buffers; ``wait``: some may still execute (a run that
        failed half way), so wait for the queue first."""
        if not self._seg_cbs:
            return
        if wait:
            self.device.wait_idle()
        vk.vkFreeCommandBuffers(self.device.device, self._cmd_pool, len(self._seg_cbs), self._seg_cbs)
        self._seg_cbs = []
        self._seg = None

    # ------------------------------------------------------------------ bookkeeping, teardown
    def _add(self, **kw: float) -> None:
        with self._stats_lock:
            for k, v in kw.items():
                self.load_stats[k] = self.load_stats.get(k, 0) + v

    @contextmanager
    def _working(self) -> Iterator[None]:
        with self._idle:
            self._check_open()
            self._active += 1
        try:
            yield
        finally:
            with self._idle:
                self._active -= 1
                self._idle.notify_all()

    @property
    def closed(self) -> bool:
        """Closed itself, or its device closed under it (at exit)."""
        return self._closed or self.device.closed

    def _check_open(self) -> None:
        if self.closed:
            raise BackendError("this Vulkan model is closed")

    def close(self) -> None:
        with self._idle:
            if self._closed:
                return
            self._closed = True
            # a loader thread may still be preparing a layer of a cancelled load: let it finish first
            self._idle.wait_for(lambda: self._active == 0, timeout=10)
        with self._lock:
            self._free()

    def _free(self) -> None:
        dev = self.device
        if dev.closed or dev.device is None:
            return
        d = dev.device
        signalled = False
        if self._fence is not None:
            try:
                vk.vkWaitForFences(d, 1, [self._fence], vk.VK_TRUE, 10 * 10**9)  # (raises unless signalled)
                signalled = True
            except Exception:
                pass
        if self._seg_cbs:
            dev.wait_idle()  # segments of an interrupted first run may still execute
        for i, p in enumerate(self._prepared):
            if p is not None:
                self._release(p)
                self._prepared[i] = None
        arena = getattr(self, "_descriptors", None)
        if arena is not None:
            arena.destroy()
        slabs = getattr(self, "_slabs", None)
        if slabs is not None:
            slabs.close()
        for h in self._hosts.values():
            h.close()
        self._hosts = {}
        if self._cmd_pool is not None:
            vk.vkDestroyCommandPool(d, self._cmd_pool, None)  # frees every command buffer from it
            self._cmd_pool = None
            self._seg_cbs, self._seg, self._warm_cb, self._warm_submit = [], None, None, None
        if self._fence is not None:
            dev.give_fence(self._fence, signalled)
            self._fence = None
        if self._query_pool is not None:
            vk.vkDestroyQueryPool(d, self._query_pool, None)
            self._query_pool = None
        io = getattr(self, "io", None)
        if io is not None:
            io.free()
        for r in self._regions:
            dev.free_region(r)
        self._regions = []

    def __enter__(self) -> "VulkanColdBackend":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort; close() is the contract
        try:
            if not self._closed and not self.device.closed:
                self.close()
        except Exception:
            pass
