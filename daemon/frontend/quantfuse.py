"""QDQ fusion: the QuantizeLinear / DequantizeLinear pairs a QDQ model (onnxruntime's ``quantize_static``, QAT
exports) wraps around float ops become one integer op each, so the int8 tensors flow from op to op and no
float copy of a weight or an activation is made.

  DQ(x), DQ(w) [, DQ(b)] -> Conv | Gemm | MatMul [-> Relu | Clip] -> Q   =>  QLinearConv / QLinearMatMul
      (int32 accumulation; bias added to it; the activation a clamp of the output integers)
  DQ(a), DQ(b) -> Add | Mul [-> Relu] -> Q                              =>  QLinearAdd / QLinearMul
  DQ(x_i)... -> Concat -> Q                                             =>  QLinearConcat
  DQ(x) -> GlobalAveragePool -> Q                                       =>  QLinearGlobalAveragePool
  DQ(x) -> MaxPool | Reshape | Flatten | Transpose | ... -> Q (same scale and zero point)
                                                                        =>  the op on the integers

What is not fused runs as written (DequantizeLinear, the float op, QuantizeLinear): the same numbers up to
float rounding. DequantizeLinear of constant integers is kept by constant folding for these rewrites and
folded here where no fusion took it. Patterns are matched structurally and every condition a fused kernel
relies on (per-tensor activation scales, weight scales per tensor or per output channel, int8/uint8) is
checked; a QDQ graph whose quantisation the oracles cannot express fails at import (``check_quantised``).
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..errors import UnsupportedOpError
from ..ir import Graph, GraphIndex, Node
from ..ops.quant import INT8_TYPES, dequantize, quantize

log = logging.getLogger(__name__)

#: ops that commute with a per-tensor quantisation when input and output share scale and zero point
_PASS = {"MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity", "SpaceToDepth",
         "DepthToSpace", "Slice", "Split", "Gather"}


class _DQ:
    """A DequantizeLinear with constant scale and zero point."""

    def __init__(self, node: Node, graph: Graph) -> None:
        self.node = node
        self.q = node.inputs[0]
        self.scale_name = node.inputs[1]
        self.zp_name = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else ""
        self.scale = np.asarray(graph.constants[self.scale_name], np.float32)
        zp = graph.constants.get(self.zp_name) if self.zp_name else None
        self.dtype = np.dtype(graph.infos[self.q].dtype)
        self.zp = np.zeros(self.scale.shape, self.dtype) if zp is None else np.asarray(zp)
        self.axis = int(node.attr("axis", 1))
        self.const = self.q in graph.constants

    @property
    def per_tensor(self) -> bool:
        return self.scale.size == 1 and self.zp.size == 1


def _dq(graph: Graph, name: str, prods: dict[str, Node]) -> _DQ | None:
    p = prods.get(name)
    if p is None or p.op != "DequantizeLinear" or p.inputs[1] not in graph.constants:
        return None
    if len(p.inputs) > 2 and p.inputs[2] and p.inputs[2] not in graph.constants:
        return None
    if np.dtype(graph.infos[p.inputs[0]].dtype) not in INT8_TYPES + (np.dtype(np.int32),):
        return None
    return _DQ(p, graph)


def _q_after(graph: Graph, tensor: str, outputs: set[str], cons: dict[str, list[Node]]) -> Node | None:
    """The QuantizeLinear that is ``tensor``'s only consumer, with constant per-tensor int8 parameters."""
    if tensor in outputs:
        return None
    c = cons.get(tensor, [])
    if len(c) != 1 or c[0].op != "QuantizeLinear":
        return None
    q = c[0]
    if q.inputs[1] not in graph.constants or (len(q.inputs) < 3 or not q.inputs[2] or q.inputs[2] not in graph.constants):
        return None
    if graph.constants[q.inputs[1]].size != 1 or graph.constants[q.inputs[2]].size != 1:
        return None
    if np.dtype(graph.infos[q.outputs[0]].dtype) not in INT8_TYPES:
        return None
    return q


