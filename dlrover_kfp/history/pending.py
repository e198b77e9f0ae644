"""Profiles waiting for their history store: kept on disk when the store is locked or down.

A run that ends while its history store cannot be written (SQLite locked by a long writer,
PostgreSQL restarting or unreachable, the history's disk full) must not lose its profile: the
profile is what makes tomorrow's run start near its optimum. :func:`record_or_keep` records
it, or, on a *transient* store error (:class:`~dlrover_kfp.errors.HistoryUnavailableError`) or
a full disk (:class:`~dlrover_kfp.errors.HistoryDiskFullError`), writes it to the store's
pending directory with an event that says why (on a full disk from the run's reserved space,
:mod:`dlrover_kfp.runtime.reserve`). The next successful record into the same store records
what is pending after its own profile (:func:`record_pending`, safe from many processes at
once), and ``dlrover-kfp record --pending`` does it on demand. A run keeps its profile here
*before* it records it (the hand-off: :func:`~dlrover_kfp.runtime.launch.record_run`), so
that a run killed while recording leaves it pending, not lost. A permanent error (a bad URL,
a damaged schema) is raised: waiting would not fix it.

Where: ``$DLROVER_KFP_PENDING_DIR`` or ``pending/`` in the user's data directory, then one
directory per store, named by a hash of its resolved URL (a relative SQLite path made
absolute: the same file from any working directory) *with the password hidden* (the password
never reaches the disk; a store reached with another password is the same store). In a pipeline pod
the data directory goes with the pod: point ``DLROVER_KFP_PENDING_DIR`` at a volume that stays.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from dlrover_kfp.core.documents import to_json
from dlrover_kfp.core.profile import JobEvent, JobProfile
from dlrover_kfp.errors import HistoryDiskFullError, HistoryUnavailableError, UserInputError
from dlrover_kfp.files import read_document, write_atomic
from dlrover_kfp.history import record_profile, resolve_history_url
from dlrover_kfp.history.engine import mask_url_text

log = logging.getLogger(__name__)

#: Overrides where pending profiles are kept.
PENDING_ENV_VAR = "DLROVER_KFP_PENDING_DIR"


def pending_root(environ: Mapping[str, str] = os.environ) -> Path:
    """``$DLROVER_KFP_PENDING_DIR``, else ``pending`` in the user's data directory."""
    configured = environ.get(PENDING_ENV_VAR, "").strip()
    if configured:
        return Path(configured)
    return Path(platformdirs.user_data_dir("dlrover-kfp")) / "pending"


def pending_dir(url: str, environ: Mapping[str, str] = os.environ) -> Path:
    """The directory of ``url``'s pending profiles: sha256 of the URL without its password
    and its options (a SQLite busy timeout, say, does not make another store), 16 hex. A
    plain path counts as its ``sqlite:///`` URL, as everywhere a history URL is taken."""
    url = resolve_history_url(url, {})
    key = hashlib.sha256(mask_url_text(url).split("?", 1)[0].encode()).hexdigest()[:16]
    return pending_root(environ) / key


@dataclass(frozen=True, slots=True)
class RecordOutcome:
    """What became of a profile: recorded (``new`` False when the store already had it), or
    kept on disk at ``kept`` because the store was unavailable."""

    run_id: str
    recorded: bool
    new: bool = False
    kept: Path | None = None
    #: pending profiles of earlier runs recorded before this one
    drained: tuple[str, ...] = ()


def keep_pending(
    url: str,
    profile: JobProfile,
    environ: Mapping[str, str] = os.environ,
    *,
    reserve: Path | None = None,
) -> Path:
    """Write ``profile`` to ``url``'s pending directory (atomically; one file per run id),
    from the space ``reserve`` holds back if the disk is full."""
    path = pending_dir(url, environ) / f"{_safe_name(profile.run_id)}.json"
    write_atomic(path, to_json(profile) + "\n", reserve=reserve)
    return path


#: A claim older than this is a drain that died holding it (a drain records one profile in
#: well under a second; a PostgreSQL answer is bounded by its statement timeout, 60 s): the
#: profile is claimed again.
STALE_CLAIM_S = 600.0

#: Where a pending file that cannot be read goes, inside its store's pending directory.
QUARANTINE_DIR = "unreadable"

_CLAIM = ".claim-"


def discard_pending(url: str, run_id: str, environ: Mapping[str, str] = os.environ) -> None:
    """Remove ``run_id``'s own pending copy once the store holds it."""
    (pending_dir(url, environ) / f"{_safe_name(run_id)}.json").unlink(missing_ok=True)


