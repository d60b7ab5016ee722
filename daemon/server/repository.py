"""The model repository: a directory the daemon scans at start and on SIGHUP.

Layout::

    DIR/NAME.onnx                     model NAME, default settings
    DIR/NAME/model.onnx               model NAME ...
    DIR/NAME/config.toml              ... with optional settings:
        preload = true                # load at start (default: the daemon's `preload` option)
        priority = 0                  # importance: orders waiters for the shared GPU; kept for budget planning
        max_queue = 64                # queue cap (default: the daemon's `max_queue`)
        pinned = false                # never unloaded by the daemon on its own (memory budget)
        device = "auto"               # override the daemon's device for this model
        batch = 1                     # batch size of the first shape when the batch dimension is dynamic
        # a model with dynamic input dimensions runs at any shape it takes; a new shape is prepared at its
        # first request (the weights shared), these are prepared at load (the first one is the shape the
        # model is planned and loaded at):
        shapes = [{ x = [1, 3, 32, 128] }, { x = [1, 3, 32, 256] }]
        max_shape = { x = [8, 3, 32, 1024] }   # larger requests get INVALID_ARG
        max_variants = 4              # shapes kept besides the first (default: the daemon's `max_variants`)
        fallback = "cpu"              # serve on the CPU while the GPU recovers (default: the daemon's `fallback`)
        memory = "stream"             # run inside its share of the memory budget, weights streamed (CPU or
                                      # Vulkan; default "whole": everything resident, evicted whole)
        precision = "auto"            # fp32 (default), fp16 or auto (fp16 where the GPU has 16-bit storage)
        fp32_layers = ["/fc/Gemm"]    # layers kept fp32 in an fp16 model (their sums or weights overflow fp16)
        split = { Conv = 0.5 }        # device "cpu+vulkan": share of output channels on the CPU per node name or
                                      # op type (default: the co-execution planner's choice)

A model whose config.toml is broken is listed UNAVAILABLE with the reason, not skipped silently.
"""
from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from inferd_client.protocol import MODEL_NAME_RE

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

log = logging.getLogger("inferd.server")

MODEL_FILE = "model.onnx"
CONFIG_FILE = "config.toml"


@dataclass(frozen=True)
class ModelConfig:
    preload: bool | None = None
    priority: int = 0
    max_queue: int | None = None
    pinned: bool = False
    device: str | None = None
    batch: int = 1
    shapes: tuple[dict[str, tuple[int, ...]], ...] = ()
    max_shape: dict[str, tuple[int, ...]] | None = None
    max_variants: int | None = None
    fallback: str | None = None
    memory: str = "whole"
    precision: str | None = None
    fp32_layers: tuple[str, ...] = ()
    #: device "cpu+vulkan": fraction of output channels on the CPU per node name or op type (as inferd.load's
    #: ``split``); absent: the co-execution planner's choice
    split: tuple[tuple[str, float | str], ...] = ()


@dataclass(frozen=True)
class ModelEntry:
    name: str
    path: str
    config: ModelConfig = field(default_factory=ModelConfig)
    fingerprint: tuple[Any, ...] = ()
    error: str | None = None


_TYPES: dict[str, tuple[type, ...]] = {
    "preload": (bool,), "priority": (int,), "max_queue": (int,), "pinned": (bool,), "device": (str,), "batch": (int,),
    "shapes": (list,), "max_shape": (dict,), "max_variants": (int,), "fallback": (str,),
    "memory": (str,),
    "precision": (str,), "fp32_layers": (list,), "split": (dict,),
}


def _shape_table(path: str, key: str, table: Any) -> dict[str, tuple[int, ...]]:
    """``{input = [d, ...], ...}`` with positive integer dimensions, or ValueError naming what is wrong."""
    if not isinstance(table, dict) or not table:
        raise ValueError(f"{path}: {key!r} must be a table of input name = [dimensions], got {table!r}")
    out = {}
    for name, dims in table.items():
        if not isinstance(dims, list) or not dims or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                                                            for d in dims):
            raise ValueError(f"{path}: {key!r}: input {name!r} must be a list of positive integers, got {dims!r}")
        out[name] = tuple(dims)
    return out