def _act_then_q(graph: Graph, tensor: str, outputs: set[str], cons: dict[str, list[Node]]
                ) -> tuple[Node | None, Node | None]:
    """(activation node or None, the Q after it) for ``tensor``; (None, None) if no Q ends the pattern."""
    q = _q_after(graph, tensor, outputs, cons)
    if q is not None:
        return None, q
    c = cons.get(tensor, [])
    if tensor in outputs or len(c) != 1 or c[0].op not in ("Relu", "Clip") or len(c[0].inputs) != 1:
        return None, None
    q = _q_after(graph, c[0].outputs[0], outputs, cons)
    return (c[0], q) if q is not None else (None, None)


def _clamp(act: Node | None, q: Node, graph: Graph) -> tuple[int, int] | None:
    if act is None:
        return None
    ys, yz = graph.constants[q.inputs[1]], graph.constants[q.inputs[2]]
    dt = np.asarray(yz).dtype
    info = np.iinfo(dt)
    lo_f = 0.0 if act.op == "Relu" else float(act.attr("min", -np.inf))
    hi_f = np.inf if act.op == "Relu" else float(act.attr("max", np.inf))
    lo = int(quantize(np.float32(lo_f), ys, yz, dt)) if np.isfinite(lo_f) else int(info.min)
    hi = int(quantize(np.float32(hi_f), ys, yz, dt)) if np.isfinite(hi_f) else int(info.max)
    return lo, hi


def _const(graph: Graph, name: str, value: np.ndarray) -> str:
    graph.set_const(name, np.ascontiguousarray(value))
    return name


def _replace(graph: Graph, first: Node, removed: list[Node], new: Node) -> None:
    """``new`` takes the place of ``first`` (the float op); ``removed`` (activation, Q) leave the graph."""
    gone = {id(n) for n in removed if n is not None}
    # by identity: ``==`` on nodes compares every field (dataclass), and list.index / remove / ``in`` with it took
    # 1.5 s of a quantised vit_tiny's 6 s import under cProfile
    graph.nodes[:] = [new if n is first else n for n in graph.nodes if id(n) not in gone or n is first]


def _to_lookup(graph: Graph, first: Node, removed: list[Node], x: str, values: np.ndarray, yz: str, tag: str) -> None:
    """``first`` (with ``removed``) becomes one QLinearLookup of tensor ``x`` by the 256 output values (indexed by x's
    byte) ``values``, typed by the zero point ``yz``: the byte-table fusions' common end."""
    table = _const(graph, f"{first.name}.{tag}", np.ascontiguousarray(values).view(np.uint8))
    new = Node(first.name, "QLinearLookup", [x, table, yz], list(first.outputs), {}, "inferd")
    _replace(graph, first, removed, new)


def _bias_int32(graph: Graph, node: Node, b_name: str, x: _DQ, w: _DQ, prods: dict[str, Node]) -> np.ndarray | None:
    """The bias as int32 on the accumulator's scale x_scale * w_scale (what quantize_static writes; a float or
    differently scaled bias is requantised)."""
    acc_scale = (np.float32(x.scale.reshape(-1)[0]) * w.scale.reshape(-1)).astype(np.float32)
    bd = _dq(graph, b_name, prods)
    if bd is not None and bd.const:
        q = np.asarray(graph.constants[bd.q])
        if q.dtype == np.int32 and not np.any(bd.zp) and np.allclose(bd.scale.reshape(-1), acc_scale, rtol=1e-6, atol=0):
            return q.reshape(-1).astype(np.int32)
        bf = dequantize(q, bd.scale, bd.zp, bd.axis).reshape(-1)
    elif b_name in graph.constants:
        bf = np.asarray(graph.constants[b_name], np.float32).reshape(-1)
    else:
        return None
    return np.clip(np.rint(bf.astype(np.float64) / acc_scale), -2 ** 31, 2 ** 31 - 1).astype(np.int32)


