"""The streaming runtime on a Vulkan device: a model run inside a memory budget, its weights re-read from the
weights store, on the same engine as the CPU's (``inferd.runtime.stream.StreamingExecutor``).

The arena is one buffer of host-visible, host-coherent memory (host-cached where the device offers it): the
native loaders read each layer's weights into its mapping exactly as into the CPU arena, and the layers'
dispatches bind offsets of that buffer (activations, workspaces, weights: the FlexNN plan's boxes). On a device
whose memory is the host's (a Jetson's integrated GPU, lavapipe) that memory is the device's own; a discrete GPU
reads it over the bus (correct, slower than its own memory: the budget there is the host's).

What the CPU's compute thread does at once, the GPU does later: a step "has run" when the submission holding it
has completed. So the steps are recorded into command buffers (segments), and a segment ends (is submitted with
a fence) at every step some weight piece waits for; the loaders learn that such a step ran once its fence has
signalled (polled as the host goes on; waited for only when the host needs weights those pieces bring). Before
waiting for a layer's weights the host submits what it recorded so far, so the GPU computes while the loaders
read. Each segment begins with a barrier on the writes of the submissions before it; host writes (the loaders',
the inputs) are visible to a submission made after them.

Parameters of at most ``SMALL`` bytes (biases, shapes) live in one device region of their own, counted in the
budget with the arena. Nodes the Vulkan backend runs on the host (integer plumbing, control flow) run between two
segments on the arena's mapping, once what comes before has completed; a control-flow node's bodies are brought
up whole (resident, counted with the small parameters). Precision is fp32.
"""
from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import BackendError
from ..fileio import BLOCK
from ..ir import Graph
from ..ops.base import Kernel, Layer, choose_kernel, raw_key
from ..planner.memory import align_up
from ..runtime.stream import WALIGN, StreamError, StreamingExecutor, _Step, strip_constants, write_stream_store
from ..store import Entry
from . import raw
from .cold import ALIAS, HOST
from .device import Region, get_device, vk
from .executor import (DescriptorArena, DescriptorLease, Recorder, _applicable, _import_kernels, bind_descriptors,
                       bind_dispatches, default_kernel, fold_constants, kernel_caps, select_nodes)
from .kernel import UNUSABLE_PRIORITY, Caps, VulkanKernel, split_rows
from .shaders import norm_defines

log = logging.getLogger("inferd.vulkan.stream")


def fold_for_stream(graph: Graph) -> Graph:
    """``graph`` with its constant subgraphs folded (on the host, from the real constants: a folded weight
    transpose is a weight of its consumer) and the folded nodes gone: what the Vulkan streaming executor runs."""
    if graph.runtime_shaped:
        raise StreamError(f"{graph.name}: tensors shaped at run time cannot be planned into a static arena")
    _, consts, kept, _ = fold_constants(graph)
    used = {i for n in kept for i in n.inputs if i} | {t.name for t in graph.outputs}
    cs = {n: np.asarray(consts[n]) for n in used if n in consts}
    return Graph(graph.name, kept, list(graph.inputs), list(graph.outputs), cs, dict(graph.infos), graph.opset,
                 dict(graph.dims))


def vulkan_choice(graph: Graph, caps: Caps, kernels: Mapping[str, str] | None = None) -> list[tuple[Layer, Kernel]]:
    """(layer, kernel) per node of the folded ``graph``: alias nodes run nothing (``ALIAS``, no weights), the
    others their default (or forced) Vulkan kernel, a node the backend runs on the host ``HOST``."""
    from .host import is_host_node

    _import_kernels()
    forced = dict(kernels or {})
    consts = graph.constants
    host: set[str] = set()
    for n in graph.nodes:
        want = forced.get(n.name, forced.get(n.op))
        if is_host_node(n, graph, consts, (want,) if want else (), caps):
            host.add(n.name)
    dg = Graph(graph.name, [n for n in graph.nodes if n.name not in host], graph.inputs, graph.outputs, consts,
               graph.infos, graph.opset)
    choices = iter(select_nodes(graph, dg, caps, forced))
    out: list[tuple[Layer, Kernel]] = []
    for n in graph.nodes:
        if n.name in host:  # between two segments, on the arena's mapping; its constants stay in memory
            out.append((Layer.of(n, graph), HOST))
            continue
        c = next(choices)
        if c.default is None:
            out.append((replace(c.layer, const_inputs=()), ALIAS))
        else:
            out.append((c.layer, c.default))
    return out


