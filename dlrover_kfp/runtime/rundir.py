"""A run's output directory: one live master at a time, and the inputs its run is bound to.

Two ordinary user actions used to give wrong results reported as success:

* **Two runs into one directory.** A second ``dlrover-kfp run`` "resumed" the live run, both
  wrote checkpoints of the same steps, and each exported the other's model. A run now holds an
  exclusive lock on its directory for its whole life (:class:`OutputDirLock`): ``flock(2)`` on a
  file in it. The kernel drops the lock with the last descriptor, so a master that is SIGKILLed
  never leaves a stale lock behind (a lock *file* that stays is harmless: only the lock counts).
  Python opens files close-on-exec, so the pods a master starts do not inherit the lock.
* **Resuming after editing the spec.** ``run.json`` was matched on the job's name only, and the
  old shard ledger was restored onto a new dataset. The run file now records the run's inputs
  (:func:`run_inputs`): everything that decides which rows are trained and held out and what is
  trained. A resume whose inputs differ is refused, naming each changed field
  (:func:`changed_inputs`); ``--fresh`` archives the old run (:func:`archive_run`) instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dlrover_kfp.core.documents import to_dict
from dlrover_kfp.core.spec import JobSpec, SyntheticData
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.runtime.leftovers import reap_leftovers
from dlrover_kfp.runtime.reserve import RESERVE_FILE
from dlrover_kfp.runtime.runfile import unfinished_run_id
from dlrover_kfp.training.data import Dataset
from dlrover_kfp.training.storage import current, display

log = logging.getLogger(__name__)

#: The lock file in an output directory; it holds the live master's pid, host and start time
#: (for the message a second run gets), but only the ``flock`` on it is the lock.
LOCK_FILE = ".dlrover-kfp.lock"

#: Where ``--fresh`` moves an earlier run's files: ``DIR/archive/<its run id>/``.
ARCHIVE_DIR = "archive"


class OutputDirBusyError(UserInputError):
    """Another live master holds the output directory. Not retried: the holder may run for
    hours; the user chooses to wait, or another directory."""


class RunInputsChangedError(UserInputError):
    """A run left unfinished in the directory was started with other inputs than these."""


def prepare_output_dir(output_dir: Path) -> Path:
    """``output_dir``, created if missing, absolute; a path that is a file, or that cannot be
    created, is a one-line :class:`UserInputError` naming it."""
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UserInputError(f"--output-dir {output_dir}: is a file, not a directory") from None
    except NotADirectoryError:
        raise UserInputError(
            f"--output-dir {output_dir}: a parent of it is a file, not a directory"
        ) from None
    except OSError as exc:
        raise UserInputError(
            f"--output-dir {output_dir}: cannot create it: {exc.strerror}"
        ) from None
    if not os.access(output_dir, os.W_OK | os.X_OK):
        raise UserInputError(f"--output-dir {output_dir}: not writable")
    return output_dir.absolute()


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a directory's lock (written into the lock file by the holder)."""

    pid: int | None
    host: str
    started: str

    def describe(self) -> str:
        pid = "pid unknown" if self.pid is None else f"pid {self.pid}"
        return f"{pid} on {self.host or 'an unknown host'}, started {self.started or '?'}"


def _read_holder(fd: int) -> Holder:
    try:
        raw = os.pread(fd, 4096, 0)
        data = json.loads(raw.decode("utf-8")) if raw else {}
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    pid = data.get("pid")
    return Holder(
        pid=pid if isinstance(pid, int) else None,
        host=str(data.get("host", "")),
        started=str(data.get("started", "")),
    )


