"""The CPU backend's layout plan: which nodes run on channel-blocked tensors (pure functions over a graph).

A conv over NCHW planes is a GEMM whose input is packed per call (a quarter of a 1x1 conv's time on 56x56
planes), or a direct conv reading strided rows; in the blocked layout (N, ceil(C/16), H, W, 16) nothing is packed
(:mod:`inferd.ops.conv_nchwc`). A conversion costs about what one packing does, so blocking pays only over a
run of convs. ``plan_layout`` takes the convs the blocked kernel suits (1x1s with fewer than
``POINTWISE_MAX_WEIGHTS`` weights on maps of ``POINTWISE_MIN_PIXELS`` and more, strided ones on any map; strided
k x k convs; k x k convs of up to ``DIRECT_MAX_CIN`` input channels unless Winograd would run them with more output
channels; grouped convs whose groups fill whole blocks (``conv_nchwc.block_groups``), against
im2col's GEMM per group even alone; depthwise convs between blocked neighbours; stems, convs of fewer than 16 input
channels that read them in NCHW; channel counts short of whole blocks where the padding adds at most ``MAX_PAD``
of work, the saving counted net of it), the max pools and squeeze-excitations (a global average pool, which writes
NCHW, and the Mul by its scale) whose inputs all come blocked and the channel concats whose inputs do (or some do,
where blocking converts fewer bytes); it keeps a conv only next to another blocked node, and a connected region
only where the conv time it is expected to save (``SAVING``) exceeds its conversions.
``apply_layout`` rewrites the kept nodes (``inferd.ConvNchwc``, ``inferd.MaxPoolNchwc``, a Concat on the blocked
twins of its parts, ``inferd.GlobalAveragePoolNchwc`` and ``inferd.ScaleNchwc``), converting a tensor once where
a blocked node reads it from an NCHW producer, and back once where anything else (or the graph's output) reads it.

Per layer in the models (two threads, Emerald Rapids, the blocked kernel against the NCHW one the plan would
run): 1x1 convs 0.61-0.79x the time (the pointwise tiles), strided 1x1s against a strided copy and the GEMM
0.38-0.77x, 3x3 convs of 16-64 input channels against the direct GEMM 0.78-0.93x, strided 3x3s against im2col
0.85-0.93x; Winograd stays ahead from 128 channels on and on large maps, the GEMM on 7x7 maps and for large
weights (with the AVX-512 tiles the blocked kernel takes Winograd's mid-sized maps: ``WINOGRAD_BLOCKED_MAX_PIXELS``).

The decision reads the shapes (a map's pixels, a conv's work, a tensor's bytes), so a model whose inputs have a
dynamic spatial size stays NCHW: its shapes share their weights, which they could not across layouts. A dynamic
batch is planned as it comes (the blocked kernels apply only to their own ops, never to a plain Conv of the same
name that another shape's executor holds).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Mapping

import numpy as np

from ..ir import Graph, Node, TensorInfo
from ..native import NATIVE_ACTS
from ..ops.conv_nchwc import (BLOCK, CONV, FROM, GAP, MAXPOOL, SCALE, TO, block_groups, blocks, depthwise,
                              dilated_ok, padded_nbytes)
from ..ops.conv import conv_geom, preferred_3x3_kernel
from ..ops.pool import pool_geometry

#: k x k stride-1 convs with more input channels than this stay on Winograd (faster there)
DIRECT_MAX_CIN = 64
#: 1x1 convs with this many weights or more stay on the GEMM. It was 1024 * 1024 (resnet50's 1024->2048 downsampling
#: on 7x7 had taken 1.06x the GEMM's time blocked), which left resnet50's last stage (2048<->512 and that
#: downsampling on 7x7) on the GEMM between conversions; blocked, in-process A/Bs (Zen 4 VM, two threads,
#: 2026-12-05, median of the rounds' ratios): resnet50 0.98x the time (two runs), keras resnet50 0.96x,
#: fcn_resnet50 0.99x. Still a bound: a 1x1 conv this large is a classifier-sized GEMM
POINTWISE_MAX_WEIGHTS = 4096 * 4096
#: k x k stride-1 convs of more than DIRECT_MAX_CIN input channels that Winograd would run go blocked on maps of
#: up to this many pixels with up to WINOGRAD_BLOCKED_MAX_WEIGHTS weights a tap, and on odd maps of up to 7x7,
#: where the blocked kernel has its AVX-512 tiles (``_wide_tiles``, ``_beats_winograd``): since its weights are read
#: ahead of its tiles it outruns Winograd there, whose transforms make passes over memory (a larger share of its
#: time the fewer the channels) and whose transformed weights (1.8x and 4x the raw ones) come from memory each
#: inference too. In-process A/B of the layers in the models (``scripts/plan_ab.py``; Xeon, Emerald Rapids, two
#: threads, 2026-12-06, blocked / Winograd, in one of the VM's slow spells, then a fast one): resnet50's 128@28x28
#: 0.79-0.88x, then 0.95-1.08x (F(4,3)), 256@14x14 0.92-0.98x, then 0.98-1.01x, 512@7x7 0.81-0.83x, then 0.86x
#: (F(2,3)), and the conversions around each bottleneck's 3x3 gone (20 of them, 0.33-0.47 ms): the model 0.96x, then
#: 0.97x; resnet18 0.94-0.96x (its 256@14x14s 1.05-1.10x in the fast spell, paid for by its 7x7s' 0.87-0.88x and
#: 8 conversions), googlenet 0.95-0.99x, unet_small 1.0x. Not with more weights: vgg16's 256->512 and
#: 512@28x28 took 1.8-2.0x F(4,3)'s time blocked, 512@14x14 1.24-1.28x F(2,3)'s. Narrower tiles (AVX2, NEON) keep
#: Winograd as measured before (``_small_map``). 784 was raised to 1024 for unet_small's 32x32 decoder (2026-12-07,
#: same VM, in the model): 128->64 0.84x F(4,3)'s time blocked, 64->64 0.79x F(2,3)'s; googlenet's 64->192 on
#: 56x56 took 1.16x F(4,3)'s blocked. Alone (one conv a model, its weights left in L2 between runs) Winograd wins
#: every one of these: the whole model's other layers evict its 1.8-4x larger transformed weights
WINOGRAD_BLOCKED_MAX_PIXELS = 1024
WINOGRAD_BLOCKED_MAX_WEIGHTS = 256 * 256
#: ... and so do 1x1 convs on maps smaller than this: none since the run tiles (a map as one row of pixels).
#: mobilenetv2's 7x7 1x1s take 0.75-0.96x the GEMM's time blocked and the model 0.95-0.99x (Zen 3, 1 and 2
#: threads, 2026-12-01), googlenet 0.90-0.97x; efficientnet_b0's 7x7 expansions 0.9-1.08x, the model 0.96-1.00x
#: in four A/Bs (before the run tiles they had taken 1.15x blocked). With 49 the exported models at 64x64 (their
#: last stages on 4x4, 2x2 and 1x1 maps) converted to NCHW and back; with none, in-process A/Bs (Zen 3, two
#: threads, 2026-12-02): efficientnet_b0 0.79x the time, regnet_y_400mf 0.86, keras mobilenet_v2 0.88,
#: deeplabv3_mobilenet_v3 0.94, nf_regnet_b0 0.99; the zoo at 224x224 0.99-1.00
POINTWISE_MIN_PIXELS = 1
#: maps of fewer pixels than this save less blocked than larger ones do (``SAVING["pointwise_small"]``)
SMALL_MAP_PIXELS = 100
SUFFIX = "::nchwc"
#: Fraction of a conv's time the blocked kernel saves, by what the NCHW path would run (measured per layer in the
#: models, two threads, Emerald Rapids: 1x1 0.61-0.79x with the pointwise tiles, direct 3x3 0.78-0.93x, strided
#: 3x3 via im2col 0.85-0.88x, strided 1x1 (a strided copy and the GEMM) 0.38-0.77x; against Winograd F(4,3)
#: 0.92-1.05x on 64->64@56, worse on larger maps: nothing to pay a conversion with; with more channels on mid-sized
#: maps and the AVX-512 tiles 0.75-1.03x, "winograd_wide"); a depthwise conv or a pool saves nothing to speak of.
SAVING = {"pointwise": 0.30, "direct": 0.15, "winograd": 0.0, "strided": 0.15, "strided1x1": 0.30, "stem": 0.30,
          "winograd_wide": 0.10, "pointwise_small": 0.12, "small_kxk": 0.40, "grouped": 0.30, "dilated": 0.30}
#: Paths of a conv that saves more than its two conversions cost even with no blocked neighbour (the region check
#: still weighs them): a k x k conv on a small map, a grouped conv, and an atrous conv, whose NCHW path is the
#: implicit GEMM (FCN-ResNet50's 3x3 at dilation 4 on an 8x8 map, 512 channels, two threads, Zen 3: 2.4-2.6 ms
#: there, onnxruntime 1.45)
ALONE_PATHS = ("small_kxk", "grouped", "dilated")
#: ... and what the NCHW path pays per group of a grouped conv whatever its size (im2col and a GEMM call each:
#: RegNetY-400MF's 3x3s of 8-channel groups, two threads, Zen 3, us: 48@32x32 s2 (6 groups) 45 against 28
#: blocked, 104@8x8 (13) 37/15, 208@4x4 (26) 68/10, 440@2x2 (55) 92/8, the blocked ones with the zeros'
#: multiply-adds between two groups of a block pair; past the work at CONV_RATE, 1.6-4.5 us a group)
GROUP_CALL_S = 2.5e-6
#: Most work a conv may do on the padding lanes of its blocks, as a factor of its own (channels not a multiple of
#: 16: 24 of mobilenetv2's second stage 1.33, 40 of efficientnet_b0's third 1.2; 8 would be 2); the saving counts it
MAX_PAD = 1.5
#: Rate of a conv's work in the NCHW path (FLOP/s) and of a layout conversion (bytes read and written per s):
#: they turn savings and conversions into one unit (only their ratio matters)
CONV_RATE = 100e9
CONVERT_RATE = 30e9
#: ... and what a conversion costs whatever its size (a node of its own: shufflenetv2's 116-channel 7x7 tensors
#: took 5 us each way where their bytes alone say 1.5 us)
CONVERT_FIXED_S = 3e-6


@dataclass(frozen=True)
class LayoutPlan:
    """Nodes to run blocked, in graph order, and what each is ('conv'; 'stem': a conv reading NCHW; 'pool';
    'concat'; a squeeze-excitation's 'gap', a global average pool writing NCHW, and 'scale', its Mul)."""

    blocked: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()


def _conv_path(node: Node, graph: Graph, forced: Mapping[str, str]) -> str | None:
    """What the NCHW path would run ``node`` with ("pointwise", "strided1x1", "strided", "direct", "winograd",
    "winograd_wide" (see ``WINOGRAD_BLOCKED_MAX_PIXELS``), "small_kxk", "depthwise"; "stem" for a conv that reads
    NCHW) where the blocked kernel suits it, else None: the blocked kernel's expected saving depends on it."""
    if node.name in forced or "Conv" in forced or len(node.inputs) < 2:
        return None
    x, w = graph.infos.get(node.inputs[0]), graph.infos.get(node.inputs[1])
    if x is None or w is None or len(x.shape) != 4 or len(w.shape) != 4 or node.inputs[1] not in graph.constants:
        return None
    if any(name and name in graph.constants for name in node.inputs[3:]):  # a constant residual: left alone
        return None
    dil = tuple(int(d) for d in node.attrs.get("dilations", (1, 1)))
    cout, cin, kh, kw = (int(d) for d in w.shape)
    if any(d != 1 for d in dil) and (kh, kw) != (1, 1):
        return _dilated_path(node, graph, dil)
    dw = depthwise(node, w.shape)
    group = int(node.attrs.get("group", 1))
    # a stem: an image's few channels read as they are (NCHW), its output blocked
    stem = not dw and group == 1 and cin < BLOCK
    bg = block_groups(node, w.shape) if group != 1 and not dw else None
    if (group != 1 and not dw and bg is None) or _pad_factor(node, tuple(w.shape), stem) > MAX_PAD * (
            bg[0] if bg else 1):
        return None
    if node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return None
    pads = [int(p) for p in node.attrs.get("pads", (0, 0, 0, 0))]
    if pads[0] >= kh or pads[1] >= kw:
        return None
    act = node.attrs.get("act")
    if act is not None and str(act[0]) not in NATIVE_ACTS:  # the blocked kernels' epilogue is the native one
        return None
    if stem:
        return "stem"
    if bg is not None:
        return "grouped"
    strided = any(int(s) > 1 for s in node.attrs.get("strides", (1, 1)))
    if kh == kw == 1:
        # where the weights are large or the map small the GEMM's blocking wins (a CNN's last stages); a strided 1x1
        # (ResNet's downsampling) reads its pixels in place where the NCHW path copies them out first, on any map
        # (resnet18's 256->512 on 7x7: 0.30 ms through the copy, onnxruntime's blocked kernel 0.09)
        y = graph.infos.get(node.outputs[0])
        ok = cin * cout < POINTWISE_MAX_WEIGHTS and y is not None and (
            strided or math.prod(y.shape[2:]) >= POINTWISE_MIN_PIXELS)
        small = y is not None and math.prod(y.shape[2:]) < SMALL_MAP_PIXELS
        return ("strided1x1" if strided else "pointwise_small" if small else "pointwise") if ok else None
    if dw or strided:
        return "depthwise" if dw else "strided"
    # k x k stride 1: where the NCHW path takes Winograd it stays, but for few channels each way, and on small maps
    wino = _winograd(node, x.shape, w.shape)
    if cin <= DIRECT_MAX_CIN and (not wino or cout <= DIRECT_MAX_CIN):
        return "winograd" if wino else "direct"
    y = graph.infos.get(node.outputs[0])
    if y is not None and _small_map(y.shape, cin, cout):
        return "small_kxk"
    if wino and y is not None and _beats_winograd(y.shape, cin, cout) and _wide_tiles():
        return "winograd_wide"
    return None


def _beats_winograd(y_shape: tuple[int, ...], cin: int, cout: int) -> bool:
    """Where the blocked kernel's AVX-512 tiles outrun Winograd on a k x k conv of more than DIRECT_MAX_CIN input
    channels (see ``WINOGRAD_BLOCKED_MAX_PIXELS``): mid-sized maps with mid-sized weights, and odd maps of up to
    7x7, which F(2,3)'s tiles pad to even sides."""
    px = math.prod(y_shape[2:])
    odd = any(int(d) % 2 for d in y_shape[2:])
    return (px <= WINOGRAD_BLOCKED_MAX_PIXELS and cin * cout <= WINOGRAD_BLOCKED_MAX_WEIGHTS) or (odd and px <= 49)


@functools.cache
def _wide_tiles() -> bool:
    """Whether the blocked kernel runs its AVX-512 tiles (6 pixels x 4 blocks, 24 accumulators): where it does
    it outruns Winograd on mid-sized maps (``WINOGRAD_BLOCKED_MAX_PIXELS``)."""
    from .. import native

    return bool(native.AVAILABLE) and native.nchwc_group_blocks() == 4


def _dilated_path(node: Node, graph: Graph, dil: tuple[int, ...]) -> str | None:
    """"dilated" where native/nchwc.c's dilated conv takes the conv (``ops.conv_nchwc.dilated_ok``: stride 1, dense,
    pads whole multiples of the dilation), else None."""
    x, w = graph.infos[node.inputs[0]], graph.infos[node.inputs[1]]
    act = node.attrs.get("act")
    if len(dil) != 2 or node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID") or (
            act is not None and str(act[0]) not in NATIVE_ACTS) or int(w.shape[1]) < BLOCK:
        return None
    g = conv_geom(node, x.shape, w.shape).as2d()
    return "dilated" if g is not None and dilated_ok(g) else None


