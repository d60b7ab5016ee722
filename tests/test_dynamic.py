"""Models with dynamic input dimensions: one copy of the weights for every shape, in the library (CPU and
Vulkan, from ONNX and from a compiled package) and in a real daemon with several client processes."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import inferd
from inferd.errors import InputError
from inferd.server.testing import DaemonProcess
from inferd_client import Client
from inferd_client.errors import InvalidArgument
from ortutil import ort_session
from zoo_fixture import zoo_dir

DYNAMIC = ["detnet_dyn", "recnet_dyn"]
TOL = 1e-4
#: four shapes per model (batch, height and width change), one of them repeated later
SHAPES = {
    "detnet_dyn": [(1, 3, 64, 64), (2, 3, 100, 76), (1, 3, 96, 200), (1, 3, 33, 47)],
    "recnet_dyn": [(1, 3, 32, 100), (3, 3, 32, 64), (1, 3, 32, 7), (2, 3, 32, 257)],
}


def _vulkan() -> bool:
    try:
        from inferd.vulkan import available

        return bool(available())
    except Exception:
        return False


DEVICES = ["cpu", pytest.param("vulkan", marks=[pytest.mark.vulkan, pytest.mark.skipif(not _vulkan(),
                                                                                       reason="no Vulkan device")])]


def _x(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng([seed, *shape]).standard_normal(shape).astype(np.float32)


def _rel(y: np.ndarray, ref: np.ndarray) -> float:
    assert y.shape == ref.shape, (y.shape, ref.shape)
    return float(np.abs(y - ref).max() / max(np.abs(ref).max(), 1e-30))


def _weights_bytes(path: Path) -> int:
    import onnx

    return sum(int(np.prod(t.dims)) * 4 for t in onnx.load(str(path)).graph.initializer)


@pytest.fixture(scope="module")
def models() -> Path:
    return zoo_dir(DYNAMIC)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", DYNAMIC)
@pytest.mark.parametrize("packaged", [False, True], ids=["onnx", "package"])
def test_every_shape_matches_onnxruntime_and_shares_the_weights(models: Path, name: str, device: str,
                                                                 packaged: bool, tmp_path: Path) -> None:
    path = models / f"{name}.onnx"
    sess = ort_session(path, threads=1)
    m = inferd.load(path, device=device, cache_dir=tmp_path / "cache" if packaged else None)
    try:
        assert m.dims["input"][0] == "N" and any(isinstance(d, str) for d in m.dims["input"][2:])
        m.wait_loaded()
        base = m.memory_bytes
        for k, shape in enumerate(SHAPES[name] + [SHAPES[name][0]]):
            x = _x(shape, k)
            y = m.run({"input": x})["output"]
            assert _rel(y, sess.run(None, {"input": x})[0]) <= TOL, (shape, _rel(y, sess.run(None, {"input": x})[0]))
        assert len(m.variants) == len(SHAPES[name])  # the repeat reused its variant
        wb = _weights_bytes(path)
        for v in m.variants:
            # every layer with weights binds the first shape's copy: a variant adds activations (and the tiny
            # per-shape constants of reshapes), never the weights again
            big = [s for s in v.graph.nodes if any(v.graph.infos[i].nbytes > 4096 for i in s.inputs
                                                   if i and i in v.graph.constants)]
            assert v.shared >= len(big) > 0, (v.shapes, v.shared, len(big))
            assert v.own <= 4
        if device == "cpu":  # on the GPU, allocations are rounded and pooled: memory is checked on the CPU
            for v in m.variants:
                assert v.memory_bytes < wb / 2 + v.backend.arena.nbytes, (v.shapes, v.memory_bytes)
        assert m.memory_bytes > base
    finally:
        m.close()


def test_a_shape_takes_its_own_kernel_on_weights_of_the_same_form(tmp_path: Path) -> None:
    """A shape's executor adopting the first shape's layers: where the first shape runs a kernel that this shape
    would not choose but whose weights are of the same form (a cold load's banded im2col; the direct kernel
    here, both on the GEMM's packed weights), this shape runs its own default kernel on the one transformed
    copy; where the forms differ (F(4,3)), the donor's kernel. Both match onnxruntime."""
    from onnx import TensorProto, helper, numpy_helper

    from inferd.frontend import specialize
    from inferd.ops.base import choose_kernel, kernels_for
    from inferd.runtime.cpu import CpuExecutor, select_kernels

    rng = np.random.default_rng(3)
    w = numpy_helper.from_array((rng.standard_normal((32, 32, 3, 3)) * 0.1).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b")
    g = helper.make_graph(
        [helper.make_node("Conv", ["input", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["output"])], "g",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 32, "H", "W"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 32, "H", "W"])], [w, b])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "conv_dyn.onnx"
    path.write_bytes(model.SerializeToString())
    sess = ort_session(path, threads=1)
    m = inferd.load(path, device="cpu")
    try:
        template = m.template
        tiled = [k for k in kernels_for("Conv", "cpu") if k.name == "im2col_tiled"][0]
        big = specialize(template, {"input": (1, 32, 40, 40)})
        donor = CpuExecutor(big, choice=[(layer, tiled if layer.op == "Conv" else k)
                                         for layer, k in select_kernels(big)])
        donor_w = [s for s in donor.steps if s is not None and s.layer.op == "Conv"][0].params["w"]
        for shape, want in [((1, 32, 14, 14), "direct_gemm"), ((1, 32, 100, 100), "winograd43")]:
            v = CpuExecutor(specialize(template, {"input": shape}), lazy=True)
            counts = v.adopt(donor)
            step = [s for s in v.steps if s is not None and s.layer.op == "Conv"][0]
            assert choose_kernel(step.layer).name == want
            if want == "direct_gemm":  # the same form: its own kernel on the donor's array
                assert step.kernel.name == want and step.params["w"] is donor_w
                assert counts == {"shared": 1, "own": 0}
            else:  # F(4,3) transforms the weights its own way: the donor's kernel and array where it applies
                assert step.kernel.name == "im2col_tiled" and step.params["w"] is donor_w
            x = _x(shape)
            assert _rel(v.run({"input": x})["output"], sess.run(None, {"input": x})[0]) <= TOL, shape
    finally:
        m.close()