def _fuse_gemmlike(graph: Graph, outputs: set[str]) -> int:
    n_fused = 0
    index = GraphIndex(graph)
    for node in [n for n in graph.nodes if n.op in ("Conv", "Gemm", "MatMul")]:
        prods, cons = index.get()
        if node.attr("act") or node.attr("residual") or node.attr("bias"):
            continue
        x = _dq(graph, node.inputs[0], prods)
        w = _dq(graph, node.inputs[1], prods) if len(node.inputs) > 1 else None
        if x is None or w is None or x.const or not w.const or not x.per_tensor or x.dtype not in INT8_TYPES \
                or w.dtype not in INT8_TYPES:
            continue
        act, q = _act_then_q(graph, node.outputs[0], outputs, cons)
        if q is None:
            continue
        wq = np.asarray(graph.constants[w.q])
        has_b = len(node.inputs) > 2 and bool(node.inputs[2])
        if node.op == "Conv":
            if wq.ndim != 4 or (not w.per_tensor and w.axis % wq.ndim != 0):
                continue
            w_arr, ws, wz = wq, w.scale, w.zp
        else:
            if wq.ndim != 2:
                continue
            trans_b = node.op == "Gemm" and int(node.attr("transB", 0))
            if node.op == "Gemm" and (int(node.attr("transA", 0)) or float(node.attr("alpha", 1.0)) != 1.0
                                      or float(node.attr("beta", 1.0)) != 1.0):
                continue
            out_axis = 0 if trans_b else 1
            if not w.per_tensor and w.axis % 2 != out_axis:
                continue
            w_arr = np.ascontiguousarray(wq.T) if trans_b else wq  # (K, N)
            ws, wz = w.scale, w.zp
        if not w.per_tensor and w.zp.size not in (1, w.scale.size):
            continue
        bias = _bias_int32(graph, node, node.inputs[2], x, w, prods) if has_b else None
        if has_b and bias is None:
            continue
        if node.op == "Gemm" and bias is not None and bias.size != w_arr.shape[1]:
            continue
        base = node.name
        ins = [x.q, x.scale_name, x.zp_name or _const(graph, f"{base}.x_zp", x.zp),
               _const(graph, f"{base}.w_q", w_arr) if w_arr is not wq else w.q,
               _const(graph, f"{base}.w_scale", ws.reshape(-1) if ws.size > 1 else ws.reshape(())),
               _const(graph, f"{base}.w_zp", wz.reshape(-1) if wz.size > 1 else wz.reshape(())),
               q.inputs[1], q.inputs[2]]
        attrs: dict[str, Any] = {k: v for k, v in node.attrs.items() if k not in ("transA", "transB", "alpha", "beta")}
        if bias is not None:
            ins.append(_const(graph, f"{base}.bias_i32", bias))
            if node.op != "Conv":
                attrs["bias"] = True
        clamp = _clamp(act, q, graph)
        if clamp is not None:
            attrs["qclamp"] = clamp
        attrs["_absorbed"] = [node.outputs[0]] + ([act.outputs[0]] if act is not None else [])
        new = Node(base, "QLinearConv" if node.op == "Conv" else "QLinearMatMul", ins, [q.outputs[0]], attrs)
        _replace(graph, node, [act, q], new)
        index.replaced(node, [act, q], new)
        n_fused += 1
    return n_fused


def _same_qparams(graph: Graph, q: Node, dq: _DQ) -> bool:
    qs, qz = graph.constants[q.inputs[1]], graph.constants[q.inputs[2]]
    return (np.asarray(qz).dtype == dq.dtype and float(np.asarray(qs).reshape(-1)[0]) == float(dq.scale.reshape(-1)[0])
            and int(np.asarray(qz).reshape(-1)[0]) == int(dq.zp.reshape(-1)[0]))


