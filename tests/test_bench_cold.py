"""``inferd bench cold``: the pieces that could silently make a cold number wrong.

The page-cache drop and its mincore check, one child-process measurement of a tiny model end to
end (one round, no ncnn, no plots), and the ratio / goal arithmetic the report is judged by.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from inferd.bench import cold_bench as cb


def _read(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass


def test_evict_then_mincore_sees_nothing_resident(tmp_path: Path) -> None:
    f = tmp_path / "blob.bin"
    f.write_bytes(os.urandom(4 << 20))
    _read(f)
    assert cb.resident([f])[0] > 0, "a file just written and read should be in the page cache"
    method = cb.evict([f], mode="fadvise")  # per file: leave the rest of the machine's cache alone
    r, total = cb.resident([f])
    if r > cb.RESIDENT_MAX * total:
        pytest.skip(f"this filesystem keeps pages fadvise cannot drop ({r} of {total} bytes resident; tmpfs?)")
    assert method == "fadvise" and total == 4 << 20
    assert cb.check_cold([f], "blob") == {"resident_bytes": r, "file_bytes": total}
    _read(f)
    with pytest.raises(cb.ColdCacheError, match="still resident"):
        cb.check_cold([f], "blob")


def test_native_page_count_agrees_with_the_ctypes_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``_resident_pages`` counts in one native call (``native/mincore.c``) where the extension has it, through
    ctypes otherwise: both must count the same pages of a file with a hole dropped from its cache, sampled windows
    and the whole file alike. A window outside the file is (0, 0) natively (the ctypes count asks mincore about
    whatever is mapped there: its callers never pass one)."""
    import mmap

    from inferd import native
    from inferd.runtime import pagecache as pc
    if not native.has("inferd_resident_pages"):
        pytest.skip("the native extension is not built")
    page = mmap.PAGESIZE
    f = tmp_path / "store.bin"
    size = 300 * page + 123  # a partial last page
    f.write_bytes(os.urandom(size))
    _read(f)
    fd = os.open(f, os.O_RDONLY)
    try:
        os.fsync(fd)  # (dirty pages are not dropped)
        os.posix_fadvise(fd, 100 * page, 80 * page, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    windows = [[(0, size)], [(0, 16 * page), (96 * page, 16 * page), (290 * page, 10 * page + 123)]]
    native_counts = [pc._resident_pages(f, size, w) for w in windows]
    assert pc._resident_pages(f, size, [(0, page), (400 * page, page)]) == (0, 0)
    real_has = native.has
    monkeypatch.setattr(native, "has", lambda fn: fn != "inferd_resident_pages" and real_has(fn))
    ctypes_counts = [pc._resident_pages(f, size, w) for w in windows]
    assert native_counts == ctypes_counts, (native_counts, ctypes_counts)
    assert native_counts[0][1] == 301 and native_counts[1][1] == 16 + 16 + 11
    if native_counts[0][0] < 301:  # (a file system that keeps what fadvise drops leaves every page resident)
        assert native_counts[0][0] == 301 - 80 and native_counts[1][0] == 16 + 4 + 11


def test_sampled_resident_fraction_follows_the_page_count(tmp_path: Path) -> None:
    """The store's buffered-or-direct choice samples windows of a large file (``resident_fraction``); it must
    follow what counting every page says: none after a drop, about half after reading half, all after a read."""
    from inferd.runtime import pagecache as pc
    f = tmp_path / "store.bin"
    size = 8 * 4 * pc.SAMPLE_WINDOWS * pc.SAMPLE_WINDOW_BYTES  # past the page-by-page size: sampled
    f.write_bytes(os.urandom(size))
    pc.drop_file(f)
    if pc.resident_bytes(f)[0] > 0.05 * size:
        pytest.skip("this filesystem keeps pages fadvise cannot drop (tmpfs?)")
    assert pc.resident_fraction(f) < 0.05
    with open(f, "rb") as fh:
        fh.read(size // 2)
    exact = pc.resident_bytes(f)[0] / size
    assert abs(pc.resident_fraction(f) - exact) < 0.15, (pc.resident_fraction(f), exact)
    _read(f)
    assert pc.resident_fraction(f) > 0.9


def test_package_plan_is_put_back_before_each_run(tmp_path: Path) -> None:
    # inferd rewrites plan.bin after a cold run (refinement): every round must measure the same package
    (tmp_path / "plan.bin").write_bytes(b"compiled")
    snap = cb.snapshot(tmp_path)
    assert cb._restore(snap) == 0
    (tmp_path / "plan.bin").write_bytes(b"refined by a run")
    assert cb._restore(snap) == 1 and (tmp_path / "plan.bin").read_bytes() == b"compiled"


def test_goal_ratios_use_the_better_peer_and_the_larger_bound() -> None:
    q = cb.goal_ratios(50.0, 10.0, 40.0, {"onnxruntime": 100.0, "ncnn": 80.0})
    assert q["peer_best"] == "ncnn" and q["peer_best_ms"] == 80.0
    assert q["cold_vs_peer"] == pytest.approx(0.625) and q["goal_peer_met"] is False
    assert q["floor_bound_is"] == "read floor" and q["cold_vs_floor"] == pytest.approx(1.25)
    assert q["goal_floor_met"] is True
    q = cb.goal_ratios(26.0, 20.0, 5.0, {"onnxruntime": 50.0, "ncnn": None})
    assert q["peer_best"] == "onnxruntime" and q["goal_peer_met"] is True
    assert q["floor_bound_is"] == "warm" and q["cold_vs_floor"] == pytest.approx(1.3) and q["goal_floor_met"] is True
    # nothing to compare with: no ratio, and no goal silently "met"
    q = cb.goal_ratios(26.0, None, None, {})
    assert q["cold_vs_peer"] is None and q["goal_peer_met"] is None and q["goal_floor_met"] is None
    assert cb.loss(115.0, 100.0) == pytest.approx(0.15) and cb.loss(None, 100.0) is None
    assert cb._merge([(8192, 4096), (0, 4096), (4096, 4096), (20000, 10)]) == [[0, 12288], [20000, 10]]


def test_one_round_of_a_tiny_model_in_child_processes(tmp_path: Path) -> None:
    from inferd.zoo import write_zoo

    src = write_zoo(tmp_path / "zoo", ["tiny"])["tiny"]
    opts = cb.BenchOptions(repeat=1, ncnn=False, warm_runs=5, threads=2, drop_mode="fadvise", ort_prepacked=False,
                           quiet_wait=0, retries=0, sample_s=0.0, rehearse=False)
    r = cb.measure_model("tiny", Path(src), tmp_path / "work", opts)
    s = r["summary"]
    assert not r["errors"], r["errors"]
    for key in ("inferd", "inferd_reload", "inferd_no_binds", "ort_default", "ort_opt", "floor", "floor_direct",
                "floor_whole"):
        assert s[key]["n"] == 1 and s[key]["errors"] == [], (key, s[key])
        assert 0 < s[key]["cold_ms"] < 10_000, (key, s[key])
    # every engine answered the same thing
    for key in ("inferd", "inferd_reload", "inferd_no_binds", "ort_default", "ort_opt"):
        assert s[key]["rel_err"] < 1e-4, (key, s[key])
    # a load before the rounds recorded the package's binds (tiny's four layers have none to record: its conv reads
    # the graph's input, the rest are not native steps): the rounds rebuild what there is, the first load nothing
    b = r["binds"]
    assert (r["binds_file_bytes"] > 0) == (b["layers_replayed"] > 0) and 0 <= b["layers_replayed"] <= b["layers"] == 4
    assert [x["cold_stats"].get("binds_replayed") for x in r["runs"]["inferd_no_binds"]] == [0]
    # the reload's process had served the package: its plan and index parsed, ready for the timed load
    assert [x["reload_cached"] for x in r["runs"]["inferd_reload"]] == [True]
    assert r["ratios_reload"]["cold_vs_peer"] is not None
    inf = r["inferd"]
    assert inf["source"] == "package" and 0 < inf["warm_ms"] < inf["cold_ms"] * 100
    assert {"cold_s", "read_s", "execute_s", "waiting_s"} <= set(inf["cold_stats"])
    kinds = {e["kind"] for e in inf["timeline"]}
    assert {"setup", "prepare", "execute"} <= kinds
    assert all(e["t1"] >= e["t0"] >= 0 for e in inf["timeline"])
    # the floor reads what the plan reads: no more than the package, and at least plan.bin
    pkg_bytes = sum(r["package_bytes"].values())
    assert r["package_bytes"]["plan.bin"] <= r["plan_read_bytes"] <= pkg_bytes
    assert r["floor"]["ms"] == min(s["floor"]["cold_ms"], s["floor_direct"]["cold_ms"])
    assert isinstance(r["refined_plan"], bool)
    # the runs were cold: mincore found nothing of the run's files resident
    assert r["cache"]["max_resident_bytes"] == 0
    q = r["ratios"]
    assert q["peer_best"] == "onnxruntime"
    assert q["peer_best_ms"] == min(s["ort_default"]["cold_ms"], s["ort_opt"]["cold_ms"])
    assert q["cold_vs_peer"] == pytest.approx(inf["cold_ms"] / q["peer_best_ms"])
    data = {"machine": {"date": "2026-01-01T00:00:00Z", "cpu": "test", "cores": 2}, "device": "cpu", "repeat": 1,
            "threads": 2, "versions": {}, "cache_methods": r["cache"]["methods"], "max_resident_bytes": 0,
            "models": {"tiny": r}}
    md = cb.markdown(data)
    assert "| tiny |" in md and ("met" in md or "missed" in md) and "Reload:" in md and "Recorded binds" in md


def test_cli_is_wired() -> None:
    from inferd.bench import main

    with pytest.raises(SystemExit) as e:
        main(["cold", "--help"])
    assert e.value.code == 0