def _small_map(y_shape: tuple[int, ...], cin: int, cout: int) -> bool:
    """A k x k conv's map too small for the NCHW path's kernels (a CNN's last stages at a small input: 64x64
    images leave resnets 2x2 to 8x8 maps): Winograd's transforms and tiles padded to even sides cost more than the
    multiplies saved, and the GEMM kernels' blocking wants more pixels. Two threads, Zen 3, us, F(2,3) / the
    best other NCHW kernel / blocked direct: 512@2x2 513/293 (im2col)/112, 512@4x4 740/-/414, 512@5x5 1282/-/635,
    384@6x6 771/-/507, 256@4x4 423/193 (direct_gemm)/112, 256@7x7 616/-/309, 128@7x7 216/-/88, 128@8x8 215/143
    (direct_gemm)/111; Winograd still ahead at 256@8x8 336/-/403, 512@7x7 1111/1750/1243, 128@14x14 261/-/304
    (where the blocked kernel's tiles are narrower than AVX-512's: see ``WINOGRAD_BLOCKED_MAX_PIXELS``)."""
    px = math.prod(y_shape[2:])
    odd = any(int(d) % 2 for d in y_shape[2:])
    return px <= 36 or (px <= 64 and (cin * cout <= 128 * 128 or (odd and cin * cout <= 256 * 256)))


