"""Recurrent ops: LSTM, GRU and RNN with ONNX's full semantics.

Every attribute and optional input: ``direction`` forward / reverse / bidirectional, ``layout`` 0
(time-major: X (seq, batch, in), Y (seq, dirs, batch, H), states (dirs, batch, H)) and 1 (batch-major:
X (batch, seq, in), Y (batch, seq, dirs, H), states (batch, dirs, H)), ``sequence_lens`` (steps past a
batch item's length leave its state alone and write zeros to Y; a reverse direction walks each item from
its own last valid step), initial states, LSTM peepholes ``P`` and ``input_forget`` (f = 1 - i),
GRU ``linear_before_reset``, ``clip`` (of every gate's pre-activation) and the activation lists with
their alpha/beta lists, consumed in order as onnxruntime does.

Gate orders are ONNX's: LSTM i, o, f, c (peepholes i, o, f); GRU z, r, h; RNN one gate.

com.microsoft's DynamicQuantizeLSTM (what onnxruntime's ``quantize_dynamic`` makes of an LSTM) is the LSTM with
int8/uint8 W (dirs, in, 4H) and R (dirs, H, 4H) and their scales: each projection quantises its float operand
to uint8 over the whole operand (all of X once; h at every step), multiplies in integers and scales the int32
sums back, as onnxruntime's quantised GEMM does; the gates are the LSTM's.

``reference`` is the numpy oracle (a step loop vectorised over the batch). The CPU kernel splits the work
the way the cost does: the input projection of every time step and both directions is ONE packed GEMM
(``X (seq*batch, in) @ [W_fwd; W_rev]^T`` with W's bias and, where it is constant per gate, R's bias folded
into the GEMM's bias; weights packed at load by ``transform``), then the recurrence walks the steps in native
C (``inferd_rnn_dir``: per step ``h @ R^T`` plus the gate maths; ``R^T`` laid out at load too); the two
directions of a bidirectional layer run at once on two pool threads (``inferd_rnn_bidir``).
"""
from __future__ import annotations

from typing import Any, Callable, ClassVar, Mapping, Sequence

import numpy as np

from .. import native
from ..native import ACTS, Act, apply_act  # the activation codes the native step understands
from ..errors import ShapeError, UnsupportedOpError
from ..ir import Node, TensorInfo
from .base import Kernel, Layer, OpSpec, full_inputs, raw_key, register_kernel, register_op, weights_key

RNN_OPS = ("LSTM", "GRU", "RNN")
DQ_LSTM = "DynamicQuantizeLSTM"
#: gates per op
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1, DQ_LSTM: 4}
#: activations per direction, and their defaults
N_ACTS = {"LSTM": 3, "GRU": 2, "RNN": 1, DQ_LSTM: 3}
DEFAULT_ACTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"],
                DQ_LSTM: ["Sigmoid", "Tanh", "Tanh"]}
#: inputs after X, W, R, B, sequence_lens, initial_h (DynamicQuantizeLSTM: ... P, W/R scales and zero points)
MAX_INPUTS = {"LSTM": 8, "GRU": 6, "RNN": 6, DQ_LSTM: 12}



