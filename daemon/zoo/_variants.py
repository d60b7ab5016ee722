"""Model variants: the zoo's architectures re-drawn at other widths, resolutions, depths and kernel sizes.

The latency predictor trains and is evaluated on models no one tuned for (nn-Meter's point: a
predictor fitted to a handful of famous models says little about the next one). A variant is a
:class:`VariantSpec`; :func:`variant_specs` draws a deterministic list of them over several families
and :func:`build_variant` builds one as ONNX with :class:`GraphBuilder`, as the zoo builds its models.
Whether a variant is held out of training is a property of its name (a hash), so the split does not
change when more variants are drawn.
"""
from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass

import numpy as np
import onnx

from . import _cnn, _vit
from ._graph import GraphBuilder

#: the families a variant is drawn from (each one a zoo architecture with knobs); "vit": vit_tiny's graph (its
#: linear layers, attention products, LayerNorm, Softmax, GELU), which the convolutional families have none of
FAMILIES = ("resnet", "bottleneck", "mobilenetv2", "efficientnet", "squeezenet", "vgg", "vit")
WIDTHS = (0.25, 0.35, 0.5, 0.75, 1.0)
#: input resolutions: the 2-core machine measures hundreds of these, so the top stays at 192
RESOLUTIONS = (64, 96, 112, 128, 160, 192)
DEPTHS = (0.5, 0.75, 1.0)
KERNELS = (3, 5, 7)


@dataclass(frozen=True)
class VariantSpec:
    family: str
    width: float
    resolution: int
    depth: float
    kernel: int  # depthwise / main kernel size where the family has a choice; vit: its MLP ratio (3: 4x, 5: 2x)
    classes: int = 1000

    @property
    def name(self) -> str:
        return (f"{self.family}_w{int(round(self.width * 100)):03d}_r{self.resolution}_d{int(round(self.depth * 100)):03d}"
                f"_k{self.kernel}")

    @property
    def held_out(self) -> bool:
        """Whether this variant is kept out of training (about 30%, fixed by its name)."""
        return hashlib.sha256(self.name.encode()).digest()[0] < 77

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        return (1, 3, self.resolution, self.resolution)


def _ch(c: float, width: float, div: int = 8) -> int:
    """Channels scaled by ``width``, rounded to a multiple of ``div`` as MobileNet's make_divisible does."""
    v = max(div, int(c * width + div / 2) // div * div)
    return v if v >= 0.9 * c * width else v + div


def _n(n: int, depth: float) -> int:
    return max(1, int(round(n * depth)))


def _resnet(g: GraphBuilder, x: str, s: VariantSpec, bottleneck: bool) -> str:
    stem = _ch(64, s.width)
    y = g.conv(x, "conv1", 3, stem, s.kernel if s.kernel != 5 else 7, 2, (s.kernel if s.kernel != 5 else 7) // 2,
               gain=1.0)
    y = g.relu(g.bn(y, "bn1", stem), "relu")
    y = g.maxpool(y, 3, 2, 1, scope="maxpool")
    cin = stem
    layers = [3, 4, 6, 3] if bottleneck else [2, 2, 2, 2]
    for li, (n, width) in enumerate(zip(layers, [64, 128, 256, 512])):
        w = _ch(width, s.width)
        for bi in range(_n(n, s.depth)):
            stride = 2 if (li > 0 and bi == 0) else 1
            name = f"layer{li + 1}.{bi}"
            if bottleneck:
                y = _cnn._bottleneck(g, y, name, cin, w, stride)
                cin = w * 4
            else:
                y = _cnn._basic_block(g, y, name, cin, w, stride)
                cin = w
    y = g.gap_flatten(y, "avgpool")
    return g.gemm(y, "fc", cin, s.classes)


def _mobilenetv2(g: GraphBuilder, x: str, s: VariantSpec) -> str:
    settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]
    c0 = _ch(32, s.width)
    y = _cnn._conv_bn_relu6(g, x, "features.0", 3, c0, 3, 2, gain=1.0)
    cin, idx = c0, 1
    for t, c, n, st in settings:
        c = _ch(c, s.width)
        for i in range(_n(n, s.depth)):
            stride = st if i == 0 else 1
            name = f"features.{idx}.conv"
            hidden = cin * t
            h, j = y, 0
            if t != 1:
                h = _cnn._conv_bn_relu6(g, h, f"{name}.{j}", cin, hidden, 1, 1, gain=1.0)
                j += 1
            h = _cnn._conv_bn_relu6(g, h, f"{name}.{j}", hidden, hidden, s.kernel, stride, groups=hidden)
            h = g.conv(h, f"{name}.{j + 1}", hidden, c, 1)
            res = stride == 1 and cin == c
            h = g.bn(h, f"{name}.{j + 2}", c, gamma=_cnn._RES_GAMMA if res else (0.5, 1.5))
            y = g.op("Add", [y, h], f"features.{idx}") if res else h
            cin, idx = c, idx + 1
    last = _ch(1280, max(1.0, s.width))
    y = _cnn._conv_bn_relu6(g, y, f"features.{idx}", cin, last, 1, 1, gain=1.0)
    y = g.gap_flatten(y, "pool")
    return g.gemm(y, "classifier.1", last, s.classes)


