"""How a model's worker thread sends replies and events back to the main (ZeroMQ) thread.

Its own module so that the scheduler (which sends) and the daemon (which receives) both import it
rather than each other."""
from __future__ import annotations

from typing import Any

import zmq


class ReplySender:
    """A worker thread's way back to the main thread (one PUSH socket per thread)."""

    def __init__(self, ctx: zmq.Context, addr: str) -> None:
        self.sock = ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.setsockopt(zmq.LINGER, 2000)
        self.sock.connect(addr)

    def send(self, ident: bytes, frames: list[Any]) -> None:
        self.sock.send_multipart([ident, *frames], copy=False)

    def event(self, kind: str, name: str) -> None:
        self.sock.send_multipart([b"", kind.encode(), name.encode()])

    def close(self) -> None:
        self.sock.close()
