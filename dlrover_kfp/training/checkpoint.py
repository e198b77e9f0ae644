"""Flash checkpoints for the parameter servers: snapshot to shared memory, persist in background.

A PS serves training requests on one thread, and a checkpoint request is handled between two of
them, so training on that PS stops for exactly as long as the checkpoint blocks. ``torch.save``
of a GiB of embeddings plus ``fsync`` takes 0.7-2 s on the machines we measured (0.5-1.4 GB/s);
a copy into memory that is already mapped and touched runs at 13-17 GB/s. So the blocking part of
a checkpoint is only that copy, into a shared-memory file, and everything slow happens after:

    blocked  = state_bytes / memcpy_rate          (~0.07 s per GiB)
    durable  = blocked + state_bytes / min(crc32_rate, write_rate) + fsync + commit

The pieces, in the order a checkpoint goes through them:

* :class:`ShmSnapshot` (one per PS process) owns a file in ``/dev/shm`` (tmpfs) named from the
  job id, a *generation* (the PS incarnation) and the part name. It is created **once**, sized
  for the state, reserved with ``posix_fallocate`` (so a full tmpfs is a clean error, not a
  SIGBUS on first write) and mapped in with ``MADV_POPULATE_WRITE``. Pre-touching matters:
  copying into fresh memory on these VMs runs at only 0.4-1.8 GB/s because every page faults in
  from the host, against 13-17 GB/s into pages that are already mapped. Each snapshot reuses
  the buffer.
* A snapshot marks the header "writing", copies the arrays, writes a JSON descriptor, then marks
  it "complete". A crash mid-copy leaves a snapshot that is invalid, never one that is half
  valid. The checksum is *not* computed here: crc32 runs at ~4 GB/s, which would triple the
  blocking time; the persister computes it while it reads the buffer anyway.
* :class:`Persister` (a background thread per PS) writes the buffer to
  ``ROOT/step-<step:010d>.tmp/<part>.bin`` in 8 MiB chunks, computing crc32 over each chunk as it
  writes it (one pass over the data, no copy), fsyncs, stores the crc into the shm header too,
  and resolves a future with a :class:`PartRecord` (file, bytes, crc32, array layout). Both
  ``zlib.crc32`` and ``os.pwrite`` release the GIL, so the training thread keeps running.
  *Back-pressure*: the persister pins the buffer from :meth:`Persister.submit` until its write
  is done; a new snapshot waits for that (``ShmSnapshot.busy`` says whether it would), because
  overwriting a buffer that is being written out would persist a torn state.
* :func:`commit` (the coordinator, once it holds every part's record) writes ``manifest.json``
  into the ``.tmp`` directory, fsyncs it, renames ``step-N.tmp`` to ``step-N`` and fsyncs the
  root. A checkpoint exists only once renamed, so no partial checkpoint is ever visible; the last
  ``keep`` are kept and older ones (and stale ``.tmp`` directories) deleted.
* :func:`load_checkpoint` restores one PS. Candidates are the complete shared-memory sets (every
  old part present at the same step) and the committed directories, newest step first, shared
  memory first on a tie. Each part is streamed through crc32 while it is copied, and a part that
  fails (size, header, crc32: one flipped byte is enough) is logged with its file name and the
  next older candidate is tried. Rows are re-partitioned on the fly when the number of PS
  changed (see :class:`_RowSink`).

File format (the same bytes in shared memory and on disk)::

    [0, 64)            header: magic, version, state, step, seq, total_len, json_len,
                       crc_seq, crc32 (of bytes [64, total_len)), header_crc
    [64, 4096)         zeros
    [4096, data_end)   the arrays, C order, each 64-byte aligned
    [.., total_len)    JSON descriptor: meta, step, seq, extra, arrays (name, dtype, shape, offset)

Who calls what:

* PS process, at start: ``load_checkpoint`` (or :func:`restore_ps_state`) *before* creating
  its own buffer, then ``FlashCheckpointer(root, meta, StateSpec...)`` (or
  :class:`PsCheckpointer`). Every incarnation gets a new ``generation`` (by default a
  timestamp), so a new PS never replaces an old snapshot that another PS may still be reading;
  after its first snapshot a PS removes the older generations' files of its own part
  (:meth:`ShmSnapshot.discard_older`).
* PS serving thread, on a checkpoint request between two training requests: ``save(step,
  arrays)``; reply with the blocked seconds; report the future's :class:`PartRecord` (a dict
  via ``to_dict``) when it resolves.
* Master/coordinator: when all P records of a step are in, :func:`commit`; at job start
  ``prune_checkpoints(root, all_tmp=True)``; at job end :func:`cleanup_shm` (tmpfs memory
  stays allocated until the files are unlinked). To restore consistently and cheaply, run
  :func:`select_checkpoint` once and pass the choice to every PS's ``load_checkpoint``.

Checksum trade-off for shared memory: the header carries the crc32 only once the persister has
written that snapshot (``crc_seq == seq``). A snapshot that is newer than its persist (the PS died
between the two) is restored *unverified*: its integrity rests on the writing/complete protocol,
and it is the only copy of that step. A snapshot with a crc is verified on restore like a file.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import logging
import math
import mmap
import os
import re
import shutil
import struct
import tempfile
import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

import numpy as np
import numpy.typing as npt
import torch

from dlrover_kfp.core.partition import Partition
from dlrover_kfp.errors import PermanentError, TransientError, UserInputError
from dlrover_kfp.training import memory

if TYPE_CHECKING:
    from dlrover_kfp.training.ps_state import PsConfig, PsState

logger = logging.getLogger(__name__)

AnyArray = npt.NDArray[Any]
ArrayLike = npt.NDArray[Any] | torch.Tensor
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
GROWTH = 1.25  # a buffer that must grow gets this much headroom, so that the next growth is rare
JSON_RESERVE = 64 << 10  # room for the descriptor and ``extra`` when sizing from a StateSpec
_POPULATE_MIN = 16 << 20  # restored arrays this big are mapped with MAP_POPULATE
_SPLIT_MIN = 32 << 20  # arrays this big are split over the copy threads

STATE_EMPTY = 0
STATE_WRITING = 1
STATE_COMPLETE = 2

ROW_ARRAYS = ("weights", "accum")  # [rows_on(k), dim], striped over the PS
DENSE_ARRAYS = ("dense", "dense_accum")  # flat, all on PS 0

SHM_ENV = "DLROVER_KFP_SHM_DIR"
_SHM_PREFIX = "dlrover-kfp"
_SHM_REST = re.compile(r"g(\d+)\.(ps-\d+)\.snap")
_SHM_ANY = re.compile(r"g\d+\.ps-\d+\.snap(?:\.\d+\.tmp)?")
_STEP_DIR = re.compile(r"step-(\d{10})")
_TMP_DIR = re.compile(r"step-(\d{10})\.tmp")
_DELETING = re.compile(r"step-\d{10}\.deleting")


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
        desc = cls(
            str(raw["name"]),
            np.dtype(str(raw["dtype"])).str,
            tuple(int(n) for n in raw["shape"]),
            int(raw["offset"]),
        )
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
# Shared-memory snapshot
# --------------------------------------------------------------------------------------------


def default_shm_dir() -> Path:
    """``$DLROVER_KFP_SHM_DIR``, else ``/dev/shm`` (tmpfs), else the temp dir (slower: disk)."""
    env = os.environ.get(SHM_ENV)
    if env:
        return Path(env)
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm
    return Path(tempfile.gettempdir())


def _shm_prefix(job_id: str) -> str:
    if not job_id:
        raise UserInputError("job_id must not be empty")
    return f"{_SHM_PREFIX}.{quote(job_id, safe='')}."


def shm_path(job_id: str, part: str, generation: int = 0, shm_dir: PathLike | None = None) -> Path:
    """Where the snapshot of ``part`` of ``job_id``'s incarnation ``generation`` lives."""
    directory = Path(shm_dir) if shm_dir is not None else default_shm_dir()
    return directory / f"{_shm_prefix(job_id)}g{int(generation)}.{part}.snap"


