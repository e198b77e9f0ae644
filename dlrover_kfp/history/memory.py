"""A history store in a dict, for tests and the simulator.

It keeps the same promises as the SQL store (the contract tests run both): idempotent
``record``, all-or-nothing ``record_many``, newest-first similarity queries over summaries
computed once at record time. A lock makes it safe to share between threads; it is not shared
between processes.
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Callable, Iterable, Iterator

from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.core.summary import JobSummary
from dlrover_kfp.errors import NotFoundError
from dlrover_kfp.history.validation import checked_batch, checked_summary
from dlrover_kfp.ports import SimilarityQuery


def _newest_first(summary: JobSummary) -> tuple[float, str]:
    return (summary.started_at, summary.run_id)


class InMemoryHistoryStore:
    """:class:`~dlrover_kfp.ports.HistoryStore` held in memory; gone when the process ends."""

    def __init__(self, profiles: Iterable[JobProfile] = ()) -> None:
        self._lock = threading.Lock()
        self._profiles: dict[str, JobProfile] = {}
        self._summaries: dict[str, JobSummary] = {}
        self.record_many(profiles)

    def record(self, profile: JobProfile) -> bool:
        summary = checked_summary(profile)
        with self._lock:
            if profile.run_id in self._profiles:
                return False
            self._profiles[profile.run_id] = profile
            self._summaries[profile.run_id] = summary
        return True

    def record_many(self, profiles: Iterable[JobProfile]) -> int:
        # Every check happens before the first write, which is what makes the batch atomic here.
        batch = checked_batch(profiles)
        with self._lock:
            fresh = [(p, s) for p, s in batch if p.run_id not in self._profiles]
            for profile, summary in fresh:
                self._profiles[profile.run_id] = profile
                self._summaries[profile.run_id] = summary
        return len(fresh)

    def replace(self, profile: JobProfile) -> bool:
        summary = checked_summary(profile)
        with self._lock:
            if self._profiles.get(profile.run_id) == profile:
                return False
            self._profiles[profile.run_id] = profile
            self._summaries[profile.run_id] = summary
        return True

    def get(self, run_id: str) -> JobProfile:
        with self._lock:
            profile = self._profiles.get(run_id)
        if profile is None:
            raise NotFoundError(f"run {run_id!r} is not in the history (in memory)")
        return profile

    def list(self, *, scenario: str | None = None, limit: int = 50) -> list[JobSummary]:
        if scenario is None:
            return self._select(lambda s: True, limit)
        return self._select(lambda s: s.scenario == scenario, limit)

    def find_similar(self, query: SimilarityQuery) -> builtins.list[JobSummary]:
        since = query.since

        def similar(s: JobSummary) -> bool:
            if query.scenario is not None:
                if s.scenario != query.scenario:
                    return False
            elif s.model_signature != query.model_signature:
                return False
            return since is None or s.started_at >= since

        return self._select(similar, query.limit)

    def iter_profiles(self) -> Iterator[JobProfile]:
        with self._lock:
            ordered = sorted(self._summaries.values(), key=_newest_first)
            snapshot = [self._profiles[s.run_id] for s in ordered]
        yield from snapshot

    def count(self) -> int:
        with self._lock:
            return len(self._profiles)

    def close(self) -> None:
        """Nothing to release; present to satisfy the protocol."""

    def _select(self, keep: Callable[[JobSummary], bool], limit: int) -> builtins.list[JobSummary]:
        if limit <= 0:
            return []
        with self._lock:
            chosen = [s for s in self._summaries.values() if keep(s)]
        chosen.sort(key=_newest_first, reverse=True)
        return chosen[:limit]
