"""Graph IR: what import produces and every later stage (planners, runtime, backends) consumes.

Every tensor has a concrete shape, so the planners can size memory exactly. A model with dynamic
input dimensions is imported as a *template*: its tensors are shaped at a probe shape, ``dims`` names
the dynamic dimensions, and the nodes that compute shapes from them (Shape, Gather, Concat on int64,
...) stay in the graph. ``inferd.frontend.specialize`` turns the template into the static graph of one
concrete shape (those nodes folded); every specialisation shares the template's constants.
"""
from __future__ import annotations

import functools
import math

from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np


#: Constant folding (at import, and a backend's own folding of what a shape makes constant) leaves a node whose
#: outputs exceed this at run time: folding an op that makes a huge tensor from a tiny one (ConstantOfShape, Expand,
#: Tile) would bloat the weights, the store and the device's weight memory.
FOLD_MAX_BYTES = 1 << 26


class Overlay(MutableMapping[str, np.ndarray]):
    """``top`` over ``base`` (values computed here over a graph's constants): reads look in ``top`` first,
    writes and deletes go to ``top``; ``base`` is never changed. ChainMap does the same, but its ``in`` walks
    its maps through a generator (~2 us), and shape inference and the Vulkan backend's binding resolution ask
    it for every input of every node a load prepares."""

    __slots__ = ("top", "base")

    def __init__(self, top: dict[str, np.ndarray], base: Mapping[str, np.ndarray]) -> None:
        self.top, self.base = top, base

    def __contains__(self, key: object) -> bool:
        return key in self.top or key in self.base

    def release(self) -> None:
        """Let the base forget the values it read (``LazyConstants.release``): the model is closed."""
        release = getattr(self.base, "release", None)
        if release is not None:
            release()

    # A package's lazily read constants (``LazyConstants``) under an overlay of values computed at the plan's shape
    # (a dynamic model's, a control-flow model's shaped graph) answer the loader as they would bare: a layer's raw
    # weights come from the load's stream (``WeightSource.raw`` asks ``entry``), widened where stored fp16, and are
    # forgotten once transformed. Without these the loader read them from the store again beside the stream.
    def entry(self, name: str) -> Any:
        entry = getattr(self.base, "entry", None)
        return entry(name) if entry is not None and name not in self.top else None

    def widened(self, name: str, a: np.ndarray) -> np.ndarray:
        widened = getattr(self.base, "widened", None)
        return widened(name, a) if widened is not None and name not in self.top else a

    def drop(self, name: str) -> None:
        drop = getattr(self.base, "drop", None)
        if drop is not None and name not in self.top:
            drop(name)

    def __getitem__(self, key: str) -> np.ndarray:
        top = self.top
        return top[key] if key in top else self.base[key]

    def __setitem__(self, key: str, value: np.ndarray) -> None:
        self.top[key] = value

    def __delitem__(self, key: str) -> None:
        del self.top[key]

    def __iter__(self) -> Iterator[str]:
        top = self.top
        yield from top
        for k in self.base:
            if k not in top:
                yield k

    def __len__(self) -> int:
        return sum(1 for _ in self)


class Renamed(Mapping[str, np.ndarray]):
    """``base``'s values under other names (``names``: new -> base's name), read from ``base`` when asked: a
    control-flow body's copies of its enclosing graph's weights, which a package's open leaves in the store until
    they are used."""

    __slots__ = ("base", "names")

    def __init__(self, base: Mapping[str, np.ndarray], names: Mapping[str, str]) -> None:
        self.base, self.names = base, dict(names)

    def __contains__(self, key: object) -> bool:
        return key in self.names

    def __getitem__(self, key: str) -> np.ndarray:
        return self.base[self.names[key]]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def dtype_tag(dtype: Any) -> str:
    """A dtype as on-disk formats write it. numpy's ``str`` ("<f4") for its own types; the name for the
    ml_dtypes types ONNX models carry (bfloat16, float8...), whose ``str`` is an anonymous "<V2" that reads
    back as raw bytes."""
    dt = np.dtype(dtype)
    return dt.name if dt.kind == "V" else dt.str


@functools.lru_cache(maxsize=64)
def dtype_from_tag(tag: str) -> np.dtype:
    """Inverse of :func:`dtype_tag`; ValueError for a tag that names no type. Cached: a package's open asks it per
    tensor and per store entry (np.dtype parses the string each time: ~0.5 ms of vit_tiny's open)."""
    try:
        dt = np.dtype(tag)
    except TypeError:
        import ml_dtypes  # registers its names with numpy only once imported

        try:
            return np.dtype(getattr(ml_dtypes, tag))
        except AttributeError:
            raise ValueError(f"unknown element type {tag!r}") from None
    if dt.kind == "V" and tag.lstrip("<>|=").startswith("V"):  # an old "<V2" tag: the type it held is lost
        raise ValueError(f"element type {tag!r} names raw bytes, not a numeric type")
    return dt


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def size(self) -> int:
        # math.prod, not np.prod: ~50x cheaper on a short tuple, and planners ask for it per tensor per layer
        return int(math.prod(self.shape))

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize


