"""inferd client: talk to the inferd daemon over ZeroMQ (needs only pyzmq, msgpack and numpy).

    from inferd_client import Client
    with Client() as c:
        outputs = c.infer("mlp_small", {"x": x})
"""
from .client import Client
from .errors import (
    ConnectionError,
    DeadlineExceeded,
    InferdClientError,
    InternalError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ProtocolError,
    ServerError,
    TimeoutError,
    TransportError,
    Unavailable,
)
from .protocol import PROTOCOL_VERSION, default_endpoint, parse_size

__all__ = [
    "Client",
    "ConnectionError",
    "DeadlineExceeded",
    "InferdClientError",
    "InternalError",
    "InvalidArgument",
    "NotFound",
    "PROTOCOL_VERSION",
    "PermissionDenied",
    "ProtocolError",
    "ServerError",
    "TimeoutError",
    "TransportError",
    "Unavailable",
    "default_endpoint",
    "parse_size",
]
