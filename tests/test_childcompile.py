"""Packages compiled in a child process (inferd.runtime.childcompile), as a daemon compiles the models its cache
lacks: the package is the one an in-process compile makes, a model's error comes back as the same exception, a child
that cannot run leaves the compile to this process, and the daemon itself never imports onnx."""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import inferd
from inferd import package
from inferd.errors import UnsupportedOpError
from inferd.runtime import childcompile, rehearsal


@pytest.fixture(scope="module")
def small_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("cc") / "small.onnx"
    onnx.save(rehearsal.model(), str(p))
    return p


def _unsupported(path: Path) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="ok"),
                           helper.make_node("NoSuchOp", ["r"], ["y"], name="the_odd_one")], "g", [x], [y])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_a_package_compiled_in_a_child_loads_and_answers_as_one_compiled_here(small_onnx: Path, tmp_path: Path) -> None:
    out = tmp_path / "pkg"
    childcompile.compile_package(small_onnx, out, {"device": "cpu", "profile": False})
    assert (out / "plan.bin").is_file() and (out / "weights.store").is_file()
    x = np.random.default_rng(3).standard_normal(rehearsal.SHAPE).astype(np.float32)
    ref = inferd.load(str(small_onnx), device="cpu")
    m = inferd.load(str(out), device="cpu")
    try:
        np.testing.assert_allclose(m.run({"input": x})["output"], ref.run({"input": x})["output"], rtol=1e-4,
                                   atol=1e-5)
    finally:
        m.close()
        ref.close()


def test_a_models_error_comes_back_as_the_same_exception(tmp_path: Path) -> None:
    src = _unsupported(tmp_path / "odd.onnx")
    with pytest.raises(UnsupportedOpError) as here:
        package.compile_model(src, tmp_path / "here", device="cpu", profile=False)
    with pytest.raises(UnsupportedOpError) as there:
        childcompile.compile_package(src, tmp_path / "there", {"device": "cpu", "profile": False})
    assert str(there.value) == str(here.value) and "NoSuchOp" in str(there.value)
    assert there.value.op_type == "NoSuchOp" and there.value.node == "the_odd_one"


def test_exceptions_travel_back_as_they_were_raised() -> None:
    import errno

    from inferd.errors import PackageUnsupported
    from inferd.runtime._compile_child import _described

    for raised in (OSError(errno.ENOSPC, "No space left on device", "/cache/x/weights.store"),
                   PackageUnsupported("shaped at run time", template=object()), KeyError("layer"),
                   UnsupportedOpError("NoSuchOp", "n1", 17, "no kernel")):
        back = childcompile._rebuilt(_described(raised))
        assert type(back) is type(raised) and str(back) == str(raised), (back, raised)
    back = childcompile._rebuilt(_described(PackageUnsupported("x", template=object())))
    assert back.template is None  # (not sent: the caller imports the model again)
    assert childcompile._rebuilt(_described(UnsupportedOpError("Foo", "n2"))).node == "n2"


def test_a_child_that_cannot_run_is_childfailed(small_onnx: Path, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(childcompile.sys, "executable", str(tmp_path / "no-python"))
    with pytest.raises(childcompile.ChildFailed, match="could not start"):
        childcompile.compile_package(small_onnx, tmp_path / "pkg", {"device": "cpu"})


def test_the_cache_compiles_in_a_child_and_falls_back_here(small_onnx: Path, tmp_path: Path, monkeypatch: Any,
                                                           caplog: Any) -> None:
    calls: list[str] = []
    real = childcompile.compile_package

    def counted(src: Any, out: Any, kw: dict[str, Any], nice: int = 10) -> None:
        calls.append(str(out))
        real(src, out, kw, nice)

    monkeypatch.setattr(childcompile, "compile_package", counted)
    monkeypatch.setattr(package, "_in_children", True)
    got = package.cached_package(small_onnx, tmp_path / "c1", device="cpu")
    assert got is not None and (got / "plan.bin").is_file() and len(calls) == 1

    def broken(*_a: Any, **_k: Any) -> None:
        raise childcompile.ChildFailed("the compile exited with -9: (nothing on stderr)")

    monkeypatch.setattr(childcompile, "compile_package", broken)
    with caplog.at_level(logging.WARNING, logger="inferd.package"):
        got = package.cached_package(small_onnx, tmp_path / "c2", device="cpu")
    assert got is not None and (got / "plan.bin").is_file()  # compiled here instead
    assert "compiling it in this one" in caplog.text


def test_a_daemon_compiles_a_new_model_without_importing_onnx(small_onnx: Path, tmp_path: Path) -> None:
    """The daemon answers while it compiles (the compile's ``import onnx`` held the GIL 1-2.5 s): it never maps
    onnx's or ml_dtypes' extension modules."""
    from inferd.server.testing import DaemonProcess
    from inferd_client import Client

    models = tmp_path / "m"
    models.mkdir()
    (models / "small.onnx").write_bytes(small_onnx.read_bytes())
    env = dict(os.environ, INFERD_CACHE_DIR=str(tmp_path / "cache"), INFERD_MEMORY_PRESSURE="off",
               INFERD_REHEARSE="false")
    with DaemonProcess(f"ipc://{tmp_path}/s.sock", models, env=env, log_path=tmp_path / "d.log") as d, \
            Client(d.endpoint, timeout=60) as c:
        out = c.infer("small", {"input": np.zeros(rehearsal.SHAPE, np.float32)})
        assert out["output"].shape == (1, 10)
        end = time.monotonic() + 30  # (the idle-time work after the answer: profiling, the warm switch)
        while not c.status()["models"]["small"].get("warm") and time.monotonic() < end:
            time.sleep(0.1)
        maps = Path(f"/proc/{d.pid}/maps").read_text()
    assert list(Path(tmp_path / "cache").rglob("plan.bin")), "no package was compiled into the cache"
    assert "onnx_cpp2py_export" not in maps and "_ml_dtypes_ext" not in maps
