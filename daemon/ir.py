"""Graph IR: what import produces and every later stage (planners, runtime, backends) consumes.

Every tensor has a concrete shape, so the planners can size memory exactly. A model with dynamic
input dimensions is imported as a *template*: its tensors are shaped at a probe shape, ``dims`` names
the dynamic dimensions, and the nodes that compute shapes from them (Shape, Gather, Concat on int64,
...) stay in the graph. ``inferd.frontend.specialize`` turns the template into the static graph of one
concrete shape (those nodes folded); every specialisation shares the template's constants.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

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

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)


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

    def is_const(self, name: str) -> bool:
        return name in self.constants
