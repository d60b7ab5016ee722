"""Run a graph on a Vulkan device: the pieces every load path shares, and ``VulkanModel``.

A load (``inferd.vulkan.cold.VulkanColdBackend``; each phase timed in ``load_stats``):
  fold      constant subgraphs (and Shape/Size of static shapes) evaluated on the host, touching
            only the constants a folded node reads (``fold_constants``);
  select    per node its candidate Vulkan kernels and the default (forced per node name or op type
            through ``kernels``); a node without a Vulkan kernel fails here with an error naming it
            (no CPU fallback) (``select_nodes``);
  alloc     the activations region laid out by ``inferd.planner.memory`` (lifetime reuse; alias ops
            such as Reshape get no buffer and no dispatch; per-layer workspaces are buffers live for
            their one step), offsets aligned to minStorageBufferOffsetAlignment;
then per layer, concurrently for different layers: the kernel's pure weight transform on the host,
its dispatches, SPIR-V (disk cache, parallel glslang), its pipelines through the device's persistent
pipeline cache, its weights region written in place (host-visible device memory) or through staging,
and its descriptor sets (``resolve_binding``, ``bind_descriptors``). Recording (``Recorder``) puts a
compute->compute barrier only before a dispatch that reads or overwrites a range written (or
overwritten while read) since the last barrier.

``VulkanModel`` prepares every layer at load in batched stages (one SPIR-V pass, one pipeline
batch) and records ONE command buffer. Warm ``run``: copy inputs into mapped memory, one
vkQueueSubmit, one fence wait, copy outputs; the Python work does not depend on the number of layers.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import BackendError, InputError, KernelError, UnsupportedOpError
from ..ir import FOLD_MAX_BYTES, Graph, Node, Overlay, TensorInfo
from ..ops.base import Layer, choose_kernel, kernels_for, op_spec, raw_key, raw_params
from ..planner.memory import MemoryPlan, align_up
from . import raw
from .device import Pipeline, Region, VulkanDevice, descriptor_type, vk
from .kernel import ALIGN, UNUSABLE_PRIORITY, Caps, Dispatch, Ref, VulkanKernel, int_dot_level, split_rows
from .shaders import norm_defines

log = logging.getLogger("inferd.vulkan.executor")

#: Ops whose outputs depend only on static shapes: folded at load even with dynamic inputs.
_SHAPE_OPS = ("Shape", "Size")
#: ``device_priority`` from which a kernel is reference speed: a candidate only where nothing faster applies.
REFERENCE_PRIORITY = 90


def _import_kernels() -> None:
    # host bindings register their kernels on import; they need no Vulkan themselves
    from ..ops import conv_vulkan, eltwise_vulkan, gemm_vulkan, norm_vulkan, pool_vulkan  # noqa: F401
    from ..ops import attention_vulkan, recurrent_vulkan, reduce_vulkan, resize_vulkan, sampling_vulkan  # noqa: F401
    from ..ops import quant_vulkan, tensor_vulkan  # noqa: F401


# ------------------------------------------------------------------------------------ fold, select


def fold_constants(g: Graph) -> tuple[dict[str, np.ndarray], Mapping[str, np.ndarray], list[Node], list[bool]]:
    """Evaluate constant subgraphs (and Shape/Size of static shapes) on the host.

    Returns the folded values, the graph's constants with them (a view that reads a constant only
    when a folded node needs it, so a lazily read weights store stays on disk), the nodes left to
    run, and per graph node whether it folded."""
    _import_kernels()
    folded: dict[str, np.ndarray] = {}
    consts = Overlay(folded, g.constants)
    kept: list[Node] = []
    is_folded: list[bool] = []
    for node in g.nodes:
        spec = op_spec(node.op)
        if spec is None:
            raise UnsupportedOpError(node.op, node.name, g.opset, "not registered")
        dyn = [i for i in node.inputs if i and i not in consts]
        huge = sum(g.infos[o].nbytes for o in node.outputs if o) > FOLD_MAX_BYTES  # left to run, as import left it
        if (not dyn and not huge) or node.op in _SHAPE_OPS:
            ins = [consts[i] if i in consts else np.zeros(g.infos[i].shape, g.infos[i].dtype) if i else None
                   for i in node.inputs]
            for o, a in zip(node.outputs, spec.reference(node, ins)):
                if o:
                    folded[o] = np.asarray(a)
            is_folded.append(True)
            continue
        kept.append(node)
        is_folded.append(False)
    return folded, consts, kept, is_folded


def kernel_caps(dev: VulkanDevice) -> Caps:
    """What the kernels ask of ``dev`` (``VulkanKernel.applies``, ``dispatches``, ``device_priority``)."""
    c = dev.caps
    return Caps(c.subgroup_size, c.max_shared_bytes, c.max_workgroup_invocations, c.max_workgroup_count,
                c.vendor_id, c.device_type, coopmat=bool(dev.features.get("cooperativeMatrixNV")),
                int_dot=int_dot_level(dev.features))


def _applicable(layer: Layer, caps: Caps) -> dict[VulkanKernel, int]:
    """The Vulkan kernels that apply to ``layer``, with their priority on this kind of device."""
    return {k: k.device_priority(caps, layer) for k in kernels_for(layer.op, "vulkan")
            if isinstance(k, VulkanKernel) and k.applies(layer)}


def default_kernel(layer: Layer, caps: Caps, applicable: Mapping[VulkanKernel, int] | None = None) -> VulkanKernel:
    """The applicable Vulkan kernel with the lowest priority on this kind of device (``applicable``: the
    kernels that apply with their priorities, when the caller has them already)."""
    prio = _applicable(layer, caps) if applicable is None else applicable
    if not prio:
        raise KernelError(f"no vulkan kernel applies to node {layer.name!r} ({layer.op})")
    return min(prio, key=prio.__getitem__)


@dataclass(frozen=True)
class NodeChoice:
    """A node left to run: its layer, the kernels a planner may choose, the default (None: an alias op,
    a view of its input with no buffer and no dispatch)."""

    layer: Layer
    kernels: tuple[VulkanKernel, ...]
    default: VulkanKernel | None


_IO_DTYPES: dict[int, frozenset[np.dtype]] = {}


def _misfit(layer: Layer, kernel: VulkanKernel, consts: Mapping[str, Any]) -> str | None:
    """Why ``kernel`` cannot run ``layer`` although it applies to its shapes and attributes: a device tensor of a
    dtype it does not handle, or a constant input's value it refuses (``VulkanKernel.refuses``); None if it can."""
    ok = _IO_DTYPES.get(id(kernel))
    if ok is None:  # dtype objects, not names: ``dtype.name`` is a Python property, asked per tensor per kernel
        ok = _IO_DTYPES[id(kernel)] = frozenset(np.dtype(n) for n in kernel.io_dtypes)
    for tname, info in (*zip(layer.node.inputs, layer.inputs), *((t.name, t) for t in layer.outputs)):
        if tname and tname not in consts and info is not None and info.dtype not in ok:
            return (f"tensor {tname!r} has dtype {np.dtype(info.dtype)}; kernel {kernel.name} handles "
                    f"{list(kernel.io_dtypes)} (the Vulkan backend stores float32 tensors, plus int64/bool where a "
                    f"kernel produces or reads them)")
    why = kernel.refuses(layer, consts)
    return f"kernel {kernel.name}: {why}" if why else None


