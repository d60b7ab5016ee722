"""Shapes of a graph: static shape inference with constant folding (import's first pass), and the
specialisation of a dynamic model's template to one concrete input shape. No onnx import here: a
compiled package is specialised at load without it."""
from __future__ import annotations

from typing import Callable, Collection, Mapping, MutableMapping, Sequence

import numpy as np

from ..errors import InferdError, ModelFormatError, ShapeError
from ..ir import FOLD_MAX_BYTES, Graph, Node, Overlay, Subgraph, TensorInfo
from ..ops.base import op_spec
from ..ops.control import CONTROL_OPS, axis_index, formal_inputs, outer_map, scan_counts
from ..ops.tensor import onnx_dtype
from .rewrite import dce, rewrite



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
    view = Overlay(extra, consts)
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

    sized: set[str] = set(dynamic)  # tensors whose shape depends on a dynamic dimension
    probed: dict[str, np.ndarray] = {}  # values that do: known at the probe only
    known: Mapping[str, np.ndarray] = Overlay(probed, constants) if dynamic else constants
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
        if (node.op == "Shape" or node.op == "Size") and node.inputs[0] not in ragged:
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
            res = shape_control(node, infos, known, opset, lambda name: name not in probed, ragged)
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
                outs = [((), dt) for dt in _fallback_dtypes(node, infos)]
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
            if sum(np.asarray(v).nbytes for v in vals) <= FOLD_MAX_BYTES:
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
        # a data-dependent op: its outputs are shaped by the run, within the bounds ``infer`` gave
        bounded = spec.bounded is not None and spec.bounded(node, _Values(known, [i for i in node.inputs
                                                                                  if i and i in known]))
        for o, (shape, dt) in zip(node.outputs, outs):
            if o:
                if any(int(d) < 0 for d in shape):
                    raise ShapeError(f"node {node.name!r} ({node.op}) gives negative output shape {tuple(shape)}")
                infos[o] = TensorInfo(o, tuple(int(d) for d in shape), np.dtype(dt))
                if depends:
                    sized.add(o)
                if bounded:
                    ragged.add(o)
        kept.append(node)
    return kept


#: ops whose outputs' element type is not their first input's: (output index -> dtype) for the fallback below
_INT64_OUTS = {"NonMaxSuppression": (0,), "NonZero": (0,), "Shape": (0,), "Size": (0,), "ArgMax": (0,),
               "ArgMin": (0,), "TopK": (1,), "Unique": (1, 2, 3)}
_BOOL_OPS = {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "Xor", "IsNaN", "IsInf"}


def _fallback_dtypes(node: Node, infos: Mapping[str, TensorInfo]) -> list[np.dtype]:
    """Output element types of a node downstream of a run-time shaped tensor whose shape inference failed at
    the placeholder shape: the element type still follows from the op (an If's branches must agree on it, and
    the arena plan sizes by it)."""
    first = np.dtype(infos[node.inputs[0]].dtype) if node.inputs and node.inputs[0] in infos else np.dtype(np.float32)
    outs = [first] * len(node.outputs)
    if node.op in _BOOL_OPS:
        outs = [np.dtype(np.bool_)] * len(node.outputs)
    for k in _INT64_OUTS.get(node.op, ()):
        if k < len(outs):
            outs[k] = np.dtype(np.int64)
    if node.op == "Cast":
        outs = [onnx_dtype(int(node.attr("to", 1)), node.op, node.name)]
    elif node.op == "CastLike" and len(node.inputs) > 1 and node.inputs[1] in infos:
        outs = [np.dtype(infos[node.inputs[1]].dtype)]
    elif node.op == "Where" and len(node.inputs) > 1 and node.inputs[1] in infos:
        outs = [np.dtype(infos[node.inputs[1]].dtype)]
    elif node.op == "ConstantOfShape":
        v = node.attr("value", None)
        outs = [np.asarray(v).dtype if v is not None else np.dtype(np.float32)]
    return outs


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


# ------------------------------------------------------------------------------------------------ control flow

