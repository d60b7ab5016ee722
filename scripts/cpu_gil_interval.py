"""A small CPU model's run alone and beside one spinning Python thread, at the switch interval argv[1] (seconds): what
the daemon's switch_interval_us buys a request behind a busy thread. The model: scripts/device/_vk_warm_gil.py writes it."""
import sys, time, threading, numpy as np
import inferd
sys.setswitchinterval(float(sys.argv[1]))
mod = inferd.load("/tmp/_vk_warm_gil_tiny.onnx", device="cpu")
feeds = {"x": np.ones((1, 16, 8, 8), np.float32)}
for _ in range(20): mod.run(feeds)
stop = False
def spin():
    while not stop: pass
res = {}
for arm in ["quiet", "spin1", "quiet", "spin1"]:
    th = None
    if arm == "spin1":
        stop = False; th = threading.Thread(target=spin, daemon=True); th.start(); time.sleep(0.02)
    ts = []
    for _ in range(200):
        t0 = time.perf_counter(); mod.run(feeds); ts.append(time.perf_counter() - t0)
    if th is not None: stop = True; th.join()
    res.setdefault(arm, []).extend(ts)
for arm, ts in res.items():
    print(f"interval {sys.argv[1]} {arm:6s} p50 {np.median(ts)*1e6:8.0f} us  p90 {np.percentile(ts, 90)*1e6:8.0f} us  mean {np.mean(ts)*1e6:8.0f} us")
