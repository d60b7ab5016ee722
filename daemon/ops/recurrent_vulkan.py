"""Vulkan kernel for LSTM, GRU and RNN (``recurrent.py`` holds the semantics and the CPU kernels).

Two dispatches: ``rnn_proj.comp`` projects every step of every direction at once (the GEMM the CPU kernel does
natively, W transposed and both biases folded at load), then ``rnn.comp`` walks the steps: one workgroup per
direction holding the states in shared memory, a workgroup barrier between the recurrence product and the gate
maths. One recorded dispatch for the whole sequence instead of per-step dispatches: a step of a small recurrent
layer is a few microseconds of arithmetic, less than a dispatch and its barrier cost, and the planner's cost of
this kernel is then that of one layer.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..vulkan.kernel import Caps, Dispatch, In, Out, Param, VulkanKernel, Ws, grid
from .base import Layer, raw_key, register_kernel, weights_key
from .recurrent import ACTS, GATES, RNN_OPS, _str, activations, dims, split_weights


@register_kernel
class VkRecurrent(VulkanKernel):
    name = "vk_rnn"
    ops = RNN_OPS
    priority = 10

    @staticmethod
    def _dims(layer: Layer) -> tuple[int, int, int, int, int, int]:
        seq, batch, isz, h, dirs = dims(layer.node, layer.in_shape(0))
        return seq, batch, isz, h, dirs, GATES[layer.op]

    def applies(self, layer: Layer) -> bool:
        x = layer.inputs[0]
        if x is None or np.dtype(x.dtype) != np.float32 or 0 in layer.const_inputs:
            return False
        if not all(k in layer.const_inputs for k in (1, 2)) or any(
                layer.has_input(k) and k not in layer.const_inputs for k in (3, 4, 7)):
            return False  # weights (and lengths) are laid out at load
        seq, batch, isz, h, dirs, g = self._dims(layer)
        # the states and one step's gates live in shared memory (16 KiB is every device's minimum)
        return 4 * (2 * batch * h + batch * g * h) <= 12 * 1024

    def transform_key(self, layer: Layer) -> tuple[Any, ...]:
        return weights_key(layer) + tuple(layer.in_shape(k) for k in (4, 5, 6) if layer.has_input(k))

    def transform(self, layer: Layer, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        w, r, bias, step_rb = split_weights(layer, raw)
        dirs, gh, isz = w.shape
        out = {"wt": np.ascontiguousarray(w.reshape(dirs * gh, isz).T), "bias": np.ascontiguousarray(bias.reshape(-1)),
               "rt": np.ascontiguousarray(r.transpose(0, 2, 1)), "rb": np.ascontiguousarray(step_rb.reshape(-1)),
               "peep": np.ascontiguousarray(np.asarray(raw[raw_key(7)], np.float32).reshape(-1)) if raw_key(7) in raw
               else np.zeros(1, np.float32),
               "lens": np.ascontiguousarray(np.asarray(raw[raw_key(4)]).astype(np.int32).reshape(-1)) if raw_key(4) in raw
               else np.zeros(1, np.int32)}
        for k in (5, 6):  # initial states given as constants
            if raw_key(k) in raw:
                out[raw_key(k)] = np.ascontiguousarray(raw[raw_key(k)], np.float32)
        return out

    def transformed_nbytes(self, layer: Layer) -> int:
        seq, batch, isz, h, dirs, g = self._dims(layer)
        n = isz * dirs * g * h + 2 * dirs * g * h + dirs * h * g * h + 3 * dirs * h + batch + 1
        return 4 * (n + sum(layer.inputs[k].size for k in (5, 6)  # type: ignore[union-attr]
                            if k in layer.const_inputs and layer.inputs[k] is not None))

    def workspace_parts(self, layer: Layer) -> dict[str, int]:
        seq, batch, isz, h, dirs, g = self._dims(layer)
        # xw: the projections; sink: where absent outputs (Y, Y_h, Y_c not asked for) are written
        return {"xw": 4 * seq * batch * dirs * g * h, "sink": 4 * max(seq, 1) * dirs * batch * h}

    def dispatches(self, layer: Layer, params: Mapping[str, np.ndarray], caps: Caps) -> list[Dispatch]:
        node = layer.node
        seq, batch, isz, h, dirs, g = self._dims(layer)
        layout = int(node.attr("layout", 0))
        n = dirs * g * h
        sx_t, sx_b = (batch * isz, isz) if layout == 0 else (isz, seq * isz)
        proj = Dispatch("rnn_proj", (In(0), Param("wt"), Param("bias"), Ws("xw")), grid(seq * batch * n, 64, caps),
                        push={"rows": seq * batch, "K": isz, "N": n, "batch": batch, "sx_t": sx_t, "sx_b": sx_b})
        acts = activations(node)
        codes, al, be = [0] * 6, [0.0] * 6, [0.0] * 6
        for d, ad in enumerate(acts):
            for k, (name, a, b) in enumerate(ad):
                codes[3 * d + k], al[3 * d + k], be[3 * d + k] = ACTS[name][0], a, b
        direction = _str(node.attr("direction", "forward"))
        rev = 1 if direction == "reverse" else (2 if direction == "bidirectional" else 0)
        flags = ((1 if layer.has_input(5) else 0) | (2 if layer.has_input(6) and layer.op == "LSTM" else 0)
                 | (4 if layer.has_input(7) else 0) | (8 if layer.has_input(4) else 0)
                 | (16 if int(node.attr("input_forget", 0)) else 0) | (32 if int(node.attr("linear_before_reset", 0)) else 0))
        clip = node.attr("clip")
        outs = list(node.outputs) + ["", "", ""]
        refs = (Ws("xw"), Param("rt"), Param("rb"), Param("peep"), Param("lens"),
                In(5) if layer.has_input(5) else Param("rb"),
                In(6) if layer.has_input(6) and layer.op == "LSTM" else Param("rb"),
                Out(0) if outs[0] else Ws("sink"), Out(1) if outs[1] else Ws("sink"),
                Out(2) if outs[2] and layer.op == "LSTM" else Ws("sink"))
        step = Dispatch("rnn", refs, (dirs, 1, 1), {"KIND": {"RNN": 0, "GRU": 1, "LSTM": 2}[layer.op],
                                                     "BH": batch * h, "BGH": batch * g * h},
                        push={"seq": seq, "batch": batch, "H": h, "dirs": dirs, "rev": rev, "layout_": layout,
                              "flags": flags, "clip": float(clip) if clip is not None else 0.0,
                              "act": codes, "alpha": al, "beta": be})
        return [proj, step]
