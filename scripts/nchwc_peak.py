"""The blocked (NCHW16c) convolution kernels of native/nchwc.c alone, against the cores' measured FMA peak: with
warm caches (the same call back to back), after a 64 MiB write flushed them, and after a 2 ms sleep (a pool woken
up), as a layer meets them inside a model. What `inferd bench --layers` reports per layer inside the model, this
separates into the kernel's own rate and what the model around it costs it.

    python scripts/nchwc_peak.py [--threads N]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from inferd import native
from inferd.ops.conv_nchwc import pack_weights

#: (input channels, output channels, map side, kernel side): resnet50's shapes (1x1 and 3x3 at 56, 28, 14, 7)
SHAPES = [(64, 256, 56, 1), (256, 64, 56, 1), (128, 128, 28, 3), (64, 64, 56, 3), (256, 256, 14, 3),
          (512, 512, 7, 3), (1024, 256, 14, 1), (512, 2048, 7, 1)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=0, help="pool threads (0: the default)")
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    if a.threads:
        native.set_num_threads(a.threads)
    threads = native.num_threads()
    peak = native.fma_peak(threads)
    print(f"{threads} threads, measured FMA peak {peak / 1e9:.0f} GFLOP/s")
    rng = np.random.default_rng(0)
    junk = np.zeros(16 << 20, np.float32)
    for cin, cout, hw, k in SHAPES:
        x = rng.standard_normal((1, cin // 16, hw, hw, 16)).astype(np.float32)
        wp = pack_weights(rng.standard_normal((cout, cin, k, k)).astype(np.float32))
        y = np.zeros((1, cout // 16, hw, hw, 16), np.float32)
        f = native.nchwc_conv_bound(x, wp, np.zeros(cout, np.float32), None, y, k, k, 1, 1, k // 2, k // 2, 1, 0.0, 0.0)
        if f is None:
            print(f"{cin}->{cout} {hw}x{hw} k{k}: no native kernel here")
            continue
        flops = 2.0 * cin * cout * k * k * hw * hw
        for _ in range(10):
            f()
        row = []
        for mode in ("warm", "flushed", "slept"):
            ts = []
            for _ in range(a.reps):
                if mode == "flushed":
                    junk += 1.0
                elif mode == "slept":
                    time.sleep(0.002)
                t0 = time.perf_counter()
                f()
                ts.append(time.perf_counter() - t0)
            t = float(np.median(ts))
            row.append(f"{mode} {t * 1e3:6.3f} ms {flops / t / peak * 100:5.1f}%")
        print(f"{cin:4d}->{cout:4d} {hw:3d}x{hw:<3d} k{k}: " + "  ".join(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
