"""Who may do what: roles on the ipc socket from the peer's kernel credentials (real users, created
here as root), protected mode for TCP endpoints, CURVE keys with a role each."""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from inferd.server import keys as K
from inferd.server.testing import DaemonProcess, write_fake_model
from inferd_client import Client, PermissionDenied

X = np.array([1.0, 2.0, 3.0], np.float32)
SPEC = {"inputs": [{"name": "x", "shape": [3], "dtype": "float32"}]}

OPS = {
    "infer": lambda c: c.infer("echo", X), "status": lambda c: c.status()["you"]["role"],
    "models": lambda c: c.models(), "health": lambda c: c.health(),
    "unload": lambda c: c.unload("echo"), "load": lambda c: c.load("echo"),
    "budget": lambda c: c.set_budget("1G"), "reload": lambda c: c.reload(),
}


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- roles on ipc (real users)


class Users:
    """Two groups and three users, removed afterwards: app (socket group), op (both), other (neither)."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.sock_group, self.admin_group = f"ifds{tag}", f"ifda{tag}"
        self.names = {"app": f"ifdapp{tag}", "op": f"ifdop{tag}", "other": f"ifdoth{tag}"}
        self.created: list[tuple[str, str]] = []
        for g in (self.sock_group, self.admin_group):
            self._do(["groupadd", "--system", g], ("groupdel", g))
        groups = {"app": [self.sock_group], "op": [self.sock_group, self.admin_group], "other": []}
        for who, name in self.names.items():
            extra = ["-G", ",".join(groups[who])] if groups[who] else []
            self._do(["useradd", "--system", "-M", "-s", "/usr/sbin/nologin", "-U", *extra, name], ("userdel", name))
        import grp
        import pwd

        self.ids = {}
        for who, name in self.names.items():
            pw = pwd.getpwnam(name)
            self.ids[who] = (pw.pw_uid, pw.pw_gid, [grp.getgrnam(g).gr_gid for g in groups[who]])

    def _do(self, cmd: list[str], undo: tuple[str, str]) -> None:
        r = _run(cmd)
        if r.returncode != 0:
            self.remove()
            pytest.skip(f"cannot create users/groups here ({' '.join(cmd)}: {r.stderr.strip()})")
        self.created.append(undo)

    def remove(self) -> None:
        for cmd, name in reversed(self.created):
            _run([cmd, name])
        self.created.clear()

    def run_as(self, who: str, fn: Callable[[], Any], timeout: float = 30.0) -> Any:
        """``fn()`` in a forked child that has become ``who`` (that user's uid, gid and groups, nothing
        else), its result back through a pipe. A fork rather than a new interpreter: the interpreter
        may live where the test users cannot read it (e.g. under /root), and everything the child
        needs is imported already."""
        uid, gid, extra = self.ids[who]
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 0
            try:
                os.close(r)
                os.setgroups(extra)
                os.setgid(gid)
                os.setuid(uid)
                out = json.dumps({"ok": fn()})
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                out = json.dumps({"error": f"{type(exc).__name__}: {exc}"})
                code = 1
            os.write(w, out.encode())
            os._exit(code)
        os.close(w)
        data = b""
        end = time.monotonic() + timeout
        try:
            while time.monotonic() < end:
                ready, _, _ = select.select([r], [], [], 0.1)
                if ready:
                    chunk = os.read(r, 65536)
                    if not chunk:
                        break
                    data += chunk
            else:
                os.kill(pid, signal.SIGKILL)
        finally:
            os.close(r)
            os.waitpid(pid, 0)
        res = json.loads(data or b'{"error": "child timed out"}')
        assert "error" not in res, res["error"]
        return res["ok"]

    def probe(self, who: str, ep: str, ops: str) -> dict[str, str]:
        """Each op as ``who``: "ok", the op's string result, or "ExceptionName: message"."""

        def fn() -> dict[str, str]:
            out = {}
            with Client(ep, timeout=5) as c:
                for op in ops.split(","):
                    try:
                        r = OPS[op](c)
                        out[op] = r if isinstance(r, str) else "ok"
                    except Exception as exc:  # noqa: BLE001 - reported
                        out[op] = f"{type(exc).__name__}: {exc}"
            return out

        return self.run_as(who, fn)

    def inferctl(self, who: str, args: list[str]) -> tuple[int, str]:
        """``inferctl ARGS`` as ``who``: (exit status, stderr)."""

        def fn() -> tuple[int, str]:
            import io
            from contextlib import redirect_stderr, redirect_stdout

            from inferd_client.cli import main

            err = io.StringIO()
            with redirect_stderr(err), redirect_stdout(io.StringIO()):
                rc = main(args)
            return rc, err.getvalue()

        rc, err = self.run_as(who, fn)
        return rc, err


