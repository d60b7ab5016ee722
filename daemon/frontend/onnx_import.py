"""ONNX -> ``inferd.ir.Graph``.

Steps, in order: parse (clear errors for unreadable files), fix the batch dimension, convert
nodes and attributes, check every op against the registry (unsupported ops fail here, naming the
op, node and opset), static shape inference with constant folding (Shape of a statically shaped
tensor is folded too, so Shape/Gather/Unsqueeze/Concat chains disappear), then graph rewrites:
BatchNorm folding, SiLU/GELU pattern recognition, residual-add and activation fusion, dead code
elimination.
"""
from __future__ import annotations

import functools

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .. import ops  # noqa: F401  (registers all ops)
from ..errors import InferdError, ModelFormatError, ShapeError, UnsupportedOpError
from ..ir import Graph, Node, Subgraph, TensorInfo
from ..ops.base import op_spec
from ..ops.control import body_reads, lower_optionals
from ..ops.quant import MS_OPS
from .rewrite import dce as _dce
from .rewrite import rewrite as _rewrite
from .shapes import copy_node, dims_str, infer_and_fold, specialize

log = logging.getLogger(__name__)

MIN_OPSET, MAX_OPSET = 7, 28


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
        # another domain's op is registered as "<domain>.<op>" (inferd.ops.attention: com.microsoft's); the
        # quantised com.microsoft ops (inferd.ops.quant.MS_OPS) keep their own names, which the default domain lacks
        own = n.domain in ("", "ai.onnx") or (n.domain == "com.microsoft" and n.op_type in MS_OPS)
        op = n.op_type if own else f"{n.domain}.{n.op_type}"
        spec = op_spec(op)
        if spec is None:
            if n.domain not in ("", "ai.onnx"):
                raise UnsupportedOpError(n.op_type, where, opset, f"custom domain {n.domain!r} is not supported")
            raise UnsupportedOpError(n.op_type, where, opset)
        if n.domain in ("", "ai.onnx"):
            since = _introduced_after(n.op_type, opset)
            if since is not None:
                raise ModelFormatError(f"node {where!r}: operator {n.op_type} does not exist at the model's opset "
                                       f"{opset} (ONNX introduced it at opset {since}); the model declares an opset "
                                       f"too low for its operators")
        attrs = {a.name: _attr_value(a, opset, where) for a in n.attribute}
        attrs["_opset"] = opset
        node = Node(name, op, list(n.input), list(n.output), attrs, domain=n.domain)
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


@functools.lru_cache(maxsize=1024)
def _introduced_after(op: str, opset: int) -> int | None:
    """The opset ONNX introduced ``op`` at, when that is after ``opset`` (the model may not use it); None when the
    op exists at ``opset``, or when the installed onnx package has no schema for it at all (newer than it: then
    the registry's own checks decide)."""
    try:
        onnx.defs.get_schema(op, opset, "")
        return None
    except onnx.defs.SchemaError:
        pass
    firsts = [sch.since_version for sch in onnx.defs.get_all_schemas_with_history() if sch.name == op and sch.domain == ""]
    return min(firsts) if firsts and min(firsts) > opset else None


def _convert_subgraph(g: onnx.GraphProto, opset: int, where: str) -> Subgraph:
    try:
        consts = {init.name: numpy_helper.to_array(init) for init in g.initializer}
    except Exception as e:
        raise ModelFormatError(f"cannot read an initializer of subgraph {where}: {type(e).__name__}: {e}") from e
    inputs: list[tuple[str, np.dtype, tuple[int, ...] | None]] = []
    for vi in g.input:
        if vi.type.WhichOneof("value") is None:
            # ONNX lets a body leave an input untyped (function bodies expanded into Loop/Scan do): its type
            # is that of the value the node feeds it, which shaping takes from there (shapes.shape_body)
            inputs.append((vi.name, np.dtype(np.float32), None))
            continue
        tt = _tensor_type(vi, f"input {vi.name!r} of body {where}",
                          lambda why: UnsupportedOpError("(subgraph)", where, opset, why))
        dims = (tuple(int(d.dim_value) if d.HasField("dim_value") else -1 for d in tt.shape.dim)
                if tt.HasField("shape") else None)
        inputs.append((vi.name, _elem_dtype(tt.elem_type) if tt.elem_type else np.dtype(np.float32), dims))
    sub = Subgraph(g.name or where, _convert_nodes(g.node, opset, where), inputs, [o.name for o in g.output], consts,
                   [])
    sub.outer = body_reads(sub)
    return sub


def _tensor_type(vi: onnx.ValueInfoProto, what: str, error: Callable[[str], Exception]) -> onnx.TypeProto.Tensor:
    """The tensor type of a graph or body input: a tensor, or an optional of one. An optional-of-tensor input is
    taken as a present tensor, which is sound: a client's feed is always a tensor (inferd has no absent value) and
    a body's is what its node passes, never an empty optional (``inferd.ops.control.lower_optionals`` refuses
    passing one). Anything else (a sequence, a map, an optional of a sequence) is refused with ``error``."""
    t = vi.type
    if t.HasField("optional_type"):
        if t.optional_type.elem_type.HasField("tensor_type"):
            return t.optional_type.elem_type.tensor_type
        kind = t.optional_type.elem_type.WhichOneof("value") or "untyped value"
        raise error(f"{what} is an optional of a {kind.replace('_type', '')}: only tensors (and optionals of "
                    "tensors) are supported")
    if not t.HasField("tensor_type"):
        kind = (t.WhichOneof("value") or "untyped value").replace("_type", "")
        raise error(f"{what} is a {kind}, not a tensor (sequence/map values are not supported)")
    return t.tensor_type


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
        tt = _tensor_type(vi, f"graph input {vi.name!r}", ModelFormatError)
        dims = tuple(int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or f"{vi.name}:{k}")
                     for k, d in enumerate(tt.shape.dim))
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
        dt = _elem_dtype(_tensor_type(vi, "", ModelFormatError).elem_type)
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
    nodes = lower_optionals(_convert_nodes(g.node, opset), [o.name for o in g.output], opset)
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
