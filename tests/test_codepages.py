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
