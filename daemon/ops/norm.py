"""BatchNormalization, InstanceNormalization, LayerNormalization, and BN folding.

Import folds a BatchNormalization that follows a Conv/ConvTranspose/Gemm into that producer with
``fold_bn_into``; a BN that cannot be folded (after a Concat, at a graph input, ...) runs as a
per-channel affine map whose scale/shift the ``norm`` kernel precomputes in ``transform``.

``training_mode=1`` (opset 14+) normalises with the batch's own statistics and writes the updated running
statistics: inference graphs carry it where a model standardises its weights with ``F.batch_norm(...,
training=True)`` (timm's ScaledStdConv2d in NF-Nets and NF-RegNets), usually on constants that import folds.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .. import native
from ..errors import ShapeError, UnsupportedOpError
from ..ir import Node, TensorInfo
from .activation import apply_act
from .base import (BoundOrOracle, ContiguousOut, Kernel, Layer, OpSpec, full_inputs, raw_key, register_kernel,
                   register_op)

__all__ = ["fold_bn_into", "bn_scale_shift", "bn_training", "batchnorm_reference", "instancenorm_reference", "layernorm_reference"]


# --------------------------------------------------------------------------- BN folding

def bn_scale_shift(scale: np.ndarray, B: np.ndarray, mean: np.ndarray, var: np.ndarray,
                   eps: float) -> tuple[np.ndarray, np.ndarray]:
    """BN as ``y = x * s + t`` per channel, in float64: ``s = scale / sqrt(var + eps)``, ``t = B - mean * s``."""
    s = np.asarray(scale, np.float64) / np.sqrt(np.asarray(var, np.float64) + float(eps))
    t = np.asarray(B, np.float64) - np.asarray(mean, np.float64) * s
    return s, t


def _work_dtype(w: np.ndarray) -> np.dtype:
    """float32 weights are scaled in float32: the product of two float32 numbers is correctly rounded, so
    only the per-channel factor's own rounding (6e-8 relative) differs from float64, and this avoids
    a float64 copy of every weight at import (tens of ms on resnet50, on the cold path)."""
    return np.dtype(np.float32) if w.dtype == np.float32 else np.dtype(np.float64)


def fold_bn_into(weight: np.ndarray, bias: np.ndarray | None, scale: np.ndarray, B: np.ndarray,
                 mean: np.ndarray, var: np.ndarray, eps: float, axis: int,
                 groups: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Fold an inference BatchNormalization that follows a linear layer into that layer's weights.

    The layer computes ``y[..., c, ...] = sum(W * x) + bias[c]`` for output channel ``c``; the BN then
    computes ``(y - mean) * scale / sqrt(var + eps) + B``. Returns ``(w, b)`` with
    ``w = W * s`` along the output-channel axis and ``b = (bias - mean) * s + B`` (``bias=None`` = 0),
    in ``weight``'s dtype (per-channel factors in float64; see ``_work_dtype``). Inputs are not modified.

    ``axis`` is the output-channel axis of ``weight``:
      * Conv (W: [C_out, C_in/g, k...]): ``axis=0``;
      * ConvTranspose (W: [C_in, C_out/g, k...]): ``axis=1, groups=g`` -- the BN has C_out = g * W.shape[1]
        channels, and channel ``gi * W.shape[1] + j`` scales ``W[gi*C_in/g:(gi+1)*C_in/g, j]``;
      * Gemm (Y = A @ op(B) + C): ``axis=0`` if transB=1 (B: [N, K]) else ``axis=1`` (B: [K, N]); the same
        for MatMul with a constant 2-D B (``axis=1``, ``bias=None``). Gemm's alpha/beta must already be
        folded into B and C (``W = alpha * B``, ``bias = beta * C``) before calling.
    ``bias`` may be any shape that broadcasts against ``(C_out,)`` on its last axis (Gemm's C may be
    a scalar, (N,), (1, N) or (M, N)); the result has the broadcast shape.
    """
    w = np.asarray(weight)
    s, t = bn_scale_shift(scale, B, mean, var, eps)
    c_out = s.shape[0]
    ax = axis % w.ndim
    if groups < 1:
        raise ShapeError(f"fold_bn_into: groups must be >= 1, got {groups}")
    if groups > 1:
        if ax != 1:
            raise ShapeError(f"fold_bn_into: groups={groups} only applies to ConvTranspose weights (axis=1), "
                             f"got axis={axis}")
        cin, per = w.shape[0], w.shape[1]
        if per * groups != c_out or cin % groups:
            raise ShapeError(f"fold_bn_into: ConvTranspose weight {w.shape} with groups={groups} does not have "
                             f"{c_out} output channels")
        wg = w.reshape((groups, cin // groups, per) + w.shape[2:])
        f = s.reshape((groups, 1, per) + (1,) * (w.ndim - 2)).astype(_work_dtype(w))
        w_new = (wg * f).reshape(w.shape)
    else:
        if w.shape[ax] != c_out:
            raise ShapeError(f"fold_bn_into: weight {w.shape} has {w.shape[ax]} channels on axis {axis}, "
                             f"BatchNormalization has {c_out}")
        f = s.reshape((1,) * ax + (c_out,) + (1,) * (w.ndim - ax - 1)).astype(_work_dtype(w))
        w_new = w * f
    b0 = np.zeros(c_out) if bias is None else np.asarray(bias, np.float64)
    b_new = (b0 - np.asarray(mean, np.float64)) * s + np.asarray(B, np.float64)
    return w_new.astype(w.dtype), b_new.astype(w.dtype)


# --------------------------------------------------------------------------- shared helpers

def _extra_outputs(node: Node) -> list[str]:
    return [o for o in node.outputs[1:] if o]


def bn_training(node: Node) -> bool:
    """A BatchNormalization that normalises with the batch's statistics (``training_mode=1``)."""
    return bool(node.attr("training_mode", 0))


def _check_bn(node: Node, opset: int) -> None:
    if bn_training(node):
        if opset < 14:
            raise UnsupportedOpError(node.op, node.name, opset, "training_mode is an opset-14 attribute")
        return
    if _extra_outputs(node):
        # before opset 14 a node with these outputs was a training node (mean, var, saved_mean, saved_var)
        raise UnsupportedOpError(node.op, node.name, opset,
                                 "running/saved mean and variance outputs without training_mode=1 are not supported")


def _check_ln(node: Node, opset: int) -> None:
    if _extra_outputs(node) and int(node.attr("stash_type", 1)) != 1:
        raise UnsupportedOpError(node.op, node.name, opset, f"stash_type={node.attr('stash_type')} for the "
                                 f"Mean/InvStdDev outputs (only 1, float32, is supported)")


def _check_in(node: Node, opset: int) -> None:
    if _extra_outputs(node):
        raise UnsupportedOpError(node.op, node.name, opset, "only one output is defined")


def _channel_shape(x_ndim: int, p: np.ndarray) -> tuple[int, ...]:
    """How a per-channel parameter broadcasts against (N, C, *spatial)."""
    if p.ndim > 1:  # BN spatial=0 (opset < 9): parameters shaped like x.shape[1:]
        return p.shape
    return (p.shape[0],) + (1,) * (x_ndim - 2)


def _infer_bn(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    x = ins[0]
    if x is None or len(x.shape) < 2:
        raise ShapeError(f"BatchNormalization {node.name!r}: X must be (N, C, ...), "
                         f"got {None if x is None else x.shape}")
    for i in range(1, 5):
        p = ins[i] if i < len(ins) else None
        if p is None:
            raise ShapeError(f"BatchNormalization {node.name!r}: input {i} is required")
        if len(p.shape) == 1 and p.shape[0] != x.shape[1]:
            raise ShapeError(f"BatchNormalization {node.name!r}: parameter {i} has {p.shape[0]} channels, "
                             f"X has {x.shape[1]}")
    if bn_training(node) and len(ins[1].shape) != 1:  # type: ignore[union-attr]
        raise ShapeError(f"BatchNormalization {node.name!r}: training_mode needs per-channel parameters")
    # running mean and variance (training_mode): one value per channel
    stat = ((x.shape[1],), ins[3].dtype)  # type: ignore[union-attr]
    return [(x.shape, x.dtype), stat, stat][:max(len(node.outputs), 1)]


def _infer_in(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    x = ins[0]
    if x is None or len(x.shape) < 3:
        raise ShapeError(f"InstanceNormalization {node.name!r}: X must be (N, C, spatial...), got "
                         f"{None if x is None else x.shape}")
    for i in (1, 2):
        if ins[i] is None or tuple(ins[i].shape) != (x.shape[1],):
            raise ShapeError(f"InstanceNormalization {node.name!r}: input {i} must have shape ({x.shape[1]},)")
    return [(x.shape, x.dtype)]


def _ln_axis(node: Node, ndim: int) -> int:
    a = int(node.attr("axis", -1))
    if not -ndim <= a < ndim:
        raise ShapeError(f"LayerNormalization {node.name!r}: axis {a} out of range for rank {ndim}")
    return a % ndim


def _infer_ln(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    x = ins[0]
    if x is None or len(x.shape) < 1:
        raise ShapeError(f"LayerNormalization {node.name!r}: X is required and must not be a scalar")
    ax = _ln_axis(node, len(x.shape))
    norm = tuple(x.shape[ax:])
    for i in (1, 2):
        p = ins[i] if i < len(ins) else None
        if p is None:
            if i == 1:
                raise ShapeError(f"LayerNormalization {node.name!r}: Scale is required")
            continue
        ps = tuple(p.shape)
        if len(ps) > len(norm) or any(a not in (1, b) for a, b in zip(reversed(ps), reversed(norm))):
            raise ShapeError(f"LayerNormalization {node.name!r}: input {i} of shape {ps} does not broadcast to "
                             f"the normalized shape {norm}")
    stat = (tuple(x.shape[:ax]) + (1,) * len(norm), _LN_STASH)
    return [(x.shape, x.dtype), stat, stat][:max(len(node.outputs), 1)]


#: element type of LayerNormalization's Mean/InvStdDev outputs (stash_type=1, the only one _check_ln lets through)
_LN_STASH = np.dtype(np.float32)


def _write_stats(node: Node, outputs: Sequence[np.ndarray], stats: Sequence[np.ndarray]) -> None:
    """Fill the statistics outputs the node asks for (LayerNormalization's Mean/InvStdDev, a training
    BatchNormalization's running mean/variance). ``outputs`` holds only its non-empty outputs (Y first), as
    executors pass them; ``stats`` is the two statistics in output order (a shorter sequence is fine when the
    node declares fewer outputs)."""
    j = 1
    for k, name in enumerate(node.outputs[1:3]):
        if not name:
            continue
        o = outputs[j]
        np.copyto(o, np.asarray(stats[k]).reshape(o.shape), casting="unsafe")
        j += 1


def _finish(node: Node, y: np.ndarray) -> np.ndarray:
    act = node.attr("act")
    if act is not None:
        apply_act(y, act)
    return y


# --------------------------------------------------------------------------- references (float64)

def bn_batch_stats(node: Node, x: np.ndarray, mean: np.ndarray, var: np.ndarray,
                   acc: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """training_mode: the batch's per-channel mean and (population) variance over every axis but 1, in ``acc``,
    and the running statistics ONNX asks for: ``input * momentum + batch * (1 - momentum)``."""
    axes = (0,) + tuple(range(2, x.ndim))
    bm = np.mean(x, axis=axes, dtype=acc)
    d = x - bm.reshape((1, -1) + (1,) * (x.ndim - 2)).astype(acc)
    bv = np.mean(d * d, axis=axes, dtype=acc)
    mom = np.asarray(float(node.attr("momentum", 0.9)), acc)
    run_m = np.asarray(mean, acc) * mom + bm * (1 - mom)
    run_v = np.asarray(var, acc) * mom + bv * (1 - mom)
    return bm, bv, run_m, run_v


def batchnorm_reference(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    scale, b, mean, var = (np.asarray(inputs[i], np.float64) for i in range(1, 5))
    sh = _channel_shape(x.ndim, scale)
    eps = float(node.attr("epsilon", 1e-5))
    stats: list[np.ndarray] = []
    if bn_training(node):
        mean, var, run_m, run_v = bn_batch_stats(node, x.astype(np.float64), mean, var, np.dtype(np.float64))
        stats = [run_m.astype(inputs[3].dtype), run_v.astype(inputs[4].dtype)]  # type: ignore[union-attr]
    y = (x.astype(np.float64) - mean.reshape(sh)) / np.sqrt(var.reshape(sh) + eps) * scale.reshape(sh) + b.reshape(sh)
    # one result per declared output (an empty name included), as constant folding zips them
    return ([_finish(node, y.astype(x.dtype))] + stats)[:max(len(node.outputs), 1)]


def instancenorm_reference(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    xf = x.astype(np.float64)
    axes = tuple(range(2, x.ndim))
    mean = xf.mean(axis=axes, keepdims=True)
    var = ((xf - mean) ** 2).mean(axis=axes, keepdims=True)
    sh = (x.shape[1],) + (1,) * (x.ndim - 2)
    scale, b = np.asarray(inputs[1], np.float64).reshape(sh), np.asarray(inputs[2], np.float64).reshape(sh)
    y = (xf - mean) / np.sqrt(var + float(node.attr("epsilon", 1e-5))) * scale + b
    return [_finish(node, y.astype(x.dtype))]


def layernorm_reference(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    ax = _ln_axis(node, x.ndim)
    xf = x.astype(np.float64)
    axes = tuple(range(ax, x.ndim))
    mean = xf.mean(axis=axes, keepdims=True)
    var = ((xf - mean) ** 2).mean(axis=axes, keepdims=True)
    inv = 1.0 / np.sqrt(var + float(node.attr("epsilon", 1e-5)))
    y = (xf - mean) * inv * np.asarray(inputs[1], np.float64)
    if len(inputs) > 2 and inputs[2] is not None:
        y = y + np.asarray(inputs[2], np.float64)
    # one result per declared output (an empty name included), as constant folding zips them
    return [_finish(node, y.astype(x.dtype)), mean.astype(_LN_STASH), inv.astype(_LN_STASH)][:max(len(node.outputs), 1)]


register_op(OpSpec("BatchNormalization", _infer_bn, batchnorm_reference, check=_check_bn,
                   notes="training_mode=1 (batch statistics, running-statistics outputs) on the CPU; the opset < 14 "
                         "training outputs refused"))
register_op(OpSpec("InstanceNormalization", _infer_in, instancenorm_reference, check=_check_in))
register_op(OpSpec("LayerNormalization", _infer_ln, layernorm_reference, min_opset=17, check=_check_ln))


# --------------------------------------------------------------------------- kernels

def _acc_dtype(dt: np.dtype) -> np.dtype:
    """Statistics in at least float32 (LayerNormalization's default stash_type=1 asks for that)."""
    return np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)


@register_kernel
class NormKernel(Kernel):
    """Vectorised numpy: BN as a precomputed per-channel affine map; IN/LN with a two-pass variance.

    BN params: ``scale``/``shift`` already shaped to broadcast against X (when all four BN
    parameters are constant; otherwise the raw ones and the map is built per run).
    """

    name = "norm"
    ops = ("BatchNormalization", "InstanceNormalization", "LayerNormalization")
    priority = 10

    def applies(self, layer: Layer) -> bool:
        return layer.inputs[0] is not None and np.issubdtype(np.dtype(layer.inputs[0].dtype), np.floating)

    def _bn_all_const(self, layer: Layer) -> bool:
        # (training_mode: the statistics come from the batch, so there is no fixed affine map to precompute)
        return all(k in layer.const_inputs for k in range(1, 5)) and not bn_training(layer.node)

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        dt = np.dtype(layer.outputs[0].dtype)
        if layer.op == "BatchNormalization" and self._bn_all_const(layer):
            p = [raw[raw_key(k)] for k in range(1, 5)]
            s, t = bn_scale_shift(*p, float(layer.attr("epsilon", 1e-5)))
            sh = _channel_shape(len(layer.in_shape(0)), np.asarray(p[0]))
            return {"scale": s.reshape(sh).astype(dt), "shift": t.reshape(sh).astype(dt)}
        return dict(raw)

    def transformed_nbytes(self, layer: Layer) -> int:
        if layer.op == "BatchNormalization" and self._bn_all_const(layer):
            return 2 * layer.inputs[1].nbytes
        return super().transformed_nbytes(layer)

    def workspace_nbytes(self, layer: Layer) -> int:
        if layer.op == "BatchNormalization":
            return 0
        shape = layer.in_shape(0)
        ax = _ln_axis(layer.node, len(shape)) if layer.op == "LayerNormalization" else 2
        rows = int(np.prod(shape[:ax], dtype=np.int64))
        nb = _acc_dtype(np.dtype(layer.inputs[0].dtype)).itemsize
        extra = layer.inputs[0].size * nb if np.dtype(layer.inputs[0].dtype) == np.float16 else 0
        return int(rows * 2 * nb + extra)

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        y = outputs[0]
        if layer.op == "BatchNormalization":
            x = inputs[0]
            if bn_training(layer.node):
                self._run_bn_training(layer, full_inputs(layer, inputs, params), outputs)
                return
            if "scale" in params:
                s, t = params["scale"], params["shift"]
            else:
                ins = full_inputs(layer, inputs, params)
                s64, t64 = bn_scale_shift(*ins[1:5], float(layer.attr("epsilon", 1e-5)))
                sh = _channel_shape(x.ndim, np.asarray(ins[1]))
                s, t = s64.reshape(sh).astype(y.dtype), t64.reshape(sh).astype(y.dtype)
            np.multiply(x, s, out=y)
            np.add(y, t, out=y)
        else:
            ins = full_inputs(layer, inputs, params)
            x = ins[0]
            if layer.op == "InstanceNormalization":
                ax = 2
                c = x.shape[1]
                scale = np.asarray(ins[1]).reshape((1, c) + (1,) * (x.ndim - 2))
                bias = np.asarray(ins[2]).reshape((1, c) + (1,) * (x.ndim - 2))
            else:
                ax = _ln_axis(layer.node, x.ndim)
                scale = ins[1]
                bias = ins[2] if len(ins) > 2 else None
            eps = float(layer.attr("epsilon", 1e-5))
            acc = _acc_dtype(x.dtype)
            rows = int(np.prod(x.shape[:ax], dtype=np.int64))
            d = int(np.prod(x.shape[ax:], dtype=np.int64))
            # the normalised values are built in y itself when y can hold the statistics' precision
            work = y if y.dtype == acc and y.flags.c_contiguous else np.empty(x.shape, acc)
            x2 = x.reshape(rows, d)
            w2 = work.reshape(rows, d)
            mean = np.mean(x2, axis=1, dtype=acc, keepdims=True)
            np.subtract(x2, mean, out=w2, casting="unsafe")
            var = np.einsum("rd,rd->r", w2, w2) / np.asarray(d, acc)
            inv = 1.0 / np.sqrt(var + np.asarray(eps, acc))
            np.multiply(w2, inv[:, None].astype(acc), out=w2)
            np.multiply(work, scale, out=work, casting="unsafe")
            if bias is not None:
                np.add(work, bias, out=work, casting="unsafe")
            if work is not y:
                np.copyto(y, work, casting="unsafe")
            if layer.op == "LayerNormalization" and len(outputs) > 1:
                _write_stats(layer.node, outputs, (mean, inv))
        act = layer.attr("act")
        if act is not None:
            apply_act(y, act)

    @staticmethod
    def _run_bn_training(layer: Layer, ins: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray]) -> None:
        """training_mode: the batch's statistics in at least float32, then the affine map into Y."""
        x, y = np.asarray(ins[0]), outputs[0]
        acc = _acc_dtype(x.dtype)
        bm, bv, run_m, run_v = bn_batch_stats(layer.node, x, ins[3], ins[4], acc)  # type: ignore[arg-type]
        s, t = bn_scale_shift(ins[1], ins[2], bm, bv, float(layer.attr("epsilon", 1e-5)))  # type: ignore[arg-type]
        sh = _channel_shape(x.ndim, s)
        np.multiply(x, s.reshape(sh).astype(acc), out=y, casting="unsafe")
        np.add(y, t.reshape(sh).astype(acc), out=y, casting="unsafe")
        _write_stats(layer.node, outputs, (run_m, run_v))
        act = layer.attr("act")
        if act is not None:
            apply_act(y, act)


@register_kernel
class NormReferenceKernel(Kernel):
    """The OpSpecs' float64 numpy references (the oracle the ``norm`` kernel is tested against)."""

    name = "reference"
    ops = ("BatchNormalization", "InstanceNormalization", "LayerNormalization")
    priority = 100

    _REF: dict[str, Any] = {"BatchNormalization": batchnorm_reference,
                            "InstanceNormalization": instancenorm_reference,
                            "LayerNormalization": layernorm_reference}

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        res = self._REF[layer.op](layer.node, full_inputs(layer, inputs, params))
        np.copyto(outputs[0], res[0])
        if len(outputs) > 1:
            _write_stats(layer.node, outputs, res[1:])


@register_kernel
class LayerNormNativeKernel(Kernel):
    """Float32 LayerNormalization over the trailing axes in native code (mean, variance and the affine map in
    three passes per row, rows split over the native pool). Scale and bias must be one value per normalised
    element (the usual (D,) parameters); only the first output (Y) may be used."""

    name = "layernorm_native"
    ops = ("LayerNormalization",)
    priority = 5

    def applies(self, layer: Layer) -> bool:
        x = layer.inputs[0]
        if not native.AVAILABLE or x is None or np.dtype(x.dtype) != np.float32:
            return False
        if np.dtype(layer.outputs[0].dtype) != np.float32 or any(o for o in layer.node.outputs[1:]):
            return False
        shape = tuple(x.shape)
        if not shape:
            return False
        d = int(np.prod(shape[_ln_axis(layer.node, len(shape)):], dtype=np.int64))
        for i in (1, 2):
            t = layer.inputs[i] if len(layer.inputs) > i else None
            if t is not None and (int(np.prod(t.shape, dtype=np.int64)) != d or np.dtype(t.dtype) != np.float32):
                return False
        return layer.inputs[1] is not None and d > 0

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: np.ascontiguousarray(v, dtype=np.float32).reshape(-1) for k, v in raw.items()}

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        self._call(layer, inputs, params, outputs, bound=False)()

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]):
        return self._call(layer, inputs, params, outputs, bound=True)

    def _call(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
              outputs: Sequence[np.ndarray], bound: bool):
        ins = full_inputs(layer, inputs, params)
        x, y = ins[0], outputs[0]
        g = np.ascontiguousarray(ins[1], dtype=np.float32).reshape(-1)
        b = np.ascontiguousarray(ins[2], dtype=np.float32).reshape(-1) if len(ins) > 2 and ins[2] is not None \
            else None
        d = g.size
        rows = x.size // d
        eps = float(layer.attr("epsilon", 1e-5))
        dynamic_params = any(inputs[i] is not None for i in (1, 2) if i < len(inputs))
        if not bound or dynamic_params or not x.flags.c_contiguous or not y.flags.c_contiguous:
            # resolved per run: parameters computed at run time, or strided views
            def once() -> None:
                ins2 = full_inputs(layer, inputs, params)
                xc = np.ascontiguousarray(ins2[0], dtype=np.float32)
                g2 = np.ascontiguousarray(ins2[1], dtype=np.float32).reshape(-1)
                b2 = None if len(ins2) < 3 or ins2[2] is None else np.ascontiguousarray(ins2[2], np.float32).reshape(-1)
                o = ContiguousOut(y)
                native.lib.inferd_layernorm(native._ptr(xc), native._ptr(o.y), rows, d, native._ptr(g2),
                                            native.ffi.NULL if b2 is None else native._ptr(b2), eps)
                o.close()
            return once
        fn = native.lib.inferd_layernorm
        args = (native._ptr(x), native._ptr(y), rows, d, native._ptr(g), native.ffi.NULL if b is None else native._ptr(b),
                eps)
        keep = (x, y, g, b)

        def call(_keep=keep) -> None:
            fn(*args)
        return native.with_steps(call, [("inferd_layernorm", args)])


# --------------------------------------------------------------------------- LpNormalization, LRN, MVN, GroupNorm
# Normalizations models carry less often than BN/LN: one numpy function each, computed in float32 (float64 for
# float64 inputs) whatever the input type, shared by the oracle and the CPU kernel.

def _calc(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64 if x.dtype == np.float64 else np.float32, copy=False)


def lp_normalization(node: Node, x: np.ndarray) -> np.ndarray:
    p = int(node.attr("p", 2))
    a = int(node.attr("axis", -1))
    xf = _calc(x)
    n = np.sum(np.abs(xf), axis=a, keepdims=True) if p == 1 else np.sqrt(np.sum(xf * xf, axis=a, keepdims=True))
    with np.errstate(divide="ignore", invalid="ignore"):
        # a zero norm gives 0, not 0/0 (the spec's test data and onnxruntime agree)
        return np.where(n == 0, 0, xf / n).astype(x.dtype)


def lrn(node: Node, x: np.ndarray) -> np.ndarray:
    """Across-channel LRN: x / (bias + alpha/size * sum of squares over the channel window)^beta."""
    size = int(node.attr("size", 0))
    alpha, beta, bias = float(node.attr("alpha", 1e-4)), float(node.attr("beta", 0.75)), float(node.attr("bias", 1.0))
    xf = _calc(x)
    sq = xf * xf
    c = x.shape[1]
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2  # the window [ch - lo, ch + hi], clipped to the channels
    acc = np.zeros_like(sq)
    for off in range(-lo, hi + 1):  # size is small (3..5 in every model that uses LRN)
        src = slice(max(0, off), c + min(0, off))
        dst = slice(max(0, -off), c - max(0, off))
        acc[:, dst] += sq[:, src]
    return (xf / (bias + (alpha / size) * acc) ** beta).astype(x.dtype)


def mean_variance_normalization(node: Node, x: np.ndarray) -> np.ndarray:
    axes = tuple(int(a) for a in node.attr("axes", [0, 2, 3]))
    xf = _calc(x)
    mean = np.mean(xf, axis=axes, keepdims=True)
    # ONNX's function body: (x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9); np.var is the same variance, never < 0
    std = np.sqrt(np.var(xf, axis=axes, keepdims=True))
    return ((xf - mean) / (std + xf.dtype.type(1e-9))).astype(x.dtype)


def group_normalization(node: Node, x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
    g = int(node.attr("num_groups", 0))
    eps = float(node.attr("epsilon", 1e-5))
    n, c = x.shape[0], x.shape[1]
    xf = _calc(x).reshape(n, g, -1)
    mean = xf.mean(axis=2, keepdims=True)
    var = xf.var(axis=2, keepdims=True)
    y = ((xf - mean) / np.sqrt(var + eps)).reshape(x.shape)
    s, b = _calc(np.asarray(scale)).reshape(-1), _calc(np.asarray(bias)).reshape(-1)
    if s.size == g and g != c:  # opset 18: one scale and bias per group (opset 21 made them per channel)
        s, b = np.repeat(s, c // g), np.repeat(b, c // g)
    cs = (c,) + (1,) * (x.ndim - 2)
    return (y * s.reshape(cs) + b.reshape(cs)).astype(x.dtype)


def _check_lrn(node: Node, opset: int) -> None:
    if int(node.attr("size", 0)) < 1:
        raise UnsupportedOpError("LRN", node.name, opset, "size must be >= 1")


def _check_lp(node: Node, opset: int) -> None:
    if int(node.attr("p", 2)) not in (1, 2):
        raise UnsupportedOpError("LpNormalization", node.name, opset, f"p={node.attr('p')} (ONNX allows 1 and 2)")


def _infer_same_norm(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    x = ins[0]
    assert x is not None
    if node.op == "LRN" and len(x.shape) < 3:
        raise ShapeError(f"node {node.name!r} (LRN): input rank {len(x.shape)} < 3 (N, C, spatial...)")
    if node.op == "GroupNormalization":
        g = int(node.attr("num_groups", 0))
        c = x.shape[1] if len(x.shape) > 1 else 0
        if g < 1 or c % g:
            raise ShapeError(f"node {node.name!r} (GroupNormalization): {c} channels do not split into {g} groups")
        for i in (1, 2):
            p = ins[i]
            if p is None or int(np.prod(p.shape)) not in (c, g):
                raise ShapeError(f"node {node.name!r} (GroupNormalization): input {i} must have {c} (or, before "
                                 f"opset 21, {g}) elements")
    return [(x.shape, np.dtype(x.dtype))]


def _ref_more(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    if node.op == "LpNormalization":
        return [lp_normalization(node, x)]
    if node.op == "LRN":
        return [lrn(node, x)]
    if node.op == "MeanVarianceNormalization":
        return [mean_variance_normalization(node, x)]
    return [group_normalization(node, x, np.asarray(inputs[1]), np.asarray(inputs[2]))]


MORE_NORMS = ("LpNormalization", "LRN", "MeanVarianceNormalization", "GroupNormalization")
register_op(OpSpec("LpNormalization", _infer_same_norm, _ref_more, min_opset=1, check=_check_lp))
register_op(OpSpec("LRN", _infer_same_norm, _ref_more, min_opset=1, check=_check_lrn))
register_op(OpSpec("MeanVarianceNormalization", _infer_same_norm, _ref_more, min_opset=9))
register_op(OpSpec("GroupNormalization", _infer_same_norm, _ref_more, min_opset=18,
                   notes="scale/bias per group (opset 18) or per channel (opset 21); computed in float32"))


@register_kernel
class MoreNormKernel(Kernel):
    """numpy in float32 (float64 inputs in float64): these normalizations are off the hot path of the models
    inferd serves (GroupNormalization has a native kernel beside this one: GroupNormNative)."""

    name = "numpy"
    ops = MORE_NORMS


@register_kernel
class GroupNormNative(Kernel):
    """native/rows.c: float32 GroupNormalization, one pool task per (image, group): its mean and variance in
    16 partial lanes, then each channel's scale and shift folded into one multiply-add. Scale and bias per
    group (opset 18) are repeated per channel once here."""

    name = "groupnorm_native"
    ops = ("GroupNormalization",)
    priority = 10

    def applies(self, layer: Layer) -> bool:
        x = layer.inputs[0]
        if not native.has("inferd_groupnorm") or x is None or len(x.shape) < 2 or np.dtype(x.dtype) != np.float32:
            return False
        return all(t is not None and np.dtype(t.dtype) == np.float32 for t in layer.inputs[1:3])

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        ins = full_inputs(layer, inputs, params)
        x = np.ascontiguousarray(ins[0], np.float32)
        g = int(layer.attr("num_groups", 0))
        n, c = x.shape[0], x.shape[1]
        s = np.ascontiguousarray(ins[1], np.float32).reshape(-1)
        b = np.ascontiguousarray(ins[2], np.float32).reshape(-1)
        if s.size == g and g != c:  # opset 18: per group
            s, b = np.repeat(s, c // g), np.repeat(b, c // g)
        o = ContiguousOut(outputs[0])
        native.lib.inferd_groupnorm(native._ptr(x), native._ptr(o.y), n, c, x.size // max(n * c, 1), g,
                                    native._ptr(s), native._ptr(b), float(layer.attr("epsilon", 1e-5)))
        o.close()


# --------------------------------------------------------------------------- L2 normalisation of the last axis

#: inferd's own op: x / max(||x||_2 over the last axis, eps), as torch exports F.normalize (ReduceL2 with keepdims,
#: Clip(min=eps), an Expand, Div). The CPU graph fuses those four into it (planner/layout.py,
#: ``fuse_l2_normalize``): one pass per row where they were four ops and three temporaries (EdgeNeXt's XCA
#: normalises q and k in every block: 17 us a pair of calls, 78 us of a 0.9 ms run).
L2NORM = "inferd.L2Normalize"


def _infer_l2norm(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    x = ins[0]
    if x is None or not x.shape:
        raise ShapeError(f"{node.op} {node.name!r}: needs an input of rank >= 1")
    return [(tuple(x.shape), x.dtype)]


def l2norm_reference(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    x = np.asarray(inputs[0])
    nrm = np.sqrt(np.sum(np.square(x), axis=-1, keepdims=True, dtype=x.dtype))
    eps = np.asarray(node.attr("eps", 0.0), x.dtype)
    nrm = np.where(nrm < eps, eps, nrm)  # (NaN stays NaN, as Clip leaves it)
    return [np.divide(x, nrm).astype(x.dtype, copy=False)]


register_op(OpSpec(L2NORM, _infer_l2norm, l2norm_reference,
                   notes="inferd's own: x / max(||x||, eps) over the last axis, torch's F.normalize (the CPU graph "
                         "fuses its ReduceL2, Clip, Expand and Div into it)"))


@register_kernel
class L2NormNative(BoundOrOracle):
    """native/rows.c: float32 rows split over the native pool; the sum of squares in 16 partial lanes (like
    onnxruntime's ReduceL2 in float32), each element divided by the clipped norm."""

    name = "l2norm_native"
    ops = (L2NORM,)
    priority = 10

    def applies(self, layer: Layer) -> bool:
        x = layer.inputs[0]
        return x is not None and bool(x.shape) and np.dtype(x.dtype) == np.float32

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]):  # type: ignore[no-untyped-def]
        x, y = inputs[0], outputs[0]
        if (x is None or not native.has("inferd_l2norm") or x.size == 0
                or any(a.dtype != np.float32 or not a.flags.c_contiguous for a in (x, y))):
            return None
        n = x.shape[-1]
        fn, args = native.lib.inferd_l2norm, (native._ptr(x), native._ptr(y), x.size // n, n,
                                              float(layer.attr("eps", 0.0)))

        def call(_keep: object = (x, y)) -> None:
            fn(*args)
        return call

    def oracle(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray]) -> np.ndarray:
        return l2norm_reference(layer.node, [inputs[0]])[0]
