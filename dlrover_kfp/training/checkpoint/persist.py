"""Persisting snapshots to disk in the background, and committing a step's parts.

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
* A checkpoint that fails leaves nothing behind: a PS removes the part it could not write, a
  commit that fails removes its ``step-N.tmp`` and so does the coordinator when a PS failed
  (:func:`discard_unfinished`). On a full disk those bytes are what the run's profile needs.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import zlib
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlrover_kfp.errors import UserInputError
from dlrover_kfp.training.checkpoint.format import (
    CHECKSUM_KEY,
    CHUNK,
    FORMAT_VERSION,
    HEADER_SIZE,
    MANIFEST,
    MANIFEST_FORMAT,
    STATE_COMPLETE,
    ArrayDesc,
    CheckpointError,
    CheckpointWriteError,
    PartMeta,
    PathLike,
    StateSpec,
    _Header,
    manifest_checksum,
)
from dlrover_kfp.training.checkpoint.shm import ShmSnapshot, SnapshotStats, _Current

if TYPE_CHECKING:
    from dlrover_kfp.training.checkpoint.format import ArrayLike

logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"step-(\d{10})")
_TMP_DIR = re.compile(r"step-(\d{10})\.tmp")
_DELETING = re.compile(r"step-\d{10}\.deleting")


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
    # Every view is released on the way out, a failed write's too: the exception's traceback
    # keeps this frame, and a view of the snapshot's mmap left in it would make the mmap
    # impossible to close ("cannot close exported pointers exist").
    with memoryview(data) as whole:
        done = 0
        while done < whole.nbytes:
            with whole[done:] as rest:
                done += os.pwrite(fd, rest, offset + done)


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
        fd = _create_part(step_dir, path)
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
        # Half a part is useless, and on a full disk its bytes are the space the job's profile
        # and the next checkpoint need: it goes (the coordinator removes the step's directory).
        _remove_partial(path)
        raise CheckpointWriteError(f"{path}: cannot write checkpoint part: {exc.strerror}") from exc
    shm._set_crc(cur.seq, crc)
    return PartRecord(shm.meta, cur.step, cur.seq, path.name, cur.total_len, crc, cur.arrays)


def _create_part(step_dir: Path, path: Path) -> int:
    """Create ``path`` in ``step_dir``, making the directory. A PS whose own part failed removes
    the step's directory when it finds it empty (:func:`_remove_partial`); when that falls
    between this one's ``mkdir`` and ``open``, the open fails with "No such file or directory"
    instead of this part's own outcome (on a full disk: "No space left on device"). The
    directory is made again then; once the file exists the directory is not empty, and no
    other PS removes it. The same removal can fall inside ``mkdir(exist_ok=True)`` itself,
    between its EEXIST and its check that the path is a directory, which then raises "File
    exists" (seen once in a CI run): that too is tried again."""
    attempts = 3
    while True:
        try:
            step_dir.mkdir(parents=True, exist_ok=True)
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except (FileNotFoundError, FileExistsError):
            attempts -= 1
            if not attempts:
                raise


def _remove_partial(path: Path) -> None:
    """Remove a part file that failed, and its step directory once nothing else is in it."""
    try:
        path.unlink(missing_ok=True)
        path.parent.rmdir()
    except OSError:
        pass  # another PS's part is there (the coordinator removes the directory), or gone


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


def discard_unfinished(root: PathLike, step: int) -> bool:
    """Remove ``step``'s unfinished ``step-N.tmp`` (a checkpoint that failed: a PS could not
    write its part, or the commit could not). Its parts are never restored from, and on a full
    disk they hold the space that the run's profile needs. True if there was one."""
    tmp = Path(root) / _tmp_name(step)
    existed = tmp.exists()
    shutil.rmtree(tmp, ignore_errors=True)
    return existed


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
        manifest[CHECKSUM_KEY] = manifest_checksum(manifest)
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
        if not final.exists():
            discard_unfinished(base, step)
        raise CheckpointWriteError(f"{final}: cannot commit: {exc.strerror}") from exc
    logger.info("committed %s (%d parts)", final, len(records))
    prune_checkpoints(base, keep)
    return final
