"""ONNX -> ``inferd.ir.Graph``.

Steps, in order: parse (clear errors for unreadable files), fix the batch dimension, convert
nodes and attributes, check every op against the registry (unsupported ops fail here, naming the
op, node and opset), static shape inference with constant folding (Shape of a statically shaped
tensor is folded too, so Shape/Gather/Unsqueeze/Concat chains disappear), then graph rewrites:
BatchNorm folding, SiLU/GELU pattern recognition, residual-add and activation fusion, dead code
elimination.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .. import ops  # noqa: F401  (registers all ops)
from ..errors import InferdError, ModelFormatError, ShapeError, UnsupportedOpError
from ..ir import Graph, Node, TensorInfo
from ..ops.activation import FUSABLE, act_from_node
from ..ops.base import op_spec

log = logging.getLogger(__name__)

MIN_OPSET, MAX_OPSET = 7, 23
#: Folding an op that creates a huge tensor from a tiny one would bloat the weights; keep these at run time.
_NO_FOLD_ABOVE = 1 << 26
_FUSE_ACT_INTO = {"Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "Sub", "Mul", "Div"}
_FUSE_RESIDUAL_INTO = {"Conv", "Gemm", "MatMul"}


def load_onnx(src: str | os.PathLike | bytes | onnx.ModelProto) -> onnx.ModelProto:
    """Parse an ONNX model, turning every parse failure into a ``ModelFormatError``."""
    if isinstance(src, onnx.ModelProto):
        return src
    try:
        if isinstance(src, (bytes, bytearray)):
            model = onnx.load_from_string(bytes(src))
        else:
            p = Path(src)
            if not p.is_file():
                raise ModelFormatError(f"model file {str(p)!r} does not exist")
            if p.stat().st_size == 0:
                raise ModelFormatError(f"model file {str(p)!r} is empty; expected an ONNX protobuf")
            model = onnx.load(str(p))
    except ModelFormatError:
        raise
    except Exception as e:  # protobuf DecodeError, external-data errors, ...
        raise ModelFormatError(f"cannot parse {src if not isinstance(src, (bytes, bytearray)) else 'model bytes'} "
                               f"as ONNX: {type(e).__name__}: {e}") from e
    g = model.graph
    if not g.output or not model.opset_import:
        raise ModelFormatError("not an ONNX model: expected a graph with outputs and an opset_import, "
                               f"got {len(g.node)} nodes, {len(g.output)} outputs, {len(model.opset_import)} opset entries")
    return model


def _opset(model: onnx.ModelProto) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    raise ModelFormatError("model has no default-domain opset_import entry")


def _attr_value(a: onnx.AttributeProto) -> Any:
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, list):
        return [x.decode("utf-8", "replace") if isinstance(x, bytes) else x for x in v]
    if isinstance(v, onnx.GraphProto):
        raise UnsupportedOpError("(subgraph attribute)", a.name, detail="control flow with subgraphs is not supported")
    return v


def _elem_dtype(t: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(t))


def _input_infos(model: onnx.ModelProto, batch: int, shapes: dict[str, tuple[int, ...]] | None,
                 init_names: set[str]) -> list[TensorInfo]:
    out = []
    for vi in model.graph.input:
        if vi.name in init_names:
            continue
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise ModelFormatError(f"graph input {vi.name!r} is not a tensor (sequence/map inputs are not supported)")
        if shapes and vi.name in shapes:
            shape = tuple(int(d) for d in shapes[vi.name])
        else:
            dims: list[int] = []
            for k, d in enumerate(tt.shape.dim):
                if d.HasField("dim_value") and d.dim_value > 0:
                    dims.append(int(d.dim_value))
                elif k == 0:
                    dims.append(batch)  # a dynamic batch dimension is fixed at load
                else:
                    raise ShapeError(f"graph input {vi.name!r} has dynamic dimension {k} "
                                     f"({d.dim_param or '?'}); pass its shape explicitly (shapes={{'{vi.name}': ...}})")
            shape = tuple(dims)
        out.append(TensorInfo(vi.name, shape, _elem_dtype(tt.elem_type)))
    return out


def import_model(src: str | os.PathLike | bytes | onnx.ModelProto, batch: int = 1,
                 shapes: dict[str, tuple[int, ...]] | None = None, optimize: bool = True) -> Graph:
    """Import an ONNX model into a static-shaped, folded and fused ``Graph``."""
    model = load_onnx(src)
    opset = _opset(model)
    if not (MIN_OPSET <= opset <= MAX_OPSET):
        raise UnsupportedOpError("(model)", model.graph.name or "graph", opset,
                                 f"opset {opset} is outside the supported range {MIN_OPSET}..{MAX_OPSET}")
    g = model.graph
    constants: dict[str, np.ndarray] = {}
    try:
        for init in g.initializer:
            constants[init.name] = numpy_helper.to_array(init)
    except Exception as e:
        raise ModelFormatError(f"cannot read initializer: {type(e).__name__}: {e}") from e
    inputs = _input_infos(model, batch, shapes, set(constants))
    nodes: list[Node] = []
    seen_names: set[str] = set()
    for idx, n in enumerate(g.node):
        name = n.name or f"{n.op_type}_{idx}"
        if name in seen_names:
            name = f"{name}_{idx}"
        seen_names.add(name)
        if n.domain not in ("", "ai.onnx"):
            raise UnsupportedOpError(n.op_type, name, opset, f"custom domain {n.domain!r} is not supported")
        spec = op_spec(n.op_type)
        if spec is None:
            raise UnsupportedOpError(n.op_type, name, opset)
        attrs = {a.name: _attr_value(a) for a in n.attribute}
        attrs["_opset"] = opset
        node = Node(name, n.op_type, list(n.input), list(n.output), attrs)
        if spec.check is not None:
            spec.check(node, opset)
        nodes.append(node)
    infos: dict[str, TensorInfo] = {t.name: t for t in inputs}
    for k, v in constants.items():
        infos[k] = TensorInfo(k, tuple(v.shape), v.dtype)
    out_names = [o.name for o in g.output]
    nodes = _infer_and_fold(nodes, infos, constants, set(out_names), opset)
    graph = Graph(g.name or "model", nodes, inputs, [], constants, infos, opset)
    if optimize:
        _rewrite(graph, set(out_names))
    _dce(graph, out_names)
    missing = [o for o in out_names if o not in graph.infos]
    if missing:
        raise ModelFormatError(f"graph outputs {missing} are produced by no node")
    graph.outputs = [graph.infos[o] for o in out_names]
    return graph


def _infer_and_fold(nodes: list[Node], infos: dict[str, TensorInfo], constants: dict[str, np.ndarray],
                    keep: set[str], opset: int) -> list[Node]:
    kept: list[Node] = []
    for node in nodes:
        spec = op_spec(node.op)
        assert spec is not None
        for i in node.inputs:
            if i and i not in infos:
                raise ModelFormatError(f"node {node.name!r} ({node.op}) reads {i!r}, which no earlier node produces "
                                       f"and which is no graph input or initializer")
        if node.op == "Constant":
            val = spec.reference(node, [])[0]
            _set_const(node.outputs[0], np.asarray(val), infos, constants)
            continue
        if node.op == "Shape" or node.op == "Size":
            # the input's shape is static, so the result is a constant even when its values are not
            x = infos[node.inputs[0]]
            dummy = np.broadcast_to(np.zeros((), x.dtype), x.shape)
            _set_const(node.outputs[0], spec.reference(node, [dummy])[0], infos, constants)
            continue
        if node.op == "Clip" and len(node.inputs) > 1:
            _clip_inputs_to_attrs(node, constants)
        in_infos = [infos[i] if i else None for i in node.inputs]
        if all((not i) or i in constants for i in node.inputs) and node.inputs and any(node.inputs):
            try:
                vals = spec.reference(node, [constants[i] if i else None for i in node.inputs])
            except InferdError:
                raise
            except Exception as e:
                raise ShapeError(f"constant folding failed at node {node.name!r} ({node.op}): {type(e).__name__}: {e}") from e
            if sum(np.asarray(v).nbytes for v in vals) <= _NO_FOLD_ABOVE:
                for o, v in zip(node.outputs, vals):
                    if o:
                        _set_const(o, np.asarray(v), infos, constants)
                continue
        try:
            outs = spec.infer(node, in_infos, {i: constants[i] for i in node.inputs if i in constants})
        except InferdError:
            raise
        except Exception as e:
            shapes = [(i.name, i.shape) if i else None for i in in_infos]
            raise ShapeError(f"shape inference failed at node {node.name!r} ({node.op}) with inputs {shapes}: "
                             f"{type(e).__name__}: {e}") from e
        for o, (shape, dt) in zip(node.outputs, outs):
            if o:
                if any(int(d) < 0 for d in shape):
                    raise ShapeError(f"node {node.name!r} ({node.op}) gives negative output shape {tuple(shape)}")
                infos[o] = TensorInfo(o, tuple(int(d) for d in shape), np.dtype(dt))
        kept.append(node)
    return kept


def _set_const(name: str, val: np.ndarray, infos: dict[str, TensorInfo], constants: dict[str, np.ndarray]) -> None:
    constants[name] = val
    infos[name] = TensorInfo(name, tuple(val.shape), val.dtype)


def _clip_inputs_to_attrs(node: Node, constants: dict[str, np.ndarray]) -> None:
    """Opset >= 11 Clip takes min/max as inputs; constant ones become attributes so Clip can be fused."""
    extra = node.inputs[1:]
    if all((not i) or i in constants for i in extra):
        if len(extra) > 0 and extra[0]:
            node.attrs["min"] = float(constants[extra[0]])
        if len(extra) > 1 and extra[1]:
            node.attrs["max"] = float(constants[extra[1]])
        node.inputs = node.inputs[:1]


# ----------------------------------------------------------------------------------------------
# rewrites


def _rewrite(graph: Graph, outputs: set[str]) -> None:
    _fold_batchnorm(graph, outputs)
    _recognise_silu(graph, outputs)
    _recognise_gelu(graph, outputs)
    _fuse_matmul_bias(graph, outputs)
    _fuse_residual(graph, outputs)
    _fuse_activations(graph, outputs)


def _single_consumer(graph: Graph, tensor: str, outputs: set[str]) -> Node | None:
    if tensor in outputs:
        return None
    cons = graph.consumers().get(tensor, [])
    return cons[0] if len(cons) == 1 and cons[0].inputs.count(tensor) == 1 else None


def _replace_node_output(graph: Graph, producer: Node, old: Node) -> None:
    """``producer`` takes over ``old``'s output name; ``old`` is removed."""
    producer.outputs[0] = old.outputs[0]
    graph.nodes.remove(old)


