"""Streaming CPU runtime: a model run inside a memory budget, its weights re-read from the weights store.

One static arena of the budget's size holds everything the plan (``planner.flex``) places: activations,
each layer's kernel workspace (the im2col / Winograd buffers, handed to the kernels as their scratch),
the streamed weights and the resident ones. Loader threads read each layer's already transformed
weights from the store into their planned offsets; the compute thread runs the layers. Dependencies
come from the plan: ``load(i)`` after ``comp(load_after[i])`` (the last step that used those addresses),
``comp(i)`` after ``load(i)``. A layer's weights are read in pieces (``PIECE`` bytes at the finest,
``PIECE_MAX`` at most), each after the last step that used *its* addresses: where the plan could not
preload a whole layer (a tight budget), the part of it that lands on memory already free still loads while
the step before runs. Pieces next to each other in the store whose dependencies have run go in one read of
up to ``RUN`` bytes. Every kernel is bound once to its arena views, so a run is the same native calls as the
unconstrained executor's, fed by the loaders.

Read modes: ``cache`` (through the page cache; one loader, niced: there a read is a copy, CPU work) and
``bypass`` (``O_DIRECT`` straight into the arena, ``bypass_readers`` loaders so that several reads are in
flight, as a disk needs to reach its rate; ``posix_fadvise(DONTNEED)`` after each read where the file system
refuses ``O_DIRECT``), so the cache does not keep what the budget left out. ``ondemand`` is the baseline:
no loader thread, no preloading, no resident weights; each layer reads its weights just before it runs.

Parameters of at most ``SMALL`` bytes (biases, shapes, scales) stay in process memory, counted in
``small_bytes`` and taken off the budget before the arena is sized; so is the largest buffer a layer's native
code allocates for itself while it runs (``Kernel.native_scratch_nbytes``: a blocked conv's padded copy of its
input).

``prepare_stream_store`` writes the store (each layer's transformed weights in run order): a one-off step
that needs the whole model, outside the budget, as compiling a package is.
"""
from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .. import __version__, faults, native
from ..backends.base import transformed_key
from ..errors import InferdError, WeightsStoreError
from ..ir import Graph
from ..ops import conv as _conv
from ..ops.base import Kernel, Layer, kernels_for, op_spec, raw_params
from ..planner.flex import BudgetTooSmall, FlexPlan, LayerMem, min_budget, plan_budget, plan_flex
from ..planner.memory import align_up, graph_buffers
from ..store import Entry, StoreWriter, WeightsStore, aligned_empty, checksum
from ..fileio import BLOCK, ShortRead, huge_bytes, readv
from .cpu import select_kernels

log = logging.getLogger(__name__)

SMALL = 16 << 10
ALIGN = 64
#: weight boxes and each blob in them start on a block boundary: ``O_DIRECT`` reads land in place
WALIGN = 4096
#: the finest piece the loader reads on its own dependency; neighbouring pieces that wait for the same step
#: are read together (fewer, larger reads: ``O_DIRECT`` reaches the disk's rate only with large ones)
PIECE = 256 << 10
#: the loader joins the pieces next in its queue whose dependencies have run and that follow each other in the
#: store into one ``preadv`` of up to RUN bytes (a gap of small parameters, up to GAP bytes, read into a
#: scratch buffer): small layers' blobs otherwise go one request each, at the disk's latency, not its rate
RUN = 4 << 20
GAP = 32 << 10
#: the largest piece: a large layer's weights go in several reads that several loaders (and the compute thread)
#: can have in flight at once, and one loader joins them back up to RUN bytes when it is alone
PIECE_MAX = 1 << 20
MODES = ("preload", "ondemand")
READS = ("cache", "bypass")


def _joined(pcs: Sequence[_Piece]) -> list[list[_Piece]]:
    """``pcs`` (one layer's pieces) in reads as the loaders join them: neighbours in the store, gaps of at most
    ``GAP`` bytes, up to ``RUN`` bytes a read."""
    runs: list[list[_Piece]] = []
    for pc in pcs:
        if runs:
            run = runs[-1]
            end = run[-1].file_off + run[-1].span.nbytes
            if 0 <= pc.file_off - end <= GAP and pc.file_off + pc.span.nbytes - run[0].file_off <= RUN:
                run.append(pc)
                continue
        runs.append([pc])
    return runs


def _xxh3_fn() -> Any:
    """The store's checksum (xxh3-64, seed 0) as a C function pointer for the native loaders (``store.xxh3_c``): both
    sides compute the same sum by the same code. NULL where there is none: the compute thread then verifies each
    layer after waiting for it."""
    from ..store import xxh3_c

    fn = xxh3_c()
    return native.ffi.NULL if fn is None else fn


class StreamError(InferdError):
    pass


def choice_digest(graph: Graph, choice: Sequence[tuple[Layer, Kernel]]) -> str:
    h = hashlib.sha256(graph.name.encode())
    for layer, k in choice:
        h.update(f"{layer.name}:{k.name};".encode())
    return h.hexdigest()


def prepare_stream_store(graph: Graph, path: str | os.PathLike, kernels: dict[str, str] | None = None) -> Path:
    """Write (or keep, if it matches) ``path``: every layer's transformed parameters in run order, for the
    kernels ``select_kernels`` picks. Needs the graph's constants: run it outside the budget."""
    return write_stream_store(graph, path, select_kernels(graph, "cpu", kernels), {"backend": "cpu"})


def store_backend(st: WeightsStore) -> str:
    """The backend whose kernels transformed a streaming store's weights."""
    return str(st.meta.get("fingerprint", {}).get("backend", "cpu"))


def write_stream_store(graph: Graph, path: str | os.PathLike, choice: Sequence[tuple[Layer, Kernel]],
                       fingerprint: dict[str, Any]) -> Path:
    """Write (or keep, if it was written for the same choice, engine and ``fingerprint``: its ``backend``, and the
    device the kernels were chosen for) the store of ``choice``'s layers' parameters as their kernels transform
    them, in run order."""
    path = Path(path)
    digest = choice_digest(graph, choice)
    backend = str(fingerprint["backend"])
    if path.exists():
        try:
            with WeightsStore(path) as st:
                if st.model_sha256 == digest and st.meta.get("engine_version") == __version__ \
                        and st.meta.get("fingerprint", {}) == fingerprint:
                    return path
        except WeightsStoreError as e:
            log.warning("stream store %s unusable (%s): rewriting", path, e)
    log.info("writing the streaming weights store %s (outside the memory budget: needs the whole model)", path)
    with StoreWriter(path, digest, __version__, dict(fingerprint)) as w:
        for layer, k in choice:
            if not layer.const_inputs:
                continue
            params = k.transform(layer, raw_params(layer, graph.constants))
            for key, a in params.items():
                if not isinstance(a, np.ndarray):
                    raise StreamError(f"{layer.name}: kernel {k.name} keeps a non-array parameter {key!r}; "
                                      f"it cannot be streamed")
                w.add(layer.name, key, a, kernel=transformed_key(backend, k.name), variant="transformed")
    return path


