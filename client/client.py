"""The inferd client: a few lines from robot code to a model served by the daemon.

    from inferd_client import Client
    with Client() as c:                       # default endpoint: the same one the daemon uses
        out = c.infer("yolo", {"images": frame})   # {output name: ndarray}

Needs only pyzmq, msgpack and numpy. Thread-safe: every thread gets its own DEALER socket
(created on first use), so threads run requests concurrently without a pool. Not fork-safe, like
every ZeroMQ object: a forked child that uses an inherited Client gets fresh sockets (the
inherited ones are abandoned, never touched).

Reconnection: after a transport error the thread's socket is thrown away and the next call builds
a new one, so a Client outlives daemon restarts; requests that timed out are never delivered late.

Authentication: on the ipc socket the daemon knows the calling process's user and groups from the
kernel; nothing to pass. A TCP endpoint with CURVE needs this client's key file (``key=``, made by
``inferd keys client NAME``) and the server's public key (``server_key=``: its ``server.key`` file
or the key itself); ``$INFERD_KEY`` and ``$INFERD_SERVER_KEY`` are the defaults. A refused
connection raises :class:`~inferd_client.errors.PermissionDenied` instead of timing out.

Short requests (``spin_us``): a thread whose last request to a model came back within ``spin_us``,
from a daemon that had nothing else to do then and the time before (the replies' ``idle``), polls for
the next reply of that model awake, yielding its core between polls, for up to that long before it
sleeps in the poll.
A thread that slept is woken cold: on a 2-core VM one VAD chunk's round trip took 270-300 us with
the sleep and 240 us awake, the codec's Python alone 3-5x slower after a sleep than in a loop. A
model whose replies take longer is not spun for, nor one whose daemon is serving others (the spin
would take a core from it), so the cost is at most ``spin_us`` of CPU per short request.
"""
from __future__ import annotations

import itertools
import os
import random
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import zmq
import zmq.auth
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from . import errors
from .protocol import (
    WireError,
    decode_reply,
    default_endpoint,
    encode_request,
    ipc_path,
    parse_size,
)

_sched_yield = getattr(os, "sched_yield", lambda: None)
_HANDSHAKE_FAILED_AUTH = int(getattr(zmq, "EVENT_HANDSHAKE_FAILED_AUTH", 0))
_HANDSHAKE_FAILED_PROTOCOL = int(getattr(zmq, "EVENT_HANDSHAKE_FAILED_PROTOCOL", 0))
_HANDSHAKE_SUCCEEDED = int(getattr(zmq, "EVENT_HANDSHAKE_SUCCEEDED", 0))
#: connections in a row dropped by the daemon during the handshake, with no failure event, taken as
#: a refusal (``refused`` is then _DROPPED_IN_HANDSHAKE); a daemon stopping mid-handshake drops one
_EARLY_DROPS_REFUSED = 3
_DROPPED_IN_HANDSHAKE = -1
_MONITOR_EVENTS = (zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | _HANDSHAKE_FAILED_AUTH
                   | _HANDSHAKE_FAILED_PROTOCOL | _HANDSHAKE_SUCCEEDED)
# Plain ints: pyzmq's constants are IntFlag enums, and every ``|``/``&`` on them runs the enum
# machinery (about a microsecond each), several times per request.
_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE = int(zmq.SNDMORE)
_NOBLOCK_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
_POLLIN = int(zmq.POLLIN)
_EVENTS = int(zmq.EVENTS)
#: a VAD chunk's round trip is 240-330 us on the 2-core VM: the spin must outlast it to help
DEFAULT_SPIN_US = 500.0
#: past this, sleeping in the poll costs less than the wake-up it saves
MAX_SPIN_US = 10_000.0
_NO_SPIN = float("inf")
_LAST_NONE = (_NO_SPIN, False)


