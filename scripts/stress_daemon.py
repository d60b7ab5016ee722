"""A daemon under a mixed load, as a board's apps would give it: six zoo models (CPU, lavapipe/GPU, a dynamic one, a
recurrent one with control flow) served from a repository of DIR/NAME/model.onnx, N client processes sending
random requests whose answers are checked against onnxruntime, and an admin process that changes the memory
budget, unloads, loads, reloads and asks for the status meanwhile (``--streamed``: three of the models served inside
their share of the budget, one of them on the GPU, re-sliced in the background as it changes). At the end: wrong answers (must be none),
errors other than UNAVAILABLE (must be none), the daemon's log tracebacks (must be none), and its memory as
``inferctl status`` reports it (the host pool's bytes in use against the models' bytes).

Usage: python scripts/stress_daemon.py [--clients 8] [--requests 150] [--dir /tmp/inferd-stress] [--streamed]
(found on 2026-12-05: closed models holding most of the host pool, and every model logging as "model")."""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

MODELS = {"squeezenet1_1": "cpu", "mobilenetv2": "vulkan", "resnet18": "cpu", "vad_lstm": "cpu",
          "detnet_dyn": "cpu", "shufflenetv2_x1_0": "vulkan"}
#: ``--streamed``: these serve inside their share of the budget (``memory = "stream"``), sliced again in the
#: background when a share falls below their slicing's minimum (mobilenetv2 on its device, Vulkan: streamed on the GPU)
STREAMED = ("squeezenet1_1", "resnet18", "mobilenetv2")


def setup(d: Path, streamed: bool = False) -> None:
    from inferd.zoo import write_zoo

    shutil.rmtree(d / "models", ignore_errors=True)
    (d / "models").mkdir(parents=True)
    (d / "onnx").mkdir(exist_ok=True)
    write_zoo(str(d / "onnx"), list(MODELS))
    for n, dev in MODELS.items():
        (d / "models" / n).mkdir()
        shutil.copy(d / "onnx" / f"{n}.onnx", d / "models" / n / "model.onnx")
        stream = 'memory = "stream"\n' if streamed and n in STREAMED else ""
        (d / "models" / n / "config.toml").write_text(f'device = "{dev}"\n{stream}')


def client(d: Path, ep: str, idx: int, n: int, q: "mp.Queue[object]") -> None:
    import onnxruntime as ort

    from inferd_client import Client

    rng = np.random.default_rng(idx)
    c = Client(ep)
    sessions: dict[str, object] = {}
    errors: list[str] = []
    ok, codes = 0, {}
    models = c.models()
    for i in range(n):
        name = random.Random(idx * 1000 + i).choice(list(MODELS))
        m = next(x for x in models if x["name"] == name)
        feeds = {}
        for inp in m["inputs"]:
            dims = inp.get("dims") or inp["shape"]
            shape = [x if isinstance(x, int) else (1 if x == "N" else int(rng.choice([96, 128, 160, 224])))
                     for x in dims]
            feeds[inp["name"]] = (np.array(16000, dtype=inp["dtype"]) if inp["dtype"].startswith("int")
                                  else rng.standard_normal(shape).astype(inp["dtype"]))
        try:
            out = c.infer(name, feeds, timeout=60)
        except Exception as e:  # noqa: BLE001 - counted and judged below
            kind = type(e).__name__
            codes[kind] = codes.get(kind, 0) + 1
            if kind != "Unavailable":
                errors.append(f"{name}: {kind}: {str(e)[:200]}")
            continue
        if name not in sessions:
            sessions[name] = ort.InferenceSession(str(d / "onnx" / f"{name}.onnx"), providers=["CPUExecutionProvider"])
        for a, b in zip(out.values(), sessions[name].run(None, feeds)):  # type: ignore[attr-defined]
            err = float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-6))
            if err > 1e-3:
                errors.append(f"{name}: relative error {err:.2e}")
        ok += 1
    q.put(("client", idx, ok, errors[:10], codes))


