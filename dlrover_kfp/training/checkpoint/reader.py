"""Reading and verifying one part, a file on disk or a snapshot in shared memory.

:class:`_PartFile` opens a part and checks its header and descriptor; its ``stream`` reads the
payload once, through crc32, and hands each array's rows to a :class:`_RowSink`, which copies
them (re-partitioned when a sink says so) into the restored arrays. :func:`read_snapshot`
copies a whole snapshot out. This module needs only the format, so that both the snapshot
buffer (``ShmSnapshot.read``) and the restore build on it.

Checksum trade-off for shared memory: the header carries the crc32 only once the persister has
written that snapshot (``crc_seq == seq``). A snapshot that is newer than its persist (the PS died
between the two) is restored *unverified*: its integrity rests on the writing/complete protocol,
and it is the only copy of that step. A snapshot with a crc is verified on restore like a file.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dlrover_kfp.errors import UserInputError
from dlrover_kfp.training.checkpoint.format import (
    CHUNK,
    DATA_START,
    HEADER_SIZE,
    PART_FORMAT,
    STATE_COMPLETE,
    AnyArray,
    ArrayDesc,
    CheckpointCorruptError,
    PartMeta,
    PathLike,
    _Header,
)

_POPULATE_MIN = 16 << 20  # restored arrays this big are mapped with MAP_POPULATE


@dataclass(frozen=True, slots=True)
class PartRef:
    """One part of a restore candidate and what it must match."""

    path: str
    nbytes: int
    crc32: int | None  # None: a shm snapshot whose persist never finished (unverifiable)
    seq: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "bytes": self.nbytes, "crc32": self.crc32, "seq": self.seq}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> PartRef:
        crc = raw.get("crc32")
        return cls(
            str(raw["path"]), int(raw["bytes"]), None if crc is None else int(crc), int(raw["seq"])
        )


class _PartFile:
    """An open part (disk file or shm snapshot): header and descriptor read and checked."""

    def __init__(self, path: Path, *, shm: bool, ref: PartRef | None = None) -> None:
        self.path = path
        self.shm = shm
        self.ref = ref
        try:
            self.fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise CheckpointCorruptError(f"{path}: missing") from None
        try:
            self._parse()
        except BaseException:
            os.close(self.fd)
            raise

    def _parse(self) -> None:
        path, ref = self.path, self.ref
        size = os.fstat(self.fd).st_size
        header = _Header.unpack(os.pread(self.fd, HEADER_SIZE, 0), path)
        if header.state != STATE_COMPLETE:
            raise CheckpointCorruptError(f"{path}: snapshot is not complete")
        if (size != header.total_len) if not self.shm else (size < header.total_len):
            raise CheckpointCorruptError(f"{path}: {size} bytes, header says {header.total_len}")
        if ref is not None:
            if header.total_len != ref.nbytes:
                raise CheckpointCorruptError(
                    f"{path}: {header.total_len} bytes, expected {ref.nbytes}"
                )
            if header.seq != ref.seq:
                raise CheckpointCorruptError(f"{path}: snapshot {header.seq}, expected {ref.seq}")
            if ref.crc32 is not None and header.verified_crc not in (None, ref.crc32):
                raise CheckpointCorruptError(f"{path}: header crc32 does not match the manifest")
        json_at = header.total_len - header.json_len
        if not DATA_START <= json_at <= header.total_len:
            raise CheckpointCorruptError(f"{path}: descriptor out of bounds")
        try:
            desc = json.loads(os.pread(self.fd, header.json_len, json_at))
            if desc.get("format") != PART_FORMAT:
                raise ValueError("not a part descriptor")
            self.meta = PartMeta.from_dict(desc["meta"])
            listed = [ArrayDesc.from_dict(x) for x in desc["arrays"]]
            self.arrays = {a.name: a for a in listed}
            if len(self.arrays) != len(listed):
                raise ValueError("an array name appears twice")
            self.extra: dict[str, Any] = dict(desc.get("extra") or {})
            self.generation = int(desc.get("generation", 0))
            if int(desc["step"]) != header.step or int(desc["seq"]) != header.seq:
                raise ValueError("descriptor and header disagree on step/seq")
        except (ValueError, KeyError, TypeError, UserInputError) as exc:
            raise CheckpointCorruptError(f"{path}: bad descriptor: {exc}") from None
        except (AttributeError, OverflowError, RecursionError) as exc:
            # The descriptor is not an object, a number is infinite, or nested too deeply.
            raise CheckpointCorruptError(
                f"{path}: bad descriptor: {type(exc).__name__}: {exc}"
            ) from None
        pos = DATA_START
        for a in sorted(self.arrays.values(), key=lambda a: a.offset):
            if a.offset < pos or a.offset + a.nbytes > json_at:
                raise CheckpointCorruptError(f"{path}: array {a.name!r} out of bounds")
            pos = a.offset + a.nbytes
        self.header = header
        self.json_at = json_at

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> _PartFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self, offset: int, buf: memoryview) -> None:
        while buf:
            n = os.preadv(self.fd, [buf], offset)
            if n <= 0:
                raise CheckpointCorruptError(f"{self.path}: truncated at byte {offset}")
            buf = buf[n:]
            offset += n

    def stream(self, sinks: Mapping[str, _RowSink], scratch: bytearray) -> None:
        """Read [64, total_len) once in chunks: crc32 every byte, hand array rows to the sinks.

        A contiguous sink receives the bytes straight from the kernel (``preadv`` into the
        destination); the others get them through ``scratch``. Reading instead of mapping the
        file: mapping faults every page into this process, which is slower here than one
        kernel copy per chunk. Raises :class:`CheckpointCorruptError` on a crc32 mismatch.
        """
        crc = 0
        scratch_view = memoryview(scratch)
        pos = HEADER_SIZE

        def skip_to(end: int) -> None:
            nonlocal pos, crc
            while pos < end:
                n = min(len(scratch), end - pos)
                self._read(pos, scratch_view[:n])
                crc = zlib.crc32(scratch_view[:n], crc)
                pos += n

        for desc in sorted(self.arrays.values(), key=lambda a: a.offset):
            skip_to(desc.offset)
            rows = desc.shape[0] if desc.shape else 1
            if rows == 0 or desc.nbytes == 0:
                continue
            row_bytes = desc.nbytes // rows
            per_chunk = max(1, len(scratch) // row_bytes)
            sink = sinks.get(desc.name)
            for r0 in range(0, rows, per_chunk):
                r1 = min(rows, r0 + per_chunk)
                n = (r1 - r0) * row_bytes
                direct = sink.direct(r0, r1) if sink is not None else None
                if direct is not None:
                    buf = direct.data.cast("B")
                    self._read(pos, buf)
                    sink_done = True
                else:
                    # One row bigger than the scratch buffer: a buffer of its own.
                    buf = scratch_view[:n] if n <= len(scratch) else memoryview(bytearray(n))
                    self._read(pos, buf)
                    sink_done = False
                crc = zlib.crc32(buf, crc)
                if sink is not None:
                    if sink_done:
                        sink.filled += r1 - r0
                    else:
                        chunk = np.frombuffer(buf, dtype=desc.dtype).reshape(
                            (r1 - r0, *desc.shape[1:])
                        )
                        sink.scatter(r0, chunk)
                pos += n
        skip_to(self.header.total_len)
        self._check(crc)

    def _check(self, crc: int) -> None:
        expected = self.ref.crc32 if self.ref is not None else None
        if expected is None:
            expected = self.header.verified_crc
        if expected is not None and crc != expected:
            raise CheckpointCorruptError(
                f"{self.path}: crc32 {crc:08x} does not match the recorded {expected:08x}"
            )
        if self.shm:
            now = _Header.unpack(os.pread(self.fd, HEADER_SIZE, 0), self.path)
            if (now.state, now.step, now.seq) != (
                STATE_COMPLETE,
                self.header.step,
                self.header.seq,
            ):
                raise CheckpointCorruptError(f"{self.path}: snapshot changed while being read")


class _RowSink:
    """Where the stored rows of one array go in this PS's restored array.

    The selected stored rows are an arithmetic progression and so are their new slots:

        stored row s = first + t·stride  ->  dest[dest_first + t·dest_stride],  t = 0 .. count-1

    so each chunk is one strided numpy copy, with no index arrays.
    """

    def __init__(
        self,
        dest: AnyArray,
        *,
        first: int,
        stride: int,
        dest_first: int,
        dest_stride: int,
        count: int,
    ) -> None:
        self.dest = dest
        self.first, self.stride = first, stride
        self.dest_first, self.dest_stride = dest_first, dest_stride
        self.count = count
        self.filled = 0

    @classmethod
    def identity(cls, dest: AnyArray) -> _RowSink:
        rows = dest.shape[0] if dest.shape else 1
        return cls(dest, first=0, stride=1, dest_first=0, dest_stride=1, count=rows)

    def direct(self, r0: int, r1: int) -> AnyArray | None:
        """The destination rows for stored rows [r0, r1) if they are one contiguous block."""
        if (
            self.stride == 1
            and self.dest_stride == 1
            and self.dest.flags.c_contiguous
            and self.first <= r0
            and r1 <= self.first + self.count
        ):
            start = self.dest_first + r0 - self.first
            if not self.dest.shape:
                return self.dest.reshape(1)
            return self.dest[start : start + r1 - r0]
        return None

    def scatter(self, r0: int, chunk: AnyArray) -> None:
        """Copy the selected rows among stored rows [r0, r0 + len(chunk))."""
        r1 = r0 + chunk.shape[0]
        t_lo = max(0, -((self.first - r0) // self.stride))  # ceil((r0 - first) / stride)
        t_hi = min(self.count, max(0, -((self.first - r1) // self.stride)))
        m = t_hi - t_lo
        if m <= 0:
            return
        a = self.first + t_lo * self.stride - r0
        b = self.dest_first + t_lo * self.dest_stride
        dest = self.dest if self.dest.shape else self.dest.reshape(1)
        np.copyto(
            dest[b : b + (m - 1) * self.dest_stride + 1 : self.dest_stride],
            chunk[a : a + (m - 1) * self.stride + 1 : self.stride],
            casting="no",
        )
        self.filled += m


def _fresh_array(shape: tuple[int, ...], dtype: str) -> AnyArray:
    """A new array for restored state; big ones are mapped with MAP_POPULATE.

    The kernel then fills the page tables in one go instead of one trap per 4 KiB page on first
    write, which measured 1.8 GB/s against 0.4-0.6 GB/s for ``np.empty`` + copy here.
    """
    dt = np.dtype(dtype)
    nbytes = math.prod(shape) * dt.itemsize
    populate = getattr(mmap, "MAP_POPULATE", 0)
    if nbytes >= _POPULATE_MIN and populate:
        buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)
        return np.frombuffer(buf, dtype=dt).reshape(shape)
    return np.empty(shape, dtype=dt)


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """A snapshot's description, from :func:`read_snapshot`."""

    path: Path
    meta: PartMeta
    generation: int
    step: int
    seq: int
    extra: dict[str, Any]
    verified: bool  # the persister's crc32 was present and matched


def read_snapshot(path: PathLike) -> tuple[SnapshotInfo, dict[str, AnyArray]]:
    """Copies of every array in a complete snapshot (verified when its crc32 is recorded)."""
    with _PartFile(Path(path), shm=True) as part:
        arrays = {n: _fresh_array(a.shape, a.dtype) for n, a in part.arrays.items()}
        part.stream({n: _RowSink.identity(a) for n, a in arrays.items()}, bytearray(CHUNK))
        info = SnapshotInfo(
            Path(path),
            part.meta,
            part.generation,
            part.header.step,
            part.header.seq,
            part.extra,
            part.header.verified_crc is not None,
        )
    return info, arrays
