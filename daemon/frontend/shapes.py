"""Shapes of a graph: static shape inference with constant folding (import's first pass), and the
specialisation of a dynamic model's template to one concrete input shape. No onnx import here: a
compiled package is specialised at load without it."""
from __future__ import annotations

from collections import ChainMap
from typing import Mapping, MutableMapping, Sequence

import numpy as np

from ..errors import InferdError, ModelFormatError, ShapeError
from ..ir import Graph, Node, TensorInfo
from ..ops.base import op_spec

#: Folding an op that creates a huge tensor from a tiny one would bloat the weights; keep these at run time.
_NO_FOLD_ABOVE = 1 << 26


class _Values(Mapping[str, np.ndarray]):
    """The constant inputs of one node, each read from ``known`` only when asked for."""

    def __init__(self, known: Mapping[str, np.ndarray], names: Sequence[str]) -> None:
        self._known, self._names = known, list(dict.fromkeys(names))

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._names:
            raise KeyError(name)
        return self._known[name]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def dims_str(dims: Sequence[int | str]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def copy_node(n: Node) -> Node:
    return Node(n.name, n.op, list(n.inputs), list(n.outputs), dict(n.attrs), n.domain)


def specialize(template: Graph, shapes: Mapping[str, Sequence[int]] | None = None) -> Graph:
    """The static graph of ``template`` at ``shapes`` (input name -> shape; inputs not named keep the
    template's probe shape): the shape computations folded, every tensor shaped. The result shares the
    template's constants (a lazily read store stays on disk); a static template is returned as it is.
    ``ShapeError`` when the model does not take these shapes."""
    if not template.dynamic and not _unshaped_bodies(template):
        return template
    shapes = shapes or {}
    inputs = []
    for t in template.inputs:
        shape = tuple(int(x) for x in shapes.get(t.name, t.shape))
        check_dims(t.name, template.dims.get(t.name, t.shape), shape, empty=True)
        inputs.append(TensorInfo(t.name, shape, t.dtype))
    consts = template.constants
    extra: dict[str, np.ndarray] = {}
    view: ChainMap[str, np.ndarray] = ChainMap(extra, consts)  # type: ignore[arg-type]
    infos = {k: v for k, v in template.infos.items() if k in consts}
    infos.update({t.name: t for t in inputs})
    out_names = [o.name for o in template.outputs]
    runtime: set[str] = set()
    try:
        nodes = infer_and_fold([copy_node(n) for n in template.nodes], infos, view, set(out_names),
                                template.opset, set(), runtime=runtime)
    except ShapeError as e:
        got = ", ".join(f"{t.name}{list(t.shape)}" for t in inputs)
        raise ShapeError(f"model {template.name!r} does not take inputs {got}: {e}") from e
    for n in nodes:
        if n.attr("residual"):  # fused at import where the shapes agreed at both probes; make sure here
            r, o = infos[n.inputs[-1]], infos[n.outputs[0]]
            if r.shape != o.shape:
                raise ShapeError(f"node {n.name!r} ({n.op}) adds a residual of shape {list(r.shape)} to an output of "
                                 f"shape {list(o.shape)} at these input shapes; import the model with shapes= "
                                 f"set to them")
    needed = {i for n in nodes for i in n.inputs if i} | set(out_names)
    for k in [k for k in extra if k not in needed]:
        del extra[k]
    used = needed | {o for n in nodes for o in n.outputs if o} | {t.name for t in inputs}
    infos = {k: v for k, v in infos.items() if k in used}
    missing = [o for o in out_names if o not in infos]
    if missing:
        raise ModelFormatError(f"graph outputs {missing} are produced by no node")
    g = Graph(template.name, nodes, inputs, [infos[o] for o in out_names], view, infos,  # type: ignore[arg-type]
              template.opset, dict(template.dims))
    g.runtime_shaped = runtime & set(infos)
    return g


def _unshaped_bodies(g: Graph) -> bool:
    """Whether a control-flow node of ``g`` has no shaped bodies (a graph read back from a package)."""
    from ..ops.control import CONTROL_OPS

    return any(n.op in CONTROL_OPS and not n.bodies for n in g.nodes)


def check_dims(name: str, dims: Sequence[int | str], shape: Sequence[int],
               bounds: Sequence[int] | None = None, empty: bool = False) -> None:
    """``ShapeError`` unless ``shape`` fits the declared ``dims`` (same rank, fixed dimensions equal, every
    dynamic dimension positive, or zero with ``empty``, and within ``bounds`` where given); the message names
    expected and got. A request is refused an empty dynamic dimension (a tensor of nothing is an app's bug);
    the engine itself runs empty tensors where a caller asks for them."""
    head = f"input {name!r} expects shape {dims_str(dims)}"
    if bounds is not None:
        head += f" (at most {list(bounds)})"
    head += f", got {list(shape)}"
    if len(shape) != len(dims):
        raise ShapeError(f"{head}: rank {len(shape)}, the model's is {len(dims)}")
    for k, (d, x) in enumerate(zip(dims, shape)):
        if int(x) < 0 or (int(x) == 0 and not empty and isinstance(d, str)):
            raise ShapeError(f"{head}: dimension {k} is {x}")
        if isinstance(d, int) and int(x) != d:
            raise ShapeError(f"{head}: dimension {k} must be {d}")
        if bounds is not None and k < len(bounds) and int(x) > int(bounds[k]):
            raise ShapeError(f"{head}: dimension {k} exceeds {bounds[k]}")


def infer_and_fold(nodes: list[Node], infos: dict[str, TensorInfo], constants: MutableMapping[str, np.ndarray],
                    keep: set[str], opset: int, dynamic: set[str] | frozenset[str] = frozenset(),
                    runtime: set[str] | None = None, lenient: bool = False) -> list[Node]:
    """Shape every tensor and fold what is constant. ``dynamic``: inputs with a dynamic dimension. What
    depends on their sizes (Shape of a tensor downstream of them, and what is computed from it) is
    evaluated at the probe for shape inference but stays a node, so that ``specialize`` folds it anew
    for every shape; everything else constant is folded once, shared by every shape.

    Control flow (``inferd.ops.control``): an If decided by constants, or by shapes once they are concrete,
    is replaced by its branch's nodes (shaped in turn); other control-flow nodes get their bodies shaped.
    ``runtime`` collects the tensors whose shape only a run can tell (and everything computed from them);
    ``lenient`` (a control-flow body) lets a shape that depends on a run-time value (a Slice at the iteration
    number) be one of them instead of an error."""
    from ..ops.control import CONTROL_OPS, shape_control

    sized: set[str] = set(dynamic)  # tensors whose shape depends on a dynamic dimension
    probed: dict[str, np.ndarray] = {}  # values that do: known at the probe only
    known: Mapping[str, np.ndarray] = ChainMap(probed, constants) if dynamic else constants  # type: ignore[arg-type]
    ragged: set[str] = runtime if runtime is not None else set()
    kept: list[Node] = []
    work = list(nodes)
    pos = 0
    while pos < len(work):
        node = work[pos]
        pos += 1
        spec = op_spec(node.op)
        assert spec is not None
        for i in node.inputs:
            if i and i not in infos:
                raise ModelFormatError(f"node {node.name!r} ({node.op}) reads {i!r}, which no earlier node produces "
                                       f"and which is no graph input or initializer")
        if node.op == "Constant":
            val = spec.reference(node, [])[0]
            set_const(node.outputs[0], np.asarray(val), infos, constants)
            continue
        if node.op == "Shape" or node.op == "Size":
            # the input's shape is known, so the result is a constant even when its values are not
            x = infos[node.inputs[0]]
            dummy = np.broadcast_to(np.zeros((), x.dtype), x.shape)
            val = np.asarray(spec.reference(node, [dummy])[0])
            if node.inputs[0] in sized:
                probed[node.outputs[0]] = val
                infos[node.outputs[0]] = TensorInfo(node.outputs[0], tuple(val.shape), val.dtype)
                kept.append(node)
            else:
                set_const(node.outputs[0], val, infos, constants)
            continue
        if node.op in CONTROL_OPS:
            res = shape_control(node, infos, known, opset, lambda name: name not in probed)
            if isinstance(res[1], dict):  # an If decided here: its branch's nodes take its place
                inlined, consts = res
                for k, v in consts.items():
                    set_const(k, np.asarray(v), infos, constants)
                work[pos:pos] = inlined
                continue
            outs, rag = res
            depends = any(i in sized or i in probed for i in node.inputs if i)
            for o, (shape, dt), r in zip(node.outputs, outs, rag):
                if o:
                    infos[o] = TensorInfo(o, tuple(int(d) for d in shape), np.dtype(dt))
                    if depends:
                        sized.add(o)
                    if r or any(i in ragged for i in node.inputs if i):
                        ragged.add(o)
            kept.append(node)
            continue
        if any(i in ragged for i in node.inputs if i):
            # downstream of a tensor shaped at run time: shaped at the placeholder where that works, run by the oracle
            try:
                outs = spec.infer(node, [infos[i] if i else None for i in node.inputs],
                                  {i: known[i] for i in node.inputs if i and i in known})
            except Exception:
                outs = [((), infos[node.inputs[0]].dtype)] * len(node.outputs)
            for o, (shape, dt) in zip(node.outputs, outs):
                if o:
                    infos[o] = TensorInfo(o, tuple(int(d) for d in shape), np.dtype(dt))
                    ragged.add(o)
            kept.append(node)
            continue
        if node.op == "Clip" and len(node.inputs) > 1:
            _clip_inputs_to_attrs(node, constants)
        in_infos = [infos[i] if i else None for i in node.inputs]
        from_probe = any(i in probed for i in node.inputs if i)
        if (all((not i) or i in known for i in node.inputs) and node.inputs and any(node.inputs)
                and not _quantised_weight(node, known)):
            try:
                vals = spec.reference(node, [known[i] if i else None for i in node.inputs])
            except InferdError:
                raise
            except Exception as e:
                raise ShapeError(f"constant folding failed at node {node.name!r} ({node.op}): {type(e).__name__}: {e}") from e
            if sum(np.asarray(v).nbytes for v in vals) <= _NO_FOLD_ABOVE:
                for o, v in zip(node.outputs, vals):
                    if o:
                        if from_probe:
                            probed[o] = np.asarray(v)
                            infos[o] = TensorInfo(o, tuple(np.shape(v)), np.asarray(v).dtype)
                        else:
                            set_const(o, np.asarray(v), infos, constants)
                if from_probe:
                    kept.append(node)
                continue
        try:
            # the values on demand: shape inference reads a Reshape's shape, never a Conv's weights, and a
            # package's weights must stay in the store until the loader streams them
            outs = spec.infer(node, in_infos, _Values(known, [i for i in node.inputs if i and i in known]))
        except ShapeError:
            if not (lenient and any(i and i not in known for i in node.inputs[1:])):
                raise
            for o in node.outputs:
                if o:
                    infos[o] = TensorInfo(o, (), infos[node.inputs[0]].dtype)
                    ragged.add(o)
            kept.append(node)
            continue
        except InferdError:
            raise
        except Exception as e:
            shapes = [(i.name, i.shape) if i else None for i in in_infos]
            raise ShapeError(f"shape inference failed at node {node.name!r} ({node.op}) with inputs {shapes}: "
                             f"{type(e).__name__}: {e}") from e
        depends = from_probe or any(i in sized for i in node.inputs if i)
        for o, (shape, dt) in zip(node.outputs, outs):
            if o:
                if any(int(d) < 0 for d in shape):
                    raise ShapeError(f"node {node.name!r} ({node.op}) gives negative output shape {tuple(shape)}")
                infos[o] = TensorInfo(o, tuple(int(d) for d in shape), np.dtype(dt))
                if depends:
                    sized.add(o)
        kept.append(node)
    return kept


def _quantised_weight(node: Node, known: Mapping[str, np.ndarray]) -> bool:
    """A DequantizeLinear of constant integers (a quantised model's weights) stays a node: the int8 fusions
    (``inferd.frontend.quantfuse``) read the integers, and fold what they do not fuse themselves."""
    return node.op == "DequantizeLinear" and np.issubdtype(np.asarray(known[node.inputs[0]]).dtype, np.integer)


def set_const(name: str, val: np.ndarray, infos: dict[str, TensorInfo], constants: MutableMapping[str, np.ndarray]) -> None:
    constants[name] = val
    infos[name] = TensorInfo(name, tuple(val.shape), val.dtype)


def _clip_inputs_to_attrs(node: Node, constants: Mapping[str, np.ndarray]) -> None:
    """Opset >= 11 Clip takes min/max as inputs; constant ones become attributes so Clip can be fused."""
    extra = node.inputs[1:]
    if all((not i) or i in constants for i in extra):
        if len(extra) > 0 and extra[0]:
            node.attrs["min"] = float(constants[extra[0]])
        if len(extra) > 1 and extra[1]:
            node.attrs["max"] = float(constants[extra[1]])
        node.inputs = node.inputs[:1]
