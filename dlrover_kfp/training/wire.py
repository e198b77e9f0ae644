"""The transport between the processes of a parameter-server training job.

Workers, parameter servers and the master talk over TCP (loopback when run locally, the pod
network on Kubernetes). Every step moves a batch's embedding rows (about 1 MB each way), and
the job does thousands of steps per second in all, so the transport is built around three
costs that dominate in Python: per-element encoding, per-message allocation and syscalls.

* Arrays travel as their raw bytes, described by a small table (dtype code, shape). Nothing
  is pickled and nothing received is ever unpickled: a peer that can reach the port must not
  be able to run code in the trainer.
* A frame is sent with one ``sendmsg`` (header and array buffers gathered by the kernel, no
  concatenation copy) and received with ``recv_into`` into one reusable ``bytearray`` per
  connection. Received arrays are numpy views into that buffer.
* Every length in a header is checked against per-connection limits *before* any memory is
  reserved for it, so a hostile or broken peer cannot make a process allocate gigabytes.

Wire format (all integers little-endian)::

    header   24 bytes  struct "<4sBBBBIIQ": magic b"DKFW", version 1, flags 0,
                       kind_len (1..32), n_arrays (0..64), meta_len (<= 64 KiB),
                       table_len, data_len
    preamble           kind (ASCII) | meta (UTF-8 JSON object; empty means {}) |
                       array table: per array "<BB" dtype code, ndim, then ndim x "<Q" dims |
                       zero padding to a multiple of 8 bytes
    data               each array's C-order bytes, each padded with zeros to a multiple of 8,
                       so data_len == sum(align8(nbytes)) and every array lands 8-aligned

Authentication happens once per connection, before any frame, with the per-job secret: both
sides send a random 32-byte nonce and each returns ``HMAC-SHA256(secret, other's nonce || role
label)``, compared with :func:`hmac.compare_digest`. The role label differs per direction, so
an answer reflected back at its sender (or relayed through a second connection) does not
verify. On the wire::

    client -> server   b"DKFA", version, 3 zero bytes, client nonce (32)
    server -> client   server nonce (32), HMAC(secret, client nonce || b"dlrover-kfp-wire/1 server")
    client -> server   HMAC(secret, server nonce || b"dlrover-kfp-wire/1 client")
    server -> client   b"DKOK"

Frames after that are **not** individually MACed. HMAC-SHA256 runs at about 1.8 GB/s even with
SHA CPU extensions, so MACing a step's ~852 KB batch costs ~0.5 ms per direction on each side:
a large share of a ~6 ms step, and more than the whole round trip costs without it. The
network is the job's own loopback or pod network; the handshake keeps strangers (other jobs,
scanners, a misconfigured process) out. Integrity and secrecy against an active attacker on
that network would need TLS, which is out of scope here.

The secret is never logged, and never appears in a repr, a str or an exception message.

.. warning::
   Arrays returned by :meth:`Connection.recv` (and passed to a :class:`Server` handler) are
   **views into the connection's reusable receive buffer**. They are valid only until the next
   receive on that connection, which overwrites them in place. Pass ``copy=True`` (or
   ``Server(copy_arrays=True)``), or copy what you keep, whenever the data must outlive the
   next message.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np
import numpy.typing as npt

from dlrover_kfp.errors import PermanentError, TransientError, UserInputError

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "HEADER",
    "MAGIC",
    "MAX_ARRAYS",
    "MAX_KIND_BYTES",
    "MAX_META_BYTES",
    "MAX_NDIM",
    "SECRET_ENV_VAR",
    "VERSION",
    "AuthenticationError",
    "Connection",
    "ConnectionClosedError",
    "Message",
    "MessageError",
    "PeerInfo",
    "PeerUnavailableError",
    "ProtocolError",
    "RemoteError",
    "Reply",
    "Server",
    "WireTimeoutError",
    "connect",
    "decode_frame",
    "encode_frame",
    "new_secret",
    "secret_from_env",
    "secret_to_env",
]

log = logging.getLogger(__name__)

Address = tuple[str, int]
Array = npt.NDArray[Any]

MAGIC = b"DKFW"
VERSION = 1
HEADER = struct.Struct("<4sBBBBIIQ")
"""magic, version, flags, kind_len, n_arrays, meta_len, table_len, data_len (24 bytes)."""

DEFAULT_MAX_MESSAGE_BYTES = 512 * 1024 * 1024
MAX_KIND_BYTES = 32
MAX_META_BYTES = 64 * 1024
MAX_ARRAYS = 64
MAX_NDIM = 8
SECRET_ENV_VAR = "DLROVER_KFP_JOB_SECRET"

_MIN_MESSAGE_LIMIT = 4096
_MIN_SECRET_BYTES = 16
_ALIGN = 8
_ZEROS = bytes(_ALIGN)
_INITIAL_BUFFER = 64 * 1024
_ENTRY = [struct.Struct(f"<BB{n}Q") for n in range(MAX_NDIM + 1)]
_ENTRY_HEAD = struct.Struct("<BB")
_DIMS = [struct.Struct(f"<{n}Q") for n in range(MAX_NDIM + 1)]
_MAX_TABLE_BYTES = MAX_ARRAYS * _ENTRY[MAX_NDIM].size
_KIND_RE = re.compile(rb"[A-Za-z0-9_.:/-]{1,32}")
_KINDS: dict[bytes, str] = {}  # received kinds already validated (a protocol has a handful)
_MAX_CACHED_KINDS = 1024
# One codec each, made once: json.dumps/loads with options build a new one per call.
_JSON_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_JSON_DECODER = json.JSONDecoder()

# Codes are part of the protocol: never renumber, only append.
_DTYPE_BY_CODE: dict[int, np.dtype[Any]] = {
    1: np.dtype("<f4"),
    2: np.dtype("<f8"),
    3: np.dtype("<i4"),
    4: np.dtype("<i8"),
    5: np.dtype("u1"),
    6: np.dtype("?"),
}
_CODE_BY_DTYPE: dict[np.dtype[Any], int] = {dt: code for code, dt in _DTYPE_BY_CODE.items()}
_ALLOWED_NAMES = ", ".join(str(dt) for dt in _DTYPE_BY_CODE.values())

# Handshake: hello = magic, version, 3 zero bytes, client nonce; then the server's nonce and
# proof; then the client's proof; then the server's acknowledgement.
_HELLO_MAGIC = b"DKFA"
_NONCE_BYTES = 32
_HELLO_BYTES = 8 + _NONCE_BYTES
_PROOF_BYTES = 32
_CHALLENGE_BYTES = _NONCE_BYTES + _PROOF_BYTES
_ACK = b"DKOK"
_SERVER_LABEL = b"dlrover-kfp-wire/1 server"
_CLIENT_LABEL = b"dlrover-kfp-wire/1 client"


# ----------------------------------------------------------------------------------- errors


class ProtocolError(PermanentError):
    """The peer sent bytes that are not a valid frame (or exceed a limit); the link is closed.

    Permanent: the same peer will send the same bad bytes again, and after a framing error the
    byte stream cannot be resynchronised anyway.
    """


class AuthenticationError(PermanentError):
    """The other side did not prove it knows the job secret (or rejected our proof)."""


class MessageError(PermanentError, ValueError):
    """A message this process asked to send breaks the protocol's rules; nothing was sent.

    Raised before any byte goes out, so the connection stays usable. A ``ValueError`` because it
    is a bad argument.
    """


class RemoteError(PermanentError):
    """The peer's handler failed on our request and answered with an ``"error"`` message.

    ``remote_type`` is the name of the exception type raised on the other side.
    """

    def __init__(self, message: str, remote_type: str = "") -> None:
        super().__init__(message)
        self.remote_type = remote_type


class ConnectionClosedError(TransientError, ConnectionError):
    """The peer closed the connection (or it broke). Reconnecting may work."""


class PeerUnavailableError(TransientError, ConnectionError):
    """Nobody accepted the connection within ``retry_for``; the message names the address."""


class WireTimeoutError(TransientError, TimeoutError):
    """A send or receive did not finish within the connection's timeout.

    After a receive timeout the connection stays usable: whatever part of a frame arrived is
    kept and the next :meth:`Connection.recv` continues from it. After a send timeout the
    connection is closed, because the peer may hold half a frame.
    """


# ---------------------------------------------------------------------------------- secrets


class _Key:
    """The job secret, kept out of every repr, str and exception message."""

    __slots__ = ("_secret",)

    def __init__(self, secret: bytes) -> None:
        if not isinstance(secret, bytes | bytearray):
            raise UserInputError("the job secret must be bytes")
        if len(secret) < _MIN_SECRET_BYTES:
            raise UserInputError(f"the job secret must be at least {_MIN_SECRET_BYTES} bytes")
        self._secret = bytes(secret)

    def prove(self, nonce: bytes, label: bytes) -> bytes:
        return hmac.digest(self._secret, nonce + label, hashlib.sha256)

    def __repr__(self) -> str:
        return "<secret redacted>"

    __str__ = __repr__


def new_secret() -> bytes:
    """A fresh 32-byte per-job secret; the launcher makes one and hands it to every process."""
    return secrets.token_bytes(32)


def secret_to_env(secret: bytes) -> str:
    """The secret as the hex string to put in :data:`SECRET_ENV_VAR` of each pod or process."""
    _Key(secret)  # validates without echoing the value
    return bytes(secret).hex()


def secret_from_env(var: str = SECRET_ENV_VAR) -> bytes:
    """Read the job secret that the launcher put in the environment (hex).

    Errors name the variable but never its value: the message ends up in logs.
    """
    raw = os.environ.get(var)
    if raw is None or not raw.strip():
        raise UserInputError(
            f"environment variable {var} is not set; it must hold the job secret "
            "(hex, from secret_to_env(new_secret()))"
        )
    try:
        secret = bytes.fromhex(raw.strip())
    except ValueError:
        raise UserInputError(f"environment variable {var} is not a hex string") from None
    if len(secret) < _MIN_SECRET_BYTES:
        raise UserInputError(
            f"environment variable {var} holds fewer than {_MIN_SECRET_BYTES} secret bytes"
        )
    return secret


# --------------------------------------------------------------------------------- messages


@dataclass(frozen=True, slots=True)
class Message:
    """One frame: a short ASCII ``kind``, small JSON ``meta`` and raw numeric ``arrays``.

    ``kind`` is 1..32 characters of ``[A-Za-z0-9_.:/-]``; the kind ``"error"`` is what a
    server answers when its handler fails. ``meta`` is JSON data (str, int, float, bool, None,
    lists, dicts; tuples arrive as lists and dict keys as strings), at most 64 KiB encoded.
    ``arrays`` holds up to 64 arrays of float32, float64, int32, int64, uint8 or bool with up to
    8 dimensions. Arrays of a received message are views into the connection's receive buffer
    unless it was received with ``copy=True``; see the module docstring.
    """

    kind: str
    meta: dict[str, Any] = field(default_factory=dict)
    arrays: tuple[Array, ...] = ()


Reply = Message
"""What a server handler returns to answer a request (``None`` sends nothing back)."""


def _align(n: int) -> int:
    return (n + _ALIGN - 1) & ~(_ALIGN - 1)


def _kind_bytes(kind: str) -> bytes:
    if not isinstance(kind, str):
        raise MessageError(f"message kind must be a str, not {type(kind).__name__}")
    return _checked_kind(kind)


@functools.lru_cache(maxsize=512)
def _checked_kind(kind: str) -> bytes:
    """Kinds repeat (a handful per protocol), so the check runs once per distinct kind."""
    try:
        raw = kind.encode("ascii")
    except UnicodeEncodeError:
        raise MessageError(f"message kind {kind!r} is not ASCII") from None
    if not _KIND_RE.fullmatch(raw):
        raise MessageError(
            f"message kind {kind!r} must be 1..{MAX_KIND_BYTES} characters of [A-Za-z0-9_.:/-]"
        )
    return raw


def _prepare_array(index: int, array: object) -> tuple[int, Array]:
    """Check one outgoing array; return its dtype code and a C-contiguous little-endian array.

    Non-contiguous arrays (slices, transposes) and big-endian arrays of an allowed type are
    converted with one copy rather than refused: the caller would have to make the same copy,
    and refusing them only moves that line into every call site. Any other dtype (object,
    float16, strings, structured...) is refused: object arrays would need pickle.
    """
    if not isinstance(array, np.ndarray):
        raise MessageError(f"array {index} is a {type(array).__name__}, not a numpy.ndarray")
    dtype = array.dtype
    code = _CODE_BY_DTYPE.get(dtype)
    if code is None:
        little = dtype.newbyteorder("<") if dtype.byteorder == ">" else None
        code = _CODE_BY_DTYPE.get(little) if little is not None else None
        if code is None or little is None:
            raise MessageError(
                f"array {index} has dtype {dtype}, which the wire does not carry; "
                f"allowed: {_ALLOWED_NAMES}"
            )
        array = array.astype(little)
    if array.ndim > MAX_NDIM:
        raise MessageError(f"array {index} has {array.ndim} dimensions; at most {MAX_NDIM}")
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    return code, array


def _encode(
    kind: str,
    meta: dict[str, Any] | None,
    arrays: Sequence[Array],
    max_message_bytes: int,
) -> tuple[list[bytes | memoryview], int]:
    """Validate and lay out one frame: the buffers to gather into ``sendmsg`` and their total.

    The header and preamble are one small ``bytes``; each array is a zero-copy ``memoryview``.
    """
    kind_b = _kind_bytes(kind)
    if meta:
        if not isinstance(meta, dict):
            raise MessageError(f"meta must be a dict, not {type(meta).__name__}")
        try:
            meta_b = _JSON_ENCODER.encode(meta).encode()
        except (TypeError, ValueError) as exc:
            raise MessageError(f"meta is not plain JSON data: {exc}") from None
        if len(meta_b) > MAX_META_BYTES:
            raise MessageError(
                f"meta encodes to {len(meta_b)} bytes; at most {MAX_META_BYTES} "
                "(send bulk data as arrays)"
            )
    elif meta is None or isinstance(meta, dict):
        meta_b = b""
    else:
        raise MessageError(f"meta must be a dict, not {type(meta).__name__}")
    if isinstance(arrays, np.ndarray):
        raise MessageError("arrays must be a sequence of arrays, not one array: use (array,)")
    if len(arrays) > MAX_ARRAYS:
        raise MessageError(f"{len(arrays)} arrays in one message; at most {MAX_ARRAYS}")

    table: list[bytes] = []
    data: list[bytes | memoryview] = []
    data_len = 0
    for index, raw in enumerate(arrays):
        code, array = _prepare_array(index, raw)
        table.append(_ENTRY[array.ndim].pack(code, array.ndim, *array.shape))
        nbytes = array.nbytes
        if nbytes:
            data.append(array.data.cast("B"))
            pad = -nbytes % _ALIGN
            if pad:
                data.append(_ZEROS[:pad])
            data_len += nbytes + pad
    table_b = b"".join(table)
    preamble = len(kind_b) + len(meta_b) + len(table_b)
    head = b"".join(
        (
            HEADER.pack(
                MAGIC, VERSION, 0, len(kind_b), len(arrays), len(meta_b), len(table_b), data_len
            ),
            kind_b,
            meta_b,
            table_b,
            _ZEROS[: -preamble % _ALIGN],
        )
    )
    total = len(head) + data_len
    if total > max_message_bytes:
        raise MessageError(
            f"message of {total} bytes exceeds this connection's limit of {max_message_bytes}"
        )
    return [head, *data], total


def encode_frame(
    kind: str,
    meta: dict[str, Any] | None = None,
    arrays: Sequence[Array] = (),
    *,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> bytes:
    """One frame as ``bytes`` (a copy), for tests and tools; connections never build this."""
    buffers, _ = _encode(kind, meta, arrays, max_message_bytes)
    return b"".join(buffers)


def decode_frame(
    data: bytes | bytearray | memoryview, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
) -> Message:
    """Parse exactly one whole frame (arrays copied); :class:`ProtocolError` if it is invalid."""
    view = memoryview(data).cast("B")
    if len(view) > max_message_bytes:
        raise ProtocolError(f"{len(view)} bytes exceed the limit of {max_message_bytes}")
    reader = _FrameReader(max_message_bytes, initial=max(len(view), HEADER.size))
    reader.free()[: len(view)] = view
    reader.advance(len(view))
    message = reader.next_message(copy=True)
    if message is None:
        raise ProtocolError("truncated frame")
    if reader.buffered:
        raise ProtocolError("trailing bytes after the frame")
    return message


def _check_limit(max_message_bytes: int) -> int:
    if not isinstance(max_message_bytes, int) or max_message_bytes < _MIN_MESSAGE_LIMIT:
        raise UserInputError(
            f"max_message_bytes must be an int >= {_MIN_MESSAGE_LIMIT}, got {max_message_bytes!r}"
        )
    return max_message_bytes


class _FrameReader:
    """Incremental frame parser over one reusable receive buffer (no I/O of its own).

    The owner asks :meth:`free` for a writable region, ``recv_into`` it, reports the count with
    :meth:`advance`, and calls :meth:`next_message` until it returns ``None``. Reads are greedy
    (a recv may bring the start of the next frame), which saves syscalls for small messages.

    The buffer only grows when a validated header says the frame needs more room, and never
    beyond ``max_message_bytes``. It is replaced rather than resized, so arrays still viewing
    the old buffer stay intact; compaction in place is what overwrites earlier messages, and it
    happens only in :meth:`free`, i.e. when the owner is about to receive again.
    """

    __slots__ = (
        "_buf",
        "_data_len",
        "_end",
        "_kind",
        "_lengths",
        "_limit",
        "_meta",
        "_need",
        "_specs",
        "_stage",
        "_start",
        "_total",
        "_view",
    )

    def __init__(self, max_message_bytes: int, initial: int = _INITIAL_BUFFER) -> None:
        self._limit = max_message_bytes
        self._buf = bytearray(min(initial, max_message_bytes))
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0
        self._stage = 0  # 0: want header, 1: want preamble, 2: want data
        self._need = HEADER.size  # bytes from _start needed for the next stage
        self._total = 0
        self._data_len = 0
        self._kind = ""
        self._lengths = (0, 0, 0, 0)  # kind_len, n_arrays, meta_len, table_len
        self._meta: dict[str, Any] = {}
        self._specs: list[tuple[np.dtype[Any], tuple[int, ...], int]] = []

    @property
    def buffered(self) -> int:
        """Bytes received but not yet consumed as whole frames."""
        return self._end - self._start

    def free(self) -> memoryview:
        """Writable space after the buffered bytes, large enough for the current stage."""
        if self._start == self._end:
            self._start = self._end = 0
        if self._start + self._need > len(self._buf):
            self._make_room()
        return self._view[self._end :]

    def advance(self, n: int) -> None:
        self._end += n

    def _make_room(self) -> None:
        pending = self._end - self._start
        size = len(self._buf)
        if self._need <= size:
            # Compact: move the partial frame to the front. Overwrites earlier messages' views,
            # which the contract allows because the owner is about to receive again.
            self._view[:pending] = bytes(self._view[self._start : self._end])
        else:
            size = min(max(self._need, 2 * size, _INITIAL_BUFFER), self._limit)
            fresh = bytearray(size)
            fresh[:pending] = self._view[self._start : self._end]
            self._buf = fresh
            self._view = memoryview(fresh)
        self._start = 0
        self._end = pending

    def next_message(self, copy: bool) -> Message | None:
        """The next whole frame from the buffer, or ``None`` if more bytes are needed."""
        available = self._end - self._start
        if self._stage == 0:
            if available < HEADER.size:
                return None
            self._read_header()
        if available < self._need:
            return None
        if self._stage == 1:
            self._read_preamble()
            if available < self._need:
                return None
        return self._take(copy)

    def _read_header(self) -> None:
        magic, version, flags, kind_len, n_arrays, meta_len, table_len, data_len = (
            HEADER.unpack_from(self._buf, self._start)
        )
        if magic != MAGIC:
            raise ProtocolError(f"bad magic {magic!r} (not a dlrover-kfp wire frame)")
        if version != VERSION:
            raise ProtocolError(f"unsupported wire version {version} (this side speaks {VERSION})")
        if flags:
            raise ProtocolError(f"unknown header flags {flags:#x}")
        if not 1 <= kind_len <= MAX_KIND_BYTES:
            raise ProtocolError(f"kind length {kind_len} outside 1..{MAX_KIND_BYTES}")
        if n_arrays > MAX_ARRAYS:
            raise ProtocolError(f"{n_arrays} arrays announced; at most {MAX_ARRAYS}")
        if meta_len > MAX_META_BYTES:
            raise ProtocolError(f"meta of {meta_len} bytes announced; at most {MAX_META_BYTES}")
        if not _ENTRY_HEAD.size * n_arrays <= table_len <= _MAX_TABLE_BYTES:
            raise ProtocolError(f"array table of {table_len} bytes for {n_arrays} arrays")
        preamble = HEADER.size + _align(kind_len + meta_len + table_len)
        total = preamble + data_len
        if total > self._limit:
            raise ProtocolError(
                f"frame of {total} bytes announced; this connection's limit is {self._limit}"
            )
        if data_len % _ALIGN:
            raise ProtocolError(f"data length {data_len} is not a multiple of {_ALIGN}")
        self._lengths = (kind_len, n_arrays, meta_len, table_len)
        self._need = preamble
        self._total = total
        self._data_len = data_len
        self._stage = 1

    def _read_preamble(self) -> None:
        buf = self._buf
        kind_len, n_arrays, meta_len, table_len = self._lengths
        at = self._start + HEADER.size
        kind_b = bytes(buf[at : at + kind_len])
        kind = _KINDS.get(kind_b)
        if kind is None:
            if not _KIND_RE.fullmatch(kind_b):
                raise ProtocolError(f"bad message kind {kind_b!r}")
            kind = kind_b.decode("ascii")
            if len(_KINDS) < _MAX_CACHED_KINDS:
                _KINDS[kind_b] = kind
        at += kind_len
        if meta_len:
            try:
                meta = _JSON_DECODER.decode(buf[at : at + meta_len].decode("utf-8"))
            except (ValueError, RecursionError) as exc:
                raise ProtocolError(f"meta is not valid UTF-8 JSON: {exc}") from None
            if not isinstance(meta, dict):
                raise ProtocolError(f"meta is a JSON {type(meta).__name__}, not an object")
            at += meta_len
        else:
            meta = {}
        table_end = at + table_len
        specs: list[tuple[np.dtype[Any], tuple[int, ...], int]] = []
        data_len = 0
        for index in range(n_arrays):
            if at + _ENTRY_HEAD.size > table_end:
                raise ProtocolError("array table is shorter than its arrays")
            code, ndim = _ENTRY_HEAD.unpack_from(buf, at)
            dtype = _DTYPE_BY_CODE.get(code)
            if dtype is None:
                raise ProtocolError(f"array {index}: unknown dtype code {code}")
            if ndim > MAX_NDIM:
                raise ProtocolError(f"array {index}: {ndim} dimensions; at most {MAX_NDIM}")
            at += _ENTRY_HEAD.size
            if at + 8 * ndim > table_end:
                raise ProtocolError("array table is shorter than its arrays")
            shape = _DIMS[ndim].unpack_from(buf, at)
            at += 8 * ndim
            count = 1
            extent = 1  # product of the non-zero dims: numpy refuses shapes whose extent overflows
            for dim in shape:
                count *= dim
                extent *= dim or 1
            if extent > self._limit:
                raise ProtocolError(f"array {index}: shape {shape} is implausibly large")
            nbytes = count * dtype.itemsize
            data_len += _align(nbytes)
            if data_len > self._data_len:
                break  # a mismatch, reported below before any more arithmetic on huge shapes
            specs.append((dtype, shape, nbytes))
        if at != table_end:
            raise ProtocolError(f"array table of {table_len} bytes has bytes left over")
        if data_len != self._data_len:
            raise ProtocolError(
                f"array shapes need at least {data_len} data bytes; "
                f"the header announced {self._data_len}"
            )
        self._kind = kind
        self._meta = meta
        self._specs = specs
        self._stage = 2
        self._need = self._total

    def _take(self, copy: bool) -> Message:
        offset = self._start + self._total - self._data_len
        arrays: list[Array] = []
        for dtype, shape, nbytes in self._specs:
            if nbytes:
                array = np.frombuffer(
                    self._buf, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset
                ).reshape(shape)
                arrays.append(array.copy() if copy else array)
                offset += _align(nbytes)
            else:
                arrays.append(np.empty(shape, dtype=dtype))
        message = Message(self._kind, self._meta, tuple(arrays))
        self._start += self._total
        self._stage = 0
        self._need = HEADER.size
        self._specs = []
        self._meta = {}
        return message


def _consume(buffers: list[bytes | memoryview], sent: int) -> None:
    """Drop ``sent`` bytes from the front of a gather list (after a partial ``sendmsg``)."""
    while sent:
        first = buffers[0]
        if sent >= len(first):
            sent -= len(first)
            del buffers[0]
        else:
            buffers[0] = memoryview(first)[sent:]
            sent = 0


def _send_all(sock: socket.socket, buffers: list[bytes | memoryview], total: int) -> None:
    """Gather-send a whole frame; usually one syscall, more when the socket buffer fills."""
    sent = sock.sendmsg(buffers)
    if sent == total:
        return
    pending = list(buffers)
    while True:
        _consume(pending, sent)
        if not pending:
            return
        sent = sock.sendmsg(pending)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    """Exactly ``n`` bytes (handshake only; frames use the reusable buffer), None on EOF."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        count = sock.recv_into(view[got:])
        if count == 0:
            return None
        got += count
    return bytes(buf)


