"""Convolutional zoo models, layer for layer as torchvision defines them (eval mode, opset 17).

Every builder takes a :class:`GraphBuilder` and the input tensor name and returns the output
tensor name. Shapes are not tracked by the builder, so the few ops that need concrete
sizes (Reshape in shufflenet) get them from the known 224x224 geometry.
"""

from __future__ import annotations

import numpy as np

from ._graph import GraphBuilder

# --------------------------------------------------------------------------- tiny models


def tiny(g: GraphBuilder, x: str) -> str:
    y = g.conv(x, "conv", 3, 8, 3, pad=1, bias=True, gain=1.0)
    y = g.relu(y, "relu")
    y = g.gap_flatten(y, "pool")
    return g.gemm(y, "fc", 8, 10)


def mlp_small(g: GraphBuilder, x: str) -> str:
    y = g.gemm(x, "fc1", 64, 128, gain=1.0)
    y = g.relu(y, "relu")
    y = g.gemm(y, "fc2", 128, 10)
    return g.op("Softmax", [y], "softmax", axis=1)


# --------------------------------------------------------------------------- resnet

# The last BN of each residual branch gets a smaller gamma: otherwise the variance of the
# residual stream doubles with every block (torchvision's zero_init_residual idea, softened
# so the branch still contributes).
_RES_GAMMA = (0.2, 0.6)
# The shortcut projection sees the whole residual stream (branch + identity, with a large
# positive mean after ReLU); unit gain stops the stream growing at every stage.
_SHORTCUT_GAIN = 1.0


def _basic_block(g: GraphBuilder, x: str, name: str, cin: int, cout: int, stride: int) -> str:
    y = g.conv(x, f"{name}.conv1", cin, cout, 3, stride, 1)
    y = g.relu(g.bn(y, f"{name}.bn1", cout), f"{name}.relu")
    y = g.conv(y, f"{name}.conv2", cout, cout, 3, 1, 1)
    y = g.bn(y, f"{name}.bn2", cout, gamma=_RES_GAMMA)
    if stride != 1 or cin != cout:
        x = g.conv(x, f"{name}.downsample.0", cin, cout, 1, stride, gain=_SHORTCUT_GAIN)
        x = g.bn(x, f"{name}.downsample.1", cout)
    return g.relu(g.op("Add", [y, x], name), f"{name}.relu_1")


def _bottleneck(g: GraphBuilder, x: str, name: str, cin: int, width: int, stride: int) -> str:
    cout = width * 4
    y = g.conv(x, f"{name}.conv1", cin, width, 1)
    y = g.relu(g.bn(y, f"{name}.bn1", width), f"{name}.relu")
    # torchvision's ResNet v1.5: the stride sits on the 3x3 conv.
    y = g.conv(y, f"{name}.conv2", width, width, 3, stride, 1)
    y = g.relu(g.bn(y, f"{name}.bn2", width), f"{name}.relu_1")
    y = g.conv(y, f"{name}.conv3", width, cout, 1)
    y = g.bn(y, f"{name}.bn3", cout, gamma=_RES_GAMMA)
    if stride != 1 or cin != cout:
        x = g.conv(x, f"{name}.downsample.0", cin, cout, 1, stride, gain=_SHORTCUT_GAIN)
        x = g.bn(x, f"{name}.downsample.1", cout)
    return g.relu(g.op("Add", [y, x], name), f"{name}.relu_2")


def _resnet(g: GraphBuilder, x: str, bottleneck: bool, layers: list[int]) -> str:
    y = g.conv(x, "conv1", 3, 64, 7, 2, 3, gain=1.0)
    y = g.relu(g.bn(y, "bn1", 64), "relu")
    y = g.maxpool(y, 3, 2, 1, scope="maxpool")
    cin = 64
    for li, (n, width) in enumerate(zip(layers, [64, 128, 256, 512])):
        for bi in range(n):
            stride = 2 if (li > 0 and bi == 0) else 1
            name = f"layer{li + 1}.{bi}"
            if bottleneck:
                y = _bottleneck(g, y, name, cin, width, stride)
                cin = width * 4
            else:
                y = _basic_block(g, y, name, cin, width, stride)
                cin = width
    y = g.gap_flatten(y, "avgpool")
    return g.gemm(y, "fc", cin, 1000)