@dataclass
class Node:
    """One operator instance. ``inputs`` may hold "" for an absent optional input.

    Fusion is recorded in ``attrs``: ``act`` = (name, params) is an activation applied to the
    output; ``residual`` = True means the last input is added (after bias, before ``act``).
    """

    name: str
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = ""
    #: control flow (If/Loop/Scan): each body attribute's ``Subgraph`` shaped at this node's input shapes, made
    #: by shape inference (``inferd.ops.control``) every time the node is shaped, never copied or stored
    bodies: dict[str, "Graph"] = field(default_factory=dict, repr=False, compare=False)
    #: what a backend learns running the node (control flow: bodies taken, deciding cost); never serialised
    notes: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)


@dataclass
class Subgraph:
    """A control-flow body as imported (an If branch, a Loop or Scan body): its nodes are not shaped, since a
    body takes its shapes from where it is used, and may read ``outer`` names of enclosing scopes (the node
    that owns it lists them as extra inputs after its formal ones, so planners see those reads)."""

    name: str
    nodes: list[Node]
    #: formal inputs in order: (name, dtype, declared dims; None where the file declares none)
    inputs: list[tuple[str, np.dtype, tuple[int, ...] | None]]
    outputs: list[str]
    constants: dict[str, np.ndarray]
    #: names read from enclosing scopes (nested bodies' reads included)
    outer: list[str]


@dataclass
class Graph:
    name: str
    nodes: list[Node]
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    constants: dict[str, np.ndarray]
    infos: dict[str, TensorInfo]
    opset: int = 17
    #: input name -> its declared dimensions, a str naming each dynamic one (empty: every input is static)
    dims: dict[str, tuple[int | str, ...]] = field(default_factory=dict)
    #: tensors whose shape is known only at run time (a value-dependent If whose branches differ in shape, a
    #: Loop's scan outputs under a value-dependent trip count): their ``infos`` shape is a placeholder
    runtime_shaped: set[str] = field(default_factory=set)

    @property
    def dynamic(self) -> bool:
        """Whether some input dimension is dynamic (the graph is a template, shaped at its probe)."""
        return any(isinstance(d, str) for ds in self.dims.values() for d in ds)

    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs if o}

    def consumers(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    out.setdefault(i, []).append(n)
        return out

    def remove_node(self, node: Node) -> None:
        """Take ``node`` out of ``nodes``, found by identity: ``list.remove`` compares with ``==``, which on nodes
        (dataclasses) compares every field of every node before it (1.5 s of a quantised vit_tiny's import under
        cProfile). ValueError if it is not there, as ``list.remove``."""
        for i, n in enumerate(self.nodes):
            if n is node:
                del self.nodes[i]
                return
        raise ValueError(f"node {node.name!r} is not in the graph")

    def is_const(self, name: str) -> bool:
        return name in self.constants

    def set_const(self, name: str, val: np.ndarray) -> None:
        """Add (or replace) constant ``name`` and its info."""
        self.constants[name] = val
        self.infos[name] = TensorInfo(name, tuple(val.shape), val.dtype)


class GraphIndex:
    """A graph's producers and consumers for a pass that changes the graph: kept up to date through its node
    replacements (``replaced``) or built again after any other change (set ``stale``). The import's fusion passes
    built both for every candidate node, quadratic in the graph (a quantised vit_tiny's import under cProfile: 3.7 of
    its 6 s; 1.85 -> 0.47 s unprofiled, 2-core VM)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.stale = True
        self.prods: dict[str, Node] = {}
        self.cons: dict[str, list[Node]] = {}
        self.alive: set[int] = set()

    def get(self) -> tuple[dict[str, Node], dict[str, list[Node]]]:
        if self.stale:
            g = self.graph
            self.prods, self.cons = g.producers(), g.consumers()
            self.alive = {id(n) for n in g.nodes}  # (every node counted here is alive: its id is not reused)
            self.stale = False
        return self.prods, self.cons

    def holds(self, node: Node) -> bool:
        """Whether ``node`` is still in the graph."""
        self.get()
        return id(node) in self.alive

    def replaced(self, first: Node, removed: list[Node | None], new: Node) -> None:
        """Follow ``new`` taking ``first``'s place and ``removed`` leaving the graph, without building the index
        again. A consumers list may come out in another order than the graph's: its readers ask how many consumers a
        tensor has, and which where there is one."""
        if self.stale:
            return  # built from the graph when next asked
        for n in [first, *(r for r in removed if r is not None)]:
            for o in n.outputs:
                if o and self.prods.get(o) is n:
                    del self.prods[o]
            for i in set(n.inputs):
                if i and i in self.cons:
                    left = [c for c in self.cons[i] if c is not n]
                    if left:
                        self.cons[i] = left
                    else:
                        del self.cons[i]
            self.alive.discard(id(n))
        for o in new.outputs:
            if o:
                self.prods[o] = new
        for i in new.inputs:
            if i:
                self.cons.setdefault(i, []).append(new)
        self.alive.add(id(new))
