"""``inferd keys``: the CURVE keys of the daemon and of the clients it lets in over TCP.

    inferd keys init [--force] [--owner USER]            the server's key pair (secret: 0600)
    inferd keys client NAME --role infer|admin [--out DIR]  a new client key pair; its public key authorised
    inferd keys add FILE.key --role infer|admin [--name NAME]   authorise a client's existing public key
    inferd keys list                                      the server's public key, the authorised clients
    inferd keys remove NAME                               withdraw a client's key

Layout of ``keys_dir`` (config option; default $STATE_DIRECTORY/keys, /var/lib/inferd/keys under
systemd)::

    server.key  server.key_secret  clients/admin/NAME.key  clients/infer/NAME.key

Key files are pyzmq's (``zmq.auth``) format. The daemon reads the authorised keys at start and on
``systemctl reload inferd`` / ``inferctl reload``. Every command takes ``--config`` and
``--keys-dir`` like ``inferd serve``.
"""
from __future__ import annotations

import argparse
import os
import pwd
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import zmq.auth

from inferd_client import protocol as P

from ..config import ConfigError, load_config
from .auth import CLIENTS_DIR, SERVER_PUBLIC, SERVER_SECRET

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


class KeysCommandError(Exception):
    pass


def _owner(user: str | None) -> tuple[int, int] | None:
    if not user:
        return None
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise KeysCommandError(f"--owner: no user {user!r}") from None
    return pw.pw_uid, pw.pw_gid


def _chown(path: Path, owner: tuple[int, int] | None) -> None:
    if owner is not None:
        os.chown(path, *owner)


def _private_dir(path: Path, owner: tuple[int, int] | None) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    _chown(path, owner)


def _new_pair(name: str, where: Path) -> tuple[Path, Path, Path]:
    """A fresh key pair made in a private (0700) temporary directory under ``where``, so that the
    secret is never readable by others, not even between its creation and its chmod, and can be
    renamed into place on the same file system: (tmpdir, public, secret)."""
    tmp = Path(tempfile.mkdtemp(prefix=".new-", dir=where))
    public, secret = zmq.auth.create_certificates(str(tmp), name)
    os.chmod(secret, 0o600)
    os.chmod(public, 0o644)
    return tmp, Path(public), Path(secret)


