"""The cpu+vulkan device through inferd.load, the CLI and the daemon: answers like onnxruntime with the
planner's choice and with ``split`` overrides; no GPU -> CPU only with a warning; a GPU fault during a split
inference fails that request clearly and the next one answers; ``inferctl status`` shows the split model."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import inferd
import inferd.vulkan
from inferd.vulkan.testing import coexec_skip_reason
import inferd.zoo
from inferd import faults
from ortutil import ort_session

pytestmark = [pytest.mark.vulkan, pytest.mark.skipif(not inferd.vulkan.available(), reason="no Vulkan device")]
_COEXEC_SKIP = coexec_skip_reason() if inferd.vulkan.available() else None
#: the tests of a real split (a discrete GPU falls back to the GPU alone: the fallback tests run there too)
needs_coexec = pytest.mark.skipif(_COEXEC_SKIP is not None, reason=str(_COEXEC_SKIP))


@pytest.fixture(scope="module")
def ref() -> Any:
    d = Path(tempfile.mkdtemp(prefix="ifcoex", dir="/tmp"))
    inferd.zoo.write_zoo(d, ["tiny"])
    feeds = {"input": np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    sess = ort_session(d / "tiny.onnx")
    yield {"src": d / "tiny.onnx", "feeds": feeds, "want": sess.run(None, feeds)[0], "dir": d}
    shutil.rmtree(d, ignore_errors=True)


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.allclose(a, b, rtol=1e-4, atol=1e-5))


@needs_coexec
def test_load_cpu_vulkan_planner_choice_and_split_overrides(ref: Any) -> None:
    m = inferd.load(str(ref["src"]), device="cpu+vulkan")
    try:
        assert m.device == "cpu+vulkan"
        assert _close(m.run(ref["feeds"])["output"], ref["want"])
        ks = m.kernels
        assert ks and all(v.startswith(("gpu:", "cpu:")) for v in ks.values())
    finally:
        m.close()
    convs = ["Conv"]
    for frac, side in ((0.5, "split"), (1.0, "cpu"), (0.0, "gpu")):
        m = inferd.load(str(ref["src"]), device="cpu+vulkan", split={c: frac for c in convs})
        try:
            sides = {p.side for p in m.coexec.placements if p.op == "Conv"}
            assert sides == {side}, (frac, m.coexec.placements)
            for _ in range(3):
                assert _close(m.run(ref["feeds"])["output"], ref["want"])
        finally:
            m.close()


def test_no_gpu_loads_cpu_only_with_a_warning(ref: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import inferd.coexec.load as cl
    from inferd.coexec.load import CoexecWarning

    monkeypatch.setattr(cl, "vulkan_available", lambda: False)
    with pytest.warns(CoexecWarning, match="no Vulkan device"):
        m = inferd.load(str(ref["src"]), device="cpu+vulkan")
    try:
        assert m.device == "cpu"
        assert _close(m.run(ref["feeds"])["output"], ref["want"])
    finally:
        m.close()


@needs_coexec
def test_gpu_fault_during_a_split_inference_fails_that_request_only(ref: Any) -> None:
    from inferd.errors import DeviceLostError

    m = inferd.load(str(ref["src"]), device="cpu+vulkan", split={"Conv": 0.5})
    try:
        assert m.coexec.load_stats["splits"] >= 1
        assert _close(m.run(ref["feeds"])["output"], ref["want"])
        faults.configure("vulkan.fence:device_lost@1")
        with pytest.raises(DeviceLostError, match="injected|lost"):
            m.run(ref["feeds"])
        faults.configure(None)
        for _ in range(2):
            assert _close(m.run(ref["feeds"])["output"], ref["want"])
    finally:
        faults.configure(None)
        m.close()


@needs_coexec
def test_cli_info_and_run_cpu_vulkan(ref: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from inferd.cli import main

    assert main(["info", str(ref["src"]), "--device", "cpu+vulkan", "--json", "--split", "Conv=0.5"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["device"] == "cpu+vulkan" and d["layers"]
    conv = [lay for lay in d["layers"] if lay["op"] == "Conv"]
    assert conv and all(d["sides"][lay["name"]] == 0.5 for lay in conv)
    assert {"side", "t_cpu", "t_gpu", "t_pred", "gpu_channels"} <= set(d["layers"][0])
    assert main(["info", str(ref["src"]), "--device", "cpu+vulkan"]) == 0
    assert "co-execution plan" in capsys.readouterr().out
    assert main(["run", str(ref["src"]), "--device", "cpu+vulkan", "--split", "Conv=0.5", "--repeat", "2"]) == 0
    assert "on cpu+vulkan" in capsys.readouterr().out


@needs_coexec
def test_daemon_serves_a_cpu_vulkan_model_through_a_gpu_fault(ref: Any) -> None:
    from inferd.server.testing import DaemonProcess
    from inferd_client import Client

    tmp = Path(tempfile.mkdtemp(prefix="ifcoexd", dir="/tmp"))
    try:
        (tmp / "m" / "tiny").mkdir(parents=True)
        shutil.copy(ref["src"], tmp / "m" / "tiny" / "model.onnx")
        # a split forced by the model's config: the planner may well keep a model this small on the CPU alone
        (tmp / "m" / "tiny" / "config.toml").write_text('device = "cpu+vulkan"\nsplit = {Conv = 0.5}\n')
        env = dict(os.environ)
        for var in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "INVOCATION_ID", "JOURNAL_STREAM"):
            env.pop(var, None)
        env.update(INFERD_TESTING="1", INFERD_FAULTS="vulkan.fence:device_lost@3")
        with DaemonProcess(f"ipc://{tmp}/s.sock", tmp / "m", "--cache-dir", str(tmp / "c"), "--coexec-threads", "1",
                           env=env, device="cpu", log_path=tmp / "d.log").start() as dp:
            with Client(dp.endpoint, timeout=60) as c:
                results = []
                for _ in range(6):
                    try:
                        out = c.infer("tiny", ref["feeds"])["output"]
                        results.append("ok" if _close(out, ref["want"]) else "WRONG")
                    except Exception as e:  # noqa: BLE001 - a clear error is the expected answer to the fault
                        results.append(f"error: {e}")
                    time.sleep(0.05)
                # the injected loss of the device during a split inference is either a clear error or retried
                # by the daemon (the device recreated); never a wrong or partial answer, and serving goes on
                assert "WRONG" not in results, results
                assert all(r == "ok" or "lost" in r.lower() or "device" in r.lower() for r in results), results
                assert results[-1] == "ok", results
                full = c.status()
                assert sum((full["faults"].get("counts") or {}).values()) >= 1, full["faults"]
                deadline = time.monotonic() + 30
                while True:
                    st = c.status()["models"]["tiny"]
                    if st.get("state") == "READY":
                        break
                    assert time.monotonic() < deadline, st
                    time.sleep(0.1)
                assert st["device"] == "cpu+vulkan", st
                assert "coexec" in st, st
        from inferd_client.cli import format_status  # type: ignore[import-not-found]

        assert "co-executed" in format_status({"models": {"tiny": st}})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_model_config_split_key(tmp_path: Path) -> None:
    from inferd.server.repository import parse_model_config

    p = tmp_path / "config.toml"
    p.write_text('device = "cpu+vulkan"\nsplit = {Conv = 0.5, "/fc/Gemm" = 1, "/pool" = "gpu"}\n')
    assert parse_model_config(str(p)).split == (("Conv", 0.5), ("/fc/Gemm", 1.0), ("/pool", "gpu"))
    p.write_text('device = "cpu+vulkan"\nsplit = {Conv = 1.5}\n')
    with pytest.raises(ValueError, match="fractions from 0 to 1.*Conv"):
        parse_model_config(str(p))
    p.write_text('device = "vulkan"\nsplit = {Conv = 0.5}\n')
    with pytest.raises(ValueError, match="cpu\\+vulkan"):
        parse_model_config(str(p))