def shape_body(sub: Subgraph, formal: Sequence[TensorInfo], node: Node, infos: Mapping[str, TensorInfo],
               known: Mapping[str, np.ndarray], opset: int, ragged: Collection[str] = ()) -> Graph:
    """``sub`` shaped at these formal input infos: a static Graph whose inputs are the formal ones and the
    outer names that are not constants here (constants and shape values known here fold into the body).
    ``ragged``: the enclosing scope's tensors shaped only at run time; a body reading one treats it (and what
    it computes from it) as run-time shaped too, instead of shaping nodes at its placeholder shape."""
    outer = outer_map(node)
    b_infos: dict[str, TensorInfo] = {}
    local: dict[str, np.ndarray] = {}
    inputs: list[TensorInfo] = []
    for (name, _dt, _dims), t in zip(sub.inputs, formal):
        b_infos[name] = TensorInfo(name, tuple(t.shape), np.dtype(t.dtype))
        inputs.append(b_infos[name])
    runtime: set[str] = set()
    for o in sub.outer:
        src = outer.get(o, o)
        if src in ragged and src not in known:
            runtime.add(o)
        if src in known:
            set_const(o, np.asarray(known[src]), b_infos, local)
        elif src in infos:
            t = infos[src]
            b_infos[o] = TensorInfo(o, tuple(t.shape), np.dtype(t.dtype))
            inputs.append(b_infos[o])
        else:
            raise ShapeError(f"node {node.name!r} ({node.op}): body {sub.name!r} reads {o!r}, which no enclosing "
                             f"scope defines")
    for k, v in sub.constants.items():
        set_const(k, v, b_infos, local)
    nodes = infer_and_fold([copy_node(n) for n in sub.nodes], b_infos, local, set(sub.outputs), opset,
                           runtime=runtime, lenient=True)
    # dead code: a folded condition leaves nodes nothing reads
    needed = set(sub.outputs)
    live: list[Node] = []
    for n in reversed(nodes):
        if any(o in needed for o in n.outputs if o):
            live.append(n)
            needed.update(i for i in n.inputs if i)
    nodes = list(reversed(live))
    for o in sub.outputs:
        if o not in b_infos:
            raise ShapeError(f"node {node.name!r} ({node.op}): body {sub.name!r} output {o!r} is produced by no node")
    used = needed | {t.name for t in inputs}
    g = Graph(sub.name, nodes, inputs, [b_infos[o] for o in sub.outputs],
              {k: v for k, v in local.items() if k in used}, {k: v for k, v in b_infos.items() if k in used
                                                               or any(k in n.outputs for n in nodes)}, opset)
    g.runtime_shaped = runtime
    if not runtime:
        _optimize(g)
    return g


def _optimize(g: Graph) -> None:
    """The import's rewrites (BN folding, activation and residual fusion) on a shaped body: a body runs as
    often as the graph around it."""
    outs = {t.name for t in g.outputs}
    rewrite(g, outs, None)
    dce(g, [t.name for t in g.outputs])
    g.outputs = [g.infos[t.name] if t.name in g.infos else t for t in g.outputs]


def _inline_branch(node: Node, sub: Subgraph) -> tuple[list[Node], dict[str, np.ndarray]]:
    """The branch's nodes with every name it defines prefixed by the If's name, plus an Identity per output
    onto the If's own output names; and its initializers under their new names."""
    prefix = f"{node.name}/"
    defined = {o for n in sub.nodes for o in n.outputs if o} | set(sub.constants)
    outer = outer_map(node)

    def ren(x: str) -> str:
        if not x:
            return x
        if x in defined:
            return prefix + x
        return outer.get(x, x)

    nodes = []
    for n in sub.nodes:
        c = copy_node(n)
        c.name = prefix + n.name
        c.inputs = [ren(i) for i in n.inputs]
        c.outputs = [ren(o) for o in n.outputs]
        nodes.append(c)
    for k, (o, src) in enumerate(zip(node.outputs, sub.outputs)):
        if o:
            nodes.append(Node(f"{prefix}output{k}", "Identity", [ren(src)], [o], {"_opset": node.attr("_opset", 17)}))
    return nodes, {prefix + k: v for k, v in sub.constants.items()}


