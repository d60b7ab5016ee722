"""CPU-GPU co-execution of one graph over one activation arena in memory both sides read and write.

``CoexecModel(graph, sides)`` places every node on the GPU (Vulkan), on the CPU (inferd's CPU kernels), or
splits a Conv/Gemm/MatMul by output channels (``inferd.coexec.split_ops``): the GPU computes the leading
channels, the CPU the rest, of the same output tensor, from the same input. The activations are the Vulkan
backend's arena (``VulkanColdBackend``: fold, kernel selection, lifetime-packed layout); it must be
host-visible and host-cached (lavapipe, integrated GPUs), so the CPU kernels read and write numpy views of
the very memory the shaders bind: no copy and no map/unmap per inference. A device without such memory is
refused at load (``CoexecUnsupported``), and ``inferd.load`` then falls back (see ``inferd.coexec.load``).

At load the graph becomes a *program*: GPU work in segments (command buffers recorded once, each starting
with a barrier on everything before it and ending with a barrier making its writes visible to the host),
CPU tasks, and waits. A CPU task is a split layer's CPU part (its kernel bound to views of the arena) or a
*region*: a run of consecutive CPU-only nodes as the CPU backend runs them (``CpuExecutor`` over their subgraph,
with its layout plan, blocked kernels and fusions, in an arena of its own), its inputs copied in from the shared
arena and the tensors read beyond it copied back. A segment is submitted as soon as a CPU task is
due, so the GPU runs its half of a split layer (and whatever GPU work precedes it) while the CPU computes
its half; a CPU task first waits for every submitted segment that wrote what it reads or touches what it
writes (byte ranges; a split layer's two halves are disjoint by construction), and a GPU segment is
submitted only after the CPU tasks before it in the program finished, so a consumer on either side reads
the whole tensor. Waiting is polling: the fence's status in a spin (``sync="fence"``), or a word the
segment's last command writes into host-coherent memory (``sync="flag"``); ``sync="block"`` uses
``vkWaitForFences`` (the baseline the paper measured at 141-162 us).
"""
from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections import ChainMap
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from .. import faults
from ..errors import BackendError, DeviceLostError, DeviceTimeoutError, KernelError
from ..ir import Graph, TensorInfo
from ..ops.base import Layer, choose_kernel, raw_params
from ..planner.plan import LayerPlan
from .split_ops import Part, SplitShape, make_part, split_shape

log = logging.getLogger("inferd.coexec")

# lavapipe runs a command buffer inside vkQueueSubmit unless Mesa's submit thread is on: then the CPU half of a
# split could not start before the GPU half ended. Effective for a device created after this import.
os.environ.setdefault("MESA_VK_ENABLE_SUBMIT_THREAD", "1")

SYNC_MODES = ("auto", "event", "fence", "flag", "block")


NO_SHARED_MEMORY = ("the device offers no host-visible, host-cached, coherent memory for the activations: the CPU "
                    "cannot share them without copies")


def shareable(r: Any) -> bool:
    """Whether both sides can read and write region ``r`` in place: mapped, coherent and host-cached (a discrete
    GPU's mapped BAR is coherent but uncached: CPU reads of it crawl, so its models take the staging path)."""
    return r.mapped is not None and bool(r.coherent) and bool(r.cached)


def unsupported_reason(dev: Any) -> str | None:
    """Why ``dev`` cannot co-execute (None: it can), by the same allocation the engine's activations get: for
    callers that want to know before loading a model (tests, benchmarks)."""
    r = dev.allocate_region(256, "coexec probe")
    try:
        return None if shareable(r) else NO_SHARED_MEMORY
    finally:
        dev.free_region(r)


class CoexecUnsupported(BackendError):
    """The device or the model cannot co-execute (no host-visible cached activations, host steps)."""


#: a byte range of the arena: (start, end, writes, owner tag); the tag lets a split's halves ignore each other
Range = tuple[int, int, bool, str]


@dataclass
class _Segment:
    index: int
    rec: Any
    ranges: list[Range] = field(default_factory=list)
    dispatches: int = 0
    submit: Any = None


@dataclass
class _CpuTask:
    name: str
    call: Callable[[], None]
    ranges: list[Range]
    tag: str
    split: bool = False
    #: a region's run that notes each of its layers in the trace list it is given (None: not a region)
    traced: Callable[[list[tuple[str, Any, float]]], None] | None = None


