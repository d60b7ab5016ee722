"""Who may connect and what they may do: roles, ZAP authentication, protected mode, client shares.

Every connection goes through ZeroMQ's ZAP handshake, answered by :class:`Authenticator` (pyzmq's
ThreadAuthenticator, on its own thread of the daemon's context):

* ipc: libzmq reads the peer's credentials with ``SO_PEERCRED`` when it accepts the connection and
  hands them to ZAP as the address (``...:uid:gid:pid``). The handler adds the process's
  supplementary groups (``/proc/PID/status``, where the kernel keeps them) and :class:`Policy`
  decides the role: root and the daemon's own user are ``admin``, members of ``admin_group``
  ``admin``, members of ``socket_group`` ``infer``, anybody else is refused at the handshake,
  whatever the socket file's mode lets through.
* TCP with CURVE: the client's public key must be one of the authorised keys (``keys_dir/clients/
  ROLE/NAME.key``); the directory it lies in is its role. Unknown keys and clients without a key
  are refused at the handshake.
* TCP without CURVE (loopback, or remote with ``allow_insecure_remote``): nobody is identified;
  every client gets ``tcp_role``.

The handshake's verdict travels with every message as its ``User-Id`` (a description of the peer,
see :func:`Policy.resolve`); the serving thread maps it to a :class:`Peer` through the current
policy, so a reload that changes the groups or the keys applies to open connections too.
"""
from __future__ import annotations

import grp
import inspect
import ipaddress
import logging
import os
import pwd
import socket
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
from zmq.auth.certs import load_certificate
from zmq.auth.thread import ThreadAuthenticator

from inferd_client import protocol as P

from ..config import Config, ConfigError

log = logging.getLogger("inferd.auth")

# One ZAP domain per kind of bind, so that the handler knows the transport of a request
# (the address alone does not tell "localhost:0:0:42" on ipc from an IPv6 peer on TCP).
ZAP_DOMAIN_IPC = "inferd-ipc"
ZAP_DOMAIN_TCP = "inferd-tcp"

SERVER_PUBLIC = "server.key"
SERVER_SECRET = "server.key_secret"
CLIENTS_DIR = "clients"


class ProtectedModeError(RuntimeError):
    """An endpoint the configuration must not serve as it stands; the message says what to change."""


class KeysError(RuntimeError):
    """The CURVE keys are missing or unsafe; the message says how to fix it."""


@dataclass(frozen=True)
class Peer:
    """One connected client as the serving thread sees it."""

    transport: str          # "ipc", "curve" or "tcp"
    role: str | None        # None: refused
    client: str             # fair-share key ("" on plain TCP: each connection is its own client)
    desc: str               # for logs and messages: who it is
    reason: str = ""        # why role is None


# --------------------------------------------------------------------------- peer credentials


def peer_groups(pid: int, uid: int, gid: int) -> set[int]:
    """The groups of the process ``pid`` as the kernel holds them (what the socket file's permissions
    were checked against), its primary group included. Falls back to the user database when the
    process cannot be read or is no longer the one that connected (uid differs)."""
    groups = {gid}
    try:
        with open(f"/proc/{pid}/status") as fh:
            fields = dict(line.split(":", 1) for line in fh if ":" in line)
        uids = [int(u) for u in fields.get("Uid", "").split()]
        if len(uids) >= 2 and uids[1] == uid:  # effective uid, which SO_PEERCRED reports
            return groups | {int(g) for g in fields.get("Groups", "").split()}
    except (OSError, ValueError):
        pass
    try:
        return groups | set(os.getgrouplist(pwd.getpwuid(uid).pw_name, gid))
    except (KeyError, OSError):
        return groups


def ipc_user_id(address: str) -> str | None:
    """The User-Id for an ipc peer from ZAP's address (``<host>:uid:gid:pid``); None if it carries no
    credentials (a platform without SO_PEERCRED)."""
    parts = address.rsplit(":", 3)
    if len(parts) != 4:
        return None
    try:
        uid, gid, pid = int(parts[1]), int(parts[2]), int(parts[3])
    except ValueError:
        return None
    groups = ",".join(str(g) for g in sorted(peer_groups(pid, uid, gid)))
    return f"ipc {uid} {gid} {pid} {groups}"


