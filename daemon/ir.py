"""Graph IR: what import produces and every later stage (planners, runtime, backends) consumes.

Shapes are static: a dynamic batch dimension is fixed when the model is loaded, so every tensor
has a concrete shape and the planners can size memory exactly.
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