@pytest.fixture(scope="module")
def roles_env():
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("creating users needs root and useradd")
    users = Users()
    d = Path(tempfile.mkdtemp(prefix="ifdau", dir="/tmp"))
    try:
        os.chmod(d, 0o755)  # the test users must reach the socket's directory; the socket's mode decides
        models = d / "m"
        models.mkdir()
        write_fake_model(models / "echo.onnx", **SPEC)
        daemon = DaemonProcess(f"ipc://{d}/s.sock", models, "--socket-group", users.sock_group,
                               "--admin-group", users.admin_group, log_path=d / "d.log")
        with daemon:
            yield daemon, users
    finally:
        users.remove()
        shutil.rmtree(d, ignore_errors=True)


def test_socket_group_member_infers_but_may_not_administer(roles_env) -> None:
    daemon, users = roles_env
    sock = daemon.endpoint[len("ipc://"):]
    assert oct(os.stat(sock).st_mode & 0o777) == "0o660"
    import grp

    assert grp.getgrgid(os.stat(sock).st_gid).gr_name == users.sock_group
    res = users.probe("app", daemon.endpoint, "infer,status,models,health,unload,load,budget,reload")
    assert res["infer"] == "ok" and res["models"] == "ok" and res["health"] == "ok"
    assert res["status"] == "infer"  # the daemon's view of this client's role
    for op in ("unload", "load", "budget", "reload"):
        assert res[op].startswith("PermissionDenied: PERMISSION_DENIED: permission denied"), (op, res[op])
        assert "admin role" in res[op]
    with Client(daemon.endpoint) as root:
        st = root.status()
        assert st["models"]["echo"]["state"] == "READY"  # the refused unload changed nothing
        assert st["budget_bytes"] == 0
    log = daemon.log_text()
    uid = users.ids["app"][0]
    assert f"permission denied: uid {uid} ({users.names['app']}) pid" in log
    assert "asked for 'unload' on model 'echo' (needs admin, has infer)" in log
    # inferctl: non-zero exit and a message saying so
    rc, err = users.inferctl("app", ["--endpoint", daemon.endpoint, "budget", "2G"])
    assert rc == 4, (rc, err)
    assert "permission" in err.lower() and "set_budget" in err


def test_admin_group_member_may_do_everything(roles_env) -> None:
    daemon, users = roles_env
    res = users.probe("op", daemon.endpoint, "infer,status,unload,load,budget,reload,infer")
    assert res == {"infer": "ok", "status": "admin", "unload": "ok", "load": "ok", "budget": "ok", "reload": "ok"}
    with Client(daemon.endpoint) as root:
        assert root.status()["budget_bytes"] == 1 << 30
        root.set_budget(0)


def test_user_in_neither_group_cannot_connect(roles_env) -> None:
    daemon, users = roles_env
    sock = daemon.endpoint[len("ipc://"):]
    # The socket file keeps it out (0660, socket group) ...
    t0 = time.monotonic()
    res = users.probe("other", daemon.endpoint, "health")
    assert res["health"].startswith("PermissionDenied") and "may not open the daemon's socket" in res["health"]
    assert time.monotonic() - t0 < 4.5  # refused at once, not after the client's 5 s timeout
    # ... and so does the handshake, when the file's mode would let everybody in.
    os.chmod(sock, 0o666)
    try:
        res = users.probe("other", daemon.endpoint, "health,infer")
        for op in ("health", "infer"):
            assert res[op].startswith("PermissionDenied") and "neither the socket_group" in res[op], res
        assert f"refused connection from uid {users.ids['other'][0]}" in daemon.log_text()
        assert users.probe("app", daemon.endpoint, "infer") == {"infer": "ok"}  # the others are still served
    finally:
        os.chmod(sock, 0o660)


# --------------------------------------------------------------------------- protected mode


@pytest.fixture()
def models_dir(tmp_path: Path) -> Path:
    m = tmp_path / "m"
    m.mkdir()
    write_fake_model(m / "echo.onnx", **SPEC)
    return m


