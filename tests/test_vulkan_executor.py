"""The Vulkan executor: whole graphs vs onnxruntime, barriers, memory reuse, the warm path, staging,
errors, validation layers, device lifetime and the SPIR-V cache (lavapipe in CI)."""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import inferd.ops  # noqa: F401
import inferd.vulkan
from inferd.errors import InputError, KernelError, UnsupportedOpError
from inferd.ir import Graph, Node, TensorInfo

pytestmark = [pytest.mark.vulkan,
              pytest.mark.skipif(not inferd.vulkan.available(), reason="no Vulkan device")]

F32 = np.float32
RNG = np.random.default_rng(7)


@pytest.fixture(scope="module")
def tmp_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("vkexec")
    os.environ["MESA_SHADER_CACHE_DIR"] = str(d / "mesa")
    return d


@pytest.fixture(scope="module")
def device(tmp_cache: Path):
    from inferd.vulkan.device import VulkanConfig, VulkanDevice
    dev = VulkanDevice(VulkanConfig(debug=True, cache_dir=str(tmp_cache / "cache")))
    yield dev
    errors = dev.validation_errors
    dev.close()
    assert not errors, errors[:5]


def _w(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) * 0.3).astype(F32)


def branchy_model() -> onnx.ModelProto:
    """conv+relu -> two branches (1x1, 3x3) -> concat -> residual add -> maxpool -> flatten -> gemm -> softmax."""
    inits = {"w1": _w(8, 3, 3, 3), "b1": _w(8), "wa": _w(4, 8, 1, 1), "ba": _w(4), "wb": _w(4, 8, 3, 3),
             "bb": _w(4), "wf": _w(10, 8 * 5 * 6), "bf": _w(10)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "wa", "ba"], ["ca"]),
        helper.make_node("Conv", ["r1", "wb", "bb"], ["cb"], pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["ca", "cb"], ["cat"], axis=1),
        helper.make_node("Add", ["cat", "r1"], ["res"]),
        helper.make_node("MaxPool", ["res"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["g"], transB=1),
        helper.make_node("Softmax", ["g"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(nodes, "branchy", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 10, 12])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 10])],
                              initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    from inferd.vulkan.testing import rel_err
    return rel_err(a, b)


def test_graph_matches_onnxruntime_and_warm_runs_repeat(device: Any) -> None:
    from inferd.frontend import import_model
    from inferd.vulkan.model import VulkanModel
    model = branchy_model()
    g = import_model(model)
    x = RNG.standard_normal((1, 3, 10, 12)).astype(F32)
    ref = _ort(model, {"x": x})[0]
    with VulkanModel(g, device) as m:
        y1 = m.run({"x": x})["y"]
        assert _rel(y1, ref) <= 1e-4
        # warm runs with new inputs (inputs are rewritten in place, nothing is re-recorded)
        for _ in range(3):
            x2 = RNG.standard_normal((1, 3, 10, 12)).astype(F32)
            assert _rel(m.run({"x": x2})["y"], _ort(model, {"x": x2})[0]) <= 1e-4
        st = m.load_stats
        for key in ("fold_s", "select_s", "transform_s", "shader_compile_s", "pipeline_create_s", "alloc_s",
                    "upload_s", "record_s", "total_load_s", "first_run_s"):
            assert st[key] >= 0.0, key
        assert st["dispatches"] >= 7
        assert "alias" in m.kernel_names.values()  # Flatten: no buffer, no dispatch
        assert m.memory_bytes > 0


def _chain_graph(ops: list[str], shape: tuple[int, ...] = (2, 3, 5)) -> Graph:
    info = {"x": TensorInfo("x", shape, np.dtype(F32))}
    nodes = []
    prev = "x"
    for k, op in enumerate(ops):
        out = f"t{k}"
        nodes.append(Node(f"n{k}", op, [prev], [out], {}))
        info[out] = TensorInfo(out, shape, np.dtype(F32))
        prev = out
    return Graph("chain", nodes, [info["x"]], [info[prev]], {}, info)


def _numpy_chain(ops: list[str], x: np.ndarray) -> np.ndarray:
    from inferd.ops.base import op_spec
    for k, op in enumerate(ops):
        x = op_spec(op).reference(Node(f"n{k}", op, ["a"], ["b"], {}), [x])[0]
    return x


