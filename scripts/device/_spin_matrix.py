"""The VAD chunk's daemon round trip for each pair of (daemon spin_us, client spin_us), in interleaved rounds, with
a bare pyzmq echo beside them: which spins pay on this host. Run from the repo root (inferd importable):
python3 scripts/device/_spin_matrix.py [ROUNDS] [DAEMON_SPINS] [CLIENT_SPINS]"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from inferd import zoo
from inferd.bench.daemon_bench import EchoPeer
from inferd.bench.recurrent_bench import _feeds, _warm_up
from inferd.server.testing import DaemonProcess
from inferd_client import Client


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    dspins = [s for s in (sys.argv[2] if len(sys.argv) > 2 else "200,0").split(",")]
    cspins = [float(s) for s in (sys.argv[3] if len(sys.argv) > 3 else "500,0").split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="ifsm", dir="/tmp"))
    paths = zoo.write_zoo(tmp / "m", ["vad_lstm"])
    feeds = _feeds("vad_lstm")
    daemons = [DaemonProcess(f"ipc://{tmp}/d{ds}.sock", paths["vad_lstm"].parent, "--spin-us", ds,
                             log_path=tmp / f"d{ds}.log", device="cpu") for ds in dspins]
    for d in daemons:
        d.__enter__()
    try:
        clients = {(ds, cs): Client(d.endpoint, timeout=30, spin_us=cs) for ds, d in zip(dspins, daemons)
                   for cs in cspins}
        for c in clients.values():
            _warm_up(c, feeds)
        res: dict[object, list[float]] = {k: [] for k in clients}
        res["echo"] = []
        with EchoPeer(tmp, 2200, 600, one_frame=True) as echo:
            for r in range(rounds):
                order = list(clients.items())
                order = order[r % len(order):] + order[:r % len(order)]
                for k, c in order:
                    ts = []
                    for _ in range(300):
                        t0 = time.perf_counter()
                        c.infer("vad_lstm", feeds)
                        ts.append(time.perf_counter() - t0)
                    res[k].append(float(np.median(ts[20:])) * 1e6)
                res["echo"].append(float(np.median(echo.time(300, 20))) * 1e6)
        for k, v in res.items():
            name = "echo" if k == "echo" else f"daemon spin {k[0]:>4} us, client spin {k[1]:>5g} us"
            print(f"{name}: median of round medians {np.median(v):7.1f} us  rounds {[round(x) for x in v]}")
        for c in clients.values():
            c.close()
    finally:
        for d in daemons:
            d.__exit__(None, None, None)


if __name__ == "__main__":
    main()
