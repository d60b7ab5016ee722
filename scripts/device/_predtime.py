"""Where a whole-model Vulkan prediction spends its time (issue 10's <= 5 ms goal): the slowest held-out variants'
predictions, each from a fresh cost model with the dispatch cache cleared (as the bench times them), profiled."""
import cProfile
import pstats
import sys
import time

import numpy as np

from inferd.ops.base import Layer, choose_kernel
from inferd.predictor.cost import PredictedCost, predict_warm
from inferd.predictor.features import _DISPATCHES
from inferd.predictor.model import Predictor
from inferd.predictor.train import Trainer, executed_layers
from inferd.zoo._variants import variant_specs

pred = Predictor.load(sys.argv[1])
tr = Trainer("vulkan")
held = [s for s in variant_specs(240) if s.held_out]
from inferd.vulkan.cold import VulkanColdBackend  # noqa: E402  (its import registers the Vulkan kernels)

VulkanColdBackend(tr.graph(held[0])).close()
res = []
for s in held[:int(sys.argv[2]) if len(sys.argv) > 2 else 40]:
    g = tr.graph(s)
    ks = {}
    for n in g.nodes:
        try:
            ks[n.name] = choose_kernel(Layer.of(n, g), "vulkan").name
        except Exception:
            pass
    layers = executed_layers(g, ks, "vulkan")
    ts = []
    for _ in range(5):
        _DISPATCHES.clear()
        t = time.perf_counter()
        predict_warm(layers, PredictedCost(pred, threads=1, constants=g.constants))
        ts.append(time.perf_counter() - t)
    res.append((float(np.median(ts)) * 1e3, s.name, len(layers), g, layers))
res.sort(key=lambda r: r[0])
print("median of the models' medians %.2f ms, max %.2f ms" % (np.median([r[0] for r in res]), res[-1][0]))
for r in res[-5:]:
    print("%.2f ms %s %d layers" % r[:3])
_ms, name, _n, g, layers = res[-1]
_DISPATCHES.clear()
pr = cProfile.Profile()
pr.enable()
predict_warm(layers, PredictedCost(pred, threads=1, constants=g.constants))
pr.disable()
pstats.Stats(pr).sort_stats("cumtime").print_stats(30)
