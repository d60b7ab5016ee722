"""Where a Vulkan cold load's ``load()`` goes before its plan starts (issue 8): the package's open against the
Vulkan backend's set-up (node selection, workspace sizes, the activation plan), averaged over later loads in a
daemon's state (plan.bin's parse not memoised). argv: package dirs."""
import sys
import time

import inferd
from inferd import package
from inferd.bench.common import daemon_state
import inferd.vulkan.cold as VC

daemon_state("vulkan", 64 << 20, 128, 256 << 20, claim_cores=True, rehearse=True)
package.PARSED_PLANS_MAX = 0
acc: dict[str, float] = {}


def wrap(owner, name, label):  # type: ignore[no-untyped-def]
    f = getattr(owner, name)

    def w(*a, **k):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            acc[label] = acc.get(label, 0.0) + time.perf_counter() - t
    setattr(owner, name, w)


wrap(VC.VulkanColdBackend, "_setup", "backend _setup")
wrap(package, "_open_package", "package open")
N = 20
for pkg in sys.argv[1:]:
    acc.clear()
    for i in range(N + 2):
        if i == 2:
            acc.clear()
        t = time.perf_counter()
        m = inferd.load(pkg, device="vulkan")
        acc["load()"] = acc.get("load()", 0.0) + time.perf_counter() - t
        m.wait_loaded()
        m.close()
    print(pkg, {k: round(v / N * 1e3, 2) for k, v in acc.items()}, "ms per load")
