"""The daemon's configuration: one frozen dataclass, every option settable four ways.

Precedence (later wins): built-in defaults < TOML file (``--config FILE`` or ``$INFERD_CONFIG``)
< environment ``INFERD_<OPTION>`` (so systemd's ``EnvironmentFile=`` works) < command-line flags.

TOML keys and environment names follow the field names: ``max_queue = 32`` in the file,
``INFERD_MAX_QUEUE=32`` in the environment, ``--max-queue 32`` on the command line.
``models`` / ``INFERD_MODELS`` / ``--models`` are accepted for ``models_dir``. Sizes take units
(``512M``, ``2GiB``). Unknown TOML keys are errors, so a typo does not go unnoticed.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferd_client.protocol import default_endpoint, parse_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

DEVICES = ("auto", "vulkan", "cpu", "cpu+vulkan")
LOG_LEVELS = ("debug", "info", "warning", "error")
FALLBACKS = ("none", "cpu")


class ConfigError(ValueError):
    """A bad option value; the message names where it came from (file, variable, flag)."""


def default_models_dir(environ: Mapping[str, str]) -> str:
    state = environ.get("STATE_DIRECTORY", "").strip()
    if state:
        return os.path.join(state.split(":")[0], "models")
    return os.path.expanduser("~/.local/share/inferd/models")


def default_cache_dir(environ: Mapping[str, str]) -> str:
    cache = environ.get("CACHE_DIRECTORY", "").strip()
    if cache:
        return cache.split(":")[0]
    return os.path.expanduser("~/.cache/inferd")


def default_keys_dir(environ: Mapping[str, str]) -> str:
    state = environ.get("STATE_DIRECTORY", "").strip()
    if state:
        return os.path.join(state.split(":")[0], "keys")
    return os.path.expanduser("~/.local/share/inferd/keys")


def predictor_path(device: str, environ: Mapping[str, str] | None = None) -> str:
    """Where ``inferd predictor train`` writes, and the planners look for, the latency predictor of ``device``:
    ``$INFERD_PREDICTOR_DIR`` or the cache directory's ``predictor/``, one file per device."""
    env = os.environ if environ is None else environ
    d = env.get("INFERD_PREDICTOR_DIR", "").strip() or os.path.join(default_cache_dir(env), "predictor")
    return os.path.join(d, f"{device}.ipred")


def _opt(kind: str, help: str, *, default: Any = None, choices: Sequence[str] | None = None,
         minimum: float | None = None) -> Any:
    return field(default=default, metadata={"kind": kind, "help": help, "choices": choices, "min": minimum})