def _winograd(node: Node, x_shape: tuple[int, ...], w_shape: tuple[int, ...]) -> bool:
    if tuple(w_shape[2:]) != (3, 3):
        return False
    g = conv_geom(node, x_shape, w_shape).as2d()
    return g is not None and preferred_3x3_kernel(g).startswith("winograd")


def _pad_factor(node: Node, w_shape: tuple[int, ...], stem: bool) -> float:
    """The blocked kernel's work over the conv's own: its packed weights (padded to whole blocks) over its raw
    ones."""
    return padded_nbytes(w_shape, depthwise(node, w_shape), stem, block_groups(node, w_shape)) / (
        4.0 * math.prod(w_shape))


def _saving(node: Node, graph: Graph, path: str) -> float:
    """Seconds the blocked kernel is expected to save on conv ``node`` against the NCHW ``path``: its saving on
    the conv's own work, less the work on padding lanes (negative where that outweighs it)."""
    w = graph.infos[node.inputs[1]].shape
    _cout, cin_g, kh, kw = w
    y = graph.infos[node.outputs[0]].shape  # (N, Cout, OH, OW): a multiply-add per output and tap
    blocked = (1.0 - SAVING.get(path, 0.0)) * _pad_factor(node, tuple(w), path == "stem")
    calls = int(node.attrs.get("group", 1)) * GROUP_CALL_S if path == "grouped" else 0.0
    return (1.0 - blocked) * 2.0 * cin_g * kh * kw * math.prod(y) / CONV_RATE + calls


