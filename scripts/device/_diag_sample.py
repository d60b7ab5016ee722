# sampling profile (sys._current_frames every 0.5 ms) of one cold load; argv: pkg loaders
import sys, time, os, threading, collections
import inferd, numpy as np
from inferd.runtime import pagecache
from inferd.vulkan import device as D
import inferd.vulkan.host  # noqa
pkg, loaders = sys.argv[1], int(sys.argv[2])
dev = D.get_device()
print("device warm_s", getattr(dev, "warm_s", None))
pagecache.drop_all()
for root, _, fs in os.walk(pkg):
    for f in fs: pagecache.drop_file(os.path.join(root, f))
leaf = collections.Counter(); ours = collections.Counter(); n = [0]
stop = threading.Event(); me = threading.get_ident()
names = {}
def sampler():
    while not stop.is_set():
        for tid, fr in sys._current_frames().items():
            if tid == threading.get_ident(): continue
            th = names.get(tid)
            if th is None:
                th = next((t.name for t in threading.enumerate() if t.ident == tid), "?")
                th = "loader" if "loader" in th else th; names[tid] = th
            f = fr; top = f"{os.path.basename(f.f_code.co_filename)}:{f.f_code.co_name}:{f.f_lineno}"
            chain = []
            while f is not None and len(chain) < 4:
                fn = f.f_code.co_filename
                if ("/daemon/" in fn or "/inferd/" in fn) and "threading" not in fn:
                    chain.append(f"{os.path.basename(fn)}:{f.f_code.co_name}:{f.f_lineno}")
                f = f.f_back
            ourf = " < ".join(chain) or None
            if th in ("inferd-aux", "inferd-idle", "inferd-io") and "_run" in top: continue
            leaf[(th, top)] += 1; ours[(th, ourf)] += 1
        n[0] += 1
        time.sleep(0.0005)
s = threading.Thread(target=sampler, daemon=True)
main_ident = threading.get_ident()
t0 = time.perf_counter(); s.start()
m = inferd.load(pkg, device="vulkan", loaders=loaders)
feeds = {i.name: np.random.rand(*i.shape).astype(i.dtype) for i in m.inputs}
m.run(feeds)
t = time.perf_counter() - t0
stop.set(); s.join()
print("cold_ms", round(t*1e3, 1), "cold_s", m.cold_stats.get("cold_s"), "samples", n[0])
for title, c in (("leaf", leaf), ("ours", ours)):
    print("==", title)
    for (th, fn), k in c.most_common(45 if title == "leaf" else 70):
        if "wait" in str(fn) and th == "loader" and "scheduler" in str(fn): pass
        print(f"  {k:5d} {th[:12]:12} {fn}")
m.close()
