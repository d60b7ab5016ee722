"""A resident Vulkan model's warm run alone and with one Python thread spinning beside it (the GIL hand-back after
each call that lets it go): a 1x1 conv + relu on 16x8x8, 200 runs per arm, arms alternating."""
import time, threading, numpy as np, onnx
from onnx import helper, TensorProto
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])
w = helper.make_tensor("w", TensorProto.FLOAT, [16, 16, 1, 1], np.random.default_rng(0).standard_normal(256).astype(np.float32).tolist())
g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])], "t", [x], [y], [w])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
onnx.save(m, "/tmp/_vk_warm_gil_tiny.onnx")
import inferd
mod = inferd.load("/tmp/_vk_warm_gil_tiny.onnx", device="vulkan")
feeds = {"x": np.ones((1, 16, 8, 8), np.float32)}
for _ in range(20): mod.run(feeds)
stop = False
def spin():
    while not stop:
        pass
res = {}
for arm in ["quiet", "spin1", "quiet", "spin1"]:
    th = None
    if arm == "spin1":
        th = threading.Thread(target=spin, daemon=True); stop = False; th.start(); time.sleep(0.02)
    ts = []
    for _ in range(200):
        t0 = time.perf_counter(); mod.run(feeds); ts.append(time.perf_counter() - t0)
    if th is not None:
        stop = True; th.join()
    res.setdefault(arm, []).extend(ts)
for arm, ts in res.items():
    print(f"{arm:6s} p50 {np.median(ts)*1e6:8.0f} us  p90 {np.percentile(ts, 90)*1e6:8.0f} us  mean {np.mean(ts)*1e6:8.0f} us")
