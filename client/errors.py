"""Exceptions raised by the inferd client.

Two families that callers treat differently:

* transport errors (:class:`TransportError`: :class:`ConnectionError`, :class:`TimeoutError`):
  the request may or may not have reached the daemon; retrying is safe (inference has no side
  effects) and usually right, e.g. while systemd restarts the daemon.
* server errors (:class:`ServerError` and its subclasses): the daemon answered with a
  structured error ``{code, message}``; retrying the same request gives the same answer,
  except :class:`Unavailable` (queue full, model loading, daemon stopping; ``retry_after`` says
  when) and :class:`DeadlineExceeded`, which may succeed later. :class:`PermissionDenied` never
  goes away by retrying.
"""
from __future__ import annotations

import builtins


class InferdClientError(Exception):
    """Base of every error this package raises."""


class TransportError(InferdClientError):
    """No valid reply came back from the daemon (it is down, restarting or too slow)."""


class ConnectionError(TransportError, builtins.ConnectionError):  # noqa: A001 - deliberate shadow
    """The connection to the daemon broke while a request was in flight (e.g. daemon died)."""


class TimeoutError(TransportError, builtins.TimeoutError):  # noqa: A001 - deliberate shadow
    """No reply within the client's timeout (daemon not running, hung or overloaded)."""


class ProtocolError(TransportError):
    """The daemon's reply could not be decoded (version mismatch or corrupted message)."""


class ServerError(InferdClientError):
    """The daemon answered with an error. ``code`` is the wire code, ``message`` its text."""

    code: str = "INTERNAL"
    #: seconds after which the daemon expects a retry to succeed (e.g. while it recovers a GPU), or None
    retry_after: float | None = None

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class InvalidArgument(ServerError):
    """The request was malformed or did not match the model (input name, dtype, shape)."""

    code = "INVALID_ARG"


class NotFound(ServerError):
    """The named model is not in the daemon's repository."""

    code = "NOT_FOUND"


class Unavailable(ServerError):
    """The model cannot serve now: queue full, too many requests of this client in flight, failed
    to load, unloaded, or daemon stopping. ``retry_after`` (seconds, or None) is the daemon's
    estimate of when a retry can be accepted."""

    code = "UNAVAILABLE"

    def __init__(self, message: str, code: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(message, code)
        self.retry_after = retry_after


class PermissionDenied(ServerError):
    """This client may not do that: the op needs the admin role, or the daemon refused the
    connection (not in the socket's group, CURVE key not authorised, no key where one is needed).
    Retrying does not help; the message says what would."""

    code = "PERMISSION_DENIED"


class DeadlineExceeded(ServerError):
    """The request's deadline passed before the daemon could run it; it was not run."""

    code = "DEADLINE_EXCEEDED"


class InternalError(ServerError):
    """The daemon or the model failed unexpectedly while serving the request."""

    code = "INTERNAL"


ERROR_CLASSES: dict[str, type[ServerError]] = {
    cls.code: cls for cls in (InvalidArgument, NotFound, Unavailable, DeadlineExceeded, InternalError, PermissionDenied)
}


def error_from_wire(code: object, message: object, retry_after_ms: float | None = None) -> ServerError:
    """The exception for a wire error; unknown codes (newer daemon) become a plain ServerError.
    ``retry_after`` (seconds or None) carries the daemon's hint that a retry after that long may succeed."""
    code_s = code if isinstance(code, str) else "INTERNAL"
    msg_s = message if isinstance(message, str) else repr(message)
    cls = ERROR_CLASSES.get(code_s)
    exc = ServerError(msg_s, code=code_s) if cls is None else cls(msg_s)
    exc.retry_after = None if retry_after_ms is None else retry_after_ms / 1e3
    return exc