# ----------------------------------------------------------------------------------- client


def _format_address(address: Address) -> str:
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Connection:
    """An authenticated client connection; make one with :func:`connect`.

    Not thread-safe: use one connection per thread (they are cheap). Arrays returned by
    :meth:`recv` and :meth:`request` are views into this connection's receive buffer, valid
    only until the next receive on it, unless ``copy=True``.
    """

    def __init__(self, sock: socket.socket, peer: Address, *, max_message_bytes: int) -> None:
        self._sock: socket.socket | None = sock
        self._peer = peer
        self._limit = max_message_bytes
        self._reader = _FrameReader(max_message_bytes)

    @property
    def peer(self) -> Address:
        """The server's address as connected to."""
        return self._peer

    @property
    def closed(self) -> bool:
        return self._sock is None

    def _live(self) -> socket.socket:
        if self._sock is None:
            raise ConnectionClosedError(f"connection to {_format_address(self._peer)} is closed")
        return self._sock

    def send(
        self,
        kind: str,
        meta: dict[str, Any] | None = None,
        arrays: Sequence[Array] = (),
    ) -> None:
        """Send one message. Validation errors (:class:`MessageError`) happen before any I/O."""
        buffers, total = _encode(kind, meta, arrays, self._limit)
        sock = self._live()
        try:
            _send_all(sock, buffers, total)
        except (TimeoutError, BlockingIOError):
            self.close()
            raise WireTimeoutError(
                f"send to {_format_address(self._peer)} timed out; connection closed"
            ) from None
        except OSError as exc:
            self.close()
            raise ConnectionClosedError(
                f"connection to {_format_address(self._peer)} broke while sending: {exc}"
            ) from None

    def recv(self, copy: bool = False) -> Message:
        """Receive one message.

        With ``copy=False`` (the default, no allocation per message) the arrays are views into
        the reusable receive buffer and are **overwritten by the next receive** on this
        connection. With ``copy=True`` they are independent arrays.
        """
        sock = self._live()
        reader = self._reader
        try:
            while True:
                message = reader.next_message(copy)
                if message is not None:
                    return message
                count = sock.recv_into(reader.free())  # greedy: small frames come whole
                if count == 0:
                    self.close()
                    raise ConnectionClosedError(
                        f"{_format_address(self._peer)} closed the connection"
                    )
                reader.advance(count)
        except (ProtocolError, ConnectionClosedError):
            self.close()
            raise
        except (TimeoutError, BlockingIOError):
            raise WireTimeoutError(
                f"no complete message from {_format_address(self._peer)} within the timeout"
            ) from None
        except OSError as exc:
            self.close()
            raise ConnectionClosedError(
                f"connection to {_format_address(self._peer)} broke while receiving: {exc}"
            ) from None

    def request(
        self,
        kind: str,
        meta: dict[str, Any] | None = None,
        arrays: Sequence[Array] = (),
        copy: bool = False,
    ) -> Message:
        """Send a message and wait for the reply; an ``"error"`` reply raises RemoteError."""
        self.send(kind, meta, arrays)
        reply = self.recv(copy=copy)
        if reply.kind == "error":
            raise RemoteError(
                str(reply.meta.get("message", "remote handler failed")),
                str(reply.meta.get("type", "")),
            )
        return reply

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def abort(self) -> None:
        """Close from another thread: a thread blocked in a send or receive on this connection
        returns at once with :class:`ConnectionClosedError` (a plain ``close`` would leave it
        blocked until its timeout, since the kernel keeps the socket while it is in use)."""
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._sock is None else "open"
        return f"<Connection to {_format_address(self._peer)} {state}>"