def _convert_cost(info: TensorInfo) -> float:
    return CONVERT_FIXED_S + 2.0 * info.nbytes / CONVERT_RATE


def _pool_ok(node: Node, graph: Graph, forced: Mapping[str, str]) -> bool:
    if node.name in forced or "MaxPool" in forced or len([o for o in node.outputs if o]) != 1:
        return False
    if node.attrs.get("act") is not None or any(int(d) != 1 for d in node.attrs.get("dilations", (1, 1))):
        return False
    x = graph.infos.get(node.inputs[0])
    if x is None or len(x.shape) != 4:
        return False
    try:
        g = pool_geometry(node, x.shape)
    except Exception:
        return False
    return g.pads_head[0] < g.kernel[0] and g.pads_head[1] < g.kernel[1]


def _concat_ok(node: Node, graph: Graph) -> bool:
    infos = [graph.infos.get(i) for i in node.inputs]
    return (int(node.attrs.get("axis", 0)) in (1, -3) and bool(infos)
            and all(t is not None and len(t.shape) == 4 and t.shape[1] % BLOCK == 0 and t.name not in graph.constants
                    for t in infos))


def _scale_input(node: Node, graph: Graph) -> int | None:
    """A squeeze-excitation's Mul: the position of its (N, C, H, W) input, the other a scale per channel (N or 1,
    C, 1, 1) computed at run time; None for any other node."""
    if node.op != "Mul" or len(node.inputs) != 2 or node.attrs.get("act") is not None \
            or any(t in graph.constants for t in node.inputs):
        return None
    a, b, y = (graph.infos.get(t) for t in (*node.inputs, node.outputs[0]))
    if a is None or b is None or y is None:
        return None
    for i, (x, sc) in enumerate(((a, b), (b, a))):
        if len(x.shape) == 4 and tuple(x.shape) == tuple(y.shape) and math.prod(x.shape[2:]) > 1 \
                and len(sc.shape) == 4 and tuple(sc.shape[1:]) == (x.shape[1], 1, 1) and sc.shape[0] in (1, x.shape[0]):
            return i
    return None


#: activations that keep zero at zero: a blocked tensor's padding lanes stay zero through them
_ZERO_KEEPING_ACTS = ("Relu", "LeakyRelu", "SiLU", "HardSwish", "Gelu", "Tanh")


def _scalar_input(node: Node, graph: Graph) -> int | None:
    """A Mul of an (N, C, H, W) activation by a constant scalar, its activation (if any) zero at zero (NF-Nets'
    gains between convs): the position of the activation; it runs on a blocked tensor as it is, its padding
    lanes staying zero. None for any other node."""
    if node.op != "Mul" or len(node.inputs) != 2:
        return None
    act = node.attrs.get("act")
    if act is not None and str(act[0]) not in _ZERO_KEEPING_ACTS:
        return None
    for i in (0, 1):
        x, c = node.inputs[i], node.inputs[1 - i]
        v = graph.constants.get(c)
        info = graph.infos.get(x)
        if (v is not None and v.size == 1 and np.isfinite(v).all() and x not in graph.constants and info is not None
                and len(info.shape) == 4 and tuple(graph.infos[node.outputs[0]].shape) == tuple(info.shape)):
            return i
    return None


def _unary_ok(node: Node, graph: Graph) -> bool:
    """A standalone activation that keeps zero at zero on an (N, C, H, W) tensor (a pre-activation residual
    block's SiLU or ReLU, whose input the skip also reads): elementwise, it runs on a blocked tensor as it is,
    its padding lanes staying zero. NF-RegNet-B0 converted out of and back into the blocked layout around twelve
    of them."""
    if node.op not in _ZERO_KEEPING_ACTS or len(node.inputs) != 1 or len([o for o in node.outputs if o]) != 1:
        return False
    act = node.attrs.get("act")
    if act is not None and str(act[0]) not in _ZERO_KEEPING_ACTS:
        return False
    x, y = graph.infos.get(node.inputs[0]), graph.infos.get(node.outputs[0])
    return x is not None and y is not None and len(x.shape) == 4 and tuple(x.shape) == tuple(y.shape)