def _group_id(option: str, name: str) -> int | None:
    """The gid of a group option; a group this system lacks is a configuration error (checked when
    the daemon starts or reloads, not when a config file is parsed elsewhere)."""
    if not name:
        return None
    try:
        return int(name) if name.isdigit() else grp.getgrnam(name).gr_gid
    except KeyError:
        raise ConfigError(f"option {option!r}: no group {name!r} on this system (create it: sudo groupadd "
                          f"--system {name})") from None


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


# --------------------------------------------------------------------------- keys


def load_server_keys(keys_dir: str) -> tuple[bytes, bytes]:
    """(public, secret) z85 keys of the server; refuses a missing or group/world-readable secret."""
    path = Path(keys_dir) / SERVER_SECRET
    if not path.exists():
        raise KeysError(f"curve = true, but there is no server key pair in {keys_dir} ({path} is missing): "
                        f"create it with `inferd keys init --keys-dir {keys_dir}`")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise KeysError(f"{path} is readable by others (mode {mode:04o}); it holds the server's secret key: "
                        f"`chmod 600 {path}`")
    try:
        public, secret = load_certificate(path)
    except (OSError, ValueError) as exc:
        raise KeysError(f"{path}: not a CURVE secret key file ({exc}); re-create it with `inferd keys init --force`") from None
    if not secret:
        raise KeysError(f"{path} holds no secret key; re-create it with `inferd keys init --force`")
    return public, secret


def load_authorized_keys(keys_dir: str) -> dict[str, tuple[str, str]]:
    """{z85 public key: (role, name)} from ``keys_dir/clients/ROLE/NAME.key``. Unreadable files are
    skipped with a warning; a key under both roles gets the lesser one."""
    out: dict[str, tuple[str, str]] = {}
    for role in (P.ROLE_ADMIN, P.ROLE_INFER):  # infer last: it wins a conflict
        d = Path(keys_dir) / CLIENTS_DIR / role
        if not d.is_dir():
            continue
        for f in sorted(d.glob("*.key")):
            try:
                public, _ = load_certificate(f)
            except (OSError, ValueError) as exc:
                log.warning("authorised key %s unreadable, ignored: %s", f, exc)
                continue
            key = public.decode("ascii")
            if key in out and out[key][0] != role:
                log.warning("key %s is authorised as %s (%s) and as %s (%s): using %s",
                            key, out[key][0], out[key][1], role, f.stem, role)
            out[key] = (role, f.stem)
    return out


# --------------------------------------------------------------------------- policy


@dataclass(frozen=True)
class Policy:
    """The role of each peer under one configuration (replaced whole on reload)."""

    daemon_uid: int
    socket_gid: int | None
    admin_gid: int | None
    tcp_role: str
    socket_group: str = ""
    admin_group: str = ""
    keys: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: Config) -> Policy:
        """Raises ConfigError for a group that does not exist."""
        keys = load_authorized_keys(config.keys_dir) if config.curve else {}
        socket_gid = _group_id("socket_group", config.socket_group)
        return cls(daemon_uid=os.geteuid(),
                   # Without socket_group the socket file has the daemon's group, as before roles existed.
                   socket_gid=os.getegid() if socket_gid is None else socket_gid,
                   admin_gid=_group_id("admin_group", config.admin_group), tcp_role=config.tcp_role,
                   socket_group=config.socket_group or _group_name(os.getegid()),
                   admin_group=config.admin_group, keys=keys)

    def ipc_role(self, uid: int, groups: set[int]) -> str | None:
        if uid == 0 or uid == self.daemon_uid:
            return P.ROLE_ADMIN
        if self.admin_gid is not None and self.admin_gid in groups:
            return P.ROLE_ADMIN
        if self.socket_gid is not None and self.socket_gid in groups:
            return P.ROLE_INFER
        return None

    def resolve(self, user_id: str) -> Peer:
        """The peer a ZAP User-Id describes: ``ipc UID GID PID G1,G2``, ``curve Z85KEY`` or ``tcp ADDRESS``."""
        parts = user_id.split(" ")
        kind = parts[0]
        if kind == "ipc" and len(parts) == 5:
            uid, pid = int(parts[1]), int(parts[3])
            groups = {int(g) for g in parts[4].split(",") if g}
            role = self.ipc_role(uid, groups)
            desc = f"uid {uid} ({_user_name(uid)}) pid {pid} on ipc"
            reason = "" if role else (f"user {_user_name(uid)} (uid {uid}) is in neither socket_group "
                                      f"{self.socket_group!r} nor admin_group {self.admin_group or '(unset)'!r}")
            return Peer("ipc", role, f"pid {pid}", desc, reason)
        if kind == "curve" and len(parts) == 2:
            found = self.keys.get(parts[1])
            if found is None:
                return Peer("curve", None, "", f"CURVE key {parts[1]}", "the client key is not (or no longer) authorised")
            role, name = found
            return Peer("curve", role, f"key {name}", f"CURVE key {name!r}")
        if kind == "tcp" and len(parts) == 2:
            return Peer("tcp", self.tcp_role, "", f"{parts[1]} on TCP without CURVE")
        return Peer("?", None, "", f"unknown peer {user_id!r}", "the connection was not authenticated")