def resnet18(g: GraphBuilder, x: str) -> str:
    return _resnet(g, x, False, [2, 2, 2, 2])


def resnet50(g: GraphBuilder, x: str) -> str:
    return _resnet(g, x, True, [3, 4, 6, 3])


# --------------------------------------------------------------------------- mobilenet_v2


def _conv_bn_relu6(g: GraphBuilder, x: str, name: str, cin: int, cout: int, k: int, stride: int, groups: int = 1,
                   gain: float = 2.0) -> str:
    y = g.conv(x, f"{name}.0", cin, cout, k, stride, (k - 1) // 2, groups, gain=gain)
    y = g.bn(y, f"{name}.1", cout)
    return g.relu6(y, f"{name}.2")


def mobilenetv2(g: GraphBuilder, x: str) -> str:
    settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]
    y = _conv_bn_relu6(g, x, "features.0", 3, 32, 3, 2, gain=1.0)
    cin, idx = 32, 1
    for t, c, n, s in settings:
        for i in range(n):
            stride = s if i == 0 else 1
            name = f"features.{idx}.conv"
            hidden = cin * t
            h, j = y, 0
            if t != 1:
                h = _conv_bn_relu6(g, h, f"{name}.{j}", cin, hidden, 1, 1, gain=1.0)
                j += 1
            h = _conv_bn_relu6(g, h, f"{name}.{j}", hidden, hidden, 3, stride, groups=hidden)
            # Linear bottleneck: the projection has no activation behind it.
            h = g.conv(h, f"{name}.{j + 1}", hidden, c, 1)
            res = stride == 1 and cin == c
            h = g.bn(h, f"{name}.{j + 2}", c, gamma=_RES_GAMMA if res else (0.5, 1.5))
            y = g.op("Add", [y, h], f"features.{idx}") if res else h
            cin, idx = c, idx + 1
    y = _conv_bn_relu6(g, y, f"features.{idx}", cin, 1280, 1, 1, gain=1.0)
    y = g.gap_flatten(y, "pool")
    return g.gemm(y, "classifier.1", 1280, 1000)


# --------------------------------------------------------------------------- squeezenet1_1


def _fire(g: GraphBuilder, x: str, name: str, cin: int, sq: int, e1: int, e3: int) -> str:
    s = g.relu(g.conv(x, f"{name}.squeeze", cin, sq, 1, bias=True), f"{name}.squeeze_activation")
    a = g.relu(g.conv(s, f"{name}.expand1x1", sq, e1, 1, bias=True), f"{name}.expand1x1_activation")
    b = g.relu(g.conv(s, f"{name}.expand3x3", sq, e3, 3, pad=1, bias=True), f"{name}.expand3x3_activation")
    return g.op("Concat", [a, b], name, axis=1)


def squeezenet1_1(g: GraphBuilder, x: str) -> str:
    y = g.relu(g.conv(x, "features.0", 3, 64, 3, 2, bias=True, gain=1.0), "features.1")
    y = g.maxpool(y, 3, 2, ceil=True, scope="features.2")
    y = _fire(g, y, "features.3", 64, 16, 64, 64)
    y = _fire(g, y, "features.4", 128, 16, 64, 64)
    y = g.maxpool(y, 3, 2, ceil=True, scope="features.5")
    y = _fire(g, y, "features.6", 128, 32, 128, 128)
    y = _fire(g, y, "features.7", 256, 32, 128, 128)
    y = g.maxpool(y, 3, 2, ceil=True, scope="features.8")
    y = _fire(g, y, "features.9", 256, 48, 192, 192)
    y = _fire(g, y, "features.10", 384, 48, 192, 192)
    y = _fire(g, y, "features.11", 384, 64, 256, 256)
    y = _fire(g, y, "features.12", 512, 64, 256, 256)
    y = g.relu(g.conv(y, "classifier.1", 512, 1000, 1, bias=True), "classifier.2")
    # The reference head ends in ReLU + average pool, so the "logits" are non-negative.
    return g.gap_flatten(y, "classifier.3")


# --------------------------------------------------------------------------- shufflenet_v2_x1_0