def _check_dtypes(layer: Layer, kernel: VulkanKernel, consts: Mapping[str, Any]) -> None:
    bad = _misfit(layer, kernel, consts)
    if bad is not None:
        raise BackendError(f"node {layer.name} ({layer.op}): {bad}")


def select_nodes(g: Graph, pg: Graph, caps: Caps, forced: Mapping[str, str],
                 planned: Mapping[str, Sequence[str]] | None = None) -> list[NodeChoice]:
    """Per node of the folded graph ``pg``: alias, or its candidate kernels and default. A kernel forced by
    node name or op type must apply to every node it names (``KernelError``); unforced nodes get every
    applicable kernel usable on this device, reference-speed ones only where nothing faster applies.
    ``planned`` (node name -> kernel names, the first the default): a stored plan's kernels for its node, the
    only candidates then. Asking every kernel whether it applies costs ~0.3 ms a node in Python, on the way
    to a cold answer, for choices the plan made already (for this device: its fingerprint is checked)."""
    _import_kernels()
    consts = pg.constants
    consumed = set(pg.consumers()) | {t.name for t in g.outputs}
    out: list[NodeChoice] = []
    missing: list[Node] = []
    for node in pg.nodes:
        spec = op_spec(node.op)
        layer = Layer.of(node, pg)
        src = node.inputs[0] if node.inputs else ""
        if spec is not None and spec.alias and src and src not in consts:
            extra = [o for o in node.outputs[1:] if o and o in consumed]
            if extra:
                raise BackendError(f"node {node.name} ({node.op}): secondary outputs {extra} of an alias op are not supported")
            if g.infos[node.outputs[0]].nbytes != g.infos[src].nbytes:
                raise BackendError(f"alias node {node.name} ({node.op}) changes the byte size "
                                   f"({g.infos[src].nbytes} -> {g.infos[node.outputs[0]].nbytes})")
            out.append(NodeChoice(layer, (), None))
            continue
        if not kernels_for(node.op, "vulkan"):
            missing.append(node)
            out.append(NodeChoice(layer, (), None))
            continue
        want = forced.get(node.name, forced.get(node.op))
        names = planned.get(node.name) if planned is not None and want is None else None
        if names:
            # by name, not asked whether they apply: the plan chose them for this node on this device
            ks = tuple(dict.fromkeys(choose_kernel(layer, "vulkan", n, check=False) for n in names))
            assert all(isinstance(k, VulkanKernel) for k in ks)
            _check_dtypes(layer, ks[0], consts)  # type: ignore[arg-type]
            out.append(NodeChoice(layer, ks, ks[0]))  # type: ignore[arg-type]
            continue
        if want is not None:
            k = choose_kernel(layer, "vulkan", want)
            assert isinstance(k, VulkanKernel)
            _check_dtypes(layer, k, consts)
            out.append(NodeChoice(layer, (k,), k))
            continue
        prio = _applicable(layer, caps)
        try:
            default = default_kernel(layer, caps, prio)
        except KernelError:
            raise UnsupportedOpError(node.op, node.name, g.opset,
                                     "no Vulkan kernel applies to these attributes/shapes "
                                     f"(inputs {[i.shape if i else None for i in layer.inputs]}, attrs "
                                     f"{ {k: v for k, v in node.attrs.items() if not isinstance(v, np.ndarray)} })") from None
        _check_dtypes(layer, default, consts)
        ok = [k for k, p in prio.items() if p < UNUSABLE_PRIORITY and _misfit(layer, k, consts) is None]
        fast = [k for k in ok if prio[k] < REFERENCE_PRIORITY]
        cands = sorted(fast or ok, key=prio.__getitem__)
        if default not in cands:
            cands = [default] + cands
        out.append(NodeChoice(layer, tuple(cands), default))
    if missing:
        names = ", ".join(f"{n.op} (node {n.name!r})" for n in missing[:10])
        raise UnsupportedOpError(missing[0].op, missing[0].name, g.opset,
                                 f"the Vulkan backend has no kernel for: {names}"
                                 + (f" and {len(missing) - 10} more" if len(missing) > 10 else ""))
    return out