def _kind(node: Node, graph: Graph, forced: Mapping[str, str], paths: dict[str, str]) -> str | None:
    """'conv' (its NCHW path recorded in ``paths``) and 'pool' (computed in the blocked layout), 'concat'
    (blocked parts concatenated as they are), 'gap' and 'scale' (a squeeze-excitation's pool and Mul), 'scalar' (a
    Mul by a constant, ``_scalar_input``), 'unary' (an activation zero at zero, ``_unary_ok``), or None (NCHW
    only)."""
    if node.inputs and any(graph.infos.get(t) is None or graph.infos[t].dtype != np.float32
                           or t in graph.runtime_shaped for t in node.inputs[:2 if node.op == "Mul" else 1]):
        return None
    if node.op == "Conv" and (path := _conv_path(node, graph, forced)) is not None:
        paths[node.name] = path
        return "stem" if path == "stem" else "conv"
    if node.op == "MaxPool" and _pool_ok(node, graph, forced):
        return "pool"
    if node.op == "Concat" and _concat_ok(node, graph):
        return "concat"
    if node.op == "GlobalAveragePool" and node.name not in forced and "GlobalAveragePool" not in forced \
            and len(graph.infos[node.inputs[0]].shape) == 4:
        return "gap"
    if _scale_input(node, graph) is not None and node.name not in forced and "Mul" not in forced:
        return "scale"
    if _scalar_input(node, graph) is not None and node.name not in forced and "Mul" not in forced:
        return "scalar"
    if _unary_ok(node, graph) and node.name not in forced and node.op not in forced:
        return "unary"
    return None


def _writes_blocked(p: Node | None, kept: set[str], kinds: Mapping[str, str]) -> bool:
    """Whether producer ``p`` writes its output blocked: kept, and not a 'gap' (one value per channel, written
    NCHW; a blocked reader of it pays a conversion). Counting a squeeze-excitation's pool as a blocked producer
    joined its two 1x1-map convs to the trunk's region with their conversions free: RegNetY-400MF converted
    fifteen pooled vectors in and fifteen gates out, ~3 us each, for convs that save a tenth of a microsecond."""
    return p is not None and p.name in kept and kinds[p.name] != "gap"


def _losing_regions(graph: Graph, kinds: Mapping[str, str], kept: set[str], prod: Mapping[str, Node],
                    cons: Mapping[str, list[Node]], saving: Mapping[str, float]) -> set[str]:
    """Nodes of the connected blocked regions whose conversions (into and out of the region) cost more than
    their convs save."""
    by_name = {n.name: n for n in graph.nodes}
    outs = {t.name for t in graph.outputs}
    # regions: kept nodes joined through the tensors they read blocked
    parent = {k: k for k in kept}

    def find(a: str) -> str:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    first_reader: dict[str, str] = {}
    for name in kept:
        n = by_name[name]
        for i in blocked_reads(n, kinds[name], graph):
            p = prod.get(n.inputs[i])
            if _writes_blocked(p, kept, kinds):
                parent[find(p.name)] = find(name)
            else:
                # readers of one converted tensor (a ResNet stage's strided conv and its downsampling) share
                # its conversion: one region
                other = first_reader.setdefault(n.inputs[i], name)
                parent[find(other)] = find(name)
    value: dict[str, float] = {}
    converted_in: set[tuple[str, str]] = set()
    for name in kept:
        n, r = by_name[name], find(name)
        v = saving.get(name, 0.0)
        for i in blocked_reads(n, kinds[name], graph):
            t = n.inputs[i]
            if not _writes_blocked(prod.get(t), kept, kinds) and (t, r) not in converted_in:
                converted_in.add((t, r))
                v -= _convert_cost(graph.infos[t])
        out = n.outputs[0]
        if kinds[name] != "gap" and (  # (a pool to one value per channel writes NCHW as it is)
                out in outs or not all(_reads_blocked(c, out, kinds, kept, graph) for c in cons.get(out, []))):
            v -= _convert_cost(graph.infos[out])
        value[r] = value.get(r, 0.0) + v
    return {name for name in kept if value[find(name)] < 0}


def _concat_pays(node: Node, fed: list[bool], graph: Graph, kinds: Mapping[str, str], kept: set[str],
                 cons: Mapping[str, list[Node]], outs: set[str]) -> bool:
    """Whether a concat of some blocked and some NCHW parts converts fewer bytes blocked (its NCHW parts in, its
    output out where something reads it in NCHW) than in NCHW (its blocked parts out, its output in where a
    blocked node reads it). unet_small's skip connections: the encoder's blocked output beside the upsampling's
    NCHW one, read by a blocked conv: blocked, one conversion of the upsampled half; in NCHW, two of the skip and
    of the whole concat."""
    size = {t: graph.infos[t].nbytes for t in node.inputs}
    out = node.outputs[0]
    readers = cons.get(out, [])
    read_blocked = [_reads_blocked(c, out, kinds, kept, graph) for c in readers]
    out_bytes = graph.infos[out].nbytes
    blocked = sum(size[t] for t, f in zip(node.inputs, fed) if not f) + (
        out_bytes if out in outs or not all(read_blocked) else 0)
    nchw = sum(size[t] for t, f in zip(node.inputs, fed) if f) + (out_bytes if any(read_blocked) else 0)
    return blocked < nchw


def _reads_blocked(node: Node, tensor: str, kinds: Mapping[str, str], kept: set[str], graph: Graph) -> bool:
    """Whether ``node`` is kept blocked and reads ``tensor`` in the blocked layout."""
    return node.name in kept and any(node.inputs[i] == tensor for i in blocked_reads(node, kinds[node.name], graph))


def blocked_reads(node: Node, kind: str | None, graph: Graph) -> list[int]:
    """Input positions a blocked node reads in the blocked layout."""
    if kind in ("conv", "stem"):  # a stem reads its input in NCHW
        return ([0] if kind == "conv" else []) + ([len(node.inputs) - 1] if node.attrs.get("residual") else [])
    if kind in ("pool", "gap", "unary"):
        return [0]
    if kind == "scale":
        i = _scale_input(node, graph)
        return [] if i is None else [i]
    if kind == "scalar":
        i = _scalar_input(node, graph)
        return [] if i is None else [i]
    if kind == "concat":
        return list(range(len(node.inputs)))
    return []