@dataclass
class _Step:
    pos: int
    layer: Layer
    kernel: Kernel
    call: Callable[[], None] | None  # None: an alias (a view, nothing to run)
    #: (entry, arena view) of the streamed parameters
    blobs: list[tuple[Entry, np.ndarray]] = field(default_factory=list)
    scratch: dict[int, np.ndarray] = field(default_factory=dict)
    #: what another backend runs for this step (the Vulkan one: its dispatches, bound to the arena)
    work: Any = None


@dataclass
class _Segment:
    """Steps a run executes between two hand-offs with the loaders: ``first`` (the step whose weights are waited
    for before it, or None), ``calls`` (consecutive native steps fused into one C call, the others one call each),
    and ``publish`` (the last step's position where a loader waits for it to have run, else None)."""

    first: _Step | None
    calls: list[Callable[[], None]]
    publish: int | None
    #: the steps whose calls it runs, in order (aliases run nothing and are left out)
    positions: list[int] = field(default_factory=list)


@dataclass
class _Piece:
    """Part of one streamed blob: ``span`` (arena bytes, block padded) read from ``file_off`` once step
    ``dep`` has run (-1: at the run's start)."""

    entry: Entry
    span: np.ndarray
    file_off: int
    nbytes: int  # bytes of data (the span may be longer: the block padding a direct read fills)
    dep: int
    key: tuple[str, str]
    offset: int  # in the arena (for the tracker)


