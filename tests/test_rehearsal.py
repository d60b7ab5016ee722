"""The cold-load rehearsal a daemon's start runs (inferd.runtime.rehearsal): it loads and answers, leaves nothing
behind (files, parsed plans, store indexes), and a failure costs nothing but the speed-up."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import inferd
from inferd import package, store
from inferd.runtime import codepages, rehearsal


def _leftovers() -> list[Path]:
    """This process's rehearsal folders (a folder carries its process's pid: another test worker's rehearsal, under
    way at the same moment, is not this one's leftover)."""
    return sorted(p for d in (Path(tempfile.gettempdir()), Path("/dev/shm")) if d.is_dir()
                  for p in d.glob(f"inferd-rehearsal-{os.getpid()}-*"))


def test_the_rehearsal_model_loads_and_matches_onnxruntime(tmp_path: Path) -> None:
    import onnx
    import onnxruntime as ort

    src = tmp_path / "r.onnx"
    onnx.save(rehearsal.model(), str(src))
    x = np.random.default_rng(1).standard_normal(rehearsal.SHAPE).astype(np.float32)
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    m = inferd.load(str(src), device="cpu")
    try:
        got = m.run({"input": x})["output"]
        kernels = set(m.kernels.values())
    finally:
        m.close()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert len(kernels) >= 4, kernels  # convolutions, pooling, concatenation, GEMM: more than one kernel family


def test_a_rehearsal_runs_and_leaves_nothing_behind() -> None:
    before = _leftovers()
    took = rehearsal.rehearse("cpu")
    assert took is not None and took["compile_s"] > 0 and took["load_s"] > 0
    # nothing of its own (a dead process's folder it may have removed: ``sweep``)
    assert set(_leftovers()) <= set(before)
    # the open's memos keep nothing of a package that is gone
    assert not any("inferd-rehearsal-" in k for k in package._parsed._d)
    assert not any("inferd-rehearsal-" in k for k in store._indexes._d)


def test_the_child_compiles_for_this_process_kernel_threads(caplog: Any) -> None:
    """The package's fingerprint holds the native pool's threads: a child compiling on its own default count made a
    package the load found stale, rebuilt in this process (onnx imported here after all)."""
    import logging

    from inferd import native

    n = native.num_threads()
    native.set_num_threads(1 if n != 1 else 2)
    try:
        with caplog.at_level(logging.WARNING):
            took = rehearsal.rehearse("cpu")
    finally:
        native.set_num_threads(n)
    assert took is not None
    assert "rebuilding" not in caplog.text and "unusable" not in caplog.text, caplog.text


def test_a_failing_rehearsal_is_only_logged(monkeypatch: Any, caplog: Any) -> None:
    import logging

    def broken(*_a: Any, **_k: Any) -> Any:
        raise OSError("no space left on device")

    monkeypatch.setattr(rehearsal, "compile_in_child", broken)
    before = _leftovers()
    with caplog.at_level(logging.DEBUG, logger="inferd.runtime.rehearsal"):
        assert rehearsal.rehearse("cpu") is None
        codepages.warm_start(rehearse=True)  # the daemon's start goes on
    assert "no space left on device" in caplog.text
    assert set(_leftovers()) <= set(before)  # (its own folder removed; a dead process's it may have swept)


def test_a_failing_compile_in_the_child_is_reported_and_only_logged(caplog: Any) -> None:
    import logging

    before = _leftovers()
    with caplog.at_level(logging.DEBUG, logger="inferd.runtime.rehearsal"):
        assert rehearsal.rehearse("no-such-device") is None
    # the compile's own error, raised again here (not a bare exit status)
    assert "no-such-device" in caplog.text and "exited with" not in caplog.text, caplog.text
    assert set(_leftovers()) <= set(before)


def test_the_rehearsing_process_never_imports_onnx() -> None:
    """The compile (onnx, and ml_dtypes' extension: ~1 s holding the GIL) runs in a child: a daemon serving from
    its start must not stall behind it, nor carry onnx in its RSS when its models are compiled already."""
    import subprocess
    import sys

    code = ("import sys\nfrom inferd.runtime import rehearsal\ntook = rehearsal.rehearse('cpu')\n"
            "assert took is not None, 'the rehearsal failed'\n"
            "print(sorted(m for m in ('onnx', 'ml_dtypes', 'google.protobuf') if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout


def test_the_daemon_setting_reads_and_defaults_on() -> None:
    from inferd import config as C

    assert C.load_config(environ={}).rehearse is True
    assert C.load_config(environ={"INFERD_REHEARSE": "0"}).rehearse is False


def test_no_rehearsal_under_the_fault_seam(monkeypatch: Any) -> None:
    """Injected faults count calls process-wide and are meant for a test's requests: no rehearsal takes them."""
    from inferd import faults

    monkeypatch.setattr(faults, "enabled", True)
    before = _leftovers()
    assert rehearsal.rehearse("cpu") is None
    assert _leftovers() == before


def test_a_rehearsal_removes_the_folders_of_processes_that_are_gone(tmp_path: Path, monkeypatch: Any) -> None:
    """A daemon killed while it rehearsed leaves its folder behind (in /dev/shm: memory): the next rehearsal removes
    it, and leaves a live process's alone."""
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    dead = tmp_path / f"{rehearsal.PREFIX}{p.pid}-abc"
    (dead / "pkg").mkdir(parents=True)
    (dead / "pkg" / "plan.bin").write_bytes(b"x")
    live = tmp_path / f"{rehearsal.PREFIX}{os.getppid()}-def"
    live.mkdir()
    legacy_new = tmp_path / f"{rehearsal.PREFIX}xyz123"
    legacy_new.mkdir()
    legacy_old = tmp_path / f"{rehearsal.PREFIX}uvw456"
    legacy_old.mkdir()
    os.utime(legacy_old, (0, 0))
    monkeypatch.setattr(rehearsal, "_scratch", lambda: str(tmp_path))
    assert rehearsal.rehearse("cpu") is not None
    assert not dead.exists() and not legacy_old.exists()
    assert live.exists() and legacy_new.exists()
    assert sorted(tmp_path.iterdir()) == sorted([live, legacy_new])  # its own folder gone too