# ------------------------------------------------------------------------------------ binding

@dataclass
class Bound:
    """One dispatch ready to record: its pipeline, the (region, offset, size) of every binding, the packed
    push constants and (once ``bind_descriptors`` ran) its descriptor set, as the one-element array
    ``vkCmdBindDescriptorSets`` takes."""

    pos: int
    layer: Layer
    kernel: VulkanKernel
    dispatch: Dispatch
    pipeline: Pipeline
    ranges: list[tuple[Region, int, int]]
    push: bytes
    dset: Any = None


#: Where an activation tensor lives: name -> (region, byte offset, bytes).
Locate = Callable[[str], tuple[Region, int, int]]


def resolve_binding(dev: VulkanDevice, layer: Layer, kernel: VulkanKernel, ref: Ref, where: str,
                    consts: Mapping[str, Any], locate: Locate, ws: tuple[Region, int] | None,
                    params: Mapping[str, np.ndarray], weights: Mapping[str, tuple[Region, int]]
                    ) -> tuple[Region, int, int]:
    """(region, offset, size) of one binding: an activation, a weights array, or a workspace part."""
    node = layer.node
    if ref.kind in ("in", "out"):
        names = node.inputs if ref.kind == "in" else node.outputs
        assert isinstance(ref.key, int)
        if ref.key >= len(names) or not names[ref.key]:
            raise BackendError(f"{where}: binding {ref} names an absent tensor")
        tname = names[ref.key]
        if tname in consts:
            ref = Ref("param", raw_key(ref.key), ref.offset, ref.size)
        else:
            region, off, size = locate(tname)
    if ref.kind == "param":
        key = str(ref.key)
        if key not in weights:
            raise BackendError(f"{where}: binding {ref} names no array of the kernel's transform (has {sorted(params)})")
        region, off = weights[key]
        size = params[key].nbytes
    elif ref.kind == "ws":
        parts = kernel.workspace_parts(layer)
        if ref.key not in parts or ws is None:
            raise BackendError(f"{where}: binding {ref} names no workspace part (has {sorted(parts)})")
        region, off = ws
        for name, n in parts.items():
            if name == ref.key:
                size = n
                break
            off += align_up(n, ALIGN)
    elif ref.kind not in ("in", "out"):
        raise BackendError(f"{where}: unknown binding kind {ref.kind!r}")
    off += ref.offset
    size = (size - ref.offset) if ref.size is None else ref.size
    # whole 32-bit words: shaders address bool tensors a word at a time (buffers are 64-byte aligned)
    size = max(align_up(size, 4), 4)
    caps = dev.caps
    if off % caps.min_storage_align:
        raise BackendError(f"{where}: binding {ref} at offset {off} is not aligned to {caps.min_storage_align}")
    if size > caps.max_storage_range:
        raise BackendError(f"{where}: binding {ref} spans {size} bytes, more than the device's "
                           f"maxStorageBufferRange {caps.max_storage_range}")
    if off + size > region.size:
        raise BackendError(f"{where}: binding {ref} ({off}+{size}) overruns region {region.label} ({region.size})")
    return region, off, size


