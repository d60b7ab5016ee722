"""Compiled model package: a directory holding ``plan.bin`` (graph IR + kernel choices) and
``weights.store`` (raw constants, and post-transformed weights of the chosen kernels).

``inferd compile`` writes it; ``inferd.load(dir)`` reads it, taking transformed weights from the
store instead of transforming at load (the cold-start planner decides per layer later on).
"""
from __future__ import annotations

import hashlib
import logging
import os
import platform
import struct
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from . import __version__
from .errors import WeightsStoreError
from .fileio import atomic_write
from .ir import Graph, Node, TensorInfo
from .ops.base import raw_key
from .store import StoreWriter, WeightsStore, file_sha256

log = logging.getLogger(__name__)

PLAN_MAGIC = b"INFDPLAN"
PLAN_VERSION = 1
_PLAN_HEAD = struct.Struct("<8sI32s")
_EXT_NDARRAY, _EXT_TUPLE = 1, 2


def _default(o: Any) -> Any:
    if isinstance(o, np.ndarray):
        return msgpack.ExtType(_EXT_NDARRAY, msgpack.packb([o.dtype.str, list(o.shape), o.tobytes()], use_bin_type=True))
    if isinstance(o, tuple):
        return msgpack.ExtType(_EXT_TUPLE, msgpack.packb(list(o), default=_default, use_bin_type=True))
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"cannot serialise {type(o).__name__}")


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _EXT_NDARRAY:
        dt, shape, buf = msgpack.unpackb(data, raw=False)
        return np.frombuffer(buf, dtype=np.dtype(dt)).reshape(shape).copy()
    if code == _EXT_TUPLE:
        return tuple(msgpack.unpackb(data, raw=False, ext_hook=_ext_hook, strict_map_key=False))
    return msgpack.ExtType(code, data)


def _info(t: TensorInfo) -> list[Any]:
    return [t.name, list(t.shape), np.dtype(t.dtype).str]


def _uninfo(r: list[Any]) -> TensorInfo:
    return TensorInfo(r[0], tuple(r[1]), np.dtype(r[2]))


def fingerprint(device: str) -> dict[str, str]:
    return {"device": device, "machine": platform.machine(), "engine": __version__}


def compile_model(src: str | os.PathLike, out_dir: str | os.PathLike, device: str = "cpu", batch: int = 1,
                  kernels: dict[str, str] | None = None, transformed: bool = True) -> Path:
    """Import ``src`` and write a package to ``out_dir``. Returns the directory."""
    from .frontend import import_model
    from .runtime.cpu import select_kernels

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    graph = import_model(src, batch=batch)
    sha = file_sha256(src)
    choice = select_kernels(graph, "cpu", kernels)
    with StoreWriter(out / "weights.store", sha, __version__, fingerprint(device)) as w:
        for name, arr in graph.constants.items():
            w.add("", name, arr)
        if transformed:
            for layer, k in choice:
                if not layer.const_inputs:
                    continue
                raw = {raw_key(i): graph.constants[layer.node.inputs[i]] for i in layer.const_inputs}
                params = k.transform(layer, raw)
                if all(params.get(key) is raw.get(key) for key in set(params) | set(raw)):
                    continue  # the kernel runs on raw weights: nothing to cache
                for key, arr in params.items():
                    w.add(layer.name, key, np.asarray(arr), kernel=k.name, variant="transformed")
    body = msgpack.packb({
        "engine_version": __version__, "model_sha256": sha, "batch": batch, "device": device,
        "name": graph.name, "opset": graph.opset,
        "inputs": [_info(t) for t in graph.inputs], "outputs": [_info(t) for t in graph.outputs],
        "infos": [_info(t) for t in graph.infos.values()],
        "nodes": [[n.name, n.op, n.inputs, n.outputs, n.attrs] for n in graph.nodes],
        "kernels": {layer.name: k.name for layer, k in choice},
    }, default=_default, use_bin_type=True)
    atomic_write(out / "plan.bin", _PLAN_HEAD.pack(PLAN_MAGIC, PLAN_VERSION, hashlib.sha256(body).digest()) + body)
    return out


