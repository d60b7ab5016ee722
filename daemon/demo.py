"""``inferd demo``: the README's main-job command.

Writes a few bundled zoo models into a model repository under the cache directory, starts
``inferd serve`` on the default endpoint (Vulkan when a device exists, else the CPU), waits until
it is ready, prints a ready line with example ``inferctl`` calls, then stays in the foreground
until interrupted (signals are passed on to the daemon, which drains and exits).
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

DEMO_MODELS = ["tiny", "mlp_small", "mobilenetv2", "resnet18"]


def main(argv: list[str] | None = None) -> int:
    from inferd_client import Client
    from inferd_client.protocol import default_endpoint

    from .config import default_cache_dir
    from .zoo import write_zoo

    p = argparse.ArgumentParser(prog="inferd demo", description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(DEMO_MODELS), help="zoo models to serve")
    p.add_argument("--device", default="auto", choices=["auto", "vulkan", "cpu"])
    p.add_argument("--endpoint", default=None)
    p.add_argument("--ready-timeout", type=float, default=600.0)
    p.add_argument("--exit-when-ready", action="store_true", help="stop the daemon once it is ready (for checks)")
    args = p.parse_args(argv)

    repo = Path(default_cache_dir(os.environ)) / "demo-models"
    names = [n for n in args.models.split(",") if n]
    print(f"[inferd demo] writing zoo models {names} to {repo}", flush=True)
    write_zoo(repo, names)
    endpoint = args.endpoint or default_endpoint(os.environ)
    cmd = [sys.executable, "-m", "inferd.cli", "serve", "--models", str(repo), "--device", args.device,
           "--endpoint", endpoint]
    print(f"[inferd demo] starting: {' '.join(cmd)}", flush=True)
    proc = subprocess.Popen(cmd)

    def forward(sig: int, _frame: object) -> None:
        if proc.poll() is None:
            proc.send_signal(sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    deadline = time.monotonic() + args.ready_timeout
    with Client(endpoint, timeout=2.0) as c:
        while time.monotonic() < deadline and proc.poll() is None:
            if c.is_ready(timeout=1.0):
                break
            time.sleep(0.2)
        else:
            if proc.poll() is None:
                proc.terminate()
            print("[inferd demo] the daemon did not become ready", file=sys.stderr)
            return proc.wait() or 1
        st = c.status()
        models = ", ".join(f"{m['name']}({m.get('state', '?')})" for m in c.models())
    print(f"[inferd demo] READY on {endpoint} (device {st.get('device', '?')}): {models}", flush=True)
    print(f"  try:  inferctl --endpoint {endpoint} status\n"
          f"        inferctl --endpoint {endpoint} models\n"
          f"        python -c \"import numpy as np; np.save('/tmp/x.npy', np.random.rand(1,3,8,8).astype('float32'))\"\n"
          f"        inferctl --endpoint {endpoint} infer tiny --input input=/tmp/x.npy", flush=True)
    if args.exit_when_ready:
        proc.send_signal(signal.SIGTERM)
    return proc.wait()


if __name__ == "__main__":
    sys.exit(main())
