"""The cold-load rehearsal a daemon's start runs (inferd.runtime.rehearsal): it loads and answers, leaves nothing
behind (files, parsed plans, store indexes), and a failure costs nothing but the speed-up."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import inferd
from inferd import package, store
from inferd.runtime import codepages, rehearsal


def _leftovers() -> list[Path]:
    return sorted(p for d in (Path(tempfile.gettempdir()), Path("/dev/shm")) if d.is_dir()
                  for p in d.glob("inferd-rehearsal-*"))


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
    assert _leftovers() == before
    # the open's memos keep nothing of a package that is gone
    assert not any("inferd-rehearsal-" in k for k in package._parsed._d)
    assert not any("inferd-rehearsal-" in k for k in store._indexes._d)


def test_a_failing_rehearsal_is_only_logged(monkeypatch: Any, caplog: Any) -> None:
    import logging

    def broken(*_a: Any, **_k: Any) -> Any:
        raise OSError("no space left on device")

    monkeypatch.setattr(package, "compile_model", broken)
    before = _leftovers()
    with caplog.at_level(logging.DEBUG, logger="inferd.runtime.rehearsal"):
        assert rehearsal.rehearse("cpu") is None
        codepages.warm_start(rehearse=True)  # the daemon's start goes on
    assert "no space left on device" in caplog.text
    assert _leftovers() == before


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