def record_pending(url: str, environ: Mapping[str, str] = os.environ) -> list[tuple[str, bool]]:
    """Record every pending profile of ``url`` (oldest file first) and delete each once it is
    in the store; (run id, new) for each.

    Safe to run from many processes at once: each file is claimed before it is read, by an
    atomic rename to a name of this drain's own (``.NAME.json.claim-<token>``); a file another
    drain renamed first is left to it, so every profile is recorded by one drain (and a second
    record of one run id would change nothing anyway: the store replaces by run id). A claim
    left by a drain that died (older than :data:`STALE_CLAIM_S`) is taken over. A file that
    cannot be read is moved to ``unreadable/`` with a warning naming it, and the others go on.
    A store error puts the claimed file back and is raised, with the rest still kept."""
    directory = pending_dir(url, environ)
    if not directory.is_dir():
        return []
    done = []
    for path in _candidates(directory):
        claimed = directory / f".{_original(path.name)}{_CLAIM}{secrets.token_hex(6)}"
        try:
            os.rename(path, claimed)
            # A claim's age is its drain's: a stale claim taken over would otherwise still look
            # stale (a rename keeps the file's mtime) and be taken again while recorded.
            os.utime(claimed)
        except FileNotFoundError:
            continue  # another drain claimed it first
        try:
            profile = read_document(JobProfile, claimed)
        except UserInputError as exc:
            _quarantine(directory, claimed, _original(path.name), exc)
            continue
        try:
            new = record_profile(url, profile)
        except BaseException:
            with contextlib.suppress(OSError):
                os.rename(claimed, directory / _original(path.name))
            raise
        claimed.unlink(missing_ok=True)
        done.append((profile.run_id, new))
        log.info("history: recorded the pending profile of %s", profile.run_id)
    return done


def _candidates(directory: Path) -> list[Path]:
    """The pending files, oldest first, with the stale claims of drains that died."""
    now = time.time()
    found = []
    for path in directory.iterdir():
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:
            continue
        pending = path.name.endswith(".json") and not path.name.startswith(".")
        if pending or (_CLAIM in path.name and now - mtime > STALE_CLAIM_S):
            found.append((mtime, path.name, path))
    return [path for _, _, path in sorted(found)]


def _original(name: str) -> str:
    """``NAME.json`` of a pending file or of a claim on it."""
    return name[1:].split(_CLAIM, 1)[0] if _CLAIM in name else name


def _quarantine(directory: Path, claimed: Path, name: str, exc: Exception) -> None:
    target = directory / QUARANTINE_DIR / name
    try:
        target.parent.mkdir(exist_ok=True)
        os.rename(claimed, target)
    except OSError:
        target = claimed
    log.warning(
        "history: a pending profile cannot be read and is set aside in %s (%s); fix or remove "
        "it, then run `dlrover-kfp record --pending`",
        target,
        exc,
    )


def record_or_keep(
    url: str,
    profile: JobProfile,
    environ: Mapping[str, str] = os.environ,
    *,
    reserve: Path | None = None,
) -> RecordOutcome:
    """Record ``profile``, then the pending ones of the same store; or keep it on disk with an
    event that says why when the store is unavailable or its disk full (see the module
    docstring); ``reserve``: the run's reserved space (:func:`keep_pending`).

    The run's own profile goes first: what earlier runs left (a file another drain holds, one
    that cannot be read, a store that fails half-way) can delay them, never this one. A
    failure while draining them is logged and leaves them pending; it is not this run's. A
    copy of this profile kept before (:func:`keep_pending`, the run's hand-off) is removed
    once the store holds it; on a permanent store error it stays, and the error says where."""
    try:
        new = record_profile(url, profile)
    except (HistoryUnavailableError, HistoryDiskFullError) as exc:
        where = pending_dir(url, environ)
        then = (
            "free space on its disk, then run `dlrover-kfp record --pending`"
            if isinstance(exc, HistoryDiskFullError)
            else "it is recorded by the next run into this history or by "
            "`dlrover-kfp record --pending`"
        )
        event = JobEvent(
            time=profile.outcome.jct_seconds,
            kind="failure",
            detail=f"history unavailable at record time ({exc}); the profile is kept in {where}: "
            f"{then}",
        )
        kept = keep_pending(
            url,
            dataclasses.replace(profile, events=(*profile.events, event)),
            environ,
            reserve=reserve,
        )
        log.warning("history unavailable: the profile of %s is kept in %s", profile.run_id, kept)
        return RecordOutcome(profile.run_id, recorded=False, kept=kept)
    discard_pending(url, profile.run_id, environ)
    try:
        drained = tuple(run_id for run_id, _ in record_pending(url, environ))
    except Exception as exc:  # earlier runs' profiles wait; this run's is recorded
        log.warning(
            "history: the pending profiles of earlier runs stay in %s (%s); they are recorded "
            "by the next run or by `dlrover-kfp record --pending`",
            pending_dir(url, environ),
            exc,
        )
        drained = ()
    return RecordOutcome(profile.run_id, recorded=True, new=new, drained=drained)


def _safe_name(run_id: str) -> str:
    """A run id as a file name: run ids are ``[A-Za-z0-9._:-]`` by contract; refuse others."""
    if (
        not run_id
        or any(not (c.isascii() and (c.isalnum() or c in "._:-")) for c in run_id)
        or run_id[0] == "."
    ):
        raise UserInputError(f"run_id {run_id!r} cannot name a pending profile file")
    return run_id


__all__ = [
    "PENDING_ENV_VAR",
    "QUARANTINE_DIR",
    "STALE_CLAIM_S",
    "RecordOutcome",
    "discard_pending",
    "keep_pending",
    "pending_dir",
    "pending_root",
    "record_or_keep",
    "record_pending",
]