def _fuse_split(graph: Graph, node: Node, outputs: set[str], prods: dict[str, Node], cons: dict[str, list[Node]]) -> int:
    """DQ -> Split -> Q per output, all with the input's scale and zero point: the Split on the integers."""
    dq = _dq(graph, node.inputs[0], prods)
    if dq is None or dq.const or not dq.per_tensor or dq.dtype not in INT8_TYPES:
        return 0
    qs = [_q_after(graph, o, outputs, cons) if o else None for o in node.outputs]
    if any(o and (q is None or not _same_qparams(graph, q, dq)) for o, q in zip(node.outputs, qs)):
        return 0
    new = Node(node.name, node.op, [dq.q] + node.inputs[1:], [q.outputs[0] if q is not None else "" for q in qs],
               dict(node.attrs), node.domain)
    new.attrs["_absorbed"] = [o for o in node.outputs if o]
    _replace(graph, node, [q for q in qs if q is not None], new)
    return 1


def _fuse_elementwise(graph: Graph, outputs: set[str]) -> int:
    n_fused = 0
    index = GraphIndex(graph)
    for node in [n for n in graph.nodes if n.op in ("Add", "Mul", "Concat", "GlobalAveragePool", "Sigmoid",
                                                   "LeakyRelu") or n.op in _PASS]:
        if not index.holds(node) or node.attr("act"):
            continue
        prods, cons = index.get()
        outs = [o for o in node.outputs if o]
        if len(outs) > 1 and node.op == "Split":
            split = _fuse_split(graph, node, outputs, prods, cons)
            index.stale = index.stale or split > 0
            n_fused += split
            continue
        if len(outs) != 1:
            continue
        if node.op in ("Add", "Mul"):
            act, q = _act_then_q(graph, outs[0], outputs, cons)
            if act is not None and (act.op != "Relu" or node.op != "Add"):
                continue
        else:
            act, q = None, _q_after(graph, outs[0], outputs, cons)
        if q is None:
            continue
        if node.op in _PASS:
            dq = _dq(graph, node.inputs[0], prods)
            if dq is None or dq.const or not dq.per_tensor or dq.dtype not in INT8_TYPES:
                continue
            qs, qz = graph.constants[q.inputs[1]], graph.constants[q.inputs[2]]
            if (np.asarray(qz).dtype != dq.dtype or float(np.asarray(qs).reshape(-1)[0]) != float(dq.scale.reshape(-1)[0])
                    or int(np.asarray(qz).reshape(-1)[0]) != int(dq.zp.reshape(-1)[0])):
                continue
            new = Node(node.name, node.op, [dq.q] + node.inputs[1:], [q.outputs[0]], dict(node.attrs), node.domain)
            new.attrs["_absorbed"] = [outs[0]]
            _replace(graph, node, [q], new)
            index.replaced(node, [q], new)
            n_fused += 1
            continue
        srcs = [_dq(graph, i, prods) for i in node.inputs if i]
        if any(s is None or not s.per_tensor or s.dtype not in INT8_TYPES for s in srcs):
            continue
        ins_q = []
        for s in srcs:
            assert s is not None
            zp = s.zp_name or _const(graph, f"{node.name}.{s.q}.zp", s.zp.reshape(()))
            ins_q.append((s.q, s.scale_name, zp))
        attrs: dict[str, Any] = {"_absorbed": [outs[0]]}
        if node.op in ("Add", "Mul"):
            if len(srcs) != 2:
                continue
            ins = [*ins_q[0], *ins_q[1], q.inputs[1], q.inputs[2]]
            op = "QLinearAdd" if node.op == "Add" else "QLinearMul"
            clamp = _clamp(act, q, graph)
            if clamp is not None:
                attrs["qclamp"] = clamp
        elif node.op == "Concat":
            ins = [q.inputs[1], q.inputs[2]] + [v for t in ins_q for v in t]
            op = "QLinearConcat"
            attrs["axis"] = int(node.attr("axis"))
        elif node.op == "GlobalAveragePool":
            ins = [*ins_q[0], q.inputs[1], q.inputs[2]]
            op = "QLinearGlobalAveragePool"
        else:
            ins = [*ins_q[0], q.inputs[1], q.inputs[2]]
            op = "QLinearSigmoid" if node.op == "Sigmoid" else "QLinearLeakyRelu"
            if node.op == "LeakyRelu":
                attrs["alpha"] = float(node.attr("alpha", 0.01))
        new = Node(node.name, op, ins, [q.outputs[0]], attrs, "com.microsoft")
        _replace(graph, node, [act, q], new)
        index.replaced(node, [act, q], new)
        n_fused += 1
    return n_fused