@dataclass(frozen=True)
class Config:
    endpoint: str = _opt("str", "ZeroMQ endpoint to bind: ipc://PATH (default: $RUNTIME_DIRECTORY, "
                         "$XDG_RUNTIME_DIR or a temp dir) or tcp://127.0.0.1:PORT", default="")
    models_dir: str = _opt("path", "model repository: DIR/NAME.onnx or DIR/NAME/model.onnx [+ config.toml] "
                           "(default: $STATE_DIRECTORY/models or ~/.local/share/inferd/models)", default="")
    device: str = _opt("str", "compute device for models", default="auto", choices=DEVICES)
    cache_dir: str = _opt("path", "cache directory (default: $CACHE_DIRECTORY or ~/.cache/inferd)", default="")
    log_level: str = _opt("str", "log level", default="info", choices=LOG_LEVELS)
    threads: int = _opt("int", "CPU threads of the native kernels' pool (0: the usable cores)", default=0, minimum=0)
    coexec_threads: int = _opt("int", "CPU threads a cpu+vulkan (co-executed) model's CPU halves may use, so that "
                               "other models are not starved (0: half the pool)", default=0, minimum=0)
    preload: bool = _opt("bool", "load every repository model at start (a model's config.toml can override)",
                         default=True)
    register: bool = _opt("bool", "prepare every repository model that is not preloaded for its first request, in "
                          "idle time after the start: its package compiled where missing or stale, its plan parsed "
                          "(its first request then reads only weights and never compiles)", default=True)
    register_profile: bool = _opt("bool", "registering a model also profiles its package on this device where it was "
                                  "planned from predictions (seconds of idle CPU a model, between requests), so "
                                  "that its first load follows measured costs", default=True)
    max_queue: int = _opt("int", "default per-model queue cap; a full queue answers UNAVAILABLE",
                          default=64, minimum=1)
    max_message_bytes: int = _opt("size", "largest request accepted (header + tensors)",
                                  default=128 * 1024 * 1024, minimum=1024)
    max_header_bytes: int = _opt("size", "largest msgpack header accepted", default=64 * 1024, minimum=256)
    max_tensors: int = _opt("int", "most tensors in one request", default=64, minimum=1)
    max_dims: int = _opt("int", "most dimensions of one tensor", default=8, minimum=1)
    inline_max_us: float = _opt("float", "run a request on the serving thread itself when its model is idle, "
                                "on the CPU and its runs take at most this long (saves two thread hand-offs; "
                                "0: never)", default=1000.0, minimum=0)
    spin_us: float = _opt("float", "after a request run on the serving thread, poll for the next one this long "
                          "before sleeping when requests come close together (the last came within twice this of "
                          "the one before) and no worker thread is busy: back-to-back requests then find the "
                          "thread and its caches awake (0: never)", default=200.0, minimum=0)
    switch_interval_us: float = _opt("float", "the interpreter's GIL switch interval: the longest a thread that wants "
                                     "the GIL (a request's, after its run's native or Vulkan call) waits while another "
                                     "thread runs Python; Python's own 5000 favours throughput", default=500.0,
                                     minimum=50)
    max_variants: int = _opt("int", "input shapes a model with dynamic dimensions keeps prepared besides its first "
                             "(least recently used dropped; a model's config.toml can override)", default=4, minimum=0)
    drain_timeout: float = _opt("float", "seconds SIGTERM waits for queued and running requests",
                                default=30.0, minimum=0)
    memory_budget: int = _opt("size", "memory budget for the models (0: none): least recently used models are "
                              "unloaded to keep it, pinned and busy ones stay; set_budget changes it",
                              default=0, minimum=0)
    device_memory_budget: int = _opt("size", "device (GPU) memory budget for the models placed on Vulkan (0: what a "
                                     "discrete GPU reports, its largest device-local heap; none where the device's "
                                     "memory is the host's, an integrated GPU or lavapipe, whose models count "
                                     "against memory_budget); LRU eviction as on the host",
                                     default=0, minimum=0)
    host_pool: int = _opt("size", "host memory the daemon faults in at start and serves cold loads' weights and "
                          "arenas from (capped at an eighth of the RAM; 0: none): memory faulted in on the way to a "
                          "first answer costs time there", default=256 * 1024 * 1024, minimum=0)
    device_pool: int = _opt("size", "device memory the daemon allocates when it opens the Vulkan device and takes "
                            "models' arenas and weights from (capped at an eighth of its heap; 0: none; read at the "
                            "start): an allocation on the way to a first answer costs time there",
                            default=64 * 1024 * 1024, minimum=0)
    heap_trim: bool = _opt("bool", "give the heap's freed memory back to the system (malloc_trim) in idle time after a "
                           "cold load settles and after a model is closed: what loads, warm switches and compiles "
                           "freed otherwise stays in the RSS", default=True)
    rehearse: bool = _opt("bool", "at the start, compile a small built-in model into a temporary package and load it "
                          "cold once, in the background: the first model a client asks for then finds the cold "
                          "load's code warm (inferd.runtime.rehearsal)", default=True)
    resident_pipelines: int = _opt("int", "Vulkan pipelines created at start in the background: the device's most "
                                   "recently used ones (its list in the cache directory), so that a cold load of a "
                                   "model served before creates none (0: none)", default=128, minimum=0)
    memory_pressure: str = _opt("str", "memory pressure (PSI) watched as a budget source: auto (this cgroup's "
                                "memory.pressure, else /proc/pressure/memory), off, or a path; an event caps a "
                                "budget in force below what the models hold, relaxed while no event comes", default="auto")
    socket_mode: str = _opt("str", "octal permission bits for the ipc socket file, e.g. 0660 (empty: 0660 "
                            "when socket_group is set, else the umask's)", default="")
    socket_group: str = _opt("str", "group of the ipc socket: its members may connect and infer (empty: the "
                             "daemon's own group)", default="")
    admin_group: str = _opt("str", "members of this group may also load, unload, set the budget and reload "
                            "(root and the daemon's own user always may; empty: nobody else)", default="")
    remote_endpoint: str = _opt("str", "a second endpoint to bind beside 'endpoint', for other machines, e.g. "
                                "tcp://0.0.0.0:5599 (needs curve = true or allow_insecure_remote)", default="")
    curve: bool = _opt("bool", "require CURVE (encryption + client keys) on every TCP endpoint; the keys come "
                       "from keys_dir ('inferd keys init')", default=False)
    keys_dir: str = _opt("path", "CURVE keys: server.key, server.key_secret, clients/admin/*.key, "
                         "clients/infer/*.key (default: $STATE_DIRECTORY/keys or ~/.local/share/inferd/keys)",
                         default="")
    allow_insecure_remote: bool = _opt("bool", "serve a non-loopback TCP endpoint without CURVE: anyone on the "
                                       "network can connect, unencrypted", default=False)
    tcp_role: str = _opt("str", "role of TCP clients without CURVE (loopback, or remote with "
                         "allow_insecure_remote)", default="infer", choices=("infer", "admin"))
    max_inflight_per_client: int = _opt("int", "requests one client (a process on ipc, a key on CURVE, a "
                                        "connection on plain TCP) may have queued or running; more are "
                                        "answered UNAVAILABLE with a retry hint", default=32, minimum=1)
    stall_timeout: float = _opt("float", "stop the systemd watchdog when one run lasts longer than this many "
                                "seconds, so systemd restarts a hung daemon (0: off)", default=0.0, minimum=0)
    cache_max_bytes: int = _opt("size", "largest size of the compiled packages in the cache; the least recently "
                                "used go first (0: half of what the cache could grow to at start, at most 8 GiB)",
                                default=0, minimum=0)
    fallback: str = _opt("str", "where a GPU model is served while its device recovers from a fault, or when "
                         "it does not fit in device memory ('cpu', or 'none': requests wait or get UNAVAILABLE); "
                         "a model's config.toml can override", default="none", choices=FALLBACKS)
    gpu_timeout: float = _opt("float", "seconds a GPU dispatch may take before it counts as hung: the request is "
                              "retried and the device recreated", default=60.0, minimum=0.1)
    config_file: str = field(default="", metadata={"kind": "internal", "help": "the TOML file read, if any"})

    def replace(self, **changes: Any) -> Config:
        return dataclasses.replace(self, **changes)