def parse_model_config(path: str) -> ModelConfig:
    """Read a model's config.toml; raises ValueError naming the bad key and what was expected."""
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in _TYPES:
            raise ValueError(f"{path}: unknown key {key!r}; known: {sorted(_TYPES)}")
        types = _TYPES[key]
        if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
            raise ValueError(f"{path}: {key!r} must be {types[0].__name__}, got {value!r}")
        values[key] = value
    if "device" in values and values["device"] not in ("auto", "vulkan", "cpu", "cpu+vulkan"):
        raise ValueError(f"{path}: 'device' must be auto, vulkan, cpu or cpu+vulkan, got {values['device']!r}")
    if "fallback" in values and values["fallback"] not in ("none", "cpu"):
        raise ValueError(f"{path}: 'fallback' must be none or cpu, got {values['fallback']!r}")
    if "memory" in values and values["memory"] not in ("whole", "stream"):
        raise ValueError(f"{path}: 'memory' must be whole or stream, got {values['memory']!r}")
    if values.get("memory") == "stream" and values.get("device") == "cpu+vulkan":
        # served anyway, it would run on one side while its config says both: refused, as any other bad key
        raise ValueError(f"{path}: memory = \"stream\" runs on the CPU or on the GPU, not split between them, but "
                         f"device = \"cpu+vulkan\"; set device = \"cpu\" or \"vulkan\", or memory = \"whole\"")
    if "precision" in values and values["precision"] not in ("fp32", "fp16", "auto"):
        raise ValueError(f"{path}: 'precision' must be fp32, fp16 or auto, got {values['precision']!r}")
    if "split" in values:
        split = values["split"]
        if values.get("device") != "cpu+vulkan":
            raise ValueError(f"{path}: 'split' applies to device = \"cpu+vulkan\" only")
        bad = [k for k, v in split.items() if not (v in ("cpu", "gpu") or (isinstance(v, (int, float))
                                                                        and not isinstance(v, bool) and 0 <= v <= 1))]
        if bad:
            raise ValueError(f"{path}: 'split' values must be fractions from 0 to 1 (of the output channels on the "
                             f"CPU), \"cpu\" or \"gpu\"; bad: {bad}")
        values["split"] = tuple((str(k), v if isinstance(v, str) else float(v)) for k, v in split.items())
    if "fp32_layers" in values:
        if not all(isinstance(n, str) for n in values["fp32_layers"]):
            raise ValueError(f"{path}: 'fp32_layers' must be a list of layer names")
        values["fp32_layers"] = tuple(values["fp32_layers"])
    if values.get("max_queue", 1) < 1 or values.get("batch", 1) < 1:
        raise ValueError(f"{path}: 'max_queue' and 'batch' must be >= 1")
    if values.get("max_variants", 0) < 0:
        raise ValueError(f"{path}: 'max_variants' must be >= 0")
    if "shapes" in values:
        values["shapes"] = tuple(_shape_table(path, f"shapes[{k}]", t) for k, t in enumerate(values["shapes"]))
    if "max_shape" in values:
        values["max_shape"] = _shape_table(path, "max_shape", values["max_shape"])
    return ModelConfig(**values)


def _stat_key(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (0, -1)
    return (st.st_mtime_ns, st.st_size)


def scan(models_dir: str) -> dict[str, ModelEntry]:
    """The models under ``models_dir``; a missing directory is an empty repository (logged)."""
    try:
        names = sorted(os.listdir(models_dir))
    except FileNotFoundError:
        log.warning("model repository %s does not exist; serving no models", models_dir)
        return {}
    except OSError as exc:
        log.error("cannot read model repository %s: %s", models_dir, exc)
        return {}
    out: dict[str, ModelEntry] = {}
    for fname in names:
        full = os.path.join(models_dir, fname)
        if fname.endswith(".onnx") and os.path.isfile(full):
            name, kind = fname[: -len(".onnx")], "file"
        elif os.path.isdir(full) and os.path.isfile(os.path.join(full, MODEL_FILE)):
            name, kind = fname, "dir"
        else:
            continue
        if not MODEL_NAME_RE.match(name):
            log.warning("skipping %s: model names must match %s", full, MODEL_NAME_RE.pattern)
            continue
        if name in out:
            out[name] = ModelEntry(name, out[name].path, error=f"both {name}.onnx and {name}/{MODEL_FILE} exist; "
                                                              "remove one")
            continue
        if kind == "file":
            out[name] = ModelEntry(name, full, ModelConfig(), _stat_key(full))
            continue
        model_path = os.path.join(full, MODEL_FILE)
        cfg_path = os.path.join(full, CONFIG_FILE)
        fp = _stat_key(model_path) + _stat_key(cfg_path)
        cfg, error = ModelConfig(), None
        if os.path.exists(cfg_path):
            try:
                cfg = parse_model_config(cfg_path)
            except (OSError, ValueError, tomllib.TOMLDecodeError) as exc:
                error = f"bad {CONFIG_FILE}: {exc}"
                log.error("model %s: %s", name, error)
        out[name] = ModelEntry(name, model_path, cfg, fp, error)
    return out
