"""The config layers (defaults < TOML < INFERD_* < flags), the repository scan, sd_notify fallback."""
from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from inferd import config as C
from inferd.server import repository as R
from inferd.server.sdnotify import Notifier, notify_fallback, setup_logging
from inferd_client import protocol as P

REPO = Path(__file__).resolve().parents[1]


def test_defaults_follow_systemd_directories(monkeypatch) -> None:
    monkeypatch.setattr(P, "SYSTEM_SOCKET", "/nonexistent/inferd.sock")
    env = {"RUNTIME_DIRECTORY": "/run/inferd", "CACHE_DIRECTORY": "/var/cache/inferd", "STATE_DIRECTORY": "/var/lib/inferd"}
    cfg = C.load_config(environ=env)
    assert cfg.endpoint == "ipc:///run/inferd/inferd.sock" == P.default_endpoint(env)
    assert cfg.cache_dir == "/var/cache/inferd"
    assert cfg.models_dir == "/var/lib/inferd/models"
    assert (cfg.device, cfg.log_level, cfg.threads, cfg.preload) == ("auto", "info", 0, True)
    bare = C.load_config(environ={"XDG_RUNTIME_DIR": "/run/user/5"})
    assert bare.endpoint == "ipc:///run/user/5/inferd.sock"
    assert bare.cache_dir == os.path.expanduser("~/.cache/inferd")


def test_layers_precedence(tmp_path: Path) -> None:
    toml = tmp_path / "inferd.toml"
    toml.write_text('models = "/from/toml"\ndevice = "vulkan"\nmax_queue = 7\nthreads = 2\n'
                    'max_message_bytes = "1M"\nlog_level = "debug"\n')
    env = {"INFERD_DEVICE": "cpu", "INFERD_MAX_QUEUE": "9", "INFERD_PRELOAD": "false"}
    cfg, cli, path = C.parse_argv(["--config", str(toml), "--max-queue", "11", "--endpoint", "tcp://127.0.0.1:7777"],
                                  environ=env)
    assert path == str(toml) and cfg.config_file == str(toml)
    assert cfg.models_dir == "/from/toml"          # TOML only
    assert cfg.threads == 2 and cfg.log_level == "debug"
    assert cfg.max_message_bytes == 1 << 20        # sizes take units
    assert cfg.device == "cpu"                     # env beats TOML
    assert cfg.preload is False                    # env bool
    assert cfg.max_queue == 11                     # flag beats env
    assert cfg.endpoint == "tcp://127.0.0.1:7777"
    assert cli == {"max_queue": 11, "endpoint": "tcp://127.0.0.1:7777"}
    # INFERD_CONFIG names the file when --config is absent
    cfg2 = C.load_config(environ={"INFERD_CONFIG": str(toml)})
    assert cfg2.models_dir == "/from/toml" and cfg2.device == "vulkan"
    # [inferd] table form
    t2 = tmp_path / "t2.toml"
    t2.write_text('[inferd]\nmodels_dir = "/x"\n')
    assert C.load_config(config_file=str(t2), environ={}).models_dir == "/x"