OPTIONS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(Config)
                                        if f.metadata.get("kind") != "internal"}
ALIASES = {"models": "models_dir"}


def _convert(name: str, value: Any, source: str) -> Any:
    meta = OPTIONS[name].metadata
    kind = meta["kind"]
    where = f"{source}: option {name!r}"
    try:
        if kind in ("str", "path"):
            if not isinstance(value, str):
                raise ConfigError(f"{where}: expected a string, got {value!r}")
            out: Any = os.path.expanduser(value.strip()) if kind == "path" else value.strip()
        elif kind == "bool":
            if isinstance(value, bool):
                out = value
            elif isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
                out = True
            elif isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off"):
                out = False
            else:
                raise ConfigError(f"{where}: expected a boolean (true/false), got {value!r}")
        elif kind == "int":
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise ConfigError(f"{where}: expected an integer, got {value!r}")
            out = int(value)
        elif kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise ConfigError(f"{where}: expected a number, got {value!r}")
            out = float(value)
        elif kind == "size":
            out = parse_size(value if not isinstance(value, float) else int(value))
        else:  # pragma: no cover
            raise AssertionError(kind)
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    choices = meta.get("choices")
    if choices and out.lower() not in choices:
        raise ConfigError(f"{where}: expected one of {list(choices)}, got {value!r}")
    if choices:
        out = out.lower()
    minimum = meta.get("min")
    if minimum is not None and out < minimum:
        raise ConfigError(f"{where}: must be >= {minimum}, got {value!r}")
    return out


