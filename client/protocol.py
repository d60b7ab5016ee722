"""The inferd wire protocol: the one definition that the client and the daemon both import.

Transport: ZeroMQ. The daemon binds a ROUTER socket; each client connects a DEALER socket and
sends no empty delimiter frame (so REQ sockets are not supported). Several requests may be in
flight on one DEALER; replies carry the request id and may come back in any order. A message is
a multipart ZeroMQ message::

    [header, tensor_0, tensor_1, ...]          (the ROUTER side sees [identity, header, ...])

``header`` is a msgpack map (never pickle). A request header::

    {"v": 1,                      # PROTOCOL_VERSION; another version is refused with INVALID_ARG
     "id": 17,                    # request id chosen by the client (int or str <= 128 chars), echoed back
     "op": "infer",               # one of OPS
     "model": "tiny",             # model name (infer, load, unload)
     "timeout_ms": 250.0,         # optional deadline, RELATIVE milliseconds counted from the moment the
                                  # daemon receives the message (immune to wall-clock jumps; transport
                                  # time before receipt, microseconds over ipc, is not counted).
                                  # A request still queued when it expires is answered DEADLINE_EXCEEDED
                                  # and never run.
     "priority": 0,               # optional int; higher runs first within the model's queue
     "args": {...},               # optional op arguments (load: {"reload": bool}; set_budget: {"bytes": int};
                                  # infer: {"outputs": [names]} to return only some outputs; reload: none)
     "tensors": [{"name": "x", "dtype": "float32", "shape": [1, 3, 8, 8]}, ...]}

Each tensor entry describes the raw frame at the same position after the header: C-order,
little-endian (native on every platform inferd targets), ``len(frame) == prod(shape) * itemsize``.
For ``infer`` a single tensor named ``""`` means "the model's only input".

Small tensors may instead travel inside the header: an entry with ``"data"`` (msgpack bin, same
layout and size rule) takes no frame, and the frames after the header belong, in order, to the
entries without ``"data"``. The client does this when a request's tensors total at most
INLINE_MAX_BYTES (one frame instead of one per tensor: each frame costs a few microseconds on
both sides, which is most of a small model's round trip); up to INLINE_MAX_BYTES of inline data
do not count against ``max_header_bytes``. The daemon answers such a request's small outputs
inline too, and only such a request's, so a client that never inlines never sees an inline reply.

A reply header::

    {"v": 1, "id": 17, "ok": true, "result": {...}, "tensors": [...]}        + tensor frames
    {"v": 1, "id": 17, "ok": false, "error": {"code": "INVALID_ARG", "message": "..."}}
    {"v": 1, "id": 17, "ok": false, "error": {"code": "UNAVAILABLE", "message": "...", "retry_after_ms": 12.5}}

Error codes: ERROR_CODES. ``retry_after_ms`` (optional, UNAVAILABLE only) is the daemon's estimate of
when a retry can be accepted.

Roles: every op needs a role (:func:`required_role`). ``infer`` may run INFER_ROLE_OPS (infer,
models, status, health); every other op, present and future, changes the daemon's state and
needs ``admin``. A connection's role comes from who it is (the kernel's peer credentials on ipc,
the client's key on CURVE); a forbidden op is answered PERMISSION_DENIED. A message whose header cannot be read at all is answered with
``"id": null``. Everything coming off the socket is validated before use (see :func:`decode_request`);
claimed sizes are checked against the real frame lengths, never used to allocate.
"""
from __future__ import annotations

import math
import os
import re
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import msgpack
import numpy as np

PROTOCOL_VERSION = 1

OPS: tuple[str, ...] = ("infer", "load", "unload", "models", "status", "set_budget", "health", "reload")
OPS_WITH_MODEL: frozenset[str] = frozenset({"infer", "load", "unload"})

ROLE_INFER = "infer"
ROLE_ADMIN = "admin"
ROLES: tuple[str, ...] = (ROLE_INFER, ROLE_ADMIN)
# Listed positively: an op added later needs admin unless it is added here on purpose.
INFER_ROLE_OPS: frozenset[str] = frozenset({"infer", "models", "status", "health"})


def required_role(op: str) -> str:
    """The least role that may run ``op``."""
    return ROLE_INFER if op in INFER_ROLE_OPS else ROLE_ADMIN


def role_allows(role: str | None, op: str) -> bool:
    return role == ROLE_ADMIN or (role == ROLE_INFER and op in INFER_ROLE_OPS)

