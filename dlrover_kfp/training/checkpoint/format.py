"""The format of a flash checkpoint part: constants, errors, array layout, meta and header.

The same bytes are in shared memory and on disk, so the snapshot buffer (:mod:`.shm`), the
persister (:mod:`.persist`) and the reader (:mod:`.reader`) all build on this module, which
imports none of them.

File format (the same bytes in shared memory and on disk)::

    [0, 64)            header: magic, version, state, step, seq, total_len, json_len,
                       crc_seq, crc32 (of bytes [64, total_len)), header_crc
    [64, 4096)         zeros
    [4096, data_end)   the arrays, C order, each 64-byte aligned
    [.., total_len)    JSON descriptor: meta, step, seq, extra, arrays (name, dtype, shape, offset)
"""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import re
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import numpy as np
import numpy.typing as npt

from dlrover_kfp.core.partition import Partition
from dlrover_kfp.errors import PermanentError, TransientError, UserInputError

if TYPE_CHECKING:
    # Only for the types: torch takes a second to import, and the processes that only name,
    # list or remove checkpoints (the master, `dlrover-kfp cleanup`) never hold a tensor.
    import torch

    ArrayLike: TypeAlias = npt.NDArray[Any] | torch.Tensor

AnyArray = npt.NDArray[Any]
PathLike = str | os.PathLike[str]
Source = Literal["shm", "disk"]

MAGIC = b"DLKFPSNP"
FORMAT_VERSION = 1
PART_FORMAT = "dlrover-kfp-flash-part"
MANIFEST_FORMAT = "dlrover-kfp-flash-checkpoint"
MANIFEST = "manifest.json"

# Header: magic, version, state, step, seq, total_len, json_len, crc_seq, crc32 | header_crc.
_HEADER_BODY = struct.Struct("<8sIIqQQQQI")
HEADER_SIZE = _HEADER_BODY.size + 4
PAGE = mmap.PAGESIZE
DATA_START = 4096
ARRAY_ALIGN = 64
CHUNK = 8 << 20  # fits in the last-level cache: crc32 then write (or read then crc32) stay hot
JSON_RESERVE = 64 << 10  # room for the descriptor and ``extra`` when sizing from a StateSpec

STATE_EMPTY = 0
STATE_WRITING = 1
STATE_COMPLETE = 2

ROW_ARRAYS = ("weights", "accum")  # [rows_on(k), dim], striped over the PS
DENSE_ARRAYS = ("dense", "dense_accum")  # flat, all on PS 0


class CheckpointError(PermanentError):
    """A checkpoint cannot be written or restored as asked (no usable one, inconsistent parts)."""


class CheckpointCorruptError(CheckpointError):
    """A part file or snapshot does not verify: wrong size, bad header, crc32 mismatch."""


class CheckpointBusyError(TransientError):
    """The snapshot buffer is still being persisted; a later attempt will find it free."""


class CheckpointWriteError(TransientError):
    """Writing a part or a manifest failed (disk full, I/O error); the next checkpoint may work."""


def _align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def _as_numpy(name: str, array: ArrayLike) -> AnyArray:
    """A numpy view of a CPU tensor (no copy) or the array itself."""
    if isinstance(array, np.ndarray):
        return array
    import torch  # noqa: PLC0415 (a tensor comes from a process that has torch loaded)

    if isinstance(array, torch.Tensor):
        if array.device.type != "cpu":
            raise UserInputError(
                f"array {name!r} is on {array.device}; flash checkpoints hold CPU state"
            )
        return array.detach().numpy()
    raise UserInputError(
        f"array {name!r}: expected a numpy array or a torch tensor, got {type(array).__name__}"
    )


# --------------------------------------------------------------------------------------------
# Layout
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """One named array of a PS part: what a snapshot must hold room for."""

    name: str
    dtype: str  # numpy's dtype.str, byte order included ("<f4")
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    @classmethod
    def of(cls, name: str, array: AnyArray) -> ArraySpec:
        return cls(name, np.dtype(array.dtype).str, tuple(int(n) for n in array.shape))


#: The dtypes a part may hold, as numpy writes them (``dtype.str``): numbers and booleans.
_NUMERIC_DTYPE = re.compile(r"[<>|=]?(?:[fiu][1248]|b1|f16)")