def list_shm(job_id: str, shm_dir: PathLike | None = None) -> list[Path]:
    """The snapshot files of ``job_id`` (every generation and part), sorted by name."""
    directory = Path(shm_dir) if shm_dir is not None else default_shm_dir()
    prefix = _shm_prefix(job_id)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(
        directory / n
        for n in names
        if n.startswith(prefix) and _SHM_REST.fullmatch(n[len(prefix) :])
    )


def cleanup_shm(
    job_id: str, shm_dir: PathLike | None = None, *, keep_generation: int | None = None
) -> list[Path]:
    """Remove ``job_id``'s snapshot files (half-created ones too); returns what was removed.

    Call it when the job ends, and with ``keep_generation`` once every PS of a new incarnation
    has restored, to free the old incarnation's memory (tmpfs holds it until unlinked).
    """
    directory = Path(shm_dir) if shm_dir is not None else default_shm_dir()
    prefix = _shm_prefix(job_id)
    keep = None if keep_generation is None else f"g{int(keep_generation)}."
    removed = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    for name in names:
        rest = name[len(prefix) :]
        if not name.startswith(prefix) or not _SHM_ANY.fullmatch(rest):
            continue
        if keep is not None and rest.startswith(keep):
            continue
        path = directory / name
        path.unlink(missing_ok=True)
        removed.append(path)
    return sorted(removed)


