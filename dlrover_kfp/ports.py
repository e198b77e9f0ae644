"""The outside world as small protocols. Implementations are passed in, never built inside.

Each port has one behavioural test suite that every implementation runs (tests/contract/).
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.core.summary import JobSummary


@dataclass(frozen=True, slots=True)
class SimilarityQuery:
    """Which finished jobs count as "similar" for warm start.

    With a ``scenario`` the store matches on it; without one, on ``model_signature`` (the same
    model shape). Only jobs started at or after ``since`` (epoch seconds) are returned, newest
    first, at most ``limit``.
    """

    model_signature: str
    scenario: str | None = None
    since: float | None = None
    limit: int = 50


class HistoryStore(Protocol):
    """Finished jobs' profiles, queried by similarity. Recording is idempotent on ``run_id``."""

    def record(self, profile: JobProfile) -> bool:
        """Store a profile; False (and no change) if its ``run_id`` is already stored."""
        ...

    def record_many(self, profiles: Iterable[JobProfile]) -> int:
        """Store many profiles atomically (all or none); return how many were new."""
        ...

    def get(self, run_id: str) -> JobProfile:
        """The stored profile; :class:`~dlrover_kfp.errors.NotFoundError` if absent."""
        ...

    def list(self, *, scenario: str | None = None, limit: int = 50) -> list[JobSummary]:
        """Summaries, newest first."""
        ...

    def find_similar(self, query: SimilarityQuery) -> builtins.list[JobSummary]: ...

    def iter_profiles(self) -> Iterator[JobProfile]:
        """Every profile, oldest first (for export)."""
        ...

    def count(self) -> int: ...

    def close(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""
        ...


@dataclass(frozen=True, slots=True)
class FixedClock:
    """A clock stopped at ``moment``: planning "as of" a given time (replays, simulation)."""

    moment: float

    def now(self) -> float:
        return self.moment


class SystemClock:
    def now(self) -> float:
        return time.time()