@dataclass
class LayerPlacement:
    """What the model does with one node: side 'gpu', 'cpu' or 'split' (GPU channels [0, gpu_channels),
    CPU [gpu_channels, channels))."""

    name: str
    op: str
    side: str
    channels: int = 0
    gpu_channels: int = 0
    cpu_kernel: str = ""
    gpu_kernel: str = ""


def resolve_side(layer: Layer, want: Any) -> tuple[str, int]:
    """(side, GPU channels) for ``want``: 'gpu', 'cpu', a fraction of output channels on the CPU (a float in
    [0, 1]), or a number of CPU channels (an int). A fraction on a layer that cannot split picks the side
    with the larger share; a split with no channel left on one side is that side alone."""
    sh = split_shape(layer)
    if want is None or want == "gpu":
        return "gpu", sh.channels if sh else 0
    if want == "cpu":
        return "cpu", 0
    if isinstance(want, bool) or not isinstance(want, (int, float, np.integer, np.floating)):
        raise ValueError(f"node {layer.name}: split must be 'cpu', 'gpu', a fraction or a channel count, got {want!r}")
    if isinstance(want, (float, np.floating)):
        if not 0.0 <= float(want) <= 1.0:
            raise ValueError(f"node {layer.name}: split fraction {want} outside [0, 1]")
        if sh is None:
            return ("cpu", 0) if float(want) >= 0.5 else ("gpu", 0)
        cpu = int(round(float(want) * sh.channels))
    else:
        if sh is None:
            raise ValueError(f"node {layer.name} ({layer.op}) cannot be split by channels")
        cpu = int(want)
        if not 0 <= cpu <= sh.channels:
            raise ValueError(f"node {layer.name}: {cpu} CPU channels of {sh.channels}")
    g = sh.snap(sh.channels - cpu)
    if g == 0:
        return "cpu", 0
    if g == sh.channels:
        return "gpu", g
    return "split", g


def _overlap(a: Range, b: Range) -> bool:
    return a[0] < b[1] and b[0] < a[1] and (a[2] or b[2])


