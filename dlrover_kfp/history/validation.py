"""Checks every history store makes before it writes, so that all of them refuse the same input.

A :class:`JobProfile` that pydantic accepted can still be unusable for the history: its
``started_at`` is free text until something parses it, and a batch may name one run twice.
Finding that out before the first write is what lets ``record_many`` be all-or-nothing cheaply.
"""

from __future__ import annotations

from collections.abc import Iterable

from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.core.summary import JobSummary, parse_timestamp, summarize
from dlrover_kfp.errors import UserInputError


def checked_summary(profile: JobProfile, source: str | None = None) -> JobSummary:
    """``summarize(profile)``, or a :class:`UserInputError` naming ``source`` and the bad key."""
    try:
        parse_timestamp(profile.started_at)
    except ValueError:
        where = source or f"profile {profile.run_id!r}"
        raise UserInputError(
            f"{where}: started_at: not an ISO 8601 time (got {profile.started_at!r})"
        ) from None
    return summarize(profile)


def checked_batch(profiles: Iterable[JobProfile]) -> list[tuple[JobProfile, JobSummary]]:
    """Each profile with its summary; :class:`UserInputError` if a run_id appears twice."""
    seen: set[str] = set()
    result = []
    for profile in profiles:
        if profile.run_id in seen:
            raise UserInputError(f"run_id {profile.run_id!r} appears more than once in the batch")
        seen.add(profile.run_id)
        result.append((profile, checked_summary(profile)))
    return result
