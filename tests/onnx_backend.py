"""An ``onnx.backend.base.Backend`` over inferd's CPU engine, for the official ONNX backend tests.

``InferdBackend.prepare(model)`` imports the model with inferd's importer and builds a
``CpuExecutor``; ``rep.run(inputs)`` feeds the graph inputs (initializers excluded) in graph order
and returns the outputs in graph-output order.

Three adaptations, all about the *test models* rather than the engine's semantics:
  * Shapes. inferd fixes every shape at load. When a model's graph inputs are fully static the
    engine is built in ``prepare``; otherwise it is built at the first ``run`` with the shapes of
    the arrays actually fed (and rebuilt if a later run feeds other shapes).
  * Shape-defining inputs. inferd requires the inputs that decide an output's shape (Reshape's
    shape, Slice's starts/ends/axes/steps, Pad's pads, a Reduce's axes, Resize's scales/sizes, ...,
    see ``SHAPE_INPUTS``) to be constants, as they are in exported models; the node tests feed
    them as graph inputs. A graph input that reaches such a position (directly or through other
    nodes, not through Shape/Size) is frozen into an initializer holding the value fed at ``run``
    and the model is imported then. Data inputs are never frozen, so the kernels still run on
    them; a test whose inputs are *all* shape-defining (Range, ConstantOfShape) is computed by
    the import-time constant folding, i.e. by the op's numpy reference.
  * Opsets. The ONNX node tests stamp each model with the opset in which its op last changed,
    up to the newest opset onnx knows (28 in onnx 1.23, which is also the importer's
    ``inferd.frontend.onnx_import.MAX_OPSET``: the models import as they are). A model of a newer
    onnx's opset is converted down with onnx's own ``version_converter``, which refuses where it has
    no adapter; such a refusal is reported as ``UnsupportedOpError``.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx import version_converter
from onnx.backend.base import Backend, BackendRep

from inferd.errors import UnsupportedOpError
from inferd.frontend import import_model
from inferd.frontend.onnx_import import MAX_OPSET
from inferd.ir import Graph
from inferd.runtime.cpu import CpuExecutor, check_feeds


#: op -> input positions that must be constants for inferd (they define shapes, or a mode flag)
SHAPE_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "Pad": (1, 2, 3),
    "Squeeze": (1,), "Unsqueeze": (1,), "Split": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2),
    "Resize": (1, 2, 3), "Upsample": (1,), "Dropout": (1, 2), "OneHot": (1,), "TopK": (1,),
    "DFT": (1, 2), "STFT": (1, 3), "HannWindow": (0,), "HammingWindow": (0,), "BlackmanWindow": (0,),
    "MelWeightMatrix": (0, 1), "CenterCropPad": (1, 2), "Col2Im": (1, 2, 3), "AffineGrid": (1,), "MaxUnpool": (2,),
    "RandomNormalLike": (), "RandomUniformLike": (), "Bernoulli": (), "Multinomial": (),
    **{op: (1,) for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                           "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")},
}
#: op -> weight-like input positions: initializers in exported models, graph inputs in the node tests.
#: ``prepare(..., freeze_weights=True)`` freezes them too, so the kernels that need constant weights
#: (with a weight transform: im2col, Winograd, packed GEMM, ...) get to run on the node tests.
WEIGHT_INPUTS: dict[str, tuple[int, ...]] = {
    "Conv": (1, 2), "ConvTranspose": (1, 2), "Gemm": (1, 2), "MatMul": (1,), "PRelu": (1,),
    "BatchNormalization": (1, 2, 3, 4), "InstanceNormalization": (1, 2), "LayerNormalization": (1, 2),
    "LSTM": (1, 2, 3, 7), "GRU": (1, 2, 3), "RNN": (1, 2, 3), "GroupNormalization": (1, 2),
    "CumSum": (1,), "Trilu": (1,),  # the axis / k: initializers in exported models (the Vulkan kernels need them so)
}
#: ops whose output depends on their input's shape only, where the backward walk stops
_SHAPE_ONLY = {"Shape", "Size"}


def shape_defining_inputs(model: onnx.ModelProto,
                          positions: dict[str, tuple[int, ...]] = SHAPE_INPUTS) -> set[str]:
    """Graph inputs whose *values* reach one of ``positions`` (op -> input indices)."""
    producer = {o: n for n in model.graph.node for o in n.output if o}
    graph_inputs = {vi.name for vi in _graph_inputs(model)}
    todo = [n.input[i] for n in model.graph.node for i in positions.get(n.op_type, ())
            if i < len(n.input) and n.input[i]]
    seen: set[str] = set()
    found: set[str] = set()
    while todo:
        t = todo.pop()
        if t in seen:
            continue
        seen.add(t)
        if t in graph_inputs:
            found.add(t)
        p = producer.get(t)
        if p is not None and p.op_type not in _SHAPE_ONLY:
            todo.extend(i for i in p.input if i)
            # a branch or body reads outer-scope values without naming them as node inputs (an If
            # computing a shape from a graph input, as AffineGrid's function body does)
            todo.extend(_outer_names(p))
    return found


def _outer_names(node: onnx.NodeProto) -> set[str]:
    """Values a node's subgraphs (If branches, Loop/Scan bodies) read from the enclosing scope."""
    names: set[str] = set()
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            local = ({vi.name for vi in g.input} | {i.name for i in g.initializer}
                     | {o for n in g.node for o in n.output})
            for n in g.node:
                names.update(i for i in n.input if i and i not in local)
                names.update(x for x in _outer_names(n) if x not in local)
    return names