def _serve_until_exit(endpoint: str, models: Path, *args: str) -> tuple[int, str]:
    d = DaemonProcess(endpoint, models, *args, log_path=models.parent / "refused.log")
    d.start(wait=False)
    try:
        code = d.wait(timeout=60)
    finally:
        d.kill()
    return code, d.log_text()


def test_remote_tcp_without_curve_is_refused_with_how_to(models_dir: Path) -> None:
    code, log = _serve_until_exit(f"tcp://0.0.0.0:{_free_port()}", models_dir)
    assert code == 2, log
    assert "refusing to serve tcp://0.0.0.0" in log
    assert "inferd keys init" in log and "curve = true" in log and "allow_insecure_remote = true" in log


def test_remote_tcp_with_allow_insecure_remote_starts_and_gives_tcp_role(models_dir: Path) -> None:
    port = _free_port()
    with DaemonProcess(f"ipc://{models_dir.parent}/s.sock", models_dir, "--remote-endpoint", f"tcp://0.0.0.0:{port}",
                       "--allow-insecure-remote", log_path=models_dir.parent / "d.log") as d:
        with Client(f"tcp://127.0.0.1:{port}", timeout=5) as c:
            np.testing.assert_array_equal(c.infer("echo", X)["y"], X * 2 + 1)
            with pytest.raises(PermissionDenied, match="permission denied"):
                c.unload("echo")  # unauthenticated TCP gets tcp_role = infer by default
        assert "WITHOUT authentication or encryption" in d.log_text()


def test_loopback_tcp_starts_with_a_warning(models_dir: Path) -> None:
    port = _free_port()
    with DaemonProcess(f"tcp://127.0.0.1:{port}", models_dir, log_path=models_dir.parent / "d.log") as d:
        with Client(d.endpoint, timeout=5) as c:
            assert c.status()["you"]["role"] == "infer"
        assert "every user of this machine can connect" in d.log_text()


# --------------------------------------------------------------------------- CURVE


def test_curve_keys_roles_and_refusals(models_dir: Path) -> None:
    tmp = models_dir.parent
    kd, cl = tmp / "keys", tmp / "clientkeys"
    K.init(kd)
    robot = K.client(kd, "robot", "infer", cl)
    op = K.client(kd, "op", "admin", cl)
    stranger = K.client(tmp / "otherkeys", "stranger", "admin", tmp / "stranger")  # a key nobody authorised
    server_key = str(kd / "server.key")
    port = _free_port()
    remote = f"tcp://127.0.0.1:{port}"
    with DaemonProcess(f"ipc://{tmp}/s.sock", models_dir, "--remote-endpoint", f"tcp://0.0.0.0:{port}", "--curve",
                       "--keys-dir", str(kd), log_path=tmp / "d.log") as d:
        with Client(remote, timeout=5, key=robot, server_key=server_key) as c_robot, \
                Client(remote, timeout=5, key=op, server_key=server_key) as c_op:
            np.testing.assert_array_equal(c_robot.infer("echo", X)["y"], X * 2 + 1)
            assert c_robot.status()["you"]["who"] == "CURVE key 'robot'"
            with pytest.raises(PermissionDenied, match="'unload' needs the admin role"):
                c_robot.unload("echo")
            assert c_op.unload("echo")["state"] == "UNLOADED"
            assert c_op.load("echo")["state"] == "READY"
            # an unknown key, no key at all, and a known key sent to another daemon's server key are refused at
            # the handshake, at once (the last two with no failure event from ZeroMQ at times: the daemon hangs
            # up, and the client takes repeated hang-ups during the handshake as the refusal)
            K.init(tmp / "otherserver")
            wrong_server = dict(key=robot, server_key=str(tmp / "otherserver" / "server.key"))
            for kw, why in ((dict(key=stranger, server_key=server_key), "not authorised"), ({}, "requires CURVE"),
                            (wrong_server, "server_key is not the daemon's")):
                t0 = time.monotonic()
                with Client(remote, timeout=5, **kw) as bad, pytest.raises(PermissionDenied, match=why):
                    bad.infer("echo", X)
                assert time.monotonic() - t0 < 4.0
            # the daemon keeps serving the authorised clients
            np.testing.assert_array_equal(c_robot.infer("echo", X)["y"], X * 2 + 1)
            r = _run([sys.executable, "-m", "inferd_client.cli", "--endpoint", remote, "--key", str(robot),
                      "--server-key", server_key, "--json", "status"])
            assert r.returncode == 0, r.stderr
            assert json.loads(r.stdout)["you"]["role"] == "infer"
            r = _run([sys.executable, "-m", "inferd_client.cli", "--endpoint", remote, "--key", str(stranger),
                      "--server-key", server_key, "health"])
            assert r.returncode == 4 and "permission denied" in r.stderr
            # withdrawing a key takes effect on reload, for connections already open too
            K.remove(kd, "robot")
            assert c_op.reload()["authorized_keys"] == 1
            with pytest.raises(PermissionDenied, match="no longer"):
                c_robot.infer("echo", X)
        assert "refused a CURVE client: its key" in d.log_text()


