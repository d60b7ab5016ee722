"""What the predictor knows about a unit: a layer after import (fusions applied) run by one kernel.

nn-Meter has to find out black-box which ops a backend fuses; inferd knows: a fused layer (Conv +
BN + activation + residual is one node) run by its chosen kernel is one unit. Its features are the
op and kernel (the model key), its shapes (non-square too), FLOPs, bytes of weights (raw and in the
kernel's layout), inputs, outputs and workspace, the threads; on Vulkan also the dispatches (count,
workgroup counts and local size), which the co-execution paper found necessary to catch the spikes
of GPU kernels. Everything here is arithmetic on shapes: cheap enough for a whole model in a few ms.
"""
from __future__ import annotations

import math
import re
import zlib
from functools import lru_cache
from typing import Any, Hashable, Mapping, Sequence

import numpy as np

from ..ops.base import Kernel, Layer, raw_key
from ..planner.cost import layer_flops

#: the feature vector, in this order (the predictor file records the names, so a file written with
#: another list is refused rather than misread). ``out_px`` (output pixels per channel), ``k_area`` and
#: ``cin_g`` (input channels per group) are products the trees would otherwise have to build from several
#: splits: kernels switch form at a map size (the depthwise kernel's blocked form up to 1024 output pixels)
#: and the depthwise/grouped cost per output is k_area x cin_g; ``work_bytes`` (inputs, outputs, weights in
#: the kernel's layout and workspace) is what has to fit in the caches.
FEATURES = ("flops", "in_bytes", "out_bytes", "w_bytes", "tw_bytes", "ws_bytes", "out_elems",
            "n", "cin", "cout", "h", "w", "oh", "ow", "kh", "kw", "sh", "sw", "groups",
            "act", "residual", "n_inputs", "threads", "op_id",
            "n_disp", "wg_total", "wg_max", "local", "invocations",
            "out_px", "k_area", "cin_g", "work_bytes")
INDEX = {f: i for i, f in enumerate(FEATURES)}
_NF = len(FEATURES)
_DISP = [INDEX[f] for f in ("n_disp", "wg_total", "wg_max", "local", "invocations")]
_DISP0 = _DISP[0]
assert _DISP == list(range(_DISP0, _DISP0 + 5))  # unit_row writes them as one slice

#: fused activations by id (0: none); an unknown one gets a stable id from its name
_ACTS = {None: 0, "Relu": 1, "LeakyRelu": 2, "Clip": 3, "Sigmoid": 4, "HardSigmoid": 5, "HardSwish": 6,
         "Tanh": 7, "SiLU": 8, "Gelu": 9, "GeluTanh": 10, "Softplus": 11}


@lru_cache(maxsize=None)
def stable_id(s: str) -> float:
    """A small number that names ``s`` the same way on every machine and run (not Python's ``hash``)."""
    return float(zlib.crc32(s.encode()) % 997)


def _nchw(s: Sequence[int]) -> tuple[int, int, int, int]:
    """(N, C, H, W) of a tensor of any rank: 4-D as is, 2-D (N, C), 3-D (N, T, C) as T rows of C, 1-D as C."""
    r = len(s)
    if r >= 4:
        return int(s[0]), int(s[1]), int(s[2]), int(math.prod(s[3:]))
    if r == 3:
        return int(s[0]), int(s[2]), int(s[1]), 1
    if r == 2:
        return int(s[0]), int(s[1]), 1, 1
    if r == 1:
        return 1, int(s[0]), 1, 1
    return 1, 1, 1, 1


def unit_key(layer: Layer, kernel: Kernel) -> str:
    return f"{layer.op}/{kernel.name}"


def kernel_key(kernel: Kernel) -> str:
    """The coarser model a unit falls back to when its (op, kernel) pair has none of its own."""
    return f"*/{kernel.name}"


_ITEMSIZE: dict[Any, int] = {}
_F32 = np.dtype(np.float32)


