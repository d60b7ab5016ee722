"""The inferd daemon: a ROUTER socket, the model slots, signals, systemd notifications.

Threads: the main thread owns every ZeroMQ socket that faces clients (ZeroMQ sockets are not
thread-safe). It decodes and validates requests, answers the cheap ops itself and hands
inference and load/unload to the model slots. Worker threads send their replies through their
own inproc PUSH socket to a PULL socket that the main thread forwards to the ROUTER, without
copying the tensor frames.

Who may do what is decided in :mod:`.auth` (ZAP, on its own thread): every message carries its
connection's verdict (ZeroMQ's User-Id), which the main thread maps to a role and a fair-share
client before running the op.

Exit codes of :func:`serve_main`: 0 clean stop (SIGTERM/SIGINT), 1 could not start (endpoint
taken, bind failed), 2 bad configuration (including protected mode's refusals and missing keys).
"""
from __future__ import annotations

import errno
import fcntl
import functools
import gc
import itertools
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable

import zmq

from inferd_client import protocol as P

from ..config import Config, ConfigError, load_config, parse_argv
from . import auth
from .auth import Peer, Policy
from . import budget, pressure, streamed
from .repository import scan
from .replies import ReplySender
from .. import cache, faults
from ..runtime import heap
from ..runtime.heap import process_rss
from .scheduler import (_SHARED_DEVICES, LOADING, READY, RECOVERING, UNAVAILABLE, UNLOADED, ClientShares, DeviceLock,
                        Job, ModelSlot)
from .sdnotify import Notifier, setup_logging

log = logging.getLogger("inferd.server")

# Plain ints: pyzmq's constants are IntFlag enums, and every ``|``/``&`` on them runs the enum
# machinery (about a microsecond each), several times per request.
_NOBLOCK = int(zmq.NOBLOCK)
_NOBLOCK_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
_POLLIN = int(zmq.POLLIN)
_EVENTS = int(zmq.EVENTS)


def recv_frames(sock: zmq.Socket, flags: int = 0) -> list[zmq.Frame]:
    """``sock.recv_multipart(flags, copy=False)`` without its per-part RCVMORE getsockopt: a
    received Frame already knows whether more parts follow (parts of a message arrive together)."""
    f = sock.recv(flags, copy=False)
    frames = [f]
    while f.more:
        f = sock.recv(flags, copy=False)
        frames.append(f)
    return frames


STATUS_PERIOD_S = 10.0
#: how often the cgroup's memory.max / memory.high are read again between status periods (cheap: two files)
CGROUP_PERIOD_S = 2.0
PEER_CACHE_MAX = 4096  # distinct connections' verdicts remembered (one per client process on ipc)
MAX_BATCH = 256  # messages handled per socket per loop turn, so neither socket starves the other
IPC_PATH_MAX = 107  # sun_path


class EndpointBusy(RuntimeError):
    """Another process already serves the endpoint."""


def default_loader(path: str, device: str = "auto", batch: int = 1, cache_dir: str | None = None,
                   **dynamic: Any) -> Any:
    """``dynamic``: a model's ``shapes``, ``max_shape`` and ``max_variants``, passed only where its config sets
    them (so that a loader that knows no dynamic dimensions still serves the other models)."""
    # Looked up at call time so that tests and embedders can substitute ``inferd.load``.
    import inferd

    return inferd.load(path, device=device, batch=batch, cache_dir=cache_dir, **dynamic)


def default_register(path: str, device: str = "auto", batch: int = 1, cache_dir: str | None = None,
                     **kw: Any) -> Any:
    """``default_loader``'s ``register``: ``inferd.register`` (``kw``: its options and the model's config's)."""
    import inferd

    return inferd.register(path, device=device, batch=batch, cache_dir=cache_dir, **kw)


default_loader.register = default_register  # type: ignore[attr-defined]


def apply_threads(n: int) -> None:
    """Size inferd's native pool (the CPU kernels' threads) to ``n``; 0 keeps its default (the usable cores).

    Other libraries' pools are bounded too (best effort; env vars only reach libraries loaded later): numpy's
    BLAS is held to one thread here, at start (``inferd.native.claim_cores``), not inside the first cold load."""
    from .. import native
    from ..runtime.scheduler import default_loaders, loader_pool

    if n <= 0:
        # the loader threads up before the first request, not started inside its cold load (as the cold bench
        # measures a daemon that is up)
        loader_pool().set_size(default_loaders())
    else:
        native.set_num_threads(n)
        loader_pool().set_size(n)  # cold loads prepare layers on as many threads as the kernels compute on
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LP_NUM_THREADS"):
            os.environ.setdefault(var, str(n))
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    native.claim_cores()  # (a cold load would look for numpy's OpenBLAS on disk: 1-10 ms after a dropped cache)


def prepare_cache_dir(path: str) -> None:
    """Point the GPU drivers' shader caches and inferd's SPIR-V and pipeline caches into the cache
    directory (unless the environment already does), so compiled shaders survive restarts under the
    service's own dir. An unusable directory is only a slower start: the Server reports it."""
    os.environ.setdefault("MESA_SHADER_CACHE_DIR", os.path.join(path, "mesa"))
    os.environ.setdefault("__GL_SHADER_DISK_CACHE_PATH", os.path.join(path, "nvidia"))
    os.environ.setdefault("INFERD_CACHE_DIR", path)


#: recent fault and recovery events kept for ``status`` (the journal has them all)
MAX_EVENTS = 32


