"""Frames: a message as bytes, and the incremental parser that turns bytes back into messages.

No socket and no clock here, only bytes in and bytes out: the client and the server both lay
out a frame with :func:`_encode` and parse one with :class:`_FrameReader`, so one set of limits
guards both ends, and the fuzz targets reach the parser without a connection. The format, and
why it is built the way it is, is in the package docstring (:mod:`dlrover_kfp.training.wire`).
"""

from __future__ import annotations

import functools
import json
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from dlrover_kfp.errors import PermanentError, UserInputError

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

_MIN_MESSAGE_LIMIT = 4096
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


# ----------------------------------------------------------------------------------- errors


class ProtocolError(PermanentError):
    """The peer sent bytes that are not a valid frame (or exceed a limit); the link is closed.

    Permanent: the same peer will send the same bad bytes again, and after a framing error the
    byte stream cannot be resynchronised anyway.
    """


class MessageError(PermanentError, ValueError):
    """A message this process asked to send breaks the protocol's rules; nothing was sent.

    Raised before any byte goes out, so the connection stays usable. A ``ValueError`` because it
    is a bad argument.
    """


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