def prepare_vulkan_stream_store(graph: Graph, path: str | os.PathLike, device: Any = None,
                                kernels: Mapping[str, str] | None = None, *,
                                facts: Mapping[str, Any] | None = None) -> tuple[Path, Graph]:
    """Fold ``graph`` and write (or keep) ``path``: every layer's parameters as its Vulkan kernel on ``device``
    transforms them, in run order. Returns the store and the folded graph to run (strip its constants with
    ``strip_constants`` to hold none). Needs the whole model: run it outside the budget. ``facts``
    (``device_facts``) in place of ``device``: what a child process compiling for the daemon's device is told of
    it (it opens no device)."""
    f = dict(facts) if facts is not None else device_facts(device or get_device())
    folded = fold_for_stream(graph)
    choice = vulkan_choice(folded, caps_of(f), kernels)
    return write_stream_store(folded, path, choice, dict(f["fingerprint"])), folded


def device_facts(dev: Any) -> dict[str, Any]:
    """What compiling a streamed model for ``dev`` needs of it, as plain data (JSON for a child process): the
    kernels' caps, the arena's alignment and the fingerprint its store carries."""
    from dataclasses import asdict

    return {"caps": asdict(kernel_caps(dev)), "fingerprint": dict(dev.fingerprint()), "align": arena_align(dev)}


def arena_align(dev: Any) -> int:
    """Where the arena's boxes start on ``dev``: storage-buffer bindings and texel views both bind there."""
    return max(64, dev.caps.min_storage_align, dev.min_texel_align)


def caps_of(facts: Mapping[str, Any]) -> Caps:
    c = dict(facts["caps"])
    c["max_workgroup_count"] = tuple(c["max_workgroup_count"])
    return Caps(**c)


def vulkan_kernel_memory(caps: Caps) -> Any:
    """``planner.slicing.KernelMemory`` of the Vulkan kernels on a device like ``caps``: each layer's default (or
    forced) kernel; its fallback is the fastest applicable kernel that needs less memory (weights and workspace:
    a Winograd conv's 4x weights give way to a GEMM's 1x)."""
    from ..planner.slicing import SLICE_SEP, KernelMemory, _kernel

    _import_kernels()

    def own(layer: Layer, k: Kernel) -> int:
        try:
            return int(k.transformed_nbytes(layer)) + int(k.workspace_nbytes(layer))  # type: ignore[attr-defined]
        except Exception:  # a kernel that cannot say: not a fallback
            return 1 << 62

    def kernel(layer: Layer, kernels: Mapping[str, str]) -> Kernel:
        want = kernels.get(layer.name.split(SLICE_SEP)[0])
        try:
            if want:
                k = choose_kernel(layer, "vulkan", want)
                if k.applies(layer):
                    return k
            return default_kernel(layer, caps)
        except Exception:  # no Vulkan kernel (an alias, a folded node): its memory as the CPU's
            return _kernel(layer, {})

    def workspace(layer: Layer, k: Kernel, alignment: int) -> int:
        return align_up(k.workspace_nbytes(layer), alignment) if isinstance(k, VulkanKernel) else 0

    def fallback(layer: Layer, k: Kernel) -> str | None:
        if not isinstance(k, VulkanKernel) or not layer.const_inputs:
            return None
        cur = own(layer, k)
        smaller = [(p, c.name) for c, p in _applicable(layer, caps).items()
                   if p < UNUSABLE_PRIORITY and own(layer, c) < cur]
        return min(smaller)[1] if smaller else None

    return KernelMemory(kernel, workspace, fallback, None)