class OutputDirLock:
    """An exclusive lock on a run's output directory, held from :meth:`acquire` to
    :meth:`release` (a context manager). A second holder is refused at once
    (:class:`OutputDirBusyError`, naming the first one's pid, host and start time)."""

    def __init__(self, output_dir: Path) -> None:
        self.output_dir = output_dir
        self.path = output_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> OutputDirLock:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise UserInputError(
                f"{self.path}: cannot open the lock file: {exc.strerror}"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise OutputDirBusyError(
                f"--output-dir {self.output_dir}: in use by another run ({holder.describe()}); "
                "wait for it to end, or choose another --output-dir"
            ) from None
        except OSError as exc:
            os.close(fd)
            raise UserInputError(f"{self.path}: cannot lock: {exc.strerror}") from None
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        # Best effort: the lock holds whether or not its description could be written.
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        # The file stays: unlinking it would let a third run lock a new inode while a second
        # one still waits on the old.
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None

    def __enter__(self) -> OutputDirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


# -- the inputs a run is bound to ------------------------------------------------------------


def run_inputs(
    spec: JobSpec, dataset: Dataset, *, shard_rows: int, eval_fraction: float
) -> dict[str, Any]:
    """What decides which rows a run trains and holds out, and what it trains, as flat
    ``field -> JSON value`` pairs (the field names are the spec's keys, so a refusal names the
    key the user edited). Data files are identified by path, size and modification time: a
    file rewritten in place (same name, other rows) is a different input."""
    out: dict[str, Any] = {"name": spec.name}
    if isinstance(spec.data, SyntheticData):
        out |= {
            "data.format": "synthetic",
            "data.rows": spec.data.rows,
            "data.seed": spec.data.seed,
        }
    else:
        out["data.format"] = spec.data.format
        # How the rows are read: the path or glob as written, the column mapping (which column
        # is the label, which the dense and categorical features) and whether the files have a
        # header. A resume with the label mapped to another column trained the rest of the run
        # on another target. ``data.rows`` is a planning hint and reads nothing.
        out |= _flat("data", {k: v for k, v in to_dict(spec.data).items() if k != "rows"})
        out |= data_files(dataset)
    out |= {"held_out.eval_fraction": eval_fraction, "held_out.shard_rows": shard_rows}
    out |= {f"model.{k}": v for k, v in to_dict(spec.model).items()}
    training = spec.training
    out |= {
        "training.batch_size": training.batch_size,
        "training.epochs": training.epochs,
        "training.learning_rate": training.learning_rate,
    }
    return out


def _flat(prefix: str, value: Any) -> dict[str, Any]:
    """``{"a": {"b": 1}}`` as ``{"prefix.a.b": 1}``: the spec's keys, as a refusal names them."""
    if not isinstance(value, dict):
        return {prefix: value}
    out: dict[str, Any] = {}
    for key, item in value.items():
        out |= _flat(f"{prefix}.{key}", item)
    return out


def data_files(dataset: Dataset, *, now: bool = False) -> dict[str, str]:
    """``data.file[URL] -> "N bytes, modified T"`` (a local file) or ``"N bytes, version V"``
    (an object: its ETag or generation) for each file of a file dataset, as listed when the
    dataset was opened, or with ``now`` as the store holds it now (``"missing"`` when gone)
    ({} for generated data)."""
    out = {}
    for listed in getattr(dataset, "files", None) or ():
        f = current(listed) if now else listed
        if f is None:
            out[f"data.file[{display(listed.url)}]"] = "missing"
            continue
        if "://" in f.url:
            out[f"data.file[{display(f.url)}]"] = f"{f.size} bytes, version {f.version}"
            continue
        stamp = datetime.fromtimestamp(int(f.version) / 1e9, UTC).isoformat(timespec="microseconds")
        out[f"data.file[{f.url}]"] = f"{f.size} bytes, modified {stamp}"
    return out


def changed_inputs(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """One line per field whose value differs: ``field: old -> new`` (``(none)`` for a field
    only one side has), in the order of ``new`` then the fields only ``old`` has."""
    lines = []
    for key in [*new, *(k for k in old if k not in new)]:
        before, after = old.get(key, _NONE), new.get(key, _NONE)
        if before != after:
            lines.append(f"{key}: {_show(before)} -> {_show(after)}")
    return lines


_NONE = object()


def _show(value: Any) -> str:
    if value is _NONE:
        return "(none)"
    return json.dumps(value) if not isinstance(value, str) else value


def refuse_changed(run_file: Path, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """Raise :class:`RunInputsChangedError` when a run left unfinished in ``run_file``'s
    directory was started with other inputs than ``new``."""
    changes = changed_inputs(old, new)
    if changes:
        raise RunInputsChangedError(
            f"{run_file}: an unfinished run of other inputs is in this directory; resuming it "
            f"would train a mix of both ({'; '.join(changes)}). To start afresh run again with "
            "--fresh (the old run moves to "
            f"{run_file.parent / ARCHIVE_DIR}/<its run id>/), or choose another --output-dir"
        )


def archive_run(output_dir: Path, label: str | None = None) -> Path | None:
    """Move what an earlier run left in ``output_dir`` (run file, checkpoints, profile, model,
    logs) to ``output_dir/archive/<label>/`` and return that directory (None: nothing to move).
    The caller holds the directory's lock. Nothing is deleted: the user removes archives."""
    # The lock is the caller's; the profile's reserved space is no record, and the new run
    # reserves its own (runtime/reserve.py).
    (output_dir / RESERVE_FILE).unlink(missing_ok=True)
    entries = [p for p in output_dir.iterdir() if p.name not in (LOCK_FILE, ARCHIVE_DIR)]
    if not entries:
        return None
    label = label or time.strftime("run-%Y%m%dT%H%M%S", time.gmtime())
    target = output_dir / ARCHIVE_DIR / label
    suffix = 1
    while target.exists():
        suffix += 1
        target = output_dir / ARCHIVE_DIR / f"{label}.{suffix}"
    try:
        target.mkdir(parents=True)
        for entry in entries:
            entry.rename(target / entry.name)
    except OSError as exc:
        raise UserInputError(
            f"--fresh: cannot archive {output_dir} into {target}: {exc.strerror}"
        ) from None
    return target


@contextlib.contextmanager
def hold_output_dir(
    output_dir: Path, *, fresh: bool = False, progress: Callable[[str], None] | None = None
) -> Iterator[Path]:
    """The output directory, created, locked for the caller's whole ``with`` block, cleared of
    what an earlier master killed with SIGKILL left running (its pods, cgroups and shared
    memory: :func:`~dlrover_kfp.runtime.leftovers.reap_leftovers`; its run file and
    checkpoints stay, to resume from) and, with ``fresh``, emptied of an earlier run
    (archived). Yields its absolute path."""
    output_dir = prepare_output_dir(output_dir)
    with OutputDirLock(output_dir):
        # Before archiving: the reaper reads the earlier run's logs/ and run file.
        found = reap_leftovers(output_dir)
        if found:
            (progress or log.warning)(found.summary())
        if fresh:
            label = earlier_run_id(output_dir)
            archive_run(output_dir, label)
        yield output_dir


def earlier_run_id(output_dir: Path) -> str | None:
    """The run id an earlier run left in the directory (its run file, else its profile): what
    ``--fresh`` archives it under, and the id a retried pipeline step keeps."""
    run_id = unfinished_run_id(output_dir)
    if run_id is None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            run_id = json.loads((output_dir / "profile.json").read_text()).get("run_id")
    return run_id if isinstance(run_id, str) and run_id and "/" not in run_id else None


__all__ = [
    "ARCHIVE_DIR",
    "LOCK_FILE",
    "OutputDirBusyError",
    "OutputDirLock",
    "RunInputsChangedError",
    "archive_run",
    "changed_inputs",
    "data_files",
    "earlier_run_id",
    "hold_output_dir",
    "prepare_output_dir",
    "refuse_changed",
    "run_inputs",
]