def plan_layout(graph: Graph, forced: Mapping[str, str] | None = None) -> LayoutPlan:
    """The nodes of ``graph`` to run blocked. ``forced``: the load's kernel choices ({node or op type: kernel});
    a node whose kernel is forced keeps its layout (the choice names an NCHW kernel).

    A conv is kept where it has a blocked neighbour (a blocked producer of what it reads blocked, a blocked
    reader of its output, or another blocked conv reading the same input, whose conversion they share): alone it
    would pay a conversion each way for the packing it saves. A pool is kept only where everything it reads comes
    blocked: it saves no packing to pay a conversion with; a concat where its parts all come blocked, or some do
    and blocking it converts fewer bytes (``_concat_pays``)."""
    forced = forced or {}
    if any(isinstance(d, str) for ds in graph.dims.values() for d in tuple(ds)[2:]):
        # a dynamic map size: the plan reads it, and every shape of the model must share its weights
        return LayoutPlan()
    paths: dict[str, str] = {}
    kinds = {n.name: k for n in graph.nodes if (k := _kind(n, graph, forced, paths)) is not None}
    by_name = {n.name: n for n in graph.nodes}
    saving = {name: _saving(by_name[name], graph, path) for name, path in paths.items()}
    prod = graph.producers()
    cons = graph.consumers()
    outs = {t.name for t in graph.outputs}
    kept = set(kinds)
    while True:
        nxt = set()
        for name in kept:
            n, k = by_name[name], kinds[name]
            reads = [n.inputs[i] for i in blocked_reads(n, k, graph)]
            fed = [_writes_blocked(prod.get(i), kept, kinds) for i in reads]
            read_out = [_reads_blocked(c, n.outputs[0], kinds, kept, graph) for c in cons.get(n.outputs[0], [])]
            if k in ("pool", "gap", "scale", "scalar", "unary"):
                ok = all(fed)
            elif k == "concat":
                ok = all(fed) or (any(fed) and _concat_pays(n, fed, graph, kinds, kept, cons, outs))
            elif paths[name] == "depthwise":
                # a depthwise conv saves nothing blocked (native/dwconv.c is as fast): only where both sides
                # are blocked, so that it spares the conversions (a squeeze-excitation after it: where its pool
                # and Mul are blocked too)
                ok = all(fed) and bool(read_out) and all(read_out) and n.outputs[0] not in outs
            else:
                # (ALONE_PATHS save more than their two conversions cost even alone: the region check below
                # weighs them)
                ok = paths[name] in ALONE_PATHS or any(fed) or any(read_out) \
                    or any(c.name != name and c.name in kept and kinds[c.name] == "conv"
                           and c.inputs[0] == t for t in reads for c in cons.get(t, []))
            if ok:
                nxt.add(name)
        if nxt == kept:
            dropped = _losing_regions(graph, kinds, kept, prod, cons, saving)
            if not dropped:
                break
            nxt = kept - dropped
        kept = nxt
    return LayoutPlan(tuple(n.name for n in graph.nodes if n.name in kept),
                      tuple(kinds[n.name] for n in graph.nodes if n.name in kept))


def apply_layout(graph: Graph, plan: LayoutPlan) -> Graph:
    """``graph`` with ``plan``'s nodes in the blocked layout (convs as ``inferd.ConvNchwc``, max pools as
    ``inferd.MaxPoolNchwc``, concats as they are on the blocked twins of their parts) and the conversions they
    need; ``graph`` itself is left as it was. Tensors keep their names in NCHW; a blocked twin is named
    ``name + SUFFIX``."""
    kinds = dict(zip(plan.blocked, plan.kinds))
    if not kinds:
        return graph
    infos = dict(graph.infos)

    def twin(name: str) -> str:
        t = graph.infos[name]
        n, c, h, w = t.shape
        bn = name + SUFFIX
        infos[bn] = TensorInfo(bn, (n, blocks(c), h, w, BLOCK), t.dtype)
        return bn

    # tensors blocked nodes write, and those of them something reads in NCHW (or the graph gives out)
    made_blocked = {n.outputs[0] for n in graph.nodes if kinds.get(n.name) not in (None, "gap")}
    nchw_readers: set[str] = {t.name for t in graph.outputs} & made_blocked
    for n in graph.nodes:
        bl = blocked_reads(n, kinds.get(n.name), graph)
        nchw_readers.update(name for i, name in enumerate(n.inputs) if name in made_blocked and i not in bl)
    converted: set[str] = set()
    nodes: list[Node] = []
    for n in graph.nodes:
        kind = kinds.get(n.name)
        if kind is None:
            nodes.append(n)  # (only blocked nodes read blocked twins: its inputs are as they were)
            continue
        ins = list(n.inputs)
        for i in blocked_reads(n, kind, graph):
            name = ins[i]
            if name not in made_blocked and name not in converted:
                # an NCHW tensor read blocked: converted once, just before its first blocked reader
                nodes.append(Node(f"{name}{SUFFIX}#to", TO, [name], [twin(name)], {}))
                converted.add(name)
            ins[i] = name + SUFFIX
        out = n.outputs[0]
        # (Node(...) rather than dataclasses.replace: replace looks the fields up and goes through keywords, per
        # blocked node of every CPU load)
        if kind == "gap":  # (one value per channel: NCHW as it is)
            nodes.append(Node(n.name, GAP, ins, n.outputs, {"channels": int(graph.infos[out].shape[1])}, n.domain,
                              n.bodies, n.notes))
            continue
        if kind == "scale":  # the blocked input first
            i = blocked_reads(n, kind, graph)[0]
            ins = [ins[i], ins[1 - i]]
        op = {"conv": CONV, "stem": CONV, "pool": MAXPOOL, "concat": n.op, "scale": SCALE, "scalar": n.op,
              "unary": n.op}[kind]
        # a concat's axis as the blocks' axis of the 5-D twins (-3 of NCHW would name their rows)
        attrs = {**n.attrs, "axis": 1} if kind == "concat" else dict(n.attrs)
        nodes.append(Node(n.name, op, ins, [twin(out)], attrs, n.domain, n.bodies, n.notes))
        if out in nchw_readers:
            nodes.append(Node(f"{out}{SUFFIX}#from", FROM, [out + SUFFIX], [out],
                              {"channels": int(graph.infos[out].shape[1])}))
    return Graph(graph.name, nodes, list(graph.inputs), list(graph.outputs), graph.constants, infos, graph.opset,
                 dict(graph.dims), set(graph.runtime_shaped))


