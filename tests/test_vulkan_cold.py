"""Cold loads on a Vulkan device follow their plan and answer like onnxruntime (max |vk - ort| / max |ort|
<= 1e-3, as in test_vulkan_zoo.py), first (cold) run and warm runs, whatever the plan: every layer read
raw and transformed at load (from the ONNX file), every layer read transformed (from a compiled
package), one loader thread, many, no pipelining; a warm switch to other kernels; a package made for
another device is rebuilt; the staging path; a layer that fails half way; the profile; pipelines
requested by several threads at once. Validation layers on, and no validation error."""
from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import inferd
import inferd.vulkan
from inferd.package import compile_model, read_plan, write_plan
from inferd.planner.plan import PlanOptions
from inferd.vulkan.slabs import MIN_SLAB
from vkutil import validated_shared_device
from zoo_fixture import check_against_reference, zoo_reference

pytestmark = [pytest.mark.vulkan,
              pytest.mark.skipif(not inferd.vulkan.available(), reason="no Vulkan device")]

TOL = 1e-3
SMALL = ["squeezenet1_1", "mobilenetv2"]


@pytest.fixture(scope="module", autouse=True)
def device(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The process's shared device (what ``inferd.load`` uses), with validation and this module's own caches."""
    yield from validated_shared_device(tmp_path_factory.mktemp("vkcold"))


def ref(name: str) -> tuple[Path, dict[str, np.ndarray], list[np.ndarray], list[str]]:
    """(model path, feeds, onnxruntime's outputs, output names)."""
    return zoo_reference(name)


def check(model: inferd.Model, name: str, what: str) -> None:
    check_against_reference(model, name, what, TOL)


def only_the_plans_kernels(model: inferd.Model) -> None:
    """A model that follows a stored plan offers each layer only the plan's kernels (its cold one first, then
    its warm one): the backend did not ask every other kernel whether it applies."""
    from inferd.vulkan.cold import PLACEHOLDERS

    planned = {lp.name: [k for k in (lp.kernel, lp.warm_kernel) if k] for lp in model.plan.layers}
    seen = 0
    for layer, kernels, default in model._exec.candidates():
        if default.name in PLACEHOLDERS:
            continue
        assert [k.name for k in kernels] == planned[layer.name], layer.name
        assert default.name == planned[layer.name][0]
        seen += 1
    assert seen


def ran_the_plan(model: inferd.Model) -> None:
    """The backend runs each layer with the kernel the plan names (folded nodes run nothing); a layer with
    a warm kernel may already have been switched to it (the warm switch runs in the background)."""
    assert model.plan is not None
    got = model.kernels
    assert set(got) == {lp.name for lp in model.plan.layers if lp.kernel != "fold"}
    for lp in model.plan.layers:
        if lp.kernel != "fold":
            assert got[lp.name] in (lp.kernel, lp.warm_kernel or lp.kernel), (lp.name, got[lp.name], lp)


def cold_then_warm(model: inferd.Model, name: str, what: str) -> None:
    check(model, name, what + ", first (cold) run")
    assert model.cold_stats["tasks"] == len(model.plan.layers)
    ran_the_plan(model)
    assert model.wait_warm(120)
    assert "warm_switch_error" not in model.cold_stats
    check(model, name, what + ", warm run")
    check(model, name, what + ", second warm run")


def weighted(model: inferd.Model) -> list[Any]:
    """Plan entries of the layers that read weights."""
    return [lp for lp in model.plan.layers if lp.source != "none"]


@pytest.mark.parametrize("name", SMALL)
def test_cold_from_onnx_every_layer_read_raw_and_transformed_at_load(name: str) -> None:
    with inferd.load(ref(name)[0], device="vulkan") as model:
        assert model.device == "vulkan" and model.plan.backend == "vulkan"
        assert weighted(model) and all(lp.source == "raw" for lp in weighted(model))
        cold_then_warm(model, name, "ONNX")


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Per small model, a package whose plan reads every layer's transformed weights (no profile: fast)."""
    root = tmp_path_factory.mktemp("vkpkg")
    opt = PlanOptions(force_source="transformed")
    return {n: compile_model(ref(n)[0], root / n, device="vulkan", options=opt, profile=False) for n in SMALL}


@pytest.mark.parametrize("name", SMALL)
def test_cold_from_a_package_every_layer_read_transformed(name: str, packages: dict[str, Path]) -> None:
    opt = PlanOptions(force_source="transformed")
    with inferd.load(packages[name], device="vulkan", cold=opt) as model:
        assert weighted(model) and all(lp.source == "transformed" for lp in weighted(model))
        only_the_plans_kernels(model)
        cold_then_warm(model, name, "package, transformed weights")


ODD: dict[str, tuple[dict[str, Any], int | None]] = {
    "one loader": ({}, 1),
    "many loaders": ({}, 4),
    "no pipelining": ({"pipeline": False}, None),
    "raw reads, no stealing": ({"force_source": "raw", "steal": False}, 2),
}


@pytest.mark.parametrize("variant", sorted(ODD))
def test_odd_plans(variant: str, packages: dict[str, Path]) -> None:
    name = "squeezenet1_1"
    opts, loaders = ODD[variant]
    opt = PlanOptions(**{"force_source": "transformed", **opts})
    with inferd.load(packages[name], device="vulkan", cold=opt, loaders=loaders) as model:
        assert model.plan.options == opt
        if loaders is not None:
            assert model.plan.loaders == loaders
        cold_then_warm(model, name, variant)


def _rewrite_plan(pkg: Path, **changes: object) -> None:
    d = read_plan(pkg / "plan.bin")
    d.update(changes)
    write_plan(pkg / "plan.bin", d)


def test_warm_switch_moves_to_the_warm_kernels_and_keeps_the_answers(packages: dict[str, Path], tmp_path: Path) -> None:
    """Every conv runs its first run on the register-blocked implicit GEMM, read raw, then switches back."""
    name = "squeezenet1_1"
    pkg = tmp_path / "pkg"
    shutil.copytree(packages[name], pkg)
    d = read_plan(pkg / "plan.bin")
    rows = d["plan"]["layers"]
    switched = 0
    for r in rows:  # [index, name, op, kernel, source, loader, order, warm_kernel, ...]
        if r[2] == "Conv" and r[3] != "vk_gemm_reg":
            r[7], r[3], r[4] = r[3], "vk_gemm_reg", "raw"
            switched += 1
    assert switched
    _rewrite_plan(pkg, plan=d["plan"])
    with inferd.load(pkg, device="vulkan", cold=PlanOptions(force_source="transformed")) as model:
        assert [lp.kernel for lp in model.plan.layers] == [r[3] for r in rows]  # the stored plan, not a new one
        only_the_plans_kernels(model)
        check(model, name, "first run on the cold kernels")
        ran_the_plan(model)
        assert model.wait_warm(120)
        assert model.cold_stats["warm_switch_layers"] == switched
        assert "warm_switch_error" not in model.cold_stats
        warm = {lp.name: lp.warm_kernel or lp.kernel for lp in model.plan.layers if lp.kernel != "fold"}
        assert model.kernels == warm
        check(model, name, "after the warm switch")
        check(model, name, "after the warm switch, again")
        # the switched layers' weights were placed again into the ranges the cold kernels gave back
        # (compact_weights): what the allocations hold beyond the weights placed is less than one layer's weights
        # (without it, 3.7 MB beyond 4.9 MB: each warm kernel's weights were placed before its cold kernel's went)
        b = model._exec
        placed = [p.wsize for p in b._prepared if p is not None and p.origin is None and p.weights is not None]
        held = sum(r.size for r in b.weight_regions)
        assert sum(placed) <= held <= sum(placed) + max(max(placed), MIN_SLAB)


@pytest.mark.parametrize("limit", [0, 1 << 40])
def test_a_large_warm_kernels_weights_are_not_stored_twice(limit: int, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A layer whose cold run reads one kernel's transformed weights and whose warm kernel is another: the warm
    kernel's weights are stored too only up to ``WARM_COPY_MAX_BYTES`` (vgg16 fp16 stored its classifier three
    times); without them the warm switch transforms from raw, to the same answers."""
    import dataclasses

    import inferd.package as pk
    from inferd.store import WeightsStore

    real = pk.plan_cold

    def cold_on_gemm_reg(*a: Any, **k: Any) -> Any:  # every conv's cold run on vk_gemm_reg, read transformed
        plan = real(*a, **k)
        layers = [dataclasses.replace(lp, kernel="vk_gemm_reg", source="transformed",
                                      warm_kernel=lp.warm_kernel or lp.kernel)
                  if lp.op == "Conv" and (lp.warm_kernel or lp.kernel) != "vk_gemm_reg" else lp for lp in plan.layers]
        return dataclasses.replace(plan, layers=tuple(layers))

    monkeypatch.setattr(pk, "plan_cold", cold_on_gemm_reg)
    monkeypatch.setattr(pk, "WARM_COPY_MAX_BYTES", limit)
    name = "squeezenet1_1"
    pkg = compile_model(ref(name)[0], tmp_path / "pkg", device="vulkan", profile=False)
    monkeypatch.undo()
    d = read_plan(pkg / "plan.bin")
    switched = [r for r in d["plan"]["layers"] if r[7] and r[7] != r[3]]
    assert switched
    with WeightsStore(pkg / "weights.store") as st:
        for r in switched:
            assert any(True for _ in st.find(r[1], kernel=f"vulkan/{r[3]}", variant="transformed"))
            warm_stored = any(True for _ in st.find(r[1], kernel=f"vulkan/{r[7]}", variant="transformed"))
            assert warm_stored == (limit > 0), (r[1], r[7])
    with inferd.load(pkg, device="vulkan") as model:
        check(model, name, "first run on the cold kernels")
        assert model.wait_warm(120)
        assert model.cold_stats["warm_switch_layers"] == len(switched)
        assert "warm_switch_error" not in model.cold_stats
        check(model, name, "after the warm switch")


def test_profiled_package_and_a_package_for_another_device(tmp_path: Path) -> None:
    """``compile`` profiles on this device (candidates, pipelines, GPU execution) and records its fingerprint; a
    package whose fingerprint is another device's is refused and rebuilt from its source, never used."""
    from inferd.errors import StalePackageError
    from inferd.package import fingerprint, open_package
    from inferd.planner.cost import PHASES

    name = "tiny"
    src = tmp_path / "m.onnx"
    shutil.copy(ref(name)[0], src)
    pkg = compile_model(src, tmp_path / "pkg", device="vulkan")
    d = read_plan(pkg / "plan.bin")
    fp = d["fingerprint"]
    assert fp == fingerprint("vulkan")
    assert {"backend", "engine", "vendor_id", "device_id", "driver_version", "device_name",
            "pipeline_cache_uuid"} <= set(fp) and fp["backend"] == "vulkan" and fp["engine"] == inferd.__version__
    times = {(r[0], r[1], r[2]): r[3] for r in d["profile"]["times"]}
    assert {p for _, _, p in times} <= set(PHASES)
    conv = next(r[0] for r in d["nodes"] if r[1] == "Conv")
    for phase in ("transform", "pipeline_empty", "pipeline_filled", "exec", "exec_first"):
        assert any(layer == conv and p == phase for layer, _, p in times), phase
    assert len({k for layer, k, p in times if layer == conv and p == "exec"}) > 1  # every candidate measured
    assert all(v >= 0 for v in times.values())

    other = dict(fp, driver_version="0", pipeline_cache_uuid="00" * 16)
    _rewrite_plan(pkg, fingerprint=other)
    with pytest.raises(StalePackageError, match="another device"):
        open_package(pkg, device="vulkan", current=fingerprint("vulkan"))
    with inferd.load(pkg, device="vulkan") as model:
        check(model, name, "after a device mismatch")
    assert read_plan(pkg / "plan.bin")["fingerprint"] == fingerprint("vulkan")


def test_staging_path_cold_load(tmp_path: Path) -> None:
    """Device memory the host cannot map: weights through staging, inputs and outputs through the IO region,
    in every segment of the first run as in the warm command buffer."""
    from inferd.backends.base import WeightSource
    from inferd.frontend import import_model
    from inferd.package import make_plan
    from inferd.runtime.cold import ColdLoad
    from inferd.vulkan.cold import VulkanColdBackend
    from inferd.vulkan.device import VulkanConfig, VulkanDevice
    from inferd.vulkan.testing import rel_err

    name = "squeezenet1_1"
    path, feeds, want, names = ref(name)
    dev = VulkanDevice(VulkanConfig(force_staging=True, debug=True, cache_dir=str(tmp_path / "cache")))
    try:
        graph = import_model(path)
        backend = VulkanColdBackend(graph, device=dev)
        plan = make_plan(backend, backend.candidates(), None, PlanOptions(cache=False), 2)
        cold = ColdLoad(backend, plan, WeightSource(graph.constants), name, backend.layers())
        first = cold.first_run(feeds)
        assert backend.act_region.mapped is None and backend.weight_regions
        assert all(r.mapped is None for r in backend.weight_regions)
        assert backend.io.region is not backend.act_region
        for out in (first, backend.run(feeds)):
            for n, r in zip(names, want):
                assert rel_err(out[n], r) <= TOL
        backend.close()
        assert not dev.validation_errors, dev.validation_errors[:3]
    finally:
        dev.close()


def test_a_layer_that_fails_fails_the_first_run_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Layers before it may already run on the device when it fails: closing waits for them."""
    from inferd.vulkan.cold import VulkanColdBackend

    name = "squeezenet1_1"
    real = VulkanColdBackend.prepare

    def broken(self: VulkanColdBackend, pos: int, lp: Any, arrays: dict[str, np.ndarray]) -> dict[str, float]:
        if pos == len(self.layers()) // 2:
            raise ValueError("injected prepare failure")
        return real(self, pos, lp, arrays)

    monkeypatch.setattr(VulkanColdBackend, "prepare", broken)
    model = inferd.load(ref(name)[0], device="vulkan")
    with pytest.raises(Exception, match="injected prepare failure"):
        model.run(ref(name)[1])
    model.close()
    monkeypatch.setattr(VulkanColdBackend, "prepare", real)
    with inferd.load(ref(name)[0], device="vulkan") as ok:
        check(ok, name, "after a failed load")


def test_pipelines_requested_by_several_threads_are_created_once(device: Any) -> None:
    reqs: list[tuple[Any, dict[str, Any]]] = [(device.shader_cache.get("unary", {"UOP": u, "ACT": 0}), {})
                                              for u in (1, 2, 3)]
    before = device.stats["pipelines_created"]
    got: list[list[Any]] = []
    go = threading.Barrier(4)

    def work() -> None:
        go.wait()
        got.append(device.pipelines(list(reqs)))

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(got) == 4 and all([p.handle for p in g] == [p.handle for p in got[0]] for g in got)
    assert device.stats["pipelines_created"] - before <= len(reqs)
    assert device.time_pipelines(reqs, empty=True) > 0 and device.time_pipelines(reqs, empty=False) > 0


@pytest.mark.parametrize("op", ["Relu", "Conv"])
def test_grids_larger_than_one_row_of_workgroups(op: str) -> None:
    """A dispatch of more than maxComputeWorkGroupCount[0] groups (65,535 on lavapipe): split into 1-D
    dispatches, since lavapipe ran workgroup rows y >= 1 only in part (wrong answers, not an error)."""
    from onnx import TensorProto, helper, numpy_helper

    from inferd.vulkan.device import get_device

    maxx = get_device().caps.max_workgroup_count[0]
    if maxx * 256 > 64 << 20:  # NVIDIA: 2**31 - 1 groups; no test-sized tensor needs two rows there
        pytest.skip(f"the device's grid holds {maxx} groups in a row")
    rng = np.random.default_rng(0)
    if op == "Relu":
        h = -(-maxx * 256 // (64 * 256)) + 8  # past maxx groups of 256 invocations
        x = rng.standard_normal((1, 64, h, 256)).astype(np.float32)
        node, inits, out = helper.make_node("Relu", ["x"], ["y"], name="n"), [], x.shape
        kernels = None
    else:
        x = rng.standard_normal((1, 64, 200, 200)).astype(np.float32)  # im2col: 576 x 10,000 columns / 64
        w = (rng.standard_normal((64, 64, 3, 3)) * 0.1).astype(np.float32)
        node, inits, out = (helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name="n"),
                            [numpy_helper.from_array(w, "w")], x.shape)
        kernels = {"n": "vk_gemm_tex"} if maxx < 2**20 else None
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out))], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    want = inferd.load(m, device="cpu").run({"x": x})["y"]
    with inferd.load(m, device="vulkan", kernels=kernels) as vm:
        for run in ("cold", "warm"):
            got = vm.run({"x": x})["y"]
            err = float(np.abs(got - want).max() / np.abs(want).max())
            assert err <= TOL, (op, run, err)


def test_device_close_lets_a_models_background_work_finish(tmp_path: Any) -> None:
    """A model's background work holds the model's lock and takes the device's (the warm switch swaps kernels
    in under the model's lock and creates their pipelines); a model's close waits for the model's lock. So the
    device closes its models without holding its own lock: a process that exited during a warm switch hung in
    atexit (``_close_all``), the model's close and the warm switch each waiting for the other's lock."""
    from inferd.vulkan.device import VulkanConfig, VulkanDevice

    dev = VulkanDevice(VulkanConfig(cache_dir=str(tmp_path / "cache")))
    model_lock = threading.Lock()
    holding, closing = threading.Event(), threading.Event()
    took: list[bool] = []

    def warm_switch() -> None:
        with model_lock:
            holding.set()
            closing.wait(10)
            got = dev._lock.acquire(timeout=5)  # creating the warm kernels' pipelines
            took.append(got)
            if got:
                dev._lock.release()

    class Model:
        def close(self) -> None:
            closing.set()
            with model_lock:
                pass

    model = Model()
    dev.register_model(model)
    t = threading.Thread(target=warm_switch)
    t.start()
    assert holding.wait(10)
    try:
        dev.close()
    finally:
        t.join(20)
    assert took == [True], "the background work could not take the device lock while the device closed its models"
    assert dev.closed


def test_a_refined_plans_cold_kernels_get_their_pipelines_listed(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A refinement that moves a layer to another cold kernel lists that kernel's pipelines (the next load of the
    package runs it, in a daemon whose start made resident what the list holds); layers it leaves alone list
    nothing more. Before, a restarted daemon's cold load created the pipelines of such layers itself."""
    import dataclasses

    from inferd.ops.base import applicable_kernels
    from inferd.package import list_plan_pipelines

    name = "squeezenet1_1"
    src, feeds, _, _ = zoo_reference(name)
    pkg = compile_model(src, tmp_path / "pkg", device="vulkan", profile=False)
    with inferd.load(pkg, device="vulkan") as model:
        model.run(feeds)
        assert model.wait_warm(60)
        cold, backend = model._cold, model._exec
        pick = None
        for lp in cold.plan.layers:
            slot = backend._slots[lp.index]
            if slot.kind == "kernel":
                others = [k for k in applicable_kernels(slot.layer, "vulkan")
                          if k.name not in (lp.kernel, lp.warm_kernel)]
                if others:
                    pick = (lp, slot, others[0])
                    break
        assert pick is not None
        lp, slot, other = pick
        recorded: list[Any] = []
        monkeypatch.setattr(backend.device.pipeline_list, "record", lambda reqs, now=None: recorded.extend(reqs))
        assert list_plan_pipelines(backend, cold.plan, cold.plan) == 0 and recorded == []  # the plan it ran
        moved = dataclasses.replace(cold.plan, layers=tuple(
            dataclasses.replace(x, kernel=other.name) if x is lp else x for x in cold.plan.layers))
        assert list_plan_pipelines(backend, cold.plan, moved) == 1
        params = other.transform(slot.layer, backend._raw(slot, {}))
        want = {d.shader for d in backend._dispatches(slot, other, params)[0]}
        assert want and {r[0] for r in recorded} == want


def test_a_models_fence_is_kept_for_the_next_load(packages: dict[str, Path]) -> None:
    """The device keeps signalled fences for its models' loads (NVIDIA's vkCreateFence took 0.3-0.4 ms of each cold
    load's set-up): a closed model's fence serves the next load, which answers right with it."""
    from inferd.vulkan.device import SPARE_FENCES, get_device

    dev = get_device()
    with inferd.load(packages["squeezenet1_1"], device="vulkan") as first:
        check(first, "squeezenet1_1", "first")
        fence = first._cold.backend._fence
        assert fence is not None and fence not in dev._spare_fences
    assert fence in dev._spare_fences and len(dev._spare_fences) <= SPARE_FENCES
    with inferd.load(packages["squeezenet1_1"], device="vulkan") as second:
        assert second._cold.backend._fence == fence
        check(second, "squeezenet1_1", "second, on the first one's fence")
        check(second, "squeezenet1_1", "second, warm")
