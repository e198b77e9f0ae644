"""Checks every history store makes before it writes, so that all of them refuse the same input.

A :class:`JobProfile` that pydantic accepted can still be unusable for the history: its
``started_at`` is free text until something parses it, and a batch may name one run twice.
Finding that out before the first write is what lets ``record_many`` be all-or-nothing cheaply.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

from dlrover_kfp.core.plan import NodeGroup
from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.core.summary import JobSummary, parse_timestamp, summarize
from dlrover_kfp.errors import UserInputError

#: Summary columns that the SQL schema keeps as 32-bit integers (the rest are 64-bit).
_INT32_FIELDS = frozenset({"batch_size", "oom_events"})
_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1


def checked_summary(profile: JobProfile, source: str | None = None) -> JobSummary:
    """``summarize(profile)``, or a :class:`UserInputError` naming ``source`` and the bad key.

    Besides ``started_at``, every number of the summary must be one that every store can keep:
    finite (SQLite turns NaN into NULL and refuses the row) and, for counts and sizes, within
    the SQL columns' 32 or 64 bits. Pydantic accepted the profile, but a float may be
    ``Infinity`` and an integer may have any size in JSON.
    """
    where = source or f"profile {profile.run_id!r}"
    try:
        moment = parse_timestamp(profile.started_at)
    except (ValueError, OverflowError):
        # OverflowError: a time at the edge of datetime's range that a UTC offset pushes out.
        raise UserInputError(
            f"{where}: started_at: not an ISO 8601 time (got {profile.started_at!r})"
        ) from None
    if not math.isfinite(moment):
        raise UserInputError(f"{where}: started_at: out of range (got {profile.started_at!r})")
    summary = summarize(profile)
    for field in dataclasses.fields(summary):
        value = getattr(summary, field.name)
        if isinstance(value, NodeGroup):
            _check_number(where, f"{field.name}.count", value.count, _INT32_MAX)
            _check_number(where, f"{field.name}.cpu", value.cpu, _INT64_MAX)
            _check_number(where, f"{field.name}.memory_mb", value.memory_mb, _INT64_MAX)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            bound = _INT32_MAX if field.name in _INT32_FIELDS else _INT64_MAX
            _check_number(where, field.name, value, bound)
    for obs in summary.observations:
        _check_number(where, "samples.throughput", obs.throughput, _INT64_MAX)
    _check_metrics(where, profile)
    return summary


def _check_metrics(where: str, profile: JobProfile) -> None:
    """Refuse metrics no run can have: an AUC outside [0, 1], a negative loss (log loss is
    >= 0). Warm start and the reports rank jobs by them, so one impossible value would rank an
    imported profile above every real one. NaN passes: a diverged run's metrics are NaN, and
    its profile (the record that it diverged) must still be kept."""
    metrics = profile.metrics
    # NaN compares false both ways, so it passes these checks.
    if metrics.auc is not None and (metrics.auc < 0 or metrics.auc > 1):
        raise UserInputError(f"{where}: metrics.auc: must be within [0, 1] (got {metrics.auc})")
    for key, value in (("metrics.loss", metrics.loss), ("metrics.train_loss", metrics.train_loss)):
        if value is not None and value < 0:
            raise UserInputError(f"{where}: {key}: must be at least 0 (got {value})")
    for k, sample in enumerate(profile.samples):
        if sample.loss is not None and sample.loss < 0:
            raise UserInputError(
                f"{where}: samples[{k}].loss: must be at least 0 (got {sample.loss})"
            )


def _check_number(where: str, key: str, value: float, bound: int) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise UserInputError(f"{where}: {key}: must be a finite number (got {value!r})")
    if abs(value) > bound:
        shown = value if abs(value) < 10**30 else f"a number of {len(str(int(value)))} digits"
        raise UserInputError(f"{where}: {key}: too large for the history (got {shown})")


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