def test_bad_shapes_are_refused_naming_expected_and_got(models: Path) -> None:
    m = inferd.load(models / "recnet_dyn.onnx", max_shape={"input": (4, 3, 32, 512)})
    try:
        cases = {
            (1, 3, 32): r"expects shape \[N, 3, 32, W\].*got \[1, 3, 32\]: rank 3",
            (1, 3, 31, 64): r"got \[1, 3, 31, 64\]: dimension 2 must be 32",
            (1, 3, 32, 0): r"dimension 3 is 0",
            (1, 3, 32, 600): r"at most \[4, 3, 32, 512\].*dimension 3 exceeds 512",
            (5, 3, 32, 64): r"dimension 0 exceeds 4",
        }
        for shape, msg in cases.items():
            with pytest.raises(InputError, match=msg):
                m.run({"input": np.zeros(shape, np.float32)})
        with pytest.raises(InputError, match="dtype float32"):
            m.run({"input": np.zeros((1, 3, 32, 64), np.float64)})
        assert not m.variants  # nothing was prepared for a refused request
        y = m.run({"input": _x((1, 3, 32, 64))})["output"]  # and it still serves
        assert y.shape == (1, 16, 37)
    finally:
        m.close()


def test_variants_beyond_the_bound_are_replanned_and_memory_stays_bounded(models: Path) -> None:
    import gc
    import tracemalloc

    path = models / "detnet_dyn.onnx"
    sess = ort_session(path, threads=1)
    m = inferd.load(path, max_variants=2)
    try:
        shapes = [(1, 3, 96 + 16 * k, 128) for k in range(6)]
        held = []
        tracemalloc.start()  # numpy reports its buffers: what stays allocated, without the allocator's noise in RSS
        try:
            for rnd in range(4):
                for k, shape in enumerate(shapes):
                    x = _x(shape, rnd)
                    if rnd < 2:
                        assert _rel(m.run({"input": x})["output"], sess.run(None, {"input": x})[0]) <= TOL
                    else:
                        m.run({"input": x})
                    assert len(m.variants) <= 2
                    # what the model counts is its first shape and the two variants kept, nothing evicted
                    assert m.memory_bytes == m._exec.memory_bytes + sum(v.memory_bytes for v in m.variants)
                gc.collect()
                held.append(tracemalloc.get_traced_memory()[0])
        finally:
            tracemalloc.stop()
        assert [v.shapes["input"] for v in m.variants] == shapes[-2:]  # least recently used dropped
        # 12 evictions after the second round (the first two fill caches of shapes and kernels): nothing of theirs
        # stays allocated (each variant's arena is ~1 MiB)
        assert held[-1] - held[1] < 256 * 1024, [h // 1024 for h in held]
    finally:
        m.close()


def test_shapes_prepared_at_load_and_a_damaged_dynamic_package_is_rebuilt(models: Path, tmp_path: Path) -> None:
    src = tmp_path / "recnet_dyn.onnx"
    shutil.copy(models / "recnet_dyn.onnx", src)
    want = [{"input": (1, 3, 32, 128)}, {"input": (2, 3, 32, 64)}]
    m = inferd.load(src, cache_dir=tmp_path / "c", shapes=want)
    try:
        assert m.inputs[0].shape == (1, 3, 32, 128)  # the first shape is the one planned
        assert [v.shapes["input"] for v in m.variants] == [(2, 3, 32, 64)]
    finally:
        m.close()
    (pkg,) = (tmp_path / "c").iterdir()
    store = pkg / "weights.store"
    data = bytearray(store.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a flipped byte inside some blob: caught by its checksum, then rebuilt
    store.write_bytes(bytes(data))
    sess = ort_session(src, threads=1)
    m = inferd.load(src, cache_dir=tmp_path / "c", shapes=want[:1])
    try:
        for shape in [(1, 3, 32, 128), (1, 3, 32, 300), (4, 3, 32, 16)]:
            x = _x(shape)
            assert _rel(m.run({"input": x})["output"], sess.run(None, {"input": x})[0]) <= TOL
    finally:
        m.close()


_CLIENT = r"""
import json, sys
import numpy as np
from inferd_client import Client
endpoint, name, shapes, seed, out = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
res = {}
with Client(endpoint, timeout=300) as c:
    for rnd in range(2):
        for k, shape in enumerate(shapes):
            x = np.random.default_rng([seed, rnd, k]).standard_normal(shape).astype(np.float32)
            res[f"x{rnd}_{k}"] = x
            res[f"y{rnd}_{k}"] = c.infer(name, {"input": x})["output"]
np.savez(out, **res)
"""


@pytest.mark.parametrize("device", DEVICES)
def test_daemon_serves_every_shape_to_several_client_processes(models: Path, device: str) -> None:
    d = Path(tempfile.mkdtemp(prefix="ifdd", dir="/tmp"))
    try:
        (d / "models" / "rec").mkdir(parents=True)
        shutil.copy(models / "detnet_dyn.onnx", d / "models" / "det.onnx")
        shutil.copy(models / "recnet_dyn.onnx", d / "models" / "rec" / "model.onnx")
        (d / "models" / "rec" / "config.toml").write_text(
            'shapes = [{ input = [1, 3, 32, 128] }, { input = [1, 3, 32, 64] }]\n'
            'max_shape = { input = [4, 3, 32, 512] }\nmax_variants = 3\n')
        with DaemonProcess(f"ipc://{d}/s.sock", d / "models", "--cache-dir", str(d / "cache"),
                           log_path=d / "daemon.log", device=device) as dp:
            jobs = [("det", SHAPES["detnet_dyn"]), ("rec", SHAPES["recnet_dyn"][:3]), ("det", SHAPES["detnet_dyn"][::-1])]
            procs = [subprocess.Popen([sys.executable, "-c", _CLIENT, dp.endpoint, n, json.dumps(s), str(k),
                                       str(d / f"out{k}.npz")], env=os.environ.copy())
                     for k, (n, s) in enumerate(jobs)]
            for p in procs:
                assert p.wait(600) == 0
            sess = {k: ort_session(models / f"{k}net_dyn.onnx", threads=1) for k in ("det", "rec")}
            for k, (n, s) in enumerate(jobs):
                got = np.load(d / f"out{k}.npz")
                for key in [f for f in got.files if f.startswith("x")]:
                    ref = sess[n].run(None, {"input": got[key]})[0]
                    assert _rel(got["y" + key[1:]], ref) <= TOL, (n, key)
            with Client(dp.endpoint, timeout=60) as c:
                ms = {m["name"]: m for m in c.models()}
                rec = ms["rec"]
                assert rec["inputs"][0]["dims"] == ["N", 3, 32, "W"] and rec["inputs"][0]["shape"] == [1, 3, 32, 128]
                assert len(rec["variants"]) <= 3 and all(v["shared_layers"] > 0 for v in rec["variants"])
                assert ms["det"]["inputs"][0]["dims"] == ["N", 3, "H", "W"]
                assert len(ms["det"]["variants"]) == 4  # the daemon's default bound
                for bad, msg in [((1, 3, 32), "rank"), ((1, 3, 30, 64), "must be 32"), ((1, 3, 32, 0), "is 0"),
                                 ((1, 3, 32, 999), "exceeds 512")]:
                    with pytest.raises(InvalidArgument, match=msg):
                        c.infer("rec", {"input": np.zeros(bad, np.float32)})
                y = c.infer("rec", {"input": _x((1, 3, 32, 64))})["output"]  # still serving
                assert y.shape == (1, 16, 37)
            out = subprocess.run([sys.executable, "-m", "inferd_client.cli", "--endpoint", dp.endpoint, "models"],
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            assert "input:float32[N, 3, 32, W]" in out.stdout and "1x3x32x128" in out.stdout, out.stdout
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("name", DYNAMIC)
def test_a_dynamic_package_records_its_shaped_graph_and_opens_without_shaping(models: Path, tmp_path: Path,
                                                                            name: str, monkeypatch) -> None:
    from inferd import package as P
    from inferd.frontend.shapes import specialize

    pkg = P.compile_model(models / f"{name}.onnx", tmp_path / "pkg")
    d = P.read_plan(pkg / "plan.bin")
    assert d["at_shape"] is not None
    # an open takes the recorded graph: no shape inference (2 ms of mobilenetv2's cold load)
    with monkeypatch.context() as mp:
        def refuse(*_a, **_k):
            raise AssertionError("shaped again")
        mp.setattr(P, "specialize", refuse)
        op = P.open_package(pkg)
    try:
        shaped = specialize(op.template)
        g = op.graph
        assert [(n.name, n.op, n.inputs, n.outputs, repr(n.attrs)) for n in g.nodes] == \
            [(n.name, n.op, n.inputs, n.outputs, repr(n.attrs)) for n in shaped.nodes]
        assert (g.infos, g.inputs, g.outputs, g.dims) == (shaped.infos, shaped.inputs, shaped.outputs, shaped.dims)
        for k in {i for n in shaped.nodes for i in n.inputs if i}:
            assert (k in g.constants) == (k in shaped.constants)
            if k in shaped.constants:
                np.testing.assert_array_equal(np.asarray(g.constants[k]), np.asarray(shaped.constants[k]))
    finally:
        op.store.close()
    # a package written before the record (or without one) is shaped at open, with the same answers
    x = _x(SHAPES[name][0])
    m = inferd.load(pkg)
    try:
        want = m.run({"input": x})["output"]
    finally:
        m.close()
    d.pop("at_shape")
    P.write_plan(pkg / "plan.bin", d)
    m = inferd.load(pkg)
    try:
        np.testing.assert_array_equal(m.run({"input": x})["output"], want)
    finally:
        m.close()
    # a record that names a tensor nobody shaped is a damaged plan: refused at open (a load then rebuilds it)
    d["at_shape"] = {**P._shaped_record(op.template, shaped), "nodes": [["bad", "Relu", ["nowhere"], ["y"], {}]]}
    P.write_plan(pkg / "plan.bin", d)
    with pytest.raises(P.WeightsStoreError, match="unknown tensors"):
        P.open_package(pkg)