def _create_shm_file(path: Path, capacity: int, threads: int = 1) -> tuple[int, mmap.mmap]:
    """A new ``capacity``-byte file at ``path``, reserved, mapped and touched; atomically named.

    Built under a temporary name and renamed, so the name never refers to a half-made file, and a
    reader that still has the previous file open keeps reading the previous snapshot.

    The file is reserved and mapped in :data:`memory.POPULATE_PIECE` pieces, each
    ``posix_fallocate`` (allocates its tmpfs pages, which tmpfs zeroes at their first fault) then
    ``MADV_POPULATE_WRITE`` (zeroes and maps them into this process in one call, see
    :mod:`dlrover_kfp.training.memory`); ``threads`` > 1 work on different pieces at once. For
    3 GB in fresh processes here (medians of 4): 1.2 GB/s with one thread, 1.8 GB/s with two,
    against 0.8-1.5 GB/s for the former whole-file fallocate plus one written byte per page.
    Almost all of it is the zeroing of pages that the host must first provide (``clear_page``
    in a kernel profile), so under memory pressure it falls to 0.4-0.6 GB/s whatever the method.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, capacity)
        mm = mmap.mmap(fd, capacity, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    try:
        fallocate = [hasattr(os, "posix_fallocate")]  # macOS: no fallocate, no tmpfs either

        def reserve_and_map(start: int) -> None:
            stop = min(start + memory.POPULATE_PIECE, capacity)
            if fallocate[0]:
                # Reserve: on tmpfs a write fault into a page that cannot be allocated is a
                # SIGBUS that kills the PS; fallocate turns that into ENOSPC here, at start.
                try:
                    os.posix_fallocate(fd, start, stop - start)
                except OSError as exc:
                    if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                        raise
                    fallocate[0] = False  # populate alone still reports a full tmpfs
            # Mapping every page now lets snapshots copy at memcpy speed instead of faulting
            # pages in (10x slower on these VMs).
            memory.populate(np.frombuffer(mm, np.uint8, count=stop - start, offset=start))

        pieces = range(0, capacity, memory.POPULATE_PIECE)
        try:
            if threads <= 1:
                for start in pieces:
                    reserve_and_map(start)
            else:
                with ThreadPoolExecutor(threads, thread_name_prefix="shm-populate") as pool:
                    for future in [pool.submit(reserve_and_map, start) for start in pieces]:
                        future.result()
        except (OSError, MemoryError) as exc:
            if isinstance(exc, OSError) and exc.errno != errno.ENOSPC:
                raise
            raise CheckpointError(
                f"{path.parent}: no room for a {capacity}-byte snapshot buffer; give the pod "
                "a larger /dev/shm (an emptyDir with medium: Memory and a sizeLimit)"
            ) from None
        os.replace(tmp, path)
    except BaseException:
        # A view of the buffer may still be held by the exception's traceback; the mapping then
        # goes when that is freed.
        with contextlib.suppress(BufferError):
            mm.close()
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    return fd, mm


def _as_numpy(name: str, array: ArrayLike) -> AnyArray:
    """A numpy view of a CPU tensor (no copy) or the array itself."""
    if isinstance(array, torch.Tensor):
        if array.device.type != "cpu":
            raise UserInputError(
                f"array {name!r} is on {array.device}; flash checkpoints hold CPU state"
            )
        return array.detach().numpy()
    if isinstance(array, np.ndarray):
        return array
    raise UserInputError(
        f"array {name!r}: expected a numpy array or a torch tensor, got {type(array).__name__}"
    )


@dataclass(frozen=True, slots=True)
class SnapshotStats:
    """What one snapshot cost the training thread."""

    step: int
    seq: int
    nbytes: int
    wait_s: float  # waiting for the previous snapshot's persist (back-pressure)
    copy_s: float  # the copy itself (and, if ``grew``, re-creating the buffer)
    grew: bool = False

    @property
    def blocked_s(self) -> float:
        return self.wait_s + self.copy_s


@dataclass(frozen=True, slots=True)
class _Current:
    """The complete snapshot in the buffer, as the persister needs it."""

    step: int
    seq: int
    total_len: int
    json_len: int
    arrays: tuple[ArrayDesc, ...]


class ShmSnapshot:
    """One PS's snapshot buffer: a pre-touched shared-memory file reused for every snapshot.

    Create it once at PS start (it costs ~0.5-1 s per GiB to reserve and map here, up to 2.5 s
    when the host is short of memory). The
    file outlives the process on purpose: a restarted PS restores from it. Remove it with
    :meth:`unlink` or :func:`cleanup_shm` when the job ends.

    ``copy_threads`` > 1 splits big arrays over that many threads during the copy (numpy
    releases the GIL): 12-13 GB/s with one thread, 17-20 GB/s with two on these machines; the
    same number of threads reserve and map the buffer at creation. The default is one, because
    a PS shares the cores with other processes of the job.
    """

    def __init__(
        self,
        meta: PartMeta,
        capacity: int | StateSpec,
        *,
        shm_dir: PathLike | None = None,
        generation: int | None = None,
        copy_threads: int = 1,
    ) -> None:
        if copy_threads < 1:
            raise UserInputError(f"copy_threads must be >= 1, got {copy_threads}")
        self.copy_threads = copy_threads
        self._copy_pool = (
            ThreadPoolExecutor(copy_threads - 1, thread_name_prefix="shm-copy")
            if copy_threads > 1
            else None
        )
        if generation is None:
            generation = time.time_ns() // 1000  # unique per incarnation, and increasing
        if generation < 0:
            raise UserInputError(f"generation must be >= 0, got {generation}")
        self.meta = meta
        self.generation = generation
        self.shm_dir = Path(shm_dir) if shm_dir is not None else default_shm_dir()
        self.path = shm_path(meta.job_id, meta.part, generation, self.shm_dir)
        size = capacity.capacity() if isinstance(capacity, StateSpec) else int(capacity)
        self.capacity = _align(max(size, DATA_START + PAGE), PAGE)
        self._cond = threading.Condition()
        self._pins = 0
        self._closed = False
        self._seq = 0
        self._current: _Current | None = None
        started = time.perf_counter()
        self._fd, self._mm = _create_shm_file(self.path, self.capacity, copy_threads)
        self.setup_s = time.perf_counter() - started

    @property
    def busy(self) -> bool:
        """True while a persist still reads the buffer: a snapshot now would wait for it."""
        with self._cond:
            return self._pins > 0

    @property
    def step(self) -> int | None:
        """The step of the complete snapshot in the buffer, if any."""
        with self._cond:
            return None if self._current is None else self._current.step

    def snapshot(
        self,
        step: int,
        arrays: Mapping[str, ArrayLike],
        *,
        extra: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> SnapshotStats:
        """Copy ``arrays`` into the buffer as the snapshot of ``step``; blocks only for the copy.

        Waits first (up to ``timeout`` s, then :class:`CheckpointBusyError`) while a persist of
        the previous snapshot still reads the buffer. ``extra`` (JSON) travels with the snapshot:
        give PS 0 the worker/data-shard state so that a restore from shared memory has it too.
        """
        if step < 0:
            raise UserInputError(f"step must be >= 0, got {step}")
        started = time.perf_counter()
        with self._cond:
            if self._closed:
                raise CheckpointError(f"{self.path}: snapshot buffer is closed")
            if not self._cond.wait_for(lambda: self._pins == 0, timeout):
                raise CheckpointBusyError(
                    f"{self.path}: the previous snapshot is still being persisted"
                )
            waited = time.perf_counter()
            sources = {name: _as_numpy(name, a) for name, a in arrays.items()}
            descs, data_end = _layout([ArraySpec.of(n, a) for n, a in sources.items()])
            seq = self._seq + 1
            try:
                descriptor = json.dumps(
                    {
                        "format": PART_FORMAT,
                        "version": FORMAT_VERSION,
                        "meta": self.meta.to_dict(),
                        "generation": self.generation,
                        "step": step,
                        "seq": seq,
                        "written_at": time.time(),
                        "arrays": [d.to_dict() for d in descs],
                        "extra": dict(extra or {}),
                    },
                    separators=(",", ":"),
                ).encode()
            except (TypeError, ValueError) as exc:
                raise UserInputError(f"snapshot extra is not JSON: {exc}") from None
            total = _align(data_end, ARRAY_ALIGN) + len(descriptor)
            grew = total > self.capacity
            if grew:
                self._grow(total)
            self._current = None
            mm = self._mm
            mm[:HEADER_SIZE] = _Header(STATE_WRITING, step, seq, 0, 0).pack()
            for desc in descs:
                if desc.count:
                    target = np.frombuffer(
                        mm, dtype=desc.dtype, count=desc.count, offset=desc.offset
                    ).reshape(desc.shape)
                    try:
                        self._copy(target, sources[desc.name])
                    finally:
                        del target  # an exported view would keep the mmap from closing
            mm[total - len(descriptor) : total] = descriptor
            mm[:HEADER_SIZE] = _Header(STATE_COMPLETE, step, seq, total, len(descriptor)).pack()
            self._seq = seq
            self._current = _Current(step, seq, total, len(descriptor), descs)
            done = time.perf_counter()
        return SnapshotStats(
            step, seq, sum(d.nbytes for d in descs), waited - started, done - waited, grew
        )

    def _copy(self, target: AnyArray, source: AnyArray) -> None:
        """``target[:] = source``, split by rows over the copy threads when it is big."""
        pool = self._copy_pool
        rows = target.shape[0] if target.shape else 0
        if pool is None or target.nbytes < _SPLIT_MIN or rows < self.copy_threads:
            np.copyto(target, source, casting="no")
            return
        bounds = [rows * i // self.copy_threads for i in range(self.copy_threads + 1)]
        pending = [
            pool.submit(np.copyto, target[a:b], source[a:b], casting="no")
            for a, b in itertools.pairwise(bounds[:-1])
        ]
        np.copyto(target[bounds[-2] :], source[bounds[-2] :], casting="no")
        for future in pending:
            future.result()

    def _grow(self, needed: int) -> None:
        """Slow path: the state outgrew the buffer; replace it with a bigger one (called locked)."""
        capacity = _align(int(needed * GROWTH), PAGE)
        started = time.perf_counter()
        old_fd, old_mm = self._fd, self._mm
        self._fd, self._mm = _create_shm_file(self.path, capacity, self.copy_threads)
        old_mm.close()
        os.close(old_fd)
        logger.warning(
            "%s: a %d-byte snapshot outgrew the %d-byte buffer; re-created it with %d "
            "bytes in %.2f s (size the buffer with StateSpec at PS start to avoid this)",
            self.path,
            needed,
            self.capacity,
            capacity,
            time.perf_counter() - started,
        )
        self.capacity = capacity

    # The persister's side. ``_pin`` is taken in the caller's thread at submit time, so that no
    # snapshot can slip in between a snapshot and the start of its persist.

    def _pin(self) -> _Current:
        with self._cond:
            if self._closed or self._current is None:
                raise CheckpointError(f"{self.path}: no complete snapshot to persist")
            self._pins += 1
            return self._current

    def _unpin(self) -> None:
        with self._cond:
            self._pins -= 1
            self._cond.notify_all()

    def _view(self) -> memoryview:
        return memoryview(self._mm)

    def _set_crc(self, seq: int, crc: int) -> None:
        """Record the persister's crc32 in the header, so that a restore from shm can verify."""
        with self._cond:
            cur = self._current
            if cur is not None and cur.seq == seq and not self._closed:
                self._mm[:HEADER_SIZE] = _Header(
                    STATE_COMPLETE, cur.step, cur.seq, cur.total_len, cur.json_len, seq, crc
                ).pack()

    def discard_older(self) -> list[Path]:
        """Remove this job's snapshot files that this PS's snapshots have made useless.

        That is this part's files of other generations and, on PS 0, the files of parts that no
        longer exist (index >= num_ps after a scale-in). Call it once this incarnation has a
        complete snapshot of its own *and* every PS of the job has restored (the first checkpoint
        request of a job comes after all PS registered, so after its first snapshot is safe).
        """
        prefix = _shm_prefix(self.meta.job_id)
        removed = []
        for path in list_shm(self.meta.job_id, self.shm_dir):
            m = _SHM_REST.fullmatch(path.name[len(prefix) :])
            if m is None or int(m.group(1)) == self.generation:
                continue
            index = int(m.group(2)[3:])
            if index == self.meta.ps_index or (
                self.meta.ps_index == 0 and index >= self.meta.num_ps
            ):
                path.unlink(missing_ok=True)
                removed.append(path)
        return removed

    def close(self, timeout: float | None = None) -> None:
        """Unmap the buffer (waiting for a persist that still reads it); the file stays."""
        with self._cond:
            if self._closed:
                return
            if not self._cond.wait_for(lambda: self._pins == 0, timeout):
                raise CheckpointBusyError(f"{self.path}: still being persisted")
            self._closed = True
            self._mm.close()
            os.close(self._fd)
            if self._copy_pool is not None:
                self._copy_pool.shutdown()

    def unlink(self) -> None:
        """Close and remove the file (the snapshot is gone for good)."""
        self.close()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> ShmSnapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def read(path: PathLike) -> tuple[SnapshotInfo, dict[str, AnyArray]]:
        """The snapshot in ``path`` (of a live or dead process): see :func:`read_snapshot`."""
        return read_snapshot(path)