class _RateLimited:
    """At most ``n`` log lines per ``window`` seconds; then one line counting the suppressed ones."""

    def __init__(self, n: int = 10, window: float = 10.0) -> None:
        self.n, self.window = n, window
        self.t0, self.count, self.suppressed = 0.0, 0, 0

    def __call__(self, level: int, msg: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self.t0 > self.window:
            if self.suppressed:
                log.warning("... %d similar messages suppressed", self.suppressed)
            self.t0, self.count, self.suppressed = now, 0, 0
        if self.count < self.n:
            self.count += 1
            log.log(level, msg, *args)
        else:
            self.suppressed += 1


class _MainSender:
    """ReplySender's interface for jobs the main thread runs itself: straight to the ROUTER."""

    def __init__(self, server: Server) -> None:
        self.server = server

    def send(self, ident: bytes, frames: list[Any]) -> None:
        self.server._send_frames([ident, *frames])

    def event(self, kind: str, name: str) -> None:
        self.server._on_event(kind, name)

    def close(self) -> None:
        pass


def claim_ipc_path(path: str) -> Any:
    """Make sure no live process serves ``path``; returns the held lock file.

    A second ZeroMQ bind on an ipc path silently takes it over from a live daemon, so probe first.
    The flock on ``path.lock`` closes the race between two daemons starting at once; the connect
    probe also catches a non-inferd listener. A socket file nobody listens on is stale: removed.
    """
    if len(path.encode()) > IPC_PATH_MAX:
        raise EndpointBusy(f"ipc path {path!r} is longer than {IPC_PATH_MAX} bytes (unix socket limit)")
    parent = os.path.dirname(path) or "."
    os.makedirs(parent, mode=0o700, exist_ok=True)
    lock = open(path + ".lock", "a+")  # noqa: SIM115 - held for the daemon's lifetime
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        raise EndpointBusy(f"another inferd holds {path}.lock: it already serves ipc://{path}") from None
    if os.path.lexists(path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            log.info("removing stale socket %s (nobody listens on it)", path)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        except OSError as exc:
            lock.close()
            raise EndpointBusy(f"cannot probe {path}: {exc}") from None
        else:
            lock.close()
            raise EndpointBusy(f"a live process already listens on {path}; not taking it over "
                               "(pass --endpoint to serve elsewhere)")
        finally:
            probe.close()
    return lock


class Server:
    def __init__(
        self,
        config: Config,
        cli: Mapping[str, Any] | None = None,
        config_path: str | None = None,
        loader: Callable[..., Any] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self._cli = dict(cli or {})
        self._config_path = config_path
        # models are compiled once into packages under the cache dir: later (cold) loads skip ONNX parsing
        # compiled packages (plan, profile, weights store) live in the cache; every loader is given it
        self.packages_dir = str(Path(config.cache_dir) / "packages")
        self.loader = functools.partial(loader or default_loader, cache_dir=self.packages_dir)
        #: prepares a model that is not preloaded for its first request (``ModelSlot.register``): the loader's
        #: ``register`` (``inferd.register`` for the default one), None where it has none or the config says not to
        self.registrar: Callable[..., Any] | None = (getattr(loader or default_loader, "register", None)
                                                     if config.register else None)
        self.cache = cache.cache_dir(config.cache_dir)
        if self.cache.probe() == cache.OK:
            cache.clean_leftovers(config.cache_dir)
        self.cache_max_bytes = config.cache_max_bytes or cache.default_max_bytes(config.cache_dir)
        self._cache_bytes: tuple[float, int] = (-1e9, 0)
        self.events: deque[dict[str, Any]] = deque(maxlen=MAX_EVENTS)
        self.event_counts: dict[str, int] = {}
        self._events_lock = threading.Lock()
        self._recovery_lock = threading.Lock()
        self._recover_queue: list[tuple[ModelSlot, bool]] = []
        self._recovery_thread: threading.Thread | None = None
        self.last_recovery_s: float | None = None
        self.notifier = Notifier(environ)
        self.ctx = zmq.Context()
        self.device_lock = DeviceLock()
        self.slots: dict[str, ModelSlot] = {}
        self._retired: list[ModelSlot] = []
        self.budget = config.memory_budget
        self.cgroup_limit: int | None = None  # the process's cgroup memory limit, as last read
        self._shares_host: bool | None = None  # the Vulkan device's memory is the host's (once it is open)
        self._cgroup_checked = 0.0
        # memory pressure (PSI): a watcher thread counts trigger events, the main loop acts on them
        self.pressure_cap = pressure.PressureCap()
        self.pressure_watcher: pressure.PressureWatcher | None = None
        self.pressure_source = ""  # the file watched, or why none is
        self._pressure_hits = 0
        self._pressure_seen = 0
        self._wake_w: socket.socket | None = None
        self.limits = self._limits(config)
        self.policy = Policy.from_config(config)
        self.shares = ClientShares(config.max_inflight_per_client)
        self._peers: dict[str, Peer] = {}
        self._peer: Peer = auth.UNAUTHENTICATED  # the peer of the request being handled (main thread)
        self.authenticator: auth.Authenticator | None = None
        self.reply_addr = f"inproc://inferd-replies-{id(self):x}"
        self.router: zmq.Socket | None = None
        self.pull: zmq.Socket | None = None
        self._lockfile: Any = None
        self._seq = itertools.count()
        self._t_start = time.monotonic()
        self._pending_preload: set[str] = set()
        #: what making the Vulkan device's recently used pipelines resident at start did (None: not run)
        self.resident_pipelines: dict[str, Any] | None = None
        #: the same after the last recovery that recreated the device (None: none has)
        self.resident_after_recovery: dict[str, Any] | None = None
        self.ready = False  # health's "ready": stays true through a SIGHUP reload
        self._reloading = False
        self.draining = False
        self._drain_deadline = 0.0
        self._drain_warned = False
        self._stop_requests = 0
        self._reload_requested = False
        self._last_status = 0.0
        self._stalled_logged = False
        self._rl = _RateLimited()
        self._next_sweep = float("inf")  # earliest queued deadline (may be early, never late)
        self._inline_sender = _MainSender(self)
        self._spin_until = 0.0  # the serving loop polls without sleeping until then (``spin_us``)
        # spins so far, seconds spent in them, and how many a request ended: whether the spin's CPU pays off
        self._spin_stats: list[float] = [0, 0.0, 0]
        self._inline_end = 0.0  # when the last request run on this thread ended
        # gc.freeze() once ready: right for the daemon's own process (serve_main sets it), not for
        # a process that embeds a Server among other work.
        self.freeze_gc = False
        self._ops: dict[str, Callable[[bytes, P.Request, float], None]] = {
            op: getattr(self, "_op_" + op) for op in P.OPS}

    @staticmethod
    def _limits(c: Config) -> P.Limits:
        return P.Limits(max_message_bytes=c.max_message_bytes, max_header_bytes=c.max_header_bytes,
                        max_tensors=c.max_tensors, max_dims=c.max_dims)

    # ------------------------------------------------------------------ setup

    def reply_sender(self) -> ReplySender:
        return ReplySender(self.ctx, self.reply_addr)

    def bind(self) -> None:
        """Bind ``endpoint`` (and ``remote_endpoint``) on one ROUTER. Raises ProtectedModeError or
        KeysError for a configuration that must not serve, EndpointBusy when the address is taken."""
        config = self.config
        for warning in auth.check_endpoints(config):
            log.warning("%s", warning)
        keys = auth.load_server_keys(config.keys_dir) if config.curve else None
        if config.curve:
            log.info("CURVE on TCP endpoints: %d authorised client keys in %s", len(self.policy.keys),
                     os.path.join(config.keys_dir, auth.CLIENTS_DIR))
        endpoint = config.endpoint
        path = P.ipc_path(endpoint)
        if path is not None:
            self._lockfile = claim_ipc_path(path)
        # ZAP first: a connection accepted before its handler runs would carry no verdict.
        self.authenticator = auth.Authenticator(self.ctx, lambda: self.policy)
        self.authenticator.start()
        router = self.ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)  # unknown peers raise EHOSTUNREACH, not silence
        router.setsockopt(zmq.MAXMSGSIZE, config.max_message_bytes)  # per frame, checked before buffering
        router.setsockopt(zmq.LINGER, 2000)
        router.setsockopt(zmq.SNDHWM, 10000)
        router.setsockopt(zmq.RCVHWM, 10000)
        try:
            for ep in [endpoint, config.remote_endpoint]:
                if not ep:
                    continue
                # Security options are copied into each listener at bind(): the ipc socket keeps
                # NULL + peer credentials while a TCP bind on the same ROUTER speaks CURVE.
                is_ipc = ep.startswith("ipc://")
                router.setsockopt(zmq.ZAP_DOMAIN, (auth.ZAP_DOMAIN_IPC if is_ipc else auth.ZAP_DOMAIN_TCP).encode())
                curve = keys is not None and not is_ipc
                router.setsockopt(zmq.CURVE_SERVER, int(curve))
                if curve:
                    assert keys is not None
                    router.setsockopt(zmq.CURVE_PUBLICKEY, keys[0])
                    router.setsockopt(zmq.CURVE_SECRETKEY, keys[1])
                router.bind(ep)
        except zmq.ZMQError as exc:
            router.close(0)
            self._release_lock()
            raise EndpointBusy(f"cannot bind {ep}: {exc}") from None
        if path is not None:
            try:
                auth.socket_group_setup(path, self.policy, config)
            except auth.ProtectedModeError:
                router.close(0)
                self._release_lock()
                raise
        for user in auth.admin_members_outside_socket_group(self.policy):
            log.warning("user %s is in admin_group %r but not in socket_group %r: it cannot open %s "
                        "(sudo usermod -aG %s %s)", user, config.admin_group, self.policy.socket_group,
                        path or endpoint, self.policy.socket_group, user)
        pull = self.ctx.socket(zmq.PULL)
        pull.setsockopt(zmq.RCVHWM, 0)
        pull.bind(self.reply_addr)
        self.router, self.pull = router, pull
        log.info("listening on %s%s (socket_group %r, admin_group %r)", endpoint,
                 f" and {config.remote_endpoint}" + (" with CURVE" if keys else "") if config.remote_endpoint else "",
                 self.policy.socket_group, config.admin_group or None)

    def _release_lock(self) -> None:
        if self._lockfile is not None:
            self._lockfile.close()
            self._lockfile = None

    # ------------------------------------------------------------------ repository

    def rescan(self) -> None:
        entries = scan(self.config.models_dir)
        for name in [n for n in self.slots if n not in entries]:
            slot = self.slots.pop(name)
            log.info("model %s: removed from the repository; unloading", name)
            slot.retire()
            self._retired.append(slot)
            self._pending_preload.discard(name)
        for name, entry in entries.items():
            slot = self.slots.get(name)
            if slot is None:
                slot = ModelSlot(entry, self)
                self.slots[name] = slot
                log.info("model %s: found %s", name, entry.path)
                if slot.preload:
                    self._pending_preload.add(name)
                    slot.request_load(None)
                else:
                    slot.register()
            elif entry != slot.entry:
                slot.entry = entry
                log.info("model %s: changed on disk", name)
                if slot.state in (READY, LOADING) or (slot.state == UNAVAILABLE and slot.preload):
                    self._pending_preload.add(name)
                    slot.request_load(None, reload=True)
                elif slot.state == UNLOADED:
                    slot.register()
        self._retired = [s for s in self._retired if s._thread.is_alive()]

    def _check_ready(self) -> None:
        """READY=1 once the preloaded models have settled (loaded or failed), at start and after a reload."""
        self._pending_preload = {n for n in self._pending_preload if n in self.slots and not self.slots[n].settled()}
        if self._pending_preload or self.draining:
            return
        if not self.ready or self._reloading:
            if not self.ready and self.freeze_gc:
                # Everything alive now (modules, loaded models) lives as long as the daemon: move it
                # out of the collector's view, so the collections that per-request garbage triggers
                # stay short instead of walking the whole heap.
                gc.collect()
                gc.freeze()
            self.ready = True
            self._reloading = False
            self.notifier.ready(self._status_line())
            log.info("ready: %s", self._status_line())

    def _status_line(self) -> str:
        n_ready = sum(1 for s in self.slots.values() if s.state == READY)
        failed = [n for n, s in self.slots.items() if s.state == UNAVAILABLE]
        recovering = [n for n, s in self.slots.items() if s.state == RECOVERING]
        mem = process_rss() / (1 << 20)
        line = f"{n_ready}/{len(self.slots)} models ready, RSS {mem:.0f} MiB"
        if failed:
            line += f", unavailable: {', '.join(sorted(failed))}"
        if recovering:
            line += f", recovering: {', '.join(sorted(recovering))}"
        if self.cache.state != cache.OK:
            line += f", cache {self.cache.state}"
        if self.draining:
            line = "stopping: " + line
        return line

    # ------------------------------------------------------------------ sending

    def _send(self, ident: bytes, frames: list[Any]) -> None:
        self._send_frames([ident, *frames])

    def _send_frames(self, frames: list[Any]) -> None:
        """Send ``[identity, header, tensors...]`` to a client; drops (with a log line) what cannot go."""
        router = self.router
        assert router is not None
        try:
            # send per frame rather than send_multipart, whose type-check pass costs more than the
            # sends for small replies; copy=False still copies frames below zmq.COPY_THRESHOLD.
            for f in frames[:-1]:
                router.send(f, _NOBLOCK_MORE, copy=False)
            router.send(frames[-1], _NOBLOCK, copy=False)
        except zmq.ZMQError as exc:
            ident = frames[0]
            if exc.errno == errno.EHOSTUNREACH:
                log.debug("client %s went away; reply dropped", ident.hex())
            elif exc.errno == errno.EAGAIN:
                self._rl(logging.WARNING, "client %s does not read its replies; reply dropped", ident.hex())
            else:
                self._rl(logging.ERROR, "sending a reply failed: %s", exc)

    def _error(self, ident: bytes, rid: P.RequestId, code: str, message: str,
               retry_after_ms: float | None = None) -> None:
        self._send(ident, P.encode_error(rid, code, message, retry_after_ms))

    def _forward_replies(self) -> None:
        pull = self.pull
        assert pull is not None
        for _ in range(MAX_BATCH * 4):
            if not pull.get(_EVENTS) & _POLLIN:
                return
            try:
                frames = recv_frames(pull, _NOBLOCK)
            except zmq.Again:
                return
            ident = frames[0].bytes
            if not ident:
                self._on_event(frames[1].bytes.decode(), frames[2].bytes.decode())
            else:
                frames[0] = ident
                self._send_frames(frames)

    def after_inline_run(self, t_recv: float) -> None:
        """Called by a slot after running a request (received at ``t_recv``) on this thread: the loop spins
        ``spin_us`` for the next one when requests come close together, i.e. when this one came at most twice
        that long after the previous such run ended (a stream that sends every 32 ms would pay the spin and
        gain nothing). Not while a worker thread is busy: a spinning thread that keeps taking the GIL back
        delays a worker's Python between layers by up to the interpreter's switch interval."""
        spin = self.config.spin_us * 1e-6
        now = time.monotonic()
        prev, self._inline_end = self._inline_end, now
        if spin <= 0 or t_recv - prev > 2 * spin or self._models_busy():
            return
        self._spin_until = now + spin

    def _models_busy(self, but: ModelSlot | None = None) -> bool:
        """Whether a model other than ``but`` has requests queued, or one running on its worker."""
        return any(s.queued or (s.busy and s is not but) for s in self.slots.values())

    def nothing_waiting(self, slot: ModelSlot) -> bool:
        """On the serving thread, as it answers a request it ran itself (``slot``'s): no other request is waiting
        for this thread, nor queued or running on a worker. The reply says so (its info's ``idle``), and only
        then does the client wait for its next reply awake: three clients streaming back to back at once on the
        2-core VM served 7,400 chunks/s when they slept in their polls and 6,000 when they spun."""
        router = self.router
        return router is not None and not router.get(_EVENTS) & _POLLIN and not self._models_busy(slot)

    def _on_event(self, kind: str, name: str) -> None:
        if kind == "state":
            self._check_ready()
            self.enforce_budget()
            self.notifier.status(self._status_line())

    # ------------------------------------------------------------------ memory budget (main thread)

    @staticmethod
    def _open_device() -> Any:
        """The process's Vulkan device if one is open (None otherwise). Never imports the Vulkan module: a CPU-only
        daemon starts no driver to ask, and a model placed on the device has imported it (getattr: another thread
        may be importing it right now)."""
        is_open = getattr(sys.modules.get("inferd.vulkan.device"), "shared_device_if_open", None)
        try:
            return is_open() if is_open is not None else None
        except Exception:  # no loader: nothing on the device
            return None

    def device_shares_host(self) -> bool:
        """Whether the Vulkan device's memory is the host's (an integrated GPU, lavapipe): its models then count
        against the host budget. Known once the device is open (and the same device for the daemon's life; a Vulkan
        model evicted and asked for again is admitted by where its memory will be)."""
        if self._shares_host is None:
            dev = self._open_device()
            if dev is None:
                return False
            self._shares_host = bool(getattr(dev, "shares_host_memory", False))
        return self._shares_host

    def _on_host(self, device: str | None) -> bool:
        """Whether a model placed on ``device`` counts against the host budget."""
        return not budget.on_device(device, self.device_shares_host())

    def _residents(self, device: bool = False) -> list[budget.Resident]:
        """The loaded models the host budget (``device``: the GPU's, every Vulkan placement) plans with."""
        # a model whose unload is queued is on its way out: counted as resident (and busy: not evictable) until its
        # worker gets to it, it had the next look evict a second model for the same shortfall (a loaded machine:
        # test_device_budget's CPU model evicted after the Vulkan one it was meant to keep)
        return [budget.Resident(s.name, streamed.need_bytes(s), s.last_used, s.entry.config.pinned,
                                not s.idle() or s.reslicing)  # (being sliced again: not evictable, as busy)
                for s in self.slots.values()
                if s.model is not None and not s.leaving()
                and (budget.on_device(s.device) if device else self._on_host(s.device))]

    def device_budget_now(self) -> int:
        """The device memory budget: ``device_memory_budget``, else what the open Vulkan device reports (0:
        none open, no budget: nothing is placed there). A device whose memory is the host's has only the
        configured one: its models count against the host budget."""
        if self.device_shares_host():
            return max(0, self.config.device_memory_budget)
        dev = self._open_device() if any(budget.on_device(s.device) for s in self.slots.values()) else None
        avail = dev.memory_report()["available"] if dev is not None else None
        return budget.device_budget(self.config.device_memory_budget, avail)

    def enforce_device_budget(self) -> None:
        """Unload least recently used Vulkan models until those on the device fit its budget."""
        limit = self.device_budget_now()
        if limit <= 0:
            return
        self._evict_to(limit, self._residents(device=True), "device memory budget", "models on the device",
                       "its memory budget")

    def budget_now(self, rss: int | None = None, models: int | None = None) -> int:
        """The models' budget now: the configured one tightened to what the process's cgroup limit leaves
        (read again each time: systemd and container runtimes change it while the board runs). ``rss`` and
        ``models`` (the process's RSS, its models' bytes) when the caller has them already."""
        self.cgroup_limit = budget.cgroup_memory_limit()
        limit = self.budget
        if self.cgroup_limit is not None:
            if models is None:
                models = sum(s.memory_bytes() for s in self.slots.values())
            limit = budget.effective_budget(self.budget, self.cgroup_limit,
                                            (process_rss() if rss is None else rss) - models)
        # memory pressure caps it further until enough quiet time has passed
        return pressure.apply_cap(limit, self.pressure_cap.current(time.monotonic(), ceiling=limit))

    # ------------------------------------------------------------------ memory pressure and the cgroup

    def start_pressure_watch(self) -> None:
        """Watch memory pressure as ``memory_pressure`` says; where PSI is absent or a trigger is refused, say
        why once and run without it."""
        how = (self.config.memory_pressure or "auto").strip()
        if how == "off":
            self.pressure_source = "off"
            return
        w, what = pressure.start(self.on_memory_pressure, None if how == "auto" else how)
        self.pressure_watcher = w
        self.pressure_source = what if w is not None else f"not watched: {what}"
        if w is None:
            log.info("memory pressure not watched (%s); the cgroup's memory.max/memory.high are still read", what)
        else:
            log.info("memory pressure watched through %s", what)

    def stop_pressure_watch(self) -> None:
        if self.pressure_watcher is not None:
            self.pressure_watcher.stop()
            self.pressure_watcher = None

    def on_memory_pressure(self) -> None:
        """From the watcher thread: count the event and wake the main loop, which acts on it."""
        self._pressure_hits += 1
        w = self._wake_w
        if w is not None:
            try:
                w.send(b"p")
            except OSError:
                pass

    def check_memory_sources(self, now: float) -> None:
        """Main loop: act on pressure events since the last look, and on a changed cgroup limit (read every
        CGROUP_PERIOD_S): both go the way ``set_budget`` goes (re-plan the streamed models, evict LRU)."""
        if self._pressure_hits != self._pressure_seen:
            self._pressure_seen = self._pressure_hits
            # what the host budget counts (a discrete GPU's models hold device memory, which host pressure
            # does not relieve)
            held = sum(s.memory_bytes() for s in self.slots.values() if self._on_host(s.device))
            cap = self.pressure_cap.event(now, held)
            self._rl(logging.WARNING, "memory pressure: the models' budget capped at %d bytes (they held %d)", cap,
                     held)
            self.enforce_budget()
            return
        if now - self._cgroup_checked >= CGROUP_PERIOD_S:
            self._cgroup_checked = now
            old = self.cgroup_limit
            if budget.cgroup_memory_limit() != old:
                log.info("cgroup memory limit changed from %s to %s bytes", old, budget.cgroup_memory_limit())
                self.enforce_budget()

    def enforce_budget(self) -> None:
        """Unload least recently used models until the resident ones fit the budget (never pinned or busy ones)."""
        self.enforce_device_budget()
        limit = self.budget_now()
        streamed.rebudget([s for s in self.slots.values() if self._on_host(s.device)], limit)
        if limit <= 0:
            return
        self._evict_to(limit, self._residents(), "memory budget", "models", "the memory budget")

    def _evict_to(self, limit: int, residents: Any, what: str, who: str, whose: str) -> None:
        """Evict (LRU; pinned and busy models stay) until ``residents`` fit ``limit``: the host budget and the
        device budget alike, ``what``/``who``/``whose`` naming which in the messages."""
        v = budget.plan(residents, limit)
        for name in v.evict:
            if self.slots[name].evict(f"evicted to keep the {what} ({limit} bytes); loads again on its next request"):
                log.info("model %s: evicted to keep the %s of %d bytes", name, what, limit)
        if not v.fits:
            self._rl(logging.WARNING, f"{who} that must stay (pinned or busy) exceed {whose} of %d bytes by %d bytes",
                     limit, v.short_by)

    def admit(self, slot: ModelSlot) -> str | None:
        """Before an on-demand load of ``slot``: evict what the budget needs for it to fit (its size as at its
        last load; unknown the first time), or the reason it cannot fit at all."""
        placed = slot.device or slot.last_device  # where its last load placed it (first: host)
        need = streamed.admit_need(slot)
        if need <= 0:
            return None
        # the budgets it counts against: the device's where placed on Vulkan, the host's unless placed on a
        # device with memory of its own (both on an integrated GPU with a device budget set); every one must
        # admit it before anything is evicted for any
        counted = [dev for dev, counts in ((True, budget.on_device(placed)), (False, self._on_host(placed))) if counts]
        evictions = []
        for dev in counted:
            limit = self.device_budget_now() if dev else self.budget_now()
            if limit <= 0:
                continue
            res = [r for r in self._residents(device=dev) if r.name != slot.name]
            v = budget.plan(res, limit, need=need, keep=slot.name)
            if not v.fits:
                held = sum(r.nbytes for r in res if r.pinned or r.busy)
                return budget.describe_shortfall(slot.name, need, limit, held, device=dev)
            evictions.append((dev, limit, v.evict))
        for dev, limit, names in evictions:
            for name in names:
                self.slots[name].evict(f"evicted to make room for {slot.name!r} within the "
                                       f"{'device ' if dev else ''}memory budget ({limit} bytes)")
        return None

    # ------------------------------------------------------------------ requests

    def _peer_of(self, frame: zmq.Frame) -> Peer:
        """Who sent this message: the ZAP verdict its connection carries, through the current policy."""
        try:
            user_id = frame.get("User-Id")
        except zmq.ZMQError:
            return auth.UNAUTHENTICATED  # no verdict: refuse rather than guess
        peer = self._peers.get(user_id)
        if peer is None:
            try:
                peer = self.policy.resolve(user_id)
            except ValueError:
                peer = auth.UNAUTHENTICATED
            if len(self._peers) >= PEER_CACHE_MAX:
                self._peers.clear()
            self._peers[user_id] = peer
        return peer

    def _deny(self, ident: bytes, req: P.Request, peer: Peer) -> None:
        needed = P.required_role(req.op)
        if peer.role is None:
            msg = f"permission denied: {peer.reason}"
        else:
            how = ("a member of admin_group " + repr(self.config.admin_group) if self.config.admin_group
                   else "root or the daemon's own user (admin_group is not set)")
            msg = (f"permission denied: {req.op!r} needs the {needed} role and this client ({peer.desc}) has the "
                   f"{peer.role} role. On the ipc socket, admins are {how}; a CURVE client's key must be "
                   f"authorised under clients/admin (inferd keys client NAME --role admin)")
        self._rl(logging.WARNING, "permission denied: %s asked for %r%s (needs %s, has %s)", peer.desc, req.op,
                 f" on model {req.model!r}" if req.model else "", needed, peer.role or "no role")
        self._error(ident, req.id, P.PERMISSION_DENIED, msg)

    def _handle(self, frames: list[zmq.Frame]) -> None:
        ident = frames[0].bytes
        peer = self._peer_of(frames[0])
        body = frames[1:]
        t_recv = time.monotonic()
        try:
            req = P.decode_request(body, self.limits)
        except P.WireError as exc:
            rid = exc.request_id
            if rid is None and body:
                rid = P.peek_request_id(body[0], self.limits)
            self._rl(logging.WARNING, "bad request from %s: %s", ident.hex(), exc.message)
            self._error(ident, rid, exc.code, exc.message)
            return
        except Exception as exc:  # a decoding gap must cost one reply, never the serving loop
            self._rl(logging.ERROR, "undecodable request from %s: %s: %s", ident.hex(), type(exc).__name__, exc)
            self._error(ident, P.peek_request_id(body[0], self.limits) if body else None, P.INVALID_ARG,
                        f"request could not be decoded: {type(exc).__name__}: {exc}")
            return
        if not P.role_allows(peer.role, req.op):
            self._deny(ident, req, peer)
            return
        self._peer = peer
        try:
            self._ops[req.op](ident, req, t_recv)
        except Exception as exc:
            log.exception("op %s failed", req.op)
            self._error(ident, req.id, P.INTERNAL, f"{req.op}: {type(exc).__name__}: {exc}")

    def _slot(self, ident: bytes, req: P.Request) -> ModelSlot | None:
        slot = self.slots.get(req.model or "")
        if slot is None:
            known = sorted(self.slots)
            self._error(ident, req.id, P.NOT_FOUND,
                        f"model {req.model!r} is not in the repository {self.config.models_dir}; available: {known}")
        return slot

    def _op_infer(self, ident: bytes, req: P.Request, t_recv: float) -> None:
        if self.draining:
            self._error(ident, req.id, P.UNAVAILABLE, "the daemon is stopping; retry after it restarts")
            return
        slot = self._slot(ident, req)
        if slot is None:
            return
        outputs = req.args.get("outputs")
        if outputs is not None and (not isinstance(outputs, list) or not all(isinstance(o, str) for o in outputs)):
            self._error(ident, req.id, P.INVALID_ARG, f"'outputs' must be a list of output names, got {outputs!r}")
            return
        if not req.tensors:
            self._error(ident, req.id, P.INVALID_ARG, f"infer on model {req.model!r} carries no input tensors")
            return
        deadline = None if req.timeout_ms is None else t_recv + req.timeout_ms / 1e3
        if deadline is not None and deadline < self._next_sweep:
            self._next_sweep = deadline
        peer = self._peer
        job = Job(ident, req.id, req.tensors, req.priority, deadline, t_recv, next(self._seq), outputs or None,
                  client=peer.client or "conn " + ident.hex(), wire_inline=req.inline)
        err = slot.submit(job, inline=self._inline_sender)
        if err is not None:
            self._error(ident, req.id, *err)

    def _op_load(self, ident: bytes, req: P.Request, t_recv: float) -> None:
        if self.draining:
            self._error(ident, req.id, P.UNAVAILABLE, "the daemon is stopping")
            return
        if req.model not in self.slots:
            self.rescan()  # a model copied into the repository can be loaded without SIGHUP
        slot = self._slot(ident, req)
        if slot is None:
            return
        short = self.admit(slot) if slot.model is None else None
        if short:
            self._error(ident, req.id, P.UNAVAILABLE, short)
            return
        info = slot.request_load((ident, req.id), reload=bool(req.args.get("reload", False)))
        if info is not None:
            self._send(ident, P.encode_reply(req.id, info))

    def _op_unload(self, ident: bytes, req: P.Request, t_recv: float) -> None:
        slot = self._slot(ident, req)
        if slot is None:
            return
        info = slot.request_unload((ident, req.id))
        if info is not None:
            self._send(ident, P.encode_reply(req.id, info))

    def _op_models(self, ident: bytes, req: P.Request, t_recv: float) -> None:
        self._send(ident, P.encode_reply(req.id, {"models": [self.slots[n].info() for n in sorted(self.slots)]}))

    def _op_health(self, ident: bytes, req: P.Request, t_recv: float) -> None:
        self._send(ident, P.encode_reply(req.id, {"live": True, "ready": self.ready and not self.draining,
                                                   "draining": self.draining}))

    def _op_set_budget(self, ident: bytes, req: P.Request, t_recv: float) -> None:
        nbytes = req.args.get("bytes")
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            self._error(ident, req.id, P.INVALID_ARG, f"set_budget needs args.bytes: an int >= 0 (0 = no budget), got {nbytes!r}")
            return
        self.budget = nbytes
        log.info("memory budget set to %d bytes", nbytes)
        self.enforce_budget()
        self._send(ident, P.encode_reply(req.id, {"budget_bytes": self.budget}))

    def _op_status(self, ident: bytes, req: P.Request, t_recv: float) -> None:
        peer = self._peer
        client = peer.client or "conn " + ident.hex()
        st = self.status()
        st["you"] = {"role": peer.role, "who": peer.desc, "client": client, "inflight": self.shares.inflight(client)}
        self._send(ident, P.encode_reply(req.id, st))

    def _op_reload(self, ident: bytes, req: P.Request, t_recv: float) -> None:
        err = self.reload()
        if err:
            self._error(ident, req.id, P.INVALID_ARG, err)
        else:
            self._send(ident, P.encode_reply(req.id, {"config_file": self._config_path or "",
                                                       "models": sorted(self.slots),
                                                       "authorized_keys": len(self.policy.keys)}))

    def status(self) -> dict[str, Any]:
        try:
            import inferd

            version = getattr(inferd, "__version__", "")
        except Exception:
            version = ""
        models: dict[str, Any] = {}
        models_bytes = 0
        for name in sorted(self.slots):
            s = self.slots[name]
            mem = s.memory_bytes()
            models_bytes += mem
            models[name] = {"state": s.state, "reason": s.reason, "device": s.device, "queued": s.queued,
                            "memory_bytes": mem, "pinned": s.entry.config.pinned, **s.stats.snapshot(),
                            **s.memory_breakdown(),
                            "cold": s.cold_stats(), "warm": s.warm(), "known_bytes": s.known_bytes,
                            "evictions": s.evictions,
                            "idle_s": round(time.monotonic() - s.last_used, 3) if s.last_used else None,
                            **s._coexec_info(), **s.threads_info(), **s.registration_info()}
        rss = process_rss()
        from ..package import parsed_stats
        from ..runtime import hostpool
        from ..store import index_stats

        pool = hostpool.current()
        pool_stats = pool.stats() if pool is not None else None
        # the pool's free part is memory the daemon holds for the next cold loads (its used part is the models')
        pool_free = pool_stats["prefaulted_bytes"] - pool_stats["in_use_bytes"] if pool_stats else 0
        dev_pool = self.device_pool_status()
        for p in (dev_pool, (dev_pool or {}).get("host")):
            if p and p["host_memory"]:  # in the RSS too (lavapipe, a unified-memory board, the host regions' pool)
                pool_free += p["capacity_bytes"] - p["in_use_bytes"]
        return {
            "live": True, "ready": self.ready and not self.draining, "draining": self.draining,
            "version": version, "protocol": P.PROTOCOL_VERSION, "pid": os.getpid(),
            "uptime_s": round(time.monotonic() - self._t_start, 3), "endpoint": self.config.endpoint,
            "models_dir": self.config.models_dir, "device": self.config.device,
            "devices_in_use": sorted({s.device for s in self.slots.values() if s.device}),
            "remote_endpoint": self.config.remote_endpoint or None,
            "security": auth.describe(self.config, self.policy),
            "clients_inflight": len(self.shares.snapshot()),
            "serving_spin": {"spins": int(self._spin_stats[0]), "seconds": round(self._spin_stats[1], 6),
                             "caught_requests": int(self._spin_stats[2]), "spin_us": self.config.spin_us},
            "memory": {"rss_bytes": rss, "models_bytes": models_bytes, "budget_bytes": self.budget,
                       "effective_budget_bytes": self.budget_now(rss, models_bytes),
                       "cgroup_limit_bytes": self.cgroup_limit,
                       "device": {"budget_bytes": self.device_budget_now(),
                                  "configured_bytes": self.config.device_memory_budget,
                                  # its models count against the host budget (an integrated GPU, lavapipe)
                                  "shares_host_memory": self.device_shares_host(),
                                  "models_bytes": sum(s.memory_bytes() for s in self.slots.values()
                                                      if budget.on_device(s.device))},
                       "pressure": {"source": self.pressure_source, "events": self.pressure_cap.events,
                                    "cap_bytes": self.pressure_cap.current(time.monotonic())},
                       # what RSS holds beyond the models' arenas and weights: interpreter, libraries, driver
                       "overhead_bytes": max(0, rss - models_bytes - max(0, pool_free)),
                       "host_pool": pool_stats,
                       "device_pool": dev_pool,
                       # freed heap given back to the system (heap_trim), so far
                       "heap": heap.stats(),
                       # packages' plans and store indexes kept parsed for their next load (in the overhead)
                       "metadata_cache": {**parsed_stats(), **index_stats()},
                       # clean pages of the loaded models' packages in the page cache: memory too, and the
                       # kernel's to drop (the weights store bypasses it with O_DIRECT when not resident)
                       "page_cache_bytes": self.package_cache_bytes()},
            "budget_bytes": self.budget,
            "models": models,
            "totals": {k: sum(m[k] for m in models.values()) for k in ("requests", "ok", "failures")},
            "cache": {**self.cache.snapshot(), "bytes_used": self.cache_bytes(), "max_bytes": self.cache_max_bytes},
            "faults": self.fault_status(),
            "vulkan_pipelines": self.pipeline_status(),
        }

    def start_resident_pipelines(self, after_recovery: bool = False) -> threading.Thread | None:
        """Create the device's recently used Vulkan pipelines in the background (``resident_pipelines``), if
        the cache directory lists some: a cold load of a model served before then creates none of its own.
        At the start, and ``after_recovery`` once more: a device recreated after a fault holds only the
        pipelines of the models the recovery loaded again, and the others' next cold loads would create theirs
        (about 10 ms a pipeline on lavapipe) as if the daemon had just started."""
        from ..vulkan import resident

        n = self.config.resident_pipelines
        if n <= 0 or not resident.listed():
            return None
        attr = "resident_after_recovery" if after_recovery else "resident_pipelines"

        def run() -> None:
            setattr(self, attr, {"running": True})
            setattr(self, attr, _make_resident(n))

        t = threading.Thread(target=run, name="inferd-pipelines", daemon=True)
        t.start()
        return t

    def pipeline_status(self) -> dict[str, Any] | None:
        """The shared Vulkan device's pipelines (None while no device is open)."""
        try:
            from ..vulkan.device import shared_device_if_open
        except Exception:  # no Vulkan binding here
            return None
        dev = shared_device_if_open()
        if dev is None:
            return None
        return {"held": dev.pipeline_count(), "listed": len(dev.pipeline_list), "at_start": self.resident_pipelines,
                "after_recovery": self.resident_after_recovery}

    def device_pool_status(self) -> dict[str, Any] | None:
        """The open Vulkan device's pool (``device_pool``; None while no device is open or it has none)."""
        try:
            from ..vulkan.device import shared_device_if_open
        except Exception:  # no Vulkan binding here
            return None
        dev = shared_device_if_open()
        return dev.pool_stats() if dev is not None else None

    def package_cache_bytes(self) -> int:
        """Page-cache bytes of the loaded models' package files (mincore)."""
        from ..runtime.pagecache import resident_in

        pkgs = {str(p) for s in list(self.slots.values()) for m in (s.model, getattr(s, "fallback_model", None))
                if (p := getattr(m, "package", None)) is not None}
        try:
            return resident_in(sorted(pkgs))
        except OSError:
            return 0

    def cache_bytes(self) -> int:
        """Bytes the cache directory holds (walked at most every 2 s: status may be polled)."""
        t, n = self._cache_bytes
        now = time.monotonic()
        if now - t > 2.0:
            n = cache.tree_bytes(self.config.cache_dir)
            self._cache_bytes = (now, n)
        return n

    def fault_status(self) -> dict[str, Any]:
        with self._events_lock:
            out: dict[str, Any] = {"counts": dict(self.event_counts), "recent": list(self.events),
                                   "recovering": sorted(n for n, s in self.slots.items() if s.state == RECOVERING),
                                   "last_recovery_s": self.last_recovery_s}
        if faults.enabled:
            out["injected"] = faults.fired()
        return out

    # ------------------------------------------------------------------ loads, faults, recovery

    def load(self, slot: ModelSlot, path: str, device: str, batch: int, **dynamic: Any) -> Any:
        """Load one model through the loader (the package cache's health is the loader's business),
        then keep the packages under ``cache_max_bytes``. Any thread. ``dynamic``: the model's shapes to
        prepare and bounds, where its config sets them."""
        if device != "cpu":
            try:
                from ..vulkan.device import set_fence_timeout

                set_fence_timeout(self.config.gpu_timeout)
            except Exception:  # no Vulkan module here: nothing waits on fences
                pass
        if slot.entry.config.memory == "stream":  # inside its share of the budget, weights streamed
            # ("cpu+vulkan" with memory = "stream" is refused when its config is read)
            model = streamed.load_for_slot(self, slot, path, batch, "vulkan" if device == "vulkan" else "cpu")
        else:
            model = self.loader(path, device=device, batch=batch, **dynamic)
        if isinstance(getattr(model, "name", None), str) and model.name != slot.name:
            # its logs and input errors name it as the apps do, not by its file: every DIR/NAME/model.onnx of a
            # repository had logged as "model model: ..."
            try:
                model.name = slot.name
            except AttributeError:  # a loader's own model type with a read-only name
                pass
        if hasattr(model, "max_variants"):
            mv = slot.entry.config.max_variants
            model.max_variants = mv if mv is not None else self.config.max_variants
        if self.cache.state == cache.OK:
            from ..runtime.cold import after_answer

            # in idle time: walking the cache beside a cold load's stream took its first answer 0.5-1.3 ms. The job
            # holds the package's path, not the model: a model closed meanwhile must not wait for it to be freed
            pkg = getattr(model, "package", None)
            after_answer(lambda: self._trim_cache(pkg))
        return model

    def _trim_cache(self, loaded: Any) -> None:
        """Keep the cache's packages under ``cache_max_bytes``, never deleting one a model uses or ``loaded`` (the
        package of the load that asked)."""
        if self.cache.state != cache.OK:
            return
        keep = {str(p) for s in list(self.slots.values()) for m in (s.model, s.fallback_model)
                if (p := getattr(m, "package", None)) is not None}
        if loaded is not None:
            keep.add(str(loaded))
        cache.evict(self.packages_dir, self.cache_max_bytes, keep)

    def record_event(self, model: str, kind: str, detail: str) -> None:
        """A fault or recovery: counted, kept for status, and logged (the journal under systemd)."""
        ev = {"time": round(time.time(), 3), "model": model, "event": kind, "detail": detail[:500]}
        with self._events_lock:
            self.events.append(ev)
            self.event_counts[kind] = self.event_counts.get(kind, 0) + 1
        level = logging.INFO if kind in ("recovered",) else logging.WARNING
        self._rl(level, "model %s: %s: %s", model, kind, detail)

    def retry_after_ms(self) -> int:
        """The hint sent with an UNAVAILABLE during a recovery: about one recovery's time."""
        last = self.last_recovery_s
        return int(1000 * min(30.0, max(0.2, last if last is not None else 1.0)))

    def note_deadline(self, deadline: float | None) -> None:
        """A requeued job's deadline (a benign race from worker threads: the sweep may run early, never late)."""
        if deadline is not None and deadline < self._next_sweep:
            self._next_sweep = deadline

    def on_fault(self, slot: ModelSlot, model: Any, exc: BaseException, kind: str | None) -> None:
        """A run hit a device or cache fault: record it and start the recovery (once per fault: a
        fault of a model already being recovered only counts)."""
        self.record_event(slot.name, f"{kind}_fault", f"{type(exc).__name__}: {exc}")
        with self._recovery_lock:
            if model is not slot.model or slot.state != READY:
                return  # the fallback's fault, or a recovery already took this model away
            vulkan = kind == "device" and slot.device in _SHARED_DEVICES
            if not slot.begin_recovery(f"{type(exc).__name__}: {exc}"):
                return
            self._recover_queue.append((slot, vulkan))
            if self._recovery_thread is None:
                self._recovery_thread = threading.Thread(target=self._recovery_loop, name="inferd-recovery",
                                                         daemon=True)
                self._recovery_thread.start()

    def _recovery_loop(self) -> None:
        sender = self.reply_sender()
        try:
            while True:
                with self._recovery_lock:
                    items, self._recover_queue = self._recover_queue, []
                    if not items:
                        self._recovery_thread = None
                        return
                slots = list(dict.fromkeys(s for s, _ in items))
                try:
                    self._recover(slots, any(v for _, v in items), sender)
                except Exception:  # never leave slots RECOVERING because of a bug here
                    log.exception("recovery failed")
                    for s in slots:
                        s.finish_recovery(sender)
        finally:
            sender.close()

    def _recover(self, slots: list[ModelSlot], vulkan: bool, sender: Any) -> None:
        """Serve on the CPU fallbacks, drop the failed models (and the Vulkan device: every model on it
        goes with it), then load them again on a fresh device."""
        t0 = time.monotonic()

        def join_device_models() -> None:
            for s in list(self.slots.values()):
                if s not in slots and s.device in _SHARED_DEVICES and s.begin_recovery("the Vulkan device is recreated"):
                    slots.append(s)
        if vulkan:
            join_device_models()
        sender.event("state", "")
        for s in slots:
            s.load_fallback()
        # ahead of every waiter: runs on the failed device have no use any more
        with self.device_lock.hold(1 << 30, 1 << 30):
            if vulkan:
                join_device_models()
            for s in slots:
                m = s.take_model()
                if m is not None:
                    try:
                        m.close()
                    except Exception as exc:  # a lost device may refuse even that
                        log.debug("model %s: close after a fault: %s", s.name, exc)
            if vulkan:
                try:
                    from ..vulkan.device import close_shared_device

                    close_shared_device()
                except Exception as exc:
                    log.warning("closing the failed Vulkan device: %s: %s", type(exc).__name__, exc)
        t_reload = time.monotonic()
        results = [(s.name, *s.finish_recovery(sender)) for s in slots]
        if vulkan:
            self.start_resident_pipelines(after_recovery=True)  # the new device's, behind the reloads above
        dt = time.monotonic() - t0
        self.last_recovery_s = dt
        ok = [n for n, good, _ in results if good]
        bad = [f"{n}: {why}" for n, good, why in results if not good]
        what = "device recreated, " if vulkan else ""
        self.record_event(",".join(n for n, *_ in results), "recovered" if not bad else "recovery_failed",
                          f"{what}{len(ok)}/{len(results)} models back in {dt:.3f} s (reload {time.monotonic() - t_reload:.3f} s)"
                          + (f"; failed: {'; '.join(bad)}" if bad else ""))
        sender.event("state", "")

    # ------------------------------------------------------------------ signals, reload, drain

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if signum == signal.SIGHUP:
            self._reload_requested = True
        else:
            self._stop_requests += 1

    def reload(self) -> str | None:
        """SIGHUP or the reload op: re-read the config, the groups and the authorised keys, rescan the
        repository. Returns the error that kept the old configuration, if any."""
        self._reload_requested = False
        log.info("reloading configuration and rescanning %s", self.config.models_dir)
        self.notifier.reloading()
        error = None
        try:
            new = load_config(self._cli, self._config_path)
        except ConfigError as exc:
            error = f"configuration reload failed, keeping the old one: {exc}"
            new = self.config
        for key in ("endpoint", "socket_mode", "socket_group", "remote_endpoint", "curve", "keys_dir",
                    "allow_insecure_remote"):
            if getattr(new, key) != getattr(self.config, key):
                log.warning("option %s changed to %r: takes effect after a restart", key, getattr(new, key))
                new = new.replace(**{key: getattr(self.config, key)})
        try:
            # Open connections are judged by the new groups and keys from their next message on.
            policy = Policy.from_config(new)
        except ConfigError as exc:
            error = f"configuration reload failed, keeping the old one: {exc}"
            new, policy = self.config, self.policy
        if error:
            log.error("%s", error)
        if new.memory_budget != self.config.memory_budget:
            self.budget = new.memory_budget
            self.enforce_budget()
        if new.log_level != self.config.log_level:
            logging.getLogger("inferd").setLevel(new.log_level.upper())
        device_budget_changed = new.device_memory_budget != self.config.device_memory_budget
        self.config = new
        if device_budget_changed:
            self.enforce_device_budget()
        self.limits = self._limits(new)
        self.policy = policy
        self._peers.clear()
        self.shares.cap = new.max_inflight_per_client
        self._reloading = True
        self.rescan()
        self._check_ready()
        return error

    def _begin_drain(self, now: float) -> None:
        self.draining = True
        self._drain_deadline = now + self.config.drain_timeout
        queued = sum(s.queued for s in self.slots.values())
        log.info("stopping: draining %d queued requests (up to %.1f s)", queued, self.config.drain_timeout)
        self.notifier.stopping(self._status_line())

    def _drained(self, now: float) -> bool:
        if all(s.idle() for s in self.slots.values()):
            return True
        if now >= self._drain_deadline or self._stop_requests > 1:
            for s in self.slots.values():
                for job in s.cancel_queued():
                    self._error(job.ident, job.req_id, P.UNAVAILABLE, "the daemon stopped before running this request")
            busy = [n for n, s in self.slots.items() if not s.idle()]
            if busy and not self._drain_warned:
                self._drain_warned = True
                log.warning("drain timeout: queued requests answered UNAVAILABLE; still running: %s", busy)
            return not any(s.busy for s in self.slots.values()) or now >= self._drain_deadline + 5.0
        return False

    # ------------------------------------------------------------------ main loop

    def _sweep_deadlines(self, now: float) -> float | None:
        """Answer expired queued requests; returns the next deadline. Cheap when none is due."""
        if now < self._next_sweep:
            return None if self._next_sweep == float("inf") else self._next_sweep
        nearest: float | None = None
        for slot in self.slots.values():
            for job in slot.expire(now):
                self._error(job.ident, job.req_id, P.DEADLINE_EXCEEDED,
                            f"model {slot.name!r}: deadline passed after {1e3 * (now - job.t_recv):.1f} ms "
                            "in the queue; not run")
            d = slot.next_deadline()
            if d is not None and (nearest is None or d < nearest):
                nearest = d
        self._next_sweep = float("inf") if nearest is None else nearest
        return nearest

    def _stalled(self, now: float) -> bool:
        limit = self.config.stall_timeout
        if limit <= 0:
            return False
        for s in self.slots.values():
            since = s.running_since
            if since is not None and now - since > limit:
                if not self._stalled_logged:
                    log.error("model %s has been running for %.1f s (> stall_timeout): stopping the watchdog",
                              s.name, now - since)
                    self._stalled_logged = True
                return True
        return False

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT (``bind`` first). Returns the exit code."""
        assert self.router is not None and self.pull is not None
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        old_wakeup: int | None = None
        old_handlers: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            old_wakeup = signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                old_handlers[sig] = signal.signal(sig, self._on_signal)
        router, pull, wake_fd = self.router, self.pull, wake_r.fileno()
        self._wake_w = wake_w
        self.start_pressure_watch()
        # zmq_poll on a fixed item list: zmq.Poller rebuilds the list and a dict on every call.
        poll_items = [(router, _POLLIN), (pull, _POLLIN), (wake_fd, _POLLIN)]
        zmq_poll = zmq.zmq_poll
        sched_yield = os.sched_yield
        handle = self._handle
        try:
            self.rescan()
            self._check_ready()
            if not self.ready:
                self.notifier.status(f"loading {len(self._pending_preload)} models: {self._status_line()}")
            while True:
                now = time.monotonic()
                nearest = self._sweep_deadlines(now)
                self.check_memory_sources(now)
                if self._stop_requests and not self.draining:
                    self._begin_drain(now)
                if self._reload_requested and not self.draining:
                    self.reload()
                if self.draining and self._drained(now):
                    break
                if self.notifier.watchdog_due(now) and not self._stalled(now):
                    self.notifier.watchdog(now)
                if now - self._last_status >= STATUS_PERIOD_S:
                    self._last_status = now
                    self.enforce_budget()  # models that were busy at the last change may be idle now
                    self.notifier.status(self._status_line())
                timeout = min(STATUS_PERIOD_S, CGROUP_PERIOD_S)
                if self.notifier.watchdog_interval is not None:
                    timeout = min(timeout, self.notifier.watchdog_interval / 2)
                if nearest is not None:
                    timeout = min(timeout, max(0.0, nearest - now) + 0.0005)
                if self.draining:
                    timeout = min(timeout, 0.02)
                # the next request of a stream often comes within microseconds of the last reply: waiting for
                # it awake costs less than waking up (on the 2-core VM a core that slept ran the VAD's next run
                # in 140-240 us against 84 hot)
                events = None
                t_spin = time.monotonic()
                if self._spin_until > t_spin:
                    while self._spin_until > time.monotonic():
                        events = zmq_poll(poll_items, 0)
                        if events:
                            break
                        # a thread woken on this core (zmq's I/O thread bringing the request) runs at once
                        sched_yield()
                    self._spin_stats[0] += 1
                    self._spin_stats[1] += time.monotonic() - t_spin
                    self._spin_stats[2] += bool(events and any(sock is router for sock, _ev in events))
                if not events:
                    self._spin_until = 0.0
                    events = zmq_poll(poll_items, int(timeout * 1000) + 1)
                elif any(sock is router for sock, _ev in events):
                    self._spin_until = 0.0  # set again if this request runs on this thread
                # else a wake (memory pressure, a signal) or another model's reply came during the spin: handled,
                # then the spin goes on; it waits for the stream's next request, which has not come yet
                for sock, _ev in events:
                    if sock is router:
                        # Ask the socket whether more is queued rather than recv until zmq.Again:
                        # building that exception costs more than the getsockopt.
                        for i in range(MAX_BATCH):
                            try:
                                frames = recv_frames(router, _NOBLOCK)
                            except zmq.Again:
                                break
                            handle(frames)
                            if not router.get(_EVENTS) & _POLLIN:
                                break
                            # Finished work first: under a flood of new requests a reply would
                            # otherwise wait for the whole batch (most of them refusals).
                            if i & 7 == 7 and pull.get(_EVENTS) & _POLLIN:
                                self._forward_replies()
                    elif sock is pull:
                        self._forward_replies()
                    else:
                        try:
                            while wake_r.recv(512):
                                pass
                        except BlockingIOError:
                            pass
            self._forward_replies()
            log.info("drained; shutting down")
            return 0
        finally:
            self.stop_pressure_watch()
            self._wake_w = None
            self._shutdown()
            if old_handlers:
                for sig, h in old_handlers.items():
                    signal.signal(sig, h)
                signal.set_wakeup_fd(old_wakeup if old_wakeup is not None else -1)
            wake_r.close()
            wake_w.close()

    def _shutdown(self) -> None:
        slots = list(self.slots.values()) + self._retired
        for s in self.slots.values():
            s.retire("unloaded: the daemon is stopping")
        deadline = time.monotonic() + 10.0
        while any(s._thread.is_alive() for s in slots) and time.monotonic() < deadline:
            if self.pull is not None and self.pull.poll(20):
                self._forward_replies()
        if self.pull is not None:
            self._forward_replies()
            self.pull.close(0)
        if self.router is not None:
            self.router.close(2000)  # let the last replies reach their clients
        if self.authenticator is not None:
            self.authenticator.stop()
            self.authenticator = None
        if any(s._thread.is_alive() for s in slots):
            # A run that never returns still holds its reply socket; term() would wait for it forever.
            log.error("exiting with model threads still running: %s",
                      [s.name for s in slots if s._thread.is_alive()])
        else:
            self.ctx.term()
        path = P.ipc_path(self.config.endpoint)
        if path is not None and self._lockfile is not None:
            # We hold the lock, so the file is ours; a leftover would only look stale to the next start.
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self._release_lock()
        if self.notifier.enabled and not self.draining:
            self.notifier.stopping()


def serve_main(argv: Sequence[str] | None = None, *, loader: Callable[..., Any] | None = None) -> int:
    """``inferd serve``: parse the command line, bind, serve until stopped. Returns the exit code."""
    try:
        config, cli, config_path = parse_argv(argv)
    except ConfigError as exc:
        print(f"inferd serve: {exc}", file=sys.stderr)
        return 2
    kind = setup_logging(config.log_level)
    log.debug("logging to %s", kind)
    # a crash leaves its Python frames and its native ones in the journal (stderr), not just "code=dumped"
    import faulthandler

    from .. import native

    try:
        faulthandler.enable()
    except (RuntimeError, ValueError, OSError) as e:  # no usable stderr (started with fd 2 closed): serve without
        log.warning("no crash traceback on stderr: %s", e)
    native.install_crash_report()
    apply_threads(config.threads)
    from .. import package

    # a model its cache lacks is compiled in a child: a compile in this process imports onnx, and the daemon answered
    # nobody for the 1-2.5 s that holds the GIL (runtime.childcompile)
    package.compile_in_children()
    # a request's thread takes the GIL back after every call that let it go (a run's native call, a Vulkan fence
    # wait): behind a thread running Python (a cold load's loaders, idle-time refinement, another client's request)
    # it waited up to Python's 5 ms (a small CPU model beside one spinning thread, 2-core VM: p90 5.2 ms a run at
    # 5 ms, 9 us at 0.5 ms). The cold window shortens it further only if this is longer.
    sys.setswitchinterval(config.switch_interval_us / 1e6)
    from ..runtime import hostpool

    hostpool.install(config.host_pool)  # faulted in in the background while the daemon starts
    from ..vulkan import devpool

    devpool.configure(config.device_pool)  # allocated with the Vulkan device, when one opens
    heap.configure(config.heap_trim)  # the daemon owns its heap: freed memory goes back in idle time
    from ..runtime import codepages

    # the code a cold load runs, mapped while the daemon starts rather than faulted in from disk by the first
    # cold load after boot (one fault at a time, behind the weights that load reads)
    warm = threading.Thread(target=codepages.warm_start, kwargs={"rehearse": config.rehearse}, name="inferd-codepages",
                            daemon=True)
    warm.start()
    if config.coexec_threads:  # read by inferd.coexec.load when a cpu+vulkan model loads
        os.environ["INFERD_COEXEC_THREADS"] = str(config.coexec_threads)
    prepare_cache_dir(config.cache_dir)
    try:
        server = Server(config, cli, config_path, loader=loader)
    except ConfigError as exc:
        log.error("%s", exc)
        _join_start([warm])
        return 2
    server.freeze_gc = True
    resident = server.start_resident_pipelines()
    try:
        server.bind()
    except (EndpointBusy, auth.ProtectedModeError, auth.KeysError) as exc:
        log.error("%s", exc)
        server.notifier.status(f"failed to start: {str(exc).splitlines()[0]}")
        if server.authenticator is not None:
            server.authenticator.stop()
        server.ctx.term()
        _join_start([warm, resident])
        return 1 if isinstance(exc, EndpointBusy) else 2
    return server.run()


#: how long a daemon that refuses to start waits for its start's background work before it exits
START_JOIN_S = 30.0


def _join_start(threads: "list[threading.Thread | None]") -> None:
    """Wait (up to ``START_JOIN_S`` in all) for the start's background threads (the cold-load rehearsal, the
    pipelines made resident) before a refused start returns. Why: they run native and Vulkan code and write the
    log, and a process that exits under them can die at interpreter shutdown: a second daemon refused its endpoint
    under the suite's load exited with SIGABRT once and SIGSEGV once (2026-12-07) instead of 1."""
    end = time.monotonic() + START_JOIN_S
    for t in threads:
        if t is not None:
            t.join(max(0.0, end - time.monotonic()))


def _make_resident(limit: int) -> dict[str, Any] | None:
    """The daemon's start (a background thread): open the shared Vulkan device and make its ``limit`` most
    recently used pipelines resident. None when no Vulkan device is usable; a failure is logged and returned,
    never raised (the daemon serves on; loads create their pipelines as before)."""
    from ..vulkan.device import available, get_device

    if limit <= 0 or not available():
        return None
    try:
        st: dict[str, Any] = dict(get_device().make_resident(limit))
    except Exception as e:
        log.warning("making Vulkan pipelines resident failed: %s: %s", type(e).__name__, e)
        return {"error": f"{type(e).__name__}: {e}"}
    # the device served models before this start (it lists their pipelines), so a Vulkan cold load is coming:
    # the backend's modules and its kernels' host bindings are imported now, not on that load's path
    try:
        from ..vulkan import import_load_path

        st["imports_s"] = round(import_load_path(), 6)
    except Exception as e:  # the load imports them itself, and reports what is wrong then
        log.debug("importing the Vulkan load path failed: %s: %s", type(e).__name__, e)
    log.info("%d Vulkan pipelines resident in %.2f s (%d listed, %d skipped)", st["created"], st["seconds"],
             st["listed"], st["skipped"])
    return st
