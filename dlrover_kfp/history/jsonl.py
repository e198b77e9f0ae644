"""Moving a history between stores as JSON Lines: one profile per line, oldest first.

JSONL because it streams (an export of 100,000 runs never sits in memory as one string), it
diffs and greps, and each line is exactly the published profile contract, so any tool that reads
profiles reads an export. Export is atomic (a temporary file renamed over the target); import
validates every line before it stores any, then stores them in one transaction.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from dlrover_kfp.core.documents import parse, to_dict
from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.files import iter_json_lines
from dlrover_kfp.history.validation import checked_summary
from dlrover_kfp.ports import HistoryStore


def export_jsonl(store: HistoryStore, path: str | os.PathLike[str]) -> int:
    """Write every profile in ``store`` to ``path``; return how many. Readers never see half."""
    target = Path(path)
    if target.is_dir():
        raise UserInputError(f"{target}: is a directory, expected a file")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    except OSError as exc:
        raise UserInputError(f"{target}: cannot write: {exc.strerror}") from None
    tmp = Path(tmp_name)
    written = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            for profile in store.iter_profiles():
                handle.write(
                    json.dumps(to_dict(profile), separators=(",", ":"), ensure_ascii=False)
                )
                handle.write("\n")
                written += 1
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UserInputError(f"{target}: cannot write: {exc.strerror}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return written


def read_jsonl(path: str | os.PathLike[str]) -> list[JobProfile]:
    """Every profile in a JSONL file, validated; the first bad line is a :class:`UserInputError`.

    Blank lines are ignored. The message names ``<file>:<line>`` and what is wrong, including a
    run_id that an earlier line already used.
    """
    profiles: list[JobProfile] = []
    first_line: dict[str, int] = {}
    for where, number, data in iter_json_lines(path):
        profile = parse(JobProfile, data, where)
        checked_summary(profile, where)
        if profile.run_id in first_line:
            raise UserInputError(
                f"{where}: run_id {profile.run_id!r} already appears on line "
                f"{first_line[profile.run_id]}"
            )
        first_line[profile.run_id] = number
        profiles.append(profile)
    return profiles


def import_jsonl(store: HistoryStore, path: str | os.PathLike[str]) -> tuple[int, int]:
    """Store every profile in ``path``: ``(new, skipped)``, skipped being those already stored.

    Nothing is stored unless every line is valid (see :func:`read_jsonl`).
    """
    profiles = read_jsonl(path)
    new = store.record_many(profiles)
    return new, len(profiles) - new
