"""Profiles waiting for their history store: kept on disk when the store is locked or down.

A run that ends while its history store cannot be written (SQLite locked by a long writer,
PostgreSQL restarting or unreachable, the history's disk full) must not lose its profile: the
profile is what makes tomorrow's run start near its optimum. :func:`record_or_keep` records
it, or, on a *transient* store error (:class:`~dlrover_kfp.errors.HistoryUnavailableError`) or
a full disk (:class:`~dlrover_kfp.errors.HistoryDiskFullError`), writes it to the store's
pending directory with an event that says why (on a full disk from the run's reserved space,
:mod:`dlrover_kfp.runtime.reserve`). The next successful record into the same store
records what is pending first (:func:`record_pending`), and ``dlrover-kfp record --pending``
does it on demand. A permanent error (a bad URL, a damaged schema) is raised as before: waiting
would not fix it.

Where: ``$DLROVER_KFP_PENDING_DIR`` or ``pending/`` in the user's data directory, then one
directory per store, named by a hash of its URL *with the password hidden* (the password never
reaches the disk; a store reached with another password is the same store). In a pipeline pod
the data directory goes with the pod: point ``DLROVER_KFP_PENDING_DIR`` at a volume that stays.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
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


def record_pending(url: str, environ: Mapping[str, str] = os.environ) -> list[tuple[str, bool]]:
    """Record every pending profile of ``url`` (oldest file first) and delete each once it is
    in the store; (run id, new) for each. A store error stops it with the rest still kept."""
    directory = pending_dir(url, environ)
    if not directory.is_dir():
        return []
    done = []
    files = sorted(directory.glob("*.json"), key=lambda p: (p.stat().st_mtime, p.name))
    for path in files:
        profile = read_document(JobProfile, path)
        new = record_profile(url, profile)
        path.unlink()
        done.append((profile.run_id, new))
        log.info("history: recorded the pending profile of %s", profile.run_id)
    return done


def record_or_keep(
    url: str,
    profile: JobProfile,
    environ: Mapping[str, str] = os.environ,
    *,
    reserve: Path | None = None,
) -> RecordOutcome:
    """Record ``profile`` (after any pending ones of the same store), or keep it on disk with
    an event that says why when the store is unavailable or its disk full (see the module
    docstring); ``reserve``: the run's reserved space (:func:`keep_pending`)."""
    try:
        drained = tuple(run_id for run_id, _ in record_pending(url, environ))
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
    "RecordOutcome",
    "keep_pending",
    "pending_dir",
    "pending_root",
    "record_or_keep",
    "record_pending",
]
