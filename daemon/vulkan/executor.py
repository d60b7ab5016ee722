"""Run a graph on a Vulkan device: everything prepared at load, one submit per inference.

Load (each phase timed separately in ``load_stats`` for cold-start measurements):
  fold      constant subgraphs (and Shape/Size of static shapes) evaluated on the host;
  select    one Vulkan kernel per node (forced per node name or op type through ``kernels``);
            a node without a Vulkan kernel fails here with an error naming it (no CPU fallback);
  transform each kernel's pure weight transform, once, on the host;
  compile   GLSL -> SPIR-V for every (shader, defines) variant (disk cache, parallel glslang);
  pipelines one vkCreateComputePipelines batch through the device's persistent pipeline cache;
  alloc     the static arena: a weights region (own allocations, bump-placed at 256-byte alignment)
            and an activations region laid out by ``inferd.planner.memory`` (lifetime reuse; alias
            ops such as Reshape get no buffer and no dispatch; per-layer workspaces are buffers
            live for their one step), offsets aligned to minStorageBufferOffsetAlignment;
  upload    weights written in place (host-visible device memory) or through staging;
  record    descriptor sets (one pool, one allocation, one update call) and ONE command buffer
            holding every dispatch, with a compute->compute barrier only before a dispatch that
            reads or overwrites a range written (or overwritten while read) since the last barrier.

Warm ``run``: copy inputs into mapped memory, one vkQueueSubmit, one fence wait, copy outputs.
The Python work does not depend on the number of layers.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import BackendError, InputError, KernelError, UnsupportedOpError
from ..ir import Graph, Node, TensorInfo
from ..ops.base import Layer, choose_kernel, kernels_for, op_spec, raw_key
from ..planner.memory import align_up
from .arena import plan_arena, workspace_name
from .device import Region, VulkanDevice, binding_kinds, descriptor_type, get_device, vk
from .kernel import ALIGN, Caps, Dispatch, Ref, VulkanKernel
from .shaders import ShaderCache, norm_defines

log = logging.getLogger("inferd.vulkan.executor")

#: Ops whose outputs depend only on static shapes: folded at load even with dynamic inputs.
_SHAPE_OPS = ("Shape", "Size")


def _import_kernels() -> None:
    # host bindings register their kernels on import; they need no Vulkan themselves
    from ..ops import conv_vulkan, eltwise_vulkan, gemm_vulkan, norm_vulkan, pool_vulkan  # noqa: F401
    from ..ops import reduce_vulkan, resize_vulkan, tensor_vulkan  # noqa: F401


@dataclass
class _Step:
    layer: Layer
    kernel: VulkanKernel
    dispatches: list[Dispatch]
    params: dict[str, np.ndarray]


@dataclass
class _Bound:
    step: _Step
    dispatch: Dispatch
    pipeline: Any
    ranges: list[tuple[Region, int, int]]  # (region, offset, size) per binding
    push: bytes


def plan_graph(g: Graph, caps: Caps, forced: Mapping[str, str], st: dict[str, Any]
               ) -> tuple[dict[str, np.ndarray], Graph, list[_Step | None]]:
    """Fold, select kernels, transform weights and describe dispatches: everything that needs no device."""
    _import_kernels()
    T = time.perf_counter
    t = T()
    consts: dict[str, np.ndarray] = dict(g.constants)
    kept: list[Node] = []
    for node in g.nodes:
        spec = op_spec(node.op)
        if spec is None:
            raise UnsupportedOpError(node.op, node.name, g.opset, "not registered")
        dyn = [i for i in node.inputs if i and i not in consts]
        if not dyn or node.op in _SHAPE_OPS:
            ins = [consts[i] if i in consts else np.zeros(g.infos[i].shape, g.infos[i].dtype) if i else None
                   for i in node.inputs]
            outs = spec.reference(node, ins)
            for o, a in zip(node.outputs, outs):
                if o:
                    consts[o] = np.asarray(a)
            continue
        kept.append(node)
    pg = Graph(g.name, kept, g.inputs, g.outputs, consts, g.infos, g.opset)
    st["fold_s"] = T() - t

    # -- kernel selection
    t = T()
    steps: list[_Step | None] = []
    missing: list[Node] = []
    consumed = set(pg.consumers()) | {t.name for t in g.outputs}
    for node in kept:
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
            steps.append(None)
            continue
        want = forced.get(node.name, forced.get(node.op))
        if not kernels_for(node.op, "vulkan"):
            missing.append(node)
            steps.append(None)
            continue
        try:
            kern = choose_kernel(layer, "vulkan", want) if want is not None else default_kernel(layer, caps)
        except KernelError:
            if want is not None:
                raise
            raise UnsupportedOpError(node.op, node.name, g.opset,
                                     "no Vulkan kernel applies to these attributes/shapes "
                                     f"(inputs {[i.shape if i else None for i in layer.inputs]}, attrs "
                                     f"{ {k: v for k, v in node.attrs.items() if not isinstance(v, np.ndarray)} })") from None
        assert isinstance(kern, VulkanKernel)
        steps.append(_Step(layer, kern, [], {}))
    if missing:
        names = ", ".join(f"{n.op} (node {n.name!r})" for n in missing[:10])
        raise UnsupportedOpError(missing[0].op, missing[0].name, g.opset,
                                 f"the Vulkan backend has no kernel for: {names}"
                                 + (f" and {len(missing) - 10} more" if len(missing) > 10 else ""))
    for node, s in zip(kept, steps):
        if s is None:
            continue
        for tname in list(node.inputs) + list(node.outputs):
            dt = np.dtype(g.infos[tname].dtype) if tname else None
            if tname and tname not in consts and dt.name not in s.kernel.io_dtypes:
                raise BackendError(f"node {node.name} ({node.op}): tensor {tname!r} has dtype {dt}; kernel "
                                   f"{s.kernel.name} handles {list(s.kernel.io_dtypes)} (the Vulkan backend stores "
                                   f"float32 tensors, plus int64/bool where a kernel produces or reads them)")
    st["select_s"] = T() - t

    # -- weight transforms
    t = T()
    for s in steps:
        if s is None:
            continue
        raw = {raw_key(k): consts[s.layer.node.inputs[k]] for k in s.layer.const_inputs}
        s.params = s.kernel.transform(s.layer, raw)
        s.dispatches = s.kernel.dispatches(s.layer, s.params, caps)
    st["transform_s"] = T() - t
    return consts, pg, steps


def default_kernel(layer: Layer, caps: Caps) -> VulkanKernel:
    """The applicable Vulkan kernel with the lowest priority on this kind of device."""
    cands = [k for k in kernels_for(layer.op, "vulkan") if isinstance(k, VulkanKernel) and k.applies(layer)]
    if not cands:
        raise KernelError(f"no vulkan kernel applies to node {layer.name!r} ({layer.op})")
    return min(cands, key=lambda k: k.device_priority(caps, layer))


class VulkanModel:
    """A graph loaded on a Vulkan device. ``run(feeds) -> outputs``; ``close()`` frees it."""

    def __init__(self, graph: Graph, device: VulkanDevice | None = None, kernels: Mapping[str, str] | None = None,
                 cache: ShaderCache | str | bool | None = None, profile: bool = False) -> None:
        _import_kernels()
        self.device = dev = device or get_device()
        if dev.closed:
            raise BackendError("the Vulkan device is closed")
        self.graph = graph
        self._lock = threading.Lock()
        self._closed = False
        self._regions: list[Region] = []
        self._desc_pool = None
        self._cmd_pool = None
        self._fence = None
        self._query_pool = None
        self._views: list[Any] = []
        self.profile = bool(profile) and dev.timestamps
        self.load_stats: dict[str, Any] = {}
        self.first_run_done = False
        if cache is None or cache is True:
            self.shader_cache = dev.shader_cache
        elif cache is False:
            self.shader_cache = ShaderCache(None)
        elif isinstance(cache, ShaderCache):
            self.shader_cache = cache
        else:
            self.shader_cache = ShaderCache(cache)
        caps = dev.caps
        self.caps = Caps(caps.subgroup_size, caps.max_shared_bytes, caps.max_workgroup_invocations,
                         caps.max_workgroup_count, caps.vendor_id, caps.device_type)
        try:
            self._load(kernels or {})
        except BaseException:
            self._free()
            raise
        dev.register_model(self)

    # ------------------------------------------------------------------------------------ load
    def _load(self, forced: Mapping[str, str]) -> None:
        st = self.load_stats
        T = time.perf_counter
        t_all = T()
        self._consts, self._pg, self._steps = consts, pg, steps = plan_graph(self.graph, self.caps, forced, st)

        # -- SPIR-V
        t = T()
        sc = self.shader_cache
        before = (sc.compiled, sc.disk_hits)
        variants = [(d.shader, norm_defines(d.defines)) for s in steps if s for d in s.dispatches]
        mods = dict(zip(variants, sc.get_many(variants))) if variants else {}
        st["shader_compile_s"] = T() - t
        st["shaders_compiled"] = sc.compiled - before[0]
        st["shaders_from_disk"] = sc.disk_hits - before[1]
        st["shader_variants"] = len(set(variants))

        # -- pipelines
        t = T()
        reqs = [(mods[(d.shader, norm_defines(d.defines))], dict(d.spec)) for s in steps if s for d in s.dispatches]
        created0 = self.device.stats["pipelines_created"]
        hits0 = self.device.stats["pipeline_cache_hits"]
        pipes = self.device.pipelines(reqs) if reqs else []
        st["pipeline_create_s"] = T() - t
        st["pipelines_created"] = self.device.stats["pipelines_created"] - created0
        st["pipeline_cache_hits"] = self.device.stats["pipeline_cache_hits"] - hits0
        st["pipelines"] = len({id(p) for p in pipes})

        # -- arena
        t = T()
        dev = self.device
        a_align = max(64, dev.caps.min_storage_align)
        workspaces = [(i, s.layer.name, s.kernel.workspace_nbytes(s.layer)) for i, s in enumerate(steps) if s is not None]
        params = []
        for i, s in enumerate(steps):
            if s is None:
                continue
            # only arrays some dispatch binds (kernels also keep host-side values such as axes in params)
            bound_keys = set()
            for d in s.dispatches:
                for ref in d.bindings:
                    if ref.kind == "param":
                        bound_keys.add(str(ref.key))
                    elif ref.kind == "in" and isinstance(ref.key, int) and ref.key < len(s.layer.node.inputs) \
                            and s.layer.node.inputs[ref.key] in consts:
                        bound_keys.add(raw_key(ref.key))
            params += [(i, key, arr.nbytes) for key, arr in s.params.items() if key in bound_keys]
        self.arena = plan_arena(pg, workspaces, params, a_align)
        self.plan = self.arena.activations
        total = self.plan.total
        wplace = self.arena.weights
        chunk_sizes = list(self.arena.weight_chunks)
        self.act_region = dev.allocate_region(max(total, 256), "activations")
        self._regions.append(self.act_region)
        self.weight_regions = [dev.allocate_region(n, f"weights{k}") for k, n in enumerate(chunk_sizes)]
        self._regions += self.weight_regions
        io_staging = self.act_region.mapped is None
        st["alloc_s"] = T() - t

        # -- upload
        t = T()
        items = [(self.weight_regions[c], off, steps[i].params[key]) for (i, key), (c, off) in wplace.items()]  # type: ignore[union-attr]
        dev.upload(items)
        st["upload_s"] = T() - t
        st["weights_bytes"] = sum(chunk_sizes)
        st["activation_bytes"] = total

        # -- bind, record
        t = T()
        bound: list[_Bound] = []
        k = 0
        for i, s in enumerate(steps):
            if s is None:
                continue
            for d in s.dispatches:
                pipe = pipes[k]
                k += 1
                man = pipe.module.manifest
                where = f"node {s.layer.name} ({s.layer.op}, kernel {s.kernel.name}, shader {d.shader})"
                if len(d.bindings) != len(man.bindings):
                    raise BackendError(f"{where}: {len(d.bindings)} bindings given, shader declares {len(man.bindings)}")
                ranges = [self._resolve(i, s, ref, where, wplace) for ref in d.bindings]
                for gcount, lim in zip(d.groups, dev.caps.max_workgroup_count):
                    if not 1 <= gcount <= lim:
                        raise BackendError(f"{where}: workgroup count {d.groups} outside 1..{dev.caps.max_workgroup_count}")
                bound.append(_Bound(s, d, pipe, ranges, man.pack_push(d.push, where)))
        self._bound = bound
        self._setup_io(io_staging)
        self._record(bound, io_staging)
        st["record_s"] = T() - t
        st["dispatches"] = len(bound)

        t = T()
        dev.pipeline_cache.save()
        st["pipeline_cache_save_s"] = T() - t
        st["total_load_s"] = T() - t_all
        self.memory_bytes = sum(r.size for r in self._regions)

    def _resolve(self, i: int, s: _Step, ref: Ref, where: str,
                 wplace: Mapping[tuple[int, str], tuple[int, int]]) -> tuple[Region, int, int]:
        node = s.layer.node
        if ref.kind in ("in", "out"):
            names = node.inputs if ref.kind == "in" else node.outputs
            assert isinstance(ref.key, int)
            if ref.key >= len(names) or not names[ref.key]:
                raise BackendError(f"{where}: binding {ref} names an absent tensor")
            tname = names[ref.key]
            if tname in self._consts:
                ref = Ref("param", raw_key(ref.key), ref.offset, ref.size)
            else:
                region, off, size = self.act_region, self.plan.offset(tname), self.graph.infos[tname].nbytes
        if ref.kind == "param":
            if (i, ref.key) not in wplace:
                raise BackendError(f"{where}: binding {ref} names no array of the kernel's transform "
                                   f"(has {sorted(s.params)})")
            c, off = wplace[(i, str(ref.key))]
            region, size = self.weight_regions[c], s.params[str(ref.key)].nbytes
        elif ref.kind == "ws":
            parts = s.kernel.workspace_parts(s.layer)
            if ref.key not in parts:
                raise BackendError(f"{where}: binding {ref} names no workspace part (has {sorted(parts)})")
            off = self.plan.offsets[workspace_name(s.layer.name)]
            for name, n in parts.items():
                if name == ref.key:
                    size = n
                    break
                off += align_up(n, ALIGN)
            region = self.act_region
        elif ref.kind not in ("in", "out"):
            raise BackendError(f"{where}: unknown binding kind {ref.kind!r}")
        off += ref.offset
        size = (size - ref.offset) if ref.size is None else ref.size
        # whole 32-bit words: shaders address bool tensors a word at a time (buffers are 64-byte aligned)
        size = max(align_up(size, 4), 4)
        if off % self.device.caps.min_storage_align:
            raise BackendError(f"{where}: binding {ref} at offset {off} is not aligned to "
                               f"{self.device.caps.min_storage_align}")
        if size > self.device.caps.max_storage_range:
            raise BackendError(f"{where}: binding {ref} spans {size} bytes, more than the device's "
                               f"maxStorageBufferRange {self.device.caps.max_storage_range}")
        if off + size > region.size:
            raise BackendError(f"{where}: binding {ref} ({off}+{size}) overruns region {region.label} ({region.size})")
        return region, off, size

    def _setup_io(self, io_staging: bool) -> None:
        g = self.graph
        dev = self.device
        self._inputs: list[tuple[TensorInfo, int]] = [(t, self.plan.offset(t.name)) for t in g.inputs
                                                      if t.name not in self._consts]
        self._outputs: list[tuple[TensorInfo, int]] = []
        self._const_outputs: dict[str, np.ndarray] = {}
        for t in g.outputs:
            if t.name in self._consts:
                self._const_outputs[t.name] = self._consts[t.name]
            else:
                self._outputs.append((t, self.plan.offset(t.name)))
        for t, _ in self._inputs + self._outputs:
            if np.dtype(t.dtype).name not in ("float32", "int64", "bool"):
                raise BackendError(f"graph input/output {t.name!r} has dtype {np.dtype(t.dtype)}; the Vulkan backend "
                                   f"takes float32 (and int64/bool where a kernel handles them)")
        # where the host reads/writes: the mapped activations, or an IO staging region
        self._copies_in: list[Any] = []
        self._copies_out: list[Any] = []
        if io_staging:
            pos = 0
            layout = []
            for t, off in self._inputs + self._outputs:
                layout.append(pos)
                pos += align_up(t.nbytes, 64)
            self.io_region = dev.allocate_region(max(pos, 64), "io-staging", host=True)
            self._regions.append(self.io_region)
            nin = len(self._inputs)
            self._in_views = [(t, self.io_region.view(p, t.shape, t.dtype)) for (t, _), p in zip(self._inputs, layout)]
            self._out_views = [(t, self.io_region.view(p, t.shape, t.dtype)) for (t, _), p in zip(self._outputs, layout[nin:])]
            self._copies_in = [vk.VkBufferCopy(srcOffset=p, dstOffset=off, size=t.nbytes)
                               for (t, off), p in zip(self._inputs, layout) if t.nbytes]
            self._copies_out = [vk.VkBufferCopy(srcOffset=off, dstOffset=p, size=t.nbytes)
                                for (t, off), p in zip(self._outputs, layout[nin:]) if t.nbytes]
        else:
            self.io_region = self.act_region
            self._in_views = [(t, self.act_region.view(off, t.shape, t.dtype)) for t, off in self._inputs]
            self._out_views = [(t, self.act_region.view(off, t.shape, t.dtype)) for t, off in self._outputs]

    def _record(self, bound: Sequence[_Bound], io_staging: bool) -> None:
        dev = self.device
        d = dev.device
        COMPUTE = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
        SR, SW = vk.VK_ACCESS_SHADER_READ_BIT, vk.VK_ACCESS_SHADER_WRITE_BIT
        self._cmd_pool = vk.vkCreateCommandPool(d, vk.VkCommandPoolCreateInfo(queueFamilyIndex=dev.queue_family), None)
        # created signalled: close() waits on it, also when the model never ran
        self._fence = vk.vkCreateFence(d, vk.VkFenceCreateInfo(flags=vk.VK_FENCE_CREATE_SIGNALED_BIT), None)
        cb = vk.vkAllocateCommandBuffers(d, vk.VkCommandBufferAllocateInfo(
            commandPool=self._cmd_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        self._cb = cb
        sets: list[Any] = []
        if bound:
            kinds = [binding_kinds(b.pipeline.module.manifest) for b in bound]
            counts: dict[str, int] = {}
            for ks in kinds:
                for kd in ks:
                    counts[kd] = counts.get(kd, 0) + 1
            sizes = [vk.VkDescriptorPoolSize(type=descriptor_type(kd), descriptorCount=n) for kd, n in sorted(counts.items())]
            if not sizes:
                sizes = [vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=1)]
            self._desc_pool = vk.vkCreateDescriptorPool(d, vk.VkDescriptorPoolCreateInfo(
                maxSets=len(bound), poolSizeCount=len(sizes), pPoolSizes=sizes), None)
            arr = vk.vkAllocateDescriptorSets(d, vk.VkDescriptorSetAllocateInfo(
                descriptorPool=self._desc_pool, descriptorSetCount=len(bound),
                pSetLayouts=[b.pipeline.set_layout for b in bound]))
            sets = [arr[i] for i in range(len(bound))]
            writes = []
            for s, b, ks in zip(sets, bound, kinds):
                # one write covers each run of consecutive bindings of the same kind
                i = 0
                while i < len(b.ranges):
                    j = i
                    while j < len(b.ranges) and ks[j] == ks[i]:
                        j += 1
                    if ks[i] in ("texel", "image"):
                        views = [self._texel_view(r, off, size) for r, off, size in b.ranges[i:j]]
                        writes.append(vk.VkWriteDescriptorSet(dstSet=s, dstBinding=i, dstArrayElement=0,
                                                              descriptorCount=j - i, descriptorType=descriptor_type(ks[i]),
                                                              pTexelBufferView=views))
                    else:
                        infos = [vk.VkDescriptorBufferInfo(buffer=r.buffer, offset=off, range=size)
                                 for r, off, size in b.ranges[i:j]]
                        writes.append(vk.VkWriteDescriptorSet(dstSet=s, dstBinding=i, dstArrayElement=0,
                                                              descriptorCount=j - i, descriptorType=descriptor_type(ks[i]),
                                                              pBufferInfo=infos))
                    i = j
            if writes:
                vk.vkUpdateDescriptorSets(d, len(writes), writes, 0, None)

        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo())
        act = self.act_region
        qp = None
        if self.profile:
            qp = self._query_pool = vk.vkCreateQueryPool(d, vk.VkQueryPoolCreateInfo(
                queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=len(bound) + 1), None)
            vk.vkCmdResetQueryPool(cb, qp, 0, len(bound) + 1)
        if io_staging and self._copies_in:
            vk.vkCmdCopyBuffer(cb, self.io_region.buffer, act.buffer, len(self._copies_in), self._copies_in)
            vk.vkCmdPipelineBarrier(cb, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, COMPUTE, 0, 1,
                                    [vk.VkMemoryBarrier(srcAccessMask=vk.VK_ACCESS_TRANSFER_WRITE_BIT, dstAccessMask=SR | SW)],
                                    0, None, 0, None)
        else:
            # orders this submission after the previous one's shader writes (WAW/WAR on reused buffers)
            vk.vkCmdPipelineBarrier(cb, COMPUTE, COMPUTE, 0, 1, [vk.VkMemoryBarrier(srcAccessMask=SW, dstAccessMask=SR | SW)],
                                    0, None, 0, None)
        # ranges written / read since the last barrier, tagged with the step when the dispatch is independent
        if qp is not None:
            vk.vkCmdWriteTimestamp(cb, COMPUTE, qp, 0)
        pend_w: list[tuple[Region, int, int, int]] = []
        pend_r: list[tuple[Region, int, int, int]] = []
        nbar = 0
        cur_pipe = None

        def overlaps(a: tuple[Region, int, int], lst: list[tuple[Region, int, int, int]], skip: int) -> bool:
            r, o, n = a
            return any(r is r2 and o < o2 + n2 and o2 < o + n and tag != skip for r2, o2, n2, tag in lst)

        for k, (s, b) in enumerate(zip(sets, bound)):
            man = b.pipeline.module.manifest
            reads = [rg for rg, bi in zip(b.ranges, man.bindings) if bi.reads]
            writes_ = [rg for rg, bi in zip(b.ranges, man.bindings) if bi.writes]
            skip = id(b.step) if b.dispatch.independent else -1  # entries tagged 0 are never skipped
            tag = id(b.step) if b.dispatch.independent else 0
            if (any(overlaps(r, pend_w, skip) for r in reads)
                    or any(overlaps(w, pend_w, skip) or overlaps(w, pend_r, skip) for w in writes_)):
                bars = [vk.VkBufferMemoryBarrier(srcAccessMask=SW, dstAccessMask=SR | SW,
                                                 srcQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED,
                                                 dstQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED,
                                                 buffer=r.buffer, offset=o, size=n)
                        for r, o, n in _merge([w[:3] for w in pend_w])]
                # a pure write-after-read needs only the execution dependency the stage masks give
                vk.vkCmdPipelineBarrier(cb, COMPUTE, COMPUTE, 0, 0, None, len(bars), bars or None, 0, None)
                nbar += 1
                pend_w, pend_r = [], []
            pend_r += [(*r, tag) for r in reads]
            pend_w += [(*w, tag) for w in writes_]
            if b.pipeline is not cur_pipe:
                vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, b.pipeline.handle)
                cur_pipe = b.pipeline
            vk.vkCmdBindDescriptorSets(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, b.pipeline.layout, 0, 1, [s], 0, None)
            if b.push:
                vk.vkCmdPushConstants(cb, b.pipeline.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, len(b.push),
                                      vk.ffi.from_buffer(b.push))
            vk.vkCmdDispatch(cb, *b.dispatch.groups)
            if qp is not None:
                vk.vkCmdWriteTimestamp(cb, COMPUTE, qp, k + 1)
        outs = [(act, off, t.nbytes) for t, off in self._outputs if t.nbytes]
        if io_staging:
            if outs:
                vk.vkCmdPipelineBarrier(cb, COMPUTE, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1,
                                        [vk.VkMemoryBarrier(srcAccessMask=SW, dstAccessMask=vk.VK_ACCESS_TRANSFER_READ_BIT)],
                                        0, None, 0, None)
                vk.vkCmdCopyBuffer(cb, act.buffer, self.io_region.buffer, len(self._copies_out), self._copies_out)
                vk.vkCmdPipelineBarrier(cb, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, vk.VK_PIPELINE_STAGE_HOST_BIT, 0, 1,
                                        [vk.VkMemoryBarrier(srcAccessMask=vk.VK_ACCESS_TRANSFER_WRITE_BIT,
                                                            dstAccessMask=vk.VK_ACCESS_HOST_READ_BIT)], 0, None, 0, None)
        elif outs:
            bars = [vk.VkBufferMemoryBarrier(srcAccessMask=SW, dstAccessMask=vk.VK_ACCESS_HOST_READ_BIT,
                                             srcQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED,
                                             dstQueueFamilyIndex=vk.VK_QUEUE_FAMILY_IGNORED,
                                             buffer=r.buffer, offset=o, size=n) for r, o, n in _merge(outs)]
            vk.vkCmdPipelineBarrier(cb, COMPUTE, vk.VK_PIPELINE_STAGE_HOST_BIT, 0, 0, None, len(bars), bars, 0, None)
        vk.vkEndCommandBuffer(cb)
        self._submit = [vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cb])]
        self.load_stats["barriers"] = nbar

    def _texel_view(self, r: Region, off: int, size: int) -> Any:
        """An RGBA32F view of a bound range (whole texels: a trailing partial texel is included when the
        region extends that far, else dropped; kernels never use the bytes past the tensor)."""
        dev = self.device
        if off % dev.min_texel_align:
            raise BackendError(f"texel view at offset {off} is not aligned to {dev.min_texel_align}")
        n = align_up(size, 16)
        if off + n > r.size:
            n = size // 16 * 16
        n = max(16, min(n, 16 * dev.max_texel_elements))
        v = vk.vkCreateBufferView(dev.device, vk.VkBufferViewCreateInfo(
            buffer=r.buffer, format=vk.VK_FORMAT_R32G32B32A32_SFLOAT, offset=off, range=n), None)
        self._views.append(v)
        return v

    # ------------------------------------------------------------------------------------ run
    @property
    def input_infos(self) -> list[TensorInfo]:
        return [t for t, _ in self._inputs]

    @property
    def output_infos(self) -> list[TensorInfo]:
        return list(self.graph.outputs)

    @property
    def kernel_names(self) -> dict[str, str]:
        """Node name -> Vulkan kernel chosen ("alias" for ops that are views)."""
        return {n.name: (s.kernel.name if s else "alias") for n, s in zip(self._pg.nodes, self._steps)}

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            if self._closed:
                raise BackendError("this VulkanModel is closed")
            t0 = time.perf_counter()
            names = {t.name for t, _ in self._in_views}
            if set(feeds) != names:
                raise InputError(f"expected inputs {sorted(names)}, got {sorted(feeds)}")
            dev = self.device
            for t, view in self._in_views:
                a = np.asarray(feeds[t.name])
                if tuple(a.shape) != tuple(t.shape):
                    raise InputError(f"input {t.name!r}: expected shape {tuple(t.shape)}, got {tuple(a.shape)}")
                if a.dtype != t.dtype:
                    raise InputError(f"input {t.name!r}: expected dtype {np.dtype(t.dtype)}, got {a.dtype}")
                np.copyto(view, a)
            if not self.io_region.coherent:
                dev.flush(self.io_region)
            vk.vkResetFences(dev.device, 1, [self._fence])
            with dev.queue_lock:
                vk.vkQueueSubmit(dev.queue, 1, self._submit, self._fence)
            dev.wait_fence(self._fence)
            if not self.io_region.coherent:
                dev.invalidate(self.io_region)
            out = {t.name: view.copy() for t, view in self._out_views}
            for name, a in self._const_outputs.items():
                out[name] = a.copy()
            if not self.first_run_done:
                self.first_run_done = True
                self.load_stats["first_run_s"] = time.perf_counter() - t0
            return {t.name: out[t.name] for t in self.graph.outputs}

    __call__ = run

    def last_profile(self) -> list[dict[str, Any]]:
        """GPU time of each dispatch in the last run (``profile=True`` only): time from the previous
        dispatch's end-of-compute timestamp to this one's, so barrier waits count to the dispatch after them."""
        if self._query_pool is None or not self.first_run_done:
            return []
        n = len(self._bound) + 1
        buf = vk.ffi.new("uint64_t[]", n)
        res = vk.lib.vkGetQueryPoolResults(self.device.device, self._query_pool, 0, n, 8 * n, buf, 8,
                                           vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
        if res != vk.VK_SUCCESS:
            raise BackendError(f"vkGetQueryPoolResults failed ({res})")
        ts = [int(buf[i]) for i in range(n)]
        period = self.device.timestamp_period
        return [{"node": b.step.layer.name, "op": b.step.layer.op, "kernel": b.step.kernel.name,
                 "shader": b.dispatch.shader, "groups": b.dispatch.groups, "ms": (ts[i + 1] - ts[i]) * period / 1e6}
                for i, b in enumerate(self._bound)]

    # ------------------------------------------------------------------------------------ teardown
    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._free()

    def _free(self) -> None:
        dev = self.device
        if dev.closed or dev.device is None:
            return
        d = dev.device
        if self._fence is not None:
            try:
                vk.vkWaitForFences(d, 1, [self._fence], vk.VK_TRUE, 10 * 10**9)
            except Exception:
                pass
        self._in_views = self._out_views = []  # type: ignore[assignment]
        if self._desc_pool is not None:
            vk.vkDestroyDescriptorPool(d, self._desc_pool, None)
            self._desc_pool = None
        for v in self._views:
            vk.vkDestroyBufferView(d, v, None)
        self._views = []
        if self._cmd_pool is not None:
            vk.vkDestroyCommandPool(d, self._cmd_pool, None)
            self._cmd_pool = None
        if self._fence is not None:
            vk.vkDestroyFence(d, self._fence, None)
            self._fence = None
        if self._query_pool is not None:
            vk.vkDestroyQueryPool(d, self._query_pool, None)
            self._query_pool = None
        for r in self._regions:
            dev.free_region(r)
        self._regions = []

    def __enter__(self) -> "VulkanModel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort; close() is the contract
        try:
            if not self._closed and not self.device.closed:
                self.close()
        except Exception:
            pass


def _merge(ranges: Sequence[tuple[Region, int, int]]) -> list[tuple[Region, int, int]]:
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


def shader_variants(graph: Graph, caps: Caps | None = None, kernels: Mapping[str, str] | None = None
                    ) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    """Every (shader, defines) variant ``graph`` needs on a device like ``caps`` (to precompile SPIR-V)."""
    _, _, steps = plan_graph(graph, caps or Caps(), kernels or {}, {})
    return list(dict.fromkeys((d.shader, norm_defines(d.defines)) for s in steps if s for d in s.dispatches))
