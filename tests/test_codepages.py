"""The daemon maps the code a cold load runs when it starts (``runtime.codepages``)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from inferd.runtime import codepages

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps and smaps")

# In a fresh interpreter: how much of the extension's executable mappings this process has mapped (smaps' Rss
# against Size), before and after map_code with the method asked for.
_CHILD = r"""
import json, os, sys
from inferd.runtime import codepages
import inferd._native

def rss(path):
    size = rss_kb = 0
    inside = False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                inside = len(head) >= 6 and head[5] == path and "x" in head[1]
            elif inside and head[0] == "Size:":
                size += int(head[1])
            elif inside and head[0] == "Rss:":
                rss_kb += int(head[1])
    return size, rss_kb

path = codepages.module_files(["inferd._native"])[0]
before = rss(path)
res = codepages.map_code([path], populate=sys.argv[1] == "populate")
print(json.dumps({"before": before, "after": rss(path), "res": list(res)}))
"""


@pytest.mark.parametrize("method", ["populate", "touch"])
def test_map_code_maps_every_executable_page_of_the_extension(method: str) -> None:
    files = codepages.module_files(["inferd._native"])
    if not files:
        pytest.skip("the native extension is not built")
    out = subprocess.run([sys.executable, "-c", _CHILD, method], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    size, rss_before = r["before"]
    size_after, rss_after = r["after"]
    nbytes, nfiles, used = r["res"]
    assert size > 0 and size == size_after
    # an import maps only the pages it ran: the text of every kernel is not among them
    assert rss_before < size
    assert rss_after == size
    assert nfiles == 1 and nbytes == size * 1024
    if method == "touch":
        assert used == "touch"
    else:
        assert used in ("populate", "touch")  # a kernel before 5.14 refuses MADV_POPULATE_READ


def test_make_resident_reports_and_survives_what_it_cannot_do(tmp_path) -> None:
    res = codepages.make_resident()
    assert res.files >= 1 and res.bytes > 0 and res.method in ("populate", "touch") and res.seconds > 0
    # no procfs, a module that does not exist, a file that is not mapped: nothing mapped, no error
    assert codepages.executable_mappings(["/x"], maps=str(tmp_path / "no-maps")) == []
    assert codepages.module_files(["inferd_no_such_module", "json"]) == []
    assert codepages.map_code([str(tmp_path / "not-mapped.so")]) == (0, 0, "none")


_IMPORTS_CHILD = r"""
import json, sys
import inferd, inferd.server.daemon  # what a daemon has imported when it starts
from inferd.runtime import codepages
from inferd.server.daemon import _make_resident
want_cpu = ["inferd.runtime.pagecache", "inferd.runtime.profiler"]
want_vk = ["inferd.vulkan.cold", "inferd.vulkan.executor", "inferd.vulkan.host", "inferd.ops.conv_vulkan",
           "inferd.ops.gemm_vulkan", "inferd.ops.tensor_vulkan"]
before = [m for m in want_cpu + want_vk if m in sys.modules]
codepages.warm_start()
st = _make_resident(1)
print(json.dumps({"before": before, "cpu": [m in sys.modules for m in want_cpu],
                  "vulkan": [m in sys.modules for m in want_vk], "resident": st}))
"""


def test_a_daemon_start_imports_what_its_first_cold_load_would() -> None:
    """``import inferd`` leaves some of a cold load's modules to their first use; the daemon's start imports them
    (``warm_start``, and the Vulkan backend's where it opens the device to make pipelines resident), so that its
    first cold load after a start does not: the Vulkan backend and its kernels' host bindings took 58 ms."""
    import inferd.vulkan

    r = subprocess.run([sys.executable, "-c", _IMPORTS_CHILD], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["before"] == [], got  # the point: none of these came with the daemon's own imports
    assert all(got["cpu"]), got
    if inferd.vulkan.available():
        assert got["resident"] is not None and "imports_s" in got["resident"], got
        assert all(got["vulkan"]), got