def test_barriers_only_where_a_dispatch_reads_an_earlier_write(device: Any) -> None:
    from inferd.vulkan.model import VulkanModel
    # chain: every dispatch reads its predecessor's output -> one barrier between each pair
    ops = ["Sigmoid", "Tanh", "Neg", "Sigmoid", "Abs"]
    g = _chain_graph(ops)
    x = RNG.standard_normal((2, 3, 5)).astype(F32)
    with VulkanModel(g, device) as m:
        assert m.load_stats["barriers"] == len(ops) - 1
        assert _rel(m.run({"x": x})["t4"], _numpy_chain(ops, x)) <= 1e-5
    # two independent branches reading x, then a join: only the join waits
    info = {n: TensorInfo(n, (4, 6), np.dtype(F32)) for n in ("x", "a", "b", "y")}
    nodes = [Node("na", "Sigmoid", ["x"], ["a"]), Node("nb", "Tanh", ["x"], ["b"]), Node("nj", "Add", ["a", "b"], ["y"])]
    g2 = Graph("par", nodes, [info["x"]], [info["y"]], {}, info)
    x = RNG.standard_normal((4, 6)).astype(F32)
    with VulkanModel(g2, device) as m:
        assert m.load_stats["dispatches"] == 3
        assert m.load_stats["barriers"] == 1
        ref = 1 / (1 + np.exp(-x)) + np.tanh(x)
        assert _rel(m.run({"x": x})["y"], ref) <= 1e-5


def test_a_models_descriptor_sets_come_from_a_few_pools_and_go_back(device: Any) -> None:
    """All layers' sets from one arena pool (not a pool a layer); an arena counts what each pool has left
    and opens another pool rather than over-fill one; a pool goes once all its sets are freed. The device
    fixture fails on any validation error (an over-full pool, a set freed twice, a leaked pool)."""
    from inferd.vulkan.executor import DescriptorArena
    from inferd.vulkan.model import VulkanModel
    ops = ["Sigmoid", "Tanh", "Neg", "Sigmoid", "Abs"]
    x = RNG.standard_normal((2, 3, 5)).astype(F32)
    with VulkanModel(_chain_graph(ops), device) as m:
        b = m._b
        assert b._descriptors.pools == 1
        leases = [p.dsets for p in b._prepared if p is not None and p.bound]
        assert len(leases) == len(ops) and len({id(le.pool) for le in leases}) == 1
        assert _rel(m.run({"x": x})["t4"], _numpy_chain(ops, x)) <= 1e-5
        layout = b._prepared[0].bound[0].pipeline.set_layout
        kinds = b._prepared[0].bound[0].pipeline.module.manifest.kinds
        from inferd.vulkan.device import descriptor_type
        counts: dict[int, int] = {}
        for k in kinds:
            counts[descriptor_type(k)] = counts.get(descriptor_type(k), 0) + 1
        small = DescriptorArena(device)
        small.SETS, small.PER_TYPE = 3, 2 * max(counts.values())
        got = [small.allocate([layout, layout], {t: 2 * c for t, c in counts.items()}) for _ in range(4)]
        # 3 sets a pool: two leases of two sets never share one
        assert small.pools == 4 and len({id(le.pool) for le in got}) == 4
        one = [small.allocate([layout], counts) for _ in range(2)]
        assert small.pools == 5  # each pool of two sets has one set left, but its descriptors are spent
        assert one[0].pool is one[1].pool
        small.free(got[0])
        assert small.pools == 4  # its only lease freed: the pool is gone
        small.free(one[0])
        assert small.pools == 4  # one set of two freed: the pool stays
        small.free(one[1])
        small.free(one[1])  # twice: nothing (its pool is gone)
        assert small.pools == 3
        small.destroy()
        assert small.pools == 0
    assert m._b._descriptors.pools == 0  # closed with the model


