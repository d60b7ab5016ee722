"""Build one-node ONNX models and run them with onnxruntime: the ground truth for op tests.

``make_single_node_model`` names inputs ``x{i}`` and outputs ``y{i}``, the same names
``inferd.ops.base.single_node_layer`` uses, so results line up position by position.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

# onnxruntime rejects models whose IR version is newer than it knows; keep a conservative one per opset
_IR_FOR_OPSET = [(21, 10), (19, 9), (15, 8), (13, 7), (12, 7), (9, 4), (1, 3)]


def _ir_version(opset: int) -> int:
    for min_opset, ir in _IR_FOR_OPSET:
        if opset >= min_opset:
            return min(ir, onnx.IR_VERSION)
    return 3


def _elem_type(a: np.ndarray) -> int:
    return helper.np_dtype_to_tensor_dtype(np.asarray(a).dtype)


def make_single_node_model(op: str, inputs: Sequence[np.ndarray | None], attrs: dict[str, Any] | None = None,
                           opset: int = 17, const_mask: Sequence[bool] | None = None, n_outputs: int = 1,
                           domain: str = "") -> onnx.ModelProto:
    """A model with one ``op`` node. ``inputs[i]`` None is an absent optional input (""); ``const_mask[i]``
    True makes input ``i`` an initializer (shape tensors, weights), else a graph input fed at run time.
    Attributes are given as ``onnx.helper.make_node`` takes them (numpy arrays become tensors)."""
    if const_mask is None:
        const_mask = [False] * len(inputs)
    names = [f"x{i}" if a is not None else "" for i, a in enumerate(inputs)]
    graph_inputs, inits = [], []
    for name, a, c in zip(names, inputs, const_mask):
        if a is None:
            continue
        a = np.asarray(a)
        if c:
            inits.append(numpy_helper.from_array(a, name))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, _elem_type(a), list(a.shape)))
    onnx_attrs = {k: (numpy_helper.from_array(np.asarray(v)) if isinstance(v, np.ndarray) else v)
                  for k, v in (attrs or {}).items() if not k.startswith("_") and k not in ("act", "residual")}
    outs = [f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op, names, outs, name="n0", domain=domain, **onnx_attrs)
    # output types are left to onnxruntime's own inference: only the names are declared
    graph_outputs = [onnx.ValueInfoProto(name=o) for o in outs]
    graph = helper.make_graph([node], f"single_{op}", graph_inputs, graph_outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, opset)])
    model.ir_version = _ir_version(opset)
    return model


def feeds_for(inputs: Sequence[np.ndarray | None], const_mask: Sequence[bool] | None = None) -> dict[str, np.ndarray]:
    """The run-time feed dict matching ``make_single_node_model``'s graph inputs."""
    const_mask = const_mask if const_mask is not None else [False] * len(inputs)
    return {f"x{i}": np.asarray(a) for i, (a, c) in enumerate(zip(inputs, const_mask)) if a is not None and not c}


def ort_session(src: Any, threads: int | None = None, optimize: bool = True) -> Any:
    """An onnxruntime CPU session on a path or ModelProto (or serialized bytes), quiet, with ``threads``
    intra-op threads (None: onnxruntime's default) and graph optimisations on or off."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads is not None:
        so.intra_op_num_threads = threads
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.inter_op_num_threads = 1
    if isinstance(src, onnx.ModelProto):
        src = src.SerializeToString()
    elif not isinstance(src, bytes):
        src = str(src)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run ``model`` once on the CPU with graph optimisations off (the raw kernels are the reference)."""
    return [np.asarray(r) for r in ort_session(model, threads=1, optimize=False).run(None, feeds)]


def run_ort_file(path: Any, feeds: dict[str, np.ndarray], threads: int | None = 2) -> list[np.ndarray]:
    """Run the model at ``path`` (or a ModelProto) once on the CPU as it serves (optimisations on, ``threads``
    intra-op threads): the reference the whole-model tests compare with."""
    return ort_session(path, threads).run(None, feeds)