def blocked_graph(graph: Graph, forced: Mapping[str, str] | None = None) -> Graph:
    """``apply_layout(graph, plan_layout(graph, forced))``."""
    return apply_layout(graph, plan_layout(graph, forced))


# --------------------------------------------------------------------------- CPU-graph fusions (after the layout)


def _sole_reader(graph: Graph, cons: Mapping[str, list[Node]], t: str, node: Node) -> bool:
    """Whether ``node`` is the one reader of tensor ``t`` (read once, not a graph output): a fusion may drop it."""
    return (t not in {o.name for o in graph.outputs} and [id(n) for n in cons.get(t, [])] == [id(node)]
            and node.inputs.count(t) == 1)


def _has_ops(graph: Graph, *ops: str) -> bool:
    """Whether ``graph`` has a node of each of ``ops``. The fusions below run at every open of a CPU package (a
    package does not record them); this spares a graph without their pattern its consumers' map (shufflenetv2: the
    three passes 0.20 -> 0.014 ms, mobilenetv2 0.10 -> 0.010 ms, hot)."""
    present = {n.op for n in graph.nodes}
    return all(op in present for op in ops)


def _with_nodes(graph: Graph, replaced: Mapping[int, Node], drop: set[int]) -> Graph:
    """``graph`` with the nodes keyed by id in ``replaced`` swapped in and those in ``drop`` left out."""
    if not replaced:
        return graph
    nodes = [replaced.get(id(n), n) for n in graph.nodes if id(n) not in drop]
    return Graph(graph.name, nodes, list(graph.inputs), list(graph.outputs), graph.constants, dict(graph.infos),
                 graph.opset, dict(graph.dims), set(graph.runtime_shaped))


# --------------------------------------------------------------------------- transposes around MatMul


def _collapsible(shape: tuple[int, ...], perm: tuple[int, ...]) -> bool:
    """Whether the batch axes (all but the last two) of a C-contiguous tensor of ``shape`` read through
    ``transpose(perm)`` merge into one strided axis: the native GEMM takes one batch stride per operand."""
    strides = [0] * len(shape)
    acc = 1
    for i in range(len(shape) - 1, -1, -1):
        strides[i] = acc
        acc *= int(shape[i])
    dims = [(int(shape[p]), strides[p]) for p in perm[:-2] if int(shape[p]) != 1]
    return all(dims[i][1] == dims[i + 1][1] * dims[i + 1][0] for i in range(len(dims) - 1))


def absorb_transposes(graph: Graph, kernels: Mapping[str, str] | None = None) -> Graph:
    """``graph`` with each Transpose that only feeds a MatMul of two activations, or that only reads one, absorbed
    into it (``inferd.MatMulT``: the native GEMM packs both operands per call, so it reads them, and writes its
    output, through the transposed views at no cost). Attention exports write k^T and the heads' merge as such
    Transposes: vit_tiny's were 3.7 us of copies per block, 44 us a run on two Zen 3 cores. ``graph`` is left as it
    was; a MatMul with a fused bias, residual or activation, or one ``kernels`` forces to another kernel than
    ``matmul_native``, stays as it is."""
    from ..ops.gemm import MATMUL_T, inverse_perm

    if graph.runtime_shaped or not _has_ops(graph, "MatMul", "Transpose"):
        return graph
    kernels = kernels or {}
    outs = {t.name for t in graph.outputs}
    prods = graph.producers()
    cons = graph.consumers()
    f32 = np.dtype(np.float32)

    def perm_of(tr: Node, rank: int) -> tuple[int, ...]:
        p = tr.attr("perm")
        return tuple(range(rank - 1, -1, -1)) if p is None else tuple(int(i) for i in p)

    drop: set[int] = set()
    replaced: dict[int, Node] = {}
    for node in graph.nodes:
        if (node.op != "MatMul" or len(node.inputs) != 2 or node.attr("act") is not None or node.attr("residual")
                or node.attr("bias") or kernels.get(node.name, "matmul_native") != "matmul_native"
                or any(not i or i in graph.constants or i not in graph.infos for i in node.inputs)
                or any(np.dtype(graph.infos[t].dtype) != f32 for t in (*node.inputs, node.outputs[0]))
                or any(len(graph.infos[i].shape) < 2 for i in node.inputs)):
            continue
        ins, attrs, absorbed = list(node.inputs), {}, []
        for k, key in ((0, "perm_a"), (1, "perm_b")):
            tr = prods.get(ins[k])
            if tr is None or tr.op != "Transpose" or id(tr) in drop or not _sole_reader(graph, cons, ins[k], node):
                continue
            src = tr.inputs[0]
            if not src or src in graph.constants or src not in graph.infos:
                continue
            shape = tuple(graph.infos[src].shape)
            perm = perm_of(tr, len(shape))
            if not _collapsible(shape, perm):
                continue
            attrs[key] = list(perm)
            absorbed.append(ins[k])
            ins[k] = src
            drop.add(id(tr))
        out = node.outputs[0]
        readers = cons.get(out, [])
        if out not in outs and len(readers) == 1 and readers[0].op == "Transpose" and id(readers[0]) not in drop:
            tr = readers[0]
            y = tuple(graph.infos[out].shape)
            perm = perm_of(tr, len(y))
            if tr.outputs[0] and _collapsible(tuple(y[i] for i in perm), inverse_perm(perm)):
                attrs["perm_y"] = list(perm)
                absorbed.append(out)
                out = tr.outputs[0]
                drop.add(id(tr))
        if attrs:
            replaced[id(node)] = Node(node.name, MATMUL_T, ins, [out],
                                      {**attrs, "_absorbed": [*node.attrs.get("_absorbed", []), *absorbed]})
    return _with_nodes(graph, replaced, drop)

