"""Layout and mask ops: DepthToSpace / SpaceToDepth (pixel shuffle), Trilu (triangular masks) and EyeLike.

One numpy function per op, shared by the oracle and the CPU kernel (which copies the result into the arena).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .. import native
from ..errors import ShapeError, UnsupportedOpError
from ..ir import Node, TensorInfo
from .base import ContiguousOut, Kernel, Layer, OpSpec, full_inputs, register_kernel, register_op
from .tensor import onnx_dtype

Infos = list["TensorInfo | None"]


def _mode(node: Node) -> str:
    m = node.attr("mode", "DCR")
    return m.decode() if isinstance(m, bytes) else str(m)


def _blocksize(node: Node) -> int:
    b = int(node.attr("blocksize", 0))
    if b < 1:
        raise ShapeError(f"node {node.name!r} ({node.op}): blocksize {b} < 1")
    return b


def _check_d2s(node: Node, opset: int) -> None:
    if _mode(node) not in ("DCR", "CRD"):
        raise UnsupportedOpError(node.op, node.name, opset, f"mode {_mode(node)!r} (DCR or CRD)")


def _infer_d2s(node: Node, ins: Infos, consts: dict[str, np.ndarray]) -> list:
    x = ins[0]
    assert x is not None
    bs = _blocksize(node)
    if len(x.shape) != 4:
        raise ShapeError(f"node {node.name!r} ({node.op}): input must be 4-D (N, C, H, W), got {list(x.shape)}")
    n, c, h, w = x.shape
    if node.op == "DepthToSpace":
        if c % (bs * bs):
            raise ShapeError(f"node {node.name!r} (DepthToSpace): channels {c} not divisible by blocksize^2 {bs * bs}")
        return [((n, c // (bs * bs), h * bs, w * bs), np.dtype(x.dtype))]
    if h % bs or w % bs:
        raise ShapeError(f"node {node.name!r} (SpaceToDepth): H {h} and W {w} must be multiples of blocksize {bs}")
    return [((n, c * bs * bs, h // bs, w // bs), np.dtype(x.dtype))]


def depth_to_space(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    bs = _blocksize(node)
    n, c, h, w = x.shape
    oc = c // (bs * bs)
    if _mode(node) == "DCR":  # depth is (block row, block column, channel)
        t = x.reshape(n, bs, bs, oc, h, w).transpose(0, 3, 4, 1, 5, 2)
    else:  # CRD: (channel, block row, block column), PyTorch's pixel_shuffle
        t = x.reshape(n, oc, bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    return [np.ascontiguousarray(t).reshape(n, oc, h * bs, w * bs)]


def space_to_depth(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    bs = _blocksize(node)
    n, c, h, w = x.shape
    if _mode(node) == "DCR":  # the only layout before opset 28, which added mode
        t = x.reshape(n, c, h // bs, bs, w // bs, bs).transpose(0, 3, 5, 1, 2, 4)
    else:  # CRD: the inverse of DepthToSpace's CRD (PyTorch's pixel_unshuffle)
        t = x.reshape(n, c, h // bs, bs, w // bs, bs).transpose(0, 1, 3, 5, 2, 4)
    return [np.ascontiguousarray(t).reshape(n, c * bs * bs, h // bs, w // bs)]


# ------------------------------------------------------------------------------------- Trilu

def _infer_trilu(node: Node, ins: Infos, consts: dict[str, np.ndarray]) -> list:
    x = ins[0]
    assert x is not None
    if len(x.shape) < 2:
        raise ShapeError(f"node {node.name!r} (Trilu): input rank {len(x.shape)} < 2")
    return [(x.shape, np.dtype(x.dtype))]


def trilu(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    # k is a value, not a shape: it may be computed at run time
    k = int(np.asarray(ins[1]).reshape(-1)[0]) if len(ins) > 1 and ins[1] is not None else 0
    f = np.triu if node.attr("upper", 1) else np.tril
    return [f(x, k)]


# ------------------------------------------------------------------------------------- EyeLike

def _eye_dtype(node: Node, in_dtype: np.dtype) -> np.dtype:
    code = node.attr("dtype")
    return np.dtype(in_dtype) if code is None else onnx_dtype(int(code), "EyeLike", node.name)


def _check_eyelike(node: Node, opset: int) -> None:
    if node.attr("dtype") is not None:
        onnx_dtype(int(node.attr("dtype")), "EyeLike", node.name)


def _infer_eyelike(node: Node, ins: Infos, consts: dict[str, np.ndarray]) -> list:
    x = ins[0]
    assert x is not None
    if len(x.shape) != 2:
        raise ShapeError(f"node {node.name!r} (EyeLike): input must be 2-D, got {list(x.shape)}")
    return [(x.shape, _eye_dtype(node, x.dtype))]


def eyelike(node: Node, ins: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(ins[0])
    r, c = x.shape
    return [np.eye(r, c, k=int(node.attr("k", 0)), dtype=_eye_dtype(node, x.dtype))]


# ------------------------------------------------------------------------------------- registration

_COMPUTE: dict[str, Callable[[Node, Sequence[np.ndarray | None]], list[np.ndarray]]] = {
    "DepthToSpace": depth_to_space, "SpaceToDepth": space_to_depth, "Trilu": trilu, "EyeLike": eyelike,
}
LAYOUT_OPS = tuple(_COMPUTE)


def _reference(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    # fresh C-ordered copies (folded constants must not be views of other constants)
    return [np.array(r, order="C", copy=True) for r in _COMPUTE[node.op](node, inputs)]


register_op(OpSpec("DepthToSpace", _infer_d2s, _reference, min_opset=1, check=_check_d2s))
register_op(OpSpec("SpaceToDepth", _infer_d2s, _reference, min_opset=1, check=_check_d2s))
register_op(OpSpec("Trilu", _infer_trilu, _reference, min_opset=14))
register_op(OpSpec("EyeLike", _infer_eyelike, _reference, min_opset=9, check=_check_eyelike))


@register_kernel
class LayoutKernel(Kernel):
    """numpy reshape/transpose (one copy into the arena), triu/tril and eye."""

    name = "numpy"
    ops = LAYOUT_OPS

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        for o, r in zip(outputs, _COMPUTE[layer.op](layer.node, full_inputs(layer, inputs, params))):
            np.copyto(o, r)


@register_kernel
class DepthToSpaceNative(Kernel):
    """native/gather.c: DepthToSpace (DCR and CRD) of any element size, one pool task per (image, output
    channel) whose rows interleave blocksize input rows; numpy's reshape-transpose-copy runs on one thread."""

    name = "d2s_native"
    ops = ("DepthToSpace",)
    priority = 10

    def applies(self, layer: Layer) -> bool:
        x = layer.inputs[0]
        return native.has("inferd_depth_to_space") and x is not None and len(x.shape) == 4 and \
            np.dtype(x.dtype).itemsize > 0 and np.dtype(x.dtype).kind in "fiub"

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        ins = full_inputs(layer, inputs, params)
        x = np.ascontiguousarray(ins[0])
        y = outputs[0]
        bs = _blocksize(layer.node)
        n, c, h, w = x.shape
        o = ContiguousOut(y, x.dtype, avoid=x)
        ffi = native.ffi
        native.lib.inferd_depth_to_space(ffi.cast("const void*", x.ctypes.data), ffi.cast("void*", o.y.ctypes.data),
                                         n, c // (bs * bs), h, w, bs, int(_mode(layer.node) == "CRD"), x.itemsize)
        o.close()