def _client_handshake(sock: socket.socket, key: _Key, where: str) -> None:
    nonce = secrets.token_bytes(_NONCE_BYTES)
    sock.sendall(_HELLO_MAGIC + bytes((VERSION, 0, 0, 0)) + nonce)
    challenge = _recv_exact(sock, _CHALLENGE_BYTES)
    if challenge is None:
        raise ConnectionClosedError(f"{where} closed the connection during authentication")
    server_nonce, proof = challenge[:_NONCE_BYTES], challenge[_NONCE_BYTES:]
    if not hmac.compare_digest(proof, key.prove(nonce, _SERVER_LABEL)):
        raise AuthenticationError(
            f"{where} could not prove it knows the job secret (different job or wrong secret)"
        )
    sock.sendall(key.prove(server_nonce, _CLIENT_LABEL))
    ack = _recv_exact(sock, len(_ACK))
    if ack is None:
        raise AuthenticationError(f"{where} rejected this process's job secret")
    if ack != _ACK:
        raise ProtocolError(f"{where} sent a bad authentication acknowledgement")


#: Socket buffer size asked for on every connection. A worker's push of a small-model step is
#: ~0.85 MB (a medium one several MB): with the default buffers (~200 KB) ``sendmsg`` blocks
#: until the PS has read most of it, and the worker waited 17% of every step in it. The kernel
#: caps the request at ``net.core.wmem_max``/``rmem_max`` (4 MiB here); pages are used only
#: while data is in flight.
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024


