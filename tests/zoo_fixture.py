"""Shared model-zoo files for tests.

``zoo_dir()`` writes the zoo (seed 0) once per machine into a cache folder and returns it, so
every test file can load ``zoo_dir() / "<name>.onnx"`` without regenerating models. The
cache folder is ``$INFERD_ZOO_DIR`` or ``~/.cache/inferd-test-zoo``. Up-to-date files are
detected from their sidecar metadata without rebuilding (see ``inferd.zoo.write_zoo``), and
a file lock serialises concurrent pytest processes.

Usage from a test file (the tests folder is on sys.path under pytest's default import mode)::

    from zoo_fixture import zoo_dir

    @pytest.fixture(scope="session")
    def zoo() -> Path:
        return zoo_dir()
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from inferd import zoo as _zoo

try:
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX
    fcntl = None  # type: ignore[assignment]

ENV_VAR = "INFERD_ZOO_DIR"

_done: set[tuple[Path, str]] = set()
_mutex = threading.Lock()


def cache_root() -> Path:
    env = os.environ.get(ENV_VAR)
    return Path(env) if env else Path.home() / ".cache" / "inferd-test-zoo"


@contextlib.contextmanager
def _file_lock(root: Path) -> Iterator[None]:
    with open(root / ".lock", "a+b") as f:
        if fcntl is not None:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def zoo_dir(names: Sequence[str] | None = None) -> Path:
    """Directory holding ``<name>.onnx`` for ``names`` (default: every model in
    ``inferd.zoo.MODELS``), generating whatever is missing or stale."""
    root = cache_root().resolve()
    wanted = list(_zoo.MODELS) if names is None else list(names)
    with _mutex:
        todo = [n for n in wanted if (root, n) not in _done]
        if todo:
            root.mkdir(parents=True, exist_ok=True)
            with _file_lock(root):
                _zoo.write_zoo(root, todo, seed=0)
            _done.update((root, n) for n in todo)
    return root


def zoo_path(name: str) -> Path:
    """Path of one model in the shared zoo, generating only that model if needed."""
    return zoo_dir([name]) / f"{name}.onnx"


_refs: dict[str, tuple[Path, dict, list, list[str]]] = {}


def zoo_reference(name: str) -> tuple[Path, dict, list, list[str]]:
    """(model path, seeded random feeds, onnxruntime's outputs for them, output names) of one zoo model,
    computed once per process."""
    with _mutex:
        cached = _refs.get(name)
    if cached is not None:
        return cached
    import numpy as np
    import onnx
    import onnxruntime as ort

    path = zoo_path(name)
    m = onnx.load(str(path), load_external_data=False)
    init = {i.name for i in m.graph.initializer}
    rng = np.random.default_rng(11)
    # dynamic dimensions at 1, but a text line's width (the CRNN pools it by 4) at 64; the int64 scalar a
    # voice-activity detector takes is its sample rate
    dyn = 64 if name == "crnn_lstm" else 1
    feeds = {}
    for i in m.graph.input:
        if i.name in init:
            continue
        if i.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            feeds[i.name] = np.array(16000, np.int64)
        else:
            dims = [d.dim_value or dyn for d in i.type.tensor_type.shape.dim]
            feeds[i.name] = rng.standard_normal(dims).astype(np.float32)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.log_severity_level = 3
    want = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    out = (path, feeds, want, [o.name for o in m.graph.output])
    with _mutex:
        _refs[name] = out
    return out


def check_against_reference(model, name: str, what: str, tol: float) -> None:
    """``model``'s outputs on ``zoo_reference(name)``'s feeds within ``tol`` of onnxruntime's
    (max |ours - ref| / max |ref|, per output)."""
    from inferd.vulkan.testing import rel_err  # needs no Vulkan device: numpy only

    _, feeds, want, names = zoo_reference(name)
    got = model.run(feeds)
    for n, r in zip(names, want):
        err = rel_err(got[n], r)
        assert err <= tol, f"{name} {what}: output {n} relative error {err:.3g} > {tol}"
