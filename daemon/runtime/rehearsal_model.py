"""The cold-load rehearsal's model (``runtime.rehearsal``), apart from the rehearsal: the child process that compiles
it (``runtime.childcompile``) builds it from here without importing the load path (no import circle through
``runtime.model``). Nothing of onnx is imported until ``model()`` is called."""
from __future__ import annotations

from typing import Any

import numpy as np

#: the model's one input, NCHW
SHAPE = (1, 3, 32, 32)


def model() -> Any:
    """The rehearsal model (an ``onnx.ModelProto``): 15 layers at 32x32, fixed weights."""
    from ..zoo._cnn import _basic_block, _conv_bn_relu6, _fire
    from ..zoo._graph import GraphBuilder

    g = GraphBuilder(np.random.default_rng(0))
    y = _conv_bn_relu6(g, "input", "stem", 3, 16, 3, 2)
    # an inverted residual (expand, depthwise, project, add) and a basic block
    e = _conv_bn_relu6(g, y, "ir.expand", 16, 32, 1, 1)
    d = _conv_bn_relu6(g, e, "ir.dw", 32, 32, 3, 1, groups=32)
    p = g.bn(g.conv(d, "ir.project", 32, 16, 1), "ir.project_bn", 16)
    y = _basic_block(g, g.op("Add", [y, p], "ir"), "block", 16, 16, 1)
    y = g.op("MaxPool", [y], "pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    y = _fire(g, y, "fire", 16, 8, 16, 16)
    y = g.gemm(g.gap_flatten(y, "gap"), "fc", 32, 10)
    return g.finish("inferd-rehearsal", [("input", SHAPE)], [("output", (1, 10))], [y], "", {})