# --------------------------------------------------------------------------------------------
# Persisting
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartRecord:
    """What a PS reports to the coordinator once its part of step ``step`` is durable."""

    meta: PartMeta
    step: int
    seq: int
    file: str  # name inside the step directory
    nbytes: int
    crc32: int
    arrays: tuple[ArrayDesc, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "meta": self.meta.to_dict(),
            "step": self.step,
            "seq": self.seq,
            "file": self.file,
            "bytes": self.nbytes,
            "crc32": self.crc32,
            "arrays": [a.to_dict() for a in self.arrays],
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> PartRecord:
        return cls(
            PartMeta.from_dict(raw["meta"]),
            int(raw["step"]),
            int(raw["seq"]),
            str(raw["file"]),
            int(raw["bytes"]),
            int(raw["crc32"]),
            tuple(ArrayDesc.from_dict(a) for a in raw["arrays"]),
        )


def _step_name(step: int) -> str:
    return f"step-{step:010d}"


def _tmp_name(step: int) -> str:
    return f"{_step_name(step)}.tmp"


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _persist_part(root: Path, shm: ShmSnapshot, cur: _Current) -> PartRecord:
    """Write the pinned snapshot to ``root/step-N.tmp/<part>.bin``: crc32 and write per chunk.

    The payload [64, total) goes first, the header (with the crc) last, then fsync: a file whose
    header is valid has every byte of its payload written.
    """
    step_dir = root / _tmp_name(cur.step)
    path = step_dir / f"{shm.meta.part}.bin"
    crc = 0
    try:
        step_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            with shm._view() as view:
                pos = HEADER_SIZE
                while pos < cur.total_len:
                    end = min(pos + CHUNK, cur.total_len)
                    with view[pos:end] as chunk:
                        crc = zlib.crc32(chunk, crc)
                        _pwrite_all(fd, chunk, pos)
                    pos = end
            header = _Header(
                STATE_COMPLETE, cur.step, cur.seq, cur.total_len, cur.json_len, cur.seq, crc
            )
            _pwrite_all(fd, header.pack(), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        _fsync_dir(step_dir)
    except OSError as exc:
        raise CheckpointWriteError(f"{path}: cannot write checkpoint part: {exc.strerror}") from exc
    shm._set_crc(cur.seq, crc)
    return PartRecord(shm.meta, cur.step, cur.seq, path.name, cur.total_len, crc, cur.arrays)


class Persister:
    """Background writer of one PS's snapshots to ``root`` (one thread, one persist at a time)."""

    def __init__(self, root: PathLike, shm: ShmSnapshot) -> None:
        self.root = Path(root)
        self._shm = shm
        self._pool = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"persist-{shm.meta.part}"
        )

    @property
    def busy(self) -> bool:
        return self._shm.busy

    def submit(self) -> Future[PartRecord]:
        """Persist the buffer's current snapshot; pins it now, returns at once.

        The future resolves to the :class:`PartRecord` to send to the coordinator, or raises
        :class:`CheckpointWriteError`.
        """
        cur = self._shm._pin()
        try:
            return self._pool.submit(self._run, cur)
        except BaseException:
            self._shm._unpin()
            raise

    def _run(self, cur: _Current) -> PartRecord:
        try:
            return _persist_part(self.root, self._shm, cur)
        finally:
            self._shm._unpin()

    def close(self) -> None:
        """Finish the queued persists and stop the thread."""
        self._pool.shutdown(wait=True)


class FlashCheckpointer:
    """What a PS process holds: its snapshot buffer and its persister, behind one call."""

    def __init__(
        self,
        root: PathLike,
        meta: PartMeta,
        capacity: int | StateSpec,
        *,
        shm_dir: PathLike | None = None,
        generation: int | None = None,
        copy_threads: int = 1,
    ) -> None:
        self.shm = ShmSnapshot(
            meta, capacity, shm_dir=shm_dir, generation=generation, copy_threads=copy_threads
        )
        self.persister = Persister(root, self.shm)
        self._lock = threading.Lock()

    @property
    def busy(self) -> bool:
        return self.shm.busy

    def save(
        self,
        step: int,
        arrays: Mapping[str, ArrayLike],
        *,
        extra: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> tuple[SnapshotStats, Future[PartRecord]]:
        """Snapshot (blocking for the copy), then persist in the background."""
        with self._lock:
            stats = self.shm.snapshot(step, arrays, extra=extra, timeout=timeout)
            return stats, self.persister.submit()

    def close(self) -> None:
        """Wait for pending persists, unmap; the shm file stays for a restore."""
        self.persister.close()
        self.shm.close()

    def unlink(self) -> None:
        self.persister.close()
        self.shm.unlink()

    def __enter__(self) -> FlashCheckpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------------
# Committing
# --------------------------------------------------------------------------------------------


def _committed(root: Path) -> list[tuple[int, Path]]:
    """Committed checkpoints (renamed, with a manifest), newest first."""
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        m = _STEP_DIR.fullmatch(entry.name)
        if m and entry.is_dir() and (Path(entry.path) / MANIFEST).is_file():
            found.append((int(m.group(1)), Path(entry.path)))
    return sorted(found, reverse=True)


def list_checkpoints(root: PathLike) -> list[int]:
    """Steps of the committed checkpoints under ``root``, newest first."""
    return [step for step, _ in _committed(Path(root))]


def prune_checkpoints(root: PathLike, keep: int = 3, *, all_tmp: bool = False) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints, and ``.tmp`` directories that are stale.

    A ``.tmp`` directory is stale once a checkpoint at its step or later is committed; with
    ``all_tmp`` every one goes (call that at job start, before any PS persists, to clear what a
    crashed run left). A committed directory is renamed before it is deleted, so a crash
    mid-delete never leaves a half-deleted directory that still looks committed.
    """
    if keep < 1:
        raise UserInputError(f"keep must be >= 1, got {keep}")
    base = Path(root)
    committed = _committed(base)
    newest = committed[0][0] if committed else -1
    removed = []
    for _, path in committed[keep:]:
        doomed = path.with_name(f"{path.name}.deleting")
        shutil.rmtree(doomed, ignore_errors=True)
        os.replace(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        removed.append(path)
    try:
        entries = list(os.scandir(base))
    except FileNotFoundError:
        entries = []
    for entry in entries:
        m = _TMP_DIR.fullmatch(entry.name)
        if (m and (all_tmp or int(m.group(1)) <= newest)) or _DELETING.fullmatch(entry.name):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    if committed[keep:]:
        _fsync_dir(base)
    return removed


def commit(
    root: PathLike,
    step: int,
    parts: Sequence[PartRecord],
    extra: Mapping[str, Any] | None = None,
    *,
    keep: int = 3,
) -> Path:
    """Make step ``step`` a checkpoint: manifest into ``step-N.tmp``, fsync, rename, fsync root.

    ``parts`` are the records of every PS (0 .. P-1) of that step; ``extra`` (JSON) is the
    coordinator's own state, the workers' data-shard positions for instance. Returns the
    committed directory. A step that is already committed is left as it is (logged).
    """
    base = Path(root)
    tmp = base / _tmp_name(step)
    final = base / _step_name(step)
    records = sorted(parts, key=lambda p: p.meta.ps_index)
    if not records:
        raise CheckpointError(f"{tmp}: commit without parts")
    first = records[0].meta
    if [p.meta.ps_index for p in records] != list(range(first.num_ps)):
        raise CheckpointError(
            f"{tmp}: parts {[p.meta.part for p in records]} do not cover "
            f"PS 0..{first.num_ps - 1} exactly once"
        )
    for rec in records:
        m = rec.meta
        if rec.step != step:
            raise CheckpointError(f"{tmp}: {m.part} reported step {rec.step}, expected {step}")
        if Path(rec.file).name != rec.file or rec.file in ("", ".", "..", MANIFEST):
            raise CheckpointError(f"{tmp}: {m.part} reported the file name {rec.file!r}")
        if (m.job_id, m.num_ps, m.total_rows, m.dim, m.table_sizes) != (
            first.job_id,
            first.num_ps,
            first.total_rows,
            first.dim,
            first.table_sizes,
        ):
            raise CheckpointError(f"{tmp}: {m.part} disagrees with ps-0 on the job or geometry")
        try:
            size = (tmp / rec.file).stat().st_size
        except FileNotFoundError:
            raise CheckpointError(f"{tmp / rec.file}: reported but missing") from None
        if size != rec.nbytes:
            raise CheckpointError(f"{tmp / rec.file}: {size} bytes, reported {rec.nbytes}")
    if final.exists():
        logger.warning("%s is already committed; discarding the duplicate %s", final, tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        return final
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": FORMAT_VERSION,
        "job_id": first.job_id,
        "step": step,
        "num_ps": first.num_ps,
        "total_rows": first.total_rows,
        "dim": first.dim,
        "table_sizes": list(first.table_sizes),
        "partition": "owner = gid mod num_ps, slot = gid div num_ps",
        "committed_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "parts": [rec.to_dict() for rec in records],
        "extra": dict(extra or {}),
    }
    try:
        text = json.dumps(manifest, indent=1).encode()
    except (TypeError, ValueError) as exc:
        raise UserInputError(f"checkpoint extra is not JSON: {exc}") from None
    try:
        fd = os.open(tmp / MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _pwrite_all(fd, text, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        _fsync_dir(tmp)
        os.rename(tmp, final)
        _fsync_dir(base)
    except OSError as exc:
        raise CheckpointWriteError(f"{final}: cannot commit: {exc.strerror}") from exc
    logger.info("committed %s (%d parts)", final, len(records))
    prune_checkpoints(base, keep)
    return final


# --------------------------------------------------------------------------------------------
# Reading and verifying
# --------------------------------------------------------------------------------------------


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
            self.arrays = {a.name: a for a in (ArrayDesc.from_dict(x) for x in desc["arrays"])}
            self.extra: dict[str, Any] = dict(desc.get("extra") or {})
            self.generation = int(desc.get("generation", 0))
            if int(desc["step"]) != header.step or int(desc["seq"]) != header.seq:
                raise ValueError("descriptor and header disagree on step/seq")
        except (ValueError, KeyError, TypeError, UserInputError) as exc:
            raise CheckpointCorruptError(f"{path}: bad descriptor: {exc}") from None
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


def _repartition_sink(
    dest: AnyArray, k: int, p_old: int, j: int, p_new: int, rows_k: int
) -> _RowSink | None:
    """Rows of old part ``k`` (of ``p_old``) that new PS ``j`` (of ``p_new``) owns.

    Old slot s of part k holds gid = s·P + k; PS j of P' wants gid ≡ j (mod P'). With
    d = gcd(P, P'), s·P + k ≡ j (mod P') has a solution iff d | (j - k), and then the solutions
    are s ≡ s0 (mod P'/d). Consecutive selected gids differ by lcm(P, P') = P·P'/d, so their new
    slots gid div P' differ by P/d (lcm is a multiple of P'). None if part k gives j nothing.
    """
    d = math.gcd(p_old, p_new)
    stride, dest_stride = p_new // d, p_old // d
    s0 = next((s for s in range(stride) if (s * p_old + k - j) % p_new == 0), None)
    if s0 is None or s0 >= rows_k:
        return None
    count = (rows_k - s0 + stride - 1) // stride
    return _RowSink(
        dest,
        first=s0,
        stride=stride,
        dest_first=(s0 * p_old + k) // p_new,
        dest_stride=dest_stride,
        count=count,
    )


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


def _destination(
    name: str, shape: tuple[int, ...], dtype: str, out: Mapping[str, ArrayLike] | None
) -> AnyArray:
    if out is None or name not in out:
        return _fresh_array(shape, dtype)
    arr = _as_numpy(name, out[name])
    if tuple(arr.shape) != shape or np.dtype(arr.dtype) != np.dtype(dtype):
        raise UserInputError(
            f"out[{name!r}] is {arr.dtype}{list(arr.shape)}, the checkpoint "
            f"restores {np.dtype(dtype)}{list(shape)}"
        )
    if not arr.flags.writeable:
        raise UserInputError(f"out[{name!r}] is read-only")
    return arr


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


# --------------------------------------------------------------------------------------------
# Choosing and restoring
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckpointChoice:
    """A restore candidate: a committed directory or a complete set of shm snapshots.

    :func:`select_checkpoint` returns the one to use; ``to_dict`` is what a coordinator sends to
    the PS so that they all restore the same step.
    """

    source: Source
    step: int
    location: str  # the committed directory, or the shm directory
    job_id: str
    num_ps: int  # PS that wrote it
    total_rows: int
    dim: int
    table_sizes: tuple[int, ...]
    parts: tuple[PartRef, ...]  # index = old PS index
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "step": self.step,
            "location": self.location,
            "job_id": self.job_id,
            "num_ps": self.num_ps,
            "total_rows": self.total_rows,
            "dim": self.dim,
            "table_sizes": list(self.table_sizes),
            "parts": [p.to_dict() for p in self.parts],
            "extra": self.extra,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> CheckpointChoice:
        source = str(raw["source"])
        if source not in ("shm", "disk"):
            raise UserInputError(f"checkpoint choice: unknown source {source!r}")
        return cls(
            "shm" if source == "shm" else "disk",
            int(raw["step"]),
            str(raw["location"]),
            str(raw["job_id"]),
            int(raw["num_ps"]),
            int(raw["total_rows"]),
            int(raw["dim"]),
            tuple(int(n) for n in raw["table_sizes"]),
            tuple(PartRef.from_dict(p) for p in raw["parts"]),
            dict(raw.get("extra", {})),
        )


def _disk_choice(path: Path) -> CheckpointChoice:
    manifest_path = path / MANIFEST
    try:
        raw = json.loads(manifest_path.read_bytes())
        if raw.get("format") != MANIFEST_FORMAT or int(raw["version"]) != FORMAT_VERSION:
            raise ValueError("unknown manifest format or version")
        parts = sorted(raw["parts"], key=lambda p: int(p["meta"]["ps_index"]))
        if any(Path(str(p["file"])).name != str(p["file"]) for p in parts):
            raise ValueError("a part file name is not a plain name")
        refs = tuple(
            PartRef(str(path / str(p["file"])), int(p["bytes"]), int(p["crc32"]), int(p["seq"]))
            for p in parts
        )
        if len(refs) != int(raw["num_ps"]):
            raise ValueError(f"{len(refs)} parts for {raw['num_ps']} PS")
        return CheckpointChoice(
            "disk",
            int(raw["step"]),
            str(path),
            str(raw["job_id"]),
            int(raw["num_ps"]),
            int(raw["total_rows"]),
            int(raw["dim"]),
            tuple(int(n) for n in raw.get("table_sizes", ())),
            refs,
            dict(raw.get("extra") or {}),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointCorruptError(f"{manifest_path}: unreadable manifest: {exc}") from None


def _shm_choices(job_id: str, shm_dir: PathLike | None) -> list[CheckpointChoice]:
    """Complete sets of snapshots: every part 0..P-1 of one generation at one step."""
    groups: dict[tuple[int, int, int], dict[int, tuple[_PartFile, PartRef]]] = {}
    for path in list_shm(job_id, shm_dir):
        try:
            with _PartFile(path, shm=True) as part:
                h = part.header
                ref = PartRef(str(path), h.total_len, h.verified_crc, h.seq)
                key = (part.generation, h.step, part.meta.num_ps)
                groups.setdefault(key, {})[part.meta.ps_index] = (part, ref)
        except CheckpointCorruptError as exc:
            logger.debug("skipping shm snapshot: %s", exc)
    choices = []
    # Newest generation first: at the same step, the sort in _candidates keeps this order.
    for (_, step, num_ps), members in sorted(groups.items(), reverse=True):
        if sorted(members) != list(range(num_ps)):
            continue
        metas = [members[k][0].meta for k in range(num_ps)]
        geometry = {(m.job_id, m.total_rows, m.dim, m.table_sizes) for m in metas}
        if len(geometry) != 1:
            continue
        m0 = metas[0]
        location = str(Path(members[0][1].path).parent)
        choices.append(
            CheckpointChoice(
                "shm",
                step,
                location,
                m0.job_id,
                num_ps,
                m0.total_rows,
                m0.dim,
                m0.table_sizes,
                tuple(members[k][1] for k in range(num_ps)),
                members[0][0].extra,
            )
        )
    return choices


def _candidates(
    root: PathLike | None, job_id: str | None, shm_dir: PathLike | None
) -> tuple[list[CheckpointChoice], int]:
    """Every candidate, best first (newest step; shm before disk at the same step).

    Also returns how many committed checkpoints had an unreadable manifest.
    """
    choices: list[CheckpointChoice] = []
    broken = 0
    if root is not None:
        for _, path in _committed(Path(root)):
            try:
                choices.append(_disk_choice(path))
            except CheckpointCorruptError as exc:
                logger.warning("%s; ignoring this checkpoint", exc)
                broken += 1
    if job_id is not None:
        choices += _shm_choices(job_id, shm_dir)
    choices.sort(key=lambda c: (c.step, c.source == "shm"), reverse=True)
    return choices, broken


def _verify(choice: CheckpointChoice, skip: frozenset[int] = frozenset()) -> None:
    """crc32 over every part of ``choice`` except ``skip``; raises on the first bad one."""
    scratch = bytearray(CHUNK)
    for k, ref in enumerate(choice.parts):
        if k in skip:
            continue
        with _PartFile(Path(ref.path), shm=choice.source == "shm", ref=ref) as part:
            part.stream({}, scratch)


def select_checkpoint(
    root: PathLike | None, *, job_id: str | None = None, shm_dir: PathLike | None = None
) -> CheckpointChoice | None:
    """The newest candidate whose every part verifies (shm preferred on a tie).

    Run it once in the coordinator and pass the result to every PS's :func:`load_checkpoint`:
    then each PS reads only the parts it needs. None when there is no checkpoint at all (a
    fresh start); :class:`CheckpointError` when there are some and none verifies.
    """
    choices, broken = _candidates(root, job_id, shm_dir)
    for choice in choices:
        try:
            _verify(choice)
            return choice
        except CheckpointCorruptError as exc:
            logger.warning("%s; trying an older checkpoint", exc)
    if choices or broken:
        raise CheckpointError(f"{root}: no checkpoint verifies ({len(choices) + broken} tried)")
    return None


@dataclass(frozen=True, slots=True, eq=False)
class RestoredPart:
    """One PS's restored state, re-partitioned for ``num_ps`` PS if that changed."""

    step: int
    source: Source
    location: str
    job_id: str
    num_ps: int
    ps_index: int
    from_num_ps: int
    total_rows: int
    dim: int
    table_sizes: tuple[int, ...]
    weights: AnyArray  # [rows_on(ps_index), dim]
    accum: AnyArray
    dense: AnyArray | None  # PS 0 only
    dense_accum: AnyArray | None
    extra: dict[str, Any]
    verified: bool  # False only for a shm snapshot whose persist had not finished