def _fold_batchnorm(graph: Graph, outputs: set[str]) -> None:
    from ..ops.norm import fold_bn_into

    for bn in [n for n in graph.nodes if n.op == "BatchNormalization"]:
        x = bn.inputs[0]
        prod = graph.producers().get(x)
        if prod is None or prod.op not in ("Conv", "ConvTranspose", "Gemm") or prod.attr("act") or prod.attr("residual"):
            continue
        if _single_consumer(graph, x, outputs) is not bn or not all(i in graph.constants for i in bn.inputs[1:5]):
            continue
        if len([o for o in bn.outputs if o]) != 1:
            continue
        w_name = prod.inputs[1]
        if w_name not in graph.constants:
            continue
        has_b = len(prod.inputs) > 2 and bool(prod.inputs[2])
        if has_b and prod.inputs[2] not in graph.constants:
            continue
        if prod.op == "Gemm" and (float(prod.attr("alpha", 1.0)) != 1.0 or float(prod.attr("beta", 1.0)) != 1.0
                                  or int(prod.attr("transA", 0))):
            continue
        w = graph.constants[w_name]
        b = graph.constants[prod.inputs[2]] if has_b else None
        if prod.op == "Gemm" and b is not None and b.ndim != 1:
            continue
        scale, bias, mean, var = (graph.constants[i] for i in bn.inputs[1:5])
        eps = float(bn.attr("epsilon", 1e-5))
        axis = {"Conv": 0, "ConvTranspose": 1}.get(prod.op, 0 if int(prod.attr("transB", 0)) else 1)
        groups = int(prod.attr("group", 1)) if prod.op == "ConvTranspose" else 1
        nw, nb = fold_bn_into(w, b, scale, bias, mean, var, eps, axis, groups=groups)
        wn, bn_name = f"{prod.name}.weight_bnfolded", f"{prod.name}.bias_bnfolded"
        _set_const(wn, np.ascontiguousarray(nw, dtype=w.dtype), graph.infos, graph.constants)
        _set_const(bn_name, np.ascontiguousarray(nb, dtype=w.dtype), graph.infos, graph.constants)
        prod.inputs[1] = wn
        if has_b:
            prod.inputs[2] = bn_name
        else:
            prod.inputs = prod.inputs[:2] + [bn_name]
        _replace_node_output(graph, prod, bn)