def test_memory_is_reused_and_results_stay_right(device: Any) -> None:
    """A long chain needs only two live activation buffers: the planner reuses them (WAR hazards on
    reused ranges must be ordered by the barriers) and the answer is still exact."""
    from inferd.vulkan.model import VulkanModel
    ops = ["Sigmoid", "Tanh", "Neg", "Abs", "Sigmoid", "Neg", "Tanh", "Abs"]
    shape = (8, 32, 32)
    g = _chain_graph(ops, shape)
    x = RNG.standard_normal(shape).astype(F32)
    with VulkanModel(g, device) as m:
        nbytes = 4 * int(np.prod(shape))
        assert m.load_stats["activation_bytes"] <= 3 * nbytes + 1024  # input + 2 ping-pong buffers, not 9
        for _ in range(2):
            assert _rel(m.run({"x": x})[g.outputs[0].name], _numpy_chain(ops, x)) <= 1e-5


def test_warm_python_work_does_not_grow_with_layers(device: Any) -> None:
    from inferd.vulkan.model import VulkanModel

    def calls(n_layers: int) -> int:
        ops = ["Sigmoid", "Tanh"] * (n_layers // 2)
        g = _chain_graph(ops)
        x = RNG.standard_normal((2, 3, 5)).astype(F32)
        with VulkanModel(g, device) as m:
            for _ in range(3):  # (the later runs poll for the fence: their GPU part was seen to be short)
                m.run({"x": x})
            count = 0
            waiting = 0  # inside the fence wait: a polled one asks for the status as long as the GPU runs

            def prof(frame: Any, event: str, arg: Any) -> None:
                nonlocal count, waiting
                if frame.f_code.co_name == "wait_fence_polled" and event in ("call", "return"):
                    waiting += 1 if event == "call" else -1
                    return
                if event in ("call", "c_call") and not waiting:
                    count += 1
            sys.setprofile(prof)
            try:
                m.run({"x": x})
            finally:
                sys.setprofile(None)
            return count

    small, big = calls(2), calls(40)
    assert big == small, f"Python calls per warm run: {small} for 2 layers, {big} for 40"


def test_staging_path_when_memory_is_not_host_visible(tmp_cache: Path) -> None:
    from inferd.frontend import import_model
    from inferd.vulkan.device import VulkanConfig, VulkanDevice
    from inferd.vulkan.model import VulkanModel
    dev = VulkanDevice(VulkanConfig(force_staging=True, debug=True, cache_dir=str(tmp_cache / "cache")))
    try:
        model = branchy_model()
        x = RNG.standard_normal((1, 3, 10, 12)).astype(F32)
        with VulkanModel(import_model(model), dev) as m:
            assert m.act_region.mapped is None and all(r.mapped is None for r in m.weight_regions)
            assert m.io_region is not m.act_region and m.io_region.mapped is not None
            for _ in range(2):
                assert _rel(m.run({"x": x})["y"], _ort(model, {"x": x})[0]) <= 1e-4
        assert not dev.validation_errors, dev.validation_errors[:3]
    finally:
        dev.close()


def test_unsupported_op_fails_at_load_naming_it(device: Any) -> None:
    from inferd.ops.base import op_spec, single_node_layer
    from inferd.vulkan.model import VulkanModel
    from inferd.vulkan.testing import graph_of_layer
    # a 3-D convolution: the op exists, no Vulkan kernel applies: placed on the CPU (mixed placement), and
    # kernel_names says so (tests/test_mixed_placement.py checks whole models against onnxruntime)
    ins = [RNG.standard_normal((1, 2, 4, 4, 4)).astype(F32), _w(3, 2, 3, 3, 3)]
    layer = single_node_layer("Conv", ins, {}, name="conv3d")
    with VulkanModel(graph_of_layer(layer, ins), device) as m:
        assert m.kernel_names["conv3d"].startswith("cpu:")
        got = m.run({layer.node.inputs[0]: ins[0]})[layer.node.outputs[0]]
    want = op_spec("Conv").reference(layer.node, ins)[0]  # type: ignore[union-attr]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # an operator nobody implements
    info = {"x": TensorInfo("x", (3, 4), np.dtype(F32)), "y": TensorInfo("y", (3, 4), np.dtype(F32))}
    g = Graph("foo", [Node("weird", "FooBar", ["x"], ["y"])], [info["x"]], [info["y"]], {}, info)
    with pytest.raises(UnsupportedOpError, match="FooBar.*weird"):
        VulkanModel(g, device)


def test_forced_kernel_that_does_not_apply_is_an_error(device: Any) -> None:
    from inferd.ops.base import single_node_layer
    from inferd.vulkan.model import VulkanModel
    from inferd.vulkan.testing import graph_of_layer
    ins = [RNG.standard_normal((1, 3, 8, 8)).astype(F32), _w(4, 3, 5, 5), _w(4)]
    layer = single_node_layer("Conv", ins, {"pads": [2, 2, 2, 2]})
    with pytest.raises(KernelError, match="vk_winograd23"):
        VulkanModel(graph_of_layer(layer, ins), device, kernels={"Conv": "vk_winograd23"})


def test_bad_inputs_raise_input_error(device: Any) -> None:
    from inferd.vulkan.model import VulkanModel
    g = _chain_graph(["Sigmoid"])
    with VulkanModel(g, device) as m:
        with pytest.raises(InputError, match="expected inputs"):
            m.run({"nope": np.zeros((2, 3, 5), F32)})
        with pytest.raises(InputError, match="shape"):
            m.run({"x": np.zeros((2, 3, 6), F32)})
        with pytest.raises(InputError, match="float32"):
            m.run({"x": np.zeros((2, 3, 5), np.float64)})
    with pytest.raises(inferd.errors.BackendError, match="closed"):
        m.run({"x": np.zeros((2, 3, 5), F32)})


def test_validation_messenger_records_errors(tmp_cache: Path) -> None:
    """The debug messenger must see real validation errors (so 'no errors' elsewhere means something)."""
    import vulkan as vk
    from inferd.vulkan.device import VulkanConfig, VulkanDevice
    dev = VulkanDevice(VulkanConfig(debug=True, cache_dir=""))
    try:
        if not dev.validation:
            pytest.skip("VK_LAYER_KHRONOS_validation is not installed")
        assert not dev.validation_errors
        # a zero-sized buffer is invalid usage (VUID-VkBufferCreateInfo-size-00912)
        try:
            buf = vk.vkCreateBuffer(dev.device, vk.VkBufferCreateInfo(size=0, usage=vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT,
                                                                      sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
            vk.vkDestroyBuffer(dev.device, buf, None)
        except Exception:
            pass
        assert any("size" in e for e in dev.validation_errors), dev.messages
    finally:
        dev.close()


def test_shared_device_is_one_per_process_and_thread_safe(tmp_cache: Path) -> None:
    from inferd.vulkan import device as vd
    vd.close_shared_device()
    got: list[Any] = []
    ts = [threading.Thread(target=lambda: got.append(vd.get_device({"cache_dir": str(tmp_cache / "cache")})))
          for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    try:
        assert len(got) == 4 and all(d is got[0] for d in got)
        assert inferd.vulkan.get_device() is got[0]
    finally:
        vd.close_shared_device()
    assert got[0].closed
    got[0].close()  # idempotent


def test_device_close_closes_models(tmp_cache: Path) -> None:
    from inferd.vulkan.device import VulkanConfig, VulkanDevice
    from inferd.vulkan.model import VulkanModel
    dev = VulkanDevice(VulkanConfig(cache_dir=str(tmp_cache / "cache")))
    m = VulkanModel(_chain_graph(["Tanh"]), dev)
    dev.close()
    with pytest.raises(inferd.errors.BackendError):
        m.run({"x": np.zeros((2, 3, 5), F32)})


@pytest.mark.usefixtures("no_test_spirv")
def test_spirv_cache_on_disk_manifest_and_corruption(tmp_path: Path) -> None:
    from inferd.vulkan.shaders import ShaderCache
    c1 = ShaderCache(tmp_path)
    mod = c1.get("binary", {"BOP": 2, "RESIDUAL": 1})
    assert c1.compiled == 1
    man = mod.manifest
    assert [(b.binding, b.readonly, b.writeonly) for b in man.bindings] == [
        (0, True, False), (1, True, False), (2, True, False), (3, False, True)]
    assert [p.name for p in man.push][:2] == ["n", "rank"] and man.push_size == 88
    c2 = ShaderCache(tmp_path)
    mod2 = c2.get("binary", {"BOP": 2, "RESIDUAL": 1})
    assert c2.compiled == 0 and c2.disk_hits == 1 and mod2.spirv == mod.spirv
    # other defines are another variant (keyed by source + defines + compiler)
    c2.get("binary", {"BOP": 3, "RESIDUAL": 1})
    assert c2.compiled == 1
    spv = tmp_path / "spirv" / f"{mod.key}.spv"
    spv.write_bytes(spv.read_bytes()[:-8] + b"garbage!")
    c3 = ShaderCache(tmp_path)
    assert c3.get("binary", {"BOP": 2, "RESIDUAL": 1}).spirv == mod.spirv
    assert c3.compiled == 1  # the corrupt entry was detected by its checksum and rebuilt
    conv = c3.get("conv_dw", {})
    assert [s.name for s in conv.manifest.spec] == ["KH", "KW", "SH", "SW", "DH", "DW", "GID_BASE"]


@pytest.mark.usefixtures("no_test_spirv")
def test_spirv_bundle_serves_a_new_process_and_a_bad_one_is_a_miss(tmp_path: Path, caplog: Any) -> None:
    import logging
    import shutil

    from inferd.vulkan.shaders import ShaderCache, norm_defines, shader_dir
    variants = [("binary", norm_defines({"BOP": 2, "RESIDUAL": 1})), ("conv_dw", ())]
    c1 = ShaderCache(tmp_path)
    mods = c1.get_many(variants)
    assert c1.compiled == 2
    assert c1.save_bundle() and not c1.save_bundle()  # nothing new the second time: no rewrite
    # without the per-file entries, a new cache (a new process) serves both from the bundle, compiling nothing
    for p in (tmp_path / "spirv").glob("*.spv"):
        p.unlink()
    c2 = ShaderCache(tmp_path)
    assert c2.preload_bundle() == 2
    got = c2.get_many(variants)
    assert (c2.bundle_hits, c2.disk_hits, c2.compiled) == (2, 0, 0)
    assert [m.spirv for m in got] == [m.spirv for m in mods]
    assert [m.manifest.to_json() for m in got] == [m.manifest.to_json() for m in mods]
    # a source that changed since is another key: the bundled entry is not used for it
    sdir = tmp_path / "src"
    shutil.copytree(shader_dir(), sdir)
    (sdir / "binary.comp").write_text((sdir / "binary.comp").read_text() + "\n// changed\n")
    c5 = ShaderCache(tmp_path, sdir=sdir)
    c5.preload_bundle()
    c5.get_many(variants)
    assert (c5.bundle_hits, c5.compiled) == (1, 1)
    # damaged (a flipped byte: the checksum), truncated, or of another version: a miss with a warning
    bundle = tmp_path / "spirv" / "bundle.bin"
    good = bundle.read_bytes()
    for bad in (good[:-5] + bytes([good[-5] ^ 0xFF]) + good[-4:], good[:10], good[:8] + b"\x63" + good[9:]):
        bundle.write_bytes(bad)
        c3 = ShaderCache(tmp_path)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="inferd.vulkan.shaders"):
            assert c3.preload_bundle() == 0
        assert "SPIR-V bundle" in caplog.text
        assert c3.get_many(variants)[0].spirv == mods[0].spirv
        assert c3.bundle_hits == 0 and c3.compiled + c3.disk_hits == 2  # compiled, or the entries the last wrote
    # the last of them rewrites it whole, valid again
    assert c3.save_bundle()
    c4 = ShaderCache(tmp_path)
    assert c4.preload_bundle() == 2


def test_bool_and_int64_tensors_flow_through_a_graph(device: Any) -> None:
    """Greater -> Where (a bool intermediate) and ArgMax (an int64 graph output)."""
    from inferd.vulkan.model import VulkanModel
    f, b, i8 = np.dtype(F32), np.dtype(np.bool_), np.dtype(np.int64)
    info = {"x": TensorInfo("x", (3, 7), f), "y": TensorInfo("y", (3, 7), f), "c": TensorInfo("c", (3, 7), b),
            "m": TensorInfo("m", (3, 7), f), "a": TensorInfo("a", (3,), i8)}
    nodes = [Node("gt", "Greater", ["x", "y"], ["c"]), Node("wh", "Where", ["c", "x", "y"], ["m"]),
             Node("am", "ArgMax", ["m"], ["a"], {"axis": 1, "keepdims": 0})]
    g = Graph("mix", nodes, [info["x"], info["y"]], [info["m"], info["a"], info["c"]], {}, info)
    x, y = RNG.standard_normal((3, 7)).astype(F32), RNG.standard_normal((3, 7)).astype(F32)
    with VulkanModel(g, device) as m:
        out = m.run({"x": x, "y": y})
    assert np.array_equal(out["c"], x > y) and out["c"].dtype == np.bool_
    assert np.array_equal(out["m"], np.maximum(x, y))
    assert out["a"].dtype == np.int64 and np.array_equal(out["a"], np.argmax(np.maximum(x, y), axis=1))


def _copies(b: Any) -> dict[str, int]:
    """Copy dispatches each layer records (``copy.comp``), by node name."""
    out: dict[str, int] = {}
    for p in b._prepared:
        for bd in (p.bound if p is not None else ()):
            if bd.dispatch.shader == "copy":
                out[bd.layer.name] = out.get(bd.layer.name, 0) + 1
    return out


def _in_place_model() -> onnx.ModelProto:
    w = _w(3, 32, 1, 1)
    nodes = [
        helper.make_node("Split", ["x", "sizes"], ["s0", "s1"], axis=1),           # 2 x (1, 16, 5, 5): 1600 bytes
        helper.make_node("Sigmoid", ["s0"], ["a"]),
        helper.make_node("Tanh", ["s1"], ["b"]),
        helper.make_node("Concat", ["a", "b"], ["cat1"], axis=1),                  # both parts in place
        helper.make_node("Conv", ["x", "w"], ["m"]),                               # (1, 3, 5, 5): 300 bytes
        helper.make_node("Abs", ["x"], ["d"]),
        helper.make_node("Concat", ["cat1", "m", "d"], ["cat2"], axis=1),          # cat1 in place; m, d copied
        helper.make_node("Relu", ["cat2"], ["y"]),
        helper.make_node("Exp", ["a"], ["z"]),                                     # reads a inside cat1 inside cat2
        helper.make_node("Reshape", ["x", "shp"], ["xr"]),                         # (2, 16, 5, 5): an alias of x
        helper.make_node("Gather", ["xr", "one"], ["q"], axis=0),                  # x's second half, in place
        helper.make_node("Gather", ["xr", "two"], ["r"], axis=1),                  # (2, 5, 5): strided, copied
        helper.make_node("Sigmoid", ["q"], ["u"]),
        helper.make_node("Neg", ["r"], ["v"]),
    ]
    graph = helper.make_graph(
        nodes, "inplace", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 32, 5, 5])],
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in ("y", "z", "u", "v")],
        [numpy_helper.from_array(np.array([16, 16], np.int64), "sizes"), numpy_helper.from_array(w, "w"),
         numpy_helper.from_array(np.array([2, 16, 5, 5], np.int64), "shp"),
         numpy_helper.from_array(np.array(1, np.int64), "one"), numpy_helper.from_array(np.array(2, np.int64), "two")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_concat_and_split_parts_in_place_record_no_copies_and_match_onnxruntime(device: Any, monkeypatch: Any) -> None:
    """A Split's aligned parts and a one-index Gather's output (x's second half, through a Reshape) are read where
    they lie, and a Concat's aligned parts are written there by their producers (nested too): their copy dispatches
    are left out; a Gather of a strided slice is copied. A part that would end mid-granule (300 bytes)
    and every part after it (now off alignment) are copied; a placed part that another node also reads is read
    in place. Validation layers (the fixture) would report a misaligned descriptor."""
    from inferd.frontend import import_model
    from inferd.vulkan import arena
    from inferd.vulkan.model import VulkanModel
    model = _in_place_model()
    g = import_model(model)
    names = {n.outputs[0]: n.name for n in g.nodes}
    with VulkanModel(g, device) as m:
        copies = _copies(m._b)
        for _ in range(2):  # twice: the second run must not read the first one's leftovers as its answer
            x = RNG.standard_normal((1, 32, 5, 5)).astype(F32)
            ref = _ort(model, {"x": x})
            out = m.run({"x": x})
            for k, r in zip(("y", "z", "u", "v"), ref):
                assert _rel(out[k], r) <= 1e-5, k
        placed = m.load_stats["dispatches"]
    assert names["s0"] not in copies and names["cat1"] not in copies and names["q"] not in copies
    assert copies.get(names["cat2"]) == 2  # m (300 bytes) and d (after m: off alignment)
    assert copies.get(names["r"]) == 1  # a strided slice: no placement, a copy
    monkeypatch.setattr(arena, "SLICE_OPS", ())  # every part its own buffer: every copy recorded
    with VulkanModel(g, device) as m:
        assert _copies(m._b) == {names["s0"]: 2, names["cat1"]: 2, names["cat2"]: 3, names["q"]: 1, names["r"]: 1}
        assert m.load_stats["dispatches"] == placed + 6
        x = RNG.standard_normal((1, 32, 5, 5)).astype(F32)
        assert _rel(m.run({"x": x})["y"], _ort(model, {"x": x})[0]) <= 1e-5


def test_the_profile_prices_a_layer_whose_copies_are_all_in_place_at_nothing(device: Any) -> None:
    """The cold planner reads the profile: a Concat, Split or one-index Gather that records no dispatch costs no
    execution and no pipeline; one that still copies keeps its price: measured (the strided Gather, whose index
    is a weight) or, a single candidate without weights (cat2), the planner's estimate."""
    from inferd.frontend import import_model
    from inferd.planner.cost import DeviceRates
    from inferd.vulkan.cold import VulkanColdBackend
    g = import_model(_in_place_model())
    names = {n.outputs[0]: n.name for n in g.nodes}
    b = VulkanColdBackend(g, device=device)
    try:
        times = b.profile(b.candidates(), DeviceRates()).times
    finally:
        b.close()
    for t, k in (("s0", "vk_split"), ("cat1", "vk_concat"), ("q", "vk_gather")):
        for phase in ("exec", "exec_first", "pipeline_empty", "pipeline_filled"):
            assert times[(names[t], k, phase)] == 0.0, (t, phase)
    assert times[(names["r"], "vk_gather", "exec")] > 0.0  # copied: measured as it runs
    assert (names["cat2"], "vk_concat", "exec") not in times  # one candidate, no weights: not profiled, priced


def test_polled_fence_wait_sees_a_signal_and_falls_back_to_the_blocking_wait(device: Any, monkeypatch) -> None:
    """``wait_fence_polled``: a fence already signalled, or signalled by a submit while the poll asks, answers True
    without the blocking wait; one that stays unsignalled past the poll goes to ``wait_fence``, whose timeout
    reports a hung queue as before."""
    import vulkan as vk

    import inferd.vulkan.device as vd
    from inferd.errors import DeviceTimeoutError
    from inferd.vulkan import raw

    d = device.device
    signalled = vk.vkCreateFence(d, vk.VkFenceCreateInfo(flags=vk.VK_FENCE_CREATE_SIGNALED_BIT), None)
    unsignalled = vk.vkCreateFence(d, vk.VkFenceCreateInfo(), None)
    pool = vk.vkCreateCommandPool(d, vk.VkCommandPoolCreateInfo(queueFamilyIndex=device.queue_family), None)
    try:
        assert device.wait_fence_polled(signalled, 0.01) is True
        cb = raw.allocate_command_buffer(d, pool)
        raw.end_command_buffer(cb)
        device.reset_fence(signalled)
        device.submit_buffers([cb], signalled)
        assert device.wait_fence_polled(signalled, 5.0) is True  # an empty submission: done well within the poll
        monkeypatch.setattr(vd, "fence_timeout_s", 0.05)
        with pytest.raises(DeviceTimeoutError):
            device.wait_fence_polled(unsignalled, 0.001)
        with pytest.raises(DeviceTimeoutError):
            device.wait_fence_polled(unsignalled, 0.0)  # no poll: the blocking wait at once
    finally:
        vk.vkDestroyCommandPool(d, pool, None)
        vk.vkDestroyFence(d, signalled, None)
        vk.vkDestroyFence(d, unsignalled, None)