def _restore(
    choice: CheckpointChoice,
    num_ps: int,
    ps_index: int,
    out: Mapping[str, ArrayLike] | None,
    *,
    verify_all: bool,
) -> RestoredPart:
    p_old = choice.num_ps
    old = Partition(choice.total_rows, p_old)
    rows_j = Partition(choice.total_rows, num_ps).rows_on(ps_index)
    is_shm = choice.source == "shm"
    scratch = bytearray(CHUNK)
    dest: dict[str, AnyArray] = {}
    sinks_by_part: list[dict[str, _RowSink]] = []
    verified = True
    files: list[_PartFile] = []
    try:
        for ref in choice.parts:
            files.append(_PartFile(Path(ref.path), shm=is_shm, ref=ref))
        for k, part in enumerate(files):
            m = part.meta
            if (m.ps_index, m.num_ps, part.header.step) != (k, p_old, choice.step):
                raise CheckpointCorruptError(
                    f"{part.path}: holds {m.part} of {m.num_ps} at "
                    f"step {part.header.step}, expected ps-{k} of "
                    f"{p_old} at step {choice.step}"
                )
            sinks: dict[str, _RowSink] = {}
            for name in ROW_ARRAYS:
                desc = part.arrays.get(name)
                if desc is None or desc.shape != (old.rows_on(k), choice.dim):
                    raise CheckpointCorruptError(
                        f"{part.path}: {name} is missing or not [{old.rows_on(k)}, {choice.dim}]"
                    )
                if name not in dest:
                    dest[name] = _destination(name, (rows_j, choice.dim), desc.dtype, out)
                elif np.dtype(desc.dtype) != dest[name].dtype:
                    raise CheckpointCorruptError(
                        f"{part.path}: {name} is {desc.dtype}, ps-0 has {dest[name].dtype}"
                    )
                sink = _repartition_sink(dest[name], k, p_old, ps_index, num_ps, desc.shape[0])
                if sink is not None:
                    sinks[name] = sink
            if k == 0 and ps_index == 0:
                for name in DENSE_ARRAYS:
                    if name in part.arrays:
                        desc = part.arrays[name]
                        dest[name] = _destination(name, desc.shape, desc.dtype, out)
                        sinks[name] = _RowSink.identity(dest[name])
            sinks_by_part.append(sinks)
        for part, sinks in zip(files, sinks_by_part, strict=True):
            if sinks or verify_all:
                part.stream(sinks, scratch)
                verified = verified and (
                    part.ref is None
                    or part.ref.crc32 is not None
                    or part.header.verified_crc is not None
                )
    finally:
        for part in files:
            part.close()
    for name in ROW_ARRAYS:
        filled = sum(s[name].filled for s in sinks_by_part if name in s)
        if filled != rows_j:
            raise CheckpointCorruptError(
                f"{choice.location}: restored {filled} of {rows_j} {name} rows for ps-{ps_index}"
            )
    if not verified:
        logger.info(
            "restored step %d from shm snapshots whose persist never finished "
            "(no crc32 to verify against)",
            choice.step,
        )
    return RestoredPart(
        choice.step,
        choice.source,
        choice.location,
        choice.job_id,
        num_ps,
        ps_index,
        p_old,
        choice.total_rows,
        choice.dim,
        choice.table_sizes,
        dest["weights"],
        dest["accum"],
        dest.get("dense"),
        dest.get("dense_accum"),
        dict(choice.extra),
        verified,
    )