class ArenaTracker:
    """The instrumented allocator: every box is claimed when it starts being live (a load begins, a step
    writes its outputs) and released when its last reader has run. Claiming bytes another live box holds,
    or outside the arena, is a violation; ``high_water`` is the highest address ever claimed."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.live: dict[tuple[str, str], tuple[int, int]] = {}
        self.high_water = 0
        self.violations: list[str] = []
        self.claims = 0
        self._lock = threading.Lock()

    def claim(self, key: tuple[str, str], off: int, size: int) -> None:
        with self._lock:
            end = off + size
            self.claims += 1
            if off < 0 or end > self.size:
                self.violations.append(f"{key} [{off}, {end}) outside the arena of {self.size} bytes")
            for k, (o, e) in self.live.items():
                if k != key and o < end and off < e:
                    self.violations.append(f"{key} [{off}, {end}) overwrites live {k} [{o}, {e})")
            self.live[key] = (off, end)
            self.high_water = max(self.high_water, end)

    def release(self, key: tuple[str, str]) -> None:
        with self._lock:
            self.live.pop(key, None)


class StreamingExecutor:
    """Run ``graph`` inside ``budget`` bytes with its weights streamed from ``store_path``.

    The engine is backend-independent: the plan, the pieces, the loaders, the budget changes and the tracker are
    the same for every backend; a backend says which kernels run (``_select``), which parameters stay in memory
    (``_in_memory``, ``_small_ready``), what workspace a layer takes (``_scratch_bytes``), where the arena lives
    (``_new_arena``, ``_drop_arena``), what a step runs (``_make_step``, ``_run_step``) and, where its steps
    complete after ``_run_step`` returns (a GPU's), when a step has run (``_publish``, ``_before_wait``,
    ``_before_load``, ``_drain``, ``_abort``). This class is the CPU's; ``inferd.vulkan.stream.VulkanStreamingExecutor``
    the Vulkan one.

    ``mode``: "preload" (the FlexNN plan, loader thread, resident weights where the budget allows) or
    "ondemand" (the baseline). ``read``: "cache" or "bypass". ``track``: check every run with an
    ``ArenaTracker`` (slower: for tests). ``plan``: a plan made earlier for the same layers (re-use)."""

    name = "cpu-stream"
    #: the compute thread reads the pieces of a layer it waits for (False: it only waits; for comparison)
    steal = True
    #: niceness of the loader thread when reading through the page cache: there a read is a copy, CPU work
    #: that competes with the compute threads for the same cores; at a lower priority the loader copies ahead
    #: with the time they leave, and the compute thread reads what is still missing when it gets there
    #: (0: same priority as compute)
    cache_loader_nice = 10
    #: "idle": the loader through the page cache runs in the idle scheduling class instead (SCHED_IDLE: only on
    #: a core that nothing else wants, preempted as soon as a compute thread wakes); "nice": at
    #: ``cache_loader_nice``
    cache_loader_sched = "idle"
    #: through the page cache, the native pool's workers read pieces too while they wait for the next layer's job
    #: (the compute thread's Python between two layers): a copy there takes no core the compute wants
    pool_reads = True
    #: loader threads when bypassing the page cache: the reads in flight (a direct read is the disk's time, not
    #: the CPU's, so more loaders cost no compute; an SSD reaches its rate only with a queue of reads)
    bypass_readers = 3
    #: loader threads through the page cache (0: the compute thread reads each layer's pieces itself; on the
    #: 2-core machine, where the native pool takes every core, 0 and 1 measured the same within the noise)
    cache_loaders = 1
    #: runs of consecutive native steps between the loaders' hand-offs execute as one C call (``native.fuse_calls``:
    #: no Python between layers); a backend whose steps are not native calls sets it off
    fuse_steps = True
    #: backend of the kernels (the store's transformed entries name it) and the arena's alignment
    backend = "cpu"
    align = ALIGN

    def __init__(self, graph: Graph, store_path: str | os.PathLike, budget: int, *, mode: str = "preload",
                 read: str = "cache", keep_resident: bool = True, track: bool = False,
                 kernels: dict[str, str] | None = None, read_bw: float = 0.0,
                 max_preload: int | None = None, compute_s: Sequence[float] | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if read not in READS:
            raise ValueError(f"read must be one of {READS}, got {read!r}")
        if graph.runtime_shaped:
            raise StreamError(f"{graph.name}: tensors shaped at run time cannot be planned into a static arena")
        self.graph = graph
        self.mode = mode
        self.read = read
        self.budget = int(budget)
        # bypass: O_DIRECT straight into the arena where the file system allows it, else buffered reads
        # dropped after each blob (without readahead, which would cache the next blobs behind the drop)
        self.store = WeightsStore(store_path, direct=read == "bypass")
        if store_backend(self.store) != self.backend:
            got = store_backend(self.store)
            self.store.close()
            raise StreamError(f"{self.store.path}: its weights are transformed for the {got} backend's kernels, not "
                              f"the {self.backend} backend's")
        if read == "bypass" and not self.store.direct:
            os.posix_fadvise(self.store._fd, 0, 0, os.POSIX_FADV_RANDOM)
        self.inputs = list(graph.inputs)
        self.outputs = list(graph.outputs)
        t0 = time.perf_counter()
        # kernels: what the store holds per layer (its transformed weights), else the default
        by_layer: dict[str, list[Entry]] = {}
        for e in sorted(self.store.entries.values(), key=lambda e: e.offset):
            by_layer.setdefault(e.layer, []).append(e)
        self.choice: list[tuple[Layer, Kernel]] = []
        for layer, k in self._select(graph, kernels, by_layer):
            ents = by_layer.get(layer.name)
            if layer.const_inputs:
                if not ents:
                    raise StreamError(f"{self.store.path}: no weights for layer {layer.name!r}; "
                                      f"rewrite it with prepare_stream_store")
                kname = ents[0].kernel.split("/", 1)[-1]
                if kname != k.name:
                    named = [c for c in kernels_for(layer.op, self.backend) if c.name == kname]
                    if not named or not named[0].applies(layer):
                        raise StreamError(f"{self.store.path}: layer {layer.name!r} stored for kernel {kname!r}, "
                                          f"which does not apply here")
                    k = named[0]
            for o in layer.node.outputs:
                if o and o in graph.constants and o in {t.name for t in graph.outputs}:
                    raise StreamError(f"{graph.name}: a graph output that is a constant is not supported")
            self.choice.append((layer, k))
        self.small: dict[str, dict[str, np.ndarray]] = {}
        self._gap = aligned_empty(GAP)  # where the loader's joined reads drop the bytes between blobs
        self.small_bytes = GAP
        big: dict[int, list[Entry]] = {}
        for pos, (layer, k) in enumerate(self.choice):
            for e in by_layer.get(layer.name, []) if layer.const_inputs else []:
                if self._in_memory(k, e):
                    self.small.setdefault(layer.name, {})[e.tensor] = self.store.read(e)
                    self.small_bytes += e.size
                else:
                    big.setdefault(pos, []).append(e)
        self._big = big
        # the most a layer's native code allocates beside the arena while it runs (a blocked conv's padded copy of
        # its input: 1.7 MiB for resnet50's first strided 3x3), off the budget like the small parameters
        self.native_scratch = max((k.native_scratch_nbytes(layer) for layer, k in self.choice), default=0)
        self.small_bytes += self.native_scratch
        self._small_ready()
        acts, self.aliases = graph_buffers(graph)
        self.activations = acts
        times = list(compute_s) if compute_s is not None and len(compute_s) == len(self.choice) else None
        self.layer_mem = [LayerMem(layer.name, sum(align_up(e.size, WALIGN) for e in big.get(pos, [])),
                                   self._scratch_bytes(layer, k), times[pos] if times else 0.0)
                          for pos, (layer, k) in enumerate(self.choice)]
        # more than every box side by side is never needed: a larger budget plans (and allocates) no more
        self._ample = sum(lm.weights for lm in self.layer_mem) + max((lm.workspace for lm in self.layer_mem),
                                                                     default=0) \
            + sum(align_up(b.size, self.align) for b in acts) + self.align \
            + WALIGN * (1 + sum(1 for lm in self.layer_mem if lm.weights))  # gaps before block-aligned weights
        self._plan_opts = dict(keep_resident=keep_resident, read_bw=read_bw, max_preload=max_preload)
        self.plan = self._make_plan(self.budget)
        self.plan_s = time.perf_counter() - t0
        self.arena_budget = self.plan.budget
        self.arena = self._new_arena(self.arena_budget)
        self.track = track
        self.tracker: ArenaTracker | None = None
        self._bind()
        self._resident_loaded = False
        self.outside_scratch = 0
        self.stats: dict[str, float] = {}
        #: held by a run and by a budget change: the arena is swapped only between runs
        self.lock = threading.Lock()
        self._pending: tuple[FlexPlan, int, float] | None = None
        self._pending_lock = threading.Lock()
        self.adapt_s: list[float] = []  # per change: from the request to the new arena in place
        self.swap_s: list[float] = []  # per change: the swap itself (under the run lock)

    #: the arena in transparent huge pages (fileio.huge_bytes): the loaders' copies into it and the layers'
    #: sweeps over it walk a page table 512 times less often
    huge_arena = True

    def _new_arena(self, nbytes: int) -> np.ndarray:
        whole = align_up(max(nbytes, 1), BLOCK)  # O_DIRECT reads land block-aligned up to the arena's end
        a = huge_bytes(whole, BLOCK) if self.huge_arena else aligned_empty(whole)
        return a[:nbytes]

    def _make_plan(self, budget: int) -> FlexPlan:
        """The memory plan for ``budget`` over this executor's layers (their slicing and kernels kept)."""
        arena_budget = min(budget - self.small_bytes, self._ample)
        if arena_budget <= 0:
            need = self.small_bytes + self.min_arena()
            raise BudgetTooSmall(f"{self.graph.name}: the memory budget {budget} bytes does not even hold the "
                                 f"{self.small_bytes} bytes of small parameters: the model needs at least {need} "
                                 f"bytes ({need / 2**20:.2f} MiB)", budget, need)
        try:
            if self.mode == "ondemand":
                return plan_flex(self.layer_mem, self.activations, arena_budget, preload=False, alignment=self.align,
                                 weight_alignment=WALIGN)
            return plan_budget(self.layer_mem, self.activations, arena_budget, preload=True, alignment=self.align,
                               weight_alignment=WALIGN, **self._plan_opts)
        except BudgetTooSmall as e:
            need = self.small_bytes + (e.need or self.min_arena())
            raise BudgetTooSmall(f"{self.graph.name}: memory budget {budget} bytes ({budget / 2**20:.2f} MiB) "
                                 f"is too small: the model needs at least {need} bytes ({need / 2**20:.2f} MiB), "
                                 f"short by {need - budget} bytes", budget, need) from None

    def set_budget(self, budget: int, wait: bool = True) -> dict[str, float]:
        """Re-plan memory only (slicing and kernels kept) for ``budget`` and swap the arena between runs.
        ``BudgetTooSmall`` (the executor unchanged) when this configuration does not fit: re-slice then
        (``stream_for_budget``). ``wait`` False: when a run holds the arena, hand the new plan to it (it
        swaps as it ends) and return at once, with ``pending`` set. Returns the seconds spent planning,
        waiting for a run to end, and swapping (``adapt_s`` keeps each change's total), and ``streams`` (1.0: weights
        are read on every run within this budget)."""
        t0 = time.perf_counter()
        plan = self._make_plan(int(budget))  # pure: no lock, the current run goes on
        t1 = time.perf_counter()
        # whether this budget has weights read on every run (its slicing then matters: ``faster_config``)
        streams = float(any(lm.weights and not plan.resident[i] for i, lm in enumerate(self.layer_mem)))
        if not self.lock.acquire(blocking=wait):
            with self._pending_lock:
                self._pending = (plan, int(budget), t0)
            if self.lock.acquire(blocking=False):  # the run ended meanwhile: apply it here
                try:
                    self._apply_pending()
                finally:
                    self.lock.release()
            return {"plan_s": t1 - t0, "pending": 1.0, "streams": streams}
        try:
            t2 = time.perf_counter()
            with self._pending_lock:
                self._pending = None
            self._swap(plan, int(budget), t0)
            t3 = time.perf_counter()
        finally:
            self.lock.release()
        return {"plan_s": t1 - t0, "wait_s": t2 - t1, "swap_s": t3 - t2, "total_s": t3 - t0, "streams": streams}

    def _swap(self, plan: FlexPlan, budget: int, t0: float) -> None:
        """Under the run lock: the new plan's arena in place of the old one."""
        ts = time.perf_counter()
        self.budget = budget
        self.plan = plan
        self.arena_budget = plan.budget
        self._release_native()  # its loaders know the old arena's addresses
        self.views = {}
        self.steps = []
        self._drop_arena()  # the old arena goes before the new one is touched
        self.arena = self._new_arena(self.arena_budget)
        self._bind()
        self._resident_loaded = False  # resident weights are read again into their new places
        now = time.perf_counter()
        self.adapt_s.append(now - t0)
        self.swap_s.append(now - ts)

    def _apply_pending(self) -> None:
        with self._pending_lock:
            p, self._pending = self._pending, None
        if p is not None:
            self._swap(*p)

    # ------------------------------------------------------------------ the backend's part (CPU here)
    def _select(self, graph: Graph, kernels: dict[str, str] | None,
                stored: dict[str, list[Entry]]) -> list[tuple[Layer, Kernel]]:
        """(layer, kernel) per node of ``graph``, in order; ``stored``: the store's entries by layer."""
        return select_kernels(graph, "cpu", kernels)

    def _in_memory(self, k: Kernel, e: Entry) -> bool:
        """Whether ``e`` (a parameter of a layer ``k`` runs) stays in process memory, counted in ``small_bytes``,
        rather than streamed through the arena."""
        return e.size <= SMALL

    def _small_ready(self) -> None:
        """``self.small`` is read (CPU: the kernels take those arrays as they are)."""

    def _scratch_bytes(self, layer: Layer, k: Kernel) -> int:
        return sum(align_up(4 * int(n), self.align) for n in k.scratch_floats(layer).values())

    def _drop_arena(self) -> None:
        self.arena = None  # type: ignore[assignment]

    def _make_step(self, pos: int, layer: Layer, k: Kernel, params: dict[str, np.ndarray], woff: int,
                   alias: bool) -> tuple[Callable[[], None] | None, dict[int, np.ndarray], Any]:
        """What step ``pos`` runs, its params (streamed ones as arena views) and workspace at ``woff`` bound:
        (call, scratch views, backend work)."""
        scratch = {}
        for slot, n in sorted(k.scratch_floats(layer).items()):
            scratch[slot] = self._view(woff, (int(n),), np.float32)
            woff += align_up(4 * int(n), self.align)
        if alias:
            return None, scratch, None
        g = self.graph
        ins = [None if (not n or n in g.constants) else self.views[n] for n in layer.node.inputs]
        outs = [self.views[o] for o in layer.node.outputs if o]
        call = k.bind(layer, ins, params, outs)
        if call is None:
            call = (lambda k=k, layer=layer, ins=ins, params=params, outs=outs: k.run(layer, ins, params, outs))
        return call, scratch, None

    def _run_step(self, s: _Step) -> None:
        if s.call is not None:
            mine = _conv._tls.bufs = dict(s.scratch)
            s.call()
            if any(b is not mine.get(k) for k, b in _conv._tls.bufs.items()):
                # a kernel asked for scratch the plan did not give it: memory outside the arena
                self.outside_scratch += 1
            _conv._tls.bufs = {}

    def _publish(self, pos: int) -> None:
        """Step ``pos``, which some piece waits for, has run: its addresses may be overwritten."""
        native.lib.inferd_stream_done(self._native, pos)

    def _before_wait(self, unit: int) -> None:
        """About to wait for the weights of loader unit ``unit``: every step its pieces wait for must be published
        (CPU: it is: each was published as it ran)."""

    def _before_load(self) -> None:
        """About to read weights on this thread (on demand, inline): whatever ran before must have completed."""

    def _drain(self) -> None:
        """The run's last step has been handed to ``_compute``: complete everything (the outputs are read next)."""

    def _abort(self) -> None:
        """A run failed half way: nothing of it may still touch the arena when this returns."""

    # ------------------------------------------------------------------ setup
    def min_arena(self) -> int:
        return min_budget(self.layer_mem, self.activations, alignment=self.align, weight_alignment=WALIGN)

    def min_budget(self) -> int:
        """The smallest budget this model runs in (small parameters + the smallest feasible arena)."""
        return self.small_bytes + self.min_arena()

    def _view(self, off: int, shape: Sequence[int], dtype: Any) -> np.ndarray:
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if off < 0 or off + n > self.arena.nbytes:
            raise StreamError(f"planned view [{off}, {off + n}) outside the arena of {self.arena.nbytes} bytes")
        return self.arena[off:off + n].view(dt).reshape(tuple(shape))

    def _bind(self) -> None:
        g, plan = self.graph, self.plan
        self.views: dict[str, np.ndarray] = {}
        for name, info in g.infos.items():
            if name in g.constants:
                continue
            root = self.aliases.get(name, name)
            if root in plan.offsets:
                self.views[name] = self._view(plan.offsets[root], info.shape, info.dtype)
        self.steps: list[_Step] = []
        for pos, (layer, k) in enumerate(self.choice):
            params: dict[str, np.ndarray] = dict(self.small.get(layer.name, {}))
            blobs = []
            off = plan.weight_offset[pos]
            for e in self._big.get(pos, []):
                v = self._view(off, e.shape, e.dtype)
                params[e.tensor] = v
                blobs.append((e, v))
                off += align_up(e.size, WALIGN)
            spec = op_spec(layer.op)
            alias = bool(spec and spec.alias and layer.node.inputs and layer.node.inputs[0] not in g.constants
                         and len([o for o in layer.node.outputs if o]) == 1)
            call, scratch, work = self._make_step(pos, layer, k, params, plan.workspace_offset(pos), alias)
            self.steps.append(_Step(pos, layer, k, call, blobs, scratch, work))
        # tracker bookkeeping: which boxes start and end at each step
        self._starts: dict[int, list[tuple[tuple[str, str], int, int]]] = {}
        self._ends: dict[int, list[tuple[str, str]]] = {}
        for b in plan.boxes:
            key = (b.kind, b.name)
            if b.kind in ("activation", "workspace"):
                self._starts.setdefault(b.first, []).append((key, b.offset, b.size))
            if b.kind != "resident":
                self._ends.setdefault(b.last, []).append(key)
        self._pieces = self._split_pieces()
        for pos, pcs in self._pieces.items():
            self._ends.setdefault(pos, []).extend(pc.key for pc in pcs)
        self._make_native()
        self._segments = self._make_segments() if self.fuse_steps else None

    def _make_segments(self) -> list[_Segment]:
        """The untracked run's steps cut where the loaders and the compute hand over (a step with streamed pieces
        starts a segment, a step some piece waits for ends one), each segment's native steps fused: between two
        hand-offs nothing needs Python: step by step, mobilenetv2 with nothing streamed ran 3.3 ms against 2.9 ms
        fused (2-core VM; 0.27 ms in the per-step bookkeeping, 0.12 in the separate calls). A step with its own
        scratch views runs alone (its kernel finds them through the thread's scratch slots, set per step)."""
        segs: list[_Segment] = []
        first: _Step | None = None
        calls: list[Callable[[], None]] = []
        positions: list[int] = []
        native_run: list[Callable[[], None]] = []

        def flush_native() -> None:
            calls.extend(native.fuse_calls(native_run))
            native_run.clear()

        def close(publish: int | None) -> None:
            nonlocal first, calls, positions
            flush_native()
            if first is not None or calls or publish is not None:
                segs.append(_Segment(first, calls, publish, positions))
            first, calls, positions = None, [], []

        for s in self.steps:
            if s.pos in self._pieces:
                close(None)
                first = s
            if s.call is not None:
                positions.append(s.pos)
                if getattr(s.call, "steps", None) is not None and not s.scratch:
                    native_run.append(s.call)
                else:
                    flush_native()
                    calls.append(lambda s=s: self._run_step(s))
            if s.pos in self._deps:
                close(s.pos)
        close(None)
        return segs

    def _split_pieces(self) -> dict[int, list[_Piece]]:
        """Per streamed step (preload mode): its blobs cut into pieces, each with the last step that used its
        addresses before this step's box begins (never later than the box's own ``load_after``: the plan
        guarantees no box overlapping it in address lives during it). Pieces in dependency order."""
        plan = self.plan
        if self.mode != "preload":
            return {}
        wbox = {b.name: b for b in plan.boxes if b.kind == "weights"}
        others = [(b.offset, b.end, b.first, b.last, b.name) for b in plan.boxes if b.kind != "resident"]
        base = self.arena.ctypes.data
        out: dict[int, list[_Piece]] = {}
        for s in self.steps:
            if not s.blobs or plan.resident[s.pos]:
                continue
            box = wbox[s.layer.name]
            near = [(o, e, last) for o, e, f, last, n in others if last < box.first and o < box.end and box.offset < e]
            pcs: list[_Piece] = []
            for j, (e, v) in enumerate(s.blobs):
                start = v.ctypes.data - base
                padded = align_up(e.size, WALIGN)
                cuts: list[tuple[int, int, int]] = []  # (offset in blob, length, dep)
                a = 0
                while a < padded:
                    n = min(PIECE, padded - a)
                    lo, hi = start + a, start + a + n
                    dep = max((last for o, end, last in near if o < hi and lo < end), default=-1)
                    if cuts and cuts[-1][2] == dep and cuts[-1][1] + n <= PIECE_MAX:
                        c = cuts[-1]
                        cuts[-1] = (c[0], c[1] + n, dep)
                    else:
                        cuts.append((a, n, dep))
                    a += n
                for k, (a, n, dep) in enumerate(cuts):
                    span = self.arena[start + a:start + a + n]
                    data = max(0, min(n, e.size - a))
                    pcs.append(_Piece(e, span, e.offset + a, data, min(dep, plan.load_after[s.pos]),
                                      ("weights", f"{s.layer.name}@{j}.{k}"), start + a))
            pcs.sort(key=lambda p: p.dep)  # stable: address order among equal dependencies
            out[s.pos] = pcs
        return out

    # ------------------------------------------------------------------ reading
    def _load(self, step: _Step) -> float:
        t0 = time.perf_counter()
        st = self.store
        for e, v in step.blobs:
            if self.read == "bypass" and st.direct:
                self._read_direct(e, v)
                continue
            st.read(e, out=v)
            if self.read == "bypass":
                os.posix_fadvise(st._fd, e.offset, e.size, os.POSIX_FADV_DONTNEED)
        return time.perf_counter() - t0

    def _read_direct(self, e: Entry, v: np.ndarray) -> None:
        """One blob by ``O_DIRECT`` into its arena place (block aligned; the read's tail lands in the padding
        the plan left up to the next block), its checksum verified."""

        start = v.ctypes.data - self.arena.ctypes.data
        span = self.arena[start:start + align_up(e.size, WALIGN)]
        try:
            readv(self.store._fd, self.store._dfd, e.offset, [memoryview(span)], need=e.size, drop=True)
        except ShortRead as ex:
            raise WeightsStoreError(f"{self.store.path}: truncated weights store: {e.key}: {ex}") from None
        if checksum(memoryview(span[:e.size])) != e.checksum:
            raise WeightsStoreError(f"{self.store.path}: checksum mismatch in {e.key} (corrupted weights)")

    def _read_run(self, pcs: Sequence[_Piece]) -> None:
        """Pieces that follow each other in the store (gaps of at most GAP bytes between them) in one ``preadv``
        (``O_DIRECT`` in bypass mode: every span and gap is block aligned). A piece's span is block padded: the
        padding is read too (the next bytes of the file) but only its data must come back."""
        st = self.store
        iov: list[memoryview] = []
        pos = pcs[0].file_off
        for pc in pcs:
            if pc.file_off > pos:
                if pc.file_off - pos > self._gap.nbytes:
                    raise StreamError(f"a joined read's gap of {pc.file_off - pos} bytes exceeds its buffer")
                iov.append(memoryview(self._gap[:pc.file_off - pos]))
            iov.append(memoryview(pc.span))
            pos = pc.file_off + pc.span.nbytes
        want = pos - pcs[0].file_off - (pcs[-1].span.nbytes - pcs[-1].nbytes)
        if want <= 0:
            return
        bypass = self.read == "bypass"
        try:
            readv(st._fd, st._dfd if bypass else -1, pcs[0].file_off, iov, need=want, drop=bypass)
        except ShortRead as ex:
            raise WeightsStoreError(f"{st.path}: truncated weights store ({pcs[0].entry.key} on): {ex}") from None

    def _verify(self, step: _Step) -> None:
        """Every blob of ``step`` read in pieces: its checksum, once all its pieces are in."""

        for e, v in step.blobs:
            if checksum(memoryview(v.reshape(-1).view(np.uint8))) != e.checksum:
                raise WeightsStoreError(f"{self.store.path}: checksum mismatch in {e.key} (corrupted weights)")

    def _box(self, pos: int) -> tuple[tuple[str, str], int, int]:
        b = next(b for b in self.plan.boxes if b.kind in ("weights", "resident") and b.name == self.choice[pos][0].name
                 and (b.last == pos or b.kind == "resident"))
        return (b.kind, b.name), b.offset, b.size

    def _load_resident(self) -> None:
        for pos, r in enumerate(self.plan.resident):
            if r and self.steps[pos].blobs:
                if self.tracker is not None:
                    self.tracker.claim(*self._box(pos))
                self._load(self.steps[pos])
        self._resident_loaded = True

    # ------------------------------------------------------------------ running
    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self.lock:
            if self._pending is not None:
                self._apply_pending()
            try:
                return self._run(feeds)
            finally:
                if self._pending is not None:  # a budget change arrived during the run: swap before the next
                    self._apply_pending()

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tr = self.tracker = ArenaTracker(self.arena.nbytes) if self.track else self.tracker
        if self.track and self._resident_loaded:
            for pos, r in enumerate(self.plan.resident):  # still there from the runs before
                if r and self.steps[pos].blobs:
                    assert tr is not None
                    tr.claim(*self._box(pos))
        if not self._resident_loaded:
            self._load_resident()
        if tr is not None:
            for key, off, size in self._starts.get(-1, []):
                tr.claim(key, off, size)
        for t in self.inputs:
            np.copyto(self.views[t.name], feeds[t.name], casting="no")
        t0 = time.perf_counter()
        read_s = 0.0
        wait_s = 0.0
        steps = self.steps
        self.io_stats: dict[str, float] = {}
        if self.mode == "ondemand":
            try:
                for s in steps:
                    if s.blobs:
                        if tr is not None:
                            tr.claim(*self._box(s.pos))
                        self._before_load()
                        read_s += self._load(s)
                    self._compute(s, tr)
                self._drain()
            except BaseException:
                self._abort()
                raise
        else:
            read_s, wait_s = self._run_streamed(tr)
        res = {t.name: np.array(self.views[t.name]) for t in self.outputs}
        if tr is not None:
            for key in self._ends.get(len(steps), []):
                tr.release(key)
        self.stats = {"run_s": time.perf_counter() - t0, "read_s": read_s, "wait_s": wait_s, **self.io_stats}
        return res

    def _run_streamed(self, tr: ArenaTracker | None) -> tuple[float, float]:
        """The native loaders (native/stream.c: ``cache_loaders`` through the page cache, ``bypass_readers`` when
        bypassing it) and this (compute) thread. The loaders take the pieces in order, each once the step it
        waits for has run, joining neighbours in the store into reads of up to ``RUN`` bytes so that several
        large reads are in flight (a disk reaches its rate only with a queue of them); a layer is in once its
        last piece is read and its blobs verified, by whichever thread read that piece. The compute thread
        publishes each step it ran (a wake-up only when a loader waits for it) and, reaching a layer whose
        weights are not in yet, reads the pieces nobody has started itself (``steal``) instead of waiting for a
        loader to be woken and scheduled: on a busy machine that hand-off costs milliseconds per layer. Neither
        side takes the GIL to hand a piece over: with loaders in Python every read's bookkeeping and every
        wake-up did (2-core VM, vit_tiny, 16 MiB streamed: 8% of its run with the reads made no-ops)."""
        h = self._native
        if h is None:
            return self._run_inline(tr)
        lib = native.lib
        n = self.bypass_readers if self.read == "bypass" else self.cache_loaders
        if not self.steal:
            n = max(n, 1)  # someone must read
        if lib.inferd_stream_begin(h, n) < n and not self.steal:
            raise StreamError("no loader thread could be started")
        steal = int(self.steal)
        try:
            if tr is None and self._segments is not None:
                wait_s = self._run_segments(h, steal)
            else:
                wait_s = self._run_steps(h, steal, tr)
            self._drain()
        except BaseException:
            self._abort()
            lib.inferd_stream_end(h, 1)  # a loader may be reading into the arena: not ours again before they stop
            raise
        # no join: every piece is in (each step waited for its own), so the arena is no longer touched; a loader
        # still finishing its loop finds the queue empty and ends by itself before the next run starts
        lib.inferd_stream_end(h, 0)
        st = self._native_stats()
        self.io_stats = {"read_s": st["read_s"], "reads": st["reads"], "bytes": st["bytes"],
                         "verify_s": st["verify_s"], "pool_reads": st["pool_reads"]}
        return st["read_s"], wait_s

    def _run_steps(self, h: Any, steal: int, tr: ArenaTracker | None) -> float:
        """The native-loader run step by step (a tracked run claims and releases its boxes per step); returns the
        seconds waited for weights."""
        unit, claims, deps = self._unit, self._claims, self._deps
        wait_s = 0.0
        if tr is not None:
            for key, off, size in claims.get(-1, []):
                tr.claim(key, off, size)
        for s in self.steps:
            if s.pos in unit:
                wait_s += self._wait_for(h, s, steal)
            self._compute(s, tr)
            if tr is not None:  # a piece may be written from the moment its dependency has run
                for key, off, size in claims.get(s.pos, []):
                    tr.claim(key, off, size)
            if s.pos in deps:  # only a step some piece waits for is worth a call
                self._publish(s.pos)
        return wait_s

    def _wait_for(self, h: Any, s: _Step, steal: int) -> float:
        """Until step ``s``'s streamed weights are in (read by a loader, or by this thread where ``steal``) and
        verified; returns the seconds waited."""
        u = self._unit[s.pos]
        self._before_wait(u)
        w0 = time.perf_counter()
        rc = native.lib.inferd_stream_wait(h, u, steal)
        waited = time.perf_counter() - w0
        if rc:
            raise self._native_error()
        faults.check("cache.read")
        if not self._native_verifies:
            self._verify(s)
        return waited

    def _run_segments(self, h: Any, steal: int) -> float:
        """The native-loader run segment by segment (``_make_segments``); returns the seconds waited for weights."""
        wait_s = 0.0
        for seg in self._segments or ():
            if seg.first is not None:
                wait_s += self._wait_for(h, seg.first, steal)
            for c in seg.calls:
                c()
            if seg.publish is not None:
                self._publish(seg.publish)
        return wait_s

    def _run_inline(self, tr: ArenaTracker | None) -> tuple[float, float]:
        """Without the native extension: the compute thread reads each streamed layer's pieces (joined as the
        loaders join them) when it reaches the layer; nothing is read ahead."""
        try:
            self._inline_steps(tr)
        except BaseException:
            self._abort()
            raise
        return self.io_stats["read_s"], 0.0

    def _inline_steps(self, tr: ArenaTracker | None) -> None:
        read_s = 0.0
        reads = nbytes = 0

        def load(s: _Step) -> None:
            nonlocal read_s, reads, nbytes
            pcs = self._pieces.get(s.pos)
            if not pcs:
                return
            t0 = time.perf_counter()
            self._before_load()
            for run in _joined(pcs):
                if tr is not None:
                    for p in run:
                        tr.claim(p.key, p.offset, p.span.nbytes)
                self._read_run(run)
                reads += 1
                nbytes += run[-1].file_off + run[-1].span.nbytes - run[0].file_off
            faults.check("cache.read")
            self._verify(s)
            read_s += time.perf_counter() - t0

        if tr is None and self._segments is not None:
            for seg in self._segments:
                if seg.first is not None:
                    load(seg.first)
                for c in seg.calls:
                    c()
        else:
            for s in self.steps:
                load(s)
                self._compute(s, tr)
        self._drain()
        self.io_stats = {"read_s": read_s, "reads": reads, "bytes": nbytes, "verify_s": 0.0, "pool_reads": 0}

    # ------------------------------------------------------------------ the native loaders
    def _make_native(self) -> None:
        """The native loaders' queue for this arena: every streamed piece in run order, every streamed blob with
        its checksum. None without the extension or with nothing streamed (the run reads inline)."""
        self._release_native()
        self._unit: dict[int, int] = {}
        self._claims: dict[int, list[tuple[tuple[str, str], int, int]]] = {}
        self._flat: list[_Piece] = []
        self._flat_blobs: list[Entry] = []
        self._deps = frozenset(pc.dep for pcs in self._pieces.values() for pc in pcs)
        if not self._pieces or not native.AVAILABLE:
            return
        ffi, lib = native.ffi, native.lib
        units = sorted(self._pieces)
        self._unit = {pos: u for u, pos in enumerate(units)}
        flat = [(u, pc) for u, pos in enumerate(units) for pc in self._pieces[pos]]
        blobs = [(u, e, v) for u, pos in enumerate(units) for e, v in self.steps[pos].blobs]
        pcs = ffi.new("inferd_stream_piece[]", len(flat))
        for i, (u, pc) in enumerate(flat):
            p = pcs[i]
            p.file_off, p.span, p.need = pc.file_off, pc.span.nbytes, pc.nbytes
            p.dst, p.dep, p.unit = pc.span.ctypes.data, pc.dep, u
            self._claims.setdefault(pc.dep, []).append((pc.key, pc.offset, pc.span.nbytes))
        bl = ffi.new("inferd_stream_blob[]", max(1, len(blobs)))
        for i, (u, e, v) in enumerate(blobs):
            bl[i].addr, bl[i].size, bl[i].sum, bl[i].unit = v.ctypes.data, v.nbytes, e.checksum, u
        hash_fn = _xxh3_fn()
        self._native_verifies = hash_fn != ffi.NULL
        bypass = self.read == "bypass"
        st = self.store
        # bypassing the cache a read waits for the disk: the loaders keep the compute's priority and a pool
        # worker, which must answer the next job at once, never blocks in one
        h = lib.inferd_stream_new(st._fd, st._dfd if bypass else -1, int(bypass),
                                  0 if bypass else self._loader_nice(), int(self.pool_reads and not bypass), pcs,
                                  len(flat), len(units), bl, len(blobs), hash_fn,
                                  ffi.cast("void *", self._gap.ctypes.data), self._gap.nbytes, RUN, GAP)
        if h == ffi.NULL:
            raise MemoryError("the streaming loaders' queue could not be allocated")
        self._native = ffi.gc(h, lib.inferd_stream_free)
        self._flat = [pc for _u, pc in flat]
        self._flat_blobs = [e for _u, e, _v in blobs]

    def _loader_nice(self) -> int:
        if self.cache_loader_sched == "idle":
            return int(native.lib.INFERD_STREAM_IDLE)
        return int(self.cache_loader_nice)

    def _release_native(self) -> None:
        """End the loader threads (they wait for the next run) and free the queue, before its arena goes."""
        h, self._native = getattr(self, "_native", None), None
        if h is not None:
            native.ffi.release(h)

    def _native_stats(self) -> dict[str, Any]:
        ffi = native.ffi
        d, i = ffi.new("double[2]"), ffi.new("long long[11]")
        native.lib.inferd_stream_stats(self._native, d, i)
        keys = ("reads", "bytes", "error", "errno", "piece", "blob", "got", "need", "busy", "threads", "pool_reads")
        return {"read_s": d[0], "verify_s": d[1], **{k: int(i[j]) for j, k in enumerate(keys)}}

    def _native_error(self) -> BaseException:
        """The error that stopped the native loaders, as the Python loaders raised it."""
        lib = native.lib
        st = self._native_stats()
        path = self.store.path
        code = st["error"]
        pc = self._flat[st["piece"]] if 0 <= st["piece"] < len(self._flat) else None
        where = f" ({pc.entry.key} on)" if pc is not None else ""
        if code == lib.INFERD_STREAM_IO:
            return OSError(st["errno"], f"{os.strerror(st['errno'])}: reading the weights store{where}", str(path))
        if code == lib.INFERD_STREAM_SHORT:
            return WeightsStoreError(f"{path}: truncated weights store{where}: short read: {st['need']} bytes "
                                     f"needed at offset {pc.file_off if pc else '?'}, the file gave {st['got']}")
        if code == lib.INFERD_STREAM_CHECKSUM:
            key = self._flat_blobs[st["blob"]].key if 0 <= st["blob"] < len(self._flat_blobs) else "?"
            return WeightsStoreError(f"{path}: checksum mismatch in {key} (corrupted weights)")
        if code == lib.INFERD_STREAM_GAP:
            return StreamError(f"a joined read's gap of {st['got']} bytes exceeds its buffer")
        return StreamError(f"the streaming loaders stopped (error {code})")

    def _compute(self, s: _Step, tr: ArenaTracker | None) -> None:
        if tr is not None:
            for key, off, size in self._starts.get(s.pos, []):
                tr.claim(key, off, size)
        self._run_step(s)
        if tr is not None:
            for key in self._ends.get(s.pos, []):
                tr.release(key)

    # ------------------------------------------------------------------ accounting
    @property
    def memory_bytes(self) -> int:
        return int(self.arena.nbytes + self.small_bytes)

    @property
    def memory_breakdown(self) -> dict[str, int]:
        return {"arena_bytes": int(self.arena.nbytes), "weights_bytes": int(self.small_bytes - self.native_scratch),
                "native_scratch_bytes": int(self.native_scratch),
                "resident_bytes": int(self.plan.resident_bytes), "streamed_bytes": int(self.streamed_bytes),
                "budget_bytes": int(self.budget)}

    @property
    def streamed_bytes(self) -> int:
        """Bytes read from the store per run."""
        return sum(e.size for s in self.steps if s.blobs and not self.plan.resident[s.pos] for e, _ in s.blobs) \
            if self.mode != "ondemand" else sum(e.size for s in self.steps for e, _ in s.blobs)

    def close(self) -> None:
        self._release_native()
        self.store.close()