def _canonical(key: str) -> str | None:
    key = ALIASES.get(key, key)
    return key if key in OPTIONS else None


def read_toml(path: str) -> dict[str, Any]:
    """The options of a TOML config file (top level, or an ``[inferd]`` table), converted and checked."""
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    if isinstance(data.get("inferd"), dict):
        data = {**{k: v for k, v in data.items() if k != "inferd"}, **data["inferd"]}
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = _canonical(key)
        if name is None:
            raise ConfigError(f"config file {path}: unknown option {key!r}; known: {sorted(OPTIONS)}")
        out[name] = _convert(name, value, f"config file {path}")
    return out


def read_environ(environ: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in OPTIONS:
        var = "INFERD_" + name.upper()
        if var in environ and environ[var] != "":
            out[name] = _convert(name, environ[var], f"environment {var}")
    if "models_dir" not in out and environ.get("INFERD_MODELS"):
        out["models_dir"] = _convert("models_dir", environ["INFERD_MODELS"], "environment INFERD_MODELS")
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--config`` and one flag per option; unset flags stay None so lower layers show through."""
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="TOML config file (default: $INFERD_CONFIG if set)")
    for name, f in OPTIONS.items():
        meta = f.metadata
        flags = ["--" + name.replace("_", "-")]
        if name == "models_dir":
            flags = ["--models", "--models-dir"]
        kw: dict[str, Any] = {"dest": name, "default": None, "help": meta["help"]}
        if meta["kind"] == "bool":
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["metavar"] = name.upper() if not meta.get("choices") else "{" + ",".join(meta["choices"]) + "}"
        parser.add_argument(*flags, **kw)


def cli_overrides(ns: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in OPTIONS:
        value = getattr(ns, name, None)
        if value is not None:
            out[name] = _convert(name, value, "command line --" + name.replace("_", "-"))
    return out


def load_config(
    cli: Mapping[str, Any] | None = None,
    config_file: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Merge the layers. ``cli`` holds already-converted flag values (see :func:`cli_overrides`)."""
    env = os.environ if environ is None else environ
    path = config_file or env.get("INFERD_CONFIG") or ""
    values: dict[str, Any] = {}
    if path:
        values.update(read_toml(path))
    values.update(read_environ(env))
    values.update(cli or {})
    if not values.get("endpoint"):
        values["endpoint"] = default_endpoint(env)
    if not values.get("models_dir"):
        values["models_dir"] = default_models_dir(env)
    if not values.get("cache_dir"):
        values["cache_dir"] = default_cache_dir(env)
    if not values.get("keys_dir"):
        values["keys_dir"] = default_keys_dir(env)
    remote = values.get("remote_endpoint", "")
    if remote and not remote.startswith("tcp://"):
        raise ConfigError(f"option 'remote_endpoint': expected tcp://ADDRESS:PORT, got {remote!r}")
    if values.get("socket_mode"):
        try:
            mode = int(values["socket_mode"], 8)
        except ValueError:
            raise ConfigError(f"option 'socket_mode': expected octal bits like 0660, got {values['socket_mode']!r}") from None
        if not 0 <= mode <= 0o777:
            raise ConfigError(f"option 'socket_mode': out of range: {values['socket_mode']!r}")
    return Config(**values, config_file=path)


def parse_argv(argv: Sequence[str] | None, prog: str = "inferd serve",
               environ: Mapping[str, str] | None = None) -> tuple[Config, dict[str, Any], str | None]:
    """(config, cli overrides, config file) from a command line; SIGHUP re-merges with the last two."""
    parser = argparse.ArgumentParser(prog=prog, description="Run the inferd daemon in the foreground.")
    add_arguments(parser)
    ns = parser.parse_args(list(argv) if argv is not None else None)
    cli = cli_overrides(ns)
    return load_config(cli, ns.config, environ), cli, ns.config