def bind_dispatches(dev: VulkanDevice, pos: int, layer: Layer, kernel: VulkanKernel, dispatches: Sequence[Dispatch],
                    pipes: Sequence[Pipeline], consts: Mapping[str, Any], locate: Locate,
                    ws: tuple[Region, int] | None, params: Mapping[str, np.ndarray],
                    weights: Mapping[str, tuple[Region, int]]) -> list[Bound]:
    """Each dispatch of layer ``pos`` with its pipeline, every binding resolved (``resolve_binding``) and its
    push constants packed: what ``bind_descriptors`` and a ``Recorder`` take."""
    out = []
    for d, pipe in zip(dispatches, pipes):
        man = pipe.module.manifest
        where = f"node {layer.name} ({layer.op}, kernel {kernel.name}, shader {d.shader})"
        if len(d.bindings) != len(man.bindings):
            raise BackendError(f"{where}: {len(d.bindings)} bindings given, shader declares {len(man.bindings)}")
        ranges = [resolve_binding(dev, layer, kernel, ref, where, consts, locate, ws, params, weights)
                  for ref in d.bindings]
        for gcount, lim in zip(d.groups, dev.caps.max_workgroup_count):
            if not 1 <= gcount <= lim:
                raise BackendError(f"{where}: workgroup count {d.groups} outside 1..{dev.caps.max_workgroup_count}")
        out.append(Bound(pos, layer, kernel, d, pipe, ranges, man.pack_push(d.push, where)))
    return out


def copy_in_place(d: Dispatch, ranges: Sequence[tuple[Region, int, int]]) -> bool:
    """Whether ``d`` is a strided copy (``copy.comp``, bindings source then destination) of a range onto
    itself: the memory plan put a Concat's part where its producer writes it, or a Split's part or a one-index
    Gather's output where it lies in its input (``arena.plan_activations``). Such a dispatch is left out: it would
    move nothing."""
    if d.shader != "copy" or d.defines.get("Q8") or len(ranges) != 2:
        return False
    (rs, os_, _), (rd, od, _) = ranges
    p = d.push
    # 32-bit elements on both sides, the same strides: every element is copied to where it already is
    return rs is rd and tuple(p["ss"]) == tuple(p["ds"]) and os_ + 4 * int(p["sbase"]) == od + 4 * int(p["dbase"])