def load_checkpoint(
    root: PathLike | None,
    *,
    num_ps: int,
    ps_index: int,
    job_id: str | None = None,
    shm_dir: PathLike | None = None,
    choice: CheckpointChoice | None = None,
    out: Mapping[str, ArrayLike] | None = None,
) -> RestoredPart | None:
    """Restore PS ``ps_index`` of ``num_ps`` from the best checkpoint.

    Without ``choice``: candidates are the committed checkpoints under ``root`` and, if
    ``job_id`` is given, the complete shm snapshot sets in ``shm_dir``; newest step first, shm
    first on a tie. Every part of a candidate is verified, not just the ones this PS reads, so
    that every PS independently settles on the same step; a candidate that fails is logged
    (naming the file) and the next older one tried. With ``choice`` (from
    :func:`select_checkpoint`): only the parts this PS needs are read, verified as they stream.

    ``out`` maps array names to preallocated destinations (the PS's freshly built tables): the
    restore writes into them instead of allocating. Returns None when there is no checkpoint at
    all; raises :class:`CheckpointError` when there are checkpoints and none is usable.
    """
    if num_ps < 1 or not 0 <= ps_index < num_ps:
        raise UserInputError(f"cannot restore PS {ps_index} of {num_ps}")
    if choice is not None:
        return _restore(choice, num_ps, ps_index, out, verify_all=False)
    choices, broken = _candidates(root, job_id, shm_dir)
    for candidate in choices:
        try:
            return _restore(candidate, num_ps, ps_index, out, verify_all=True)
        except CheckpointCorruptError as exc:
            logger.warning("%s; trying an older checkpoint", exc)
    if choices or broken:
        raise CheckpointError(f"{root}: no checkpoint verifies ({len(choices) + broken} tried)")
    return None