def _recognise_silu(graph: Graph, outputs: set[str]) -> None:
    """x * Sigmoid(x) (as exported for SiLU/Swish) -> one SiLU node that can fuse into its producer."""
    for sig in [n for n in graph.nodes if n.op == "Sigmoid"]:
        mul = _single_consumer(graph, sig.outputs[0], outputs)
        if mul is None or mul.op != "Mul" or mul.attr("act"):
            continue
        other = mul.inputs[1] if mul.inputs[0] == sig.outputs[0] else mul.inputs[0]
        if other != sig.inputs[0]:
            continue
        sig.op = "SiLU"
        _replace_node_output(graph, sig, mul)


def _const_scalar(graph: Graph, name: str) -> float | None:
    v = graph.constants.get(name)
    return float(v.reshape(-1)[0]) if v is not None and v.size == 1 else None


def _recognise_gelu(graph: Graph, outputs: set[str]) -> None:
    """0.5 * x * (1 + erf(x / sqrt(2))) as PyTorch exports it (in either Mul order) -> Gelu."""
    for erf in [n for n in graph.nodes if n.op == "Erf"]:
        prods = graph.producers()
        div = prods.get(erf.inputs[0])
        if div is None or div.op not in ("Div", "Mul"):
            continue
        c = _const_scalar(graph, div.inputs[1])
        if c is None or not (abs(c - 2 ** 0.5) < 1e-3 if div.op == "Div" else abs(c - 2 ** -0.5) < 1e-3):
            continue
        x = div.inputs[0]
        add = _single_consumer(graph, erf.outputs[0], outputs)
        if add is None or add.op != "Add":
            continue
        one = add.inputs[1] if add.inputs[0] == erf.outputs[0] else add.inputs[0]
        if _const_scalar(graph, one) != 1.0:
            continue
        m1 = _single_consumer(graph, add.outputs[0], outputs)
        if m1 is None or m1.op != "Mul":
            continue
        o1 = m1.inputs[1] if m1.inputs[0] == add.outputs[0] else m1.inputs[0]
        if o1 == x:  # (x * (1+erf)) * 0.5
            m2 = _single_consumer(graph, m1.outputs[0], outputs)
            if m2 is None or m2.op != "Mul":
                continue
            half = m2.inputs[1] if m2.inputs[0] == m1.outputs[0] else m2.inputs[0]
            if _const_scalar(graph, half) != 0.5:
                continue
            last = m2
        else:  # (0.5 * x) * (1+erf)
            half_mul = prods.get(o1)
            if half_mul is None or half_mul.op != "Mul" or x not in half_mul.inputs:
                continue
            h = half_mul.inputs[1] if half_mul.inputs[0] == x else half_mul.inputs[0]
            if _const_scalar(graph, h) != 0.5 or _single_consumer(graph, o1, outputs) is not m1:
                continue
            graph.nodes.remove(half_mul)
            last = m1
        if _single_consumer(graph, div.outputs[0], outputs) is not erf:
            continue
        gelu = Node(erf.name + "_gelu", "Gelu", [x], [last.outputs[0]], {"_opset": graph.opset})
        idx = graph.nodes.index(last)
        graph.nodes[idx] = gelu
        for n in (div, erf, add, m1):
            if n in graph.nodes and n is not last:
                graph.nodes.remove(n)


