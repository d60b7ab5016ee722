"""The streaming runtime on a Vulkan device (vulkan/stream.py, on the engine of runtime/stream.py): every zoo model
inside a memory budget gives onnxruntime's outputs at the smallest feasible budget, a middle one and unconstrained,
preloading and on demand, through the page cache and bypassing it; the instrumented allocator proves no box is
overwritten while live and the arena stays inside the budget; the validation layers report nothing."""
from __future__ import annotations

import numpy as np
import pytest

import inferd
import inferd.vulkan
from inferd.errors import WeightsStoreError
from inferd.planner.flex import BudgetTooSmall
from inferd.runtime.stream import StreamError, prepare_stream_store, strip_constants
from inferd.zoo import ZOO
from ortutil import run_ort_file as _ort
from streamutil import serve_while_budgets_change
from vkutil import validated_device
from zoo_fixture import zoo_dir

pytestmark = [pytest.mark.vulkan, pytest.mark.skipif(not inferd.vulkan.available(), reason="no Vulkan device")]

TOL = 1e-4
MODELS = [pytest.param(m, marks=pytest.mark.slow) if m in ("vgg16", "resnet50", "vit_tiny") else m for m in ZOO]


@pytest.fixture(scope="module")
def device(tmp_path_factory):
    yield from validated_device(tmp_path_factory.mktemp("vkstream"))


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("vkstore")


def _prepared(device, work, name: str, seed: int = 123):
    from inferd.vulkan.stream import prepare_vulkan_stream_store

    path = zoo_dir([name]) / f"{name}.onnx"
    graph = inferd.frontend.import_model(str(path))
    rng = np.random.default_rng(seed)
    feeds = {t.name: rng.standard_normal(t.shape).astype(t.dtype) for t in graph.inputs}
    store, folded = prepare_vulkan_stream_store(graph, work / f"{name}.vkstore", device)
    return graph, strip_constants(folded), store, feeds, _ort(path, feeds)


def _check(got, ref, graph, what):
    for t, r in zip(graph.outputs, ref):
        g = got[t.name]
        assert g.shape == r.shape, f"{what}: output {t.name} shape {g.shape} vs onnxruntime {r.shape}"
        err = float(np.abs(g - r).max() / max(np.abs(r).max(), 1e-30))
        assert err <= TOL, f"{what}: output {t.name} relative error {err:.3g} > {TOL}"


def _bounds(device, skel, store):
    from inferd.vulkan.stream import VulkanStreamingExecutor

    probe = VulkanStreamingExecutor(skel, store, 1 << 40, device=device)
    need, full = probe.min_budget(), probe.small_bytes + probe.plan.peak + (1 << 16)
    probe.close()
    return need, full


