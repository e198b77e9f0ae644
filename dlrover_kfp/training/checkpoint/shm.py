"""The shared-memory snapshot buffer of a PS, and the naming and cleanup of its files.

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
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import logging
import mmap
import os
import re
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import numpy as np

from dlrover_kfp.core.pod_env import POD_SHM_ENV
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.files import memory_dir
from dlrover_kfp.training import memory
from dlrover_kfp.training.checkpoint.format import (
    ARRAY_ALIGN,
    DATA_START,
    FORMAT_VERSION,
    HEADER_SIZE,
    PAGE,
    PART_FORMAT,
    STATE_COMPLETE,
    STATE_WRITING,
    AnyArray,
    ArrayDesc,
    ArraySpec,
    CheckpointBusyError,
    CheckpointError,
    PartMeta,
    PathLike,
    StateSpec,
    _align,
    _as_numpy,
    _Header,
    _layout,
)
from dlrover_kfp.training.checkpoint.reader import SnapshotInfo, read_snapshot

if TYPE_CHECKING:
    from dlrover_kfp.training.checkpoint.format import ArrayLike

logger = logging.getLogger(__name__)

GROWTH = 1.25  # a buffer that must grow gets this much headroom, so that the next growth is rare
_SPLIT_MIN = 32 << 20  # arrays this big are split over the copy threads

SHM_ENV = POD_SHM_ENV
_SHM_PREFIX = "dlrover-kfp"
_SHM_REST = re.compile(r"g(\d+)\.(ps-\d+)\.snap")
_SHM_ANY = re.compile(r"g\d+\.ps-\d+\.snap(?:\.\d+\.tmp)?")


def default_shm_dir() -> Path:
    """``$DLROVER_KFP_SHM_DIR``, else ``/dev/shm`` (tmpfs), else the temp dir (slower: disk)."""
    env = os.environ.get(SHM_ENV)
    return Path(env) if env else memory_dir()


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


def discard_part(job_id: str, ps_index: int, shm_dir: PathLike | None = None) -> list[Path]:
    """Remove every snapshot file of PS ``ps_index``'s part of ``job_id`` (any generation);
    returns what was removed. A PS restarted inside its pod calls it once it has restored:
    the snapshot its previous process left would otherwise stay beside the one the new
    process allocates, and a pod's shared memory counts in its memory limit."""
    prefix = _shm_prefix(job_id)
    removed = []
    for path in list_shm(job_id, shm_dir):
        m = _SHM_REST.fullmatch(path.name[len(prefix) :])
        if m is not None and m.group(2) == f"ps-{int(ps_index)}":
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


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