def test_curve_needs_the_server_key_pair(models_dir: Path) -> None:
    code, log = _serve_until_exit(f"ipc://{models_dir.parent}/s.sock", models_dir, "--remote-endpoint",
                                  f"tcp://0.0.0.0:{_free_port()}", "--curve", "--keys-dir", str(models_dir.parent / "none"))
    assert code == 2 and "inferd keys init" in log


def test_keys_command_refuses_bad_input(tmp_path: Path) -> None:
    kd = tmp_path / "k"
    K.init(kd)
    assert oct((kd / "server.key_secret").stat().st_mode & 0o777) == "0o600"
    with pytest.raises(K.KeysCommandError, match="exists already"):
        K.init(kd)
    with pytest.raises(K.KeysCommandError, match="client name"):
        K.client(kd, "../evil", "infer", tmp_path)
    (tmp_path / "junk.key").write_text("not a key")
    with pytest.raises(K.KeysCommandError, match="not a readable CURVE key"):
        K.add(kd, tmp_path / "junk.key", "admin", None)
    secret = K.client(kd, "cam", "infer", tmp_path / "out")
    assert oct(secret.stat().st_mode & 0o777) == "0o600"
    # adding a secret key file authorises only its public half
    dest = K.add(kd, secret, "admin", "cam2")
    assert "secret" not in dest.read_text()


def test_inferd_keys_command(tmp_path: Path, capsys) -> None:
    from inferd.cli import main

    kd = str(tmp_path / "k")
    assert main(["keys", "init", "--keys-dir", kd]) == 0
    assert main(["keys", "client", "arm", "--role", "infer", "--keys-dir", kd, "--out", str(tmp_path)]) == 0
    assert "--key arm.key_secret" in capsys.readouterr().out
    assert main(["keys", "list", "--keys-dir", kd]) == 0
    out = capsys.readouterr().out
    assert out.startswith("server: ") and "infer  arm  " in out
    assert main(["keys", "init", "--keys-dir", kd]) == 2  # an existing server key is kept
    assert "--force" in capsys.readouterr().err
    assert main(["keys", "remove", "arm", "--keys-dir", kd]) == 0
    assert main(["keys", "remove", "arm", "--keys-dir", kd]) == 2


def test_protected_mode_tells_loopback_from_the_network() -> None:
    from inferd.config import ConfigError, load_config
    from inferd.server import auth

    assert auth.tcp_host("tcp://[::1]:5599") == "::1" and auth.tcp_host("ipc:///x") is None
    for host in ("127.0.0.1", "127.3.2.1", "::1", "localhost", "lo"):
        assert auth.is_loopback(host), host
    for host in ("0.0.0.0", "*", "::", "10.1.2.3", "192.168.1.20", "eth0"):
        assert not auth.is_loopback(host), host
    cfg = load_config({"endpoint": "tcp://[::1]:5599"}, environ={})
    assert "every user of this machine" in auth.check_endpoints(cfg)[0]
    with pytest.raises(auth.ProtectedModeError, match="allow_insecure_remote"):
        auth.check_endpoints(load_config({"endpoint": "ipc:///tmp/x.sock", "remote_endpoint": "tcp://10.0.0.1:1"},
                                         environ={}))
    assert auth.check_endpoints(load_config({"endpoint": "tcp://0.0.0.0:1", "curve": True}, environ={})) == []
    with pytest.raises(ConfigError, match="no group 'no-such-group-ifd'.*groupadd"):
        auth.Policy.from_config(load_config({"admin_group": "no-such-group-ifd"}, environ={}))
