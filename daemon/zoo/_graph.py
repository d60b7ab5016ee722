"""A small ONNX graph builder that mimics what ``torch.onnx.export`` (opset 17) emits.

Naming follows the PyTorch exporter so the zoo files look like real exports:
parameters use module paths (``layer1.0.conv1.weight``), BatchNorm buffers end in
``running_mean`` / ``running_var``, and every other (non-trainable) initializer starts
with ``onnx::``. :func:`count_params` relies on this convention.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
# IR 8 is the version that goes with opset 17; a newer IR would make the files
# unloadable by the older onnxruntime builds found on Jetson images.
IR_VERSION = 8

CONST_PREFIX = "onnx::"
BUFFER_SUFFIXES = ("running_mean", "running_var")

Dim = int | str


def is_trainable(initializer_name: str) -> bool:
    """True for initializers that torch counts in ``sum(p.numel() for p in parameters())``."""
    if initializer_name.startswith(CONST_PREFIX):
        return False
    return not initializer_name.endswith(BUFFER_SUFFIXES)


def count_params(model: onnx.ModelProto) -> int:
    """Trainable parameter count of a zoo model (BN running stats and constants excluded)."""
    total = 0
    for init in model.graph.initializer:
        if is_trainable(init.name):
            total += math.prod(init.dims)
    return total


class GraphBuilder:
    """Accumulates nodes and initializers; layer helpers return the output tensor name."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        # Initializers go straight into the final ModelProto: make_graph/make_model would copy
        # every tensor again, which costs seconds and hundreds of MB for vgg16.
        self.model = onnx.ModelProto()
        self.nodes: list[onnx.NodeProto] = []
        self._used: dict[str, int] = {}

    # ------------------------------------------------------------------ plumbing
    def _unique(self, base: str) -> str:
        n = self._used.get(base, 0)
        self._used[base] = n + 1
        return base if n == 0 else f"{base}_{n}"

    def node(
        self,
        op: str,
        inputs: Sequence[str],
        scope: str = "",
        n_out: int = 1,
        **attrs: object,
    ) -> list[str]:
        name = self._unique(f"/{scope.replace('.', '/')}/{op}" if scope else f"/{op}")
        outputs = [f"{name}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outputs, name=name, **attrs))
        return outputs

    def op(self, op: str, inputs: Sequence[str], scope: str = "", **attrs: object) -> str:
        return self.node(op, inputs, scope, 1, **attrs)[0]

    def add_init(self, name: str, array: np.ndarray) -> str:
        t = self.model.graph.initializer.add()
        t.name = name
        t.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
        t.dims.extend(array.shape)
        # ONNX raw_data is little-endian; one tobytes() copy instead of numpy_helper's several.
        t.raw_data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        return name

    def const(self, array: np.ndarray | Sequence[float] | Sequence[int], tag: str) -> str:
        """Non-trainable constant stored as an initializer (``onnx::`` prefix)."""
        arr = np.asarray(array)
        return self.add_init(self._unique(f"{CONST_PREFIX}{tag}"), arr)

    def constant_node(self, array: np.ndarray, scope: str = "") -> str:
        """Constant stored as a Constant node, the other form torch uses for scalars/shapes."""
        return self.op("Constant", [], scope, value=numpy_helper.from_array(np.asarray(array), "value"))

    def normal(self, shape: Sequence[int], std: float) -> np.ndarray:
        # float32 generation directly: vgg16 has 138M weights and float64 would double the time.
        w = self.rng.standard_normal(tuple(shape), dtype=np.float32)
        w *= np.float32(std)
        return w

    def fan_in_weight(self, shape: Sequence[int], fan_axes: tuple[int, ...], gain: float, fan_in: float) -> np.ndarray:
        """Gaussian weight whose every output unit has exactly the He/LeCun squared norm
        ``gain * (elements summed) / fan_in``: sampling noise in the gain would otherwise
        compound with depth."""
        w = self.rng.standard_normal(tuple(shape), dtype=np.float32)
        n = math.prod(shape[a] for a in fan_axes)
        # einsum row dot products avoid a weight-sized temporary (vgg16's fc6 is 400 MB).
        if fan_axes == tuple(range(1, w.ndim)):
            rows = w.reshape(w.shape[0], -1)
            norm2 = np.einsum("ij,ij->i", rows, rows).reshape((-1,) + (1,) * (w.ndim - 1))
        elif w.ndim == 2 and fan_axes == (0,):
            norm2 = np.einsum("ij,ij->j", w, w)[None, :]
        else:
            norm2 = np.sum(np.square(w), axis=fan_axes, keepdims=True)
        w *= np.sqrt(gain * n / fan_in / norm2.astype(np.float64)).astype(np.float32)
        return w

    def uniform(self, shape: Sequence[int], lo: float, hi: float) -> np.ndarray:
        return self.rng.uniform(lo, hi, size=tuple(shape)).astype(np.float32)

    # ------------------------------------------------------------------ layers
    def conv(
        self,
        x: str,
        name: str,
        cin: int,
        cout: int,
        k: int | tuple[int, int],
        stride: int = 1,
        pad: int = 0,
        groups: int = 1,
        bias: bool = False,
        gain: float = 2.0,
    ) -> str:
        """Conv2d. ``gain`` is the variance gain of the fan-in scaling (2 for inputs that went
        through ReLU, 1 for roughly zero-mean inputs), so activations keep O(1) magnitude."""
        kh, kw = (k, k) if isinstance(k, int) else k
        fan_in = cin // groups * kh * kw
        w = self.add_init(f"{name}.weight", self.fan_in_weight((cout, cin // groups, kh, kw), (1, 2, 3), gain, fan_in))
        inputs = [x, w]
        if bias:
            inputs.append(self.add_init(f"{name}.bias", self.normal((cout,), 0.05)))
        return self.op(
            "Conv",
            inputs,
            name,
            dilations=[1, 1],
            group=groups,
            kernel_shape=[kh, kw],
            pads=[pad, pad, pad, pad],
            strides=[stride, stride],
        )

    def conv_transpose(
        self,
        x: str,
        name: str,
        cin: int,
        cout: int,
        k: int,
        stride: int,
        pad: int = 0,
        output_padding: int = 0,
        bias: bool = True,
        gain: float = 2.0,
    ) -> str:
        # Each output pixel sees about cin*k*k/stride^2 inputs.
        fan_in = max(1.0, cin * k * k / (stride * stride))
        w = self.add_init(f"{name}.weight", self.fan_in_weight((cin, cout, k, k), (0, 2, 3), gain, fan_in))
        inputs = [x, w]
        if bias:
            inputs.append(self.add_init(f"{name}.bias", self.normal((cout,), 0.05)))
        attrs: dict[str, object] = dict(
            dilations=[1, 1], group=1, kernel_shape=[k, k], pads=[pad] * 4, strides=[stride, stride]
        )
        if output_padding:
            attrs["output_padding"] = [output_padding, output_padding]
        return self.op("ConvTranspose", inputs, name, **attrs)

    def bn(self, x: str, name: str, c: int, eps: float = 1e-5, gamma: tuple[float, float] = (0.5, 1.5)) -> str:
        # Running stats deliberately do not match the true activation statistics, so
        # BN folding in the importer is exercised with non-trivial mean/var.
        gam = self.uniform((c,), *gamma)
        var_ = self.uniform((c,), 0.5, 2.0)
        # Pin the layer's average gain E[gamma^2/var] to that of the gamma range's midpoint so
        # per-layer sampling noise does not compound over 50+ layers into blow-up or decay.
        mid = (gamma[0] + gamma[1]) / 2
        gam *= np.float32(mid / np.sqrt(np.mean(gam.astype(np.float64) ** 2 / var_)))
        scale = self.add_init(f"{name}.weight", gam)
        b = self.add_init(f"{name}.bias", self.normal((c,), 0.1))
        mean = self.add_init(f"{name}.running_mean", self.normal((c,), 0.1))
        var = self.add_init(f"{name}.running_var", var_)
        return self.op("BatchNormalization", [x, scale, b, mean, var], name, epsilon=eps, momentum=0.9)

    def relu(self, x: str, scope: str = "") -> str:
        return self.op("Relu", [x], scope)

    def relu6(self, x: str, scope: str = "") -> str:
        # torch exports hardtanh/ReLU6 for opset >= 11 as Clip with constant min/max inputs.
        lo = self.const(np.array(0.0, dtype=np.float32), "Clip_min")
        hi = self.const(np.array(6.0, dtype=np.float32), "Clip_max")
        return self.op("Clip", [x, lo, hi], scope)

    def silu(self, x: str, scope: str = "") -> str:
        s = self.op("Sigmoid", [x], scope)
        return self.op("Mul", [x, s], scope)

    def maxpool(self, x: str, k: int, stride: int, pad: int = 0, ceil: bool = False, scope: str = "") -> str:
        return self.op(
            "MaxPool",
            [x],
            scope,
            ceil_mode=int(ceil),
            dilations=[1, 1],
            kernel_shape=[k, k],
            pads=[pad] * 4,
            strides=[stride, stride],
        )

    def gap_flatten(self, x: str, scope: str = "") -> str:
        """adaptive_avg_pool2d(1) + torch.flatten(x, 1) as exported."""
        p = self.op("GlobalAveragePool", [x], scope)
        return self.op("Flatten", [p], scope, axis=1)

    def gemm(self, x: str, name: str, fin: int, fout: int, gain: float = 2.0) -> str:
        """nn.Linear on a 2-D input: Gemm with transB=1 and a (out, in) weight."""
        w = self.add_init(f"{name}.weight", self.fan_in_weight((fout, fin), (1,), gain, fin))
        b = self.add_init(f"{name}.bias", self.normal((fout,), 0.05))
        return self.op("Gemm", [x, w, b], name, alpha=1.0, beta=1.0, transB=1)

    def linear_matmul(self, x: str, name: str, fin: int, fout: int, gain: float = 1.0) -> str:
        """nn.Linear on a 3-D input: MatMul with a pre-transposed (in, out) weight, then Add."""
        w = self.add_init(f"{name}.weight", self.fan_in_weight((fin, fout), (0,), gain, fin))
        b = self.add_init(f"{name}.bias", self.normal((fout,), 0.05))
        y = self.op("MatMul", [x, w], name)
        return self.op("Add", [b, y], name)

    # ------------------------------------------------------------------ finish
    def finish(
        self,
        graph_name: str,
        inputs: Sequence[tuple[str, Sequence[Dim]]],
        outputs: Sequence[tuple[str, Sequence[Dim]]],
        out_tensors: Sequence[str],
        doc: str,
        metadata: dict[str, str],
        dtypes: dict[str, int] | None = None,
    ) -> onnx.ModelProto:
        """``dtypes``: ONNX element type of the inputs/outputs that are not float (an int64 sample rate)."""
        # Rename the final tensors to the declared output names (torch names outputs too).
        renames = dict(zip(out_tensors, (name for name, _ in outputs)))
        for node in self.nodes:
            for i, o in enumerate(node.output):
                if o in renames:
                    node.output[i] = renames[o]
        model = self.model
        graph = model.graph
        graph.name = graph_name
        graph.node.extend(self.nodes)
        dt = dtypes or {}
        graph.input.extend(helper.make_tensor_value_info(n, dt.get(n, TensorProto.FLOAT), list(s)) for n, s in inputs)
        graph.output.extend(helper.make_tensor_value_info(n, dt.get(n, TensorProto.FLOAT), list(s)) for n, s in outputs)
        model.ir_version = IR_VERSION
        model.opset_import.append(helper.make_opsetid("", OPSET))
        model.producer_name = "inferd.zoo"
        model.producer_version = "1"
        model.doc_string = doc
        helper.set_model_props(model, metadata)
        return model