def _str(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def num_dirs(node: Node) -> int:
    return 2 if _str(node.attr("direction", "forward")) == "bidirectional" else 1


def activations(node: Node) -> list[list[Act]]:
    """Per direction, the op's activations as (lower-case name, alpha, beta). A bidirectional op given only one
    direction's list uses it for both (onnxruntime requires both; exporters always write both)."""
    n, dirs = N_ACTS[node.op], num_dirs(node)
    names = [_str(a) for a in (node.attr("activations") or [])]
    if not names:
        names = DEFAULT_ACTS[node.op] * dirs
    elif len(names) == n and dirs == 2:
        names = names * 2
    if len(names) != n * dirs:
        raise UnsupportedOpError(node.op, node.name, detail=f"{len(names)} activations for {dirs} direction(s); "
                                                            f"expected {n * dirs}")
    alphas = [float(a) for a in (node.attr("activation_alpha") or [])]
    betas = [float(b) for b in (node.attr("activation_beta") or [])]
    ai = bi = 0
    out: list[Act] = []
    for name in names:
        key = name.lower()
        if key not in ACTS:
            raise UnsupportedOpError(node.op, node.name, detail=f"activation {name!r} is not supported "
                                                                f"(supported: {sorted(ACTS)})")
        _code, ua, ub, da, db = ACTS[key]
        a, b = da, db
        if ua:
            if ai < len(alphas):
                a = alphas[ai]
            ai += 1
        if ub:
            if bi < len(betas):
                b = betas[bi]
            bi += 1
        out.append((key, a, b))
    return [out[d * n:(d + 1) * n] for d in range(dirs)]


def _check(node: Node, opset: int) -> None:
    if node.attr("hidden_size") is None:
        raise UnsupportedOpError(node.op, node.name, opset, "attribute hidden_size is required")
    d = _str(node.attr("direction", "forward"))
    if d not in ("forward", "reverse", "bidirectional"):
        raise UnsupportedOpError(node.op, node.name, opset, f"direction {d!r}")
    if int(node.attr("layout", 0)) not in (0, 1):
        raise UnsupportedOpError(node.op, node.name, opset, f"layout {node.attr('layout')}")
    if len(node.inputs) > MAX_INPUTS[node.op]:
        raise UnsupportedOpError(node.op, node.name, opset, f"{len(node.inputs)} inputs")
    activations(node)


def split_weights(layer: Layer, raw: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """W (dirs, G*H, in), R (dirs, G*H, H) as float32, the bias the input projection adds (W's and R's,
    (dirs, G*H)) and the R bias the recurrent step must add itself (GRU's h gate only, else zeros), for the
    CPU and the Vulkan kernels alike."""
    w = np.asarray(raw[raw_key(1)], np.float32)
    r = np.asarray(raw[raw_key(2)], np.float32)
    dirs, gh, _ = w.shape
    h = gh // GATES[layer.op]
    b = np.asarray(raw[raw_key(3)], np.float32) if raw_key(3) in raw else np.zeros((dirs, 2 * gh), np.float32)
    wb, rb = b[:, :gh].copy(), b[:, gh:].copy()
    step_rb = np.zeros_like(rb)
    if layer.op == "GRU":
        # R's h-gate bias sits inside r * (...) (linear_before_reset) or after (r * h) @ R_h^T: the step adds it
        step_rb[:, 2 * h:] = rb[:, 2 * h:]
        rb[:, 2 * h:] = 0
    return w, r, wb + rb, step_rb


def dims(node: Node, x_shape: Sequence[int]) -> tuple[int, int, int, int, int]:
    """(seq, batch, input size, hidden, directions) of ``node`` on an X of ``x_shape``."""
    if len(x_shape) != 3:
        raise ShapeError(f"node {node.name!r} ({node.op}): X must have rank 3, has shape {list(x_shape)}")
    layout = int(node.attr("layout", 0))
    seq, batch = (x_shape[0], x_shape[1]) if layout == 0 else (x_shape[1], x_shape[0])
    return int(seq), int(batch), int(x_shape[2]), int(node.attr("hidden_size")), num_dirs(node)


def _infer(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    x = ins[0]
    if x is None or len(ins) < 3 or ins[1] is None or ins[2] is None:
        raise ShapeError(f"node {node.name!r} ({node.op}): needs X, W and R")
    seq, batch, isz, h, dirs = dims(node, x.shape)
    g = GATES[node.op]
    w, r = ins[1], ins[2]
    if tuple(w.shape) != (dirs, g * h, isz) or tuple(r.shape) != (dirs, g * h, h):
        raise ShapeError(f"node {node.name!r} ({node.op}): W {list(w.shape)} / R {list(r.shape)} do not fit "
                         f"{dirs} direction(s), hidden {h}, input {isz} (expected {[dirs, g * h, isz]} / {[dirs, g * h, h]})")
    if len(ins) > 3 and ins[3] is not None and tuple(ins[3].shape) != (dirs, 2 * g * h):
        raise ShapeError(f"node {node.name!r} ({node.op}): B {list(ins[3].shape)}, expected {[dirs, 2 * g * h]}")
    layout = int(node.attr("layout", 0))
    state = (dirs, batch, h) if layout == 0 else (batch, dirs, h)
    for k in (5, 6):
        if len(ins) > k and ins[k] is not None and tuple(ins[k].shape) != state:
            raise ShapeError(f"node {node.name!r} ({node.op}): initial state {list(ins[k].shape)}, expected {list(state)}")
    if len(ins) > 7 and ins[7] is not None and tuple(ins[7].shape) != (dirs, 3 * h):
        raise ShapeError(f"node {node.name!r} ({node.op}): P {list(ins[7].shape)}, expected {[dirs, 3 * h]}")
    if len(ins) > 4 and ins[4] is not None and tuple(ins[4].shape) != (batch,):
        raise ShapeError(f"node {node.name!r} ({node.op}): sequence_lens {list(ins[4].shape)}, expected [{batch}]")
    dt = np.dtype(x.dtype)
    y = (seq, dirs, batch, h) if layout == 0 else (batch, seq, dirs, h)
    outs = [(y, dt), (state, dt)]
    if node.op in ("LSTM", DQ_LSTM):
        outs.append((state, dt))
    return outs[:len(node.outputs)]


# ----------------------------------------------------------------------------------------------- the oracle

def _state(a: np.ndarray | None, layout: int, dirs: int, batch: int, h: int, dt: np.dtype) -> np.ndarray:
    """(dirs, batch, H) copy of an initial state in either layout (zeros when absent)."""
    if a is None:
        return np.zeros((dirs, batch, h), dt)
    a = np.asarray(a, dt)
    return np.array(a if layout == 0 else a.transpose(1, 0, 2))


def seq_lens(node: Node, lens: np.ndarray | None, seq: int, batch: int) -> np.ndarray:
    if lens is None:
        return np.full(batch, seq, np.int64)
    lens = np.asarray(lens).astype(np.int64).reshape(-1)
    if lens.size != batch or (lens < 0).any() or (lens > seq).any():
        raise ShapeError(f"node {node.name!r} ({node.op}): sequence_lens {lens.tolist()} do not fit "
                         f"{batch} items of at most {seq} steps")
    return lens


Proj = Callable[[int, np.ndarray], np.ndarray]


def _reference(node: Node, inputs: list[np.ndarray | None], xproj: Proj | None = None,
               hproj: Proj | None = None) -> list[np.ndarray]:
    """``xproj(d, X)`` / ``hproj(d, h)``: direction d's input and recurrent projections without bias (default
    the float ``X @ W_d^T`` and ``h @ R_d^T``; DynamicQuantizeLSTM's are quantised)."""
    op = "LSTM" if node.op == DQ_LSTM else node.op
    get = lambda i: inputs[i] if i < len(inputs) else None  # noqa: E731
    x = np.asarray(inputs[0])
    dt = x.dtype
    seq, batch, _isz, h, dirs = dims(node, x.shape)
    layout = int(node.attr("layout", 0))
    xs = x if layout == 0 else x.transpose(1, 0, 2)  # (seq, batch, in)
    g = GATES[op]
    w, r = (None, None) if xproj is not None else (np.asarray(get(1), dt), np.asarray(get(2), dt))
    if xproj is None:
        xproj = lambda d, v: v @ w[d].T  # noqa: E731
        hproj = lambda d, v: v @ r[d].T  # noqa: E731
    assert hproj is not None
    b = np.asarray(get(3), dt) if get(3) is not None else np.zeros((dirs, 2 * g * h), dt)
    lens = seq_lens(node, get(4), seq, batch)
    hs = _state(get(5), layout, dirs, batch, h, dt)
    cs = _state(get(6) if op == "LSTM" else None, layout, dirs, batch, h, dt)
    p = np.asarray(get(7), dt) if op == "LSTM" and get(7) is not None else np.zeros((dirs, 3 * h), dt)
    clip = node.attr("clip")
    clip = None if clip is None else float(clip)
    input_forget = bool(node.attr("input_forget", 0))
    lbr = bool(node.attr("linear_before_reset", 0))
    acts = activations(node)
    direction = _str(node.attr("direction", "forward"))
    y = np.zeros((seq, dirs, batch, h), dt)
    ar = np.arange(batch)

    def cl(v: np.ndarray) -> np.ndarray:
        return np.clip(v, -clip, clip) if clip is not None else v

    for d in range(dirs):
        reverse = direction == "reverse" or d == 1
        rd = r[d] if r is not None else None
        wb, rb = b[d, :g * h], b[d, g * h:]
        xw = xproj(d, xs) + wb  # (seq, batch, G*H)
        hh, cc = hs[d], cs[d]
        f, gg, hf = (acts[d] + [None, None])[:3]
        for t in range(seq):
            valid = t < lens
            tt = np.where(valid, lens - 1 - t if reverse else t, 0)
            xt = xw[tt, ar]  # (batch, G*H): each item at its own time index
            if op == "RNN":
                hn = apply_act(cl(xt + hproj(d, hh) + rb), f)
                cn = cc
            elif op == "GRU":
                hr = hproj(d, hh)  # (batch, 3H)
                z = apply_act(cl(xt[:, :h] + hr[:, :h] + rb[:h]), f)
                rr = apply_act(cl(xt[:, h:2 * h] + hr[:, h:2 * h] + rb[h:2 * h]), f)
                if lbr:
                    pre = xt[:, 2 * h:] + rr * (hr[:, 2 * h:] + rb[2 * h:])
                else:
                    assert rd is not None  # GRU has no quantised form
                    pre = xt[:, 2 * h:] + (rr * hh) @ rd[2 * h:].T + rb[2 * h:]
                hc = apply_act(cl(pre), gg)
                hn = (1 - z) * hc + z * hh
                cn = cc
            else:
                pre = xt + hproj(d, hh) + rb  # i, o, f, c
                i = apply_act(cl(pre[:, :h] + p[d, :h] * cc), f)
                if input_forget:
                    fo = 1 - i
                else:
                    fo = apply_act(cl(pre[:, 2 * h:3 * h] + p[d, 2 * h:] * cc), f)
                c_ = apply_act(cl(pre[:, 3 * h:]), gg)
                cn = fo * cc + i * c_
                o = apply_act(cl(pre[:, h:2 * h] + p[d, h:2 * h] * cn), f)
                hn = o * apply_act(cn, hf)
            m = valid[:, None]
            hh = np.where(m, hn, hh).astype(dt)
            cc = np.where(m, cn, cc).astype(dt)
            y[tt[valid], d, ar[valid]] = hh[valid]
        hs[d], cs[d] = hh, cc
    if layout == 0:
        outs = [y, hs, cs]
    else:
        outs = [y.transpose(2, 0, 1, 3), hs.transpose(1, 0, 2), cs.transpose(1, 0, 2)]
    outs = [np.ascontiguousarray(o) for o in outs]
    return [o for o, name in zip(outs, node.outputs)]


for _op in RNN_OPS:
    register_op(OpSpec(_op, _infer, _reference, min_opset=7, check=_check))


# ----------------------------------------------------------------------------------- DynamicQuantizeLSTM

def _dq_params(node: Node, ins: list, d: int, which: str) -> tuple[np.ndarray, np.ndarray]:
    """Direction d's scales (one, or one per of the 4H columns) and the zero point of W or R."""
    si, zi = (8, 9) if which == "W" else (10, 11)
    dirs = num_dirs(node)
    s = np.asarray(ins[si], np.float32).reshape(dirs, -1)[d]
    z = ins[zi] if len(ins) > zi and ins[zi] is not None else None
    zp = np.zeros((), np.int64) if z is None else np.asarray(z).reshape(dirs, -1)[d][0].astype(np.int64)
    return s, zp


def _dq_zero_points_uniform(node: Node, z: np.ndarray | None, name: str) -> None:
    # onnxruntime's quantised GEMM takes one zero point per matrix: a per-column one would be read as its first
    if z is not None and np.asarray(z).size and not (np.asarray(z) == np.asarray(z).reshape(-1)[0]).all():
        raise UnsupportedOpError(DQ_LSTM, node.name, detail=f"{name} differs between columns (one zero point per "
                                                            f"matrix is supported, as in onnxruntime)")


def _dq_infer(node: Node, ins: list[TensorInfo | None], consts: dict[str, np.ndarray]) -> list:
    x, w, r = (ins + [None] * 3)[:3]
    if x is None or w is None or r is None or len(ins) < 11 or ins[8] is None or ins[10] is None:
        raise ShapeError(f"node {node.name!r} ({DQ_LSTM}): needs X, W, R, W_scale and R_scale")
    seq, batch, isz, h, dirs = dims(node, x.shape)
    for name, t, want in (("W", w, (dirs, isz, 4 * h)), ("R", r, (dirs, h, 4 * h))):
        if tuple(t.shape) != want:
            raise ShapeError(f"node {node.name!r} ({DQ_LSTM}): {name} {list(t.shape)}, expected {list(want)}")
        if np.dtype(t.dtype) not in (np.dtype(np.int8), np.dtype(np.uint8)):
            raise UnsupportedOpError(DQ_LSTM, node.name, detail=f"{name} of type {np.dtype(t.dtype)} (int8/uint8)")
    for k, name in ((9, "W_zero_point"), (11, "R_zero_point")):
        if len(node.inputs) > k and node.inputs[k]:
            _dq_zero_points_uniform(node, consts.get(node.inputs[k]), name)
    as_lstm = list(ins[:8]) + [None] * (8 - len(ins[:8]))
    fake_w = TensorInfo(w.name, (dirs, 4 * h, isz), np.float32)
    fake_r = TensorInfo(r.name, (dirs, 4 * h, h), np.float32)
    as_lstm[1], as_lstm[2] = fake_w, fake_r
    return _infer(node, as_lstm, consts)


def _dq_reference(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    from .quant import dynamic_qparams, int_matmul, quantize

    ins = list(inputs) + [None] * (12 - len(inputs))
    for k, name in ((9, "W_zero_point"), (11, "R_zero_point")):
        _dq_zero_points_uniform(node, ins[k], name)

    def qgemm(a2: np.ndarray, wq: np.ndarray, s: np.ndarray, zp: np.ndarray) -> np.ndarray:
        sa, za = dynamic_qparams(a2)
        acc = int_matmul(quantize(a2, sa, za, np.dtype(np.uint8)), za, wq, zp)
        return acc.astype(np.float32) * (np.float32(sa) * s)  # float(int32 sum) * (a_scale * w_scale), per column

    def project(which: str, wq: np.ndarray, per_row: bool) -> Proj:
        def f(d: int, a: np.ndarray) -> np.ndarray:
            s, zp = _dq_params(node, ins, d, which)
            a2 = np.asarray(a, np.float32).reshape(-1, a.shape[-1])
            if per_row:
                y = np.concatenate([qgemm(a2[i:i + 1], wq[d], s, zp) for i in range(a2.shape[0])])
            else:
                y = qgemm(a2, wq[d], s, zp)
            return y.reshape(a.shape[:-1] + (y.shape[-1],))
        return f

    # X is quantised once as a whole; h at every step per batch item. onnxruntime quantises h per group of rows
    # that one of its threads steps (the batch split over its thread count): one row per group is what it does
    # at batch 1 and with as many threads as items, exact to 1e-7 there, and the finest (most accurate) grouping
    x = np.asarray(ins[0], np.float32)
    return _reference(node, [x] + ins[1:8], project("W", np.asarray(ins[1]), False),
                      project("R", np.asarray(ins[2]), True))


register_op(OpSpec(DQ_LSTM, _dq_infer, _dq_reference, check=_check,
                   notes="com.microsoft (onnxruntime's quantize_dynamic of an LSTM); numpy kernel"))


# ----------------------------------------------------------------------------------------------- the CPU kernels

def _const(layer: Layer, i: int) -> bool:
    return i in layer.const_inputs


class _RecurrentBase(Kernel):
    ops: ClassVar[tuple[str, ...]] = RNN_OPS

    @staticmethod
    def shape(layer: Layer) -> tuple[int, int, int, int, int, int]:
        seq, batch, isz, h, dirs = dims(layer.node, layer.in_shape(0))
        return seq, batch, isz, h, dirs, GATES[layer.op]


@register_kernel
class RecurrentReferenceKernel(_RecurrentBase):
    """The numpy oracle as a kernel (any dtype, weights at run time): what the fast kernels are tested against."""

    name = "reference"
    priority = 100

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        oracle = _dq_reference if layer.op == DQ_LSTM else _reference
        res = oracle(layer.node, full_inputs(layer, inputs, params))
        present = [r for r, name in zip(res, layer.node.outputs) if name]
        for o, r in zip(outputs, present):
            np.copyto(o, r)


@register_kernel
class DynamicQuantizeLSTMKernel(RecurrentReferenceKernel):
    """DynamicQuantizeLSTM by its oracle: the uint8 quantisation of h at every step is data-dependent, so the
    float step loop in C does not apply."""

    ops: ClassVar[tuple[str, ...]] = (DQ_LSTM,)


@register_kernel
class RecurrentPackedKernel(_RecurrentBase):
    """Float32 with constant W, R (and B, P): one packed GEMM for the input projection of every step of every
    direction, then the steps in C.

    ``transform``: ``w`` the packed ``[W_0; W_1]^T`` (in, dirs*G*H) with its bias (W's bias plus R's where it
    adds straight to a gate: all but GRU's h gate with linear_before_reset), ``rt`` per direction R^T (H, G*H)
    row-major, ``rb`` R's bias left for the step (GRU's h gate), ``p`` peepholes.
    Workspace: the projections (seq*batch, dirs*G*H), per-step gate scratch, and the states in (dirs, batch, H)."""

    name = "rnn_packed"
    priority = 5

    def applies(self, layer: Layer) -> bool:
        x = layer.inputs[0]
        if x is None or np.dtype(x.dtype) != np.float32 or 0 in layer.const_inputs:
            return False
        # the weights must be constants to be packed at load; sequence_lens and states may be either
        return all(_const(layer, i) for i in (1, 2)) and all(
            _const(layer, i) for i in (3, 7) if layer.has_input(i))

    def transform_key(self, layer: Layer) -> tuple[Any, ...]:
        return weights_key(layer)  # packed from the weights alone: any sequence length shares them

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        w, r, bias, step_rb = split_weights(layer, raw)
        dirs, gh, isz = w.shape
        bias = bias.reshape(-1)
        out = {"w": native.gemm_pack_b(w.reshape(dirs * gh, isz).T), "bias": np.ascontiguousarray(bias),
               "rt": np.ascontiguousarray(r.transpose(0, 2, 1)),  # (dirs, H, G*H)
               "rb": np.ascontiguousarray(step_rb)}
        if layer.op == "LSTM" and raw_key(7) in raw:
            out["p"] = np.ascontiguousarray(np.asarray(raw[raw_key(7)], np.float32))
        for k in (4, 5, 6):  # constant lengths / initial states stay raw
            if raw_key(k) in raw:
                out[raw_key(k)] = np.asarray(raw[raw_key(k)])
        return out

    def transformed_nbytes(self, layer: Layer) -> int:
        seq, batch, isz, h, dirs, g = self.shape(layer)
        p, kk, nbp = native.gemm_packed_b_shape(isz, dirs * g * h)
        n = p * kk * nbp + dirs * g * h + dirs * h * g * h + dirs * g * h
        if layer.op == "LSTM" and layer.has_input(7):
            n += dirs * 3 * h
        extra = sum(layer.inputs[k].nbytes for k in (4, 5, 6)  # type: ignore[union-attr]
                    if k in layer.const_inputs and layer.inputs[k] is not None)
        return 4 * n + extra

    def workspace_nbytes(self, layer: Layer) -> int:
        seq, batch, isz, h, dirs, g = self.shape(layer)
        return 4 * (seq * batch * dirs * g * h + dirs * (g + 2) * h + 2 * dirs * batch * h)

    def run(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
            outputs: Sequence[np.ndarray]) -> None:
        self._prepare(layer, inputs, params, outputs)()

    def bind(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
             outputs: Sequence[np.ndarray]) -> Callable[[], None] | None:
        return self._prepare(layer, inputs, params, outputs)

    def _prepare(self, layer: Layer, inputs: Sequence[np.ndarray | None], params: dict[str, np.ndarray],
                 outputs: Sequence[np.ndarray]) -> Callable[[], None]:
        """The run as one closure over these arrays: the workspace is allocated here, once per binding."""
        node = layer.node
        seq, batch, isz, h, dirs, g = self.shape(layer)
        layout = int(node.attr("layout", 0))
        gh = g * h
        x = inputs[0]
        assert x is not None
        xw = np.empty((seq, batch, dirs * gh), np.float32)  # time-major projections, both directions
        # ``outputs`` holds the present outputs only; an absent one ("") has no array
        outs = dict(zip([o for o in node.outputs if o], outputs))
        named = list(node.outputs) + ["", "", ""]
        y, yh, yc = (outs.get(named[k]) if named[k] else None for k in range(3))
        # the states live in Y_h / Y_c themselves where those are (dirs, batch, H) buffers: no copy out per run
        own_h = layout == 0 and yh is not None and yh.flags.c_contiguous and yh.shape == (dirs, batch, h)
        own_c = layout == 0 and yc is not None and yc.flags.c_contiguous and yc.shape == (dirs, batch, h)
        hs = yh if own_h else np.empty((dirs, batch, h), np.float32)
        cs = yc if own_c else np.empty((dirs, batch, h), np.float32)
        ws = np.empty(dirs * (g + 2) * h, np.float32)
        acts = activations(node)
        codes = np.array([[ACTS[a[0]][0] for a in ad] + [0] * (3 - len(ad)) for ad in acts], np.int32)
        alphas = np.array([[a[1] for a in ad] + [0.0] * (3 - len(ad)) for ad in acts], np.float32)
        betas = np.array([[a[2] for a in ad] + [0.0] * (3 - len(ad)) for ad in acts], np.float32)
        clip = node.attr("clip")
        clip_v = float(clip) if clip is not None else 0.0
        input_forget = int(node.attr("input_forget", 0))
        lbr = int(node.attr("linear_before_reset", 0))
        direction = _str(node.attr("direction", "forward"))
        kind = {"RNN": 0, "GRU": 1, "LSTM": 2}[layer.op]
        wpack, bias, rt, rb = params["w"], params["bias"], params["rt"], params["rb"]
        peep = params.get("p")

        def getin(i: int) -> np.ndarray | None:
            if not layer.has_input(i):
                return None
            return params[raw_key(i)] if inputs[i] is None else inputs[i]

        lens_src, h0_src, c0_src = getin(4), getin(5), getin(6) if layer.op == "LSTM" else None
        lens = np.full(batch, seq, np.int32)  # every item the whole sequence unless sequence_lens says otherwise
        x2 = None
        if layout == 0 and x.flags.c_contiguous:
            x2 = x.reshape(seq * batch, isz)
        xt = np.empty((seq, batch, isz), np.float32) if x2 is None else None
        linear = native.linear_bound(x2 if x2 is not None else xt.reshape(seq * batch, isz), wpack, dirs * gh,
                                     xw.reshape(seq * batch, dirs * gh), bias, None, 0, 0.0, 0.0)
        # Y in time-major (seq, dirs, batch, H); for layout 1 the rows are strided views of (batch, seq, dirs, H)
        yv = None if y is None else (y if layout == 0 else y.transpose(1, 2, 0, 3))  # (seq, dirs, batch, H) view
        both = native.rnn_bidir_bound(kind, seq, batch, h, xw, rt, rb, peep, lens, hs, cs, yv, codes, alphas, betas,
                                      clip_v, input_forget, lbr, ws) if dirs == 2 else None
        dir_calls = [both] if both is not None else []
        for d in range(dirs if both is None else 0):
            reverse = int(direction == "reverse" or d == 1)
            dir_calls.append(native.rnn_dir_bound(
                kind, seq, batch, h, xw[:, :, d * gh:(d + 1) * gh], rt[d], rb[d], None if peep is None else peep[d],
                lens, reverse, hs[d], cs[d], None if y is None else yv[:, d], codes[d], alphas[d], betas[d], clip_v,
                input_forget, lbr, ws[d * (g + 2) * h:(d + 1) * (g + 2) * h]))
        h0 = None if h0_src is None else (h0_src if layout == 0 else np.asarray(h0_src).transpose(1, 0, 2))
        c0 = None if c0_src is None else (c0_src if layout == 0 else np.asarray(c0_src).transpose(1, 0, 2))

        def call() -> None:
            if xt is not None:
                np.copyto(xt, x if layout == 0 else x.transpose(1, 0, 2))
            if linear is not None:
                linear()
            else:
                native.linear((x2 if x2 is not None else xt.reshape(seq * batch, isz)), wpack, dirs * gh,
                              xw.reshape(seq * batch, dirs * gh), bias)
            if lens_src is not None:
                lv = np.asarray(lens_src).reshape(-1)
                if lv.size != batch or (lv < 0).any() or (lv > seq).any():
                    raise ShapeError(f"node {node.name!r} ({node.op}): sequence_lens {lv.tolist()} do not fit "
                                     f"{batch} items of at most {seq} steps")
                np.copyto(lens, lv, casting="unsafe")
                if y is not None:
                    y.fill(0)  # the steps past an item's length are zeros; without lengths every step is written
            if h0 is None:
                hs.fill(0)
            else:
                hs[...] = h0
            if c0 is None:
                cs.fill(0)
            else:
                cs[...] = c0
            for dc in dir_calls:
                dc()
            if yh is not None and not own_h:
                np.copyto(yh, hs if layout == 0 else hs.transpose(1, 0, 2))
            if yc is not None and not own_c:
                np.copyto(yc, cs if layout == 0 else cs.transpose(1, 0, 2))

        return call