def _channel_shuffle(g: GraphBuilder, x: str, scope: str, c: int, hw: int) -> str:
    # torchvision: view(b, 2, c//2, h, w) -> transpose(1, 2) -> view(b, -1, h, w); the
    # exporter turns the traced sizes into Constant shape tensors.
    s1 = g.constant_node(np.array([1, 2, c // 2, hw, hw], dtype=np.int64), scope)
    y = g.op("Reshape", [x, s1], scope)
    y = g.op("Transpose", [y], scope, perm=[0, 2, 1, 3, 4])
    s2 = g.constant_node(np.array([1, -1, hw, hw], dtype=np.int64), scope)
    return g.op("Reshape", [y, s2], scope)


def _shuffle_unit(g: GraphBuilder, x: str, name: str, cin: int, cout: int, stride: int, hw_out: int) -> str:
    bf = cout // 2
    if stride == 1:
        split = g.const(np.array([bf, bf], dtype=np.int64), "Split")
        x1, x2 = g.node("Split", [x, split], name, n_out=2, axis=1)
        b2_in = bf
    else:
        x1 = g.conv(x, f"{name}.branch1.0", cin, cin, 3, stride, 1, groups=cin)
        x1 = g.bn(x1, f"{name}.branch1.1", cin)
        x1 = g.conv(x1, f"{name}.branch1.2", cin, bf, 1, gain=1.0)
        x1 = g.relu(g.bn(x1, f"{name}.branch1.3", bf), f"{name}.branch1.4")
        x2, b2_in = x, cin
    y = g.conv(x2, f"{name}.branch2.0", b2_in, bf, 1)
    y = g.relu(g.bn(y, f"{name}.branch2.1", bf), f"{name}.branch2.2")
    y = g.conv(y, f"{name}.branch2.3", bf, bf, 3, stride, 1, groups=bf)
    y = g.bn(y, f"{name}.branch2.4", bf)
    y = g.conv(y, f"{name}.branch2.5", bf, bf, 1, gain=1.0)
    y = g.relu(g.bn(y, f"{name}.branch2.6", bf), f"{name}.branch2.7")
    y = g.op("Concat", [x1, y], name, axis=1)
    return _channel_shuffle(g, y, name, cout, hw_out)


def shufflenetv2_x1_0(g: GraphBuilder, x: str) -> str:
    y = g.conv(x, "conv1.0", 3, 24, 3, 2, 1, gain=1.0)
    y = g.relu(g.bn(y, "conv1.1", 24), "conv1.2")
    y = g.maxpool(y, 3, 2, 1, scope="maxpool")
    cin, hw = 24, 56
    for si, (reps, cout) in enumerate(zip([4, 8, 4], [116, 232, 464])):
        hw //= 2
        for i in range(reps):
            y = _shuffle_unit(g, y, f"stage{si + 2}.{i}", cin, cout, 2 if i == 0 else 1, hw)
            cin = cout
    y = g.conv(y, "conv5.0", cin, 1024, 1)
    y = g.relu(g.bn(y, "conv5.1", 1024), "conv5.2")
    # x.mean([2, 3]) exports as ReduceMean (axes is still an attribute at opset 17).
    y = g.op("ReduceMean", [y], "mean", axes=[2, 3], keepdims=0)
    return g.gemm(y, "fc", 1024, 1000)


# --------------------------------------------------------------------------- vgg16


def vgg16(g: GraphBuilder, x: str) -> str:
    cfg: list[int | str] = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]
    y, cin = x, 3
    for i, v in enumerate(cfg):
        if v == "M":
            y = g.maxpool(y, 2, 2, scope=f"features.{i}")
        else:
            assert isinstance(v, int)
            y = g.conv(y, f"features.{i}", cin, v, 3, pad=1, bias=True, gain=1.0 if cin == 3 else 2.0)
            y = g.relu(y, f"features.{i}")
            cin = v
    # adaptive_avg_pool2d((7, 7)) on a 7x7 map is exported as a 1x1 AveragePool.
    y = g.op("AveragePool", [y], "avgpool", ceil_mode=0, kernel_shape=[1, 1], pads=[0, 0, 0, 0], strides=[1, 1])
    y = g.op("Flatten", [y], "flatten", axis=1)
    y = g.relu(g.gemm(y, "classifier.0", 512 * 7 * 7, 4096), "classifier.1")
    y = g.relu(g.gemm(y, "classifier.3", 4096, 4096), "classifier.4")
    return g.gemm(y, "classifier.6", 4096, 1000)


# --------------------------------------------------------------------------- efficientnet_b0

# SiLU keeps about a third of the second moment of a unit Gaussian (ReLU keeps half), so
# convs fed by SiLU use a larger fan-in gain to keep activations O(1).
_SILU_GAIN = 2.8


def _conv_bn_silu(g: GraphBuilder, x: str, name: str, cin: int, cout: int, k: int, stride: int, groups: int = 1,
                  gain: float = _SILU_GAIN) -> str:
    y = g.conv(x, f"{name}.0", cin, cout, k, stride, (k - 1) // 2, groups, gain=gain)
    y = g.bn(y, f"{name}.1", cout)
    return g.silu(y, f"{name}.2")


def efficientnet_b0(g: GraphBuilder, x: str) -> str:
    # (expand_ratio, kernel, stride, in, out, layers), torchvision's B0 table.
    table = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
             (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1)]
    y = _conv_bn_silu(g, x, "features.0", 3, 32, 3, 2, gain=1.0)
    for si, (e, k, s, cin0, cout, n) in enumerate(table):
        for i in range(n):
            cin = cin0 if i == 0 else cout
            stride = s if i == 0 else 1
            name = f"features.{si + 1}.{i}.block"
            hidden = cin * e
            h, j = y, 0
            if e != 1:
                # The block input is a linear projection (no activation), hence gain 1.
                h = _conv_bn_silu(g, h, f"{name}.{j}", cin, hidden, 1, 1, gain=1.0)
                j += 1
            h = _conv_bn_silu(g, h, f"{name}.{j}", hidden, hidden, k, stride, groups=hidden)
            j += 1
            # Squeeze-excitation; the squeeze width follows the block input, not the expansion.
            sq = max(1, cin // 4)
            se = f"{name}.{j}"
            p = g.op("GlobalAveragePool", [h], f"{se}.avgpool")
            p = g.conv(p, f"{se}.fc1", hidden, sq, 1, bias=True, gain=_SILU_GAIN)
            p = g.silu(p, f"{se}.activation")
            p = g.conv(p, f"{se}.fc2", sq, hidden, 1, bias=True, gain=0.25)
            p = g.op("Sigmoid", [p], f"{se}.scale_activation")
            h = g.op("Mul", [p, h], se)
            j += 1
            # The SE gate sits near 0.5 and removes about a quarter of the second moment; 2.75x
            # (found empirically, SiLU is not scale-free) keeps the stream level over 16 blocks.
            h = g.conv(h, f"{name}.{j}.0", hidden, cout, 1, gain=2.75 * _SILU_GAIN)
            res = stride == 1 and cin == cout
            h = g.bn(h, f"{name}.{j}.1", cout, gamma=_RES_GAMMA if res else (0.5, 1.5))
            # StochasticDepth is the identity at inference, so it leaves no trace in the export.
            y = g.op("Add", [h, y], f"features.{si + 1}.{i}") if res else h
    y = _conv_bn_silu(g, y, "features.8", 320, 1280, 1, 1, gain=1.0)
    y = g.gap_flatten(y, "avgpool")
    return g.gemm(y, "classifier.1", 1280, 1000, gain=_SILU_GAIN)


# --------------------------------------------------------------------------- googlenet


def _basic_conv(g: GraphBuilder, x: str, name: str, cin: int, cout: int, k: int, stride: int = 1, pad: int = 0,
                gain: float = 2.0) -> str:
    y = g.conv(x, f"{name}.conv", cin, cout, k, stride, pad, gain=gain)
    y = g.bn(y, f"{name}.bn", cout, eps=1e-3)
    return g.relu(y, name)


def _inception(g: GraphBuilder, x: str, name: str, cin: int, c1: int, c3r: int, c3: int, c5r: int, c5: int,
               pp: int) -> str:
    b1 = _basic_conv(g, x, f"{name}.branch1", cin, c1, 1)
    b2 = _basic_conv(g, x, f"{name}.branch2.0", cin, c3r, 1)
    b2 = _basic_conv(g, b2, f"{name}.branch2.1", c3r, c3, 3, pad=1)
    b3 = _basic_conv(g, x, f"{name}.branch3.0", cin, c5r, 1)
    # torchvision keeps a 3x3 here (a known deviation from the paper's 5x5).
    b3 = _basic_conv(g, b3, f"{name}.branch3.1", c5r, c5, 3, pad=1)
    b4 = g.maxpool(x, 3, 1, 1, ceil=True, scope=f"{name}.branch4.0")
    b4 = _basic_conv(g, b4, f"{name}.branch4.1", cin, pp, 1)
    return g.op("Concat", [b1, b2, b3, b4], name, axis=1)


def googlenet(g: GraphBuilder, x: str) -> str:
    y = _basic_conv(g, x, "conv1", 3, 64, 7, 2, 3, gain=1.0)
    y = g.maxpool(y, 3, 2, ceil=True, scope="maxpool1")
    y = _basic_conv(g, y, "conv2", 64, 64, 1)
    y = _basic_conv(g, y, "conv3", 64, 192, 3, pad=1)
    y = g.maxpool(y, 3, 2, ceil=True, scope="maxpool2")
    y = _inception(g, y, "inception3a", 192, 64, 96, 128, 16, 32, 32)
    y = _inception(g, y, "inception3b", 256, 128, 128, 192, 32, 96, 64)
    y = g.maxpool(y, 3, 2, ceil=True, scope="maxpool3")
    y = _inception(g, y, "inception4a", 480, 192, 96, 208, 16, 48, 64)
    y = _inception(g, y, "inception4b", 512, 160, 112, 224, 24, 64, 64)
    y = _inception(g, y, "inception4c", 512, 128, 128, 256, 24, 64, 64)
    y = _inception(g, y, "inception4d", 512, 112, 144, 288, 32, 64, 64)
    y = _inception(g, y, "inception4e", 528, 256, 160, 320, 32, 128, 128)
    y = g.maxpool(y, 2, 2, ceil=True, scope="maxpool4")
    y = _inception(g, y, "inception5a", 832, 256, 160, 320, 32, 128, 128)
    y = _inception(g, y, "inception5b", 832, 384, 192, 384, 48, 128, 128)
    y = g.gap_flatten(y, "avgpool")
    return g.gemm(y, "fc", 1024, 1000)


# --------------------------------------------------------------------------- unet_small


def _double_conv(g: GraphBuilder, x: str, name: str, cin: int, cout: int, gain: float = 2.0) -> str:
    y = g.conv(x, f"{name}.0", cin, cout, 3, pad=1, gain=gain)
    y = g.relu(g.bn(y, f"{name}.1", cout), f"{name}.2")
    y = g.conv(y, f"{name}.3", cout, cout, 3, pad=1)
    return g.relu(g.bn(y, f"{name}.4", cout), f"{name}.5")


def unet_small(g: GraphBuilder, x: str) -> str:
    """A 3-level U-Net for 128x128 inputs, 4-class per-pixel logits.

    Upsampling uses all three forms found in exported segmenters: Resize (nearest, scales
    input) + 1x1 conv, ConvTranspose k2/s2, and ConvTranspose k3/s2/p1 with output_padding.
    """
    e1 = _double_conv(g, x, "enc1", 3, 16, gain=1.0)  # 128
    e2 = _double_conv(g, g.maxpool(e1, 2, 2, scope="pool1"), "enc2", 16, 32)  # 64
    e3 = _double_conv(g, g.maxpool(e2, 2, 2, scope="pool2"), "enc3", 32, 64)  # 32
    b = _double_conv(g, g.maxpool(e3, 2, 2, scope="pool3"), "bottleneck", 64, 128)  # 16

    scales = g.const(np.array([1.0, 1.0, 2.0, 2.0], dtype=np.float32), "Resize_scales")
    u3 = g.op("Resize", [b, "", scales], "up3.0", coordinate_transformation_mode="asymmetric",
              cubic_coeff_a=-0.75, mode="nearest", nearest_mode="floor")
    u3 = g.conv(u3, "up3.1", 128, 64, 1, bias=True)
    d3 = _double_conv(g, g.op("Concat", [u3, e3], "cat3", axis=1), "dec3", 128, 64)  # 32

    u2 = g.conv_transpose(d3, "up2", 64, 32, 2, 2)
    d2 = _double_conv(g, g.op("Concat", [u2, e2], "cat2", axis=1), "dec2", 64, 32)  # 64

    u1 = g.conv_transpose(d2, "up1", 32, 16, 3, 2, pad=1, output_padding=1)
    d1 = _double_conv(g, g.op("Concat", [u1, e1], "cat1", axis=1), "dec1", 32, 16)  # 128
    return g.conv(d1, "head", 16, 4, 1, bias=True)