def _tune(sock: socket.socket) -> None:
    """Small messages leave at once (no Nagle); large ones fit the kernel's buffers whole."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)


def _use_kernel_timeouts(sock: socket.socket, timeout: float | None) -> None:
    """Make the socket truly blocking and let the kernel enforce ``timeout``.

    A Python-level socket timeout puts the socket in non-blocking mode and calls ``poll()``
    before every send and receive; with ``SO_RCVTIMEO``/``SO_SNDTIMEO`` each operation is one
    syscall (measured: 4-6% less time per round trip). A timeout then shows up as
    ``BlockingIOError`` (EAGAIN). Platforms without the options keep the Python-level timeout,
    which behaves the same, only slower.
    """
    if timeout is None:
        sock.settimeout(None)
        return
    seconds = int(timeout)
    micros = max(int((timeout - seconds) * 1_000_000), 0 if seconds else 1)  # 0 means forever
    timeval = struct.pack("@ll", seconds, micros)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
    except (OSError, AttributeError):
        sock.settimeout(timeout)
        return
    sock.settimeout(None)


def connect(
    address: Address,
    secret: bytes,
    *,
    timeout: float | None = 30.0,
    retry_for: float = 0.0,
    refused_for: float | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> Connection:
    """Connect to a :class:`Server`, authenticate both ways, and return the connection.

    ``timeout`` bounds the TCP connect, the handshake and later each send and receive (None:
    wait forever). ``retry_for`` keeps retrying failed TCP connects (refused, unreachable, not
    yet resolvable on Kubernetes) for that many seconds, because the job's processes start in
    any order; then :class:`PeerUnavailableError` names the address. ``refused_for`` (at most
    ``retry_for``; None: the same) is how long a peer that refuses the connection is retried:
    a host that answers with a refusal has nothing listening on that port, which for a peer
    that is known to have been listening means it is gone, not slow to start. Authentication
    failures are not retried: a wrong secret stays wrong.
    """
    key = _Key(secret)
    limit = _check_limit(max_message_bytes)
    where = _format_address(address)
    began = time.monotonic()
    deadline = began + max(retry_for, 0.0)
    refused_deadline = (
        deadline if refused_for is None else min(deadline, began + max(refused_for, 0.0))
    )
    delay = 0.02
    while True:
        try:
            sock = socket.create_connection(address, timeout=timeout)
            break
        except OSError as exc:
            now = time.monotonic()
            left = deadline - now
            if isinstance(exc, ConnectionRefusedError) and now >= refused_deadline:
                raise PeerUnavailableError(
                    f"cannot connect to {where}: refused for {now - began:.1f}s: {exc}"
                ) from None
            if left <= 0:
                raise PeerUnavailableError(f"cannot connect to {where}: {exc}") from None
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.5)
    try:
        _tune(sock)
        _client_handshake(sock, key, where)
        _use_kernel_timeouts(sock, timeout)
    except TimeoutError:
        sock.close()
        raise WireTimeoutError(f"authentication with {where} timed out") from None
    except (AuthenticationError, ProtocolError, ConnectionClosedError):
        sock.close()
        raise
    except OSError as exc:
        sock.close()
        raise ConnectionClosedError(
            f"connection to {where} broke during authentication: {exc}"
        ) from None
    return Connection(sock, (address[0], address[1]), max_message_bytes=limit)


# ----------------------------------------------------------------------------------- server


@dataclass(eq=False)
class PeerInfo:
    """One authenticated client as the handler sees it.

    ``state`` is the handler's own per-connection scratch space (a worker's id, its leased
    shards); it survives until ``on_disconnect`` has been called for this peer.
    """

    id: int
    address: Address
    state: dict[str, Any] = field(default_factory=dict)


Handler = Callable[[PeerInfo, Message], Message | None]


class _Phase(Enum):
    HELLO = 1
    PROOF = 2
    READY = 3
    CLOSED = 4


class _Peer:
    """Server-side connection state: handshake progress, receive buffer, unsent reply bytes."""

    __slots__ = (
        "deadline",
        "events",
        "hs_buf",
        "hs_have",
        "info",
        "nonce",
        "out",
        "phase",
        "reader",
        "sock",
    )

    def __init__(self, sock: socket.socket, info: PeerInfo, deadline: float) -> None:
        self.sock = sock
        self.info = info
        self.phase = _Phase.HELLO
        self.deadline = deadline
        self.hs_buf = bytearray(_HELLO_BYTES)
        self.hs_have = 0
        self.nonce = b""
        self.reader: _FrameReader | None = None
        self.out: list[bytes | memoryview] = []
        self.events = selectors.EVENT_READ


_LISTENER = object()
_WAKER = object()


class Server:
    """A single-threaded, ``selectors``-based server for many authenticated connections.

    One thread does everything (accept, handshakes, reads, handler calls, writes), so handlers
    need no locks and see each connection's messages in arrival order. The handshake runs in
    the loop too, non-blocking: a client that stalls mid-handshake costs nothing but a slot,
    and is dropped after ``handshake_timeout`` seconds (at most ``max_pending_handshakes`` at
    once). A handler exception becomes an ``"error"`` reply; a malformed frame closes only that
    peer's connection.

    While a reply is only partly sent (the client is slow to read), the server neither reads
    from nor dispatches for that peer: this bounds memory per peer to one reply, and it makes
    returning the request's own arrays (views into the receive buffer) in a reply safe.

    Handler arrays are views into the peer's receive buffer, valid only during the handler
    call, unless ``copy_arrays=True``. Reply arrays are sent after the handler returns and may
    be referenced until fully sent: do not modify them in place after returning them.

    ``on_disconnect(peer)`` runs in the loop thread exactly once for every authenticated peer
    whose connection ends, for whatever reason (EOF, reset, protocol error, :meth:`stop`), with
    ``peer.state`` as the handler left it; the master requeues a dead worker's shards there.
    The listening socket is bound in the constructor, so :attr:`address` is known (and clients
    may already connect) before :meth:`serve_forever` runs.

    ``threaded=True`` serves every authenticated connection on a thread of its own instead
    (accept and handshakes stay in the loop): a parameter server's handlers spend their time in
    numpy/torch kernels that release the GIL, so requests from several workers then run in
    parallel on as many cores as the process may use. Each connection's messages are still
    handled in arrival order, one at a time, but handlers of different connections run
    concurrently and must be thread-safe; ``on_disconnect`` then runs in the connection's own
    thread. A threaded connection blocks in ``send`` while its client is slow to read, which
    bounds its memory to one reply just as the loop does.
    """

    def __init__(
        self,
        address: Address,
        secret: bytes,
        handler: Handler,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        on_disconnect: Callable[[PeerInfo], None] | None = None,
        handshake_timeout: float = 5.0,
        max_pending_handshakes: int = 128,
        copy_arrays: bool = False,
        backlog: int = 128,
        threaded: bool = False,
    ) -> None:
        self._key = _Key(secret)
        self._threaded = threaded
        self._peer_threads: dict[int, threading.Thread] = {}
        self._drop_lock = threading.Lock()
        self._limit = _check_limit(max_message_bytes)
        self._handler = handler
        self._on_disconnect = on_disconnect
        self._handshake_timeout = handshake_timeout
        self._max_pending = max_pending_handshakes
        self._copy = copy_arrays
        self._listener = socket.create_server(address, backlog=backlog)
        self._listener.setblocking(False)
        bound = self._listener.getsockname()
        self._address: Address = (bound[0], bound[1])
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, _LISTENER)
        self._selector.register(self._wake_r, selectors.EVENT_READ, _WAKER)
        self._peers: dict[int, _Peer] = {}
        self._handshaking: dict[int, _Peer] = {}
        self._next_id = 1
        self._failed_handshakes = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._started = False
        self._finished = False
        self._thread: threading.Thread | None = None

    # --- public -------------------------------------------------------------------------

    @property
    def address(self) -> Address:
        """The bound address; with port 0 this is the port the OS chose."""
        return self._address

    @property
    def failed_handshakes(self) -> int:
        """Connections closed before authenticating (wrong secret, garbage, timeout, EOF)."""
        return self._failed_handshakes

    @property
    def connections(self) -> int:
        """Authenticated connections currently open."""
        return len(self._peers) - len(self._handshaking)

    def serve_forever(self) -> None:
        """Run the event loop in this thread until :meth:`stop`; then close every socket."""
        with self._lock:
            if self._started:
                raise RuntimeError("a Server serves once; make a new one")
            self._started = True
        try:
            while not self._stop.is_set():
                timeout = self._select_timeout() if self._handshaking else None
                for key, mask in self._selector.select(timeout):
                    data = key.data
                    if isinstance(data, _Peer):
                        self._service(data, mask)
                    elif data is _LISTENER:
                        self._accept()
                    else:  # the waker: stop() was called
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                if self._handshaking:
                    self._expire_handshakes()
        finally:
            self._shutdown()

    def serve_in_thread(self, name: str = "wire-server") -> threading.Thread:
        """Start :meth:`serve_forever` in a daemon thread and return it."""
        thread = threading.Thread(target=self.serve_forever, name=name, daemon=True)
        self._thread = thread
        thread.start()
        return thread

    def stop(self) -> None:
        """Ask the loop to finish. Thread-safe, and safe to call from a handler or twice."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def close(self) -> None:
        """Stop, wait for a :meth:`serve_in_thread` thread, and release the sockets."""
        self.stop()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        for peer_thread in list(self._peer_threads.values()):
            if peer_thread is not threading.current_thread():
                peer_thread.join(timeout=5.0)
        with self._lock:
            never_served = not self._started
            self._started = True
        if never_served:
            self._shutdown()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "stopped" if self._finished else "running" if self._started else "not started"
        return (
            f"<Server on {_format_address(self._address)} {state}, {self.connections} connections>"
        )

    # --- loop ---------------------------------------------------------------------------

    def _select_timeout(self) -> float:
        earliest = min(peer.deadline for peer in self._handshaking.values())
        return max(0.0, earliest - time.monotonic())

    def _expire_handshakes(self) -> None:
        now = time.monotonic()
        for peer in [p for p in self._handshaking.values() if p.deadline <= now]:
            log.warning("authentication with %s timed out", _format_address(peer.info.address))
            self._drop(peer, failed_handshake=True)

    def _accept(self) -> None:
        while True:
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE: keep serving the connections we have
                log.warning("accept failed: %s", exc)
                return
            sock.setblocking(False)
            _tune(sock)
            info = PeerInfo(self._next_id, (addr[0], addr[1]))
            self._next_id += 1
            if len(self._handshaking) >= self._max_pending:
                log.warning(
                    "too many pending handshakes; refusing %s", _format_address(info.address)
                )
                self._failed_handshakes += 1
                sock.close()
                continue
            peer = _Peer(sock, info, time.monotonic() + self._handshake_timeout)
            self._peers[info.id] = peer
            self._handshaking[info.id] = peer
            self._selector.register(sock, selectors.EVENT_READ, peer)

    def _service(self, peer: _Peer, mask: int) -> None:
        # A peer is registered for reading or for writing, never both (see _queue).
        if peer.phase is _Phase.CLOSED:
            return
        if mask & selectors.EVENT_READ:
            if peer.phase is _Phase.READY:
                self._read_frames(peer)
            else:
                self._read_handshake(peer)
        elif self._flush(peer):
            self._set_events(peer, selectors.EVENT_READ)
            if peer.phase is _Phase.READY:
                if self._threaded:
                    self._hand_off(peer)  # the handshake's acknowledgement went out
                else:
                    self._dispatch(peer)  # frames that arrived while we were writing

    def _read_handshake(self, peer: _Peer) -> None:
        need = _HELLO_BYTES if peer.phase is _Phase.HELLO else _PROOF_BYTES
        try:
            count = peer.sock.recv_into(memoryview(peer.hs_buf)[peer.hs_have : need])
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(peer, failed_handshake=True)
            return
        if count == 0:
            log.info("%s closed during authentication", _format_address(peer.info.address))
            self._drop(peer, failed_handshake=True)
            return
        peer.hs_have += count
        if peer.hs_have < need:
            return
        peer.hs_have = 0
        data = bytes(peer.hs_buf[:need])
        if peer.phase is _Phase.HELLO:
            if data[:4] != _HELLO_MAGIC or data[4] != VERSION:
                log.warning("bad hello from %s", _format_address(peer.info.address))
                self._drop(peer, failed_handshake=True)
                return
            peer.nonce = secrets.token_bytes(_NONCE_BYTES)
            peer.phase = _Phase.PROOF
            self._queue(peer, [peer.nonce + self._key.prove(data[8:], _SERVER_LABEL)])
        else:
            if not hmac.compare_digest(data, self._key.prove(peer.nonce, _CLIENT_LABEL)):
                log.warning(
                    "authentication failed for %s (wrong job secret)",
                    _format_address(peer.info.address),
                )
                self._drop(peer, failed_handshake=True)
                return
            peer.phase = _Phase.READY
            peer.reader = _FrameReader(self._limit)
            del self._handshaking[peer.info.id]
            self._queue(peer, [_ACK])
            if self._threaded and not peer.out and peer.phase is _Phase.READY:
                self._hand_off(peer)

    def _hand_off(self, peer: _Peer) -> None:
        """Give an authenticated connection its own thread (``threaded=True``). The loop has
        read only handshake bytes from it, so the thread starts at a frame boundary."""
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(peer.sock)
        peer.sock.setblocking(True)
        thread = threading.Thread(
            target=self._serve_peer, args=(peer,), name=f"wire-peer-{peer.info.id}", daemon=True
        )
        self._peer_threads[peer.info.id] = thread
        thread.start()

    def _serve_peer(self, peer: _Peer) -> None:
        """One connection's blocking loop: read a frame, call the handler, send the reply."""
        reader = peer.reader
        assert reader is not None
        where = _format_address(peer.info.address)
        try:
            while not self._stop.is_set():
                message = reader.next_message(self._copy)
                if message is None:
                    count = peer.sock.recv_into(reader.free())
                    if count == 0:
                        return
                    reader.advance(count)
                    continue
                reply = self._call_handler(peer.info, message)
                if reply is not None:
                    _send_all(peer.sock, reply, sum(memoryview(b).nbytes for b in reply))
        except ProtocolError as exc:
            log.warning("closing %s: protocol error: %s", where, exc)
        except OSError as exc:
            if not self._stop.is_set():
                log.info("connection from %s broke: %s", where, exc)
        except Exception:  # a parser bug must cost one peer, not every peer
            log.exception("closing %s: unexpected error", where)
        finally:
            self._drop(peer)
            # Only now: close() joins the threads it finds here, so on_disconnect has run by
            # the time it returns.
            self._peer_threads.pop(peer.info.id, None)

    def _read_frames(self, peer: _Peer) -> None:
        reader = peer.reader
        assert reader is not None
        try:
            count = peer.sock.recv_into(reader.free())
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.info("connection from %s broke: %s", _format_address(peer.info.address), exc)
            self._drop(peer)
            return
        if count == 0:
            self._drop(peer)
            return
        reader.advance(count)
        self._dispatch(peer)

    def _dispatch(self, peer: _Peer) -> None:
        """Hand every whole buffered frame to the handler, in order, until a reply is stuck."""
        reader = peer.reader
        assert reader is not None
        while not peer.out and peer.phase is _Phase.READY:
            try:
                message = reader.next_message(self._copy)
            except ProtocolError as exc:
                log.warning(
                    "closing %s: protocol error: %s", _format_address(peer.info.address), exc
                )
                self._drop(peer)
                return
            except Exception:  # a parser bug must cost one peer, not every peer
                log.exception("closing %s: unexpected error", _format_address(peer.info.address))
                self._drop(peer)
                return
            if message is None:
                return
            reply = self._call_handler(peer.info, message)
            if reply is not None:
                self._queue(peer, reply)

    def _call_handler(self, info: PeerInfo, message: Message) -> list[bytes | memoryview] | None:
        try:
            reply = self._handler(info, message)
            if reply is None:
                return None
            if not isinstance(reply, Message):
                raise TypeError(f"handler returned {type(reply).__name__}, not Message or None")
            return _encode(reply.kind, reply.meta, reply.arrays, self._limit)[0]
        except Exception as exc:
            log.warning(
                "handler failed on %r from %s",
                message.kind,
                _format_address(info.address),
                exc_info=True,
            )
            text = " ".join(f"{type(exc).__name__}: {exc}".split())[:1000]
            error = {"message": text, "type": type(exc).__name__}
            return _encode("error", error, (), self._limit)[0]

    def _queue(self, peer: _Peer, buffers: list[bytes | memoryview]) -> None:
        peer.out.extend(buffers)
        if not self._flush(peer):
            self._set_events(peer, selectors.EVENT_WRITE)

    def _flush(self, peer: _Peer) -> bool:
        """Send what is queued without blocking; True when all of it went out."""
        while peer.out:
            try:
                sent = peer.sock.sendmsg(peer.out)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError as exc:
                log.info("connection from %s broke: %s", _format_address(peer.info.address), exc)
                self._drop(peer)
                return False
            _consume(peer.out, sent)
        return True

    def _set_events(self, peer: _Peer, events: int) -> None:
        if peer.phase is not _Phase.CLOSED and peer.events != events:
            self._selector.modify(peer.sock, events, peer)
            peer.events = events

    def _drop(self, peer: _Peer, *, failed_handshake: bool = False) -> None:
        with self._drop_lock:  # a threaded peer's thread and the loop's shutdown may race
            if peer.phase is _Phase.CLOSED:
                return
            was_ready = peer.phase is _Phase.READY
            peer.phase = _Phase.CLOSED
        peer.out.clear()
        self._peers.pop(peer.info.id, None)
        self._handshaking.pop(peer.info.id, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(peer.sock)
        peer.sock.close()
        if failed_handshake:
            self._failed_handshakes += 1
        if was_ready and self._on_disconnect is not None:
            try:
                self._on_disconnect(peer.info)
            except Exception:  # the callback's bug must not stop the loop serving the others
                log.exception("on_disconnect failed for peer %d", peer.info.id)

    def _shutdown(self) -> None:
        for peer in list(self._peers.values()):
            if peer.info.id in self._peer_threads:
                # Its own thread closes it: wake a blocked recv instead of closing the file
                # descriptor under it (the number could be reused by another socket at once).
                # Only the reading side: a reply being sent (to "shutdown", say) still leaves.
                with contextlib.suppress(OSError):
                    peer.sock.shutdown(socket.SHUT_RD)
            else:
                self._drop(peer)
        with contextlib.suppress(OSError):
            self._selector.close()
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()
        self._finished = True