UNAUTHENTICATED = Peer("?", None, "", "an unauthenticated connection",
                       "the connection was not authenticated (no ZAP verdict)")


# --------------------------------------------------------------------------- ZAP


class Authenticator(ThreadAuthenticator):
    """pyzmq's ZAP thread with inferd's decisions: peer credentials on ipc, role-tagged CURVE keys."""

    def __init__(self, context: zmq.Context, policy: Callable[[], Policy]) -> None:
        super().__init__(context, log=logging.getLogger("inferd.auth.zap"))
        self._policy = policy
        self.configure_curve_callback(ZAP_DOMAIN_TCP, self)

    def callback(self, domain: str, key: bytes) -> bool:
        """pyzmq's CURVE credentials provider: is this client key authorised?"""
        ok = key.decode("ascii") in self._policy().keys
        if not ok:
            log.warning("refused a CURVE client: its key %s is not authorised (keys_dir/clients/ROLE/)",
                        key.decode("ascii"))
        return ok

    def curve_user_id(self, client_public_key: bytes) -> str:
        return "curve " + super().curve_user_id(client_public_key)

    def _handle_null(self, msg: list[bytes]) -> bool:
        """Answer a NULL-mechanism ZAP request (ipc, or TCP without CURVE); False for the others."""
        if len(msg) < 6 or msg[5] != b"NULL":
            return False
        request_id, domain, address = msg[1], msg[2].decode("utf-8", "replace"), msg[3].decode("utf-8", "replace")
        try:
            if domain == ZAP_DOMAIN_IPC:
                user_id = ipc_user_id(address)
                if user_id is None:
                    self._send_zap_reply(request_id, b"400", b"no peer credentials")
                    log.warning("refused an ipc connection without peer credentials (%s)", address)
                    return True
            else:
                user_id = f"tcp {address or '?'}"
            peer = self._policy().resolve(user_id)
        except Exception as exc:  # a bug here must refuse the connection, never admit it
            log.exception("ZAP request from %s failed", address)
            self._send_zap_reply(request_id, b"500", f"internal error: {type(exc).__name__}".encode())
            return True
        if peer.role is None:
            log.warning("refused connection from %s: %s", peer.desc, peer.reason)
            self._send_zap_reply(request_id, b"400", peer.reason.encode()[:255])
        else:
            log.debug("connection from %s: role %s", peer.desc, peer.role)
            self._send_zap_reply(request_id, b"200", b"OK", user_id)
        return True

    # pyzmq >= 25 awaits the handler; older versions call it. CURVE goes to pyzmq's own handling,
    # which checks the key through callback().
    if inspect.iscoroutinefunction(ThreadAuthenticator.handle_zap_message):
        async def handle_zap_message(self, msg: list[bytes]) -> None:
            if not self._handle_null(msg):
                await super().handle_zap_message(msg)
    else:  # pragma: no cover - older pyzmq
        def handle_zap_message(self, msg: list[bytes]) -> None:  # type: ignore[misc]
            if not self._handle_null(msg):
                super().handle_zap_message(msg)


# --------------------------------------------------------------------------- protected mode


def tcp_host(endpoint: str) -> str | None:
    """The host part of ``tcp://HOST:PORT`` (brackets of IPv6 removed), None for other transports."""
    if not endpoint.startswith("tcp://"):
        return None
    rest = endpoint[len("tcp://"):]
    rest = rest.split(";", 1)[-1]  # tcp://source;dest: the bind side is the destination
    host = rest.rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def is_loopback(host: str) -> bool:
    """True when ``host`` (an address, a name or an interface) only reaches this machine."""
    if host in ("lo", "localhost"):
        return True
    if host in ("*", "0.0.0.0", "::", ""):
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False  # an interface name, or unresolvable: assume the network can reach it
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos)