# --------------------------------------------------------------------------- F.normalize


def _clip_min(node: Node, graph: Graph) -> float | None:
    """The lower bound of a Clip with a constant scalar lower bound and none above, else None."""
    lo, hi = node.attr("min"), node.attr("max")
    if len(node.inputs) > 1 and node.inputs[1]:
        v = graph.constants.get(node.inputs[1])
        lo = float(v.reshape(-1)[0]) if v is not None and v.size == 1 else None
    if len(node.inputs) > 2 and node.inputs[2]:
        return None
    if hi is not None and np.isfinite(float(hi)):
        return None
    return None if lo is None else float(lo)


def fuse_scale_gain(graph: Graph, kernels: Mapping[str, str] | None = None) -> Graph:
    """``graph`` (after the layout) with each blocked squeeze-excitation scale whose one reader is a blocked Mul by
    a constant scalar (an activation of it, if any, zero at zero: NF-Nets' ``act(gain * se(x))``) as one
    ``inferd.ScaleNchwc`` with attributes ``mult`` and ``act``: the gain multiplies the per-channel scale, the
    activation runs on each span just written, where the Mul was a pass of its own over the map (NF-RegNet-B0: 16
    of them, 2-11 us each at 64x64). Not where ``kernels`` forces the Mul's kernel. ``graph`` is left as it was."""
    if not _has_ops(graph, SCALE, "Mul"):
        return graph
    kernels = kernels or {}
    cons = graph.consumers()
    drop: set[int] = set()
    replaced: dict[int, Node] = {}
    for sc in graph.nodes:
        if sc.op != SCALE or "mult" in sc.attrs or "act" in sc.attrs:
            continue
        y = sc.outputs[0]
        readers = cons.get(y, [])
        mul = readers[0] if len(readers) == 1 else None
        if (mul is None or mul.op != "Mul" or len(mul.inputs) != 2 or not _sole_reader(graph, cons, y, mul)
                or mul.name in kernels or "Mul" in kernels or set(mul.attrs) - {"act", "_absorbed", "_opset"}):
            continue
        c = graph.constants.get(mul.inputs[1 - mul.inputs.index(y)])
        act = mul.attrs.get("act")
        if c is None or c.size != 1 or not np.isfinite(c).all() or (
                act is not None and (str(act[0]) not in _ZERO_KEEPING_ACTS or str(act[0]) not in NATIVE_ACTS)):
            continue
        gain = float(np.asarray(c, dtype=np.float64).reshape(-1)[0])
        replaced[id(sc)] = replace(sc, outputs=list(mul.outputs), attrs={
            **sc.attrs, "mult": gain, **({"act": act} if act is not None else {}),
            "_absorbed": [*sc.attrs.get("_absorbed", []), y, *mul.attrs.get("_absorbed", [])]})
        drop.add(id(mul))
    return _with_nodes(graph, replaced, drop)


def fuse_l2_normalize(graph: Graph, kernels: Mapping[str, str] | None = None) -> Graph:
    """``graph`` with each x / Expand(Clip(ReduceL2(x, last axis, keepdims), min=eps)) -- torch's F.normalize
    as exported, the Expand optional -- as one ``inferd.L2Normalize`` of x (float32, every intermediate read only
    by the next; not where ``kernels`` forces the Div's kernel). ``graph`` is left as it was."""
    from ..ops.norm import L2NORM

    if graph.runtime_shaped or not _has_ops(graph, "Div", "ReduceL2"):
        return graph
    prods = graph.producers()
    cons = graph.consumers()

    def only(t: str, node: Node) -> bool:
        return _sole_reader(graph, cons, t, node)

    drop: set[int] = set()
    replaced: dict[int, Node] = {}
    for div in graph.nodes:
        if (div.op != "Div" or len(div.inputs) != 2 or div.attr("act") is not None
                or (kernels or {}).get(div.name, "l2norm_native") != "l2norm_native"):
            continue
        x, d = div.inputs
        info = graph.infos.get(x)
        if (not x or x in graph.constants or info is None or not info.shape
                or np.dtype(info.dtype) != np.float32 or graph.infos[div.outputs[0]].shape != info.shape):
            continue
        chain = []
        p = prods.get(d)
        if p is not None and p.op == "Expand" and only(d, div):
            chain.append(p)
            d, p = p.inputs[0], prods.get(p.inputs[0])
            user = chain[-1]
        else:
            user = div
        if p is None or p.op != "Clip" or not only(d, user):
            continue
        eps = _clip_min(p, graph)
        if eps is None:
            continue
        chain.append(p)
        r = p.inputs[0]
        red = prods.get(r)
        if red is None or red.op != "ReduceL2" or not only(r, p) or red.inputs[0] != x:
            continue
        axes = red.attr("axes")
        if len(red.inputs) > 1 and red.inputs[1]:
            v = graph.constants.get(red.inputs[1])
            axes = None if v is None else [int(a) for a in v.reshape(-1)]
        rank = len(info.shape)
        if (axes is None or [a + rank if a < 0 else a for a in axes] != [rank - 1]
                or int(red.attr("keepdims", 1)) != 1):
            continue
        chain.append(red)
        drop.update(id(n) for n in chain)
        replaced[id(div)] = Node(div.name, L2NORM, [x], list(div.outputs), {
            "eps": eps, "_absorbed": [*div.attrs.get("_absorbed", []), *(n.outputs[0] for n in chain)]})
    return _with_nodes(graph, replaced, drop)
