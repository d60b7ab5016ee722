"""inferd's native int8 CPU kernels against the numpy oracle and onnxruntime on one quantised zoo model, on the
machine it runs on (a second x86 microarchitecture checks the C paths that CPU takes): digests of each engine's
output and how far apart they are, in output quantisation steps."""
import hashlib
import sys

import numpy as np
import onnx

import inferd
from inferd.ops.quant import QUANT_OPS
from inferd.zoo import quant as zq
from inferd.zoo import write_zoo

name, scheme = (sys.argv[1:3] + ["mobilenetv2", "qdq_u8s8_pc"][len(sys.argv[1:3]):])[:2]
src = write_zoo("/tmp/i20cpu", [name])[name]
q = zq.quantized(src, scheme)
feeds = zq.calibration_feeds(q, n=1, seed=7)[0]


def out(m):
    r = m.run(feeds)
    return np.asarray(list(r.values())[0] if isinstance(r, dict) else r[0])


m_native = inferd.load(q, device="cpu")
native = out(m_native)
m_oracle = inferd.load(q, device="cpu", kernels={op: "numpy" for op in QUANT_OPS})
oracle = out(m_oracle)
print("native kernels", sorted(set(m_native.kernels.values())), "oracle kernels", sorted(set(m_oracle.kernels.values())))
import onnxruntime as ort

so = ort.SessionOptions()
try:
    ref = ort.InferenceSession(str(q), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
except Exception as e:  # an older onnxruntime than the model's IR version
    ref = None
    print("onnxruntime:", str(e)[:120])
for k, v in (("native", native), ("oracle", oracle), ("onnxruntime", ref)):
    if v is not None:
        print(f"{k:12s} sha1 {hashlib.sha1(np.ascontiguousarray(v).tobytes()).hexdigest()[:16]}")
print("native vs oracle max abs", float(np.abs(native - oracle).max()))
if ref is not None:
    print("native vs onnxruntime max abs", float(np.abs(native - ref).max()), "differing", int((native != ref).sum()))