def _efficientnet(g: GraphBuilder, x: str, s: VariantSpec) -> str:
    table = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
             (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1)]
    c0 = _ch(32, s.width)
    y = _cnn._conv_bn_silu(g, x, "features.0", 3, c0, 3, 2, gain=1.0)
    prev = c0
    for si, (e, k, st, _cin0, cout, n) in enumerate(table):
        cout = _ch(cout, s.width)
        k = s.kernel if k == 5 else 3  # the variant's kernel size replaces B0's 5x5 stages
        for i in range(_n(n, s.depth)):
            cin = prev
            stride = st if i == 0 else 1
            name = f"features.{si + 1}.{i}.block"
            hidden = cin * e
            h, j = y, 0
            if e != 1:
                h = _cnn._conv_bn_silu(g, h, f"{name}.{j}", cin, hidden, 1, 1, gain=1.0)
                j += 1
            h = _cnn._conv_bn_silu(g, h, f"{name}.{j}", hidden, hidden, k, stride, groups=hidden)
            j += 1
            sq = max(1, cin // 4)
            se = f"{name}.{j}"
            p = g.op("GlobalAveragePool", [h], f"{se}.avgpool")
            p = g.conv(p, f"{se}.fc1", hidden, sq, 1, bias=True, gain=_cnn._SILU_GAIN)
            p = g.silu(p, f"{se}.activation")
            p = g.conv(p, f"{se}.fc2", sq, hidden, 1, bias=True, gain=0.25)
            p = g.op("Sigmoid", [p], f"{se}.scale_activation")
            h = g.op("Mul", [p, h], se)
            j += 1
            h = g.conv(h, f"{name}.{j}.0", hidden, cout, 1, gain=2.75 * _cnn._SILU_GAIN)
            res = stride == 1 and cin == cout
            h = g.bn(h, f"{name}.{j}.1", cout, gamma=_cnn._RES_GAMMA if res else (0.5, 1.5))
            y = g.op("Add", [h, y], f"features.{si + 1}.{i}") if res else h
            prev = cout
    last = _ch(1280, max(1.0, s.width))
    y = _cnn._conv_bn_silu(g, y, "features.8", prev, last, 1, 1, gain=1.0)
    y = g.gap_flatten(y, "avgpool")
    return g.gemm(y, "classifier.1", last, s.classes, gain=_cnn._SILU_GAIN)


def _squeezenet(g: GraphBuilder, x: str, s: VariantSpec) -> str:
    c0 = _ch(64, s.width)
    y = g.relu(g.conv(x, "features.0", 3, c0, 3, 2, bias=True, gain=1.0), "features.1")
    y = g.maxpool(y, 3, 2, ceil=True, scope="features.2")
    fires = [[(16, 64)] * 2, [(32, 128)] * 2, [(48, 192)] * 2 + [(64, 256)] * 2]
    cin, idx = c0, 3
    for si, stage in enumerate(fires):
        keep = stage[:max(1, int(round(len(stage) * s.depth)))]
        for sq, e in keep:
            sq, e = _ch(sq, s.width), _ch(e, s.width)
            a = g.relu(g.conv(y, f"features.{idx}.squeeze", cin, sq, 1, bias=True), f"features.{idx}.sa")
            b1 = g.relu(g.conv(a, f"features.{idx}.expand1x1", sq, e, 1, bias=True), f"features.{idx}.e1a")
            b3 = g.relu(g.conv(a, f"features.{idx}.expand3x3", sq, e, s.kernel, pad=s.kernel // 2, bias=True),
                        f"features.{idx}.e3a")
            y = g.op("Concat", [b1, b3], f"features.{idx}", axis=1)
            cin, idx = 2 * e, idx + 1
        if si < 2:
            y = g.maxpool(y, 3, 2, ceil=True, scope=f"features.{idx}")
            idx += 1
    y = g.relu(g.conv(y, "classifier.1", cin, s.classes, 1, bias=True), "classifier.2")
    return g.gap_flatten(y, "classifier.3")


def _vgg(g: GraphBuilder, x: str, s: VariantSpec) -> str:
    # vgg11's layout (vgg16's FC head would make every variant 500 MB): convs, pools, a small head
    cfg = [[64], [128], [256, 256], [512, 512], [512, 512]]
    y, cin, i = x, 3, 0
    for stage in cfg:
        for v in stage[:max(1, int(round(len(stage) * s.depth)))]:
            v = _ch(v, s.width)
            y = g.relu(g.conv(y, f"features.{i}", cin, v, s.kernel, pad=s.kernel // 2, bias=True,
                              gain=1.0 if cin == 3 else 2.0), f"features.{i}")
            cin, i = v, i + 1
        y = g.maxpool(y, 2, 2, scope=f"features.{i}")
        i += 1
    y = g.gap_flatten(y, "avgpool")
    hidden = _ch(512, s.width)
    y = g.relu(g.gemm(y, "classifier.0", cin, hidden), "classifier.1")
    return g.gemm(y, "classifier.3", hidden, s.classes)


def vit_config(s: VariantSpec) -> _vit.Vit:
    """A vit variant's sizes: heads of 64 channels, 1 to 4 of them by width (vit_tiny has 3), 12 blocks at
    full depth, patches of 16, the MLP 4x (kernel 3) or 2x (kernel 5) the embedding."""
    heads = max(1, int(round(4 * s.width)))
    return _vit.Vit(embed=64 * heads, depth=_n(12, s.depth), heads=heads, mlp_ratio=4 if s.kernel == 3 else 2,
                    patch=16, resolution=s.resolution)


def build_variant(spec: VariantSpec, seed: int = 0) -> onnx.ModelProto:
    """The ONNX model of ``spec`` with seeded random weights (same spec and seed -> same bytes)."""
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
    g = GraphBuilder(rng)
    x = "input"
    if spec.family in ("resnet", "bottleneck"):
        out = _resnet(g, x, spec, spec.family == "bottleneck")
    elif spec.family == "mobilenetv2":
        out = _mobilenetv2(g, x, spec)
    elif spec.family == "efficientnet":
        out = _efficientnet(g, x, spec)
    elif spec.family == "squeezenet":
        out = _squeezenet(g, x, spec)
    elif spec.family == "vgg":
        out = _vgg(g, x, spec)
    elif spec.family == "vit":
        out = _vit.vit(g, x, vit_config(spec), spec.classes)
    else:
        raise KeyError(f"unknown variant family {spec.family!r}; known: {FAMILIES}")
    return g.finish(spec.name, [("input", spec.input_shape)], [("output", (1, spec.classes))], [out],
                    f"inferd variant {spec.name}", {"inferd.variant": spec.name, "inferd.zoo.seed": str(seed)})


def variant_specs(count: int = 240, seed: int = 0) -> list[VariantSpec]:
    """``count`` distinct variants, the families in turn, knobs drawn from ``seed`` (deterministic)."""
    rng = np.random.default_rng([seed, 0x5EED])
    out: list[VariantSpec] = []
    seen: set[str] = set()
    fam = 0
    tries = 0
    while len(out) < count and tries < count * 50:
        tries += 1
        f = FAMILIES[fam % len(FAMILIES)]
        width = float(rng.choice(WIDTHS))
        res = int(rng.choice(RESOLUTIONS))
        depth = float(rng.choice(DEPTHS))
        kernel = int(rng.choice(KERNELS if f in ("mobilenetv2", "efficientnet") else (3, 5)))
        if f in ("bottleneck", "vgg") and width * width * res * res > 0.5 * 160 * 160:
            continue  # the heavy families stay small enough to measure by the hundred on a 2-core board
        s = VariantSpec(f, width, res, depth, kernel)
        if s.name in seen:
            continue
        seen.add(s.name)
        out.append(s)
        fam += 1
    return out


def neighbour(spec: VariantSpec, rng: np.random.Generator, tries: int = 20) -> VariantSpec | None:
    """A variant near ``spec`` (same family; width and resolution moved by up to ~25%, depth and kernel perhaps
    one step), never one of the held-out variants: adaptive sampling refines around a bad point with these."""
    for _ in range(tries):
        width = float(np.clip(round(spec.width * rng.uniform(0.75, 1.25), 2), 0.2, 1.25))
        res = int(np.clip(int(round(spec.resolution * rng.uniform(0.75, 1.25) / 8)) * 8, 48, 224))
        depth = spec.depth if rng.random() < 0.6 else float(rng.choice(DEPTHS))
        kernels = KERNELS if spec.family in ("mobilenetv2", "efficientnet") else (3, 5)
        kernel = spec.kernel if rng.random() < 0.7 else int(rng.choice(kernels))
        if spec.family in ("bottleneck", "vgg") and width * width * res * res > 0.5 * 160 * 160:
            continue
        s = VariantSpec(spec.family, width, res, depth, kernel, spec.classes)
        if s.name != spec.name and not s.held_out:
            return s
    return None


def corner_specs() -> list[VariantSpec]:
    """Variants at the top of the space, per family and kernel size (full width, resolutions 192-208), never held
    out: a random draw leaves whole regions to the held-out share by chance (all three MobileNetV2 7x7 variants at
    192 were held out, so no training model had a 7x7 stride-2 depthwise layer with 48x48 outputs, and its slow
    per-channel form went unseen). VGG and the bottleneck ResNet at the size :func:`neighbour` allows them."""
    out = []
    for fam in FAMILIES:
        kernels = KERNELS if fam in ("mobilenetv2", "efficientnet") else (3, 5)
        for k in kernels:
            for res in (192, 200, 208):
                width = 1.0
                if fam in ("bottleneck", "vgg"):
                    width = round(float(np.sqrt(0.5) * 160 / res) - 0.005, 2)
                s = VariantSpec(fam, width, res, 1.0, k)
                if not s.held_out:
                    out.append(s)
                    break
    return out
