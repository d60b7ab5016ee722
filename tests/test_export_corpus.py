"""Real architectures as their users export them (issue 18): torchvision and timm models with random weights,
exported by ``torch.onnx.export`` with the TorchScript exporter (``dynamo=False``) and the dynamo exporter,
Keras models through tf2onnx and paddle.vision models through paddle2onnx, run by inferd on the CPU and on Vulkan (lavapipe) and compared with onnxruntime on the CPU. The detectors
keep their post-processing (NonMaxSuppression, TopK, RoiAlign, ...) in the graph, with thresholds that let
random weights keep boxes: their outputs must not be empty.

torch, torchvision, timm and onnxscript are optional test dependencies (the ``corpus`` extra; README, Tests),
and so are TensorFlow/tf2onnx and paddlepaddle/paddle2onnx (``INFERD_TEST_EXPORTERS``): a model whose
exporter is not installed skips. Exports are cached (``tests/export_corpus.py``), so only the first run
pays for them.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import export_corpus as corpus
from export_corpus import CORPUS, Arch, exporters_of
from inferd.errors import BackendError
from ortutil import ort_session

#: (arch, exporter) pairs that cannot be exported, with the exporter's own limitation
NOT_EXPORTABLE: dict[tuple[str, str], str] = {
    (a.name, "dynamo"): ("torch.export cannot trace torchvision's detection post-processing: batched_nms branches on "
                         "the number of boxes left after score filtering (GuardOnDataDependentSymNode: 'Could not "
                         "guard on data-dependent expression ... > 4000'), before any ONNX is written")
    for a in CORPUS if a.detector
}


#: (arch, exporter) pairs inferd's Vulkan backend refuses today, with the limitation (strict xfail: a fix shows)
VULKAN_REFUSES: dict[tuple[str, str], str] = {
}


def _cases(vulkan: bool) -> list[Any]:
    out = []
    for a in CORPUS:
        for e in exporters_of(a):
            marks: list[Any] = []
            if (a.name, e) in NOT_EXPORTABLE:
                marks.append(pytest.mark.skip(reason=NOT_EXPORTABLE[(a.name, e)]))
            if vulkan and (a.name, e) in VULKAN_REFUSES:
                marks.append(pytest.mark.xfail(strict=True, raises=BackendError, reason=VULKAN_REFUSES[(a.name, e)]))
            out.append(pytest.param(a, e, id=f"{a.name}-{e}", marks=marks))
    return out


CASES = _cases(vulkan=False)

_ORT_CACHE: dict[tuple[str, str], tuple[str, dict[str, np.ndarray], list[str], list[np.ndarray]]] = {}


def _exported(arch: Arch, exporter: str) -> tuple[str, dict[str, np.ndarray], list[str], list[np.ndarray]]:
    """(model path, feeds, output names, onnxruntime's outputs), once per session."""

    why = corpus.missing(arch, exporter)
    if why:
        pytest.skip(why)
    key = (arch.name, exporter)
    if key not in _ORT_CACHE:
        path, x = corpus.export(arch, exporter)
        sess = ort_session(path)
        assert len(sess.get_inputs()) == 1, [i.name for i in sess.get_inputs()]
        names = [o.name for o in sess.get_outputs()]
        feeds = {sess.get_inputs()[0].name: x}
        _ORT_CACHE[key] = (str(path), feeds, names, sess.run(None, feeds))
    return _ORT_CACHE[key]


def _tie_orders(got: list[np.ndarray], want: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:
    """A detector's rows (boxes, scores, labels) in one order on both sides: sorted by score as both give them,
    and within a run of scores equal to float32 noise by label and box, so that two detections whose scores tie
    within a millionth may come in either order (the sums behind them differ in their last bits between any two
    engines). None where the outputs are not one detection per row with a 1-D float score."""
    n = want[0].shape[0] if want and want[0].ndim else -1
    scores = [i for i, w in enumerate(want) if w.ndim == 1 and w.dtype.kind == "f" and w.shape[0] == n]
    if n < 2 or len(scores) != 1 or any(w.shape[:1] != (n,) or g.shape != w.shape for g, w in zip(got, want)):
        return None
    ws = want[scores[0]].astype(np.float64)
    tie = np.abs(np.diff(ws)) <= 1e-5 * max(float(np.abs(ws).max()), 1e-30)
    group = np.concatenate([[0], np.cumsum(~tie)])  # rows of one run of tied scores share a group number

    def order(outs: list[np.ndarray]) -> np.ndarray:
        keys = [o.reshape(n, -1)[:, j] for o in reversed(outs) if o is not outs[scores[0]]
                for j in reversed(range(o.reshape(n, -1).shape[1]))]
        return np.lexsort([*keys, group])
    return order(got), order(want)


def _compare(arch: Arch, names: list[str], got: dict[str, np.ndarray], want: list[np.ndarray]) -> None:
    orders = _tie_orders([got[n] for n in names], want) if arch.detector else None
    for name, w in zip(names, want):
        g = got[name]
        if orders is not None:
            g, w = g[orders[0]], w[orders[1]]
        assert g.shape == w.shape and g.dtype == w.dtype, f"{name}: {g.dtype}{g.shape} vs onnxruntime {w.dtype}{w.shape}"
        if w.dtype.kind in "iub":
            np.testing.assert_array_equal(g, w, err_msg=name)
            continue
        scale = float(np.abs(w).max()) if w.size else 0.0
        # errors scale with the output's magnitude (a box in pixels, a logit of a few units); float32 sums in
        # another order through ResNet-50's 53 convolutions differ from onnxruntime's by up to 1.5e-4 of it
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=5e-4 * max(scale, 1e-30), err_msg=name)
    if arch.detector:
        # boxes, scores and labels: random weights with low thresholds must keep boxes
        assert all(w.shape[0] > 0 for w in want), f"{arch.name}: onnxruntime kept no boxes {[w.shape for w in want]}"
    else:
        assert max(float(np.abs(w).max()) for w in want) > 1e-3, "outputs too small to compare meaningfully"


@pytest.mark.parametrize("arch,exporter", CASES)
def test_cpu_matches_onnxruntime(arch: Arch, exporter: str) -> None:
    import inferd

    path, feeds, names, want = _exported(arch, exporter)
    _compare(arch, names, inferd.load(path, device="cpu").run(feeds), want)


@pytest.mark.vulkan
@pytest.mark.parametrize("arch,exporter", _cases(vulkan=True))
def test_vulkan_matches_onnxruntime(arch: Arch, exporter: str) -> None:
    import inferd
    import inferd.vulkan

    if not inferd.vulkan.available():
        pytest.skip("needs a Vulkan device (lavapipe)")
    path, feeds, names, want = _exported(arch, exporter)
    model = inferd.load(path, device="vulkan")
    _compare(arch, names, model.run(feeds), want)
    if arch.detector:
        # the post-processing is shaped at run time: it runs on the CPU after the Vulkan part, which holds the rest
        kernels = model.kernels
        on_cpu = [n for n, k in kernels.items() if k.startswith("cpu:")]
        assert on_cpu and len(on_cpu) < len(kernels), (len(on_cpu), len(kernels))
        assert any(k.startswith("vk_") for k in kernels.values())