def _fold_leftover_dq(graph: Graph, outputs: set[str]) -> None:
    """Constant DequantizeLinear nodes no fusion took (a float op's quantised weights) fold to float constants."""
    cons = graph.consumers()
    for node in [n for n in graph.nodes if n.op == "DequantizeLinear"]:
        if not cons.get(node.outputs[0]) and node.outputs[0] not in outputs:
            graph.remove_node(node)  # its consumers were fused
            continue
        if all((not i) or i in graph.constants for i in node.inputs):
            ins = [graph.constants[i] if i else None for i in node.inputs]
            val = dequantize(ins[0], ins[1], ins[2] if len(ins) > 2 else None, int(node.attr("axis", 1)))
            graph.set_const(node.outputs[0], val)
            graph.remove_node(node)


def check_quantised(graph: Graph) -> None:
    """A quantised graph inferd cannot express fails here: QDQ parameters that are not constants."""
    for node in graph.nodes:
        if node.op in ("QuantizeLinear", "DequantizeLinear"):
            for i in node.inputs[1:]:
                if i and i not in graph.constants:
                    raise UnsupportedOpError(node.op, node.name, graph.opset,
                                             f"pattern: {node.op} with a run-time {'scale' if i == node.inputs[1] else 'zero point'} "
                                             f"({i!r}); only constant quantisation parameters are supported")


def fuse_quantized(graph: Graph, outputs: set[str]) -> None:
    """Every QDQ rewrite above, repeated until nothing changes (a fusion can expose the next), then SiLU."""
    try:
        _fuse_all(graph, outputs)
        _fuse_qsilu(graph, outputs)
        _fuse_qconst_binary(graph)
        _fuse_qunary_chain(graph, outputs)
    finally:
        mark_symmetric(graph)


def _fuse_qsilu(graph: Graph, outputs: set[str]) -> int:
    """QLinearSigmoid(x) then QLinearMul(x, that) (or (that, x)), the sigmoid's output read by the Mul alone: one
    ``QLinearLookup`` whose table is the two ops' oracles run on every byte of x, so bit-identical to running both
    (EfficientNet's SiLU: 49 of its 65 sigmoid/multiply pairs, two passes over the tensor and a float multiply per
    element where a byte lookup does)."""
    from ..ops.base import op_spec

    sigmoid, times = op_spec("QLinearSigmoid"), op_spec("QLinearMul")
    assert sigmoid is not None and times is not None
    n_fused = 0
    prods, cons = graph.producers(), graph.consumers()
    for mul in [n for n in graph.nodes if n.op == "QLinearMul"]:
        ins = mul.inputs
        if len(ins) < 8 or any(not ins[i] or ins[i] not in graph.constants for i in (1, 2, 4, 5, 6, 7)):
            continue
        for side in (0, 3):
            sig = prods.get(ins[side])
            other = ins[3 - side]
            if (sig is None or sig.op != "QLinearSigmoid" or sig.inputs[0] != other or ins[side] in outputs
                    or len(cons.get(ins[side], [])) != 1 or len(sig.inputs) < 5
                    or any(not sig.inputs[i] or sig.inputs[i] not in graph.constants for i in (1, 2, 3, 4))):
                continue
            # every byte of x through both ops, by their oracles: the table, indexed by x's byte
            sp = [graph.constants[i] for i in sig.inputs[1:5]]
            x = np.arange(256, dtype=np.uint8).view(np.asarray(sp[1]).dtype)
            s = sigmoid.reference(sig, [x, *sp])[0]
            m = [s if i == side else x if i == 3 - side else graph.constants[ins[i]] for i in range(8)]
            _to_lookup(graph, mul, [sig], other, times.reference(mul, m)[0], ins[7], "silu_table")
            n_fused += 1
            break
    if n_fused:
        log.info("model %s: %d quantised SiLU (QLinearSigmoid, QLinearMul) fused into byte tables", graph.name,
                 n_fused)
    return n_fused


