"""Control flow: If, Loop and Scan, with nested bodies reading names of enclosing scopes.

Import converts each body into an ``ir.Subgraph`` (recursively) and appends the names it reads from outside
to the node's inputs (``attrs['_formal']`` formal inputs first, then ``attrs['_outer']``: the names as the
bodies spell them), so planners and dead-code elimination see those reads like any other.

Shapes (``shape_control``, called by ``inferd.frontend.shapes.infer_and_fold`` every time a graph is shaped):
  * an ``If`` whose condition is a constant, or is computed from shapes alone (then it is a constant once the
    shapes are: per shape variant of a dynamic model), is replaced by its branch's nodes, renamed under the
    If's name: nothing of it is left at run time;
  * otherwise each body is shaped at the node's input shapes into a static ``Graph`` (``Node.bodies``) that
    the backends plan once (kernels, arena, on Vulkan recorded commands) and run whenever the node runs. An
    ``If`` whose branches give different shapes, a ``Loop`` whose trip count depends on values and that has
    scan outputs, or whose carried values change shape, has outputs shaped at run time
    (``Graph.runtime_shaped``): the CPU backend runs what reads them through the numpy oracle.

At run time ``run_control`` carries out the node's semantics over a ``run_body(key, feeds)`` the backend
provides; the reference passes the numpy interpreter ``run_reference``, the CPU kernel its executors.
"""
from __future__ import annotations

import dataclasses
import time
from collections import ChainMap
from typing import Any, Callable, ClassVar, Mapping, MutableMapping, Sequence

import numpy as np

from ..errors import ShapeError, UnsupportedOpError
from ..ir import Graph, Node, Overlay, Renamed, Subgraph, TensorInfo
from .base import (
    Kernel,
    Layer,
    OpSpec,
    full_inputs,
    raw_key,
    register_kernel,
    register_op,
    run_at_run_shapes,
)

CONTROL_OPS = ("If", "Loop", "Scan")
BODY_KEYS = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",)}

RunBody = Callable[[str, dict[str, np.ndarray]], list[np.ndarray]]


def formal_inputs(node: Node) -> list[str]:
    return node.inputs[:int(node.attr("_formal", len(node.inputs)))]


def outer_map(node: Node) -> dict[str, str]:
    """Body spelling of each name read from outside -> the name it has in the graph holding ``node`` (they
    differ once an enclosing If has been inlined and its names prefixed)."""
    k = int(node.attr("_formal", len(node.inputs)))
    return dict(zip(node.attr("_outer") or [], node.inputs[k:]))


def scan_counts(node: Node) -> tuple[int, int]:
    """(states, scan inputs) of a Scan."""
    m = int(node.attr("num_scan_inputs"))
    return len(formal_inputs(node)) - m, m


def axis_index(a: int, rank: int) -> int:
    return a + rank if a < 0 else a


# ------------------------------------------------------------------------------------------------ run time

