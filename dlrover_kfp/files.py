"""Reading and writing the package's documents on disk, with errors that name the file.

Writes are atomic (a temporary file in the same directory, fsync, rename) so that a crash or a
full disk never leaves half a plan or half a model behind.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

from dlrover_kfp.core.documents import load_text, parse
from dlrover_kfp.errors import UserInputError

T = TypeVar("T")


def memory_dir() -> Path:
    """Where files that should live in memory go: ``/dev/shm`` (tmpfs: pages counted in the
    writer's cgroup) where this process may write it, else the temp dir (disk: slower)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm
    return Path(tempfile.gettempdir())


def read_text(path: str | os.PathLike[str]) -> str:
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserInputError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise UserInputError(f"{p}: is a directory, expected a file") from None
    except UnicodeDecodeError:
        raise UserInputError(f"{p}: not UTF-8 text") from None
    except OSError as exc:
        raise UserInputError(f"{p}: cannot read: {exc.strerror}") from None


def read_document(cls: type[T], path: str | os.PathLike[str]) -> T:
    """Read a YAML or JSON file and validate it as ``cls``."""
    source = str(path)
    return parse(cls, load_text(read_text(path), source), source)


def write_atomic(
    path: str | os.PathLike[str], text: str, *, reserve: str | os.PathLike[str] | None = None
) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never half.

    ``reserve``: a file that holds disk space back for this write (:func:`reserve_space`).
    When the disk is full, the reserve gives up as much as the write needs and it is tried
    again, so what must be written (a failed run's profile) still fits.
    """
    target = Path(path)
    try:
        _write_once(target, text)
    except OSError as exc:
        if reserve is None or exc.errno not in _DISK_FULL or not release_space(reserve, text):
            raise UserInputError(f"{target}: cannot write: {exc.strerror}") from None
    else:
        return
    try:
        _write_once(target, text)
    except OSError as exc:
        raise UserInputError(f"{target}: cannot write: {exc.strerror}") from None


#: The mode of every file the package publishes (documents, models): readable by others,
#: like any new file under the usual umask. ``mkstemp`` creates 0600, which a serving process
#: under another uid cannot read.
PUBLISHED_MODE = 0o644


def readable_temp(directory: Path, name: str) -> Path:
    """A new empty file in ``directory`` named after ``name`` (``.NAME.xxxx``), with the mode of
    a published file: to write, then rename over ``name``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
    try:
        os.fchmod(fd, PUBLISHED_MODE)
    finally:
        os.close(fd)
    return Path(tmp)


def _write_once(target: Path, text: str) -> None:
    directory = target.parent if str(target.parent) else Path(".")
    directory.mkdir(parents=True, exist_ok=True)
    tmp = readable_temp(directory, target.name)
    try:
        with tmp.open("w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


#: The errors of a write that found no space: the disk, or the user's quota on it.
_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})

#: What a write takes besides its bytes: the temporary file's inode, a directory block, the
#: rounding of its last block (4 KiB on ext4, xfs and tmpfs); 64 KiB covers them with margin.
_WRITE_SLACK_BYTES = 64 << 10


def reserve_space(path: str | os.PathLike[str], nbytes: int) -> bool:
    """Make the file ``path`` hold at least ``nbytes`` of disk space (allocated, not sparse),
    for a later write that must succeed on a full disk (``write_atomic(..., reserve=path)``).
    False when the disk has not that much space left (the file keeps what it had)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    except OSError:
        return False
    try:
        if os.fstat(fd).st_size < nbytes:
            os.posix_fallocate(fd, 0, nbytes)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def release_space(reserve: str | os.PathLike[str], text: str) -> bool:
    """Give up as much of ``reserve`` as writing ``text`` needs (all of it when it holds less);
    False when there was nothing to give up."""
    path = Path(reserve)
    try:
        held = path.stat().st_size
        if held == 0:
            return False
        needed = len(text.encode("utf-8")) + _WRITE_SLACK_BYTES
        if needed >= held:
            path.unlink()
        else:
            os.truncate(path, held - needed)
    except OSError:
        return False
    return True


def iter_json_lines(path: str | os.PathLike[str]) -> Iterator[tuple[str, int, object]]:
    """``(where, line number, value)`` for every non-blank line of a JSON Lines file.

    ``where`` is ``<file>:<line>``, for the caller's own validation messages. A missing or
    unreadable file, a line that is not UTF-8 and a line that is not JSON are
    :class:`UserInputError` naming the file (and line).
    """
    source = Path(path)
    try:
        handle = source.open("rb")
    except FileNotFoundError:
        raise UserInputError(f"{source}: no such file") from None
    except IsADirectoryError:
        raise UserInputError(f"{source}: is a directory, expected a file") from None
    except OSError as exc:
        raise UserInputError(f"{source}: cannot read: {exc.strerror}") from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            where = f"{source}:{number}"
            try:
                text = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                raise UserInputError(f"{where}: not UTF-8 text") from None
            if not text:
                continue
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                raise UserInputError(
                    f"{where}: malformed JSON: {exc.msg} (column {exc.colno})"
                ) from None
            except ValueError as exc:
                # An integer of more digits than int() takes (4300): not a JSONDecodeError.
                problem = str(exc).split(";", 1)[0]
                raise UserInputError(f"{where}: malformed JSON: {problem}") from None
            except RecursionError:
                raise UserInputError(f"{where}: malformed JSON: nested too deeply") from None
            yield where, number, value