class CoexecModel:
    """A graph run by the CPU and a Vulkan device together (module docstring). ``sides``: per node name or op
    type, 'cpu' | 'gpu' | a fraction of output channels on the CPU | a CPU channel count (unlisted: GPU).
    ``run(feeds) -> outputs``; ``close()``."""

    def __init__(self, graph: Graph, sides: Mapping[str, Any] | None = None, device: Any = None,
                 kernels: Mapping[str, str] | None = None, cpu_kernels: Mapping[str, str] | None = None,
                 sync: str = "auto", spin_timeout_s: float | None = None, threads: int | None = None,
                 spin_s: float = 100e-6, nap_s: float = 20e-6) -> None:
        from ..vulkan.cold import VulkanColdBackend
        from ..vulkan.device import get_device

        if sync not in SYNC_MODES:
            raise ValueError(f"sync must be one of {SYNC_MODES}, got {sync!r}")
        self.graph = graph
        self._events: list[Any] = []
        self._event_ptrs: Any = None
        #: native pool threads while this model's CPU halves run (None: leave the pool as it is)
        self.threads = threads
        self.plan: Any = None
        self.plan_source = ""
        from ..vulkan import device as vdev

        # a wait longer than the device's fence timeout (the daemon's gpu_timeout) is a hung GPU
        self.spin_timeout_s = float(spin_timeout_s if spin_timeout_s is not None else vdev.fence_timeout_s)
        #: how long a wait spins before it polls between naps of ``nap_s``
        self.spin_s = spin_s
        self.nap_s = nap_s
        self._lock = threading.Lock()
        self._closed = False
        self._regions: list[Any] = []
        self._extra_prepared: list[Any] = []
        self._fences: list[Any] = []
        self._segments: list[_Segment] = []
        self._flags: Any = None
        self.placements: list[LayerPlacement] = []
        #: a CPU-only layer's placement, until its region's executor names its kernel
        self._region_of: dict[str, LayerPlacement] = {}
        #: the CPU executors of the regions of consecutive CPU-only nodes
        self.regions: list[Any] = []
        self.device = dev = device or get_device()
        if sync == "auto":
            # lavapipe waits on an event by spinning its thread for the whole inference (all segments are queued
            # at the start): a core taken from other work for the same few microseconds of sync a fence poll
            # gets (7.0 vs 7.4 us per split layer measured). A GPU waits on events for free.
            sync = "event" if dev.caps.device_type != "cpu" and async_submits(dev) else "fence"
        elif sync == "event" and not async_submits(dev):
            raise CoexecUnsupported("sync='event' needs a queue whose vkQueueSubmit returns before the work is done "
                                    "(lavapipe: MESA_VK_ENABLE_SUBMIT_THREAD=1 before the device is created)")
        self.sync = sync
        b = VulkanColdBackend(graph, kernels=kernels, device=dev)
        self._b = b
        try:
            if b._hosts:
                raise CoexecUnsupported(f"model {graph.name}: nodes run on the host between GPU segments (control "
                                        f"flow); co-execution does not handle them")
            if not shareable(b.act_region):
                raise CoexecUnsupported(NO_SHARED_MEMORY)
            self._build(dict(sides or {}), dict(cpu_kernels or {}))
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ load
    def _build(self, sides: dict[str, Any], cpu_forced: dict[str, str]) -> None:
        from ..vulkan.cold import _Slot
        from ..vulkan.device import vk
        from ..vulkan.kernel import split_rows

        b = self._b
        dev = self.device
        d = dev.device
        act = b.act_region
        plan = b.plan
        infos = self.graph.infos
        extra: dict[str, np.ndarray] = {}
        b._consts = consts = ChainMap(extra, b._consts)  # the parts' sliced weights, for binding resolution
        self._consts = consts

        def arange(name: str, writes: bool, tag: str, info: TensorInfo | None = None) -> Range:
            off = plan.offset(name)
            n = (info or infos[name]).nbytes
            return (off, off + max(n, 1), writes, tag)

        program: list[tuple[str, Any]] = []
        seg = self._new_segment(first=True)
        pending: list[_Segment] = []

        def flush() -> None:
            nonlocal seg
            if seg.dispatches:
                self._end_segment(seg)
                program.append(("submit", seg.index))
                pending.append(seg)
                seg = self._new_segment(first=False)

        def cpu_task(task: _CpuTask) -> None:
            flush()
            last = -1
            for i, s in enumerate(pending):
                if any(_overlap(r, q) for r in task.ranges for q in s.ranges if q[3] != task.tag):
                    last = i
            if last >= 0:
                program.append(("wait", pending[last].index))
                del pending[:last + 1]
            program.append(("cpu", task))

        def record_gpu(bound: list[Any], tag: str) -> None:
            for bd in bound:
                seg.rec.dispatch(bd)
                seg.dispatches += 1
                man = bd.pipeline.module.manifest
                for (r, off, n), bi in zip(bd.ranges, man.bindings):
                    if r is act:
                        seg.ranges.append((off, off + n, bool(bi.writes), tag))

        # consecutive CPU nodes run as one region: a CPU executor over their subgraph (the CPU backend's own
        # layout plan, kernel choice and fusions), reading its inputs from and writing its outputs to the arena
        region: list[Any] = []
        readers: dict[str, set[str]] = {}
        for n in self.graph.nodes:
            for i in n.inputs:
                if i:
                    readers.setdefault(i, set()).add(n.name)

        def close_region() -> None:
            if region:
                cpu_task(self._region_task(list(region), readers, cpu_forced, arange))
                region.clear()

        for slot in b._slots:
            if slot.kind == "alias" and region:
                region.append(slot.node)  # a view: free on either side, and keeps the region whole
                continue
            if slot.kind != "kernel":
                continue
            layer = slot.layer
            want = sides.get(layer.name, sides.get(layer.op))
            side, g = resolve_side(layer, want)
            sh = split_shape(layer)
            pl = LayerPlacement(layer.name, layer.op, side, sh.channels if sh else 0, g)
            self.placements.append(pl)
            if side == "cpu":
                region.append(slot.node)
                self._region_of[layer.name] = pl
                continue
            close_region()
            if side == "gpu":
                lp = LayerPlan(slot.pos, layer.name, layer.op, slot.default.name, "raw", 0, 0, "")
                b.prepare(slot.pos, lp, {})
                prep = b._prepared[slot.pos]
                pl.gpu_kernel = prep.kernel.name
                record_gpu(prep.bound, layer.name)
                continue
            assert sh is not None
            gpart = make_part(layer, consts, 0, g, "gpu")
            cpart = make_part(layer, consts, g, sh.channels, "cpu")
            extra.update(gpart.constants)
            extra.update(cpart.constants)
            glayer = gpart.layer(infos, consts)
            k = self._gpu_kernel(glayer, sh, slot.default.name)
            pl.gpu_kernel = k.name
            params = k.transform(glayer, raw_params(glayer, consts))
            ds = split_rows(k.dispatches(glayer, params, b.caps), b.caps)
            if sh.rows > 1:
                ds = [_with_ldc(dd, sh.channels) for dd in ds]
            pipes = b._pipelines(ds)
            wsn = k.workspace_nbytes(glayer)
            ws = None
            if wsn:
                wr = dev.allocate_region(wsn, f"coexec-ws:{layer.name}")
                self._regions.append(wr)
                ws = (wr, 0)

            def locate(t: str, _p: Part = gpart) -> tuple[Any, int, int]:
                v = _p.views.get(t)
                if v is None:
                    return act, plan.offset(t), infos[t].nbytes
                if v.cols:  # a column block: bind the whole matrix, the kernel writes through ldc
                    return act, plan.offset(v.parent), infos[v.parent].nbytes
                return act, plan.offset(v.parent) + v.offset, _p.infos[t].nbytes
            sub = _Slot(slot.pos, gpart.node, "kernel", glayer, (k,), k, None)
            prep = b._place(sub, k, params, ds, pipes, locate=locate, ws=ws)
            self._extra_prepared.append(prep)
            record_gpu(prep.bound, layer.name)
            task = self._cpu_task(cpart.layer(infos, consts), cpart, cpu_forced, arange, tag=layer.name)
            task.split = True
            pl.cpu_kernel = task.name
            cpu_task(task)
        close_region()
        if seg.dispatches:
            self._end_segment(seg)
            program.append(("submit", seg.index))
            pending.append(seg)
        else:
            self._segments.pop()  # the empty segment opened after the last flush (or a model all on the CPU)
            vk.vkFreeCommandBuffers(d, b._cmd_pool, 1, [seg.rec.cb])
        if pending:
            program.append(("wait", pending[-1].index))
        self.program = program
        nf = 1 if self.sync == "event" else len(self._segments)
        self._fences = [vk.vkCreateFence(d, vk.VkFenceCreateInfo(flags=vk.VK_FENCE_CREATE_SIGNALED_BIT), None)
                        for _ in range(nf if self._segments else 0)]
        self._fence_array = vk.ffi.new("VkFence[]", self._fences) if self._fences else None
        if self.sync == "event":
            # the events of the segments left after the empty last one was dropped
            for ev in self._events[len(self._segments):]:
                vk.vkDestroyEvent(d, ev, None)
            self._events = self._events[:len(self._segments)]
            self._event_ptrs = list(self._events)
            if self._segments:
                cbs = [sg.rec.cb for sg in self._segments]
                # the struct owns its command-buffer array: keep it, and pass its address
                self._submit_info = vk.VkSubmitInfo(commandBufferCount=len(cbs), pCommandBuffers=cbs)
                self._all_submit = vk.ffi.addressof(self._submit_info)
        self._fence_status = vk.lib.vkGetFenceStatus
        self._lib = vk.lib
        self.load_stats = dict(b.load_stats, segments=len(self._segments),
                               cpu_tasks=sum(1 for op, _ in program if op == "cpu"),
                               splits=sum(1 for p in self.placements if p.side == "split"))

    def _gpu_kernel(self, layer: Layer, sh: SplitShape, default: str) -> Any:
        """The GPU part's kernel: the whole layer's where it applies, else the device's default for the part;
        with strided column blocks only kernels that write through ``ldc`` without a split-K workspace."""
        from ..vulkan.executor import _applicable
        from ..vulkan.kernel import VulkanKernel, split_rows

        b = self._b
        prio = _applicable(layer, b.caps)
        names = sorted(prio, key=prio.__getitem__)
        order = [k for k in names if k.name == default] + [k for k in names if k.name != default]
        for k in order:
            if prio[k] >= 1000 or not isinstance(k, VulkanKernel):
                continue
            if sh.rows > 1:  # a strided column block: the kernel must write through ldc
                params = k.transform(layer, raw_params(layer, self._consts))
                ds = split_rows(k.dispatches(layer, params, b.caps), b.caps)
                if any(dd.shader not in ("matmul", "matmul_reg", "gemv", "gemv_nk") or dd.defines.get("SPLITK")
                       or "ldc" not in dd.push for dd in ds):
                    continue
            return k
        raise BackendError(f"node {layer.name}: no Vulkan kernel computes a channel block of this layer")

    def _region_task(self, nodes: list[Any], readers: Mapping[str, set[str]], forced: Mapping[str, str],
                     arange: Callable[..., Range]) -> _CpuTask:
        """One CPU task for consecutive CPU-only ``nodes``: the CPU backend's executor over their subgraph
        (``package.cpu_graph``: blocked layout, its kernels), its inputs copied in from the arena and its outputs
        (tensors read outside the region, or given out by the model) copied back. All inputs are copied before any
        output is written, so an output may reuse an input's bytes as the arena's plan allows."""
        from ..package import cpu_graph
        from ..runtime.cpu import CpuExecutor

        act = self._b.act_region
        plan = self._b.plan
        g = self.graph
        infos = g.infos
        consts = self._consts
        inside = {n.name for n in nodes}
        produced = {o for n in nodes for o in n.outputs if o}
        given = {t.name for t in g.outputs}
        ins: list[str] = []
        for n in nodes:
            for i in n.inputs:
                if i and i not in produced and i not in consts and i not in ins:
                    ins.append(i)
        outs = [o for n in nodes for o in n.outputs
                if o and o not in consts and (o in given or readers.get(o, set()) - inside)]
        tag = f"region:{nodes[0].name}"
        sub = Graph(f"{g.name}[{nodes[0].name}..{nodes[-1].name}]", list(nodes), [infos[i] for i in ins],
                    [infos[o] for o in outs], consts, infos, g.opset)  # type: ignore[arg-type]
        ex = CpuExecutor(cpu_graph(sub, dict(forced) or None), kernels=dict(forced) or None)
        self.regions.append(ex)
        for layer, k in ex.choice:
            pl = self._region_of.pop(layer.name, None)
            if pl is not None and k is not None:
                pl.cpu_kernel = k.name

        def view(name: str) -> np.ndarray:
            return act.view(plan.offset(name), infos[name].shape, infos[name].dtype)
        srcs, dsts = {i: view(i) for i in ins}, [(o, view(o)) for o in outs]
        call = ex.bind_run(srcs, dsts)
        if call is None:
            raise CoexecUnsupported(f"model {g.name}: the CPU nodes {nodes[0].name}..{nodes[-1].name} do not run over "
                                    f"fixed buffers (tensors shaped at run time)")
        into: list[list[tuple[str, Any, float]]] = [[]]
        clock = time.perf_counter
        each = ex.bind_run(srcs, dsts, after=lambda name: into[0].append(("cpu", name, clock())))

        def traced(trace: list[tuple[str, Any, float]]) -> None:
            into[0] = trace
            each()

        ranges = [arange(i, False, tag) for i in ins] + [arange(o, True, tag) for o in outs]
        return _CpuTask("cpu-region", call, ranges, tag, traced=traced)

    def _cpu_task(self, layer: Layer, part: Part, forced: Mapping[str, str],
                  arange: Callable[..., Range], tag: str = "") -> _CpuTask:
        """A split layer's CPU part: its kernel bound to arena views (the part's tensors: views inside the whole
        tensors; a strided column block through a contiguous scratch, copied in before and out after)."""
        act = self._b.act_region
        plan = self._b.plan
        infos = self.graph.infos
        consts = self._consts
        base = layer.name.split("#")[0]
        want = forced.get(base, forced.get(layer.op))
        try:
            k = choose_kernel(layer, "cpu", want)
        except KernelError:
            if want is None:
                raise
            k = choose_kernel(layer, "cpu")  # a part the forced kernel does not fit (one channel of a depthwise)
        params = k.transform(layer, raw_params(layer, consts))
        ranges: list[Range] = []
        pre: list[tuple[np.ndarray, np.ndarray]] = []
        post: list[tuple[np.ndarray, np.ndarray]] = []
        tag = tag or layer.name

        def view(name: str, writes: bool) -> np.ndarray:
            v = part.views.get(name)
            if v is None:
                info = infos[name]
                ranges.append(arange(name, writes, tag))
                return act.view(plan.offset(name), info.shape, info.dtype)
            info = part.infos[name]
            off = plan.offset(v.parent)
            if not v.strided:
                ranges.append((off + v.offset, off + v.offset + info.nbytes, writes, tag))
                return act.view(off + v.offset, info.shape, info.dtype)
            pinfo = infos[v.parent]
            ranges.append((off, off + pinfo.nbytes, writes, tag))
            whole = act.view(off, pinfo.shape, pinfo.dtype)
            block = whole[..., v.col0:v.col0 + v.cols]
            scratch = np.empty(info.shape, info.dtype)
            (post if writes else pre).append((block, scratch) if writes else (scratch, block))
            return scratch

        node = layer.node
        ins = [None if (not n or n in consts) else view(n, False) for n in node.inputs]
        outs = [view(o, True) for o in node.outputs if o]
        call = k.bind(layer, ins, params, outs)
        if call is None:
            call = functools.partial(k.run, layer, ins, params, outs)
        if pre or post:
            inner = call

            def call() -> None:
                for dst, src in pre:
                    np.copyto(dst, src)
                inner()
                for dst, src in post:
                    np.copyto(dst, src)
        return _CpuTask(k.name, call, ranges, tag)

    def _new_segment(self, first: bool) -> _Segment:
        from ..vulkan.device import vk
        from ..vulkan.executor import Recorder

        b = self._b
        cb = vk.vkAllocateCommandBuffers(self.device.device, vk.VkCommandBufferAllocateInfo(
            commandPool=b._cmd_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo())
        rec = Recorder(cb)
        if self.sync == "event":
            # submitted with every other segment at the start of a run: it starts when the host says so (the CPU
            # work before it in the program is done), and its reads see what the host wrote
            ev = vk.vkCreateEvent(self.device.device, vk.VkEventCreateInfo(), None)
            self._events.append(ev)
            vk.vkCmdWaitEvents(cb, 1, [ev], vk.VK_PIPELINE_STAGE_HOST_BIT,
                               vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT, 1,
                               [vk.VkMemoryBarrier(srcAccessMask=vk.VK_ACCESS_HOST_WRITE_BIT,
                                                   dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT
                                                   | vk.VK_ACCESS_SHADER_WRITE_BIT)], 0, None, 0, None)
        # the inputs (host writes before the submit) and every earlier segment's writes come first
        rec.full_barrier()
        s = _Segment(len(self._segments), rec)
        self._segments.append(s)
        return s

    def _end_segment(self, s: _Segment) -> None:
        from ..vulkan.device import vk

        cb = s.rec.cb
        compute = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
        if self.sync in ("flag", "event"):
            if self._flags is None:
                self._flags = self.device.allocate_region(4096, "coexec-flags", host=True)
                self._regions.append(self._flags)
            vk.vkCmdPipelineBarrier(cb, compute, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1,
                                    [vk.VkMemoryBarrier(srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT,
                                                        dstAccessMask=vk.VK_ACCESS_TRANSFER_WRITE_BIT)], 0, None, 0, None)
            vk.vkCmdFillBuffer(cb, self._flags.buffer, 4 * s.index, 4, 1)
            vk.vkCmdPipelineBarrier(cb, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, vk.VK_PIPELINE_STAGE_HOST_BIT, 0, 1,
                                    [vk.VkMemoryBarrier(srcAccessMask=vk.VK_ACCESS_TRANSFER_WRITE_BIT,
                                                        dstAccessMask=vk.VK_ACCESS_HOST_READ_BIT)], 0, None, 0, None)
        vk.vkCmdPipelineBarrier(cb, compute, vk.VK_PIPELINE_STAGE_HOST_BIT, 0, 1,
                                [vk.VkMemoryBarrier(srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT,
                                                    dstAccessMask=vk.VK_ACCESS_HOST_READ_BIT)], 0, None, 0, None)
        vk.vkEndCommandBuffer(cb)
        s.submit = [vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cb])]

    # ------------------------------------------------------------------ run
    def _wait(self, k: int) -> None:

        dev = self.device
        fence = self._fences[min(k, len(self._fences) - 1)]
        if faults.enabled:
            faults.check("vulkan.fence")
        if self.sync == "block":
            dev.wait_fence(fence)
            return
        if self.sync in ("flag", "event"):
            flag = self._flag_words[k:k + 1]
            self._poll(lambda: bool(flag[0]))
            return
        self._spin_fence(fence)

    def _poll(self, done: Callable[[], bool]) -> None:
        """Spin on ``done`` for ``spin_s`` (a sync is microseconds), then poll between short sleeps: a long wait
        must not hold a core the other side (or another process, on a shared machine) needs."""
        if done():
            return
        clock = time.perf_counter
        t0 = clock()
        spin_end = t0 + self.spin_s
        deadline = t0 + self.spin_timeout_s
        n = 0
        sleep = time.sleep
        while not done():
            n += 1
            if n & 15:
                continue
            now = clock()
            if now > spin_end:
                if now > deadline:
                    raise DeviceTimeoutError("a co-executed segment did not finish in time")
                # naps grow with the wait (at most 5% of it, 1 ms at most): a long wait costs little latency
                sleep(min(1e-3, max(self.nap_s, (now - t0) * 0.05)))

    def _spin_fence(self, fence: Any) -> None:
        d = self.device.device
        status = self._fence_status
        err: list[int] = []

        def done() -> bool:
            r = status(d, fence)
            if r < 0:
                err.append(r)
                return True
            return r == 0
        self._poll(done)
        if err:
            raise _vk_error(err[0], "vkGetFenceStatus")

    def run(self, feeds: Mapping[str, np.ndarray], trace: list[tuple[str, Any, float]] | None = None
            ) -> dict[str, np.ndarray]:
        """One inference. ``trace``: appended (op, what, perf_counter after it) per program step, and per layer
        inside a CPU region."""
        from ..vulkan.device import vk

        with self._lock:
            if self._closed:
                raise BackendError("this co-executed model is closed")
            b = self._b
            dev = self.device
            b.io.write(feeds)
            ev_mode = self.sync == "event"
            lib = self._lib
            d = dev.device
            submitted = 0
            clock = time.perf_counter
            from .. import native

            prev_threads = native.num_threads()
            if self.threads and self.threads != prev_threads:
                native.set_num_threads(self.threads)
            try:
                if self._fences:
                    lib.vkResetFences(d, len(self._fences), self._fence_array)
                if self._flags is not None:
                    self._flag_words[:len(self._segments)] = 0
                if ev_mode and self._segments:
                    # every segment goes to the queue now, each held by its event until the host sets it
                    for ev in self._events:
                        lib.vkResetEvent(d, ev)
                    with dev.queue_lock:
                        r = lib.vkQueueSubmit(dev.queue, 1, self._all_submit, self._fences[0])
                    if r != 0:
                        raise _vk_error(r, "vkQueueSubmit")
                    submitted = 1
                for op, arg in self.program:
                    if op == "submit":
                        if ev_mode:
                            lib.vkSetEvent(d, self._events[arg])
                        else:
                            dev.queue_submit(self._segments[arg].submit, self._fences[arg])
                            submitted = arg + 1
                    elif op == "cpu":
                        if trace is not None and arg.traced is not None:
                            arg.traced(trace)  # its layers one by one; the step noted below is its copy-out
                        else:
                            arg.call()
                    else:
                        self._wait(arg)
                    if trace is not None:
                        trace.append((op, arg if op != "cpu" else arg.tag, clock()))
                if ev_mode and submitted:
                    self._spin_fence(self._fences[0])  # the queue is done with the command buffers
            except BaseException as e:
                # never leave GPU work running over memory the next request reuses; no half answer goes out
                if ev_mode:
                    for ev in self._events:
                        lib.vkSetEvent(d, ev)  # release every segment still held, then let the queue drain
                if submitted:
                    try:
                        vk.vkWaitForFences(d, submitted, self._fences[:submitted], vk.VK_TRUE, 10 * 10**9)
                    except Exception:
                        pass
                if isinstance(e, BackendError):
                    raise
                raise BackendError(f"co-executed inference failed: {e!r}") from e
            finally:
                if native.num_threads() != prev_threads:
                    native.set_num_threads(prev_threads)
            return b.io.read()

    __call__ = run

    @property
    def _flag_words(self) -> np.ndarray:
        return self._flags.mapped.view(np.uint32)

    @property
    def input_infos(self) -> list[TensorInfo]:
        return self._b.input_infos

    @property
    def kernel_names(self) -> dict[str, str]:
        """Node name -> the kernels running it: 'gpu:<k>', 'cpu:<k>' or 'gpu:<k>+cpu:<k>' (split)."""
        out = {}
        for p in self.placements:
            parts = ([f"gpu:{p.gpu_kernel}"] if p.side != "cpu" else []) + ([f"cpu:{p.cpu_kernel}"] if p.side != "gpu" else [])
            out[p.name] = "+".join(parts)
        return out

    @property
    def memory_bytes(self) -> int:
        return int(self._b.memory_bytes + sum(r.size for r in self._regions)
                   + sum(ex.memory_bytes for ex in self.regions))

    def describe(self) -> list[dict[str, Any]]:
        return [dict(p.__dict__) for p in self.placements]

    def close(self) -> None:
        """Give everything back now: the CPU side (its regions' executors, with their arenas and weights, and the
        split layers' CPU halves, which the recorded program holds) and the device's (fences, events, regions, the
        Vulkan backend). Waits for a run under way. A daemon that unloads the model may still hold the object (its
        status, a request's reply on its way): until this, a closed model kept its CPU memory until it was
        collected."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            # the CPU side first: it needs no device (a device closed under the model leaves host memory to free)
            for ex in self.regions:
                ex.close()
            self.regions = []
            self.program = []
            self._close_device()

    def _close_device(self) -> None:
        from ..vulkan.device import vk

        b = getattr(self, "_b", None)
        dev = self.device
        if dev.closed or dev.device is None:
            return
        d = dev.device
        for ev in self._events:
            vk.vkSetEvent(d, ev)  # nothing stays held on the queue
        if self._fences:
            try:
                vk.vkWaitForFences(d, len(self._fences), self._fences, vk.VK_TRUE, 10 * 10**9)
            except Exception:
                pass
            for f in self._fences:
                vk.vkDestroyFence(d, f, None)
            self._fences = []
        for ev in self._events:
            vk.vkDestroyEvent(d, ev, None)
        self._events = []
        if b is not None:
            for p in self._extra_prepared:
                b._release(p)
            self._extra_prepared = []
        for r in self._regions:
            dev.free_region(r)
        self._regions = []
        if b is not None:
            b.close()

    def __enter__(self) -> "CoexecModel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _vk_error(r: int, call: str) -> BackendError:
    from ..vulkan.device import vk

    if r == vk.VK_ERROR_DEVICE_LOST:
        return DeviceLostError(f"the Vulkan device was lost ({call} during a co-executed inference)")
    return BackendError(f"{call} returned {r} during a co-executed inference")


_async: dict[int, bool] = {}


def async_submits(dev: Any) -> bool:
    """Whether ``vkQueueSubmit`` on ``dev`` returns before the work runs (needed for event mode and for any
    overlap at all). A GPU's queue does; lavapipe's only with Mesa's submit thread
    (``MESA_VK_ENABLE_SUBMIT_THREAD=1`` when the device was created), else it executes inside the submit. Probed
    once per device: a command buffer waiting on an unset event is submitted from a helper thread; a submit
    still inside the call after 200 ms executes synchronously (the host then sets the event to release it)."""
    from ..vulkan.device import vk

    key = id(dev)
    if key in _async:
        return _async[key]
    if dev.caps.device_type != "cpu":
        _async[key] = True
        return True
    d = dev.device
    ev = vk.vkCreateEvent(d, vk.VkEventCreateInfo(), None)
    pool = vk.vkCreateCommandPool(d, vk.VkCommandPoolCreateInfo(queueFamilyIndex=dev.queue_family), None)
    fence = vk.vkCreateFence(d, vk.VkFenceCreateInfo(), None)
    try:
        cb = vk.vkAllocateCommandBuffers(d, vk.VkCommandBufferAllocateInfo(
            commandPool=pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo())
        vk.vkCmdWaitEvents(cb, 1, [ev], vk.VK_PIPELINE_STAGE_HOST_BIT, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                           0, None, 0, None, 0, None)
        vk.vkEndCommandBuffer(cb)
        t = threading.Thread(target=dev.queue_submit,
                             args=([vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cb])], fence), daemon=True)
        t.start()
        t.join(0.2)
        result = not t.is_alive()
        vk.vkSetEvent(d, ev)
        t.join()
        vk.vkWaitForFences(d, 1, [fence], vk.VK_TRUE, 10 * 10**9)
    finally:
        vk.vkDestroyFence(d, fence, None)
        vk.vkDestroyCommandPool(d, pool, None)
        vk.vkDestroyEvent(d, ev, None)
    _async[key] = result
    if not result:
        log.warning("lavapipe executes command buffers inside vkQueueSubmit here: the CPU and the GPU halves of a "
                    "split cannot overlap (set MESA_VK_ENABLE_SUBMIT_THREAD=1 before the device is created)")
    return result


def _with_ldc(d: Any, ldc: int) -> Any:
    from dataclasses import replace

    return replace(d, push=dict(d.push, ldc=ldc))
