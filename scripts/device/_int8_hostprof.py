import cProfile, pstats, io, time, numpy as np
import inferd
from inferd.zoo import write_zoo, quant as zq
src = write_zoo("/tmp/i20zoo", ["resnet18"])["resnet18"]
q = zq.quantized(src, "qdq_s8s8")
feeds = zq.calibration_feeds(q, n=1, seed=7)[0]
for tag, path in (("int8", q), ("fp32", src.with_name(f"{src.stem}.pre.onnx"))):
    m = inferd.load(str(path), device="vulkan"); m.run(feeds); m.wait_warm(60)
    for _ in range(20): m.run(feeds)
    ts = []
    for _ in range(50):
        t = time.perf_counter(); m.run(feeds); ts.append(time.perf_counter() - t)
    print(tag, "warm ms %.2f" % (np.median(ts) * 1e3), "cpu nodes", [n for n, k in m.kernels.items() if k.startswith(("cpu", "host"))][:5])
    pr = cProfile.Profile(); pr.enable()
    for _ in range(50): m.run(feeds)
    pr.disable(); s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(8); print(s.getvalue()[-2500:])
    m.close()
