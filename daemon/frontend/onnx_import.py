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
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .. import ops  # noqa: F401  (registers all ops)
from ..errors import InferdError, ModelFormatError, ShapeError, UnsupportedOpError
from ..ir import Graph, Node, Subgraph, TensorInfo
from ..ops.activation import FUSABLE, act_from_node
from ..ops.base import op_spec
from ..ops.quant import MS_OPS
from .quantfuse import fuse_quantized
from .shapes import copy_node, dims_str, infer_and_fold, set_const, specialize

log = logging.getLogger(__name__)

MIN_OPSET, MAX_OPSET = 7, 23
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


def _attr_value(a: onnx.AttributeProto, opset: int = MAX_OPSET, where: str = "") -> Any:
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, list):
        return [x.decode("utf-8", "replace") if isinstance(x, bytes) else x for x in v]
    if isinstance(v, onnx.GraphProto):
        return _convert_subgraph(v, opset, f"{where}.{a.name}" if where else a.name)
    if isinstance(v, list) and v and isinstance(v[0], onnx.GraphProto):
        raise UnsupportedOpError("(graphs attribute)", a.name, detail="lists of subgraphs are not supported")
    return v


def _convert_nodes(protos: Iterable[onnx.NodeProto], opset: int, prefix: str = "") -> list[Node]:
    """ONNX nodes to ``Node``s, every op checked against the registry (unsupported ones fail here naming the op
    and the node, also inside control-flow bodies); a control-flow node's bodies are converted recursively and
    the names they read from enclosing scopes appended to its inputs (``attrs['_formal']`` counts the formal
    ones), so that folding, fusion, lifetimes and dead-code elimination see those reads."""
    nodes: list[Node] = []
    seen_names: set[str] = set()
    for idx, n in enumerate(protos):
        name = n.name or f"{n.op_type}_{idx}"
        if name in seen_names:
            name = f"{name}_{idx}"
        seen_names.add(name)
        where = f"{prefix}/{name}" if prefix else name
        if n.domain not in ("", "ai.onnx") and not (n.domain == "com.microsoft" and n.op_type in MS_OPS):
            raise UnsupportedOpError(n.op_type, where, opset, f"custom domain {n.domain!r} is not supported")
        spec = op_spec(n.op_type)
        if spec is None:
            raise UnsupportedOpError(n.op_type, where, opset)
        attrs = {a.name: _attr_value(a, opset, where) for a in n.attribute}
        attrs["_opset"] = opset
        node = Node(name, n.op_type, list(n.input), list(n.output), attrs, domain=n.domain)
        outer: list[str] = []
        for key in sorted(k for k, v in attrs.items() if isinstance(v, Subgraph)):
            outer += [o for o in attrs[key].outer if o not in outer]
        if outer:
            node.attrs["_formal"] = len(node.inputs)
            node.attrs["_outer"] = list(outer)
            node.inputs = node.inputs + outer
        if spec.check is not None:
            spec.check(node, opset)
        nodes.append(node)
    return nodes


def _convert_subgraph(g: onnx.GraphProto, opset: int, where: str) -> Subgraph:
    try:
        consts = {init.name: numpy_helper.to_array(init) for init in g.initializer}
    except Exception as e:
        raise ModelFormatError(f"cannot read an initializer of subgraph {where}: {type(e).__name__}: {e}") from e
    inputs: list[tuple[str, np.dtype, tuple[int, ...] | None]] = []
    for vi in g.input:
        if not vi.type.HasField("tensor_type"):
            raise UnsupportedOpError("(subgraph)", where, opset, f"input {vi.name!r} is not a tensor "
                                                                   "(sequence/optional bodies are not supported)")
        tt = vi.type.tensor_type
        dims = (tuple(int(d.dim_value) if d.HasField("dim_value") else -1 for d in tt.shape.dim)
                if tt.HasField("shape") else None)
        inputs.append((vi.name, _elem_dtype(tt.elem_type) if tt.elem_type else np.dtype(np.float32), dims))
    nodes = _convert_nodes(g.node, opset, where)
    defined = {i[0] for i in inputs} | set(consts) | {o for n in nodes for o in n.outputs if o}
    outer: list[str] = []
    for n in nodes:
        for i in n.inputs:
            if i and i not in defined and i not in outer:
                outer.append(i)
    for o in g.output:
        if o.name not in defined and o.name not in outer:
            outer.append(o.name)
    return Subgraph(g.name or where, nodes, inputs, [o.name for o in g.output], consts, outer)


def _elem_dtype(t: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(t))


#: A dynamic dimension with no size given is shaped at PROBE in the template, and checked at PROBE_ALT so
#: that a rewrite which holds at one size only (two shapes that happen to be equal) is not made. Multiples
#: of 32: sizes that conv nets with several stride-2 stages and sequence models both accept. The batch
#: dimension (0) is probed at ``batch`` and ``batch + 1``.
PROBE, PROBE_ALT = 224, 160