def run_control(node: Node, inputs: Sequence[np.ndarray | None], run_body: RunBody) -> list[np.ndarray]:
    """The outputs of ``node`` on ``inputs`` (formal ones first, then the outer names in ``node.inputs`` order);
    ``run_body(key, feeds)`` runs body ``key`` on feeds named as ``node.bodies[key]``'s inputs."""
    op = node.op
    nf = len(formal_inputs(node))
    outer_vals = {name: inputs[nf + k] for k, name in enumerate(node.attr("_outer") or [])}

    def feeds_for(key: str, formal: Sequence[np.ndarray | None]) -> dict[str, np.ndarray]:
        g = node.bodies[key]
        d: dict[str, np.ndarray] = {}
        for k, t in enumerate(g.inputs):
            d[t.name] = np.asarray(formal[k]) if k < len(formal) else np.asarray(outer_vals[t.name])
        return d

    if op == "If":
        take = "then_branch" if bool(np.asarray(inputs[0]).reshape(-1)[0]) else "else_branch"
        return run_body(take, feeds_for(take, []))
    if op == "Loop":
        m, cond = inputs[0], inputs[1] if nf > 1 else None
        carried = [np.asarray(v) for v in inputs[2:nf]]
        limit = int(np.asarray(m).reshape(-1)[0]) if m is not None else None
        go = bool(np.asarray(cond).reshape(-1)[0]) if cond is not None else True
        scans: list[list[np.ndarray]] | None = None
        nc = len(carried)
        i = 0
        while go and (limit is None or i < limit):
            res = run_body("body", feeds_for("body", [np.array(i, np.int64), np.array(go, np.bool_)] + carried))
            go = bool(np.asarray(res[0]).reshape(-1)[0])
            carried = [np.array(r, copy=True) for r in res[1:1 + nc]]
            if scans is None:
                scans = [[] for _ in res[1 + nc:]]
            for lst, r in zip(scans, res[1 + nc:]):
                lst.append(np.array(r, copy=True))
            i += 1
        body = node.bodies["body"]
        outs = carried
        for k, t in enumerate(body.outputs[1 + nc:]):
            lst = scans[k] if scans else []
            outs.append(np.stack(lst) if lst else np.zeros((0,) + tuple(t.shape), t.dtype))
        return outs
    if op == "Scan":
        ns, ms = scan_counts(node)
        states = [np.asarray(v) for v in inputs[:ns]]
        xs = [np.asarray(v) for v in inputs[ns:nf]]
        in_axes = [axis_index(int(a), x.ndim) for a, x in zip(node.attr("scan_input_axes") or [0] * ms, xs)]
        in_dirs = [int(d) for d in (node.attr("scan_input_directions") or [0] * ms)]
        seq = xs[0].shape[in_axes[0]]
        body = node.bodies["body"]
        nout = len(body.outputs) - ns
        out_axes = [int(a) for a in (node.attr("scan_output_axes") or [0] * nout)]
        out_dirs = [int(d) for d in (node.attr("scan_output_directions") or [0] * nout)]
        collected: list[list[np.ndarray]] = [[] for _ in range(nout)]
        for t in range(seq):
            slices = [np.take(x, seq - 1 - t if d else t, axis=a) for x, a, d in zip(xs, in_axes, in_dirs)]
            res = run_body("body", feeds_for("body", states + slices))
            states = [np.array(r, copy=True) for r in res[:ns]]
            for lst, r in zip(collected, res[ns:]):
                lst.append(np.array(r, copy=True))
        outs = states
        for k, (lst, t) in enumerate(zip(collected, body.outputs[ns:])):
            if out_dirs[k]:
                lst = lst[::-1]
            a = axis_index(out_axes[k], len(t.shape) + 1)
            outs.append(np.stack(lst, axis=a) if lst else np.zeros((0,) + tuple(t.shape), t.dtype))
        return outs
    raise AssertionError(op)