def _fuse_qconst_binary(graph: Graph) -> int:
    """QLinearAdd / QLinearMul of a tensor and a constant scalar (a transformer's GELU adds 1 and halves, its
    attention scales the scores): a function of x's byte alone, so one ``QLinearLookup`` whose table is the op's
    oracle run on every byte of x, bit-identical to the op (a byte lookup where the op dequantised both sides per
    element; on vit_tiny its 36 such nodes took ~9 ms of a 28 ms run on the numpy oracle)."""
    from ..ops.base import op_spec

    n_fused = 0
    for node in [n for n in graph.nodes if n.op in ("QLinearAdd", "QLinearMul")]:
        ins = node.inputs
        if len(ins) < 8 or any(not ins[i] or ins[i] not in graph.constants for i in (1, 2, 4, 5, 6, 7)):
            continue
        for side in (0, 3):  # the constant operand
            other = 3 - side
            c = graph.constants.get(ins[side])
            # a 0-d constant leaves the other operand's shape as the output's, whatever its rank
            if c is None or np.ndim(c) != 0 or ins[other] in graph.constants:
                continue
            spec = op_spec(node.op)
            assert spec is not None
            x = np.arange(256, dtype=np.uint8).view(np.asarray(graph.constants[ins[other + 2]]).dtype)
            vals = [x if i == other else graph.constants[ins[i]] for i in range(8)]
            _to_lookup(graph, node, [], ins[other], spec.reference(node, vals)[0], ins[7], "const_table")
            n_fused += 1
            break
    if n_fused:
        log.info("model %s: %d quantised binary ops with a constant scalar made byte tables", graph.name, n_fused)
    return n_fused


#: float ops a chain between a DequantizeLinear and a QuantizeLinear may hold: elementwise, each output element a
#: function of the same element of its one tensor input (the other inputs 0-d or one-element constants)
_CHAIN_OPS = frozenset({"Abs", "Add", "Celu", "Clip", "Div", "Elu", "Erf", "Exp", "Gelu", "HardSigmoid", "HardSwish",
                        "Identity", "LeakyRelu", "Log", "Mish", "Mul", "Neg", "Pow", "Reciprocal", "Relu", "Selu",
                        "Sigmoid", "Softplus", "Softsign", "Sqrt", "Sub", "Tanh", "ThresholdedRelu"})