def freeze_inputs(model: onnx.ModelProto, values: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph inputs in ``values`` are initializers holding those values."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = [vi for vi in m.graph.input if vi.name not in values]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    m.graph.initializer.extend(onnx.numpy_helper.from_array(np.asarray(v), name) for name, v in values.items())
    return m


def _default_opset(model: onnx.ModelProto) -> int | None:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return None


def to_supported_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` itself when inferd's importer accepts its opset, else a version-converted copy."""
    opset = _default_opset(model)
    if opset is None or opset <= MAX_OPSET:
        return model
    used = {n.domain for n in model.graph.node}
    if any(o.domain not in ("", "ai.onnx") and o.domain in used for o in model.opset_import):
        return model  # the converter knows the default domain only; the importer rejects the node anyway
    if any(o.domain not in ("", "ai.onnx") for o in model.opset_import):
        # an opset import no node uses (e.g. ai.onnx.preview in expanded tests) would stop the converter
        m = onnx.ModelProto()
        m.CopyFrom(model)
        keep = [o for o in m.opset_import if o.domain in ("", "ai.onnx")]
        del m.opset_import[:]
        m.opset_import.extend(keep)
        model = m
    try:
        return version_converter.convert_version(model, MAX_OPSET)
    except Exception as e:  # the converter raises RuntimeError/ConvertError with an assertion text
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UnsupportedOpError("(model)", model.graph.name or "graph", opset,
                                 f"opset {opset} > {MAX_OPSET} and onnx.version_converter cannot convert it "
                                 f"down: {first}") from e


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {i.name for i in model.graph.initializer} | {i.name for i in model.graph.sparse_initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def _static_shape(vi: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    """The input's shape when every dimension is a fixed value, else None."""
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return None
    dims = []
    for d in vi.type.tensor_type.shape.dim:
        if not d.HasField("dim_value"):
            return None
        dims.append(int(d.dim_value))
    return tuple(dims)


class InferdBackendRep(BackendRep):
    """A prepared model: one ``CpuExecutor`` (or, given a ``vulkan`` device, one ``VulkanModel`` on it: the node
    tests on lavapipe) for the input shapes (and frozen values) last fed."""

    def __init__(self, model: onnx.ModelProto, kernels: dict[str, str] | None = None,
                 freeze_weights: bool = False, vulkan: Any = None) -> None:
        self.model = model
        self.kernels = kernels
        self.vulkan = vulkan
        self._vk_model: Any = None
        self.input_names = [vi.name for vi in _graph_inputs(model)]
        self.output_names = [o.name for o in model.graph.output]
        self.frozen = shape_defining_inputs(model)
        if freeze_weights:
            self.frozen |= shape_defining_inputs(model, WEIGHT_INPUTS)
        self._static = [_static_shape(vi) for vi in _graph_inputs(model)]
        self._key: tuple[Any, ...] | None = None
        self.graph: Graph | None = None
        self._exec: Any = None  # a CpuExecutor, or a VulkanModel
        if not self.frozen and all(s is not None for s in self._static):
            self._build({n: s for n, s in zip(self.input_names, self._static) if s is not None}, {})

    def _build(self, shapes: dict[str, tuple[int, ...]], frozen: dict[str, np.ndarray]) -> None:
        model = freeze_inputs(self.model, frozen) if frozen else self.model
        graph = import_model(model, shapes={n: s for n, s in shapes.items() if n not in frozen})
        if self.vulkan is not None:
            from inferd.vulkan.model import VulkanModel

            self.close()
            self._vk_model = VulkanModel(graph, self.vulkan, kernels=self.kernels)
            self._exec = self._vk_model
        else:
            self._exec = CpuExecutor(graph, kernels=self.kernels)
        self.graph = graph

    @property
    def vulkan_kernels(self) -> dict[str, str]:
        """Node name -> the Vulkan kernel that ran it (a Vulkan rep that has run; nodes placed on the CPU absent)."""
        return dict(self._vk_model.kernel_names) if self._vk_model is not None else {}

    def close(self) -> None:
        if self._vk_model is not None:
            self._vk_model.close()
            self._vk_model = None

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        if isinstance(inputs, dict):
            arrays = [np.asarray(inputs[n]) for n in self.input_names]
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            arrays = [np.asarray(a) for a in inputs]
        if len(arrays) != len(self.input_names):
            raise ValueError(f"model takes {len(self.input_names)} input(s) {self.input_names}, got {len(arrays)}")
        fed = dict(zip(self.input_names, arrays))
        frozen = {n: a for n, a in fed.items() if n in self.frozen}
        # a statically shaped input keeps its declared shape, so a wrong feed gets the engine's InputError
        shapes = {n: (s if s is not None else tuple(fed[n].shape)) for n, s in zip(self.input_names, self._static)}
        key = (tuple(sorted(shapes.items())),
               tuple((n, a.dtype.str, a.shape, a.tobytes()) for n, a in sorted(frozen.items())))
        if self._exec is None or (self._key is not None and key != self._key):
            self._build(shapes, frozen)
        self._key = key
        assert self._exec is not None and self.graph is not None
        feeds = check_feeds(self.graph.inputs, {n: a for n, a in fed.items() if n not in frozen}, self.graph.name)
        res = self._exec.run(feeds)
        return tuple(res[n] for n in self.output_names)


class InferdBackend(Backend):
    """inferd's CPU engine as an ONNX backend (device "CPU" only)."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> InferdBackendRep:
        """``kernels`` forces kernels ({op or node name: kernel}); ``freeze_weights`` see ``WEIGHT_INPUTS``;
        ``vulkan`` (an ``inferd.vulkan.device.VulkanDevice``) runs the model on that device instead of the CPU
        engine (mixed placement: nodes no Vulkan kernel takes run on the CPU)."""
        if not cls.supports_device(device):
            raise ValueError(f"inferd's ONNX backend runs on CPU only, got device {device!r}")
        if isinstance(model, (bytes, bytearray)):
            model = onnx.load_from_string(bytes(model))
        return InferdBackendRep(to_supported_opset(model), kernels=kwargs.get("kernels"),
                                freeze_weights=bool(kwargs.get("freeze_weights", False)), vulkan=kwargs.get("vulkan"))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """Wrap one node into a model (inputs/outputs typed from the arrays and ``outputs_info``)."""
        arrays = [np.asarray(a) for a in inputs]
        ins = [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
               for n, a in zip(node.input, arrays)]
        outs = []
        for k, n in enumerate(node.output):
            if outputs_info is not None and k < len(outputs_info):
                dt, shape = outputs_info[k]
                outs.append(onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dt)),
                                                               shape))
            else:
                outs.append(onnx.helper.make_empty_tensor_value_info(n))
        opset = int(kwargs.pop("opset_version", onnx.defs.onnx_opset_version()))
        model = onnx.helper.make_model(onnx.helper.make_graph([node], "run_node", ins, outs),
                                       opset_imports=[onnx.helper.make_opsetid("", opset)])
        return cls.run_model(model, arrays, device, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper() == "CPU"


prepare = InferdBackend.prepare
run_model = InferdBackend.run_model
run_node = InferdBackend.run_node
supports_device = InferdBackend.supports_device