def _isz(info: Any) -> int:
    dt = info.dtype
    sz = _ITEMSIZE.get(dt)
    if sz is None:
        sz = _ITEMSIZE[dt] = np.dtype(dt).itemsize
    return math.prod(info.shape) * sz


def base_row(layer: Layer, kernel: Kernel, threads: int) -> list[float]:
    """Every feature but the dispatch ones (those are -1 here; :func:`dispatch_features` fills them), as a
    list: plain Python arithmetic on shapes (a whole model's rows in well under a millisecond; numpy calls
    per layer cost more than the arithmetic)."""
    ins = layer.inputs
    x = ins[0] if ins and ins[0] is not None else None
    outs = layer.outputs
    out = outs[0] if outs else None
    xs = x.shape if x is not None else None
    # _nchw inlined for the 4-D shapes most units have
    n, c, h, w = (xs if len(xs) == 4 else _nchw(xs)) if xs is not None else (1, 1, 1, 1)
    os_ = out.shape if out is not None else None
    _on, oc, oh, ow = (os_ if len(os_) == 4 else _nchw(os_)) if os_ is not None else (1, 1, 1, 1)
    attrs = layer.node.attrs
    op = layer.op
    kh = kw = 1
    cout = oc
    cin = c
    if op in ("Conv", "ConvTranspose") and len(ins) > 1 and ins[1] is not None:
        ws = ins[1].shape
        if len(ws) >= 4:
            kh, kw = int(ws[2]), int(math.prod(ws[3:]))
        elif len(ws) == 3:
            kh = int(ws[2])
    elif op in ("Gemm", "MatMul") and len(ins) > 1 and ins[1] is not None and x is not None:
        b = ins[1].shape
        trans_b = op == "Gemm" and bool(attrs.get("transB", 0))
        if len(b) >= 2:
            cin = int(b[-1] if trans_b else b[-2])
            cout = int(b[-2] if trans_b else b[-1])
    else:
        ks = attrs.get("kernel_shape")
        if ks:
            kh, kw = int(ks[0]), int(math.prod(ks[1:])) if len(ks) > 1 else 1
    st = attrs.get("strides") or [1, 1]
    act = attrs.get("act")
    aname = act[0] if act else None
    consts = layer.const_inputs
    out_b = 0.0
    for o in outs:
        out_b += _isz(o)
    # inputs and raw weights in one pass (raw_nbytes' rule inlined: fp16-stored float32 weights count half)
    in_b = raw_b = 0.0
    n_in = 0
    half = 2 if attrs.get("_wfp", 0) else 1
    for k, i in enumerate(ins):
        if i is None:
            continue
        n_in += 1
        if k in consts:
            raw_b += _isz(i) // (half if i.dtype == _F32 else 1)
        else:
            in_b += _isz(i)
    tw = float(kernel.transformed_nbytes(layer)) if consts else 0.0
    ws_b = float(kernel.workspace_nbytes(layer))
    groups = int(attrs.get("group", 1) or 1)
    a = _ACTS.get(aname)
    return [layer_flops(layer), in_b, out_b, raw_b, tw, ws_b,
            float(math.prod(out.shape)) if out is not None else 0.0,
            n, cin, cout, h, w, oh, ow, kh, kw,
            int(st[0]), int(st[1]) if len(st) > 1 else int(st[0]), groups,
            a if a is not None else 20 + stable_id(str(aname)) % 50,
            1.0 if attrs.get("residual") else 0.0, float(n_in), float(threads),
            stable_id(op), -1.0, -1.0, -1.0, -1.0, -1.0,
            float(oh * ow), float(kh * kw), float(max(cin // max(groups, 1), 1)), in_b + out_b + tw + ws_b]


def base_features(layer: Layer, kernel: Kernel, threads: int) -> np.ndarray:
    return np.array(base_row(layer, kernel, threads), dtype=np.float64)


def feature_matrix(layers: Sequence[tuple[Layer, Kernel]], threads: int) -> np.ndarray:
    """The CPU feature rows of many units at once (no dispatches), one array built from Python lists."""
    if not layers:
        return np.zeros((0, _NF))
    return np.array([base_row(layer, k, threads) for layer, k in layers], dtype=np.float64)


_LOCAL = re.compile(r"layout\s*\(([^)]*local_size[^)]*)\)\s*in")


@lru_cache(maxsize=None)
def shader_local_size(shader: str) -> int:
    """Invocations per workgroup of ``shader`` (local_size_x * y * z as written in its source; 1 if unknown)."""
    try:
        from ..vulkan.shaders import shader_dir

        src = (shader_dir() / f"{shader}.comp").read_text()
    except Exception:
        return 1
    m = _LOCAL.search(src)
    if not m:
        return 1
    n = 1
    for part in m.group(1).split(","):
        k, _, v = part.partition("=")
        if k.strip().startswith("local_size_") and v.strip().isdigit():
            n *= int(v.strip())
    return n


def dispatch_summary(dispatches: Sequence[Any]) -> tuple[float, float, float, float, float]:
    """(dispatches, workgroups in all, the largest dispatch's workgroups, its local size, invocations in all)."""
    if not dispatches:
        return 0.0, 0.0, 0.0, 0.0, 0.0
    total = inv = 0.0
    big_g = big_l = -1.0
    for d in dispatches:  # one pass (the first of equally large dispatches is the largest)
        g = float(math.prod(d.groups))
        lo = float(shader_local_size(d.shader))
        total += g
        inv += g * lo
        if g > big_g:
            big_g, big_l = g, lo
    return float(len(dispatches)), total, big_g, big_l, inv


#: constants up to this size are passed to ``dispatches`` by value when they are known (axes, pads, shapes, a
#: Gather's indices, scales); larger ones (weights) as zero stand-ins of their shape, which every kernel's geometry
#: accepts. The by-value ones are part of the dispatch cache's key, hashed at each lookup: at 64 KB the weights of
#: most mobile-net layers were (770 KB hashed per prediction of an EfficientNet variant, 1.2 of its 8.4 ms)
_SMALL = 4096


def vulkan_dispatches(layer: Layer, kernel: Any, caps: Any, constants: Mapping[str, Any] | None = None,
                      sig: Hashable | None = None) -> list[Any] | None:
    """The dispatches ``kernel`` records for ``layer`` (None when they cannot be derived without its values);
    ``sig``: the unit's :func:`unit_identity` when the caller has it."""
    global _split_rows
    key = (_dispatch_key(layer, kernel, constants, sig), caps)
    hit = _DISPATCHES.get(key, _MISS)
    if hit is not _MISS:
        return hit
    if _split_rows is None:  # imported once, not per call: the backend's module is not the predictor's to load
        from ..vulkan.kernel import split_rows as _split_rows
    try:
        out: list[Any] | None = _split_rows(kernel.dispatches(layer, _LazyParams(layer, kernel, constants), caps), caps)
    except Exception:
        out = None
    if len(_DISPATCHES) >= _DISPATCH_CACHE:
        _DISPATCHES.clear()
    _DISPATCHES[key] = out
    return out


class _LazyParams(Mapping[str, Any]):
    """A kernel's transformed parameters, transformed only when ``dispatches`` looks at one: most kernels' geometry
    comes from the layer's shapes alone, and transforming stand-in weights (a large Winograd layer: milliseconds)
    made most of a Vulkan whole-model prediction's time. The dispatches are the same either way. The raw constants
    are the graph's where they are small (``_SMALL``), zero stand-ins of their shape otherwise."""

    __slots__ = ("_layer", "_kernel", "_constants", "_params")

    def __init__(self, layer: Layer, kernel: Any, constants: Mapping[str, Any] | None) -> None:
        self._layer = layer
        self._kernel = kernel
        self._constants = constants
        self._params: Mapping[str, Any] | None = None

    def _make(self) -> Mapping[str, Any]:
        layer, constants = self._layer, self._constants
        raw: dict[str, np.ndarray] = {}
        for i in layer.const_inputs:
            info = layer.inputs[i]
            if info is None:
                continue
            val = constants.get(layer.node.inputs[i]) if constants is not None and _isz(info) <= _SMALL else None
            raw[raw_key(i)] = np.asarray(val) if val is not None else np.zeros(info.shape, info.dtype)
        return self._kernel.transform(layer, raw)

    def _get(self) -> Mapping[str, Any]:
        if self._params is None:
            self._params = self._make()
        return self._params

    def __getitem__(self, k: str) -> Any:
        return self._get()[k]

    def __iter__(self) -> Any:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


_MISS = object()
_split_rows: Any = None

#: dispatches per (kernel, layer shapes, small constants, caps): deriving them runs the kernel's transform on
#: stand-in weights (milliseconds for a large Winograd layer), and planners meet the same shapes again and again
_DISPATCHES: dict[Any, list[Any] | None] = {}
_DISPATCH_CACHE = 8192


def _dispatch_key(layer: Layer, kernel: Any, constants: Mapping[str, Any] | None, sig: Hashable | None = None) -> Any:
    small = []
    for i in layer.const_inputs:
        info = layer.inputs[i]
        v = constants.get(layer.node.inputs[i]) if constants is not None and info is not None \
            and _isz(info) <= _SMALL else None
        small.append(None if v is None else np.asarray(v).tobytes())
    return (kernel.name, sig if sig is not None else unit_identity(layer, kernel), tuple(small))


def unit_row(layer: Layer, kernel: Kernel, threads: int = 1, dispatches: Sequence[Any] | None = None) -> list[float]:
    """:func:`features` as a list (a whole model's rows then become one array: no array per unit)."""
    row = base_row(layer, kernel, threads)
    if dispatches is not None:
        row[_DISP0:_DISP0 + 5] = dispatch_summary(dispatches)
    return row


def features(layer: Layer, kernel: Kernel, threads: int = 1, dispatches: Sequence[Any] | None = None) -> np.ndarray:
    return np.array(unit_row(layer, kernel, threads, dispatches), dtype=np.float64)


def unit_identity(layer: Layer, kernel: Kernel) -> Hashable:
    """Equal for two units exactly when they are the same work: op, kernel, shapes and attributes (the cache key of
    derived features within a process). A tuple, ~2.5x cheaper to build and hash than its repr, which a Vulkan
    whole-model prediction did once per layer (a fifth of its time); the repr where an attribute value cannot be
    hashed. ``_absorbed`` (the names of the nodes a fusion folded in: bookkeeping, the kernel runs the same without
    it) is left out: it made every fused layer unique, so a model's repeated blocks were derived once each
    (EfficientNet variants: 86 of 94 units) and training never pooled identical units."""
    # list comprehensions, not generators in tuple(): cheaper at these lengths (every layer of a model is
    # identified once per whole-model prediction); a shape is taken as is when it is a tuple already (TensorInfo's)
    items = tuple([(k, tuple(v) if type(v) is list else v) for k, v in sorted(layer.attrs.items())
                   if k != "_absorbed"])  # (names are unique strings: sorting never compares values)
    key = (layer.op, kernel.name,
           tuple([None if i is None else i.shape if type(i.shape) is tuple else tuple(i.shape) for i in layer.inputs]),
           tuple([o.shape if type(o.shape) is tuple else tuple(o.shape) for o in layer.outputs]),
           tuple(layer.const_inputs), items)
    try:
        hash(key)
    except TypeError:  # an array or a nested list among the attributes
        return repr(key)
    return key


def signature(layer: Layer, kernel: Kernel) -> str:
    """:func:`unit_identity` as a string (the identity of a training sample, in its keys)."""
    key = unit_identity(layer, kernel)
    return key if isinstance(key, str) else repr(key)
