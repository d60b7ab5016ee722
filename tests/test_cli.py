"""The ``inferd`` command line: run (inputs from .npy, outputs to .npz, forced kernels), compile, info, and the
exit code and message for bad input."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from inferd import cli
from inferd.zoo import build



@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("cli") / "tiny.onnx"
    p.write_bytes(build("tiny").SerializeToString())
    return p


def _feeds(path: Path) -> dict[str, np.ndarray]:
    import inferd

    m = inferd.load(path)
    rng = np.random.default_rng(1)
    return {t.name: rng.standard_normal(t.shape).astype(t.dtype) for t in m.inputs}


def test_run_reads_npy_writes_npz_and_forces_kernels(tiny: Path, tmp_path: Path, capsys) -> None:
    import inferd

    feeds = _feeds(tiny)
    args = []
    for name, a in feeds.items():
        np.save(tmp_path / f"{name}.npy", a)
        args += ["--input", f"{name}={tmp_path / f'{name}.npy'}"]
    want = inferd.load(tiny).run(feeds)
    out = tmp_path / "y.npz"
    assert cli.main(["run", str(tiny), *args, "--output", str(out)]) == 0
    got = np.load(out)
    assert sorted(got.files) == sorted(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
    # a forced kernel gives the same numbers (the reference conv here)
    out2 = tmp_path / "y2.npz"
    assert cli.main(["run", str(tiny), *args, "--output", str(out2), "--kernel", "Conv=direct"]) == 0
    for k in want:
        np.testing.assert_allclose(np.load(out2)[k], want[k], rtol=1e-4, atol=1e-5)
    assert "load" in capsys.readouterr().out


def test_compile_then_run_the_package(tiny: Path, tmp_path: Path) -> None:
    import inferd

    pkg = tmp_path / "tiny.pkg"
    assert cli.main(["compile", str(tiny), "--out", str(pkg)]) == 0
    assert (pkg / "plan.bin").is_file() and (pkg / "weights.store").is_file()
    feeds = _feeds(tiny)
    want = inferd.load(tiny).run(feeds)
    got = inferd.load(pkg).run(feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_info_reports_kernels_the_native_pool_and_the_plan(tiny: Path, capsys) -> None:
    assert cli.main(["info", str(tiny), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["device"] == "cpu" and info["kernels"] and info["memory_bytes"] > 0
    assert set(info["native"]) == {"available", "threads", "gemm_isa", "int8_isa", "scratch_bytes"}
    assert info["native"]["threads"] >= 1
    plan = info["plan"]
    assert [r[1] for r in plan["layers"]] == list(info["kernels"])  # one plan row per node, in graph order
    assert {r[1]: r[3] for r in plan["layers"]} == info["kernels"]  # the kernels run are the planned ones
    assert cli.main(["info", str(tiny)]) == 0
    text = capsys.readouterr().out
    assert "cold plan (cpu" in text and "predicted cold" in text


def test_compile_writes_plan_and_profile(tiny: Path, tmp_path: Path, capsys) -> None:
    from inferd.package import read_plan

    assert cli.main(["compile", str(tiny), "--out", str(tmp_path / "pkg"), "--loaders", "3"]) == 0
    assert "predicted cold" in capsys.readouterr().out
    d = read_plan(tmp_path / "pkg" / "plan.bin")
    assert d["plan"]["loaders"] == 2 and d["profile"]["times"]


def test_bad_input_gives_exit_code_2_and_says_what_was_expected(tiny: Path, tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((1, 2), np.float32))
    name = next(iter(_feeds(tiny)))
    assert cli.main(["run", str(tiny), "--input", f"{name}={bad}"]) == 2
    err = capsys.readouterr().err
    assert "inferd: error:" in err and "expects shape" in err
    assert cli.main(["run", str(tiny), "--kernel", "Conv=no_such_kernel"]) == 2
    assert "no_such_kernel" in capsys.readouterr().err