def texel_view(dev: VulkanDevice, r: Region, off: int, size: int, half: bool = False) -> Any:
    """An RGBA32F view of a bound range (RGBA16F with ``half``: fp16 weights) in whole texels (a trailing
    partial texel is included when the region extends that far, else dropped; kernels never use the bytes
    past the tensor)."""
    if off % dev.min_texel_align:
        raise BackendError(f"texel view at offset {off} is not aligned to {dev.min_texel_align}")
    t = 8 if half else 16
    n = align_up(size, t)
    if off + n > r.size:
        n = size // t * t
    n = max(t, min(n, t * dev.max_texel_elements))
    fmt = vk.VK_FORMAT_R16G16B16A16_SFLOAT if half else vk.VK_FORMAT_R32G32B32A32_SFLOAT
    return raw.create_buffer_view(dev.device, r.buffer, fmt, off, n)


class _DescriptorPool:
    __slots__ = ("handle", "sets_left", "left", "live")

    def __init__(self, handle: Any, sets: int, sizes: Mapping[int, int]) -> None:
        self.handle, self.sets_left, self.left, self.live = handle, sets, dict(sizes), 0


@dataclass
class DescriptorLease:
    """Descriptor sets taken from one pool of a ``DescriptorArena`` (given back by ``DescriptorArena.free``)."""

    pool: _DescriptorPool
    sets: list[Any]


class DescriptorArena:
    """One model's descriptor sets, from a few large pools instead of a pool per layer.

    Why: creating a pool, then its sets, cost 45 us a layer on lavapipe (38 layers of squeezenet1_1 a cold
    load) under the GIL the loader threads share. The arena counts what each pool has left itself: a driver
    may let an over-full pool allocate (the spec allows either), which would be undefined. A freed set's
    descriptors are not counted back (the pool may be fragmented): a pool goes once all its sets are freed."""

    SETS = 256
    PER_TYPE = 1024

    def __init__(self, dev: VulkanDevice) -> None:
        self.dev = dev
        self._lock = threading.Lock()  # a pool's allocations are externally synchronised
        self._pools: list[_DescriptorPool] = []

    def allocate(self, layouts: Sequence[Any], counts: Mapping[int, int]) -> DescriptorLease:
        """A set per layout of ``layouts``, which together hold ``counts`` (descriptor type -> descriptors)."""
        n = len(layouts)
        with self._lock:
            pool = next((p for p in reversed(self._pools) if p.sets_left >= n
                         and all(p.left.get(t, 0) >= c for t, c in counts.items())), None)
            if pool is None:
                types = {descriptor_type(k) for k in ("buffer", "texel", "image")} | set(counts)
                sizes = {t: max(self.PER_TYPE, counts.get(t, 0)) for t in sorted(types)}
                handle = raw.create_descriptor_pool(self.dev.device, list(sizes.items()), max(self.SETS, n),
                                                    free_sets=True)
                pool = _DescriptorPool(handle, max(self.SETS, n), sizes)
                self._pools.append(pool)
            sets = raw.allocate_descriptor_sets(self.dev.device, pool.handle, layouts)
            pool.sets_left -= n
            for t, c in counts.items():
                pool.left[t] -= c
            pool.live += n
        return DescriptorLease(pool, sets)

    def free(self, lease: DescriptorLease) -> None:
        with self._lock:
            pool = lease.pool
            if pool not in self._pools:
                return
            pool.live -= len(lease.sets)
            if pool.live <= 0:
                raw.destroy_descriptor_pool(self.dev.device, pool.handle)
                self._pools.remove(pool)
            else:
                raw.free_descriptor_sets(self.dev.device, pool.handle, lease.sets)
            lease.sets = []

    def destroy(self) -> None:
        with self._lock:
            for p in self._pools:
                raw.destroy_descriptor_pool(self.dev.device, p.handle)
            self._pools = []

    @property
    def pools(self) -> int:
        return len(self._pools)


def bind_descriptors(dev: VulkanDevice, bound: Sequence[Bound], views: list[Any],
                     arena: DescriptorArena) -> DescriptorLease | None:
    """A descriptor set per dispatch of ``bound`` from ``arena``, written in one update call (texel views it
    creates are appended to ``views``). None when ``bound`` is empty."""
    if not bound:
        return None
    d = dev.device
    kinds = [b.pipeline.module.manifest.kinds for b in bound]
    counts: dict[int, int] = {}
    for ks in kinds:
        for kd in ks:
            t = descriptor_type(kd)
            counts[t] = counts.get(t, 0) + 1
    lease = arena.allocate([b.pipeline.set_layout for b in bound], counts)
    sets = lease.sets
    writes: list[raw.Write] = []
    for b, ks, s in zip(bound, kinds, sets):
        b.dset = s
        # one write covers each run of consecutive bindings of the same kind
        i = 0
        while i < len(b.ranges):
            j = i
            while j < len(b.ranges) and ks[j] == ks[i]:
                j += 1
            if ks[i] in ("texel", "image", "image16"):
                vs = [texel_view(dev, r, off, size, ks[i] == "image16") for r, off, size in b.ranges[i:j]]
                views += vs
                writes.append((s, i, descriptor_type(ks[i]), None, vs))
            else:
                writes.append((s, i, descriptor_type(ks[i]), [(r.buffer, off, size) for r, off, size in b.ranges[i:j]],
                               None))
            i = j
    raw.update_descriptor_sets(d, writes)
    return lease