@pytest.mark.parametrize(
    "toml, env, argv, needle",
    [
        ("devcie = 'cpu'\n", {}, [], "unknown option 'devcie'"),
        ("max_queue = 'many'\n", {}, [], "max_queue"),
        ("max_queue = 0\n", {}, [], "must be >= 1"),
        ("device = 'tpu'\n", {}, [], "expected one of"),
        ("", {"INFERD_PRELOAD": "maybe"}, [], "INFERD_PRELOAD"),
        ("", {"INFERD_THREADS": "x"}, [], "INFERD_THREADS"),
        ("", {}, ["--max-message-bytes", "huge"], "--max-message-bytes"),
        ("", {}, ["--socket-mode", "rw"], "socket_mode"),
        ("switch_interval_us = 10\n", {}, [], "must be >= 50"),
        ("this is = not toml [", {}, [], "config file"),
    ],
)
def test_bad_values_name_their_source(tmp_path: Path, toml: str, env: dict, argv: list, needle: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(toml)
    with pytest.raises(C.ConfigError, match=None) as ei:
        C.parse_argv(["--config", str(f), *argv], environ=env)
    assert needle in str(ei.value), str(ei.value)


def test_missing_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(C.ConfigError, match="does not exist"):
        C.load_config(config_file=str(tmp_path / "nope.toml"), environ={})


def test_shipped_examples_parse() -> None:
    cfg = C.load_config(config_file=str(REPO / "systemd" / "inferd.conf.example"), environ={})
    assert cfg.models_dir == "/var/lib/inferd/models"
    env = {}
    for line in (REPO / "systemd" / "inferd.env.example").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            k, v = line.split("=", 1)
            env[k] = v
    assert env, "the env example should set at least one variable"
    C.read_environ(env)  # every variable it sets must be valid
    assert all(k.startswith("INFERD_") or k in ("LP_NUM_THREADS", "MESA_SHADER_CACHE_DIR") for k in env)


def test_repository_scan(tmp_path: Path) -> None:
    (tmp_path / "a.onnx").write_bytes(b"x")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "model.onnx").write_bytes(b"y")
    (tmp_path / "b" / "config.toml").write_text("preload = false\npriority = 5\nmax_queue = 3\npinned = true\n"
                                                 "device = 'cpu'\nbatch = 2\n")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "model.onnx").write_bytes(b"z")
    (tmp_path / "c" / "config.toml").write_text("prelaod = true\n")
    (tmp_path / "d").mkdir()  # no model.onnx: not a model
    (tmp_path / "notes.txt").write_text("ignored")
    (tmp_path / "bad name!.onnx").write_bytes(b"x")
    (tmp_path / "e.onnx").write_bytes(b"x")
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "model.onnx").write_bytes(b"x")
    repo = R.scan(str(tmp_path))
    assert sorted(repo) == ["a", "b", "c", "e"]
    assert repo["a"].path == str(tmp_path / "a.onnx") and repo["a"].error is None
    assert repo["b"].config == R.ModelConfig(preload=False, priority=5, max_queue=3, pinned=True, device="cpu", batch=2)
    assert repo["c"].error and "prelaod" in repo["c"].error
    assert repo["e"].error and "both" in repo["e"].error
    # fingerprints change when the file does
    fp = repo["a"].fingerprint
    os.utime(tmp_path / "a.onnx", ns=(1, 1))
    assert R.scan(str(tmp_path))["a"].fingerprint != fp
    assert R.scan(str(tmp_path / "missing")) == {}


def test_notify_fallback_path_and_abstract(tmp_path: Path) -> None:
    path = str(tmp_path / "n.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(path)
        assert notify_fallback("READY=1\nSTATUS=hi", path)
        assert s.recv(4096) == b"READY=1\nSTATUS=hi"
        n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"}, use_libsystemd=False)
        assert n.backend == "fallback" and n.watchdog_interval == 1.0
        assert n.watchdog(0.0) and s.recv(100) == b"WATCHDOG=1"
        assert n.stopping() and s.recv(100) == b"STOPPING=1"
    name = f"@inferd-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("\0" + name[1:])
        assert notify_fallback("WATCHDOG=1", name)
        assert s.recv(100) == b"WATCHDOG=1"
    # WATCHDOG_PID of another process: the watchdog is not ours
    assert Notifier({"WATCHDOG_USEC": "1000", "WATCHDOG_PID": "1"}).watchdog_interval is None
    assert not Notifier({}).enabled and not Notifier({}).ready()


@pytest.fixture
def inferd_logger():
    """setup_logging configures the process's "inferd" logger (its own handler, no propagation): put it back,
    or every later test that reads log records through pytest's caplog sees none."""
    import logging

    lg = logging.getLogger("inferd")
    saved = (list(lg.handlers), lg.level, lg.propagate)
    yield lg
    lg.handlers[:] = saved[0]
    lg.setLevel(saved[1])
    lg.propagate = saved[2]


def test_logging_to_stderr_outside_systemd(inferd_logger) -> None:
    assert setup_logging("info", environ={}) == "stderr"
    kind = setup_logging("info", environ={"INVOCATION_ID": "abc"})
    try:
        import systemd.journal  # noqa: F401

        assert kind == "journal"
    except ImportError:
        assert kind == "stderr"
    setup_logging("info", environ={})