def expand_kernels(graph: Graph, kernels: dict[str, str]) -> dict[str, str]:
    """Kernel overrides by node name, carried to the slices of a sliced node where the kernel applies."""
    from ..planner.slicing import SLICE_SEP

    out: dict[str, str] = {}
    for node in graph.nodes:
        k = kernels.get(node.name.split(SLICE_SEP)[0])
        if k is None:
            continue
        layer = Layer.of(node, graph)
        if any(c.name == k and c.applies(layer) for c in kernels_for(node.op, "cpu")):
            out[node.name] = k
    return out


def small_bytes(graph: Graph) -> int:
    """Bytes the streaming runtime keeps in process memory beside its arena: the small parameters (raw size:
    an estimate) and the loader's gap buffer."""
    seen: set[str] = set()
    n = GAP
    for node in graph.nodes:
        for i in node.inputs:
            if i and i in graph.constants and i not in seen:
                seen.add(i)
                b = int(graph.constants[i].nbytes)
                n += b if b <= SMALL else 0
    return n


def strip_constants(graph: Graph) -> Graph:
    """``graph`` with every constant above ``SMALL`` bytes replaced by a zero-strided stub of its shape and
    dtype (no memory): what an executor needs once the store holds the weights."""
    from numpy.lib.stride_tricks import as_strided

    consts: dict[str, np.ndarray] = {}
    for n, a in graph.constants.items():
        a = np.asarray(a)
        if a.nbytes <= SMALL:
            consts[n] = a
        else:
            consts[n] = as_strided(np.zeros(1, a.dtype), shape=a.shape, strides=(0,) * a.ndim, writeable=False)
    g = Graph(graph.name, list(graph.nodes), list(graph.inputs), list(graph.outputs), consts, dict(graph.infos),
              graph.opset, dict(graph.dims))
    g.runtime_shaped = set(graph.runtime_shaped)
    return g


