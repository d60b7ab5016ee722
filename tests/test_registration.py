"""Registration: a model prepared for its first request before anyone asks (``inferd.register``, what the daemon does
for the repository models it does not preload): its package compiled into the cache, validated for this device and
its plan and store index parsed, so that the first load compiles nothing and parses nothing; a stale or damaged
package rebuilt; a broken model reported; a registration and a load of the same model at once compile it once; and
the daemon's side of it (``register`` in its config, the status it reports)."""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import inferd
from inferd import package as package_mod
from inferd.errors import InferdError
from inferd.package import forget_parsed, parsed_cached
from inferd.server.testing import FAKE_MAGIC, DaemonProcess
from inferd.store import forget_index, index_cached
from inferd_client import Client
from ortutil import ort_session
from zoo_fixture import zoo_dir


@pytest.fixture(scope="module")
def src() -> Path:
    return zoo_dir(["tiny"]) / "tiny.onnx"


def _x(seed: int = 0) -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(seed).standard_normal((1, 3, 8, 8)).astype(np.float32)}


def _ort(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return ort_session(path, threads=1).run(None, feeds)[0]


def _forget(pkg: Path) -> None:
    forget_parsed(pkg)
    forget_index(pkg / "weights.store")


def test_register_compiles_parses_and_the_load_then_compiles_nothing(src: Path, tmp_path: Path, monkeypatch) -> None:
    r = inferd.register(src, device="cpu", cache_dir=tmp_path)
    assert r.compiled and r.parsed and not r.profiled and r.package is not None
    assert (r.package / "plan.bin").is_file() and r.package.parent == tmp_path
    assert parsed_cached(r.package) and index_cached(r.package / "weights.store")
    again = inferd.register(src, device="cpu", cache_dir=tmp_path)
    assert again.package == r.package and not again.compiled and again.parsed

    def no_compile(*_a, **_k):
        raise AssertionError("the load compiled a registered model")

    monkeypatch.setattr(package_mod, "compile_model", no_compile)
    reads: list[str] = []
    real_read = package_mod._read_plan
    monkeypatch.setattr(package_mod, "_read_plan", lambda p, *a, **k: (reads.append(str(p)), real_read(p, *a, **k))[1])
    m = inferd.load(src, device="cpu", cache_dir=tmp_path)
    try:
        assert m.package == r.package
        assert reads == []  # the registration's parse served the open
        x = _x()
        np.testing.assert_allclose(m.run(x)["output"], _ort(src, x), rtol=1e-4, atol=1e-5)
    finally:
        m.close()


def test_register_a_package_directory(src: Path, tmp_path: Path) -> None:
    pkg = inferd.register(src, cache_dir=tmp_path).package
    assert pkg is not None
    _forget(pkg)
    r = inferd.register(pkg)
    assert r.package == pkg and not r.compiled and r.parsed and parsed_cached(pkg)
    # an ONNX file with no cache to put its package in, a co-executed model: nothing to prepare, said so
    none = inferd.register(src)
    assert none.package is None and not none.parsed and "cache" in none.note
    co = inferd.register(src, device="cpu+vulkan", cache_dir=tmp_path)
    assert co.package is None and "co-executed" in co.note


def test_register_rebuilds_a_damaged_or_stale_package(src: Path, tmp_path: Path) -> None:
    pkg = inferd.register(src, cache_dir=tmp_path).package
    assert pkg is not None
    _forget(pkg)
    data = bytearray((pkg / "plan.bin").read_bytes())
    data[len(data) // 2] ^= 0xFF  # a flipped bit in the body: the checksum fails
    (pkg / "plan.bin").write_bytes(bytes(data))
    r = inferd.register(src, cache_dir=tmp_path)
    assert r.package == pkg and r.compiled and r.parsed
    m = inferd.load(src, cache_dir=tmp_path)
    try:
        x = _x(1)
        np.testing.assert_allclose(m.run(x)["output"], _ort(src, x), rtol=1e-4, atol=1e-5)
    finally:
        m.close()


def test_register_reports_a_broken_model_and_leaves_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not an ONNX file")
    cache = tmp_path / "cache"
    with pytest.raises(InferdError) as ei:
        inferd.register(bad, cache_dir=cache)
    assert "bad.onnx" in str(ei.value)
    assert not list(cache.rglob("plan.bin"))  # no package of it, and no half-written one


def test_a_registration_and_a_load_at_once_compile_once(src: Path, tmp_path: Path, monkeypatch) -> None:
    real = package_mod.compile_model
    calls: list[float] = []

    def slow_compile(*a, **k):
        calls.append(time.monotonic())
        time.sleep(0.3)  # long enough for the other thread to arrive while it runs
        return real(*a, **k)

    monkeypatch.setattr(package_mod, "compile_model", slow_compile)
    got: dict[str, object] = {}
    errors: list[BaseException] = []
    go = threading.Barrier(2)

    def reg() -> None:
        try:
            go.wait()
            got["reg"] = inferd.register(src, cache_dir=tmp_path)
        except BaseException as e:  # reported below
            errors.append(e)

    def load() -> None:
        try:
            go.wait()
            m = inferd.load(src, cache_dir=tmp_path)
            got["out"] = m.run(_x(2))["output"]
            got["pkg"] = m.package
            m.close()
        except BaseException as e:  # reported below
            errors.append(e)

    ths = [threading.Thread(target=f) for f in (reg, load)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(120)
    assert not errors, errors
    assert len(calls) == 1, calls
    assert got["pkg"] == got["reg"].package  # type: ignore[attr-defined]
    np.testing.assert_allclose(got["out"], _ort(src, _x(2)), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------------- the daemon


def _status(endpoint: str) -> dict:
    with Client(endpoint, timeout=30) as c:
        return c.status()


def _wait_registered(endpoint: str, names: list[str], timeout: float = 120.0) -> dict:
    end = time.monotonic() + timeout
    while True:
        st = _status(endpoint)
        regs = {n: (st["models"][n].get("registration") or {}).get("state") for n in names}
        if all(s in ("done", "failed", "skipped") for s in regs.values()):
            return st
        if time.monotonic() > end:
            raise AssertionError(f"not registered within {timeout} s: {regs}")
        time.sleep(0.1)


def test_the_daemon_registers_what_it_does_not_preload() -> None:
    d = Path(tempfile.mkdtemp(prefix="ifrg", dir="/tmp"))  # short: unix socket paths
    try:
        models = d / "models"
        models.mkdir()
        shutil.copy(zoo_dir(["tiny"]) / "tiny.onnx", models / "tiny.onnx")
        (models / "broken.onnx").write_bytes(b"not a model")
        (models / "fake.onnx").write_bytes(FAKE_MAGIC + b'{"inputs": [{"name": "x", "shape": [1, 4], '
                                           b'"dtype": "float32"}]}')
        cache = d / "cache"
        with DaemonProcess(f"ipc://{d}/r.sock", models, "--no-preload", "--cache-dir", str(cache),
                           log_path=d / "r.log") as dm:
            st = _wait_registered(dm.endpoint, ["tiny", "broken", "fake"])
            tiny = st["models"]["tiny"]
            assert tiny["state"] == "UNLOADED"
            reg = tiny["registration"]
            assert reg["state"] == "done" and reg["compiled"] and reg["parsed"], reg
            pkg = Path(reg["package"])
            assert (pkg / "plan.bin").is_file() and cache in pkg.parents
            ident = os.stat(pkg).st_ino
            broken = st["models"]["broken"]["registration"]
            assert broken["state"] == "failed" and broken["error"], broken
            assert st["models"]["fake"]["registration"]["state"] == "done"  # (nothing to prepare for it)
            with Client(dm.endpoint, timeout=60) as c:
                x = _x(3)
                out = c.infer("tiny", x)
                np.testing.assert_allclose(next(iter(out.values())), _ort(models / "tiny.onnx", x),
                                           rtol=1e-4, atol=1e-5)
                assert c.status()["models"]["tiny"]["state"] == "READY"
            assert os.stat(pkg).st_ino == ident  # the load opened the registered package: no compile replaced it
            assert "tiny: registered in" in dm.log_text()
        # registration off: nothing is compiled until the first request
        with DaemonProcess(f"ipc://{d}/s.sock", models, "--no-preload", "--no-register", "--cache-dir",
                           str(d / "cache2"), log_path=d / "s.log") as dm:
            time.sleep(1.0)
            st = _status(dm.endpoint)
            assert st["models"]["tiny"]["registration"]["state"] == "skipped"
            assert not list((d / "cache2").rglob("plan.bin"))
    finally:
        shutil.rmtree(d, ignore_errors=True)
