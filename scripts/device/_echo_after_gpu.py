"""Whether a process that has used the GPU through Vulkan does a pyzmq round trip slower, and what the driver changed
in it (issue 13: a bench process that had run Vulkan models streamed the VAD chunk ~80 us slower on an H100 host).
A REQ socket echoes 2 KB off a REP process before and after loading and running squeezenet1_1 here; beside it the
process's CPU affinity, timer slack, scheduling policy and threads. Usage: python _echo_after_gpu.py vulkan|cpu|none
MODEL.onnx"""
import os
import sys
import threading
import time

import numpy as np
import zmq


def facts(tag: str) -> None:
    with open("/proc/self/status") as f:
        st = {k: v.strip() for k, _, v in (line.partition(":") for line in f)}
    try:
        with open("/proc/self/timerslack_ns") as f:
            slack = f.read().strip()
    except OSError:
        slack = "?"
    names: dict[str, int] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                n = f.read().strip()
        except OSError:
            continue
        names[n] = names.get(n, 0) + 1
    print(f"[{tag}] affinity {sorted(os.sched_getaffinity(0))} Cpus_allowed_list {st.get('Cpus_allowed_list')} "
          f"policy {os.sched_getscheduler(0)} nice {os.getpriority(os.PRIO_PROCESS, 0)} timerslack_ns {slack} "
          f"threads {st.get('Threads')} VmRSS {st.get('VmRSS')} names {names}", flush=True)


def serve(port_q) -> None:
    c = zmq.Context()
    s = c.socket(zmq.REP)
    port_q.put(s.bind_to_random_port("tcp://127.0.0.1"))
    while True:
        s.send(s.recv())


def main() -> None:
    import multiprocessing as mp

    mode, model = sys.argv[1], sys.argv[2]
    q = mp.get_context("fork").Queue()
    mp.get_context("fork").Process(target=serve, args=(q,), daemon=True).start()
    port = q.get()
    req = zmq.Context().socket(zmq.REQ)
    req.connect(f"tcp://127.0.0.1:{port}")
    payload = np.random.rand(512).astype(np.float32).tobytes()

    def echo(n: int = 3000) -> float:
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            req.send(payload)
            req.recv()
            ts.append(time.perf_counter() - t)
        return float(np.median(ts) * 1e6)

    facts("start")
    print("before", [round(echo(), 1) for _ in range(3)], flush=True)
    if mode != "none":
        import inferd

        m = inferd.load(model, device=mode)
        x = {i.name: np.random.rand(*i.shape).astype(np.float32) for i in m.inputs}
        for _ in range(5):
            m.run(x)
        facts("model loaded")
        print("model loaded", [round(echo(), 1) for _ in range(3)], flush=True)
        m.close()
    facts("after")
    print("after", [round(echo(), 1) for _ in range(3)], flush=True)
    # from a thread started now (the driver may have set the main thread's affinity or policy only)
    res: list[float] = []
    t = threading.Thread(target=lambda: res.extend(echo() for _ in range(3)))
    t.start()
    t.join()
    print("after, new thread", [round(r, 1) for r in res], flush=True)
    os.sched_setaffinity(0, range(os.cpu_count() or 1))
    print("after, affinity reset to all", [round(echo(), 1) for _ in range(3)], flush=True)


if __name__ == "__main__":
    main()