def init(keys_dir: Path, force: bool = False, owner: tuple[int, int] | None = None) -> Path:
    secret = keys_dir / SERVER_SECRET
    if secret.exists() and not force:
        raise KeysCommandError(f"{secret} exists already: every client's --server-key would have to change; "
                               "pass --force to replace it")
    _private_dir(keys_dir, owner)
    for role in P.ROLES:
        _private_dir(keys_dir / CLIENTS_DIR / role, owner)
    tmp, pub, sec = _new_pair("server", keys_dir)
    try:
        for src, dst in ((sec, secret), (pub, keys_dir / SERVER_PUBLIC)):
            _chown(src, owner)
            os.replace(src, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return keys_dir / SERVER_PUBLIC


def _check_role(role: str) -> str:
    if role not in P.ROLES:
        raise KeysCommandError(f"--role must be one of {list(P.ROLES)}, got {role!r}")
    return role


def _check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise KeysCommandError(f"client name {name!r}: use letters, digits, '_', '.', '-' (at most 64)")
    return name


def _authorised(keys_dir: Path, name: str) -> list[Path]:
    return [p for role in P.ROLES for p in [keys_dir / CLIENTS_DIR / role / f"{name}.key"] if p.exists()]


def client(keys_dir: Path, name: str, role: str, out: Path, owner: tuple[int, int] | None = None) -> Path:
    _check_name(name)
    _check_role(role)
    if _authorised(keys_dir, name):
        raise KeysCommandError(f"a client named {name!r} is authorised already ({_authorised(keys_dir, name)[0]}); "
                               f"`inferd keys remove {name}` first, or pick another name")
    dest_secret = out / f"{name}.key_secret"
    if dest_secret.exists():
        raise KeysCommandError(f"{dest_secret} exists already; not overwriting a key someone may use")
    _private_dir(keys_dir / CLIENTS_DIR / role, owner)
    out.mkdir(parents=True, exist_ok=True)
    tmp, pub, sec = _new_pair(name, keys_dir)
    try:
        shutil.copy2(pub, keys_dir / CLIENTS_DIR / role / f"{name}.key")
        _chown(keys_dir / CLIENTS_DIR / role / f"{name}.key", owner)
        fd = os.open(dest_secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(sec.read_bytes())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest_secret


def add(keys_dir: Path, file: Path, role: str, name: str | None, owner: tuple[int, int] | None = None) -> Path:
    _check_role(role)
    name = _check_name(name or file.name.removesuffix(".key_secret").removesuffix(".key"))
    try:
        public, _ = zmq.auth.load_certificate(str(file))
    except (OSError, ValueError) as exc:
        raise KeysCommandError(f"{file}: not a readable CURVE key file ({exc})") from None
    if _authorised(keys_dir, name):
        raise KeysCommandError(f"a client named {name!r} is authorised already; `inferd keys remove {name}` first")
    _private_dir(keys_dir / CLIENTS_DIR / role, owner)
    dest = keys_dir / CLIENTS_DIR / role / f"{name}.key"
    # Only the public half goes into the daemon's directory, even when handed a secret file.
    dest.write_text(f"#   ZeroMQ CURVE public key of inferd client {name!r} (role {role})\n"
                    f"curve\n    public-key = \"{public.decode('ascii')}\"\n")
    _chown(dest, owner)
    return dest


def remove(keys_dir: Path, name: str) -> list[Path]:
    found = _authorised(keys_dir, _check_name(name))
    if not found:
        raise KeysCommandError(f"no authorised client named {name!r} under {keys_dir / CLIENTS_DIR}")
    for p in found:
        p.unlink()
    return found


def listing(keys_dir: Path) -> list[str]:
    lines = []
    pub = keys_dir / SERVER_PUBLIC
    if pub.exists():
        lines.append(f"server: {zmq.auth.load_certificate(str(pub))[0].decode()}  ({pub})")
    else:
        lines.append(f"server: no key pair in {keys_dir} (inferd keys init)")
    for role in P.ROLES:
        for f in sorted((keys_dir / CLIENTS_DIR / role).glob("*.key")):
            try:
                key = zmq.auth.load_certificate(str(f))[0].decode()
            except (OSError, ValueError) as exc:
                key = f"unreadable: {exc}"
            lines.append(f"{role:5s}  {f.stem}  {key}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="FILE", default=None, help="daemon config file (for keys_dir)")
    common.add_argument("--keys-dir", default=None, help="overrides the config's keys_dir")
    common.add_argument("--owner", default=None, metavar="USER",
                        help="owner of the files written (the daemon's user, e.g. inferd, when run as root)")
    p = argparse.ArgumentParser(prog="inferd keys", description="CURVE keys of the daemon and its TCP clients.")
    sub = p.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("init", parents=[common], help="create the server's key pair")
    sp.add_argument("--force", action="store_true", help="replace an existing key pair")
    sp = sub.add_parser("client", parents=[common], help="create a client key pair and authorise it")
    sp.add_argument("name")
    sp.add_argument("--role", required=True, choices=P.ROLES)
    sp.add_argument("--out", default=".", help="where the client's secret key file goes (default: here)")
    sp = sub.add_parser("add", parents=[common], help="authorise an existing client public key file")
    sp.add_argument("file")
    sp.add_argument("--role", required=True, choices=P.ROLES)
    sp.add_argument("--name", default=None, help="client name (default: the file's name)")
    sub.add_parser("list", parents=[common], help="the server's public key and the authorised clients")
    sp = sub.add_parser("remove", parents=[common], help="withdraw a client's key")
    sp.add_argument("name")
    args = p.parse_args(list(argv) if argv is not None else None)
    try:
        cli = {"keys_dir": os.path.expanduser(args.keys_dir)} if args.keys_dir else {}
        keys_dir = Path(load_config(cli, args.config).keys_dir)
        owner = _owner(args.owner)
        reload_hint = "the daemon picks it up on `systemctl reload inferd` or `inferctl reload`"
        if args.cmd == "init":
            pub = init(keys_dir, args.force, owner)
            print(f"server key pair written to {keys_dir} (secret: {keys_dir / SERVER_SECRET}, mode 0600)\n"
                  f"clients need the public key {pub} (--server-key); set `curve = true` in the config and restart")
        elif args.cmd == "client":
            secret = client(keys_dir, args.name, args.role, Path(args.out), owner)
            print(f"client {args.name!r} authorised as {args.role}; its key is {secret} (mode 0600): copy it to the "
                  f"client machine, with {keys_dir / SERVER_PUBLIC}, and use\n"
                  f"  inferctl --endpoint tcp://HOST:PORT --key {secret.name} --server-key {SERVER_PUBLIC} status\n"
                  f"{reload_hint}")
        elif args.cmd == "add":
            dest = add(keys_dir, Path(args.file), args.role, args.name, owner)
            print(f"authorised {dest} as {args.role}; {reload_hint}")
        elif args.cmd == "remove":
            for f in remove(keys_dir, args.name):
                print(f"removed {f}")
            print(f"{reload_hint}; open connections with that key are refused from their next request on")
        else:
            print("\n".join(listing(keys_dir)))
    except (KeysCommandError, ConfigError, OSError) as exc:
        print(f"inferd keys: {exc}", file=sys.stderr)
        return 2
    return 0