def run_reference(g: Graph, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """``g`` interpreted node by node with the numpy oracles (any shapes: what runtime-shaped tensors use); its
    data-dependent ops run their CPU kernel at the run's shapes (``run_at_run_shapes``)."""
    env: MutableMapping[str, np.ndarray] = ChainMap(dict(feeds), g.constants)  # type: ignore[arg-type]
    for n in g.nodes:
        res = run_at_run_shapes(n, [env[i] if i else None for i in n.inputs])
        for o, r in zip(n.outputs, res):
            if o:
                env[o] = np.asarray(r)
    return [np.asarray(env[t.name]) for t in g.outputs]


def _reference(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    if not node.bodies:
        raise ShapeError(f"node {node.name!r} ({node.op}): its bodies are not shaped (run shape inference first)")
    return run_control(node, inputs, lambda key, feeds: run_reference(node.bodies[key], feeds))


def _infer(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    # shaping a control-flow node needs the enclosing graph's names (infer_and_fold calls shape_control)
    raise ShapeError(f"node {node.name!r} ({node.op}) is shaped by the graph's shape inference, not alone")


def _check(node: Node, opset: int) -> None:
    for key in BODY_KEYS[node.op]:
        if not isinstance(node.attr(key), Subgraph):
            raise UnsupportedOpError(node.op, node.name, opset, f"attribute {key!r} must be a graph")
    if node.op == "Scan":
        if opset < 9:
            raise UnsupportedOpError("Scan", node.name, opset, "Scan before opset 9 (batched, sequence_lens) is not "
                                                              "supported")
        if node.attr("num_scan_inputs") is None:
            raise UnsupportedOpError("Scan", node.name, opset, "num_scan_inputs is required")


register_op(OpSpec("If", _infer, _reference, min_opset=1, check=_check))
register_op(OpSpec("Loop", _infer, _reference, min_opset=1, check=_check))
register_op(OpSpec("Scan", _infer, _reference, min_opset=9, check=_check))


# ------------------------------------------------------------------------------------------------ CPU kernel

class DecideStats:
    """How often a node ran each body and what deciding took (``inferd info`` shows it)."""

    def __init__(self) -> None:
        self.taken: dict[str, int] = {}
        self.decide_s = 0.0
        self.runs = 0

    def to_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, "taken": dict(self.taken),
                "decide_us": round(1e6 * self.decide_s / self.runs, 2) if self.runs else None}


#: what a body runs on (``Graph`` -> an object with ``run(feeds) -> outputs``). The CPU runtime registers its
#: executor when it is imported: the runtime depends on the ops, so the ops must not import the runtime.
_body_executor: Callable[[Graph], Any] | None = None


def set_body_executor(factory: Callable[[Graph], Any]) -> None:
    global _body_executor
    _body_executor = factory


@register_kernel
class ControlFlowKernel(Kernel):
    """Runs a body on its own CPU executor, planned once at load (kernels, transformed weights, arena) and run
    whenever the node runs; a body whose tensors are shaped at run time goes through the numpy oracle."""

    name = "control"
    ops: ClassVar[tuple[str, ...]] = CONTROL_OPS
    priority = 50
    storable = False  # its preparation is its bodies' executors
    prepares_at_first_run = True  # an If's taken branch (``_bind_if``)

    def transformed_nbytes(self, layer: Layer) -> int:
        return 0

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(raw)

    def workspace_nbytes(self, layer: Layer) -> int:
        from ..planner.memory import plan_graph_memory

        return sum(plan_graph_memory(g).total for g in layer.node.bodies.values() if not g.runtime_shaped)

    def executors(self, layer: Layer, loaded: Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
        make = _body_executor
        if make is None:  # only the CPU runtime binds this kernel, and importing it registers the executor
            raise RuntimeError("no executor for control-flow bodies is registered (inferd.runtime.cpu does it)")
        return {k: (make(served(g, loaded)) if not g.runtime_shaped else None) for k, g in layer.node.bodies.items()}

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        node = layer.node
        stats = DecideStats()
        node.notes["stats"] = stats  # read by ``inferd info``
        ins = full_inputs(layer, inputs, params)
        # the node's constant inputs as the load read them, by their names in the graph: its bodies' copies of them
        # are served from these rather than read again from the store (``served``)
        loaded = {node.inputs[i]: params[raw_key(i)] for i in layer.const_inputs if raw_key(i) in params}
        if node.op == "If":
            lean = _bind_if(node, ins, outputs, stats, loaded)
            if lean is not None:
                return lean
        execs = self.executors(layer, loaded)

        def run_body(key: str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            stats.taken[key] = stats.taken.get(key, 0) + 1
            ex = execs.get(key)
            g = node.bodies[key]
            if ex is not None and all(tuple(np.shape(feeds[t.name])) == tuple(t.shape) for t in g.inputs):
                res = ex.run(feeds)
                return [res[t.name] for t in g.outputs]
            return run_reference(g, feeds)

        def call() -> None:
            t0 = time.perf_counter()
            stats.runs += 1
            res = run_control(node, ins, run_body)
            for o, r in zip(outputs, [r for r, name in zip(res, node.outputs) if name]):
                if o.shape != np.shape(r):
                    raise ShapeError(f"node {node.name!r} ({node.op}): output of shape {list(np.shape(r))} where the "
                                     f"plan has {list(o.shape)}")
                np.copyto(o, r)
            stats.decide_s += time.perf_counter() - t0

        return call

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        call = self.bind(layer, inputs, params, outputs)
        assert call is not None
        call()


def served(g: Graph, loaded: Mapping[str, np.ndarray] | None) -> Graph:
    """``g`` with its references to the enclosing graph's weights (a package's shaped body: ``ir.Renamed``, read from
    the store when first used) answered from ``loaded``, the arrays the load read for the node from its stream: vad's
    taken branch read them from the store again when it was built (1.59 MB read for a 0.82 MB store). ``g`` itself
    where it holds no such reference."""
    c = g.constants
    if not loaded or not isinstance(c, Overlay) or not isinstance(c.base, Renamed):
        return g
    hit = {k: loaded[src] for k, src in c.base.names.items() if src in loaded}
    if not hit:
        return g
    return dataclasses.replace(g, constants=Overlay({**c.top, **hit}, c.base))


def _bind_if(node: Node, ins: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray],
             stats: DecideStats, loaded: Mapping[str, np.ndarray] | None = None) -> Callable[[], None] | None:
    """An ``If`` whose two bodies read and write buffers of fixed shapes (the node's inputs and outputs here) as one
    call: read the condition, run the taken body straight from those buffers into the outputs (its executor's
    ``bind_run``: its inputs copied in, its kernels, its outputs copied out). This skips the per-run feeds dict,
    shape checks and result arrays of ``run_control``: ~15 us a run, as much as the rest of a small model's body.
    Each body's executor is built when that body first runs, not at bind: a request takes one branch, often the
    same one for good (vad's sample rate), and building both was half of vad's cold preparation (two executors,
    ~2 ms each on the 2-core VM); the other branch's first run pays its build. None where a body is shaped at run
    time or its shapes differ from the node's buffers (then ``run_control`` decides per run)."""
    make = _body_executor
    cond = ins[0] if ins else None
    if make is None or cond is None:
        return None
    pos = {body_name: k for k, body_name in enumerate(node.attr("_outer") or [])}
    nf = len(formal_inputs(node))
    if len([o for o in node.outputs if o]) != len(node.outputs):
        return None
    runs: dict[bool, Callable[[], None]] = {}
    for key, taken in (("then_branch", True), ("else_branch", False)):
        g = node.bodies.get(key)
        if g is None or g.runtime_shaped or len(g.outputs) != len(node.outputs) \
                or any(t.name not in pos for t in g.inputs):
            return None
        sources = {t.name: ins[nf + pos[t.name]] for t in g.inputs}
        for t in g.inputs:
            src = sources[t.name]
            if src is None or tuple(src.shape) != tuple(t.shape) or src.dtype != t.dtype:
                return None
        for t, o in zip(g.outputs, outputs):
            if tuple(t.shape) != tuple(o.shape) or np.dtype(t.dtype) != o.dtype:
                return None
        dests = [(t.name, o) for t, o in zip(g.outputs, outputs)]
        runs[taken] = _counted(_built_on_first_run(make, served(g, loaded), sources, dests, node, key), stats, key)
    flag = np.asarray(cond).reshape(-1)  # a view of the condition's buffer: read at each run
    if not np.may_share_memory(flag, cond):
        return None
    then_run, else_run = runs[True], runs[False]
    clock = time.perf_counter

    def call() -> None:
        t0 = clock()
        stats.runs += 1
        (then_run if flag[0] else else_run)()
        stats.decide_s += clock() - t0
    return call


def _built_on_first_run(make: Callable[[Graph], Any], g: Graph, sources: Mapping[str, np.ndarray],
                        dests: list[tuple[str, np.ndarray]], node: Node, key: str) -> Callable[[], None]:
    run: Callable[[], None] | None = None

    def call() -> None:
        nonlocal run
        if run is None:
            r = make(g).bind_run(sources, dests)
            if r is None:
                raise ShapeError(f"node {node.name!r} ({node.op}): body {key!r} cannot run on the node's buffers")
            run = r
        run()
    return call


def _counted(run: Callable[[], None], stats: DecideStats, key: str) -> Callable[[], None]:
    taken = stats.taken

    def call() -> None:
        taken[key] = taken.get(key, 0) + 1
        run()
    return call


def describe(graph: Graph) -> str:
    """What ``inferd info`` says about control flow: every If/Loop/Scan left in ``graph`` (decided by values at
    run time; those decided by shapes or constants were inlined when the shape was planned), its bodies and,
    once it ran, which bodies it took and what deciding cost."""
    lines = []
    for n in graph.nodes:
        if n.op not in CONTROL_OPS:
            continue
        bodies = ", ".join(f"{k} ({len(g.nodes)} nodes)" for k, g in n.bodies.items())
        cond = formal_inputs(n)[0] if n.op == "If" else ", ".join(i for i in formal_inputs(n)[:2] if i) or "-"
        backend = n.notes.get("backend", "cpu")
        how = ("waits for the device and reads its inputs back from the activations (a readback), then submits "
               "the body's recorded command buffer") if backend == "vulkan" else "reads its inputs on the host"
        lines.append(f"{n.op} {n.name}: stays dynamic (decided by {cond} at run time); bodies: {bodies}; "
                     f"deciding {how}")
        st = n.notes.get("stats")
        if st is not None and st.runs:
            d = st.to_dict()
            lines.append(f"  ran {d['runs']} times, took {d['taken']}, deciding {d['decide_us']} us per run")
    if graph.runtime_shaped:
        lines.append(f"tensors shaped at run time (CPU oracle): {sorted(graph.runtime_shaped)}")
    return "\n".join(lines) if lines else "no control flow left at run time"


# ------------------------------------------------------------------------------------------------ optional values
# inferd's graphs carry tensors only, and a client's feed is always a tensor, so an optional value is known at import
# to be present (Optional(x), a plain tensor, an optional-typed graph or body input) or empty (Optional() with no
# input). ``lower_optionals`` turns the three ops into what they then are: Identity of the held tensor, a constant
# bool, or a refusal where an empty optional would have to exist at run time. The specs below are the ops' numpy
# oracles (an empty optional is None) and what ``inferd ops`` lists.

OPTIONAL_OPS = ("Optional", "OptionalHasElement", "OptionalGetElement")


def _optional_input(node: Node) -> str:
    return node.inputs[0] if node.inputs and node.inputs[0] else ""


def _optional_infer(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    x = ins[0] if ins else None
    if node.op == "OptionalHasElement":
        return [((), np.dtype(np.bool_))]
    if x is None:
        raise ShapeError(f"node {node.name!r} ({node.op}): an empty optional has no tensor shape (import folds it)")
    return [(tuple(x.shape), x.dtype)]


def _optional_reference(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    x = inputs[0] if inputs else None
    if node.op == "OptionalHasElement":
        return [np.array(x is not None)]
    if x is None:
        raise ShapeError(f"node {node.name!r} ({node.op}): the optional is empty"
                         + (" (OptionalGetElement of an empty optional fails in onnxruntime too)"
                            if node.op == "OptionalGetElement" else ""))
    return [np.asarray(x)]


def _optional_check(node: Node, opset: int) -> None:
    if node.op == "OptionalGetElement" and not _optional_input(node):
        raise UnsupportedOpError(node.op, node.name, opset, "its input is required")
    if node.op == "OptionalHasElement" and not _optional_input(node) and opset < 18:
        raise UnsupportedOpError(node.op, node.name, opset, "its input is required before opset 18")
    if node.op == "Optional" and not _optional_input(node) and node.attr("type") is None:
        raise UnsupportedOpError(node.op, node.name, opset, "an Optional with no input needs its 'type' attribute")


_OPTIONAL_NOTES = {
    "Optional": "static: Optional(x) is x (an Identity); Optional() is an empty optional known at import, which "
                "only OptionalHasElement may read (anything else needing it at run time is refused at import)",
    "OptionalHasElement": "folded at import to a constant bool (feeds are always tensors, so an optional graph "
                          "input is present)",
    "OptionalGetElement": "an Identity of the held tensor; of an empty optional refused at import (onnxruntime "
                          "fails at run time)",
}
for _op in OPTIONAL_OPS:
    register_op(OpSpec(_op, _optional_infer, _optional_reference, min_opset=15, check=_optional_check,
                       notes=_OPTIONAL_NOTES[_op]))


@register_kernel
class OptionalKernel(Kernel):
    """The oracle over the arena, for a node that reaches a backend without being lowered (a graph built by hand:
    import always lowers them)."""

    name = "numpy"
    ops: ClassVar[tuple[str, ...]] = OPTIONAL_OPS


def body_reads(sub: Subgraph) -> list[str]:
    """Names ``sub`` reads from enclosing scopes (its nested bodies' reads included): its ``outer``, set at import
    (``frontend.onnx_import``) and again when a rewrite changes what the body reads."""
    defined = {i[0] for i in sub.inputs} | set(sub.constants) | {o for n in sub.nodes for o in n.outputs if o}
    reads: list[str] = []
    for n in sub.nodes:
        for i in n.inputs:
            if i and i not in defined and i not in reads:
                reads.append(i)
    for o in sub.outputs:
        if o and o not in defined and o not in reads:
            reads.append(o)
    return reads


def lower_optionals(nodes: list[Node], outputs: Sequence[str], opset: int, where: str = "",
                    empty: set[str] | None = None) -> list[Node]:
    """``nodes`` (and every body in them) without Optional, OptionalHasElement and OptionalGetElement: see the
    section's comment. ``empty``: names of empty optionals defined so far in enclosing scopes (ONNX names are
    unique across scopes). Refuses (``UnsupportedOpError`` naming the op, the node's path and why) an
    OptionalGetElement of an empty optional and any other read of one: as a node input, a body's read, a graph
    or body output."""
    empty = set() if empty is None else empty
    out: list[Node] = []
    for n in nodes:
        path = f"{where}/{n.name}" if where else n.name
        if n.op in OPTIONAL_OPS:
            x = _optional_input(n)
            attrs = {"_opset": n.attr("_opset", opset)}
            if n.op == "Optional" and not x:
                empty.update(o for o in n.outputs if o)
                continue
            if n.op == "OptionalHasElement":
                out.append(Node(n.name, "Constant", [], list(n.outputs),
                                {**attrs, "value": np.array(bool(x) and x not in empty)}, n.domain))
                continue
            if x in empty:
                raise UnsupportedOpError(n.op, path, opset, f"its input {x!r} is an empty optional (Optional() with no "
                                                           "input): getting its element fails at run time, in "
                                                           "onnxruntime too")
            out.append(Node(n.name, "Identity", [x], list(n.outputs), attrs, n.domain))
            continue
        for key in sorted(k for k, v in n.attrs.items() if isinstance(v, Subgraph)):
            sub = n.attrs[key]
            sub.nodes = lower_optionals(sub.nodes, sub.outputs, opset, f"{path}.{key}", empty)
            sub.outer = body_reads(sub)
        if n.attr("_outer") is not None:
            outer: list[str] = []
            for key in sorted(k for k, v in n.attrs.items() if isinstance(v, Subgraph)):
                outer += [o for o in n.attrs[key].outer if o not in outer]
            nf = int(n.attr("_formal"))
            n.inputs = n.inputs[:nf] + outer
            n.attrs["_outer"] = outer
        bad = [i for i in n.inputs if i in empty]
        if bad:
            raise UnsupportedOpError(n.op, path, opset, f"it reads {bad}, an empty optional (Optional() with no input): "
                                                        "only tensors exist at run time in inferd, so an absent "
                                                        "optional can only be tested by OptionalHasElement")
        out.append(n)
    bad = [o for o in outputs if o in empty]
    if bad:
        raise UnsupportedOpError("Optional", where or "graph", opset,
                                 f"{'body' if where else 'graph'} output(s) {bad} are an empty optional (Optional() "
                                 "with no input): an absent optional value at run time is not supported")
    return out