def _input_infos(model: onnx.ModelProto, batch: int, shapes: Mapping[str, Sequence[int]] | None,
                 init_names: set[str]) -> tuple[list[TensorInfo], dict[str, tuple[int | str, ...]], dict[str, tuple[int, ...]]]:
    """Graph inputs at the probe shape, their declared dimensions (a name for each dynamic one) and the
    alternative probe shapes. ``shapes`` sets the probe of the inputs it names; it must agree with every
    fixed dimension."""
    declared: list[tuple[onnx.ValueInfoProto, tuple[int | str, ...]]] = []
    for vi in model.graph.input:
        if vi.name in init_names:
            continue
        if not vi.type.HasField("tensor_type"):
            raise ModelFormatError(f"graph input {vi.name!r} is not a tensor (sequence/map inputs are not supported)")
        dims = tuple(int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or f"{vi.name}:{k}")
                     for k, d in enumerate(vi.type.tensor_type.shape.dim))
        declared.append((vi, dims))
    # a symbol shared by several inputs takes one size: the first given one
    sym: dict[str, int] = {}
    for vi, dims in declared:
        given = (shapes or {}).get(vi.name)
        if given is None:
            continue
        given = tuple(int(x) for x in given)
        if len(given) != len(dims):
            raise ShapeError(f"shapes[{vi.name!r}] = {list(given)} has rank {len(given)}; the model declares "
                             f"{dims_str(dims)} (rank {len(dims)})")
        for k, (d, x) in enumerate(zip(dims, given)):
            if x < 0:
                raise ShapeError(f"shapes[{vi.name!r}] = {list(given)}: dimension {k} is negative")
            if isinstance(d, int) and d != x:
                raise ShapeError(f"shapes[{vi.name!r}] = {list(given)}: dimension {k} is fixed at {d} by the model "
                                 f"({dims_str(dims)})")
            if isinstance(d, str):
                sym.setdefault(d, x)
    out, alt, all_dims = [], {}, {}
    for vi, dims in declared:
        dt = _elem_dtype(vi.type.tensor_type.elem_type)
        probe = tuple(d if isinstance(d, int) else sym.get(d, batch if k == 0 else PROBE) for k, d in enumerate(dims))
        given = (shapes or {}).get(vi.name)
        if given is not None:
            probe = tuple(int(x) for x in given)
        alt[vi.name] = tuple(d if isinstance(d, int) else (batch + 1 if k == 0 else PROBE_ALT) for k, d in enumerate(dims))
        all_dims[vi.name] = dims
        out.append(TensorInfo(vi.name, probe, dt))
    return out, all_dims, alt


def import_model(src: str | os.PathLike | bytes | onnx.ModelProto, batch: int = 1,
                 shapes: Mapping[str, Sequence[int]] | None = None, optimize: bool = True) -> Graph:
    """Import an ONNX model into a static-shaped, folded and fused ``Graph``: the model at ``shapes``
    (dynamic dimensions not given there at the probe sizes). ``graph.dims`` names the dynamic ones."""
    return specialize(import_template(src, batch, shapes, optimize))


def import_template(src: str | os.PathLike | bytes | onnx.ModelProto, batch: int = 1,
                    shapes: Mapping[str, Sequence[int]] | None = None, optimize: bool = True) -> Graph:
    """Import an ONNX model as a template: folded and fused for every input shape the model accepts,
    shaped at the probe (``shapes`` where given). A model without dynamic dimensions is static as it is;
    ``specialize`` gives the graph of one concrete shape."""
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
    inputs, dims, alt_shapes = _input_infos(model, batch, shapes, set(constants))
    dynamic = {t.name for t in inputs if any(isinstance(d, str) for d in dims[t.name])}
    nodes = _convert_nodes(g.node, opset)
    infos: dict[str, TensorInfo] = {t.name: t for t in inputs}
    for k, v in constants.items():
        infos[k] = TensorInfo(k, tuple(v.shape), v.dtype)
    out_names = [o.name for o in g.output]
    runtime: set[str] = set()
    try:
        nodes = infer_and_fold(nodes, infos, constants, set(out_names), opset, dynamic, runtime=runtime)
    except ShapeError as e:
        if not dynamic:
            raise
        probe = ", ".join(f"{t.name}{list(t.shape)}" for t in inputs if t.name in dynamic)
        raise ShapeError(f"{e} (the model's dynamic dimensions were probed at {probe}; give sizes it accepts with "
                         f"shapes={{...}})") from e
    alt: dict[str, TensorInfo] | None = None
    if dynamic:
        # the same nodes at a second probe: what the rewrites take for equal must be equal at both
        alt = {k: v for k, v in infos.items() if k in constants}
        alt.update({t.name: TensorInfo(t.name, alt_shapes[t.name], t.dtype) for t in inputs})
        try:
            infer_and_fold([copy_node(n) for n in nodes], alt, dict(constants), set(out_names), opset, dynamic)
        except InferdError:
            alt = {}  # the model does not take the second probe: no rewrite may rest on a shape
    graph = Graph(g.name or "model", nodes, inputs, [], constants, infos, opset,
                  {t.name: dims[t.name] for t in inputs} if dynamic else {})
    graph.runtime_shaped = runtime
    if optimize:
        _rewrite(graph, set(out_names), alt)
    _dce(graph, out_names)
    missing = [o for o in out_names if o not in graph.infos]
    if missing:
        raise ModelFormatError(f"graph outputs {missing} are produced by no node")
    graph.outputs = [graph.infos[o] for o in out_names]
    _warn_declared_outputs(g, graph)
    return graph


