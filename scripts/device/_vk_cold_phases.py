"""Where the wall time of a Vulkan cold load goes before and after the plan starts (issue 8): the package's page
cache emptied before each rep (as `inferd bench cold` does: drop_caches + fadvise, the process's libraries read
back), pipelines resident; wall time of open_package and its parts, make_backend and the backend's set-up steps,
the load() call, the first run; per phase thread CPU of the loaders and the executor.
Usage: [DEVICE_POOL_MB=64] python _vk_cold_phases.py PACKAGE [REPS] (the device pool as the daemon's
``device_pool`` setting; 0: none)."""
import os
import statistics
import sys
import time

import inferd
import inferd.ops  # noqa: F401
import inferd.package as pk
import inferd.store as store
import inferd.vulkan.cold as vc
import inferd.vulkan.device as vd
from inferd.bench.cold_bench import evict, rewarm_libraries
from inferd.runtime.scheduler import default_loaders, loader_pool

from _vk_diag import clear, cold_run, cpu, wall, wrap

loader_pool().set_size(default_loaders())

for o, n, lab in [(pk, "open_package", "open_package"), (pk, "prefetch_metadata", "open.prefetch"),
                  (pk, "_read_plan", "open.read_plan"), (store.WeightsStore, "__init__", "open.store"),
                  (pk, "_shaped_graph", "open.shaped_graph"), (pk, "check_fingerprint", "open.fingerprint"),
                  (pk, "fingerprint", "fingerprint"), (pk, "make_backend", "make_backend"),
                  (vc.VulkanColdBackend, "_setup", "backend.setup"), (vc, "select_nodes", "setup.select"),
                  (vc, "plan_activations", "setup.plan_activations"), (vd.VulkanDevice, "allocate_region", "alloc_region"),
                  (vc, "HostIO", "setup.hostio"), (vc.VulkanColdBackend, "prepare", "prepare"),
                  (vc.VulkanColdBackend, "execute", "execute"), (vc.VulkanColdBackend, "end", "end"),
                  (vc.VulkanColdBackend, "_place", "prep.place"), (vd.VulkanDevice, "upload", "place.upload"),
                  (vc, "bind_descriptors", "place.bind_descriptors")]:
    try:
        wrap(o, n, lab)
    except AttributeError as e:
        print("no", lab, e)
# the daemon's device pool (its device_pool setting, 64 MiB by default); DEVICE_POOL_MB=0: none
from inferd.vulkan import devpool  # noqa: E402

devpool.configure(int(float(os.environ.get("DEVICE_POOL_MB", "64")) * (1 << 20)))
dev = vd.get_device()
dev.make_resident(128)
path, reps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5
feeds = None
rows = []
for rep in range(reps + 1):
    m0 = inferd.load(path, device="vulkan")  # the first rep warms code paths, as a daemon that served before
    m0.close()
    evict([path])
    rewarm_libraries(os.getpid(), [path])
    time.sleep(0.2)
    clear()
    m, feeds, load_s, dt = cold_run(path, feeds)
    st = dict(m._exec.load_stats)
    m.wait_warm(30)
    m.close()
    if rep == 0:
        continue
    row = {"cold": dt, "load()": load_s, **{k: sum(v) for k, v in wall.items()},
           **{"setup." + k: st[k] for k in ("fold_s", "select_s", "alloc_s") if k in st}}
    rows.append(row)
    print(f"rep {rep}: cold {dt * 1e3:.1f} ms, load() {load_s * 1e3:.1f} ms")
print("median wall ms (summed over calls and threads where several):")
for k in rows[-1]:
    print(f"  {k:28s} {statistics.median(r.get(k, 0.0) for r in rows) * 1e3:8.2f}")
print("device pool:", dev.pool_stats())
print("thread CPU of the last rep (ms):")
for k in sorted(cpu):
    print(f"  {k:28s} {cpu[k] * 1e3:8.2f}")
