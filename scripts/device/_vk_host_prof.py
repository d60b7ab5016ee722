"""Where a Vulkan cold load's host time goes (issue 8): per phase thread CPU of the loaders and the executor,
then a cProfile of the package's opening (load() up to the plan's start), for one package, hot page cache,
pipelines resident. Usage: python _vk_host_prof.py PACKAGE [REPS]."""
import cProfile
import pstats
import sys
import time

import inferd
import inferd.ops  # noqa: F401
import inferd.vulkan.cold as vc
import inferd.vulkan.device as vd
import inferd.vulkan.executor as ve
import inferd.vulkan.raw as vraw
import inferd.vulkan.shaders as vsh
from inferd.runtime.scheduler import default_loaders, loader_pool

from _vk_diag import calls, clear, cold_run, cpu, wrap

loader_pool().set_size(default_loaders())

for o, n, lab in [(vc.VulkanColdBackend, "prepare", "prepare"), (vc.VulkanColdBackend, "_pipelines", "prep.pipelines"),
                  (vc.VulkanColdBackend, "_place", "prep.place"), (vd.VulkanDevice, "upload", "place.upload"),
                  (vc, "bind_descriptors", "place.bind_descriptors"), (vc, "resolve_binding", "place.resolve"),
                  (vsh.Manifest, "pack_push", "place.pack_push"), (vc.VulkanColdBackend, "execute", "execute"),
                  (ve.Recorder, "dispatch", "exec.dispatch"), (vc.VulkanColdBackend, "_submit_segment", "exec.submit"),
                  (vc.VulkanColdBackend, "end", "end"), (vc.VulkanColdBackend, "__init__", "backend_init"),
                  (vraw, "create_descriptor_pool", "bind.pool"), (vraw, "update_descriptor_sets", "bind.update")]:
    wrap(o, n, lab)
dev = vd.get_device()
dev.make_resident(128)
path, reps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5
feeds = None
walls = []
for rep in range(reps):
    clear()
    m, feeds, load_s, dt = cold_run(path, feeds)
    snap, scnt = dict(cpu), dict(calls)
    walls.append(dt)
    print(f"rep {rep} cold {dt * 1e3:.1f} ms, load() {load_s * 1e3:.1f} ms",
          {k: round(v * 1e3, 1) for k, v in m.cold_stats.items() if k.endswith("_s")})
    m.wait_warm(30)
    m.close()
print("thread CPU of the last rep (ms, calls):")
for k in sorted(snap):
    print(f"  {k:24s} {snap[k] * 1e3:7.2f} {scnt[k]:5d}")
pr = cProfile.Profile()
t = time.perf_counter()
pr.enable()
m = inferd.load(path, device="vulkan")
pr.disable()
print(f"profiled load() {(time.perf_counter() - t) * 1e3:.1f} ms")
m.run(feeds)
m.close()
pstats.Stats(pr).sort_stats("cumulative").print_stats(28)
pstats.Stats(pr).sort_stats("tottime").print_stats(20)
