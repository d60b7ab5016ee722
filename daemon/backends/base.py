"""The backend contract of the cold runtime, and where a layer's weights come from.

The planners and the scheduler know nothing of numpy kernels or Vulkan: they see a
:class:`ColdBackend`, which for every layer (a position in graph order) can

* list its candidate kernels and the warm default (what the planner chooses among),
* ``prepare`` it from the arrays the loader read (transform if the plan reads raw weights, place
  them, create its GPU pipeline): called from loader threads, concurrently for different layers,
* ``execute`` it in order during the first run (``flush``: the next layer is not prepared yet, so a
  GPU should submit what it has recorded),

plus ``begin``/``end`` around the first run and ``finalize`` once everything is prepared (the warm
path). ``swap`` replaces one layer's kernel between runs (the warm switch).

A :class:`WeightSource` reads the bytes a layer's plan entry says: raw constants or the kernel's
transformed weights, from a compiled package's store or from an in-memory graph.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Protocol, Sequence

import numpy as np

from ..errors import WeightsStoreError
from ..ops.base import Kernel, Layer, raw_key

if TYPE_CHECKING:
    from ..planner.plan import LayerPlan
    from ..store import Entry, StoreStream, WeightsStore

log = logging.getLogger(__name__)


class ColdBackend(Protocol):
    name: str
    gpu: bool

    def layers(self) -> list[Layer]:
        """Per graph node, its layer (what a stored plan needs: the kernels are the plan's)."""
        ...

    def candidates(self) -> list[tuple[Layer, list[Kernel], Kernel]]:
        """Per graph node: its layer, the kernels the planner may choose, the warm default."""
        ...

    def prepare(self, pos: int, lp: "LayerPlan", arrays: dict[str, np.ndarray]) -> dict[str, float]:
        """Bring layer ``pos`` up with kernel ``lp.kernel`` from ``arrays`` (raw constants by ``raw_key``
        when ``lp.source`` is 'raw', the kernel's params when 'transformed'). Returns phase seconds
        (``transform_s``, ``pipeline_s``)."""
        ...

    def begin(self, feeds: Mapping[str, np.ndarray]) -> None: ...

    def execute(self, pos: int, flush: bool) -> None: ...

    # optional: ``execute_run(lo, hi) -> list[float]``, layers lo..hi-1 (all prepared) executed as one call where the
    # backend can, with the ``time.perf_counter()`` at each one's end (the CPU backend's native steps)

    def end(self) -> dict[str, np.ndarray]: ...

    def finalize(self) -> None: ...

    def swap(self, pos: int, kernel: Kernel, params: dict[str, np.ndarray]) -> None: ...


def transformed_key(backend: str, kernel: str) -> str:
    """The store's ``kernel`` field of a transformed entry: kernels of different backends may share a name."""
    return f"{backend}/{kernel}"


class LazyConstants(Mapping[str, np.ndarray]):
    """A graph's constants whose large values stay in the weights store until someone asks.

    Small constants (shapes, biases) come inline with the plan; a large one is read on first access
    (thread-safe: one read per name) and kept until ``drop``. The cold loader reads what its plan says
    through the store directly, so the whole weight set never sits here twice."""

    def __init__(self, inline: dict[str, np.ndarray], store: "WeightsStore | None",
                 entries: Mapping[str, "Entry"], widen: "set[str] | None" = None) -> None:
        self._inline = inline
        #: float32 constants the store holds in fp16 (a CPU package's fp16 precision): widened when read
        self.widen = set(widen or ())
        self._store = store
        self._entries = dict(entries)
        self._cache: dict[str, np.ndarray] = {}
        self._locks: dict[str, threading.Lock] = {n: threading.Lock() for n in self._entries}
        self.read_bytes = 0

    def __getitem__(self, name: str) -> np.ndarray:
        a = self._inline.get(name)
        if a is not None:
            return a
        a = self._cache.get(name)
        if a is not None:
            return a
        if name not in self._entries:
            raise KeyError(name)
        with self._locks[name]:
            a = self._cache.get(name)
            if a is None:
                if self._store is None:
                    raise WeightsStoreError(f"constant {name!r} is not in memory and no weights store is open")
                a = self._store.read(self._entries[name])
                self.read_bytes += a.nbytes
                a = self.widened(name, a)
                self._cache[name] = a
        return a

    def __contains__(self, name: object) -> bool:
        return name in self._inline or name in self._entries

    def __iter__(self) -> Iterator[str]:
        yield from self._inline
        yield from (n for n in self._entries if n not in self._inline)

    def __len__(self) -> int:
        return len(self._inline) + sum(1 for n in self._entries if n not in self._inline)

    def drop(self, name: str) -> None:
        self._cache.pop(name, None)

    def release(self) -> None:
        """Forget every value read (its model closed): they go now, not when a collection finds the closed
        model's cycles (resnet18's raw weights, read for its warm switch, held 27 MB of the host pool)."""
        self._cache.clear()

    def widened(self, name: str, a: np.ndarray) -> np.ndarray:
        """``a`` as the graph's float32 when the store holds constant ``name`` in fp16."""
        return a.astype(np.float32) if name in self.widen and a.dtype == np.float16 else a

    def entry(self, name: str) -> "Entry | None":
        """The store entry holding constant ``name`` (None when it came inline with the plan)."""
        return self._entries.get(name)


class WeightSource:
    """Reads a layer's planned representation. ``store`` None: everything comes from ``constants``."""

    def __init__(self, constants: Mapping[str, np.ndarray], store: "WeightsStore | None" = None,
                 backend: str = "cpu") -> None:
        self.constants = constants
        self.store = store
        self.backend = backend
        self.stream: "StoreStream | None" = None

    def planned_entries(self, layers: Sequence[Layer], plan: Any) -> list["Entry"]:
        """The store entries ``plan`` reads, in the order it needs them."""
        def layer_of(lp: Any) -> tuple[str, list[str]]:
            layer = layers[lp.index]
            return layer.name, layer.const_names

        return self._entries(plan, layer_of) or []  # (never None: every planned layer is one of ``layers``)

    def _entries(self, plan: Any,
                 layer_of: "Callable[[Any], tuple[str, Sequence[str]] | None]") -> "list[Entry] | None":
        """What ``plan`` reads, in its order; ``layer_of(lp)``: the layer's name and its constant inputs' names
        (None: the layer is unknown, and so is the answer)."""
        if self.store is None:
            return []
        out: list[Entry] = []
        for lp in plan.read_order():
            if lp.source not in ("transformed", "raw"):
                continue
            got = layer_of(lp)
            if got is None:
                return None
            name, consts = got
            if lp.source == "transformed":
                out += self._transformed_entries(name, lp.kernel)
            else:
                out += [e for e in (self._stored(i) for i in consts) if e is not None]
        return out

    def _stored(self, name: str) -> "Entry | None":
        """The store entry of raw constant ``name``, when the constants are a package's (LazyConstants)."""
        entry = getattr(self.constants, "entry", None)
        return entry(name) if entry is not None else None

    def _transformed_entries(self, layer: str, kernel: str) -> list["Entry"]:
        if self.store is None:
            return []
        return list(self.store.find(layer, kernel=transformed_key(self.backend, kernel), variant="transformed"))

    def entries_by_name(self, graph: Any, plan: Any) -> "list[Entry] | None":
        """``planned_entries`` from ``graph``'s nodes (the graph the backend will run) instead of the backend's
        layers, so that reading can start before the backend exists; None where a planned layer is not a node
        of ``graph``."""
        nodes = {n.name: n for n in graph.nodes}
        consts = graph.constants

        def layer_of(lp: Any) -> tuple[str, list[str]] | None:
            node = nodes.get(lp.name)
            return None if node is None else (lp.name, [i for i in node.inputs if i and i in consts])

        return self._entries(plan, layer_of)

    def start_stream_early(self, graph: Any, plan: Any, io: Any = None, started: "StoreStream | None" = None) -> bool:
        """Start streaming what ``plan`` reads before the backend is set up (its set-up is Python the reads
        need not wait for: 4-7 ms of a cold load on the 2-core VM and the H200's host). The layers the backend
        makes later must be ``graph``'s nodes by name; where one is not, a later ``start_stream`` starts it
        then. ``started``: a stream the package's open began from the entries its plan.bin lists, taken on
        when they are what ``plan`` reads here (else released: its reads are lost, never wrong). Which entries
        a stream holds changes no answer: a blob outside it is read when it is asked for. False: not started."""
        if self.store is None or self.stream is not None:
            if started is not None:
                started.release()
            return False
        from ..store import StoreStream

        entries = self.entries_by_name(graph, plan)
        if started is not None:
            if entries is not None and started.keys() == StoreStream.order(entries):
                self.stream = started
                return True
            log.debug("the stream started at the package's open reads other entries than its plan: restarted")
            started.release()
        if entries is None:
            return False
        self.stream = StoreStream(self.store, entries, io=io, origin="set-up")
        return True

    def start_stream(self, layers: Sequence[Layer], plan: Any, io: Any = None,
                     on_read: Callable[[int, int, float, float], None] | None = None) -> None:
        """Stream what ``plan`` reads in the order it needs it (large reads on ``io``, a worker with a
        ``submit``, or a thread of its own) from now on; ``on_read(offset, bytes, t0, t1)`` after each read.
        A stream ``start_stream_early`` started goes on: ``on_read`` hears of its reads to come, and of those
        made so far with a keyword ``thread`` (the reader's name; it is not the caller's)."""
        from ..store import StoreStream

        if self.stream is None and self.store is not None:
            self.stream = StoreStream(self.store, self.planned_entries(layers, plan), io=io)
        if self.stream is not None and on_read is not None:
            self.stream.listen(on_read)

    def stop_stream(self) -> None:
        """Stop a stream whose load will not happen (its set-up failed): no more reads, chunks let go."""
        st, self.stream = self.stream, None
        if st is not None:
            st.release()

    def _entry(self, e: "Entry") -> np.ndarray:
        st = self.stream
        if st is not None and e in st:
            return st.get(e)
        assert self.store is not None
        return self.store.read(e)

    def has_transformed(self, layer: str, kernel: str) -> bool:
        return bool(self._transformed_entries(layer, kernel))

    def raw(self, layer: Layer) -> dict[str, np.ndarray]:
        out = {}
        for i in layer.const_inputs:
            n = layer.node.inputs[i]
            e = self._stored(n)
            st = self.stream
            if e is not None and st is not None and e in st:
                widened = getattr(self.constants, "widened", None)
                a = self._entry(e)
                out[raw_key(i)] = widened(n, a) if widened is not None else a
            else:
                out[raw_key(i)] = self.constants[n]
        return out

    def transformed(self, layer: Layer, kernel: str) -> dict[str, np.ndarray]:
        if self.store is None:
            raise WeightsStoreError(f"layer {layer.name!r}: transformed weights planned but no weights store is open")
        ents = self._transformed_entries(layer.name, kernel)
        if not ents:
            raise WeightsStoreError(f"{self.store.path}: no transformed weights of layer {layer.name!r} for kernel "
                                    f"{self.backend}/{kernel}")
        out = {e.tensor: self._entry(e) for e in ents}
        if self.backend == "cpu":  # CPU kernels compute in fp32: fp16 entries are an fp16 package's narrowed weights
            out = {k: (a.astype(np.float32) if a.dtype == np.float16 else a) for k, a in out.items()}
        return out

    def read(self, layer: Layer, lp: "LayerPlan") -> tuple[dict[str, np.ndarray], float]:
        """The arrays ``lp`` says to read, and the seconds the read took."""
        t0 = time.perf_counter()
        if lp.source == "transformed":
            arrays = self.transformed(layer, lp.kernel)
        else:
            arrays = self.raw(layer)
        return arrays, time.perf_counter() - t0

    def release_raw(self, layer: Layer) -> None:
        """Forget raw values read lazily for ``layer`` (they were transformed; memory counts)."""
        forget_raw(self.constants, layer)


def forget_raw(constants: Any, layer: Layer) -> None:
    """Drop the raw constants of ``layer`` that a package's lazily read constants keep after a read (the
    layer holds its transformed weights now); ``constants`` may be a specialised graph's ChainMap over them."""
    for m in getattr(constants, "maps", [constants]):
        drop = getattr(m, "drop", None)
        if drop is not None:
            for i in layer.const_inputs:
                drop(layer.node.inputs[i])

