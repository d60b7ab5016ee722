"""Which threads of a process burn CPU while it is idle, after it ran a model on the Vulkan device (and, for
comparison, before): a thread left spinning would slow every other request of a daemon. Prints each thread's CPU
over 2 s of idle, per stage. Run from the repo root (inferd importable): python3 scripts/device/_vk_idle_threads.py"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path


def thread_cpu() -> dict[str, float]:
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                st = f.read()
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        v = st.rsplit(")", 1)[1].split()
        out[f"{tid}:{name}"] = (int(v[11]) + int(v[12])) / tick
    return out


def idle(stage: str, s: float = 2.0) -> None:
    a = thread_cpu()
    t0 = time.monotonic()
    time.sleep(s)
    b = thread_cpu()
    dt = time.monotonic() - t0
    busy = {k: round((b[k] - a.get(k, 0.0)) / dt * 100, 1) for k in b if b[k] - a.get(k, 0.0) > 0.01 * dt}
    print(f"{stage}: {len(b)} threads; busy while idle (% of a core): {busy or 'none'}", flush=True)


def main() -> None:
    import numpy as np

    import inferd
    from inferd import zoo
    from inferd.bench.recurrent_bench import _feeds

    tmp = Path(tempfile.mkdtemp(prefix="ifvi", dir="/tmp"))
    names = ["vad_lstm", "squeezenet1_1"]
    paths = zoo.write_zoo(tmp / "m", names)
    idle("imported")
    for name in names:
        feeds = _feeds(name) if name == "vad_lstm" else {"input": np.zeros((1, 3, 224, 224), np.float32)}
        m = inferd.load(str(paths[name]), device="cpu")
        for _ in range(50):
            m.run(feeds)
        idle(f"{name} cpu, loaded")
        m.close()
        idle(f"{name} cpu, closed")
        mv = inferd.load(str(paths[name]), device="vulkan")
        mv.wait_warm(60)
        for _ in range(50):
            mv.run(feeds)
        idle(f"{name} vulkan, loaded")
        mv.close()
        idle(f"{name} vulkan, closed")


if __name__ == "__main__":
    main()