@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_inside_budgets_matches_onnxruntime(device, work, name):
    from inferd.vulkan.stream import VulkanStreamingExecutor

    graph, skel, store, feeds, ref = _prepared(device, work, name)
    need, full = _bounds(device, skel, store)
    mid = (need + full) // 2
    for budget, mode, read, runs in [(need, "preload", "cache", 2), (need, "ondemand", "bypass", 1),
                                     (mid, "preload", "bypass", 2), (full, "preload", "cache", 1)]:
        what = f"{name} {mode}/{read} at {budget} bytes"
        ex = VulkanStreamingExecutor(skel, store, budget, mode=mode, read=read, track=True, device=device)
        try:
            assert ex.memory_bytes <= budget, f"{what}: {ex.memory_bytes} bytes held"
            for _ in range(runs):  # a second run reuses resident weights and overwrites the first's data
                _check(ex.run(feeds), ref, graph, what)
                tr = ex.tracker
                assert tr is not None and tr.claims > 0
                assert not tr.violations, f"{what}: {tr.violations[:3]}"
                assert tr.high_water <= ex.arena.nbytes <= budget
            if budget == full:  # unconstrained: nothing read, one submission (a host step may add one each)
                assert ex.streamed_bytes == 0 and 1 <= ex.segments <= 1 + len(ex._hosts)
            if budget == need and mode == "preload" and ex.plan.streamed_bytes:
                assert ex.stats["read_s"] > 0 and ex.segments > 1
        finally:
            ex.close()
    with pytest.raises(BudgetTooSmall) as ei:
        VulkanStreamingExecutor(skel, store, need - need // 4, device=device)
    assert ei.value.need >= need * 0.99 and str(ei.value.need) in str(ei.value)


@pytest.mark.parametrize("name", ["squeezenet1_1", "vad_lstm", "crnn_lstm"])
def test_device_local_mirror_matches_onnxruntime(device, work, name):
    """The discrete GPU's arrangement (``mirror``: shaders in a device-local copy of the arena, weights, inputs,
    outputs and host steps' tensors copied across), forced on whatever device runs the tests: onnxruntime's outputs
    at the smallest budget and unconstrained, the resident weights copied once, the streamed ones every run."""
    from inferd.vulkan.stream import VulkanStreamingExecutor

    graph, skel, store, feeds, ref = _prepared(device, work, name)
    need, full = _bounds(device, skel, store)
    for budget, mode, read in [(need, "preload", "cache"), (need, "ondemand", "bypass"), (full, "preload", "cache")]:
        what = f"{name} mirrored, {mode}/{read} at {budget} bytes"
        ex = VulkanStreamingExecutor(skel, store, budget, mode=mode, read=read, track=True, device=device,
                                     mirror=True)
        try:
            assert ex.memory_breakdown["device_bytes"] >= ex.arena.nbytes
            copies = []
            for _ in range(2):
                _check(ex.run(feeds), ref, graph, what)
                assert not ex.tracker.violations, f"{what}: {ex.tracker.violations[:3]}"
                copies.append(ex.copies)
            assert copies[0] >= copies[1] > 0  # inputs and outputs every run; resident weights the first only
            if ex.streamed_bytes == 0 and ex.plan.resident_bytes:
                assert copies[0] > copies[1]
        finally:
            ex.close()


@pytest.mark.parametrize("mirror", [False, True])
def test_a_host_step_reads_what_the_gpu_wrote_and_the_gpu_what_it_wrote(device, tmp_path, mirror):
    """MatMul (GPU) -> Cast to int64 and back (the host: integer plumbing) -> Add, MatMul (GPU): the host steps run
    between two submissions on what the GPU computed, and the GPU reads what they wrote (with ``mirror``, both
    copied across)."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    from inferd.vulkan.cold import HOST
    from inferd.vulkan.stream import VulkanStreamingExecutor, prepare_vulkan_stream_store

    rng = np.random.default_rng(0)
    w1 = nh.from_array(rng.standard_normal((64, 256)).astype(np.float32), "W1")
    w2 = nh.from_array(rng.standard_normal((256, 64)).astype(np.float32), "W2")
    # at the smallest budget W2 is read where W1 was, once the first MatMul has run: that step ends a submission,
    # and the host step right after it must have its own (its input copied back) submitted before it reads
    nodes = [h.make_node("MatMul", ["x", "W1"], ["a"]), h.make_node("Cast", ["a"], ["ai"], to=T.INT64),
             h.make_node("Cast", ["ai"], ["af"], to=T.FLOAT), h.make_node("Add", ["a", "af"], ["b"]),
             h.make_node("MatMul", ["b", "W2"], ["y"])]
    g = h.make_graph(nodes, "hostmix", [h.make_tensor_value_info("x", T.FLOAT, [2, 64])],
                     [h.make_tensor_value_info("y", T.FLOAT, [2, 64])], [w1, w2])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "hostmix.onnx")
    graph = inferd.frontend.import_model(str(tmp_path / "hostmix.onnx"))
    store, folded = prepare_vulkan_stream_store(graph, tmp_path / "hostmix.vkstore", device)
    skel = strip_constants(folded)
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).standard_normal((2, 64)).astype(np.float32)}
        ref = _ort(tmp_path / "hostmix.onnx", feeds)
        for budget in (1 << 30, _bounds(device, skel, store)[0]):
            ex = VulkanStreamingExecutor(skel, store, budget, device=device, mirror=mirror, track=True)
            try:
                assert any(k is HOST for _l, k in ex.choice)
                _check(ex.run(feeds), ref, graph, f"seed {seed}, budget {budget}, mirror {mirror}")
            finally:
                ex.close()


def test_budget_changes_while_threads_send(device, work):
    """Re-planning under load on the GPU: every request answered with the same outputs, no box overwritten while
    live, the arena inside each budget; a budget below the minimum is refused and leaves the executor serving."""
    from inferd.vulkan.stream import VulkanStreamingExecutor

    graph, skel, store, feeds0, ref0 = _prepared(device, work, "squeezenet1_1")
    need, full = _bounds(device, skel, store)
    ex = VulkanStreamingExecutor(skel, store, need, track=True, device=device)
    feeds = [feeds0] + [{t.name: np.random.default_rng(i).standard_normal(t.shape).astype(t.dtype)
                         for t in graph.inputs} for i in range(1, 3)]
    ref = [ex.run(f) for f in feeds]
    _check(ref[0], ref0, graph, "first run")
    budgets = [full, (need + full) // 2, need + (need >> 3), need]
    serve_while_budgets_change(ex, feeds, ref, budgets, need // 2)
    assert len(ex.adapt_s) == len(budgets)
    ex.close()


def test_damaged_weights_fail_the_request_and_the_next_one_is_right(device, work, tmp_path):
    """A checksum failure mid-run (the GPU has work in flight) is a clear error; the executor is intact: once
    the store is right again, so are the outputs."""
    import shutil

    from inferd.vulkan.stream import VulkanStreamingExecutor

    graph, skel, store, feeds, ref = _prepared(device, work, "mobilenetv2")
    mine = shutil.copy(store, tmp_path / "m.vkstore")
    need, _full = _bounds(device, skel, mine)
    for read in ("cache", "bypass"):
        ex = VulkanStreamingExecutor(skel, mine, need, read=read, device=device)
        try:
            _check(ex.run(feeds), ref, graph, f"before the damage ({read})")
            e = max((e for s in ex.steps if not ex.plan.resident[s.pos] for e, _ in s.blobs), key=lambda e: e.size)
            with open(mine, "r+b") as fh:
                fh.seek(e.offset + e.size // 2)
                b = fh.read(1)
                fh.seek(e.offset + e.size // 2)
                fh.write(bytes([b[0] ^ 0xFF]))
                fh.flush()
                with pytest.raises(WeightsStoreError, match="checksum"):
                    ex.run(feeds)
                fh.seek(e.offset + e.size // 2)
                fh.write(b)
            _check(ex.run(feeds), ref, graph, f"after the repair ({read})")
        finally:
            ex.close()


def test_stores_of_another_backend_or_device_are_refused(device, work, monkeypatch):
    from inferd.vulkan.stream import VulkanStreamingExecutor

    graph, skel, store, feeds, ref = _prepared(device, work, "squeezenet1_1")
    cpu_store = prepare_stream_store(graph, work / "squeezenet1_1.cpu.store")
    with pytest.raises(StreamError, match="cpu backend"):
        VulkanStreamingExecutor(skel, cpu_store, 1 << 30, device=device)
    fp = dict(device.fingerprint())
    monkeypatch.setattr(device, "fingerprint", lambda: {**fp, "driver_version": "0"})
    with pytest.raises(StreamError, match="another device"):
        VulkanStreamingExecutor(skel, store, 1 << 30, device=device)


@pytest.mark.parametrize("name", ["resnet18", "shufflenetv2_x1_0"])
def test_kernel_fallback_and_slicing_for_budgets_below_the_default_minimum(device, work, name):
    """Between the smallest budget the Vulkan kernels' fallback and slicing reach and the default kernels' minimum,
    ``vulkan_stream_for_budget`` falls layers back to Vulkan kernels that need less memory (on lavapipe resnet18's
    Winograd convs, 4x weights, to a GEMM's 1x) or slices them (shufflenetv2's classifier, by output channel: the
    backend-independent slicing); the model on the GPU gives onnxruntime's outputs."""
    from inferd.fileio import BLOCK
    from inferd.planner.slicing import MemConfig, min_fit_budget
    from inferd.runtime.stream import WALIGN, small_bytes
    from inferd.vulkan.executor import kernel_caps
    from inferd.vulkan.stream import VulkanStreamingExecutor, vulkan_kernel_memory, vulkan_stream_for_budget

    graph, skel, store, feeds, ref = _prepared(device, work, name)
    ex0 = VulkanStreamingExecutor(skel, store, 1 << 40, device=device)
    need, default = ex0.min_budget(), ex0.kernel_names
    ex0.close()
    lo, _cfg = min_fit_budget(graph, km=vulkan_kernel_memory(kernel_caps(device)), alignment=ex0.align)
    budget = (lo + small_bytes(graph) + WALIGN + BLOCK + need) // 2
    if budget >= need:
        pytest.skip(f"{name}: on this device the default kernels' minimum is already the smallest")
    with pytest.raises(BudgetTooSmall):
        VulkanStreamingExecutor(skel, store, budget, device=device)
    ex = vulkan_stream_for_budget(graph, budget, work, device=device, track=True)
    try:
        cfg = ex.config
        assert cfg != MemConfig(), cfg
        assert all(default[n] != k for n, k in cfg.kernels.items())  # a fallback is another kernel
        assert ex.memory_bytes <= budget
        _check(ex.run(feeds), ref, graph, f"{name} for {budget} bytes ({cfg.key()})")
        assert not ex.tracker.violations and ex.tracker.high_water <= ex.arena.nbytes
    finally:
        ex.close()
    if device.device_type == "cpu":  # lavapipe's defaults: what each model's cut is there
        assert cfg.kernels if name == "resnet18" else cfg.slices, cfg


def test_daemon_serves_a_model_streamed_on_the_gpu_inside_its_budget(tmp_path):
    """``memory = "stream"`` with ``device = "vulkan"``: compiled in a child process for the daemon's device (the
    child opens none), served on the GPU inside its share of the host budget (its arena is host memory), and
    re-planned when the budget changes; every answer is onnxruntime's."""
    import shutil

    from inferd.server.testing import DaemonProcess
    from inferd_client import Client

    mb = 1 << 20
    name = "squeezenet1_1"
    (tmp_path / "m" / "sq").mkdir(parents=True)
    src = zoo_dir([name]) / f"{name}.onnx"
    shutil.copy(src, tmp_path / "m" / "sq" / "model.onnx")
    (tmp_path / "m" / "sq" / "config.toml").write_text('memory = "stream"\ndevice = "vulkan"\n')
    x = np.random.default_rng(5).standard_normal((1, 3, 224, 224)).astype(np.float32)
    y = _ort(src, {"input": x})[0]
    with DaemonProcess(f"ipc://{tmp_path}/s.sock", tmp_path / "m", "--cache-dir", str(tmp_path / "c"),
                       "--memory-budget", str(24 * mb), log_path=tmp_path / "d.log") as dp, \
            Client(dp.endpoint, timeout=120) as c:
        def check(what: str) -> None:
            got = c.infer("sq", {"input": x})["output"]
            err = float(np.abs(got - y).max() / np.abs(y).max())
            assert err <= TOL, f"{what}: relative error {err}"

        check("first request")
        st = c.status()["models"]["sq"]
        assert st["device"] == "vulkan-stream", st
        assert st["memory_bytes"] <= 24 * mb and st["budget_bytes"] <= 24 * mb
        for b in (8 * mb, 6 * mb, 16 * mb):
            c.set_budget(b)
            check(f"after the budget became {b}")
            st = c.status()["models"]["sq"]
            assert st["state"] == "READY" and st["memory_bytes"] <= b, st
        log = dp.log_text()
        assert "for streaming on the GPU in a child process, outside the memory budget" in log
        assert "Traceback" not in log
