#!/usr/bin/env bash
# Issue 9, third pass (branch issue-9): does the streaming reader reach the disk's rate bypassing the page cache
# on the 16-core GPU host? There the second pass measured every 'bypass' point at 1.25-1.49 x bound (~1000 MB/s
# read against 1774 MB/s). Since then: 3 loaders with reads in flight, pieces of at most 1 MiB joined into reads of
# up to 4 MiB, loader threads kept across runs, and the bound's rate the best of one 4 MiB read in flight and the
# loaders' depth. Writes under $OUT/: the disk (read_rate at depths and chunk sizes), the reader alone (no compute:
# the executor's reads against read_rate), then `inferd bench memory` on resnet50 and mobilenetv2. < 8 minutes.
# Run from the repo root after `bash .gl/run.sh` has set PYTHONPATH.
set -u
OUT=${OUT:-/tmp/issue-9-out}
mkdir -p "$OUT"
{
  python3 -c "import os, platform; print(platform.node(), os.cpu_count(), os.getloadavg())"
  cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null
  lsblk -o NAME,TYPE,SIZE,ROTA,MIN-IO,OPT-IO,LOG-SEC,MOUNTPOINT 2>/dev/null | head -20
  df -h /tmp | tail -1
} > "$OUT/issue-9_machine.txt" 2>&1
timeout 200 python3 - > "$OUT/issue-9_reader.txt" 2>&1 <<'PY'
import os, tempfile, time
import numpy as np
from pathlib import Path
from inferd.zoo import write_zoo
from inferd.planner.slicing import MemConfig
from inferd.runtime import blockio
from inferd.runtime.pagecache import drop_file
from inferd.runtime.profiler import sequential_read_rate
from inferd.runtime.stream_compile import compile_streamed, open_streamed
work = Path(tempfile.mkdtemp(prefix="issue9-"))
write_zoo(work / "zoo", ["resnet50"])
skel = compile_streamed(work / "zoo" / "resnet50.onnx", 0, work, config=MemConfig(), in_child=False)
ex = open_streamed(skel, 1 << 40, mode="preload", read="bypass", keep_resident=False)
store = ex.store.path
print("store", store, os.path.getsize(store) >> 20, "MiB, direct", ex.store.direct)
res = {}
x = {ex.inputs[0].name: np.zeros(ex.inputs[0].shape, np.float32)}
ex.run(x)
for s in ex.steps:
    s.call = None  # no compute: the reader alone
for _ in range(5):
    res.setdefault("sequential_read_rate qd1 4M", []).append(sequential_read_rate(store))
    for d in (1, 2, 3, 4, 8):
        for c in (1 << 20, 4 << 20):
            res.setdefault(f"read_rate qd{d} {c >> 20}M", []).append(blockio.read_rate(store, d, c))
    for r in (1, 2, 3, 4, 6):
        ex.bypass_readers = r
        drop_file(store)
        t = time.perf_counter(); ex.run(x); dt = time.perf_counter() - t
        res.setdefault(f"executor readers={r} (no compute)", []).append(ex.streamed_bytes / dt)
        res.setdefault(f"executor readers={r} reads/run", []).append(ex.stats.get("reads", 0) * 1e6)
for k, v in res.items():
    print(f"{k:40s} median {np.median(v) / 1e6:7.0f} MB/s  [{' '.join(f'{a / 1e6:.0f}' for a in v)}]")
print("load", os.getloadavg())
PY
timeout 330 python3 -m inferd.cli bench memory --models resnet50,mobilenetv2 --points 8 --repeat 7 \
    --no-ncnn --no-daemon --no-adapt --out "$OUT" --tag memory_cpu_gpuhost_9c || echo "bench: exit $?" >> "$OUT/issue-9_machine.txt"
ls -l "$OUT" >> "$OUT/issue-9_machine.txt"