def _warn_declared_outputs(g: onnx.GraphProto, graph: Graph) -> None:
    """Output shapes come from inference; a file whose declarations say otherwise (exporters write stale or
    placeholder output shapes) gets a warning naming both, and the inferred shape is what the model serves."""
    for vi, t in zip(g.output, graph.outputs):
        if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            continue
        dims = vi.type.tensor_type.shape.dim
        declared = [int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in dims]
        if t.name in graph.runtime_shaped:
            continue
        bad = len(declared) != len(t.shape) or any(
            isinstance(d, int) and int(d) != int(x) for d, x in zip(declared, t.shape))
        if bad:
            log.warning("model %s: output %r is declared %s but inference gives %s; using the inferred shape",
                        graph.name, t.name, dims_str(declared), dims_str(t.shape))


# ----------------------------------------------------------------------------------------------
# rewrites


def _rewrite(graph: Graph, outputs: set[str], alt: dict[str, TensorInfo] | None = None) -> None:
    """``alt``: a dynamic model's tensors at its second probe; a rewrite that needs two shapes equal needs
    them equal there too ({}: the second probe failed, so no such rewrite is made)."""
    fuse_quantized(graph, outputs)
    _fold_batchnorm(graph, outputs)
    _recognise_silu(graph, outputs)
    _recognise_gelu(graph, outputs)
    _fuse_matmul_bias(graph, outputs, alt)
    _fuse_residual(graph, outputs, alt)
    _fuse_activations(graph, outputs)


def _same_shapes(graph: Graph, alt: dict[str, TensorInfo] | None, *names: str) -> bool:
    """Whether the tensors ``names`` have one shape, at every probe of a dynamic model."""
    for infos in (graph.infos, alt) if alt is not None else (graph.infos,):
        if any(n not in infos for n in names) or len({infos[n].shape for n in names}) != 1:
            return False
    return True


def _single_consumer(graph: Graph, tensor: str, outputs: set[str]) -> Node | None:
    if tensor in outputs:
        return None
    cons = graph.consumers().get(tensor, [])
    return cons[0] if len(cons) == 1 and cons[0].inputs.count(tensor) == 1 else None


def _absorb(node: Node, tensor: str) -> None:
    """Record that ``node`` now also computes what ``tensor`` held (a fused BN, activation or add): per-layer
    tools match other engines' nodes, named after such tensors, to the layer that absorbed them."""
    node.attrs["_absorbed"] = [*node.attrs.get("_absorbed", []), tensor]


def _replace_node_output(graph: Graph, producer: Node, old: Node) -> None:
    """``producer`` takes over ``old``'s output name; ``old`` is removed."""
    _absorb(producer, producer.outputs[0])
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
        set_const(wn, np.ascontiguousarray(nw, dtype=w.dtype), graph.infos, graph.constants)
        set_const(bn_name, np.ascontiguousarray(nb, dtype=w.dtype), graph.infos, graph.constants)
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


def _fuse_matmul_bias(graph: Graph, outputs: set[str], alt: dict[str, TensorInfo] | None = None) -> None:
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
        if cv.size != n or (cv.ndim and cv.shape[-1] != n) or not _same_shapes(graph, alt, add.outputs[0], a):
            return False
        name = f"{mm.name}.bias_fused"
        set_const(name, np.ascontiguousarray(cv.reshape(n), dtype=out.dtype), graph.infos, graph.constants)
        mm.inputs = mm.inputs + [name]
        mm.attrs["bias"] = True
        _replace_node_output(graph, mm, add)
        return True

    _fuse_adds(graph, outputs, fuse)


def _fuse_residual(graph: Graph, outputs: set[str], alt: dict[str, TensorInfo] | None = None) -> None:
    """Conv/Gemm/MatMul followed by Add of a same-shaped tensor: the add happens in the kernel's epilogue."""

    def fuse(add: Node, a: str, b: str, p: Node) -> bool:
        if p.op not in _FUSE_RESIDUAL_INTO or p.attr("act") or p.attr("residual") or b in graph.constants or a == b:
            return False
        if not _same_shapes(graph, alt, a, b, add.outputs[0]):
            return False
        if p.op in ("Gemm", "Conv") and len(p.inputs) < 3:
            p.inputs = p.inputs + [""]  # keep the residual in a position no optional input claims
        p.inputs.append(b)
        p.attrs["residual"] = True
        # the add's position is after both operands exist; run the fused node there
        graph.nodes.remove(p)
        graph.nodes[graph.nodes.index(add)] = p
        _absorb(p, p.outputs[0])
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