INVALID_ARG = "INVALID_ARG"
NOT_FOUND = "NOT_FOUND"
UNAVAILABLE = "UNAVAILABLE"
DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
INTERNAL = "INTERNAL"
PERMISSION_DENIED = "PERMISSION_DENIED"
ERROR_CODES: tuple[str, ...] = (INVALID_ARG, NOT_FOUND, UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, PERMISSION_DENIED)

ALLOWED_DTYPES: frozenset[str] = frozenset(
    {"bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
     "float16", "float32", "float64"}
)

# numpy's dtype.name is computed in Python on every access; this lookup is a dict hit.
_DTYPE_NAME: dict[np.dtype, str] = {np.dtype(n): n for n in ALLOWED_DTYPES}
_WIRE_DTYPE: dict[str, np.dtype] = {n: np.dtype(n).newbyteorder("<") for n in ALLOWED_DTYPES}

#: a message whose tensors total at most this travels in one frame (see the module docstring); well under
#: the daemon's smallest sensible max_header_bytes
INLINE_MAX_BYTES = 4096

# Below this size pyzmq copies anyway (zmq.COPY_THRESHOLD), so zero-copy bookkeeping would only cost.
ZERO_COPY_MIN_BYTES = 64 * 1024

MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
TENSOR_NAME_MAX = 256
REQUEST_ID_STR_MAX = 128
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1

SOCKET_NAME = "inferd.sock"
SYSTEM_SOCKET = "/run/inferd/" + SOCKET_NAME

Frame = Any  # zmq.Frame, bytes, memoryview or a contiguous ndarray
RequestId = Union[int, str, None]


@dataclass(frozen=True)
class Limits:
    """What the receiving side accepts. The daemon takes these from its config."""

    max_message_bytes: int = 128 * 1024 * 1024
    max_header_bytes: int = 64 * 1024
    max_tensors: int = 64
    max_dims: int = 8


DEFAULT_LIMITS = Limits()
# Replies come from the daemon the client chose to trust; the checks still run, the caps are loose.
_REPLY_LIMITS = Limits(max_message_bytes=2**62, max_header_bytes=16 * 1024 * 1024, max_tensors=4096, max_dims=64)


class WireError(Exception):
    """A message that breaks the protocol; carries the structured error to answer with."""

    def __init__(self, code: str, message: str, request_id: RequestId = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


@dataclass
class Request:
    id: RequestId
    op: str
    model: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    timeout_ms: float | None = None
    priority: int = 0
    inline: bool = False  # its tensors came inside the header: the client takes small outputs that way too


@dataclass
class Reply:
    id: RequestId
    ok: bool
    result: dict[str, Any] = field(default_factory=dict)
    error_code: str | None = None
    error_message: str | None = None
    retry_after_ms: float | None = None  # an error's hint: a retry after this long may succeed
    tensors: dict[str, np.ndarray] = field(default_factory=dict)


# --------------------------------------------------------------------------- endpoint helpers


def default_endpoint(environ: Mapping[str, str] | None = None) -> str:
    """The endpoint used when none is given; the daemon's config uses this same function.

    Order: ``$INFERD_ENDPOINT``; ``ipc://$RUNTIME_DIRECTORY/inferd.sock`` (systemd sets it for the
    service); the system service's socket ``/run/inferd/inferd.sock`` if it exists (so an app
    started outside the service finds it); ``ipc://$XDG_RUNTIME_DIR/inferd.sock``; else
    ``ipc://<tempdir>/inferd-<uid>/inferd.sock``.
    """
    env = os.environ if environ is None else environ
    explicit = env.get("INFERD_ENDPOINT", "").strip()
    if explicit:
        return explicit
    runtime = env.get("RUNTIME_DIRECTORY", "").strip()
    if runtime:
        # systemd joins several RuntimeDirectory= entries with ':'; ours is the first.
        return "ipc://" + os.path.join(runtime.split(":")[0], SOCKET_NAME)
    if os.path.exists(SYSTEM_SOCKET):
        return "ipc://" + SYSTEM_SOCKET
    xdg = env.get("XDG_RUNTIME_DIR", "").strip()
    if xdg:
        return "ipc://" + os.path.join(xdg, SOCKET_NAME)
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return "ipc://" + os.path.join(tempfile.gettempdir(), f"inferd-{uid}", SOCKET_NAME)


def ipc_path(endpoint: str) -> str | None:
    """The filesystem path of an ``ipc://`` endpoint, None for other transports or abstract sockets."""
    if not endpoint.startswith("ipc://"):
        return None
    path = endpoint[len("ipc://"):]
    if path.startswith("@") or not path:
        return None
    return path


_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgtKMGT]?)(i?[bB])?\s*$")