def _sliced_kernels(g: Graph, kernels: Mapping[str, str]) -> dict[str, str]:
    """Kernel overrides by node name of the sliced graph ``g`` (each slice of a node the node's kernel, where it
    applies to the slice)."""
    from ..planner.slicing import SLICE_SEP

    out: dict[str, str] = {}
    for node in g.nodes:
        want = kernels.get(node.name.split(SLICE_SEP)[0])
        if want:
            try:
                if choose_kernel(Layer.of(node, g), "vulkan", want).applies(Layer.of(node, g)):
                    out[node.name] = want
            except Exception:
                pass
    return out


class VulkanStreamingExecutor(StreamingExecutor):
    """``StreamingExecutor`` on a Vulkan device. ``graph`` is a folded graph (``prepare_vulkan_stream_store``);
    ``device``: default the process's shared one. Options as the CPU executor's.

    ``mirror`` (default: where the device's memory is not the host's, a discrete GPU): the shaders work in a
    device-local copy of the arena, the loaders still read into the host one; each streamed layer's weights are
    copied across (a transfer on the GPU's timeline, in the layer's segment) before its dispatches, the resident
    ones once after they are read, the inputs at the start, the outputs and a host step's inputs back. On the
    H100 the shaders reading the host arena over the bus ran resnet50 at 3.1x the resident model's time with
    nothing streamed. The copy is device memory, outside the host budget (``device_bytes``)."""

    name = "vulkan-stream"
    backend = "vulkan"
    fuse_steps = False  # its steps record dispatches (``_run_step``): no native calls to fuse

    def __init__(self, graph: Graph, store_path: str | os.PathLike, budget: int, *, device: Any = None,
                 mirror: bool | None = None, **kw: Any) -> None:
        self.device = dev = device or get_device()
        if dev.closed:
            raise BackendError("the Vulkan device is closed")
        self.mirror = (not dev.shares_host_memory) if mirror is None else bool(mirror)
        self._dev_region: Region | None = None
        #: host -> device copies (offsets, bytes) to record before the next dispatch (a mirror's)
        self._pending_up: list[tuple[int, int]] = []
        self.caps = kernel_caps(dev)
        self.align = arena_align(dev)
        self._region: Region | None = None
        self._small_region: Region | None = None
        self._small_at: dict[str, dict[str, int]] = {}
        self._base = 0
        self._descriptors = DescriptorArena(dev)
        self._leases: list[DescriptorLease] = []
        self._texel_views: list[Any] = []
        self._cmd_pool = vk.vkCreateCommandPool(dev.device, vk.VkCommandPoolCreateInfo(
            queueFamilyIndex=dev.queue_family, flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT), None)
        self._cbs: list[Any] = []  # allocated command buffers, reused run after run
        self._next_cb = 0
        self._fences: list[Any] = []  # free ones
        self._seg: Recorder | None = None
        #: submitted segments in order: (fence, the steps whose completion it tells the loaders)
        self._inflight: list[tuple[Any, list[int]]] = []
        self._maxdep: dict[int, int] = {}
        self._upload: dict[int, tuple[int, int]] = {}
        self._hosts: dict[int, Any] = {}  # step -> HostStep
        self.segments = 0  # submissions of the last run
        self.copies = 0  # arena ranges copied between the host and the device in the last run (mirror)
        try:
            super().__init__(graph, store_path, budget, **kw)
        except BaseException:
            self._free_vulkan()
            raise
        dev.register_model(self)

    # ------------------------------------------------------------------ the backend's part
    def _select(self, graph: Graph, kernels: dict[str, str] | None,
                stored: dict[str, list[Entry]]) -> list[tuple[Layer, Kernel]]:
        # the store's kernels first: its weights are theirs (a kernel chosen again could differ: the large
        # constants here are stubs, and a kernel may look at a constant's values)
        fp = self.store.meta.get("fingerprint", {})
        if fp != self.device.fingerprint():
            raise StreamError(f"{self.store.path}: written for another device or engine ({fp.get('device_name')}, "
                              f"engine {fp.get('engine')}): write it again with prepare_vulkan_stream_store")
        forced = {name: ents[0].kernel.split("/", 1)[-1] for name, ents in stored.items() if ents}
        forced.update(kernels or {})
        return vulkan_choice(graph, self.caps, forced)

    def _small_ready(self) -> None:
        """The small parameters into one device region (the shaders bind them there); the host steps, a control-flow
        node's bodies brought up whole (resident beside the arena, counted with the small parameters)."""
        from .cold import VulkanColdBackend
        from .host import HostStep

        dev = self.device

        def body(b: Graph) -> Any:
            return VulkanColdBackend.loaded(b, device=dev)

        for pos, (layer, k) in enumerate(self.choice):
            if k is HOST:  # its constants as the store has them (the graph's large ones are stubs)
                consts = dict(self.graph.constants)
                mine = self.small.get(layer.name, {})
                consts.update({layer.node.inputs[i]: mine[raw_key(i)] for i in layer.const_inputs
                               if raw_key(i) in mine})
                hs = self._hosts[pos] = HostStep(layer.node, self.graph, consts, body, self.caps)
                self.small_bytes += sum(int(m.memory_bytes) for m in hs.models.values())
        place: list[tuple[str, str, np.ndarray, int]] = []
        end = 0
        hosts = {self.choice[p][0].name for p in self._hosts}
        for layer, arrs in self.small.items():
            if layer in hosts:  # read by the host only
                continue
            for key, a in arrs.items():
                place.append((layer, key, a, end))
                self._small_at.setdefault(layer, {})[key] = end
                end += align_up(max(a.nbytes, 4), self.align)
        if end:
            self._small_region = r = dev.allocate_region(end, f"stream-small:{self.graph.name}")
            dev.upload([(r, off, a) for _l, _k, a, off in place if a.nbytes])
            self.small_bytes += r.size
        # the arena's buffer is block aligned at both ends for O_DIRECT reads: its slack is the budget's too
        self.small_bytes += WALIGN + BLOCK

    def _in_memory(self, k: Kernel, e: Entry) -> bool:
        return k is HOST or super()._in_memory(k, e)  # a host step reads its constants where it runs

    def _scratch_bytes(self, layer: Layer, k: Kernel) -> int:
        return align_up(k.workspace_nbytes(layer), self.align) if isinstance(k, VulkanKernel) else 0

    def _new_arena(self, nbytes: int) -> np.ndarray:
        dev = self.device
        whole = align_up(max(nbytes, 1), BLOCK) + WALIGN
        r = dev.allocate_region(whole, f"stream:{self.graph.name}", host=True)
        if r.mapped is None or not r.coherent:
            dev.free_region(r)
            raise StreamError(f"{self.graph.name}: the device offers no host-visible, host-coherent memory for a "
                              f"streamed arena")
        base = -r.mapped.ctypes.data % WALIGN  # O_DIRECT reads land on block-aligned host addresses
        if base % self.align or base + nbytes > r.size:
            dev.free_region(r)
            raise StreamError(f"{self.graph.name}: the arena's mapping cannot be aligned for both the loaders and "
                              f"the shaders (offset {base})")
        self._region, self._base = r, base
        if self.mirror:
            try:
                self._dev_region = dev.allocate_region(whole, f"stream-device:{self.graph.name}")
            except BaseException:
                dev.free_region(r)
                self._region = None
                raise
        return r.mapped[base:base + nbytes]

    def _drop_arena(self) -> None:
        self._wait_all(publish=False)
        self._unbind_vulkan()
        for r in (self._region, self._dev_region):
            self.device.free_region(r)
        self._region = self._dev_region = None
        self.arena = None  # type: ignore[assignment]

    def _unbind_vulkan(self) -> None:
        for lease in self._leases:
            self._descriptors.free(lease)
        self._leases = []
        if self._texel_views:
            raw.destroy_buffer_views(self.device.device, self._texel_views)
            self._texel_views = []

    def _bind(self) -> None:
        self._unbind_vulkan()
        super()._bind()
        # per loader unit, the last step its pieces wait for: published before the host waits for that unit
        units = sorted(self._pieces)
        self._maxdep = {u: max((pc.dep for pc in self._pieces[pos]), default=-1) for u, pos in enumerate(units)}
        # (a mirror's) per streamed step, its weights' box: copied to the device before the step, every run
        self._upload = {s.pos: self._box(s.pos)[1:] for s in self.steps if s.blobs and not self.plan.resident[s.pos]}

    def _make_step(self, pos: int, layer: Layer, k: Kernel, params: dict[str, np.ndarray], woff: int,
                   alias: bool) -> tuple[Callable[[], None] | None, dict[int, np.ndarray], Any]:
        if k is HOST:
            return None, {}, self._hosts[pos]
        if alias or not isinstance(k, VulkanKernel):
            return None, {}, None
        dev, caps = self.device, self.caps
        ds = split_rows(k.dispatches(layer, params, caps), caps)
        if not ds:
            return None, {}, None
        mods = self.device.shader_cache.get_many([(d.shader, norm_defines(d.defines)) for d in ds])
        pipes = dev.pipelines([(m, dict(d.spec)) for d, m in zip(ds, mods)])
        region, base, arena = self._dev_region or self._region, self._base, self.arena
        assert region is not None
        at = arena.ctypes.data
        small = self._small_at.get(layer.name, {})
        weights: dict[str, tuple[Region, int]] = {}
        for key, a in params.items():
            if key in small and self._small_region is not None:
                weights[key] = (self._small_region, small[key])
            elif isinstance(a, np.ndarray) and a.base is not None and 0 <= a.ctypes.data - at < arena.nbytes:
                weights[key] = (region, base + a.ctypes.data - at)
        offsets, infos, aliases = self.plan.offsets, self.graph.infos, self.aliases

        def locate(t: str) -> tuple[Region, int, int]:
            return region, base + offsets[aliases.get(t, t)], infos[t].nbytes

        ws = (region, base + woff) if k.workspace_nbytes(layer) else None
        bound = bind_dispatches(dev, pos, layer, k, ds, pipes, self.graph.constants, locate, ws, params, weights)
        lease = bind_descriptors(dev, bound, self._texel_views, self._descriptors)
        if lease is not None:
            self._leases.append(lease)
        return None, {}, bound

    # ------------------------------------------------------------------ running: segments and fences
    def _run_step(self, s: _Step) -> None:
        if s.kernel is HOST:
            self._host_step(s)
        elif s.work:
            rec = self._segment()
            if self.mirror and s.pos in self._upload:  # this run's read of its weights
                self._copy(rec, True, [self._upload[s.pos]])
            for b in s.work:
                rec.dispatch(b)

    def _host_step(self, s: _Step) -> None:
        """A node the host runs: everything before it completes first; its writes are visible to the submissions
        after it."""
        if self.mirror:  # its inputs back from the device first
            self._copy(self._segment(), False, self._tensor_ranges(i for i in s.layer.node.inputs
                                                                   if i and i not in self.graph.constants))
        self._before_load()
        views = self.views

        def write(name: str, a: np.ndarray) -> None:
            v = views[name]
            if tuple(a.shape) != tuple(v.shape):
                raise BackendError(f"host step {s.layer.name}: output {name!r} of shape {list(a.shape)} where the "
                                   f"plan has {list(v.shape)}")
            np.copyto(v, a, casting="unsafe")

        s.work.run(lambda name: np.array(views[name]), write)
        if self.mirror:  # its outputs to the device, before whatever reads them
            self._pending_up += self._tensor_ranges(o for o in s.layer.node.outputs if o)

    def _tensor_ranges(self, names: Any) -> list[tuple[int, int]]:
        """(arena offset, bytes) of activation tensors."""
        offs, infos, aliases = self.plan.offsets, self.graph.infos, self.aliases
        out = []
        for n in names:
            root = aliases.get(n, n)
            if root in offs and infos[n].nbytes:
                out.append((offs[root], int(infos[n].nbytes)))
        return out

    def _copy(self, rec: Recorder, up: bool, ranges: Sequence[tuple[int, int]]) -> None:
        """Record copies of arena ranges between the host arena and the device one (``up``: host to device),
        ordered after every earlier write and read, and before everything after them."""
        if not ranges or self._dev_region is None or self._region is None:
            return
        host, devr, base = self._region, self._dev_region, self._base
        src, dst = (host, devr) if up else (devr, host)
        rec.copy(src.buffer, dst.buffer, [(base + o, base + o, n) for o, n in ranges])
        self.copies += len(ranges)

    def _segment(self) -> Recorder:
        if self._seg is None:
            d = self.device.device
            if self._next_cb < len(self._cbs):
                cb = self._cbs[self._next_cb]
                vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(
                    flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
            else:
                cb = raw.allocate_command_buffer(d, self._cmd_pool)
                self._cbs.append(cb)
            self._next_cb += 1
            self._seg = Recorder(cb)
            self._seg.full_barrier()  # after the writes of the submissions before (this run's and the last's)
        if self._pending_up:
            ups, self._pending_up = self._pending_up, []
            self._copy(self._seg, True, ups)
        return self._seg

    def _submit(self, publish: list[int]) -> None:
        rec, self._seg = self._seg, None
        assert rec is not None
        raw.end_command_buffer(rec.cb)
        d = self.device.device
        if self._fences:
            fence = self._fences.pop()
            self.device.reset_fence(fence)
        else:
            fence = vk.vkCreateFence(d, vk.VkFenceCreateInfo(), None)
        try:
            self.device.submit_buffers([rec.cb], fence)
        except BaseException:
            self._fences.append(fence)
            raise
        self._inflight.append((fence, publish))
        self.segments += 1

    def _retire(self, publish: bool) -> None:
        """The oldest submission has completed: tell the loaders its steps ran."""
        fence, steps = self._inflight.pop(0)
        self._fences.append(fence)
        if publish and self._native is not None:
            from .. import native

            for p in steps:
                native.lib.inferd_stream_done(self._native, p)

    def _poll(self) -> None:
        d = self.device.device
        while self._inflight and vk.lib.vkGetFenceStatus(d, self._inflight[0][0]) == vk.VK_SUCCESS:
            self._retire(True)

    def _wait_first(self, publish: bool = True) -> None:
        self.device.wait_fence(self._inflight[0][0])
        self._retire(publish)

    def _publish(self, pos: int) -> None:
        if self._seg is not None and self._seg.count:
            self._submit([pos])
        elif self._inflight:  # nothing recorded since the last submission: pos has run once that has
            self._inflight[-1][1].append(pos)
        else:  # everything before completed already
            super()._publish(pos)
        self._poll()

    def _before_wait(self, unit: int) -> None:
        if self._seg is not None and self._seg.count:
            self._submit([])  # the GPU computes what is recorded while the loaders finish this unit
        md = self._maxdep.get(unit, -1)
        last = max((i for i, (_f, steps) in enumerate(self._inflight) if any(p <= md for p in steps)), default=-1)
        for _ in range(last + 1):
            self._wait_first()
        self._poll()

    def _before_load(self) -> None:
        if self._seg is not None and self._seg.count:
            self._submit([])
        self._wait_all(publish=True)

    def _drain(self) -> None:
        rec = self._segment()
        if self.mirror:
            self._copy(rec, False, self._tensor_ranges(t.name for t in self.graph.outputs))
        # the outputs, written by shaders, read by the host after the fence
        vk.vkCmdPipelineBarrier(rec.cb, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, vk.VK_PIPELINE_STAGE_HOST_BIT, 0, 1,
                                [vk.VkMemoryBarrier(srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT,
                                                    dstAccessMask=vk.VK_ACCESS_HOST_READ_BIT)], 0, None, 0, None)
        self._submit([])
        self._wait_all(publish=True)

    def _wait_all(self, publish: bool) -> None:
        while self._inflight:
            self._wait_first(publish)
        if self._seg is not None:  # recorded, never submitted (a failed run): dropped
            raw.end_command_buffer(self._seg.cb)
            self._seg = None
        if self._next_cb:
            vk.vkResetCommandPool(self.device.device, self._cmd_pool, 0)
            self._next_cb = 0

    def _abort(self) -> None:
        try:
            self._wait_all(publish=False)
        except Exception:  # the device is lost: nothing more will run on it
            log.exception("%s: waiting for the GPU after a failed run", self.graph.name)

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.segments = self.copies = 0
        if self.mirror:
            # the inputs (the host writes them next), and the resident weights when they are read in this run
            ups = self._tensor_ranges(t.name for t in self.graph.inputs)
            if not self._resident_loaded:
                ups += [(b.offset, b.size) for b in self.plan.boxes if b.kind == "resident"]
            self._pending_up = ups
        return super()._run(feeds)

    # ------------------------------------------------------------------ accounting, teardown
    @property
    def memory_breakdown(self) -> dict[str, int]:
        return {**super().memory_breakdown, "device_bytes": int(self._dev_region.size if self._dev_region else 0)}

    @property
    def kernel_names(self) -> dict[str, str]:
        return {layer.name: k.name for layer, k in self.choice}

    def close(self) -> None:
        super().close()
        self._free_vulkan()

    def _free_vulkan(self) -> None:
        dev = self.device
        if dev.closed or dev.device is None:
            return
        d = dev.device
        try:
            self._wait_all(publish=False)
        except Exception:  # a device lost under a run: what was in flight will not complete
            self._inflight = []
            try:
                dev.wait_idle()
            except Exception:
                pass
        self._unbind_vulkan()
        for h in self._hosts.values():
            h.close()
        self._hosts = {}
        self._descriptors.destroy()
        for r in (self._region, self._dev_region, self._small_region):
            dev.free_region(r)
        self._region = self._dev_region = self._small_region = None
        for f in self._fences:
            vk.vkDestroyFence(d, f, None)
        self._fences = []
        if self._cmd_pool is not None:
            vk.vkDestroyCommandPool(d, self._cmd_pool, None)
            self._cmd_pool = None
            self._cbs = []


def vulkan_fit(graph: Graph, facts: Mapping[str, Any]) -> tuple[int, Callable[[int], Any]]:
    """How a budget is fitted on the device ``facts`` describe: the bytes kept beside the arena (an estimate: the
    small parameters, the arena's block slack) and ``fit(arena_bytes) -> MemConfig`` (``fit_config`` with the
    Vulkan kernels' memory and fallback)."""
    from ..planner.slicing import fit_config
    from ..runtime.stream import small_bytes

    km = vulkan_kernel_memory(caps_of(facts))
    return (small_bytes(graph) + WALIGN + BLOCK,
            lambda b: fit_config(graph, b, km=km, alignment=int(facts["align"])))


def store_for_config(graph: Graph, cfg: Any, prefix: Path, facts: Mapping[str, Any]
                     ) -> tuple[Path, Graph, dict[str, str]]:
    """``graph`` sliced and its kernels fallen back as ``cfg`` says, its store written (or kept) at ``prefix``
    and the configuration's key: the store, the folded graph and the kernels by node name."""
    import hashlib

    from ..planner.slicing import slice_graph

    g = slice_graph(graph, cfg.slices, cfg.in_slices)
    kernels = _sliced_kernels(g, cfg.kernels)
    tag = hashlib.sha256(cfg.key().encode()).hexdigest()[:12]
    store, folded = prepare_vulkan_stream_store(g, Path(f"{prefix}-{tag}.vkstore"), kernels=kernels, facts=facts)
    return store, folded, kernels


def vulkan_stream_for_budget(graph: Graph, budget: int, work: str | os.PathLike, *, device: Any = None,
                             config: Any = None, **kw: Any) -> VulkanStreamingExecutor:
    """``stream_for_budget`` on a Vulkan device: the graph's Vulkan kernels fallen back and sliced as the budget
    requires (``vulkan_fit``; ``config`` to impose one), folded, its store written under ``work`` once per
    configuration (outside the budget)."""
    from ..runtime.stream import fit_and_build

    dev = device or get_device()
    facts = device_facts(dev)
    reserve, fit = vulkan_fit(graph, facts)

    def build(cfg: Any) -> VulkanStreamingExecutor:
        store, folded, _kernels = store_for_config(graph, cfg, Path(work) / graph.name, facts)
        return VulkanStreamingExecutor(strip_constants(folded), store, budget, device=dev, **kw)

    return fit_and_build(budget, reserve, fit, build, config)
