"""Compiling a model for the streaming runtime, outside the budget (in a child process), and opening it inside.

Importing an ONNX file, slicing it for a budget and transforming its weights needs the whole model in
memory at once: ``compile_streamed`` does it in a child process (``in_child=True``), so that the serving
process never holds more than its budget. It leaves two files under ``work``: the streaming store (the
transformed weights in run order) and the skeleton (``.graph``: magic, version, sha256, then the graph's
nodes, shapes and small constants; each large constant only as its shape and dtype). ``open_streamed``
reads the skeleton and runs it inside a budget; the weights come from the store on every request.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

import msgpack
import numpy as np

from .. import __version__
from ..errors import WeightsStoreError
from ..fileio import atomic_write
from ..ir import Graph, dtype_from_tag, dtype_tag
from .stream import SMALL, StreamingExecutor, expand_kernels, prepare_stream_store, small_bytes, strip_constants

log = logging.getLogger(__name__)

SKEL_MAGIC = b"INFDSKEL"
SKEL_VERSION = 1
_HEAD = struct.Struct("<8sI32s")


def write_skeleton(graph: Graph, path: Path, meta: dict[str, Any]) -> None:
    from ..package import _default, _info, node_records

    stubs = {n: [list(np.shape(a)), dtype_tag(a.dtype)] for n, a in graph.constants.items()
             if np.asarray(a).nbytes > SMALL}
    small = {n: np.ascontiguousarray(a).reshape(np.shape(a)) for n, a in graph.constants.items() if n not in stubs}
    d = {"engine_version": __version__, "name": graph.name, "opset": graph.opset,
         "inputs": [_info(t) for t in graph.inputs], "outputs": [_info(t) for t in graph.outputs],
         "infos": [_info(t) for t in graph.infos.values()],
         "nodes": node_records(graph.nodes),
         "small": small, "stubs": stubs, "meta": meta}
    body = msgpack.packb(d, default=_default, use_bin_type=True)
    atomic_write(path, _HEAD.pack(SKEL_MAGIC, SKEL_VERSION, hashlib.sha256(body).digest()) + body)


def read_skeleton(path: Path) -> tuple[Graph, dict[str, Any]]:
    """The graph (large constants as zero-strided stubs) and the meta it was written with."""
    from numpy.lib.stride_tricks import as_strided

    from ..package import _ext_hook, _uninfo, nodes_of

    data = path.read_bytes() if path.is_file() else b""
    if len(data) < _HEAD.size:
        raise WeightsStoreError(f"{path}: missing or truncated skeleton")
    magic, version, sha = _HEAD.unpack_from(data)
    body = data[_HEAD.size:]
    if magic != SKEL_MAGIC or version != SKEL_VERSION or hashlib.sha256(body).digest() != sha:
        raise WeightsStoreError(f"{path}: not a valid skeleton of this engine (magic, version or checksum)")
    d = msgpack.unpackb(body, raw=False, ext_hook=_ext_hook, strict_map_key=False)
    if d.get("engine_version") != __version__:
        raise WeightsStoreError(f"{path}: skeleton of engine {d.get('engine_version')}, this is {__version__}")
    consts: dict[str, np.ndarray] = dict(d["small"])
    for n, (shape, dt) in d["stubs"].items():
        consts[n] = as_strided(np.zeros(1, dtype_from_tag(dt)), shape=tuple(shape), strides=(0,) * len(shape),
                               writeable=False)
    g = Graph(d["name"], nodes_of(d["nodes"]),
              [_uninfo(r) for r in d["inputs"]], [_uninfo(r) for r in d["outputs"]], consts,
              {r[0]: _uninfo(r) for r in d["infos"]}, int(d["opset"]))
    return g, dict(d["meta"])


def _key(src: Path, budget: int, batch: int) -> str:
    st = src.stat()
    return hashlib.sha256(f"{src.resolve()}:{st.st_size}:{st.st_mtime_ns}:{budget}:{batch}:{__version__}".encode()
                          ).hexdigest()[:16]


def compile_streamed(src: str | os.PathLike, budget: int, work: str | os.PathLike, batch: int = 1,
                     in_child: bool = True, config: Any = None, vulkan: Mapping[str, Any] | None = None) -> Path:
    """Slice ``src`` for ``budget`` (0: none), write its store and skeleton under ``work``; returns the
    skeleton's path. ``in_child``: in a child process (the whole model never enters this one).
    ``config``: a ``MemConfig`` to impose (else ``fit_config`` finds one). ``vulkan``: compile for the Vulkan
    streaming runtime on the device these facts describe (``inferd.vulkan.stream.device_facts``)."""
    src, work = Path(src), Path(work)
    work.mkdir(parents=True, exist_ok=True)
    cfg_json = json.dumps(config.to_dict()) if config else ""
    vk_json = json.dumps(vulkan, sort_keys=True) if vulkan else ""
    tag = hashlib.sha256((cfg_json + vk_json).encode()).hexdigest()[:6]
    skel = work / f"{src.stem}-{_key(src, budget, batch)}{tag}.graph"
    if skel.is_file():
        try:
            _g, meta = read_skeleton(skel)
            if Path(meta["store"]).is_file():
                return skel
        except (WeightsStoreError, KeyError):
            pass
    if in_child:
        code = ("import sys, json\nfrom inferd.runtime.stream_compile import compile_streamed\n"
                "from inferd.planner.slicing import MemConfig\n"
                "c = json.loads(sys.argv[5]) if sys.argv[5] else None\n"
                "compile_streamed(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), in_child=False, "
                "config=MemConfig.from_dict(c) if c else None,\n"
                "                 vulkan=json.loads(sys.argv[6]) if sys.argv[6] else None)\n")
        r = subprocess.run([sys.executable, "-c", code, str(src), str(budget), str(work), str(batch), cfg_json,
                            vk_json], capture_output=True, text=True)
        if r.returncode != 0:
            tail = (r.stderr or r.stdout).strip().splitlines()
            raise _child_error(tail[-1] if tail else f"exit code {r.returncode}", budget)
        return skel
    from ..frontend import import_model
    from ..planner.slicing import MemConfig, faster_config, fit_config, slice_base, slice_graph

    graph = import_model(src, batch=batch)
    big = 1 << 50
    if vulkan:
        _compile_vulkan(graph, src, budget if budget > 0 else big, work, batch, config, vulkan, skel)
        return skel
    if config is None:
        cfg = fit_config(graph, max(1, (budget if budget > 0 else big) - small_bytes(graph)))
    else:
        cfg = config

    Built = tuple[Graph, dict[str, str], Path]

    def stem(cfg: Any) -> str:
        # named by the source too: two models both called model.onnx (a repository's NAME/model.onnx) must not
        # share, nor race for, one store
        return f"{src.stem}-{_key(src, 0, batch)[:10]}-{hashlib.sha256(cfg.key().encode()).hexdigest()[:12]}"

    def sliced(cfg: Any) -> tuple[Graph, dict[str, str]]:
        g = slice_graph(graph, cfg.slices, cfg.in_slices)
        return g, expand_kernels(g, dict(cfg.kernels))

    def write_blocked(cfg: Any, g: Graph, kernels: dict[str, str]) -> Built | None:
        """``cfg``'s graph ``g`` in the blocked layout and its store, where that layout applies and fits the
        budget."""
        blocked = blocked_layout(g, kernels)
        if blocked is None:
            return None
        store = prepare_stream_store(blocked, work / f"{stem(cfg)}-nchwc.store", kernels or None)
        if _fits(blocked, store, kernels, budget):
            return blocked, kernels, store
        store.unlink(missing_ok=True)
        log.info("%s: the blocked layout does not fit %d bytes with slicing %r", src, budget, cfg.key() or "none")
        return None

    def write(cfg: Any) -> Built:
        g, kernels = sliced(cfg)
        built = write_blocked(cfg, g, kernels)
        return built if built is not None else (g, kernels,
                                                prepare_stream_store(g, work / f"{stem(cfg)}.store", kernels or None))

    done = None
    if config is None and budget > 0 and cfg.key():
        # fit_config slices for the NCHW kernels' memory; the blocked graph needs no im2col or Winograd workspace
        # and may fit the budget unsliced (resnet50: 12.6 MiB against the NCHW kernels' 18.5)
        done = write_blocked(MemConfig(), *sliced(MemConfig()))
        if done is not None:
            cfg = MemConfig()
    g, kernels, store = done if done is not None else write(cfg)
    compute_s, read_bw = _measure(g, kernels, store)
    if config is None and budget > 0:
        # sliced further where that runs faster inside the budget (planner.slicing.faster_config), from this
        # slicing's measured times (its slices' and their Concat's count for the node)
        per_node: dict[str, float] = {}
        for node, t in zip(g.nodes, compute_s):
            base = slice_base(node.name)
            per_node[base] = per_node.get(base, 0.0) + t
        faster = faster_config(graph, max(1, budget - small_bytes(graph)), cfg, per_node, read_bw, layout=sliced_layout)
        if faster != cfg:
            cfg = faster
            g, kernels, store = write(cfg)
            compute_s, read_bw = _measure(g, kernels, store, read_bw)
    write_skeleton(strip_constants(g), skel, {"store": str(store), "kernels": kernels,
                                              "config": cfg.to_dict(),
                                              "compute_s": compute_s, "read_bw": read_bw})
    return skel


def sliced_layout(g: Graph, kernels: dict[str, str]) -> Graph | None:
    """``blocked_layout`` for a sliced graph and the overrides of the unsliced one's nodes (``faster_config``'s
    ``layout``: the form the compile writes a slicing in)."""
    return blocked_layout(g, expand_kernels(g, kernels))


def blocked_layout(g: Graph, kernels: dict[str, str]) -> Graph | None:
    """``g`` as the CPU runs it unconstrained (``package.cpu_graph``: runs of convs on channel-blocked tensors,
    the kernels in ``kernels`` keeping NCHW), or None where nothing is blocked or ``INFERD_CPU_LAYOUT=nchw``.
    resnet50 streamed, Xeon VM, two threads: 0.87-0.89x the NCHW kernels' time (resident at an ample budget), a
    smallest unsliced budget of 12.6 MiB against 18.5 (no im2col or Winograd workspace, weights packed at their
    own size where Winograd's are 1.8-4x; its 1.7 MiB of input copies counted), everything resident at 107 MiB
    against 138 (bench results 2026-12-07j)."""
    from ..package import cpu_graph
    from ..planner.layout import SUFFIX

    b = cpu_graph(g, kernels or None)
    return b if any(SUFFIX in t for t in b.infos) else None


def _fits(g: Graph, store: Path, kernels: dict[str, str], budget: int) -> bool:
    """Whether ``g`` runs inside ``budget`` bytes (0: none) from ``store``: a plan is made (the arena allocated
    and dropped: this runs where the model is compiled, outside the budget)."""
    from ..planner.flex import BudgetTooSmall

    if budget <= 0:
        return True
    try:
        StreamingExecutor(g, store, budget, kernels=kernels or None).close()
    except BudgetTooSmall:
        return False
    return True


def _compile_vulkan(graph: Graph, src: Path, budget: int, work: Path, batch: int, config: Any,
                    facts: Mapping[str, Any], skel: Path) -> None:
    """``compile_streamed``'s Vulkan half: the Vulkan kernels' fallback and the slicing for ``budget``, the store
    of their transformed weights, the folded skeleton. No compute times are measured (the child has no device):
    the memory plan keeps the weights that save the most reading per byte."""
    from ..vulkan.stream import store_for_config, vulkan_fit
    from .blockio import disk_rate
    from .stream import RUN

    reserve, fit = vulkan_fit(graph, facts)
    cfg = config if config is not None else fit(max(1, budget - reserve))
    store, folded, kernels = store_for_config(graph, cfg, work / f"{src.stem}-{_key(src, 0, batch)[:10]}", facts)
    read_bw = disk_rate(store, StreamingExecutor.bypass_readers, RUN)
    write_skeleton(strip_constants(folded), skel, {"store": str(store), "kernels": kernels, "config": cfg.to_dict(),
                                                   "backend": "vulkan", "compute_s": None, "read_bw": read_bw})


def _measure(g: Graph, kernels: dict[str, str], store: Path, read_bw: float | None = None,
             runs: int = 3) -> tuple[list[float], float]:
    """Per step compute seconds (median of ``runs`` timed runs of the whole model) and the store's read
    bandwidth (``O_DIRECT`` passes, the cache dropped first, as the loaders read): what the resident choice
    weighs. ``read_bw``: already measured on this disk (another slicing's store), not measured again."""
    from .blockio import disk_rate
    from .cpu import CpuExecutor
    from .stream import RUN

    ex = CpuExecutor(g, kernels or None)
    feeds = {t.name: np.zeros(t.shape, t.dtype) for t in g.inputs}
    ex.run(feeds)
    per = [ex.run_timed(feeds)[1] for _ in range(runs)]
    compute = [float(np.median([p[i] for p in per])) for i in range(len(per[0]))]
    del ex
    return compute, read_bw if read_bw else disk_rate(store, StreamingExecutor.bypass_readers, RUN)


def _child_error(line: str, budget: int) -> Exception:
    from ..planner.flex import BudgetTooSmall

    if "BudgetTooSmall" in line:
        import re

        m = re.search(r"at least (\d+) bytes", line)
        return BudgetTooSmall(line.split(": ", 1)[-1], budget, int(m.group(1)) if m else 0)
    return RuntimeError(f"compiling for the streaming runtime failed: {line}")


def open_streamed(skel: str | os.PathLike, budget: int, **kw: Any) -> StreamingExecutor:
    """The compiled model running inside ``budget`` bytes (0: none), on the backend it was compiled for (``device``
    in ``kw``: the Vulkan device, default the process's)."""
    from ..planner.slicing import MemConfig

    g, meta = read_skeleton(Path(skel))
    kw.setdefault("compute_s", meta.get("compute_s"))
    kw.setdefault("read_bw", float(meta.get("read_bw") or 0.0))
    cls: type[StreamingExecutor] = StreamingExecutor
    if meta.get("backend") == "vulkan":
        from ..vulkan.stream import VulkanStreamingExecutor

        cls = VulkanStreamingExecutor
    else:
        kw.pop("device", None)
    ex = cls(g, meta["store"], budget if budget > 0 else 1 << 50, kernels=meta.get("kernels") or None, **kw)
    c = meta.get("config") or {}
    ex.config = MemConfig.from_dict(c)
    return ex