def check_endpoints(config: Config) -> list[str]:
    """Protected mode, as Redis does it: raises ProtectedModeError for an endpoint that other machines
    could reach without authentication; returns the warnings to log for the ones allowed."""
    warnings: list[str] = []
    for ep in [config.endpoint, config.remote_endpoint]:
        if not ep or ep.startswith("ipc://"):
            continue
        host = tcp_host(ep)
        if host is None:
            if config.allow_insecure_remote:
                warnings.append(f"{ep}: served without authentication (allow_insecure_remote = true)")
                continue
            raise ProtectedModeError(f"refusing to serve {ep}: only ipc:// and tcp:// endpoints are checked for "
                                     "authentication; use one of those, or set allow_insecure_remote = true")
        if config.curve:
            continue
        if is_loopback(host):
            warnings.append(f"{ep}: every user of this machine can connect to this loopback TCP endpoint (unlike the "
                            f"ipc socket, which checks each process's user and groups); they get the "
                            f"{config.tcp_role!r} role (tcp_role). Set curve = true to require keys.")
            continue
        if config.allow_insecure_remote:
            warnings.append(f"{ep}: serving the network WITHOUT authentication or encryption "
                            f"(allow_insecure_remote = true); anyone who reaches it gets the {config.tcp_role!r} role")
            continue
        raise ProtectedModeError(
            f"refusing to serve {ep}: other machines can reach it and nothing would authenticate them or "
            f"encrypt their traffic (protected mode). Either:\n"
            f"  1. require CURVE keys: run `inferd keys init` (writes the server key pair to {config.keys_dir}), "
            f"authorise each client with `inferd keys client NAME --role infer` (or `inferd keys add CLIENT.key "
            f"--role infer`), and set `curve = true` in the config file (or --curve, or INFERD_CURVE=1); clients "
            f"then pass --key NAME.key_secret --server-key {config.keys_dir}/{SERVER_PUBLIC}; or\n"
            f"  2. serve it open on purpose: set `allow_insecure_remote = true` in the config file "
            f"(or --allow-insecure-remote, or INFERD_ALLOW_INSECURE_REMOTE=1).\n"
            f"To serve this machine only, bind tcp://127.0.0.1:PORT or use the ipc socket instead.")
    return warnings


def admin_members_outside_socket_group(policy: Policy) -> list[str]:
    """Members of admin_group who cannot reach a socket file only socket_group may open."""
    if policy.admin_gid is None or policy.socket_gid is None or policy.admin_gid == policy.socket_gid:
        return []
    try:
        admins = set(grp.getgrgid(policy.admin_gid).gr_mem)
        sock = grp.getgrgid(policy.socket_gid)
    except KeyError:
        return []
    out = []
    for user in sorted(admins):
        try:
            primary = pwd.getpwnam(user).pw_gid
        except KeyError:
            continue
        if user not in sock.gr_mem and primary != policy.socket_gid:
            out.append(user)
    return out


def socket_group_setup(path: str, policy: Policy, config: Config) -> None:
    """Give the ipc socket file its group and mode (0660 by default once socket_group is set)."""
    mode_s = config.socket_mode or ("0660" if config.socket_group else "")
    if config.socket_group and policy.socket_gid is not None:
        try:
            os.chown(path, -1, policy.socket_gid)
        except PermissionError:
            raise ProtectedModeError(
                f"cannot give {path} the group {config.socket_group!r}: the daemon's user "
                f"{_user_name(os.geteuid())} is not a member of it (add it: sudo usermod -aG "
                f"{config.socket_group} {_user_name(os.geteuid())}, or run the service with Group={config.socket_group})"
            ) from None
    if mode_s:
        os.chmod(path, int(mode_s, 8))
    if config.socket_group and policy.socket_gid is not None:
        parent = os.path.dirname(path) or "."
        st = os.stat(parent)
        if not (st.st_mode & stat.S_IXOTH or (st.st_gid == policy.socket_gid and st.st_mode & stat.S_IXGRP)):
            log.warning("members of socket_group %r cannot enter %s (mode %04o), so they cannot reach the socket; "
                        "give that directory the group and g+x, or choose another endpoint",
                        config.socket_group, parent, stat.S_IMODE(st.st_mode))


def describe(config: Config, policy: Policy) -> dict[str, Any]:
    """The security part of ``status``."""
    return {"socket_group": policy.socket_group, "admin_group": config.admin_group or None,
            "curve": config.curve, "authorized_keys": len(policy.keys), "tcp_role": config.tcp_role,
            "max_inflight_per_client": config.max_inflight_per_client}