# --------------------------------------------------------------------------------------------
# The PS server's view
# --------------------------------------------------------------------------------------------


class PsCheckpointer:
    """A PS server's flash checkpointing of its :class:`PsState`, one snapshot at a time.

    ``snapshot`` runs on the serving thread between two requests and returns the seconds it
    blocked; the persist runs in the background and ``status`` reports it, with the
    :class:`PartRecord` (as a dict) that the master passes to :func:`commit`.
    """

    def __init__(
        self,
        root: PathLike,
        job_id: str,
        ps_index: int,
        state: PsState,
        *,
        shm_dir: PathLike | None = None,
        generation: int | None = None,
        copy_threads: int = 1,
    ) -> None:
        cfg = state.config
        self.meta = PartMeta(
            job_id,
            cfg.num_ps,
            ps_index,
            sum(cfg.model.table_sizes),
            cfg.model.embedding_dim,
            tuple(cfg.model.table_sizes),
        )
        self.flash = FlashCheckpointer(
            root,
            self.meta,
            StateSpec.of(state.arrays()),
            shm_dir=shm_dir,
            generation=generation,
            copy_threads=copy_threads,
        )
        self._future: Future[PartRecord] | None = None
        self._step: int | None = None
        self._discarded = False

    @property
    def busy(self) -> bool:
        """The previous snapshot is still being persisted: a snapshot now would wait for it."""
        return self.flash.busy

    def snapshot(self, step: int, state: PsState, extra: Mapping[str, Any] | None = None) -> float:
        """Copy ``state`` into shared memory (blocking), persist it in the background.

        Blocks longer if the previous persist is still running (see ``busy``): the master
        should not ask for a checkpoint before the previous one's ``status`` says done.
        """
        stats, future = self.flash.save(step, state.arrays(), extra=extra)
        self._future, self._step = future, step
        if not self._discarded:
            self.flash.shm.discard_older()
            self._discarded = True
        return stats.blocked_s

    def status(self) -> dict[str, Any]:
        """``{"step", "done", "part", "error"}`` of the latest snapshot's persist."""
        future = self._future
        if future is None or not future.done():
            return {"step": self._step, "done": False, "part": None, "error": None}
        error = future.exception()
        if error is not None:
            return {
                "step": self._step,
                "done": True,
                "part": None,
                "error": f"{type(error).__name__}: {error}",
            }
        return {"step": self._step, "done": True, "part": future.result().to_dict(), "error": None}

    def close(self) -> None:
        """Finish the pending persist and unmap; the shm file stays for a restart."""
        self.flash.close()