def admin(ep: str, stop: "mp.synchronize.Event", q: "mp.Queue[object]") -> None:
    from inferd_client import Client

    c = Client(ep)
    r = random.Random(7)
    failed: list[str] = []
    n = 0
    while not stop.is_set():
        act = r.choice(["budget", "budget", "status", "unload", "load", "budget_big", "reload"])
        try:
            if act == "budget":
                c.set_budget(r.choice([30, 60, 120]) << 20)
            elif act == "budget_big":
                c.set_budget(4 << 30)
            elif act == "status":
                json.dumps(c.status())
            elif act == "unload":
                c.unload(r.choice(list(MODELS)))
            elif act == "load":
                c.load(r.choice(list(MODELS)))
            else:
                c.reload()
            n += 1
        except Exception as e:  # noqa: BLE001 - a budget too small to load a model is an answer, not a failure
            if type(e).__name__ != "Unavailable":
                failed.append(f"{act}: {type(e).__name__}: {str(e)[:150]}")
        time.sleep(0.3)
    c.set_budget(4 << 30)
    q.put(("admin", n, failed))


def memory(c: object) -> str:
    mem = c.status()["memory"]  # type: ignore[attr-defined]
    pool = mem.get("host_pool") or {}
    return (f"daemon RSS {mem['rss_bytes'] >> 20} MiB, models {mem['models_bytes'] >> 20} MiB, host pool in use "
            f"{pool.get('in_use_bytes', 0) >> 20} of {pool.get('capacity_bytes', 0) >> 20} MiB "
            f"(fallbacks {pool.get('fallbacks')})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=150)
    ap.add_argument("--dir", default="/tmp/inferd-stress")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of the load, the memory reported after each")
    ap.add_argument("--streamed", action="store_true",
                    help=f"serve {', '.join(STREAMED)} with memory = \"stream\" (re-planned and re-sliced under the "
                         "budget changes)")
    args = ap.parse_args()
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    setup(d, args.streamed)
    ep = f"ipc://{d}/sock"
    log = open(d / "daemon.log", "w")
    daemon = subprocess.Popen([sys.executable, "-m", "inferd.cli", "serve", "--endpoint", ep, "--models",
                               str(d / "models"), "--cache-dir", str(d / "cache")], stdout=log, stderr=log)
    try:
        from inferd_client import Client

        c = Client(ep)
        end = time.monotonic() + 120
        while time.monotonic() < end and not all(m["state"] == "READY" for m in c.models(timeout=5)):
            time.sleep(0.2)
        bad = 0
        print(f"ready: {memory(c)}")
        for rnd in range(args.rounds):
            q: "mp.Queue[object]" = mp.Queue()
            stop = mp.Event()
            a = mp.Process(target=admin, args=(ep, stop, q))
            a.start()
            cs = [mp.Process(target=client, args=(d, ep, i, args.requests, q)) for i in range(args.clients)]
            for p in cs:
                p.start()
            for p in cs:
                p.join(900)
            stop.set()
            a.join(60)
            for _ in range(args.clients + 1):
                rec = q.get(timeout=30)
                print(rec)
                bad += len(rec[3]) if rec[0] == "client" else len(rec[2])  # type: ignore[arg-type, index]
            print(f"round {rnd + 1}: {memory(c)}")
    finally:
        daemon.terminate()
        daemon.wait(30)
        log.close()
    text = (d / "daemon.log").read_text()
    tracebacks = text.count("Traceback")
    if args.streamed:
        print(f"streamed models: {text.count('slicing it again for')} re-slices asked, "
              f"{text.count('slicing it again failed')} failed (the room below even the sliced minimum)")
    print(f"wrong answers and unexpected errors: {bad}; tracebacks in the daemon's log: {tracebacks}")
    return 1 if bad or tracebacks else 0


if __name__ == "__main__":
    sys.exit(main())