def _fuse_qunary_chain(graph: Graph, outputs: set[str]) -> int:
    """DequantizeLinear(x) -> elementwise float ops -> QuantizeLinear, every parameter constant and per tensor: the
    chain is a function of x's byte, so one ``QLinearLookup`` whose table is the chain's oracles run on every byte
    (a transformer's GELU, x / sqrt(2) -> Erf between Q/DQ pairs: three float passes over the tensor where a byte
    lookup does). Bit-identical to the chain on the numpy oracles; the DequantizeLinear stays for other readers."""
    from ..ops.base import op_spec

    n_fused = 0
    index = GraphIndex(graph)  # built again after each fusion only
    for q in [n for n in graph.nodes if n.op == "QuantizeLinear"]:
        if (not index.holds(q) or len(q.inputs) < 3 or not q.inputs[2]
                or any(i not in graph.constants or graph.constants[i].size != 1 for i in q.inputs[1:3])):
            continue
        prods, cons = index.get()
        chain: list[Node] = []
        t = q.inputs[0]
        dq = None
        while True:
            p = prods.get(t)
            if p is None or t in outputs:
                break
            if p.op == "DequantizeLinear":
                dq = p
                break
            if len(cons.get(t, [])) != 1:
                break
            tensors = [i for i in p.inputs if i and i not in graph.constants]
            if (p.op not in _CHAIN_OPS or len(tensors) != 1 or len([o for o in p.outputs if o]) != 1
                    or any(i and i in graph.constants and graph.constants[i].size != 1 for i in p.inputs)):
                break
            chain.append(p)
            t = tensors[0]
        if (dq is None or not chain or dq.inputs[0] in graph.constants or len(dq.inputs) < 3 or not dq.inputs[2]
                or any(i not in graph.constants or graph.constants[i].size != 1 for i in dq.inputs[1:3])):
            continue
        # the chain's ops broadcast their one-element constants: the result keeps x's shape (as the table
        # lookup does) only if no constant has more dimensions than x
        xinfo = graph.infos.get(dq.inputs[0])
        if xinfo is None or xinfo.shape is None:
            continue
        rank = len(xinfo.shape)
        if any(i in graph.constants and np.ndim(graph.constants[i]) > rank for n in chain for i in n.inputs if i):
            continue
        xdt = np.asarray(graph.constants[dq.inputs[2]]).dtype
        ydt = np.asarray(graph.constants[q.inputs[2]]).dtype
        if np.dtype(xdt) not in INT8_TYPES or np.dtype(ydt) not in INT8_TYPES:
            continue
        v = np.arange(256, dtype=np.uint8).view(xdt)
        try:
            v = dequantize(v, graph.constants[dq.inputs[1]], graph.constants[dq.inputs[2]])
            for n in reversed(chain):
                spec = op_spec(n.op)
                assert spec is not None
                ins = [None if not i else graph.constants[i] if i in graph.constants else v for i in n.inputs]
                v = np.asarray(spec.reference(n, ins)[0])
            v = quantize(np.asarray(v, np.float32), graph.constants[q.inputs[1]], graph.constants[q.inputs[2]], ydt)
        except Exception:  # an oracle that does not take a 256-element vector: the chain stays as it is
            continue
        if np.shape(v) != (256,):
            continue
        _to_lookup(graph, q, chain, dq.inputs[0], v, q.inputs[2], "chain_table")
        index.stale = True
        if not index.get()[1].get(dq.outputs[0]) and dq.outputs[0] not in outputs:
            graph.remove_node(dq)
            index.stale = True
        n_fused += 1
    if n_fused:
        log.info("model %s: %d chains of float ops between Q/DQ pairs made byte tables", graph.name, n_fused)
    return n_fused


def mark_symmetric(graph: Graph) -> None:
    """``attrs["w_zp0"]``: the weights of a QLinearConv / QLinearMatMul have constant zero points of 0, which the
    native int8 kernels need (kernel selection sees shapes, not values)."""
    for node in graph.nodes:
        if node.op in ("QLinearConv", "QLinearMatMul"):
            z = node.inputs[5] if len(node.inputs) > 5 else ""
            node.attrs["w_zp0"] = (not z) or (z in graph.constants and not np.any(graph.constants[z]))


def _fuse_all(graph: Graph, outputs: set[str]) -> None:
    if not any(n.op in ("QuantizeLinear", "DequantizeLinear") for n in graph.nodes):
        return
    check_quantised(graph)
    total = 0
    for _ in range(4):
        n = _fuse_gemmlike(graph, outputs) + _fuse_elementwise(graph, outputs)
        total += n
        if not n:
            break
    _fold_leftover_dq(graph, outputs)
    left = sum(1 for n in graph.nodes if n.op in ("QuantizeLinear", "DequantizeLinear"))
    log.info("model %s: %d quantised patterns fused into integer ops; %d Q/DQ nodes left as float steps",
             graph.name, total, left)
