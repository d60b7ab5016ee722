"""Two slicings of one model streamed inside one budget, alternating in one process (a run of each per round):
what `inferd bench memory` measures in a loop of its own per slicing, without the minutes between the loops.

    python scripts/stream-slicing-ab.py MODEL.onnx BUDGET_MIB cache|bypass '{"node": slices, ...}' [ROUNDS]

The first arm is the model unsliced (MemConfig()), the second the given slicing (a "faster" row's config
from the bench's JSON). Prints per arm the medians of latency, the time a read was in flight and the
executor's wait."""
import json
import sys
import tempfile
import time

import numpy as np

from inferd.planner.slicing import MemConfig
from inferd.runtime.pagecache import drop_file
from inferd.runtime.stream_compile import compile_streamed, open_streamed

src, budget_mib, read, slices = sys.argv[1], float(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 8
work = tempfile.mkdtemp(prefix="slicing-ab")
arms = {"unsliced": MemConfig(), "sliced": MemConfig({}, slices, {})}
budget = int(budget_mib * 2**20)
exs = {k: open_streamed(compile_streamed(src, 0, work, config=c, in_child=False), budget, mode="preload",
                        read=read) for k, c in arms.items()}
x = np.random.default_rng(0).standard_normal(next(iter(exs.values())).inputs[0].shape).astype(np.float32)
got: dict[str, list[tuple[float, float, float]]] = {k: [] for k in exs}
for k, ex in exs.items():
    if read == "bypass":
        drop_file(ex.store.path)
    for _ in range(2):
        ex.run({ex.inputs[0].name: x})
for _ in range(rounds):
    for k, ex in exs.items():
        t = time.perf_counter()
        ex.run({ex.inputs[0].name: x})
        got[k].append(((time.perf_counter() - t) * 1e3, ex.stats["read_s"] * 1e3, ex.stats["wait_s"] * 1e3))
for k, ex in exs.items():
    lat, rd, wt = np.median(np.array(got[k]), axis=0)
    print(f"{k:9s} steps {ex.plan.steps:4d}  latency {lat:6.1f} ms  read in flight {rd:6.1f} ms  wait {wt:5.1f} ms")
    ex.close()
