"""The importer's rewrites on the graph IR: BatchNorm folded into convolutions, SiLU and GELU recognised,
bias, residual and activation fused into the op before them, dead nodes dropped.

Pure IR (no onnx): the importer runs them on a model, and shape inference runs them on each control-flow
body it shapes (a body runs as often as the graph around it), also when a package is loaded where onnx is
not installed."""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np

from ..ir import Graph, GraphIndex, Node, TensorInfo
from ..ops.activation import FUSABLE, act_from_node
from .quantfuse import fuse_quantized

_FUSE_ACT_INTO = {"Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "Sub", "Mul", "Div"}
_FUSE_RESIDUAL_INTO = {"Conv", "Gemm", "MatMul"}


def rewrite(graph: Graph, outputs: set[str], alt: dict[str, TensorInfo] | None = None) -> None:
    """``alt``: a dynamic model's tensors at its second probe; a rewrite that needs two shapes equal needs
    them equal there too ({}: the second probe failed, so no such rewrite is made)."""
    fuse_quantized(graph, outputs)
    _drop_identities(graph, outputs)
    _fold_batchnorm(graph, outputs)
    _fold_pad_into_conv(graph, outputs)
    _drop_dead_taps(graph, outputs, alt)
    _fold_conv_scale_shift(graph, outputs, alt)
    _fold_input_scale_into_conv(graph, outputs)
    _spatial_mean_as_pool(graph)
    _recognise_silu(graph, outputs)
    _recognise_gelu(graph, outputs)
    _merge_operand_scales(graph, outputs)
    _move_matmul_scale(graph, outputs, alt)
    _fuse_matmul_bias(graph, outputs, alt)
    _fold_scale_through_transpose(graph, outputs, alt)
    _hoist_through_reshape(graph, outputs, alt)
    _fuse_residual(graph, outputs, alt)
    _fuse_activations(graph, outputs)


def _same_shapes(graph: Graph, alt: dict[str, TensorInfo] | None, *names: str) -> bool:
    """Whether the tensors ``names`` have one shape, at every probe of a dynamic model."""
    for infos in (graph.infos, alt) if alt is not None else (graph.infos,):
        if any(n not in infos for n in names) or len({infos[n].shape for n in names}) != 1:
            return False
    return True


def _single_consumer(graph: Graph, tensor: str, outputs: set[str],
                     consumers: dict[str, list[Node]] | None = None) -> Node | None:
    """The one node reading ``tensor`` (once), if it is not a graph output. ``consumers``: the graph's, built by the
    caller where it asks for many tensors (each call builds them otherwise: a pass over the graph)."""
    if tensor in outputs:
        return None
    cons = (consumers if consumers is not None else graph.consumers()).get(tensor, [])
    return cons[0] if len(cons) == 1 and cons[0].inputs.count(tensor) == 1 else None


def _absorb(node: Node, tensor: str) -> None:
    """Record that ``node`` now also computes what ``tensor`` held (a fused BN, activation or add): per-layer
    tools match other engines' nodes, named after such tensors, to the layer that absorbed them."""
    node.attrs["_absorbed"] = [*node.attrs.get("_absorbed", []), tensor]


def _replace_node_output(graph: Graph, producer: Node, old: Node) -> None:
    """``producer`` takes over ``old``'s output name; ``old`` is removed."""
    _absorb(producer, producer.outputs[0])
    producer.outputs[0] = old.outputs[0]
    graph.remove_node(old)


def _drop_identities(graph: Graph, outputs: set[str]) -> None:
    """Identity nodes -> their readers read the Identity's input: paddle2onnx writes one after every conv and
    activation (36 in its MobileNetV3-small), and between a Conv and its ReLU or HardSigmoid one kept the
    activation from fusing into the conv. Kept where its output is a graph output or a control-flow node reads
    it (a body reads outer names by name)."""
    from ..ir import Subgraph

    cons = graph.consumers()
    for node in [n for n in graph.nodes if n.op == "Identity"]:
        if len(node.inputs) != 1 or len(node.outputs) != 1 or not node.inputs[0] or node.outputs[0] in outputs:
            continue
        out, src = node.outputs[0], node.inputs[0]
        readers = cons.get(out, [])
        if any(r.op in ("If", "Loop", "Scan") or any(isinstance(v, Subgraph) for v in r.attrs.values())
               for r in readers):
            continue
        for r in readers:
            r.inputs = [src if i == out else i for i in r.inputs]
        graph.remove_node(node)
        cons.setdefault(src, []).extend(readers)


def _fold_batchnorm(graph: Graph, outputs: set[str]) -> None:
    from ..ops.norm import bn_training, fold_bn_into

    for bn in [n for n in graph.nodes if n.op == "BatchNormalization"]:
        x = bn.inputs[0]
        prod = graph.producers().get(x)
        if prod is None or prod.op not in ("Conv", "ConvTranspose", "Gemm") or prod.attr("act") or prod.attr("residual"):
            continue
        if _single_consumer(graph, x, outputs) is not bn or not all(i in graph.constants for i in bn.inputs[1:5]):
            continue
        if len([o for o in bn.outputs if o]) != 1 or bn_training(bn):  # (training_mode: the batch's statistics)
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
        graph.set_const(wn, np.ascontiguousarray(nw, dtype=w.dtype))
        graph.set_const(bn_name, np.ascontiguousarray(nb, dtype=w.dtype))
        prod.inputs[1] = wn
        if has_b:
            prod.inputs[2] = bn_name
        else:
            prod.inputs = prod.inputs[:2] + [bn_name]
        _replace_node_output(graph, prod, bn)


def _fold_pad_into_conv(graph: Graph, outputs: set[str]) -> None:
    """A constant zero Pad of the spatial dimensions only, read by one Conv alone -> the Conv's own padding (as
    TensorFlow's exporters write a stride-2 convolution's "same" padding: Pad(0, 0, 1, 1), then a Conv with
    none). The conv then runs in place of the padded copy and its layout planned like any other conv's."""
    from ..ops.conv import _auto_pad
    from ..ops.tensor import _pad_params

    for pad in [n for n in graph.nodes if n.op == "Pad"]:
        conv = _single_consumer(graph, pad.outputs[0], outputs) if pad.outputs and pad.outputs[0] else None
        x = pad.inputs[0] if pad.inputs else ""
        if conv is None or conv.op != "Conv" or not conv.inputs or conv.inputs[0] != pad.outputs[0] \
                or x not in graph.infos or _auto_pad(conv) != "NOTSET":
            continue
        if any(i and i not in graph.constants for i in pad.inputs[1:]):
            continue  # pads given at run time
        rank = len(graph.infos[x].shape)
        try:
            widths, mode, value = _pad_params(pad, rank, lambda k: graph.constants.get(pad.inputs[k])
                                              if k < len(pad.inputs) and pad.inputs[k] else None,
                                              graph.infos[x].dtype)
        except Exception:
            continue
        if mode != "constant" or float(np.asarray(value).reshape(-1)[0]) != 0.0 or rank < 3 \
                or any(w != (0, 0) for w in widths[:2]) or any(b < 0 or e < 0 for b, e in widths):
            continue
        k = rank - 2
        cp = [int(v) for v in conv.attr("pads", [0] * (2 * k))]
        if len(cp) != 2 * k:
            continue
        conv.attrs["pads"] = [cp[i] + widths[2 + i][0] for i in range(k)] + \
            [cp[k + i] + widths[2 + i][1] for i in range(k)]
        conv.inputs[0] = x
        _absorb(conv, pad.outputs[0])
        graph.remove_node(pad)


def _drop_dead_taps(graph: Graph, outputs: set[str], alt: dict[str, TensorInfo] | None = None) -> None:
    """A Conv's kernel rows (columns, ...) whose taps fall in the padding for every output pixel are cut from its
    weights, its padding shrunk to match: they only ever multiply zeros. DeepLabV3's ASPP convs are 3x3 with
    dilations 12, 24 and 36 on a map of 4x4 at a 64x64 input (8x8 at 128x128): only the centre tap reads the
    map, so they are 1x1 convs (960->256 on 4x4: 0.86 ms each as dilated 3x3s through im2col, onnxruntime 0.14);
    its 5x5 depthwise convs of dilation 2 on 4x4 are 3x3s. Only where the input's shape is the same at every
    probe of a dynamic model (a larger map would read those taps)."""
    from ..ops.conv import _auto_pad, conv_geom

    for conv in [n for n in graph.nodes if n.op == "Conv"]:
        if len(conv.inputs) < 2 or conv.inputs[1] not in graph.constants or not conv.inputs[0] \
                or conv.inputs[0] in graph.runtime_shaped or not _same_shapes(graph, alt, conv.inputs[0]) \
                or conv.attr("pads") is None \
                or _auto_pad(conv) != "NOTSET":
            continue
        if not any(conv.attr("pads")):
            continue  # no padding: every tap reads the map
        # the weight's shape from its info: the weights themselves are read only to be cut (a package's constants
        # are read from its store on first use, and a control-flow body is shaped at every open)
        w_info = graph.infos.get(conv.inputs[1])
        w_shape = tuple(w_info.shape) if w_info is not None else np.shape(graph.constants[conv.inputs[1]])
        try:
            g = conv_geom(conv, graph.infos[conv.inputs[0]].shape, w_shape)
        except Exception:
            continue
        if any(not isinstance(v, int) or v < 1 for v in (*g.in_sp, *g.out_sp)):
            continue
        keep: list[tuple[int, int]] = []
        for h, k, s, d, pb, oh in zip(g.in_sp, g.k, g.s, g.d, g.pb, g.out_sp):
            # tap t reads the map for some output o < oh where 0 <= o * s - pb + t * d < h
            live = [t for t in range(k) if max(0, -((t * d - pb) // s)) <= min(oh - 1, (h - 1 + pb - t * d) // s)]
            keep.append((live[0], live[-1]) if live else (-1, -1))
        if any(a < 0 for a, _ in keep) or all((a, b) == (0, k - 1) for (a, b), k in zip(keep, g.k)):
            continue  # (no tap reads the map: left as it is, the output is the bias)
        pb = [p - a * d for p, (a, _), d in zip(g.pb, keep, g.d)]
        pe = [p - (k - 1 - b) * d for p, (_, b), k, d in zip(g.pe, keep, g.k, g.d)]
        if any(p < 0 for p in pb + pe):
            continue
        w = graph.constants[conv.inputs[1]]
        cut = np.ascontiguousarray(w[(slice(None), slice(None)) + tuple(slice(a, b + 1) for a, b in keep)])
        wn = f"{conv.name}.weight_live_taps"
        graph.set_const(wn, cut)
        conv.inputs[1] = wn
        conv.attrs["kernel_shape"] = [b - a + 1 for a, b in keep]
        conv.attrs["pads"] = pb + pe
        # a one-tap axis has no dilation to speak of (a 1x1 then runs as a pointwise conv)
        conv.attrs["dilations"] = [1 if a == b else d for (a, b), d in zip(keep, g.d)]


def _fold_conv_scale_shift(graph: Graph, outputs: set[str], alt: dict[str, TensorInfo] | None = None) -> None:
    """Conv, then Mul by a per-output-channel constant and Add of one (a BatchNorm as TensorFlow's exporters
    write it after a depthwise conv: tf2onnx's Keras MobileNetV2 has 17 such pairs) -> the Conv's weights and bias
    scaled and shifted, as a BatchNormalization is folded. Either may come alone; a scalar counts as per-channel."""

    def per_channel(c: str, y: str) -> np.ndarray | None:
        v = graph.constants.get(c)
        info = graph.infos.get(y)
        if v is None or info is None or not np.issubdtype(v.dtype, np.floating) or v.dtype != info.dtype:
            return None
        shape, cout = info.shape, info.shape[1] if len(info.shape) > 1 else 0
        if v.size == 1:
            return np.full(cout, v.reshape(-1)[0], dtype=v.dtype)
        if v.ndim > len(shape) or v.size != cout:
            return None
        # the constant's dimensions align with the output's last ones: its channel dimension must be axis 1
        at = 1 - (len(shape) - v.ndim)
        if at < 0 or v.shape[at] != cout or any(d != 1 for i, d in enumerate(v.shape) if i != at):
            return None
        return v.reshape(cout)

    def fold(node: Node, a: str, c: str, conv: Node) -> bool:
        if conv.op != "Conv" or conv.attr("act") or conv.attr("residual") or len(conv.inputs) < 2 \
                or conv.inputs[1] not in graph.constants or not _same_shapes(graph, alt, a, node.outputs[0]):
            return False
        has_b = len(conv.inputs) > 2 and bool(conv.inputs[2])
        if has_b and conv.inputs[2] not in graph.constants:
            return False
        v = per_channel(c, a)
        w = graph.constants[conv.inputs[1]]
        if v is None or w.dtype != v.dtype or w.shape[0] != v.shape[0]:
            return False
        b = graph.constants[conv.inputs[2]] if has_b else np.zeros(w.shape[0], w.dtype)
        if node.op == "Mul":
            nw, nb = w * v.reshape((-1,) + (1,) * (w.ndim - 1)), b * v
        else:
            nw, nb = w, b + v
        tag = "scaled" if node.op == "Mul" else "shifted"
        wn, bn = f"{conv.name}.weight_{tag}", f"{conv.name}.bias_{tag}"
        if nw is not w:
            graph.set_const(wn, np.ascontiguousarray(nw, dtype=w.dtype))
            conv.inputs[1] = wn
        graph.set_const(bn, np.ascontiguousarray(nb, dtype=w.dtype))
        conv.inputs = conv.inputs[:2] + [bn] + conv.inputs[3:]
        _replace_node_output(graph, conv, node)
        return True

    _fuse_binary(graph, outputs, "Mul", fold)
    _fuse_binary(graph, outputs, "Add", fold)


def _fold_input_scale_into_conv(graph: Graph, outputs: set[str]) -> None:
    """A Mul by a scalar constant read only by a Conv -> the Conv's weights scaled (a zero-padded conv of x * c is
    the conv of x with weights w * c): NF-Nets scale each block's input by a constant beta, a pass over the
    tensor in numpy (nf_regnet_b0: 16 of them, ~20 us each at a 64x64 input)."""
    for mul in [n for n in graph.nodes if n.op == "Mul"]:
        if mul.attr("act") or len(mul.inputs) != 2 or not mul.outputs:
            continue
        conv = _single_consumer(graph, mul.outputs[0], outputs)
        if conv is None or conv.op != "Conv" or not conv.inputs or conv.inputs[0] != mul.outputs[0] \
                or len(conv.inputs) < 2 or conv.inputs[1] not in graph.constants:
            continue
        k = next((i for i in (0, 1) if mul.inputs[i] in graph.constants), None)
        if k is None:
            continue
        c, x = graph.constants[mul.inputs[k]], mul.inputs[1 - k]
        w = graph.constants[conv.inputs[1]]
        info = graph.infos.get(x)
        if c.size != 1 or c.dtype != w.dtype or info is None or info.dtype != w.dtype \
                or graph.infos[mul.outputs[0]].shape != info.shape or not np.issubdtype(w.dtype, np.floating):
            continue
        wn = f"{conv.name}.weight_input_scaled"
        graph.set_const(wn, np.ascontiguousarray(w * c.reshape(()), dtype=w.dtype))
        conv.inputs[1] = wn
        conv.inputs[0] = x
        _absorb(conv, mul.outputs[0])
        graph.remove_node(mul)


def _spatial_mean_as_pool(graph: Graph) -> None:
    """ReduceMean over a 4-D tensor's two spatial axes, keeping them -> GlobalAveragePool, the same values: a
    squeeze-excitation written as a mean (timm's NF-Nets) then pools with the native kernel, and in the blocked
    layout where its neighbours are (it was a numpy mean, ~20 us at 184@8x8)."""
    for n in graph.nodes:
        if n.op != "ReduceMean" or not n.inputs or int(n.attr("keepdims", 1)) != 1 or len(n.outputs) != 1:
            continue
        x = graph.infos.get(n.inputs[0])
        if x is None or len(x.shape) != 4 or not np.issubdtype(x.dtype, np.floating):
            continue
        axes = n.attr("axes")
        if axes is None and len(n.inputs) > 1 and n.inputs[1]:
            axes = graph.constants.get(n.inputs[1])
            if axes is None:
                continue
        if axes is None or sorted(int(a) % 4 for a in np.asarray(axes).reshape(-1)) != [2, 3]:
            continue
        n.op = "GlobalAveragePool"
        n.inputs = n.inputs[:1]
        n.attrs = {k: v for k, v in n.attrs.items() if k.startswith("_")}


def _recognise_silu(graph: Graph, outputs: set[str]) -> None:
    """x * Sigmoid(x) (as exported for SiLU/Swish) and ONNX Swish with alpha 1 (opset 24) -> one SiLU node that can
    fuse into its producer and has Vulkan kernels."""
    for sw in graph.nodes:
        if sw.op == "Swish" and float(sw.attr("alpha", 1.0)) == 1.0:
            sw.op = "SiLU"
            sw.attrs.pop("alpha", None)
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
            graph.remove_node(half_mul)
            last = m1
        if _single_consumer(graph, div.outputs[0], outputs) is not erf:
            continue
        gelu = Node(erf.name + "_gelu", "Gelu", [x], [last.outputs[0]], {"_opset": graph.opset})
        idx = graph.nodes.index(last)
        graph.nodes[idx] = gelu
        for n in (div, erf, add, m1):
            if n in graph.nodes and n is not last:
                graph.remove_node(n)


def _merge_operand_scales(graph: Graph, outputs: set[str]) -> None:
    """MatMul of two activations each multiplied by a constant scalar first (attention as torch exports
    scaled_dot_product_attention: q * sqrt(s) and k^T * sqrt(s)) -> one Mul by the product, on the smaller operand:
    a pass over one operand saved, and the other operand read as its producer wrote it (a Transpose there can then
    be absorbed into the product). Within a rounding of each product."""
    prods = graph.producers()
    for mm in [n for n in graph.nodes if n.op == "MatMul"]:
        if (len(mm.inputs) != 2 or mm.inputs[0] == mm.inputs[1] or mm.attr("act") or mm.attr("residual")
                or mm.attr("bias")):
            continue
        muls, scales = [], []
        for t in mm.inputs:
            m = prods.get(t)
            if m is None or m.op != "Mul" or m.attr("act") or len(m.inputs) != 2 \
                    or _single_consumer(graph, t, outputs) is not mm:
                break
            j = next((j for j in (0, 1) if _const_scalar(graph, m.inputs[j]) is not None
                      and m.inputs[1 - j] not in graph.constants), None)
            if j is None:
                break
            x = m.inputs[1 - j]
            if x not in graph.infos or graph.infos[x].shape != graph.infos[t].shape \
                    or graph.infos[x].dtype != graph.infos[t].dtype \
                    or np.dtype(graph.infos[x].dtype) not in (np.float32, np.float64):
                break  # (in fp16 the two roundings the export asked for differ from one too often)
            muls.append((m, x))
            scales.append(_const_scalar(graph, m.inputs[j]))
        if len(muls) != 2:
            continue
        sizes = [math.prod(graph.infos[x].shape) if all(isinstance(d, int) for d in graph.infos[x].shape)
                 else math.inf for _m, x in muls]
        keep = 0 if sizes[0] <= sizes[1] else 1
        kept, dropped = muls[keep], muls[1 - keep]
        dtype = graph.infos[kept[1]].dtype
        scalar = f"{kept[0].name}.scale_merged"
        graph.set_const(scalar, np.asarray(np.float64(scales[0]) * np.float64(scales[1]), dtype=dtype))
        kept[0].inputs = [kept[1], scalar]
        mm.inputs[1 - keep] = dropped[1]
        _absorb(mm, dropped[0].outputs[0])
        graph.remove_node(dropped[0])


def _move_matmul_scale(graph: Graph, outputs: set[str], alt: dict[str, TensorInfo] | None = None) -> None:
    """MatMul of two activations followed by Mul by a constant scalar (attention's scores times 1/sqrt(d)) -> the
    Mul moved onto the MatMul's smaller operand: (s q) k^T has the value of s (q k^T) and scales 197x64 numbers
    per head instead of 197x197 (vit_tiny: 3x fewer). Bit for bit the same when s is a power of two (1/8 for
    64-wide heads); otherwise within a rounding of each product."""

    def move(mul: Node, t: str, c: str, mm: Node) -> bool:
        s = _const_scalar(graph, c)
        if (s is None or mm.op != "MatMul" or len(mm.inputs) != 2 or mm.inputs[0] == mm.inputs[1]
                or mm.attr("act") or mm.attr("residual") or mm.attr("bias")
                or any(i in graph.constants or i not in graph.infos for i in mm.inputs)
                or not _same_shapes(graph, alt, t, mul.outputs[0])):
            return False
        info = graph.infos[t]
        shapes = [graph.infos[i].shape for i in mm.inputs]
        if not np.issubdtype(info.dtype, np.floating) or not all(isinstance(d, int) for shp in shapes for d in shp):
            return False
        j = 0 if math.prod(shapes[0]) <= math.prod(shapes[1]) else 1
        x = mm.inputs[j]
        if graph.infos[x].dtype != info.dtype:
            return False
        scalar = f"{mul.name}.scale_moved"
        graph.set_const(scalar, np.asarray(s, dtype=info.dtype))
        scaled = f"{x}.scaled_for_{mm.name}"
        graph.infos[scaled] = TensorInfo(scaled, graph.infos[x].shape, graph.infos[x].dtype)
        if alt and x in alt:
            alt[scaled] = TensorInfo(scaled, alt[x].shape, alt[x].dtype)
        out = mul.outputs[0]
        mul.inputs, mul.outputs = [x, scalar], [scaled]
        mm.inputs = [scaled if q == j else i for q, i in enumerate(mm.inputs)]
        _absorb(mm, t)
        mm.outputs[0] = out
        graph.remove_node(mul)
        graph.nodes.insert(graph.nodes.index(mm), mul)
        return True

    _fuse_binary(graph, outputs, "Mul", move)


def _fuse_binary(graph: Graph, outputs: set[str], op: str, fuse: Callable[[Node, str, str, Node], bool]) -> None:
    """The scan the Add fusions and the Mul move share: for every two-input ``op`` node without a fused
    activation, each operand ``a`` whose producer feeds only this node is offered as ``fuse(node, a, other,
    producer)``; after a fusion that returns True its other orientation is not tried."""
    # producers and consumers built again only after a fusion (``fuse`` changes nothing where it returns False):
    # built for every node, the pass was quadratic (efficientnet_b0's import spent most of its time there)
    index = GraphIndex(graph)
    for node in [n for n in graph.nodes if n.op == op]:
        if node.attr("act") or len(node.inputs) != 2:
            continue
        prods, cons = index.get()
        for k in (0, 1):
            a, other = node.inputs[k], node.inputs[1 - k]
            p = prods.get(a)
            if p is None or _single_consumer(graph, a, outputs, cons) is not node:
                continue
            if fuse(node, a, other, p):
                index.stale = True
                break


def _fuse_adds(graph: Graph, outputs: set[str], fuse: Callable[[Node, str, str, Node], bool]) -> None:
    _fuse_binary(graph, outputs, "Add", fuse)


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
        graph.set_const(name, np.ascontiguousarray(cv.reshape(n), dtype=out.dtype))
        mm.inputs = mm.inputs + [name]
        mm.attrs["bias"] = True
        _replace_node_output(graph, mm, add)
        return True

    _fuse_adds(graph, outputs, fuse)


def _fold_scale_through_transpose(graph: Graph, outputs: set[str], alt: dict[str, TensorInfo] | None = None) -> None:
    """MatMul by constant weights (its bias fused or none) -> Transpose -> Mul by a constant that varies only along
    the axis the product's columns went to -> the constant folded into the weights' columns and the bias, the Mul
    gone: ConvNeXt's layer scale (gamma per channel) after its MLP's second Linear, which the export writes after
    the Transpose back to NCHW; convnext_tiny had 18 such Muls, each a pass over the map (0.975x its time)."""

    def fold(mul: Node, t2: str, c: str, tr: Node) -> bool:
        if c not in graph.constants or tr.op != "Transpose" or not tr.inputs:
            return False
        t1 = tr.inputs[0]
        mm = graph.producers().get(t1)
        if (mm is None or mm.op != "MatMul" or _single_consumer(graph, t1, outputs) is not tr
                or mm.attr("act") or mm.attr("residual") or mm.inputs[1] not in graph.constants
                or (mm.attr("bias") and (len(mm.inputs) != 3 or mm.inputs[2] not in graph.constants))
                or not _same_shapes(graph, alt, t2, mul.outputs[0])):
            return False
        w = graph.constants[mm.inputs[1]]
        info = graph.infos[t2]
        r = len(info.shape)
        perm = [int(i) for i in (tr.attr("perm") or range(r - 1, -1, -1))]
        cv = np.asarray(graph.constants[c])
        if w.ndim != 2 or w.dtype != np.float32 or info.dtype != np.float32 or len(perm) != r or cv.ndim > r:
            return False
        g = cv.reshape((1,) * (r - cv.ndim) + cv.shape)
        a = perm.index(r - 1)  # the axis of the Transpose's output the product's columns went to
        n = int(w.shape[1])
        if any(d != 1 for i, d in enumerate(g.shape) if i != a) or g.shape[a] not in (1, n):
            return False
        col = np.broadcast_to(g.reshape(-1).astype(np.float32), (n,))
        wname = _fresh(graph, f"{mm.inputs[1]}.scaled_{mul.name}")
        graph.set_const(wname, np.ascontiguousarray(w * col[None, :]))
        mm.inputs[1] = wname
        if mm.attr("bias"):
            bname = _fresh(graph, f"{mm.inputs[2]}.scaled_{mul.name}")
            graph.set_const(bname, np.ascontiguousarray(graph.constants[mm.inputs[2]] * col))
            mm.inputs[2] = bname
        _absorb(tr, t2)
        tr.outputs[0] = mul.outputs[0]
        graph.remove_node(mul)
        return True

    _fuse_binary(graph, outputs, "Mul", fold)


def _fresh(graph: Graph, base: str) -> str:
    name, k = base, 0
    while name in graph.infos:
        k += 1
        name = f"{base}.{k}"
    return name


def _hoist_through_reshape(graph: Graph, outputs: set[str], alt: dict[str, TensorInfo] | None = None) -> None:
    """Conv/Gemm/MatMul -> Reshape -> an activation, or an Add of a same-shaped tensor: the activation or Add moves
    before the Reshape (an element-wise op commutes with it; the Add's other operand is reshaped to the product's
    shape, a view), so the fusions after this put it in the product's epilogue. ONNX Runtime's optimiser writes a
    transformer's Linear on tokens as Reshape -> Gemm -> Reshape, with the GELU and the residual Add after the
    second Reshape, each then a pass of its own over the tokens (vit_tiny so optimised: 0.95x the time fused,
    alternating in one process). The activation after such an Add moves too (the Add is then the product). Not
    for a dynamic model, whose operand's reshape would need the product's shape at every probe."""
    if alt is not None:
        return
    moved = True
    while moved:
        moved = False
        prods = graph.producers()
        for r in [n for n in graph.nodes if n.op == "Reshape"]:
            if r not in graph.nodes or len(r.outputs) != 1:
                continue
            t, u = r.inputs[0], r.outputs[0]
            p = prods.get(t)
            x = _single_consumer(graph, u, outputs)
            if p is None or x is None or _single_consumer(graph, t, outputs) is not r or p.attr("act"):
                continue
            info_t = graph.infos.get(t)
            if info_t is None or not np.issubdtype(info_t.dtype, np.floating) or graph.infos[u].size != info_t.size:
                continue
            if x.op in FUSABLE and len(x.inputs) == 1 and p.op in _FUSE_ACT_INTO and act_from_node(x) is not None:
                x.inputs = [t]
            elif (x.op == "Add" and len(x.inputs) == 2 and p.op in _FUSE_RESIDUAL_INTO and not p.attr("residual")
                  and x.inputs[0] != x.inputs[1]):
                b = x.inputs[1] if x.inputs[0] == u else x.inputs[0]
                if b in graph.constants or not _same_shapes(graph, alt, u, b, x.outputs[0]):
                    continue
                shape = _fresh(graph, f"{x.name}.residual_shape")
                graph.set_const(shape, np.asarray(info_t.shape, np.int64))
                b2 = _fresh(graph, f"{b}.as_{p.name}")
                graph.infos[b2] = TensorInfo(b2, info_t.shape, info_t.dtype)
                rb = Node(_fresh(graph, f"{x.name}.residual_reshape"), "Reshape", [b, shape], [b2],
                          {"_opset": graph.opset})
                graph.nodes.insert(graph.nodes.index(x), rb)
                x.inputs = [t, b2] if x.inputs[0] == u else [b2, t]
            else:
                continue
            # x now computes on the product's shape where it was (its other operand exists there), the Reshape
            # right after it gives x's old output
            v = x.outputs[0]
            pre = _fresh(graph, f"{v}.pre_reshape")
            graph.infos[pre] = TensorInfo(pre, info_t.shape, info_t.dtype)
            x.outputs = [pre]
            graph.remove_node(r)
            graph.nodes.insert(graph.nodes.index(x) + 1, r)
            r.inputs = [pre, *r.inputs[1:]]
            r.outputs = [v]
            moved = True
            prods = graph.producers()


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
        graph.remove_node(p)
        graph.nodes[graph.nodes.index(add)] = p
        _absorb(p, p.outputs[0])
        p.outputs[0] = add.outputs[0]
        return True

    _fuse_adds(graph, outputs, fuse)


def _fuse_activations(graph: Graph, outputs: set[str]) -> None:
    # the consumers built once and kept up to date: a fusion removes the activation, the one reader of the node's
    # old output, and the node takes over the activation's output, whose readers stay as they were. (Nodes by
    # identity: ``==`` compares every field.)
    cons = graph.consumers()
    removed: set[int] = set()
    for node in list(graph.nodes):
        if id(node) in removed or node.op not in _FUSE_ACT_INTO or node.attr("act"):
            continue
        if len([o for o in node.outputs if o]) != 1:
            continue
        nxt = _single_consumer(graph, node.outputs[0], outputs, cons)
        if nxt is None or nxt.op not in FUSABLE or len(nxt.inputs) != 1:
            continue
        if not np.issubdtype(graph.infos[node.outputs[0]].dtype, np.floating):
            continue
        act = act_from_node(nxt)
        if act is None:
            continue
        node.attrs["act"] = act
        cons.pop(node.outputs[0], None)
        removed.add(id(nxt))
        _replace_node_output(graph, node, nxt)


def dce(graph: Graph, out_names: Iterable[str]) -> None:
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