def shape_control(node: Node, infos: Mapping[str, TensorInfo], known: Mapping[str, np.ndarray], opset: int,
                  foldable: Callable[[str], bool], ragged: Collection[str] = ()
                  ) -> tuple[list[Node], dict[str, np.ndarray]] | tuple[list[tuple[tuple[int, ...], np.dtype]], list[bool]]:
    """Either (nodes, constants) replacing an If decided here (``foldable(cond)``: its value holds for every
    use of this graph), or (output shapes/dtypes, per output whether its shape is known only at run time), with
    ``node.bodies`` shaped. ``ragged``: see ``shape_body``."""
    op = node.op
    f = formal_inputs(node)
    node.bodies = {}
    if op == "If":
        cond = f[0]
        if cond in known:
            take = "then_branch" if bool(np.asarray(known[cond]).reshape(-1)[0]) else "else_branch"
            if foldable(cond):
                return _inline_branch(node, node.attrs[take])
            # a shape-dependent condition in a dynamic template: shaped at the probe, decided per shape later
            g = shape_body(node.attrs[take], [], node, infos, known, opset, ragged)
            node.bodies = {take: g}
            return [(t.shape, t.dtype) for t in g.outputs], [t.name in g.runtime_shaped for t in g.outputs]
        t = shape_body(node.attrs["then_branch"], [], node, infos, known, opset, ragged)
        e = shape_body(node.attrs["else_branch"], [], node, infos, known, opset, ragged)
        node.bodies = {"then_branch": t, "else_branch": e}
        if len(t.outputs) != len(e.outputs) or len(t.outputs) < len([o for o in node.outputs if o]):
            raise ShapeError(f"node {node.name!r} (If): branches give {len(t.outputs)} and {len(e.outputs)} outputs "
                             f"for {len(node.outputs)}")
        outs, ragged = [], []
        for a, b in zip(t.outputs, e.outputs):
            if np.dtype(a.dtype) != np.dtype(b.dtype):
                raise ShapeError(f"node {node.name!r} (If): branch outputs {a.name!r} ({np.dtype(a.dtype)}) and "
                                 f"{b.name!r} ({np.dtype(b.dtype)}) differ in type")
            outs.append((a.shape, np.dtype(a.dtype)))
            ragged.append(a.shape != b.shape or a.name in t.runtime_shaped or b.name in e.runtime_shaped)
        return outs, ragged
    if op == "Loop":
        m, cond, carried = (f + ["", ""])[0], (f + ["", ""])[1], f[2:]
        formal = [TensorInfo("iter", (), np.dtype(np.int64)), TensorInfo("cond", (), np.dtype(np.bool_))]
        formal += [infos[c] for c in carried]
        sub: Subgraph = node.attrs["body"]
        if len(sub.inputs) != 2 + len(carried):
            raise ShapeError(f"node {node.name!r} (Loop): body takes {len(sub.inputs)} inputs for {len(carried)} "
                             f"carried values")
        g = shape_body(sub, formal, node, infos, known, opset, ragged)
        node.bodies = {"body": g}
        nc = len(carried)
        outs, ragged = [], []
        changing = False
        for k, c in enumerate(carried):
            t = g.outputs[1 + k]
            if tuple(t.shape) != tuple(infos[c].shape) or t.name in g.runtime_shaped:
                changing = True  # a value that grows per iteration: its final shape is known at run time
            outs.append((tuple(infos[c].shape), np.dtype(infos[c].dtype)))
            ragged.append(tuple(t.shape) != tuple(infos[c].shape) or t.name in g.runtime_shaped)
        trips = loop_trips(node, g, known)
        for t in g.outputs[1 + nc:]:
            outs.append(((trips if trips is not None else 1,) + tuple(t.shape), np.dtype(t.dtype)))
            ragged.append(trips is None or changing or t.name in g.runtime_shaped)
        return outs, ragged
    if op == "Scan":
        ns, ms = scan_counts(node)
        states, scans = f[:ns], f[ns:]
        in_axes = [int(a) for a in (node.attr("scan_input_axes") or [0] * ms)]
        if not scans:
            raise ShapeError(f"node {node.name!r} (Scan): no scan inputs")
        shapes = [infos[s].shape for s in scans]
        axes = [axis_index(a, len(s)) for a, s in zip(in_axes, shapes)]
        seq = shapes[0][axes[0]]
        if any(s[a] != seq for s, a in zip(shapes, axes)):
            raise ShapeError(f"node {node.name!r} (Scan): scan inputs {shapes} differ in length along {axes}")
        formal = [infos[s] for s in states]
        formal += [TensorInfo(s, tuple(d for k, d in enumerate(sh) if k != a), infos[s].dtype)
                   for s, sh, a in zip(scans, shapes, axes)]
        g = shape_body(node.attrs["body"], formal, node, infos, known, opset, ragged)
        node.bodies = {"body": g}
        outs, ragged = [], []
        for k, s in enumerate(states):
            outs.append((tuple(infos[s].shape), np.dtype(infos[s].dtype)))
            ragged.append(tuple(g.outputs[k].shape) != tuple(infos[s].shape))
        out_axes = [int(a) for a in (node.attr("scan_output_axes") or [0] * (len(g.outputs) - ns))]
        for t, a in zip(g.outputs[ns:], out_axes):
            shape = list(t.shape)
            shape.insert(axis_index(a, len(shape) + 1), seq)
            outs.append((tuple(shape), np.dtype(t.dtype)))
            ragged.append(t.name in g.runtime_shaped)
        return outs, ragged
    raise AssertionError(op)


def loop_trips(node: Node, body: Graph, known: Mapping[str, np.ndarray]) -> int | None:
    """A Loop's iteration count when shapes and constants decide it, else None (decided by values at run time)."""
    f = formal_inputs(node) + ["", ""]
    m, cond = f[0], f[1]
    if not m or m not in known:
        return None
    if cond and (cond not in known or not bool(np.asarray(known[cond]).reshape(-1)[0])):
        return None if cond not in known else 0
    c_out = body.outputs[0].name
    cin = body.inputs[1].name
    prods = body.producers()
    while c_out in prods and prods[c_out].op == "Identity":  # torch writes cond_out = Identity(cond_in)
        c_out = prods[c_out].inputs[0]
    if c_out == cin or (c_out in body.constants and bool(np.asarray(body.constants[c_out]).reshape(-1)[0])):
        return max(int(np.asarray(known[m]).reshape(-1)[0]), 0)
    return None