def _fuse_adds(graph: Graph, outputs: set[str], fuse: Callable[[Node, str, str, Node], bool]) -> None:
    """The scan the Add fusions share: for every two-input Add without a fused activation, each operand ``a``
    whose producer feeds only this Add is offered as ``fuse(add, a, other, producer)``; after a fusion that
    returns True the Add is gone and its other orientation is not tried."""
    for add in [n for n in graph.nodes if n.op == "Add"]:
        if add.attr("act") or len(add.inputs) != 2:
            continue
        prods = graph.producers()
        for k in (0, 1):
            a, other = add.inputs[k], add.inputs[1 - k]
            p = prods.get(a)
            if p is None or _single_consumer(graph, a, outputs) is not add:
                continue
            if fuse(add, a, other, p):
                break


def _fuse_matmul_bias(graph: Graph, outputs: set[str]) -> None:
    """MatMul followed by Add of a per-column constant (PyTorch's Linear on 3-D tokens exports this pair) -> one
    MatMul whose third input is the bias (attr ``bias``), added in the GEMM's store like Gemm's C. Then the
    residual and activation that follow can fuse into it as well."""

    def fuse(add: Node, a: str, c: str, mm: Node) -> bool:
        if (mm.op != "MatMul" or len(mm.inputs) != 2 or mm.attr("act") or mm.attr("residual") or mm.attr("bias")
                or c not in graph.constants):
            return False
        out = graph.infos[a]
        if not np.issubdtype(out.dtype, np.floating) or len(out.shape) < 1:
            return False
        cv = graph.constants[c]
        n = out.shape[-1]
        if cv.size != n or (cv.ndim and cv.shape[-1] != n) or graph.infos[add.outputs[0]].shape != out.shape:
            return False
        name = f"{mm.name}.bias_fused"
        _set_const(name, np.ascontiguousarray(cv.reshape(n), dtype=out.dtype), graph.infos, graph.constants)
        mm.inputs = mm.inputs + [name]
        mm.attrs["bias"] = True
        _replace_node_output(graph, mm, add)
        return True

    _fuse_adds(graph, outputs, fuse)