# ------------------------------------------------------------------------------------ recording

class Recorder:
    """Records dispatches into one command buffer, with a barrier only where a dispatch reads or
    overwrites a range written (or overwritten while read) since the last barrier. ``query_pool``:
    a GPU timestamp after every dispatch when ``per_dispatch``, else where ``timestamp`` is called."""

    def __init__(self, cb: Any, query_pool: Any = None, per_dispatch: bool = False) -> None:
        self.cb = cb
        self.qp = query_pool
        self.per_dispatch = per_dispatch
        self.query = 0
        self.barriers = 0
        self.count = 0
        # ranges written / read since the last barrier, tagged with the layer when the dispatch is independent
        self._pend_w: list[tuple[Region, int, int, int]] = []
        self._pend_r: list[tuple[Region, int, int, int]] = []
        self._pipe: Pipeline | None = None

    def full_barrier(self) -> None:
        """Orders what follows after every shader write before it, also those of earlier submissions
        (WAW/WAR on reused buffers across runs and across the cold run's segments)."""
        raw.cmd_memory_barrier(self.cb)
        self._pend_w, self._pend_r = [], []

    def copy(self, src: Any, dst: Any, regions: Sequence[tuple[int, int, int]]) -> None:
        """Copy ranges (source offset, destination offset, bytes) of buffer ``src`` to ``dst``, ordered after
        everything recorded before and before everything after, shaders and transfers alike (a barrier on each
        side, every stage): a streamed model's arena mirror. Counted as work to submit."""
        allc = vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT
        rw = (vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_READ_BIT
              | vk.VK_ACCESS_TRANSFER_WRITE_BIT)
        bar = [vk.VkMemoryBarrier(srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT,
                                  dstAccessMask=rw)]
        vk.vkCmdPipelineBarrier(self.cb, allc, allc, 0, 1, bar, 0, None, 0, None)
        vk.vkCmdCopyBuffer(self.cb, src, dst, len(regions),
                           [vk.VkBufferCopy(srcOffset=a, dstOffset=b, size=n) for a, b, n in regions])
        vk.vkCmdPipelineBarrier(self.cb, allc, allc, 0, 1, bar, 0, None, 0, None)
        self._pend_w, self._pend_r = [], []  # the barrier above orders everything recorded so far
        self.count += 1

    def timestamp(self) -> None:
        vk.vkCmdWriteTimestamp(self.cb, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, self.qp, self.query)
        self.query += 1

    @staticmethod
    def _overlaps(a: tuple[Region, int, int], lst: list[tuple[Region, int, int, int]], skip: int) -> bool:
        r, o, n = a
        return any(r is r2 and o < o2 + n2 and o2 < o + n and tag != skip for r2, o2, n2, tag in lst)

    def dispatch(self, b: Bound) -> None:
        cb = self.cb
        man = b.pipeline.module.manifest
        rgs = b.ranges
        reads = [rgs[i] for i in man.read_idx]
        writes = [rgs[i] for i in man.write_idx]
        # entries tagged 0 are never skipped; an independent dispatch ignores its own layer's ranges
        skip = b.pos + 1 if b.dispatch.independent else -1
        tag = b.pos + 1 if b.dispatch.independent else 0
        ov = self._overlaps
        if (any(ov(r, self._pend_w, skip) for r in reads)
                or any(ov(w, self._pend_w, skip) or ov(w, self._pend_r, skip) for w in writes)):
            # one global memory barrier, not per-range buffer barriers: the same order (a superset of the
            # ranges), what NVIDIA's and Mesa's drivers do with buffer barriers anyway, and one prebuilt struct
            # where the ranges' merge and structs cost ~15 us a barrier (nearly every dispatch of a CNN has one)
            raw.cmd_memory_barrier(cb)
            self.barriers += 1
            self._pend_w, self._pend_r = [], []
        self._pend_r += [(*r, tag) for r in reads]
        self._pend_w += [(*w, tag) for w in writes]
        if b.pipeline is not self._pipe:
            raw.cmd_bind_pipeline(cb, b.pipeline.handle)
            self._pipe = b.pipeline
        raw.cmd_dispatch(cb, b.pipeline.layout, b.dset, b.push, b.dispatch.groups)
        self.count += 1
        if self.qp is not None and self.per_dispatch:
            self.timestamp()


