"""vit_tiny quantised (QDQ s8s8) on the GPU with every node there, against inferd's CPU and onnxruntime: how far
apart each pair is, in the output's largest magnitude (its float LayerNorm/Softmax/GELU round per engine)."""
import numpy as np

import inferd
from inferd.frontend import import_model
from inferd.ops.base import Layer
from inferd.ops.quant_vulkan import INT8_KERNELS, VkQConvGemm
from inferd.zoo import quant as zq
from inferd.zoo import write_zoo

src = write_zoo("/tmp/i20vit", ["vit_tiny"])["vit_tiny"]
q = zq.quantized(src, "qdq_s8s8")
feeds = zq.calibration_feeds(q, n=1, seed=7)[0]
g = import_model(q)
gemm = {n.name: "vk_qconv_gemm" for n in g.nodes if n.op == "QLinearConv" and VkQConvGemm().applies(Layer.of(n, g))}
cpu = list(inferd.load(q, device="cpu").run(feeds).values())[0]
m = inferd.load(q, device="vulkan", kernels={**INT8_KERNELS, **gemm})
gpu = list(m.run(feeds).values())[0]
print("on cpu:", {n: k for n, k in m.kernels.items() if k.startswith(("cpu", "host"))})
try:
    import onnxruntime as ort

    ref = ort.InferenceSession(str(q), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
except Exception as e:
    ref = None
    print("onnxruntime:", str(e)[:100])
mag = float(np.abs(cpu).max())
print("gpu vs cpu max abs", float(np.abs(gpu - cpu).max()), "frac of magnitude", float(np.abs(gpu - cpu).max()) / mag,
      "elements differing", int((gpu != cpu).sum()), "of", gpu.size)
if ref is not None:
    print("gpu vs ort frac", float(np.abs(gpu - ref).max()) / mag, "cpu vs ort frac", float(np.abs(cpu - ref).max()) / mag)