def _fuse_residual(graph: Graph, outputs: set[str]) -> None:
    """Conv/Gemm/MatMul followed by Add of a same-shaped tensor: the add happens in the kernel's epilogue."""

    def fuse(add: Node, a: str, b: str, p: Node) -> bool:
        if p.op not in _FUSE_RESIDUAL_INTO or p.attr("act") or p.attr("residual") or b in graph.constants or a == b:
            return False
        if graph.infos[b].shape != graph.infos[add.outputs[0]].shape or graph.infos[a].shape != graph.infos[b].shape:
            return False
        if p.op in ("Gemm", "Conv") and len(p.inputs) < 3:
            p.inputs = p.inputs + [""]  # keep the residual in a position no optional input claims
        p.inputs.append(b)
        p.attrs["residual"] = True
        # the add's position is after both operands exist; run the fused node there
        graph.nodes.remove(p)
        graph.nodes[graph.nodes.index(add)] = p
        p.outputs[0] = add.outputs[0]
        return True

    _fuse_adds(graph, outputs, fuse)


def _fuse_activations(graph: Graph, outputs: set[str]) -> None:
    for node in list(graph.nodes):
        if node not in graph.nodes or node.op not in _FUSE_ACT_INTO or node.attr("act"):
            continue
        if len([o for o in node.outputs if o]) != 1:
            continue
        nxt = _single_consumer(graph, node.outputs[0], outputs)
        if nxt is None or nxt.op not in FUSABLE or len(nxt.inputs) != 1:
            continue
        if not np.issubdtype(graph.infos[node.outputs[0]].dtype, np.floating):
            continue
        act = act_from_node(nxt)
        if act is None:
            continue
        node.attrs["act"] = act
        _replace_node_output(graph, node, nxt)


def _dce(graph: Graph, out_names: Iterable[str]) -> None:
    needed = set(out_names)
    live: list[Node] = []
    for node in reversed(graph.nodes):
        if any(o in needed for o in node.outputs if o):
            live.append(node)
            needed.update(i for i in node.inputs if i)
    graph.nodes = list(reversed(live))
    graph.constants = {k: v for k, v in graph.constants.items() if k in needed}
    used = needed | {o for n in graph.nodes for o in n.outputs if o} | {t.name for t in graph.inputs}
    graph.infos = {k: v for k, v in graph.infos.items() if k in used}