def merge_ranges(ranges: Sequence[tuple[Region, int, int]]) -> list[tuple[Region, int, int]]:
    """Coalesce overlapping/adjacent byte ranges per region (fewer barrier structs)."""
    out: list[tuple[Region, int, int]] = []
    by: dict[int, list[tuple[int, int]]] = {}
    regs: dict[int, Region] = {}
    for r, o, n in ranges:
        by.setdefault(id(r), []).append((o, o + n))
        regs[id(r)] = r
    for rid, lst in by.items():
        lst.sort()
        lo, hi = lst[0]
        for a, b in lst[1:]:
            if a <= hi:
                hi = max(hi, b)
            else:
                out.append((regs[rid], lo, hi - lo))
                lo, hi = a, b
        out.append((regs[rid], lo, hi - lo))
    return out


class HostIO:
    """Where the host writes inputs and reads outputs: views into the mapped activations, or an IO
    staging region that the command buffer copies in (``prologue``) and out (``epilogue``)."""

    def __init__(self, dev: VulkanDevice, graph: Graph, consts: Mapping[str, np.ndarray], plan: MemoryPlan,
                 act: Region) -> None:
        self.dev = dev
        self.graph = graph
        self.act = act
        self.inputs: list[tuple[TensorInfo, int]] = [(t, plan.offset(t.name)) for t in graph.inputs if t.name not in consts]
        self.outputs: list[tuple[TensorInfo, int]] = []
        self.const_outputs: dict[str, np.ndarray] = {}
        for t in graph.outputs:
            if t.name in consts:
                self.const_outputs[t.name] = np.asarray(consts[t.name])
            else:
                self.outputs.append((t, plan.offset(t.name)))
        # any numeric or bool dtype crosses as bytes: a node that reads or writes it runs on the device only when
        # its kernel handles that dtype (``_misfit``), on the host otherwise (an int32 token-id input that Keras'
        # Embedding clips and gathers with, a uint8 image cast to float; bfloat16 is ml_dtypes', of kind "V")
        for t, _ in self.inputs + self.outputs:
            if np.dtype(t.dtype).kind not in "biufc" and np.dtype(t.dtype).name != "bfloat16":
                raise BackendError(f"graph input/output {t.name!r} has dtype {np.dtype(t.dtype)}; the Vulkan backend "
                                   f"takes numeric and bool tensors")
        # outputs are read through a host-cached staging copy unless the activations themselves are host-cached:
        # reading a discrete GPU's mapped BAR directly ran at ~100 MB/s (a 1.4 MB detector output: 40 ms on an H100)
        self.staging = act.mapped is None or not act.cached
        self.own: Region | None = None
        self._copies_in: list[tuple[int, int, int]] = []  # (source offset, destination offset, bytes)
        self._copies_out: list[tuple[int, int, int]] = []
        if self.staging:
            pos = 0
            layout = []
            for t, _off in self.inputs + self.outputs:
                layout.append(pos)
                pos += align_up(t.nbytes, 64)
            self.own = self.region = dev.allocate_region(max(pos, 64), "io-staging", host=True)
            nin = len(self.inputs)
            self.in_views = [(t, self.region.view(p, t.shape, t.dtype)) for (t, _), p in zip(self.inputs, layout)]
            self.out_views = [(t, self.region.view(p, t.shape, t.dtype)) for (t, _), p in zip(self.outputs, layout[nin:])]
            self._copies_in = [(p, off, t.nbytes) for (t, off), p in zip(self.inputs, layout) if t.nbytes]
            self._copies_out = [(off, p, t.nbytes) for (t, off), p in zip(self.outputs, layout[nin:]) if t.nbytes]
        else:
            self.region = act
            self.in_views = [(t, act.view(off, t.shape, t.dtype)) for t, off in self.inputs]
            self.out_views = [(t, act.view(off, t.shape, t.dtype)) for t, off in self.outputs]
        self._names = {t.name for t, _ in self.in_views}

    def prologue(self, rec: Recorder) -> None:
        """Inputs into place (staging), else order this submission after the previous one's shader writes."""
        if self.staging and self._copies_in:
            cb = rec.cb
            raw.cmd_copy_buffer(cb, self.region.buffer, self.act.buffer, self._copies_in)
            raw.cmd_barrier(cb, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                            vk.VK_ACCESS_TRANSFER_WRITE_BIT,
                            vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT)
        else:
            rec.full_barrier()

    def epilogue(self, rec: Recorder) -> None:
        """Make the outputs visible to the host (through the staging copy-out when there is one)."""
        cb = rec.cb
        compute = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
        sw = vk.VK_ACCESS_SHADER_WRITE_BIT
        outs = [(self.act, off, t.nbytes) for t, off in self.outputs if t.nbytes]
        if not outs:
            return
        if self.staging:
            raw.cmd_barrier(cb, compute, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, sw, vk.VK_ACCESS_TRANSFER_READ_BIT)
            raw.cmd_copy_buffer(cb, self.act.buffer, self.region.buffer, self._copies_out)
            raw.cmd_barrier(cb, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, vk.VK_PIPELINE_STAGE_HOST_BIT,
                            vk.VK_ACCESS_TRANSFER_WRITE_BIT, vk.VK_ACCESS_HOST_READ_BIT)
        else:
            bars = [vk.VkBufferMemoryBarrier(srcAccessMask=sw, dstAccessMask=vk.VK_ACCESS_HOST_READ_BIT,
                                             srcQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED,
                                             dstQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED,
                                             buffer=r.buffer, offset=o, size=n) for r, o, n in merge_ranges(outs)]
            vk.vkCmdPipelineBarrier(cb, compute, vk.VK_PIPELINE_STAGE_HOST_BIT, 0, 0, None, len(bars), bars, 0, None)

    def free(self) -> None:
        """Drop the host views (they point into mapped memory about to be freed) and the staging region."""
        self.in_views, self.out_views = [], []
        if self.own is not None:
            self.dev.free_region(self.own)
            self.own = None

    def write(self, feeds: Mapping[str, np.ndarray]) -> None:
        if set(feeds) != self._names:
            raise InputError(f"expected inputs {sorted(self._names)}, got {sorted(feeds)}")
        for t, view in self.in_views:
            a = np.asarray(feeds[t.name])
            if tuple(a.shape) != tuple(t.shape):
                raise InputError(f"input {t.name!r}: expected shape {tuple(t.shape)}, got {tuple(a.shape)}")
            if a.dtype != t.dtype:
                raise InputError(f"input {t.name!r}: expected dtype {np.dtype(t.dtype)}, got {a.dtype}")
            np.copyto(view, a)
        if not self.region.coherent:
            self.dev.flush(self.region)

    def read(self) -> dict[str, np.ndarray]:
        if not self.region.coherent:
            self.dev.invalidate(self.region)
        out = {t.name: view.copy() for t, view in self.out_views}
        for name, a in self.const_outputs.items():
            out[name] = a.copy()
        return {t.name: out[t.name] for t in self.graph.outputs}


# ------------------------------------------------------------------------------------ VulkanModel

def shader_variants(graph: Graph, caps: Caps | None = None, kernels: Mapping[str, str] | None = None
                    ) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    """Every (shader, defines) variant ``graph``'s default kernels need on a device like ``caps`` (to
    precompile SPIR-V)."""
    caps = caps or Caps()
    _, consts, kept, _ = fold_constants(graph)
    pg = Graph(graph.name, kept, graph.inputs, graph.outputs, consts, graph.infos, graph.opset)  # type: ignore[arg-type]
    out: list[tuple[str, tuple[tuple[str, str], ...]]] = []
    for c in select_nodes(graph, pg, caps, kernels or {}):
        if c.default is None:
            continue
        raw = raw_params(c.layer, consts)
        ds = split_rows(c.default.dispatches(c.layer, c.default.transform(c.layer, raw), caps), caps)
        out += [(d.shader, norm_defines(d.defines)) for d in ds]
    return list(dict.fromkeys(out))