def stream_for_budget(graph: Graph, budget: int, work: str | os.PathLike, *, config: Any = None,
                      **kw: Any) -> StreamingExecutor:
    """A streaming executor for ``graph`` inside ``budget`` bytes, slicing and falling back to smaller kernels
    as the budget requires (``planner.slicing.fit_config``; ``config`` to impose one), its store written
    under ``work`` once per configuration (outside the budget)."""
    from ..planner.slicing import fit_config, slice_graph

    def build(cfg: Any) -> StreamingExecutor:
        g = slice_graph(graph, cfg.slices, cfg.in_slices)
        kernels = expand_kernels(g, dict(cfg.kernels))
        tag = hashlib.sha256(cfg.key().encode()).hexdigest()[:12]
        store = prepare_stream_store(g, Path(work) / f"{graph.name}-{tag}.store", kernels or None)
        return StreamingExecutor(strip_constants(g), store, budget, kernels=kernels or None, **kw)

    return fit_and_build(budget, small_bytes(graph), lambda b: fit_config(graph, b), build, config)


def fit_and_build(budget: int, reserve: int, fit: Callable[[int], Any], build: Callable[[Any], Any],
                  config: Any = None) -> Any:
    """``build`` an executor of the configuration ``fit`` finds for ``budget`` less ``reserve`` (the bytes kept
    beside the arena, an estimate), or of ``config``; where the executor finds it does not fit after all (its small
    parameters, its workspaces took more than estimated), fit into that much less, up to three times. The
    executor's ``config`` is the configuration it runs."""
    last: BudgetTooSmall | None = None
    for _ in range(3):
        cfg = config if config is not None else fit(max(1, budget - reserve))
        try:
            ex = build(cfg)
            ex.config = cfg
            return ex
        except BudgetTooSmall as e:
            last = e
            if config is not None:
                raise
            reserve += max(e.short_by, 4096)
    assert last is not None
    raise last