@dataclass(frozen=True, slots=True)
class ArrayDesc:
    """An array's place in a part file: its spec plus the byte offset of its first element."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    @property
    def count(self) -> int:
        return math.prod(self.shape)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "offset": self.offset,
            "nbytes": self.nbytes,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ArrayDesc:
        dtype_text = str(raw["dtype"])
        if not _NUMERIC_DTYPE.fullmatch(dtype_text):
            # Checked before numpy sees it: np.dtype parses "," and "(...)" strings with
            # ast.literal_eval, which raises SyntaxError, and accepts object dtypes.
            raise ValueError(f"array dtype {dtype_text[:40]!r} is not a numeric dtype")
        desc = cls(
            str(raw["name"]),
            np.dtype(dtype_text).str,
            tuple(int(n) for n in raw["shape"]),
            int(raw["offset"]),
        )
        dtype = np.dtype(desc.dtype)
        if dtype.kind not in "fiub" or dtype.hasobject or dtype.itemsize == 0:
            # Only numbers are ever saved; an object dtype would read pointers from the file.
            raise ValueError(f"array {desc.name!r}: dtype {desc.dtype!r} is not numeric")
        if any(n < 0 for n in desc.shape) or desc.offset < 0:
            raise ValueError(f"array {desc.name!r}: negative shape or offset")
        if "nbytes" in raw and int(raw["nbytes"]) != desc.nbytes:
            raise ValueError(f"array {desc.name!r}: nbytes does not match dtype x shape")
        return desc


def _layout(specs: Sequence[ArraySpec]) -> tuple[tuple[ArrayDesc, ...], int]:
    """Offsets of the arrays, each 64-byte aligned from DATA_START; returns them and data_end."""
    pos = DATA_START
    descs = []
    for spec in specs:
        pos = _align(pos, ARRAY_ALIGN)
        descs.append(ArrayDesc(spec.name, spec.dtype, spec.shape, pos))
        pos += spec.nbytes
    return tuple(descs), pos


@dataclass(frozen=True, slots=True)
class PartMeta:
    """Which part of which job a snapshot holds, and the embedding geometry it belongs to."""

    job_id: str
    num_ps: int
    ps_index: int
    total_rows: int
    dim: int
    table_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.job_id:
            raise UserInputError("checkpoint meta: job_id must not be empty")
        if self.num_ps < 1 or not 0 <= self.ps_index < self.num_ps:
            raise UserInputError(f"checkpoint meta: PS {self.ps_index} of {self.num_ps} is invalid")
        if self.total_rows < 1 or self.dim < 1:
            raise UserInputError(
                f"checkpoint meta: total_rows={self.total_rows}, dim={self.dim} must be >= 1"
            )
        if self.table_sizes and sum(self.table_sizes) != self.total_rows:
            raise UserInputError(
                f"checkpoint meta: table sizes sum to {sum(self.table_sizes)}, "
                f"not total_rows={self.total_rows}"
            )

    @property
    def part(self) -> str:
        return f"ps-{self.ps_index}"

    @property
    def rows(self) -> int:
        """Embedding rows this part holds (slots 0 .. rows-1)."""
        return Partition(self.total_rows, self.num_ps).rows_on(self.ps_index)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "num_ps": self.num_ps,
            "ps_index": self.ps_index,
            "total_rows": self.total_rows,
            "dim": self.dim,
            "table_sizes": list(self.table_sizes),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> PartMeta:
        return cls(
            str(raw["job_id"]),
            int(raw["num_ps"]),
            int(raw["ps_index"]),
            int(raw["total_rows"]),
            int(raw["dim"]),
            tuple(int(n) for n in raw.get("table_sizes", ())),
        )


@dataclass(frozen=True, slots=True)
class StateSpec:
    """The named arrays of one PS part; sizes the shared-memory buffer at PS start."""

    arrays: tuple[ArraySpec, ...]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)

    def capacity(self, json_reserve: int = JSON_RESERVE) -> int:
        """Bytes of shared memory a snapshot of this state needs (page-rounded)."""
        _, data_end = _layout(self.arrays)
        return _align(_align(data_end, ARRAY_ALIGN) + json_reserve, PAGE)

    @classmethod
    def for_ps(cls, meta: PartMeta, dense_size: int = 0, dtype: str = "float32") -> StateSpec:
        """weights, accum ``[rows_on(k), dim]``; dense, dense_accum ``[dense_size]`` on PS 0."""
        dt = np.dtype(dtype).str
        arrays = [ArraySpec(name, dt, (meta.rows, meta.dim)) for name in ROW_ARRAYS]
        if meta.ps_index == 0 and dense_size > 0:
            arrays += [ArraySpec(name, dt, (dense_size,)) for name in DENSE_ARRAYS]
        return cls(tuple(arrays))

    @classmethod
    def of(cls, arrays: Mapping[str, ArrayLike]) -> StateSpec:
        return cls(tuple(ArraySpec.of(n, _as_numpy(n, a)) for n, a in arrays.items()))


# --------------------------------------------------------------------------------------------
# Header
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Header:
    state: int
    step: int
    seq: int
    total_len: int
    json_len: int
    crc_seq: int = 0  # the seq whose payload crc32 is below; 0: none yet
    crc32: int = 0

    def pack(self) -> bytes:
        body = _HEADER_BODY.pack(
            MAGIC,
            FORMAT_VERSION,
            self.state,
            self.step,
            self.seq,
            self.total_len,
            self.json_len,
            self.crc_seq,
            self.crc32,
        )
        return body + struct.pack("<I", zlib.crc32(body))

    @classmethod
    def unpack(cls, raw: bytes, source: object) -> _Header:
        if len(raw) < HEADER_SIZE:
            raise CheckpointCorruptError(f"{source}: truncated ({len(raw)} bytes, no header)")
        body = raw[: _HEADER_BODY.size]
        magic, version, state, step, seq, total, jlen, crc_seq, crc = _HEADER_BODY.unpack(body)
        if magic != MAGIC:
            raise CheckpointCorruptError(f"{source}: not a flash checkpoint part (bad magic)")
        (header_crc,) = struct.unpack_from("<I", raw, _HEADER_BODY.size)
        if zlib.crc32(body) != header_crc:
            raise CheckpointCorruptError(f"{source}: header checksum mismatch")
        if version != FORMAT_VERSION:
            raise CheckpointCorruptError(
                f"{source}: format version {version}, this code reads {FORMAT_VERSION}"
            )
        return cls(state, step, seq, total, jlen, crc_seq, crc)

    @property
    def verified_crc(self) -> int | None:
        """The payload crc32 if the persister computed it for this very snapshot."""
        return self.crc32 if self.seq and self.crc_seq == self.seq else None


# --------------------------------------------------------------------------------------------
# Manifest
# --------------------------------------------------------------------------------------------

_MANIFEST_INTS = ("version", "step", "num_ps", "total_rows", "dim")
_PART_INTS = ("bytes", "crc32", "seq")


#: The manifest's own key for the digest of the rest of it.
CHECKSUM_KEY = "checksum"


def manifest_checksum(manifest: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of the manifest without its checksum, as canonical JSON (sorted keys,
    no spaces): what :func:`parse_manifest` recomputes. The parts carry crc32s of their own
    bytes, but the manifest is the shard ledger, the counts and the parts' sizes: a flipped
    bit in it hung a run at 100% or trained a held-out row, and reported success."""
    body = {k: v for k, v in manifest.items() if k != CHECKSUM_KEY}
    # NaN stays NaN both ways (a diverged run's loss is kept): JSON's extension, as written
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def parse_manifest(raw: bytes, source: object) -> dict[str, Any]:
    """A committed checkpoint's ``manifest.json``, checked field by field.

    Everything in it is untrusted (a disk, a hand edit, a half-written copy): the result has
    the keys the restore reads with the types it expects, or the manifest is a
    :class:`CheckpointCorruptError` naming ``source`` and the field. Integers must be JSON
    integers (not floats, not booleans) within 64 bits; part files plain names.
    """

    def bad(problem: str) -> CheckpointCorruptError:
        return CheckpointCorruptError(f"{source}: unreadable manifest: {problem}")

    try:
        data = json.loads(raw)
    except RecursionError:
        raise bad("nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, bad UTF-8, an integer of > 4300 digits
        raise bad(str(exc).split(";", 1)[0]) from None
    if not isinstance(data, dict):
        raise bad(f"expected an object, got {type(data).__name__}")
    if CHECKSUM_KEY not in data:
        raise bad(f"{CHECKSUM_KEY}: missing")
    if data[CHECKSUM_KEY] != manifest_checksum(data):
        raise bad(f"{CHECKSUM_KEY}: does not match its content (a changed byte)")
    if data.get("format") != MANIFEST_FORMAT:
        raise bad(f"format is not {MANIFEST_FORMAT!r}")
    for key in _MANIFEST_INTS:
        _check_int(data, key, bad)
    if data["version"] != FORMAT_VERSION:
        raise bad(f"version {data['version']}, this code reads {FORMAT_VERSION}")
    if not isinstance(data.get("job_id"), str) or not data["job_id"]:
        raise bad("job_id: expected a non-empty string")
    sizes = data.get("table_sizes", [])
    if not isinstance(sizes, list) or not all(_is_int(n) and n >= 0 for n in sizes):
        raise bad("table_sizes: expected a list of integers")
    extra = data.get("extra") or {}
    if not isinstance(extra, dict):
        raise bad("extra: expected an object")
    parts = data.get("parts")
    if not isinstance(parts, list):
        raise bad("parts: expected a list")
    for index, part in enumerate(parts):
        if not isinstance(part, dict):
            raise bad(f"parts[{index}]: expected an object")
        for key in _PART_INTS:
            _check_int(part, key, bad, f"parts[{index}].")
        name = part.get("file")
        if not isinstance(name, str) or os.path.basename(name) != name or name in ("", ".", ".."):
            raise bad(f"parts[{index}].file: not a plain file name")
        meta = part.get("meta")
        if not isinstance(meta, dict) or not _is_int(meta.get("ps_index")):
            raise bad(f"parts[{index}].meta.ps_index: expected an integer")
    if len(parts) != data["num_ps"]:
        raise bad(f"{len(parts)} parts for {data['num_ps']} PS")
    return data


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**64


def _check_int(
    data: Mapping[str, Any],
    key: str,
    bad: Callable[[str], CheckpointCorruptError],
    prefix: str = "",
) -> None:
    if key not in data:
        raise bad(f"{prefix}{key}: missing")
    if not _is_int(data[key]) or data[key] < 0:
        raise bad(f"{prefix}{key}: expected an integer >= 0 of at most 64 bits")