def parse_size(value: int | str) -> int:
    """Bytes from ``1048576``, ``"512M"``, ``"1.5GiB"``, ``"2G"`` (binary units: K=1024)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must be >= 0, got {value}")
        return value
    m = _SIZE_RE.match(str(value))
    if not m:
        raise ValueError(f"expected a size like 1048576, 512M or 2GiB, got {value!r}")
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


# --------------------------------------------------------------------------- tensors


def _frame_view(frame: Frame) -> memoryview:
    t = type(frame)
    if t is memoryview:
        return frame
    if t is bytes:
        return memoryview(frame)
    buf = getattr(frame, "buffer", None)  # zmq.Frame received with copy=False
    if buf is not None:
        return buf
    return memoryview(frame)


def tensor_to_wire(arr: np.ndarray) -> tuple[dict[str, Any], np.ndarray]:
    """(descriptor, frame) for one array; the frame is a flat uint8 view, no copy when contiguous."""
    a = arr if type(arr) is np.ndarray else np.asarray(arr)
    name = _DTYPE_NAME.get(a.dtype)
    if name is not None and a.flags.c_contiguous:  # the common case, without the checks below
        return {"dtype": name, "shape": list(a.shape)}, a.reshape(-1).view(np.uint8)
    if name is None:
        if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and not _LITTLE):
            a = a.astype(a.dtype.newbyteorder("<"))
            name = _DTYPE_NAME.get(a.dtype)
        if name is None:
            raise ValueError(f"dtype {a.dtype} cannot go on the wire; allowed: {sorted(ALLOWED_DTYPES)}")
    if not a.flags.c_contiguous:
        a = a.copy(order="C")  # not np.ascontiguousarray: it turns 0-d arrays into 1-d
    desc = {"dtype": name, "shape": list(a.shape)}
    return desc, a.reshape(-1).view(np.uint8)


_LITTLE = np.little_endian


def encode_tensors(tensors: Mapping[str, np.ndarray],
                   inline: bool = False) -> tuple[list[dict[str, Any]], list[np.ndarray]]:
    """Descriptors and frames; with ``inline``, tensors totalling at most INLINE_MAX_BYTES go into
    their descriptors (``"data"``) and no frame is returned."""
    descs: list[dict[str, Any]] = []
    frames: list[np.ndarray] = []
    total = 0
    for name, arr in tensors.items():
        desc, frame = tensor_to_wire(arr)
        desc["name"] = name
        descs.append(desc)
        frames.append(frame)
        total += frame.nbytes
    if inline and total <= INLINE_MAX_BYTES:
        for desc, frame in zip(descs, frames):
            desc["data"] = frame.data  # a memoryview: msgpack writes it as bin without a bytes copy first
        return descs, []
    return descs, frames


def decode_tensors(
    descs: Any, frames: Sequence[Frame], limits: Limits, request_id: RequestId = None, writable: bool = False
) -> dict[str, np.ndarray]:
    """Arrays viewing the received frames (no copy). Inline tensors (``"data"``) view the header's bytes,
    read-only, or with ``writable`` a copy of them (a few KiB at most). Raises WireError(INVALID_ARG) on any
    mismatch."""

    def bad(msg: str) -> WireError:
        return WireError(INVALID_ARG, msg, request_id)

    if descs is None:
        descs = []
    if not isinstance(descs, list):
        raise bad(f"header 'tensors' must be a list, got {type(descs).__name__}")
    if len(descs) > limits.max_tensors:
        raise bad(f"too many tensors: {len(descs)} (limit {limits.max_tensors})")
    n_framed = len(descs)
    if n_framed != len(frames):  # inline tensors take no frame: count them only when the frames fall short
        n_framed -= sum(1 for d in descs if type(d) is dict and "data" in d)
    if n_framed != len(frames):
        inl = f" ({len(descs) - n_framed} of them inline)" if n_framed != len(descs) else ""
        raise bad(f"header describes {len(descs)} tensors{inl} but the message carries {len(frames)} tensor frames")
    out: dict[str, np.ndarray] = {}
    k = 0  # the next frame
    for i, desc in enumerate(descs):
        if type(desc) is not dict:
            raise bad(f"tensor {i}: descriptor must be a map, got {type(desc).__name__}")
        name = desc.get("name")
        dtype = desc.get("dtype")
        shape = desc.get("shape")
        if type(name) is not str or len(name) > TENSOR_NAME_MAX:
            raise bad(f"tensor {i}: 'name' must be a string of at most {TENSOR_NAME_MAX} chars, got {_short(name)}")
        if name in out:
            raise bad(f"tensor {name!r} appears twice")
        wire_dtype = _WIRE_DTYPE.get(dtype) if type(dtype) is str else None
        if wire_dtype is None:
            raise bad(f"tensor {name!r}: dtype {_short(dtype)} not allowed; expected one of {sorted(ALLOWED_DTYPES)}")
        if type(shape) is not list or len(shape) > limits.max_dims:
            raise bad(f"tensor {name!r}: shape must be a list of at most {limits.max_dims} dims, got {_short(shape)}")
        # Python ints: a huge claimed shape cannot overflow, and is only compared, never allocated.
        expected = wire_dtype.itemsize
        for d in shape:
            if type(d) is not int or d < 0:  # noqa: E721 - exactly int: bool is refused too
                raise bad(f"tensor {name!r}: shape dims must be non-negative ints, got {_short(shape)}")
            expected *= d
        data = desc.get("data")
        if data is None:
            if k == len(frames):  # more framed descriptors than frames (the count above took "data": None)
                raise bad(f"header describes {len(descs)} tensors but the message carries {len(frames)} tensor frames")
            frame = frames[k]
            k += 1
            view = frame if type(frame) is memoryview else _frame_view(frame)
            nbytes = view.nbytes
        elif type(data) is bytes:
            view = bytearray(data) if writable else data  # type: ignore[assignment]
            nbytes = len(data)
        else:
            raise bad(f"tensor {name!r}: inline 'data' must be msgpack bin, got {type(data).__name__}")
        if expected != nbytes:
            raise bad(
                f"tensor {name!r}: {dtype}{shape} needs {expected} bytes but its frame has {nbytes} bytes"
            )
        try:
            # One constructor call instead of frombuffer + reshape; the sizes were checked just above.
            out[name] = np.ndarray(shape, wire_dtype, view)
        except (ValueError, OverflowError):  # an empty tensor whose other dims numpy cannot index
            raise bad(f"tensor {name!r}: shape {_short(shape)} is beyond what an array can have") from None
    if k != len(frames):  # as many descriptors as frames, but some of them inline: frames left over
        raise bad(f"header describes {len(descs)} tensors ({len(descs) - k} of them inline) but the message "
                  f"carries {len(frames)} tensor frames")
    return out


def _short(v: Any, n: int = 80) -> str:
    s = repr(v)
    return s if len(s) <= n else s[: n - 3] + "..."


# --------------------------------------------------------------------------- headers


_packers = threading.local()


def _pack(obj: Any) -> bytes:
    # One Packer per thread: msgpack.packb builds a new one, internal buffer included, per call
    # (about half the cost of packing a request header); Packers are not thread-safe.
    pk = getattr(_packers, "pk", None)
    if pk is None:
        pk = _packers.pk = msgpack.Packer(use_bin_type=True)
    try:
        return pk.pack(obj)
    except BaseException:
        _packers.pk = None  # never reuse a packer an error left mid-message
        raise


def _unpack_header(frame: Frame, limits: Limits, slack: int = 0) -> Any:
    """``slack``: bytes of inline tensor data the header may carry beyond ``max_header_bytes`` (the caller
    checks, once unpacked, that the header without them keeps the limit)."""
    view = _frame_view(frame)
    if view.nbytes > limits.max_header_bytes + slack:
        raise WireError(INVALID_ARG, f"header of {view.nbytes} bytes exceeds the limit of {limits.max_header_bytes}")
    try:
        # strict_map_key: only str/bytes keys; the unpacker bounds lengths by the buffer size.
        return msgpack.unpackb(view, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise WireError(INVALID_ARG, f"header is not valid msgpack: {type(exc).__name__}: {_short(str(exc))}") from None


def _check_id(v: Any) -> RequestId:
    if v is None:
        return None
    if isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**64:
        return v
    if isinstance(v, str) and len(v) <= REQUEST_ID_STR_MAX:
        return v
    return None


def encode_request(
    request_id: RequestId,
    op: str,
    model: str | None = None,
    *,
    args: Mapping[str, Any] | None = None,
    tensors: Mapping[str, np.ndarray] | None = None,
    timeout_ms: float | None = None,
    priority: int = 0,
    inline: bool = False,
) -> list[Any]:
    """Frames of one request (without the identity frame, which ZeroMQ adds). ``inline``: small tensors go
    inside the header (see INLINE_MAX_BYTES), and the daemon answers small outputs the same way."""
    header: dict[str, Any] = {"v": PROTOCOL_VERSION, "op": op}  # "id" last: the rest may come from a template
    if model is not None:
        header["model"] = model
    if timeout_ms is not None:
        header["timeout_ms"] = float(timeout_ms)
    if priority:
        header["priority"] = int(priority)
    if args:
        header["args"] = dict(args)
    frames: list[Any] = []
    if tensors:
        if inline and not args:
            packed = _pack_inline(header, {"id": request_id}, tensors)
            if packed is not None:
                return [packed]
        header["id"] = request_id
        descs, frames = encode_tensors(tensors, inline)
        header["tensors"] = descs
    else:
        header["id"] = request_id
    return [_pack(header), *frames]


#: packed headers of inline requests and replies, split around their tensors' data and keyed by everything but
#: the id, a reply's result and the data: a stream sends the same names, dtypes and shapes every chunk, and
#: splicing the new data into the cached bytes costs a fraction of building and packing the maps again
_TEMPLATES: dict[tuple[Any, ...], list[bytes]] = {}
_TEMPLATES_MAX = 256
_REPLY_FIXED = {"v": PROTOCOL_VERSION, "ok": True}


def _bin_header(n: int) -> bytes:
    if n < 1 << 8:
        return b"\xc4" + n.to_bytes(1, "big")
    if n < 1 << 16:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")


def _inline_segs(fixed: Mapping[str, Any], n_tail: int, specs: Sequence[tuple[str, str, Sequence[int], int]]) -> list[bytes]:
    """The packed bytes of an inline message before each tensor's data: the map header (``fixed``, "tensors" and
    ``n_tail`` entries packed after the data), ``fixed``, then each tensor's descriptor (name, dtype name, shape,
    bytes) up to its data. The one layout both ends use: the sender splices data into it, the receiver matches it."""
    pk = msgpack.Packer(use_bin_type=True)
    head = pk.pack_map_header(len(fixed) + 1 + n_tail)
    for k, v in fixed.items():
        head += pk.pack(k) + pk.pack(v)
    head += pk.pack("tensors") + pk.pack_array_header(len(specs))
    segs = []
    for name, dt, shape, nbytes in specs:
        head += (pk.pack_map_header(4) + pk.pack("dtype") + pk.pack(dt) + pk.pack("shape") + pk.pack(list(shape))
                 + pk.pack("name") + pk.pack(name) + pk.pack("data") + _bin_header(nbytes))
        segs.append(head)
        head = b""
    return segs


@dataclass(frozen=True)
class _Seen:
    """An inline message layout the receiver decoded and validated in full once: a later message whose bytes are
    these segments with data of these sizes between them, then the tail, carries the same fields and tensor
    descriptors, so only its data and tail (the id; a reply's result) need reading. ``req``: a request's fields
    as validated (None for a reply)."""

    segs: tuple[bytes, ...]
    specs: tuple[tuple[str, np.dtype, tuple[int, ...], int], ...]
    n_tail: int
    tail_keys: frozenset[str]
    limits: Limits | None
    req: Request | None = None
    inline_bytes: int = 0  # the tensors' data, in all


#: layouts a receiver has seen (newest first, bounded): a stream sends one layout per model and chunk shape
_SEEN: list[_Seen] = []
_SEEN_MAX = 64


def _learn(header: dict[str, Any], view: memoryview, tensors: Mapping[str, np.ndarray], tail_keys: tuple[str, ...],
           limits: Limits | None, req: Request | None = None) -> None:
    """Remember the layout of an inline message just decoded in full, if rebuilding it gives its exact bytes."""
    descs = header.get("tensors")
    if type(descs) is not list or len(descs) != len(tensors) or list(header)[-len(tail_keys):] != list(tail_keys):
        return
    fixed = {k: v for k, v in header.items() if k != "tensors" and k not in tail_keys}
    if list(header)[len(fixed)] != "tensors":
        return
    specs = []
    for d in descs:
        a = tensors.get(d.get("name")) if type(d) is dict else None
        if a is None or type(d.get("data")) is not bytes:
            return
        specs.append((d["name"], d["dtype"], tuple(d["shape"]), len(d["data"])))
    try:
        segs = _inline_segs(fixed, len(tail_keys), specs)
    except (TypeError, ValueError, OverflowError):
        return
    pos = 0
    for seg, (_n, _dt, _shape, nbytes) in zip(segs, specs):
        if view[pos:pos + len(seg)] != seg:
            return
        pos += len(seg) + nbytes
    try:
        tail = msgpack.unpackb(bytes([0x80 | len(tail_keys)]) + bytes(view[pos:]), raw=False, strict_map_key=True)
    except Exception:  # msgpack raises several unrelated types
        return
    if type(tail) is not dict or list(tail) != list(tail_keys):
        return
    seen = _Seen(tuple(segs), tuple((n, _WIRE_DTYPE[dt], shape, nb) for n, dt, shape, nb in specs), len(tail_keys),
                 frozenset(tail_keys), limits, req, sum(sp[3] for sp in specs))
    _SEEN.insert(0, seen)
    del _SEEN[_SEEN_MAX:]


def _match(view: memoryview, limits: Limits | None, is_request: bool, writable: bool
           ) -> tuple[_Seen, dict[str, np.ndarray], dict[str, Any]] | None:
    """(layout, tensors, tail) when ``view`` is an inline message of a layout seen before; None otherwise (the
    full decode then runs, and reports what is wrong with a message that is not one of them)."""
    for seen in _SEEN:
        segs = seen.segs
        if (seen.req is not None) != is_request or seen.limits is not limits or view[:len(segs[0])] != segs[0]:
            continue
        pos = 0
        out: dict[str, np.ndarray] = {}
        for seg, (name, dt, shape, nbytes) in zip(segs, seen.specs):
            if pos and view[pos:pos + len(seg)] != seg:
                break
            pos += len(seg)
            data = view[pos:pos + nbytes]
            if data.nbytes != nbytes:
                break
            out[name] = np.ndarray(shape, dt, bytearray(data) if writable else data)
            pos += nbytes
        else:
            try:
                tail = msgpack.unpackb(bytes([0x80 | seen.n_tail]) + bytes(view[pos:]), raw=False,
                                       strict_map_key=True)
            except Exception:  # msgpack raises several unrelated types
                return None
            if type(tail) is not dict or tail.keys() != seen.tail_keys:
                return None
            return seen, out, tail
    return None


def _pack_inline(fixed: dict[str, Any], tail: dict[str, Any], tensors: Mapping[str, np.ndarray]) -> bytes | None:
    """One msgpack map of ``fixed``, "tensors" (inline, as encode_tensors writes them) and ``tail`` (packed last,
    each time: the id, a reply's result), built from a cached template keyed by ``fixed`` and the tensors' names,
    dtypes and shapes. None when a tensor needs encode_tensors (another byte order, not contiguous, not an
    ndarray) or they are too big to go inline."""
    key: list[Any] = [tuple(fixed.items())]
    arrays = []
    total = 0
    for name, a in tensors.items():
        if type(a) is not np.ndarray or not a.flags.c_contiguous:
            return None
        dt = _DTYPE_NAME.get(a.dtype)
        if dt is None:
            return None
        key.append((name, dt, a.shape))
        arrays.append(a)
        total += a.nbytes
    if total > INLINE_MAX_BYTES:
        return None
    tkey = tuple(key)
    segs = _TEMPLATES.get(tkey)
    if segs is None:
        segs = _inline_segs(fixed, len(tail), [(name, dt, shape, a.nbytes) for (name, dt, shape), a in zip(key[1:], arrays)])
        if len(_TEMPLATES) >= _TEMPLATES_MAX:
            _TEMPLATES.clear()
        _TEMPLATES[tkey] = segs
    parts: list[Any] = []
    for seg, a in zip(segs, arrays):
        parts.append(seg)
        parts.append(memoryview(a).cast("B") if a.size else b"")  # memoryview refuses a cast of zero-size shapes
    parts.append(_pack(tail))
    # the tail went through as a map of its own: drop that map's header byte (a fixmap: at most 15 entries)
    parts[-1] = parts[-1][1:]
    return b"".join(parts)


def decode_request(frames: Sequence[Frame], limits: Limits = DEFAULT_LIMITS) -> Request:
    """Validate and decode a request (frames after the identity). Raises WireError."""
    if not frames:
        raise WireError(INVALID_ARG, "empty message: expected a msgpack header frame")
    views = [_frame_view(f) for f in frames]  # once: the size check and the tensors both need them
    if len(views) == 1 and _SEEN:
        fast = _fast_request(views[0], limits)
        if fast is not None:
            return fast
    total = 0
    for v in views:
        total += v.nbytes
    if total > limits.max_message_bytes:
        raise WireError(INVALID_ARG, f"message of {total} bytes exceeds the limit of {limits.max_message_bytes}")
    header = _unpack_header(views[0], limits, INLINE_MAX_BYTES)
    if type(header) is not dict:
        raise WireError(INVALID_ARG, f"header must be a msgpack map, got {type(header).__name__}")
    raw_id = header.get("id")
    rid = raw_id if type(raw_id) is int and -(2**63) <= raw_id < 2**64 else _check_id(raw_id)
    if raw_id is not None and rid is None:
        raise WireError(INVALID_ARG, f"'id' must be an int or a string of at most {REQUEST_ID_STR_MAX} chars, got {_short(raw_id)}")

    def bad(msg: str, code: str = INVALID_ARG) -> WireError:
        return WireError(code, msg, rid)

    if views[0].nbytes > limits.max_header_bytes:
        tdescs = header.get("tensors")
        # Over the limit only by its inline tensors is fine (they are tensor bytes, not header): a daemon with a
        # small max_header_bytes still takes what the client inlines.
        inline = sum(len(d["data"]) for d in tdescs if type(d) is dict and type(d.get("data")) is bytes) \
            if type(tdescs) is list else 0
        if views[0].nbytes - inline > limits.max_header_bytes or inline > INLINE_MAX_BYTES:
            raise bad(f"header of {views[0].nbytes} bytes ({inline} of them inline tensor data, at most "
                      f"{INLINE_MAX_BYTES}) exceeds the limit of {limits.max_header_bytes}")
    get = header.get
    v = get("v")
    if v != PROTOCOL_VERSION or type(v) is bool:
        raise bad(f"protocol version {_short(v)} not supported; this daemon speaks version {PROTOCOL_VERSION}")
    op = get("op")
    if type(op) is not str or op not in OPS:
        raise bad(f"unknown op {_short(op)}; expected one of {list(OPS)}")
    model = get("model")
    if op in OPS_WITH_MODEL:
        # Names already seen valid skip the regex (bounded cache: names are short, the set is small).
        if type(model) is not str or (model not in _GOOD_MODEL_NAMES and not _good_model_name(model)):
            raise bad(f"op {op!r} needs 'model': a name matching {MODEL_NAME_RE.pattern}, got {_short(model)}")
    elif model is not None and type(model) is not str:
        raise bad(f"'model' must be a string, got {_short(model)}")
    timeout_ms = get("timeout_ms")
    if timeout_ms is not None:
        tt = type(timeout_ms)
        if (tt is not float and tt is not int) or not math.isfinite(timeout_ms) or timeout_ms < 0:
            raise bad(f"'timeout_ms' must be a finite number >= 0 (relative milliseconds), got {_short(timeout_ms)}")
        timeout_ms = float(timeout_ms)
    priority = get("priority", 0)
    if type(priority) is not int or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise bad(f"'priority' must be an int in [{PRIORITY_MIN}, {PRIORITY_MAX}], got {_short(priority)}")
    args = get("args")
    if args is None:
        args = {}
    elif type(args) is not dict:
        raise bad(f"'args' must be a map, got {type(args).__name__}")
    descs = get("tensors")
    tensors = decode_tensors(descs, views[1:], limits, rid)
    if tensors and op != "infer":
        raise bad(f"op {op!r} takes no tensors, got {len(tensors)}")
    req = Request(id=rid, op=op, model=model, args=args, tensors=tensors, timeout_ms=timeout_ms, priority=priority,
                  inline=len(views) == 1 and bool(tensors))
    if req.inline and op == "infer" and "args" not in header:
        _learn_once(header, views[0], tensors, ("id",), limits, req)
    return req


def _fast_request(view: memoryview, limits: Limits) -> Request | None:
    """An inline request of a layout seen before, with exactly the checks ``decode_request`` would make of it:
    everything but the data, the id and the size is byte-identical to a request that passed them."""
    m = _match(view, limits, True, False)
    if m is None:
        return None
    seen, tensors, tail = m
    n, inline = view.nbytes, seen.inline_bytes
    if n > limits.max_message_bytes or n > limits.max_header_bytes + INLINE_MAX_BYTES or (
            n > limits.max_header_bytes and (n - inline > limits.max_header_bytes or inline > INLINE_MAX_BYTES)):
        return None
    raw_id = tail["id"]
    rid = _check_id(raw_id)
    if raw_id is not None and rid is None:
        return None
    r = seen.req
    assert r is not None
    return Request(id=rid, op=r.op, model=r.model, args={}, tensors=tensors, timeout_ms=r.timeout_ms,
                   priority=r.priority, inline=True)


#: prefixes (with the message length) of inline messages whose layout could not be learned (another encoder
#: than ours): not tried again, so such a sender pays the full decode once, not twice
_UNLEARNABLE: set[tuple[bytes, int]] = set()


def _learn_once(header: dict[str, Any], view: memoryview, tensors: Mapping[str, np.ndarray],
                tail_keys: tuple[str, ...], limits: Limits | None, req: Request | None = None) -> None:
    key = (bytes(view[:64]), view.nbytes)
    if key in _UNLEARNABLE:
        return
    before = _SEEN[0] if _SEEN else None
    _learn(header, view, tensors, tail_keys, limits, req)
    if not _SEEN or _SEEN[0] is before:
        if len(_UNLEARNABLE) >= 256:
            _UNLEARNABLE.clear()
        _UNLEARNABLE.add(key)


_GOOD_MODEL_NAMES: set[str] = set()
_GOOD_MODEL_NAMES_MAX = 4096


def _good_model_name(name: str) -> bool:
    if not MODEL_NAME_RE.match(name):
        return False
    if len(_GOOD_MODEL_NAMES) < _GOOD_MODEL_NAMES_MAX:
        _GOOD_MODEL_NAMES.add(name)
    return True


def peek_request_id(frame: Frame, limits: Limits = DEFAULT_LIMITS) -> RequestId:
    """Best-effort id of a message that failed validation, so the error reply can name it."""
    try:
        header = _unpack_header(frame, limits)
    except WireError:
        return None
    return _check_id(header.get("id")) if isinstance(header, dict) else None


def encode_reply(
    request_id: RequestId,
    result: Mapping[str, Any] | None = None,
    tensors: Mapping[str, np.ndarray] | None = None,
    inline: bool = False,
) -> list[Any]:
    """``inline``: small outputs inside the header; only for a request that came that way (Request.inline)."""
    if inline and tensors:
        packed = _pack_inline(_REPLY_FIXED, {"id": request_id, "result": dict(result or {})}, tensors)
        if packed is not None:
            return [packed]
    header: dict[str, Any] = {"v": PROTOCOL_VERSION, "id": request_id, "ok": True, "result": dict(result or {})}
    frames: list[Any] = []
    if tensors:
        descs, frames = encode_tensors(tensors, inline)
        header["tensors"] = descs
    return [_pack(header), *frames]


def encode_error(request_id: RequestId, code: str, message: str, retry_after_ms: float | None = None) -> list[bytes]:
    """An error reply; ``retry_after_ms``: when a retry may succeed (a full share, a GPU recovery)."""
    if code not in ERROR_CODES:
        code = INTERNAL
    err: dict[str, Any] = {"code": code, "message": message}
    if retry_after_ms is not None:
        err["retry_after_ms"] = round(float(retry_after_ms), 3)
    header = {"v": PROTOCOL_VERSION, "id": request_id, "ok": False, "error": err}
    return [_pack(header)]


def decode_reply(frames: Sequence[Frame], limits: Limits | None = None) -> Reply:
    """Decode a reply (client side). Raises WireError on a malformed reply."""
    lim = limits or _REPLY_LIMITS
    if not frames:
        raise WireError(INTERNAL, "empty reply")
    if len(frames) == 1 and _SEEN:
        view = _frame_view(frames[0])
        m = _match(view, lim, False, True) if view.nbytes <= lim.max_header_bytes else None
        if m is not None:
            _seen, tensors, tail = m
            if type(tail["result"]) is dict:
                return Reply(id=_check_id(tail["id"]), ok=True, result=tail["result"], tensors=tensors)
    header = _unpack_header(frames[0], lim)
    if type(header) is not dict:
        raise WireError(INTERNAL, f"reply header must be a map, got {type(header).__name__}")
    if header.get("v") != PROTOCOL_VERSION:
        raise WireError(INTERNAL, f"reply speaks protocol version {_short(header.get('v'))}, this client speaks {PROTOCOL_VERSION}")
    raw_id = header.get("id")
    rid = raw_id if type(raw_id) is int and -(2**63) <= raw_id < 2**64 else _check_id(raw_id)
    if not header.get("ok"):
        err = header.get("error")
        if not isinstance(err, dict):
            err = {}
        retry = err.get("retry_after_ms")
        if type(retry) not in (int, float) or not math.isfinite(retry) or retry < 0:
            retry = None
        return Reply(id=rid, ok=False, error_code=str(err.get("code", INTERNAL)), error_message=str(err.get("message", "")),
                     retry_after_ms=None if retry is None else float(retry))
    result = header.get("result") or {}
    if not isinstance(result, dict):
        raise WireError(INTERNAL, "reply 'result' must be a map", rid)
    tensors = decode_tensors(header.get("tensors"), frames[1:], lim, rid, writable=True)
    if len(frames) == 1 and tensors:
        _learn_once(header, _frame_view(frames[0]), tensors, ("id", "result"), lim)
    return Reply(id=rid, ok=True, result=result, tensors=tensors)