def read_plan(path: Path) -> dict[str, Any]:
    data = path.read_bytes() if path.is_file() else b""
    if len(data) < _PLAN_HEAD.size:
        raise WeightsStoreError(f"{path}: missing or truncated plan ({len(data)} bytes)")
    magic, version, sha = _PLAN_HEAD.unpack_from(data)
    if magic != PLAN_MAGIC:
        raise WeightsStoreError(f"{path}: not an inferd plan (magic {magic!r}, expected {PLAN_MAGIC!r})")
    if version != PLAN_VERSION:
        raise WeightsStoreError(f"{path}: plan format version {version}, this engine reads {PLAN_VERSION}")
    body = data[_PLAN_HEAD.size:]
    if hashlib.sha256(body).digest() != sha:
        raise WeightsStoreError(f"{path}: plan checksum mismatch (corrupted file)")
    return msgpack.unpackb(body, raw=False, ext_hook=_ext_hook, strict_map_key=False)


def load_package(pkg: Path, device: str = "cpu", batch: int = 1,
                 kernels: dict[str, str] | None = None) -> tuple[Graph, dict[str, dict[str, np.ndarray]]]:
    """Graph and per-layer transformed params (for the layers whose stored kernel is the one chosen)."""
    from .runtime.cpu import select_kernels

    plan = read_plan(pkg / "plan.bin")
    stale = plan["engine_version"] != __version__
    if stale:  # transformed layouts may differ between engine versions: use the raw weights only
        log.warning("%s was compiled by inferd %s, this is %s: transforming its weights at load", pkg,
                    plan["engine_version"], __version__)
    if int(plan["batch"]) != batch:
        raise WeightsStoreError(f"{pkg}: package compiled for batch {plan['batch']}, asked for batch {batch}; "
                                f"recompile with --batch {batch}")
    with WeightsStore(pkg / "weights.store") as store:
        if store.model_sha256 != plan["model_sha256"]:
            raise WeightsStoreError(f"{pkg}: weights store belongs to model {store.model_sha256[:12]}, "
                                    f"plan to {plan['model_sha256'][:12]}")
        constants = {e.tensor: store.read(e) for e in store.find("", kernel="", variant="raw")}
        nodes = [Node(r[0], r[1], list(r[2]), list(r[3]), dict(r[4])) for r in plan["nodes"]]
        graph = Graph(plan["name"], nodes, [_uninfo(r) for r in plan["inputs"]], [_uninfo(r) for r in plan["outputs"]],
                      constants, {r[0]: _uninfo(r) for r in plan["infos"]}, int(plan["opset"]))
        missing = [n for n in (i for nd in nodes for i in nd.inputs) if n and n not in graph.infos]
        if missing:
            raise WeightsStoreError(f"{pkg}: plan references unknown tensors {missing[:5]}")
        params: dict[str, dict[str, np.ndarray]] = {}
        if device == "cpu" and not stale:
            for layer, k in select_kernels(graph, "cpu", kernels):
                ents = list(store.find(layer.name, kernel=k.name, variant="transformed"))
                if ents:
                    params[layer.name] = {e.tensor: store.read(e) for e in ents}
    return graph, params


def package_key(src: Path, batch: int, device: str) -> str:
    """Cache key of a compiled package: the source file's identity (path, size, mtime) and the options.

    Stat-based like ccache's direct mode, so a cold load does not hash the whole model; the plan
    still records the model's sha256, and an edited file gets a new mtime, hence a new package.
    """
    st = src.stat()
    ident = f"{src.resolve()}|{st.st_size}|{st.st_mtime_ns}|{batch}|{device}|{__version__}|{PLAN_VERSION}"
    return hashlib.sha256(ident.encode()).hexdigest()[:32]


def cached_package(src: str | os.PathLike, cache_root: str | os.PathLike, batch: int = 1,
                   device: str = "cpu") -> Path:
    """The compiled package of ``src`` under ``cache_root``, compiled now if missing or unreadable.

    A damaged or stale package is a cache miss with a warning: it is rebuilt, never trusted.
    """
    src = Path(src)
    root = Path(cache_root)
    pkg = root / f"{src.stem}-{package_key(src, batch, device)}"
    if (pkg / "plan.bin").is_file():
        try:
            read_plan(pkg / "plan.bin")
            return pkg
        except WeightsStoreError as e:
            log.warning("compiled package %s is unusable (%s); recompiling", pkg, e)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{pkg.name}.tmp{os.getpid()}"
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    compile_model(src, tmp, device=device, batch=batch, transformed=(device == "cpu"))
    shutil.rmtree(pkg, ignore_errors=True)
    os.replace(tmp, pkg)
    return pkg
