"""Cold loads in the daemon: several at once from several clients, the breakdown in status, and a
cold load that fails half way while the other models keep serving."""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest

from inferd.package import read_plan
from inferd.planner.plan import ColdPlan
from inferd.server.testing import DaemonProcess
from inferd.store import WeightsStore
from inferd_client import Client
from zoo_fixture import zoo_dir
from ortutil import ort_session

MODELS = ["squeezenet1_1", "mobilenetv2", "shufflenetv2_x1_0", "resnet18"]
TOL = 1e-4


def _input(path: Path) -> str:
    import onnx

    return onnx.load(str(path), load_external_data=False).graph.input[0].name


def _ort(path: Path, x: np.ndarray) -> np.ndarray:
    s = ort_session(path, threads=1)
    return s.run(None, {s.get_inputs()[0].name: x})[0]


@pytest.fixture(scope="module")
def repo():
    d = Path(tempfile.mkdtemp(prefix="ifdc", dir="/tmp"))
    (d / "models").mkdir()
    src = zoo_dir(MODELS)
    for n in MODELS:
        shutil.copy(src / f"{n}.onnx", d / "models" / f"{n}.onnx")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_four_clients_four_cold_loads_at_once(repo: Path) -> None:
    x = np.random.default_rng(5).standard_normal((1, 3, 224, 224)).astype(np.float32)
    want = {n: _ort(repo / "models" / f"{n}.onnx", x) for n in MODELS}
    with DaemonProcess(f"ipc://{repo}/a.sock", repo / "models", "--no-preload", "--cache-dir", str(repo / "cache"),
                       log_path=repo / "a.log") as d:
        got: dict[str, np.ndarray] = {}
        errors: list[BaseException] = []
        go = threading.Barrier(len(MODELS))

        def client(name: str) -> None:
            try:
                with Client(d.endpoint, timeout=240) as c:
                    go.wait()
                    out = c.infer(name, {_input(repo / "models" / f"{name}.onnx"): x})
                    got[name] = next(iter(out.values()))
            except BaseException as e:  # reported below
                errors.append(e)

        ths = [threading.Thread(target=client, args=(n,)) for n in MODELS]
        for t in ths:
            t.start()
        for t in ths:
            t.join(300)
        assert not errors, errors
        for n in MODELS:
            err = float(np.abs(got[n] - want[n]).max() / np.abs(want[n]).max())
            assert err <= TOL, (n, err)
        with Client(d.endpoint, timeout=30) as c:
            st = c.status()
        for n in MODELS:
            cold = st["models"][n]["cold"]
            assert cold["cold_s"] > 0 and cold["tasks"] > 0, (n, cold)
            assert {"read_s", "transform_s", "execute_s", "waiting_s", "predicted_s"} <= set(cold)
        # the packages compiled at first registration hold the plan and the profile
        assert len(list((repo / "cache").rglob("plan.bin"))) >= len(MODELS), d.log_text()[-3000:]


def test_a_cold_load_failing_half_way_leaves_the_others_serving(repo: Path) -> None:
    x = np.random.default_rng(6).standard_normal((1, 3, 224, 224)).astype(np.float32)
    cache = repo / "cache2"
    models = repo / "models"
    with DaemonProcess(f"ipc://{repo}/b.sock", models, "--no-preload", "--cache-dir", str(cache),
                       log_path=repo / "b.log") as d:
        ok_model = "squeezenet1_1"
        ok_inp = _input(models / f"{ok_model}.onnx")
        mb_inp = _input(models / "mobilenetv2.onnx")
        with Client(d.endpoint, timeout=240) as c:
            c.infer("mobilenetv2", {mb_inp: x})
            c.infer(ok_model, {ok_inp: x})
            c.unload("mobilenetv2")
        # damage the cached package of mobilenetv2 and its source (same size and mtime: the cache key still
        # matches), so the damaged blob is found half way through the cold load and the rebuild fails too
        pkg = next(p.parent for p in cache.rglob("plan.bin") if p.parent.name.startswith("mobilenetv2"))
        store = pkg / "weights.store"
        plan = ColdPlan.from_dict(read_plan(pkg / "plan.bin")["plan"])
        late = [lp for lp in plan.layers if lp.source == "transformed"][-3]  # a layer the loaders reach late
        with WeightsStore(store) as s:
            e = next(e for e in s.entries.values() if e.layer == late.name and e.variant == "transformed")
        data = bytearray(store.read_bytes())
        data[e.offset + e.size // 2] ^= 0xFF
        store.write_bytes(bytes(data))
        src = models / "mobilenetv2.onnx"
        st = src.stat()
        src.write_bytes(b"\0" * st.st_size)
        os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
        with Client(d.endpoint, timeout=240) as c:
            c.load("mobilenetv2")
            with pytest.raises(Exception) as ei:
                c.infer("mobilenetv2", {mb_inp: x})
            assert "checksum" in str(ei.value) or "mobilenetv2" in str(ei.value)
            out = c.infer(ok_model, {ok_inp: x})  # the daemon and its other models go on
            want = _ort(repo / "models" / f"{ok_model}.onnx", x)
            assert float(np.abs(next(iter(out.values())) - want).max() / np.abs(want).max()) <= TOL
            assert c.is_ready(timeout=10)


def test_the_cache_limit_is_kept_in_idle_time_after_a_load_never_deleting_a_package_in_use(tmp_path: Path) -> None:
    from inferd.server.testing import wait_until

    models = tmp_path / "models"
    models.mkdir()
    for n in ("a", "b"):  # two files: two packages
        shutil.copy(zoo_dir(["tiny"]) / "tiny.onnx", models / f"{n}.onnx")
    packages = tmp_path / "cache" / "packages"
    x = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype(np.float32)
    want = _ort(models / "a.onnx", x)

    def names() -> set[str]:
        return {p.name.split("-")[0] for p in packages.iterdir()} if packages.is_dir() else set()

    # a limit of one byte: every package is over it, so only those in use stay; no registration (it would compile
    # both packages in idle time, whenever its turn came, beside the loads this test orders)
    with DaemonProcess(f"ipc://{tmp_path}/d.sock", models, "--no-preload", "--no-register", "--cache-dir",
                       str(tmp_path / "cache"), "--cache-max-bytes", "1", log_path=tmp_path / "d.log") as d, \
            Client(d.endpoint, timeout=60) as c:
        inp = _input(models / "a.onnx")
        np.testing.assert_allclose(next(iter(c.infer("a", {inp: x}).values())), want, rtol=TOL, atol=TOL)
        assert names() == {"a"}  # in use: kept
        c.unload("a")
        got = c.infer("b", {inp: x})
        np.testing.assert_allclose(next(iter(got.values())), want, rtol=TOL, atol=TOL)
        wait_until(lambda: names() == {"b"}, timeout=20)  # a's package went once b's load had answered
        # (the eviction logs after it deleted: the line may come a moment after the directory went)
        wait_until(lambda: "evicted 1 least recently used" in d.log_text(), timeout=10)
        assert "cache" in d.log_text()
