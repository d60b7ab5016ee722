"""systemd integration: sd_notify (READY, STATUS, WATCHDOG, STOPPING, RELOADING) and logging.

Uses systemd-python's ``systemd.daemon.notify`` when importable, else a small fallback that
writes the datagram to ``$NOTIFY_SOCKET`` itself (path or abstract ``@name`` socket). Outside
systemd (no ``$NOTIFY_SOCKET``) every call is a cheap no-op.
"""
from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Mapping
from typing import Callable

log = logging.getLogger("inferd.server")


def notify_fallback(state: str, notify_socket: str) -> bool:
    """Send one sd_notify datagram without libsystemd."""
    addr = "\0" + notify_socket[1:] if notify_socket.startswith("@") else notify_socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall(state.encode("utf-8"))
        return True
    except OSError as exc:
        log.debug("sd_notify to %s failed: %s", notify_socket, exc)
        return False


def _systemd_notify() -> Callable[[str], bool] | None:
    try:
        from systemd import daemon as sd_daemon  # type: ignore[import-not-found]
    except Exception:
        return None
    fn = getattr(sd_daemon, "notify", None)
    if fn is None:
        return None

    def send(state: str) -> bool:
        return bool(fn(state))

    return send


class Notifier:
    """sd_notify sender plus the watchdog period derived from ``$WATCHDOG_USEC``/``$WATCHDOG_PID``."""

    def __init__(self, environ: Mapping[str, str] | None = None, use_libsystemd: bool = True) -> None:
        env = os.environ if environ is None else environ
        self.socket = env.get("NOTIFY_SOCKET") or None
        self._send: Callable[[str], bool] | None = None
        if self.socket:
            lib = _systemd_notify() if use_libsystemd else None
            sock = self.socket
            self._send = lib or (lambda state: notify_fallback(state, sock))
            self.backend = "libsystemd" if lib else "fallback"
        else:
            self.backend = "none"
        self.watchdog_interval: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid.isdigit() or int(pid) == os.getpid()):
            # systemd's own advice: ping at half the timeout.
            self.watchdog_interval = int(usec) / 2e6
        self._last_watchdog = 0.0

    @property
    def enabled(self) -> bool:
        return self._send is not None

    def send(self, *fields: str) -> bool:
        if self._send is None:
            return False
        return self._send("\n".join(fields))

    def ready(self, status: str = "") -> bool:
        return self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={text}")

    def stopping(self, status: str = "") -> bool:
        return self.send("STOPPING=1", *([f"STATUS={status}"] if status else []))

    def reloading(self) -> bool:
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.send("RELOADING=1", f"MONOTONIC_USEC={usec}", "STATUS=reloading configuration")

    def watchdog_due(self, now: float) -> bool:
        return self.watchdog_interval is not None and now - self._last_watchdog >= self.watchdog_interval

    def watchdog(self, now: float) -> bool:
        self._last_watchdog = now
        return self.send("WATCHDOG=1")


def under_systemd(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return bool(env.get("JOURNAL_STREAM") or env.get("INVOCATION_ID"))


def setup_logging(level: str, environ: Mapping[str, str] | None = None) -> str:
    """Configure the ``inferd`` logger: journald (systemd-python) under systemd, else stderr.

    Returns the handler kind used ("journal" or "stderr").
    """
    logger = logging.getLogger("inferd")
    for h in list(logger.handlers):
        if getattr(h, "_inferd_handler", False):
            logger.removeHandler(h)
    handler: logging.Handler | None = None
    kind = "stderr"
    if under_systemd(environ):
        try:
            from systemd.journal import JournalHandler  # type: ignore[import-not-found]

            handler = JournalHandler(SYSLOG_IDENTIFIER="inferd")
            handler.setFormatter(logging.Formatter("%(message)s"))
            kind = "journal"
        except Exception:
            handler = None
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler._inferd_handler = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(getattr(logging, level.upper(), logging.INFO))
    logger.propagate = False
    return kind