class _Conn:
    """One thread's DEALER socket, its monitor (to notice a vanished daemon) and their poll list."""

    def __init__(self, ctx: zmq.Context, endpoint: str, curve: tuple[bytes, bytes, bytes] | None = None) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RECONNECT_IVL, 100)
        self.sock.setsockopt(zmq.RECONNECT_IVL_MAX, 0)
        if curve is not None:
            self.sock.setsockopt(zmq.CURVE_PUBLICKEY, curve[0])
            self.sock.setsockopt(zmq.CURVE_SECRETKEY, curve[1])
            self.sock.setsockopt(zmq.CURVE_SERVERKEY, curve[2])
        # The monitor must exist before connect() or the first CONNECTED event is missed.
        self.mon = self.sock.get_monitor_socket(_MONITOR_EVENTS)
        self.sock.connect(endpoint)
        # A fixed item list for zmq_poll: zmq.Poller rebuilds one (and the caller a dict) per call.
        self.poll_items = [(self.sock, _POLLIN), (self.mon, _POLLIN)]
        self.connected = False
        self.handshaken = False
        self.refused: int | None = None  # the handshake-failure event, once the daemon refused us
        self.early_drops = 0  # connections in a row dropped before their handshake completed
        #: (op, model) -> this thread's last round trip (s; infinite unless the daemon said it was idle at this
        #: reply and the one before) and whether that reply said so: whether the next wait is worth spinning
        self.last: dict[tuple[str, str | None], tuple[float, bool]] = {}

    def drain_monitor(self) -> bool:
        """Consume pending monitor events; True if a disconnect or a refusal was among them."""
        lost = False
        while self.mon.get(_EVENTS) & _POLLIN:
            try:
                ev = recv_monitor_message(self.mon, zmq.NOBLOCK)
            except zmq.Again:
                return lost
            if ev["event"] == zmq.EVENT_CONNECTED:
                self.connected = True
            elif ev["event"] == _HANDSHAKE_SUCCEEDED:
                self.handshaken = True
                self.early_drops = 0
            elif ev["event"] == zmq.EVENT_DISCONNECTED:
                self.connected = False
                # A connection dropped before its handshake completed was refused (the failure
                # event may come after the disconnect) or never served: the socket retries, and
                # the refusal or the timeout answers. A peer that speaks another mechanism (a
                # client without a key at a CURVE endpoint) hangs up after the greetings, and
                # when its close resets the connection before our side has read its greeting,
                # no failure event comes at all (seen in 7 of 15 tries on a 2-core VM): the
                # same drop several times in a row is taken as the refusal.
                if self.handshaken or not _HANDSHAKE_SUCCEEDED:
                    lost = True
                else:
                    self.early_drops += 1
                    if self.early_drops >= _EARLY_DROPS_REFUSED and self.refused is None:
                        self.refused = _DROPPED_IN_HANDSHAKE
                        lost = True
                self.handshaken = False
            elif ev["event"] in (_HANDSHAKE_FAILED_AUTH, _HANDSHAKE_FAILED_PROTOCOL):
                self.refused = ev["event"]
                lost = True
        return lost

    def close(self) -> None:
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self.mon.close(0)
        self.sock.close(0)