def restore_ps_state(
    root: PathLike, config: PsConfig, job_id: str, *, shm_dir: PathLike | None = None
) -> PsState | None:
    """The state PS ``config.ps_index`` of ``config.num_ps`` restores, or None (no checkpoint).

    Shared memory first when it is as new as the newest committed checkpoint; rows are
    re-partitioned when the job had a different number of PS.
    """
    from dlrover_kfp.training.ps_state import PsState  # noqa: PLC0415 (ps_state imports torch models)

    restored = load_checkpoint(
        root, num_ps=config.num_ps, ps_index=config.ps_index, job_id=job_id, shm_dir=shm_dir
    )
    if restored is None:
        return None
    rows, dim = sum(config.model.table_sizes), config.model.embedding_dim
    if (restored.total_rows, restored.dim) != (rows, dim):
        raise CheckpointError(
            f"{restored.location}: checkpoint of {restored.total_rows} rows x "
            f"{restored.dim}, the model has {rows} x {dim}"
        )
    if config.ps_index == 0 and (restored.dense is None or restored.dense_accum is None):
        raise CheckpointError(f"{restored.location}: no dense parameters for PS 0")
    logger.info(
        "PS %d: restored step %d from %s (%s, written by %d PS)",
        config.ps_index,
        restored.step,
        restored.location,
        restored.source,
        restored.from_num_ps,
    )

    def tensor(a: AnyArray | None) -> torch.Tensor | None:
        return None if a is None else torch.from_numpy(a)

    return PsState(
        config,
        weights=torch.from_numpy(restored.weights),
        accum=torch.from_numpy(restored.accum),
        dense=tensor(restored.dense),
        dense_accum=tensor(restored.dense_accum),
    )