class Client:
    """A connection to one inferd daemon.

    ``timeout`` (seconds) bounds every call; for ``infer`` it is also sent to the daemon as the
    request's deadline, so a request the caller no longer waits for is never run. The client waits
    ``timeout + grace`` for the reply so that the daemon's DEADLINE_EXCEEDED answer arrives before
    the local TimeoutError would fire.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        timeout: float = 30.0,
        *,
        grace: float = 1.0,
        context: zmq.Context | None = None,
        key: str | os.PathLike[str] | None = None,
        server_key: str | os.PathLike[str] | None = None,
        spin_us: float | None = None,
    ) -> None:
        """``key``: this client's CURVE secret key file; ``server_key``: the daemon's public key
        file (``server.key``) or the 40-character key itself. Both only for tcp:// endpoints.
        ``spin_us``: how long a short request's reply is polled for awake (module docstring);
        default ``$INFERD_CLIENT_SPIN_US`` or 500; 0 never spins."""
        if timeout is None or timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        if spin_us is None:
            env = os.environ.get("INFERD_CLIENT_SPIN_US", "")
            try:
                spin_us = float(env) if env else DEFAULT_SPIN_US
            except ValueError:
                raise ValueError(f"$INFERD_CLIENT_SPIN_US must be a number of microseconds, got {env!r}") from None
        if not 0 <= spin_us <= MAX_SPIN_US:
            raise ValueError(f"spin_us must be in [0, {MAX_SPIN_US:g}] microseconds, got {spin_us!r}")
        self.spin_s = spin_us * 1e-6
        self.endpoint = endpoint or default_endpoint()
        self._curve = _curve_keys(self.endpoint, key, server_key)
        self.timeout = float(timeout)
        self.grace = float(grace)
        self._own_ctx = context is None
        self._ctx = context if context is not None else zmq.Context()
        self._pid = os.getpid()
        self._local = threading.local()
        self._conns: dict[int, tuple[threading.Thread, _Conn]] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(random.getrandbits(40))
        self._closed = False
        self.stale_replies = 0  # replies whose id matched no waiting request (e.g. after a timeout)

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._closed and os.getpid() == self._pid:
                self.close()
        except Exception:
            pass

    def close(self) -> None:
        """Close every thread's socket. Call it when no request is in flight."""
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._pid:
            return  # inherited through fork: the sockets belong to the parent
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
        for _, c in conns:
            c.close()
        if self._own_ctx:
            self._ctx.term()

    def _conn(self) -> _Conn:
        if self._closed:
            raise errors.InferdClientError("client is closed")
        if os.getpid() != self._pid:
            # After fork the parent's context and sockets must not be touched; start afresh.
            self._pid = os.getpid()
            self._ctx = zmq.Context()
            self._own_ctx = True
            self._local = threading.local()
            self._conns = {}
            self._lock = threading.Lock()
        conn: _Conn | None = getattr(self._local, "conn", None)
        if conn is None:
            path = ipc_path(self.endpoint)
            if path is not None:
                _check_ipc_access(path)
            conn = _Conn(self._ctx, self.endpoint, self._curve)
            self._local.conn = conn
            me = threading.current_thread()
            with self._lock:
                # Threads come and go (thread pools, per-request threads): close the sockets of
                # finished ones so a long-lived Client does not collect them.
                dead = [k for k, (t, _) in self._conns.items() if not t.is_alive()]
                gone = [self._conns.pop(k)[1] for k in dead]
                self._conns[id(conn)] = (me, conn)
            for c in gone:
                c.close()
        return conn

    def _drop_conn(self, conn: _Conn) -> None:
        self._local.conn = None
        with self._lock:
            self._conns.pop(id(conn), None)
        conn.close()

    # ------------------------------------------------------------------ core

    def _call(
        self,
        op: str,
        model: str | None = None,
        *,
        args: Mapping[str, Any] | None = None,
        tensors: Mapping[str, np.ndarray] | None = None,
        timeout: float | None = None,
        deadline: bool = False,
        priority: int = 0,
    ) -> Any:
        t = self.timeout if timeout is None else float(timeout)
        if t <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        conn = self._conn()
        rid = next(self._ids)
        try:
            frames = encode_request(
                rid, op, model, args=args, tensors=tensors,
                timeout_ms=t * 1000.0 if deadline else None, priority=priority, inline=True,
            )
        except ValueError as exc:
            raise errors.InvalidArgument(str(exc)) from None
        wait = t + (self.grace if deadline else 0.0)
        end = time.monotonic() + wait
        conn.drain_monitor()  # forget disconnects that happened before this request
        if conn.refused is not None:
            self._drop_conn(conn)
            raise self._refused(conn.refused)
        sock = conn.sock
        try:
            while True:
                try:
                    # Per frame rather than send_multipart (whose type-check pass costs more than
                    # the sends for small requests). DEALER queues a message atomically: only the
                    # first frame can hit the high-water mark.
                    sock.send(frames[0], _NOBLOCK_MORE if len(frames) > 1 else _NOBLOCK, copy=False)
                    break
                except zmq.Again:
                    if time.monotonic() >= end or not sock.poll(max(1, int((end - time.monotonic()) * 1000)), zmq.POLLOUT):
                        raise self._timeout(op, wait) from None
            if len(frames) > 1:
                for f in frames[1:-1]:
                    sock.send(f, _SNDMORE, copy=False)
                sock.send(frames[-1], 0, copy=False)
            t_sent = time.monotonic()
            key = (op, model)
            spin = self.spin_s
            spin_end = t_sent + spin if spin and conn.last.get(key, _LAST_NONE)[0] <= spin else 0.0
            while True:
                ready = None
                while spin_end:
                    ready = zmq.zmq_poll(conn.poll_items, 0)
                    if ready or time.monotonic() >= spin_end:
                        break
                    _sched_yield()  # the zmq I/O thread bringing the reply may be waiting for this core
                if not ready:
                    spin_end = 0.0
                    remaining = end - time.monotonic()
                    if remaining <= 0:
                        raise self._timeout(op, wait)
                    ready = zmq.zmq_poll(conn.poll_items, max(1, int(remaining * 1000 + 0.999)))
                if ready and ready[0][0] is sock:
                    # recv_multipart's per-part RCVMORE getsockopt is not needed: a received
                    # Frame knows whether more parts follow (parts of a message arrive together).
                    part = sock.recv(0, copy=False)
                    raw = [part]
                    while part.more:
                        part = sock.recv(0, copy=False)
                        raw.append(part)
                    try:
                        reply = decode_reply(raw)
                    except WireError as exc:
                        raise errors.ProtocolError(f"undecodable reply from {self.endpoint}: {exc.message}") from None
                    if reply.id != rid:
                        self.stale_replies += 1
                        continue
                    # a busy daemon's reply says so (not idle): the spin would take a core from it. Two idle
                    # replies in a row: with three clients streaming back to back on two cores a tenth of the
                    # replies found the daemon idle by chance, and spinning after each cost 7-13% of the
                    # chunks served
                    idle = reply.result.get("idle") is True
                    rt = time.monotonic() - t_sent if idle and conn.last.get(key, _LAST_NONE)[1] else _NO_SPIN
                    conn.last[key] = (rt, idle)
                    if not reply.ok:
                        raise errors.error_from_wire(reply.error_code, reply.error_message, reply.retry_after_ms)
                    return reply
                if any(r[0] is conn.mon for r in ready) and conn.drain_monitor():
                    if conn.refused is not None:
                        raise self._refused(conn.refused)
                    raise errors.ConnectionError(
                        f"connection to inferd at {self.endpoint} broke during {op!r} (daemon stopped or crashed); safe to retry"
                    )
        except errors.ServerError:
            raise
        except BaseException:
            # Transport error or interrupted wait: a fresh socket next time, so nothing queued
            # for a dead peer is delivered late and no stray reply is read as ours.
            self._drop_conn(conn)
            raise

    def _timeout(self, op: str, wait: float) -> errors.TimeoutError:
        hint = ""
        path = ipc_path(self.endpoint)
        if path is not None and not os.path.exists(path):
            hint = f" (no socket at {path}: is inferd running?)"
        elif self._curve is not None:
            hint = " (with CURVE, a server_key that is not the daemon's makes the handshake fail silently)"
        return errors.TimeoutError(f"no reply to {op!r} from inferd at {self.endpoint} within {wait:.3g} s{hint}")

    def _refused(self, event: int) -> errors.PermissionDenied:
        if event == _HANDSHAKE_FAILED_AUTH:
            why = ("its CURVE key is not authorised (inferd keys client NAME / inferd keys add on the daemon's machine)"
                   if self._curve is not None else
                   "this process's user is in neither the socket_group nor the admin_group of the daemon")
        elif event == _DROPPED_IN_HANDSHAKE and self._curve is None and ipc_path(self.endpoint) is not None:
            why = (f"it hung up during the handshake {_EARLY_DROPS_REFUSED} times in a row (this process's "
                   "user may be in neither the socket_group nor the admin_group of the daemon)")
        elif self._curve is None:
            why = ("the endpoint requires CURVE: pass key= and server_key= (inferctl --key NAME.key_secret "
                   "--server-key server.key, or $INFERD_KEY and $INFERD_SERVER_KEY)")
        else:
            why = ("the CURVE handshake failed: the endpoint does not speak CURVE (drop the key for it) or "
                   "server_key is not the daemon's")
        return errors.PermissionDenied(f"permission denied: inferd at {self.endpoint} refused the connection: {why}")

    # ------------------------------------------------------------------ operations

    def infer(
        self,
        model: str,
        inputs: Mapping[str, Any] | np.ndarray,
        timeout: float | None = None,
        priority: int = 0,
        outputs: list[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run ``model`` on ``inputs`` ({input name: array}, or one array for a single-input model).

        Returns {output name: ndarray} (zero-copy views on the received message, writable).
        ``timeout`` is the request's deadline (seconds, default the client's); ``priority``: higher
        runs earlier among requests queued for the same model.
        """
        return self.infer_with_info(model, inputs, timeout=timeout, priority=priority, outputs=outputs)[0]

    def infer_with_info(
        self,
        model: str,
        inputs: Mapping[str, Any] | np.ndarray,
        timeout: float | None = None,
        priority: int = 0,
        outputs: list[str] | None = None,
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Like :meth:`infer`, plus the daemon's info: model, device, queue_us, compute_us, inline (run by the
        serving thread itself) and idle (nothing else was waiting for the daemon when it answered)."""
        if type(inputs) is np.ndarray:  # exact-type checks first: the Mapping ABC check is slower
            feeds = {"": inputs}
        elif type(inputs) is dict or isinstance(inputs, Mapping):
            feeds = {k if type(k) is str else str(k): v if type(v) is np.ndarray else np.asarray(v)
                     for k, v in inputs.items()}
        else:
            feeds = {"": np.asarray(inputs)}
        args = {"outputs": list(outputs)} if outputs else None
        reply = self._call("infer", model, args=args, tensors=feeds, timeout=timeout, deadline=True, priority=priority)
        return reply.tensors, reply.result

    def load(self, model: str, reload: bool = False, timeout: float | None = None) -> dict[str, Any]:
        """Load ``model`` (or reload it from disk); returns its entry as in :meth:`models`."""
        return self._call("load", model, args={"reload": bool(reload)}, timeout=timeout).result

    def unload(self, model: str, timeout: float | None = None) -> dict[str, Any]:
        return self._call("unload", model, timeout=timeout).result

    def models(self, timeout: float | None = None) -> list[dict[str, Any]]:
        """Every model of the repository with its state (UNLOADED, LOADING, READY, UNAVAILABLE)."""
        return list(self._call("models", timeout=timeout).result.get("models", []))

    def status(self, timeout: float | None = None) -> dict[str, Any]:
        return self._call("status", timeout=timeout).result

    def set_budget(self, size: int | str | None, timeout: float | None = None) -> dict[str, Any]:
        """Store the memory budget (bytes, or "512M"/"2G"; None or 0 = no budget)."""
        nbytes = 0 if size is None else parse_size(size)
        return self._call("set_budget", args={"bytes": nbytes}, timeout=timeout).result

    def health(self, timeout: float | None = None) -> dict[str, Any]:
        return self._call("health", timeout=timeout).result

    def reload(self, timeout: float | None = None) -> dict[str, Any]:
        """Make the daemon re-read its config, groups and authorised keys and rescan its models (admin)."""
        return self._call("reload", timeout=timeout).result

    def is_live(self, timeout: float = 1.0) -> bool:
        """True if the daemon answers within ``timeout``."""
        try:
            return bool(self.health(timeout=timeout).get("live", False))
        except errors.InferdClientError:
            return False

    def is_ready(self, timeout: float = 1.0) -> bool:
        """True once the daemon has settled its preloaded models and is not stopping."""
        try:
            return bool(self.health(timeout=timeout).get("ready", False))
        except errors.InferdClientError:
            return False

    def is_model_ready(self, model: str, timeout: float = 1.0) -> bool:
        try:
            entries = self.models(timeout=timeout)
        except errors.InferdClientError:
            return False
        return any(m.get("name") == model and m.get("state") == "READY" for m in entries)


def _read_key(value: str | os.PathLike[str], what: str, secret: bool) -> tuple[bytes, bytes | None]:
    """(public, secret) from a zmq.auth key file, or from a bare z85 public key."""
    text = os.fspath(value)
    if not secret and len(text) == 40 and not os.path.exists(text):
        try:
            z85.decode(text)
        except ValueError:
            pass
        else:
            return text.encode("ascii"), None
    try:
        public, secret_key = zmq.auth.load_certificate(text)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{what} {text!r}: not a readable CURVE key file ({exc})") from None
    if secret and not secret_key:
        raise ValueError(f"{what} {text!r} holds no secret key: pass the NAME.key_secret file")
    return public, secret_key


def _curve_keys(endpoint: str, key: str | os.PathLike[str] | None,
                server_key: str | os.PathLike[str] | None) -> tuple[bytes, bytes, bytes] | None:
    from_env = key is None and server_key is None
    if from_env:
        key = os.environ.get("INFERD_KEY") or None
        server_key = os.environ.get("INFERD_SERVER_KEY") or None
    if key is None and server_key is None:
        return None
    if not endpoint.startswith("tcp://"):
        if from_env:
            return None  # the environment's keys are for TCP endpoints; ipc identifies us by our user
        raise ValueError(f"CURVE keys apply to tcp:// endpoints; {endpoint} identifies clients by their user and groups")
    if key is None or server_key is None:
        raise ValueError("CURVE needs both key (this client's NAME.key_secret file) and server_key "
                         "(the daemon's server.key file or its public key)")
    public, secret = _read_key(key, "key", secret=True)
    server_public, _ = _read_key(server_key, "server_key", secret=False)
    assert secret is not None
    return public, secret, server_public


def _check_ipc_access(path: str) -> None:
    """Refuse at once, with the reason, when the file system keeps this user from the socket (its
    connect would fail with EACCES, which ZeroMQ retries quietly until the timeout)."""
    if os.path.exists(path):
        if not os.access(path, os.R_OK | os.W_OK):
            try:
                st = os.stat(path)
                import grp

                group = grp.getgrgid(st.st_gid).gr_name
            except (OSError, KeyError):
                group = "?"
            raise errors.PermissionDenied(
                f"permission denied: this user may not open the daemon's socket {path} (group {group!r}); "
                f"an operator can add it to that group: sudo usermod -aG {group} $USER (then log in again)")
        return
    parent = os.path.dirname(path) or "."
    if os.path.isdir(parent) and not os.access(parent, os.X_OK):
        raise errors.PermissionDenied(f"permission denied: this user may not enter {parent}, where the daemon's socket "
                                      "lives; an operator can add it to the daemon's socket group")
