"""The record step: a run's profile into the history store."""

from __future__ import annotations

import os
from dataclasses import dataclass

from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.files import read_document
from dlrover_kfp.history import record_profile
from dlrover_kfp.steps.plan import cores
from dlrover_kfp.steps.spec import history_url_or_default


@dataclass(frozen=True, slots=True)
class RecordStepResult:
    run_id: str
    #: False when the store already had the run (a retried task): nothing was written
    new: bool
    markdown: str


def read_profile(path: str | os.PathLike[str]) -> JobProfile:
    return read_document(JobProfile, path)


def record_step(profile: JobProfile, history_url: str | None = None) -> RecordStepResult:
    """Record ``profile`` in the history (the default store when empty)."""
    new = record_profile(history_url_or_default(history_url), profile)
    return RecordStepResult(profile.run_id, new, record_markdown(profile, new))


def record_markdown(profile: JobProfile, new: bool) -> str:
    outcome, metrics = profile.outcome, profile.metrics
    auc = f"{metrics.auc:.4f}" if metrics.auc is not None else "-"
    loss = f"{metrics.loss:.4f}" if metrics.loss is not None else "-"
    final = profile.plans[-1] if profile.plans else None
    plan = (
        f"{final.workers.count} workers x {cores(final.workers.cpu)} cores + "
        f"{final.ps.count} PS x {cores(final.ps.cpu)} cores ({final.stage.value})"
        if final
        else "-"
    )
    return (
        f"# Run `{profile.run_id}` {'recorded' if new else 'was already recorded'}\n\n"
        "| | |\n|---|---|\n"
        f"| job | {profile.job.name} |\n"
        f"| scenario | {profile.job.scenario or '-'} |\n"
        f"| outcome | {outcome.status} |\n"
        f"| JCT | {outcome.jct_seconds:.1f} s |\n"
        f"| samples processed | {outcome.samples_processed:,} |\n"
        f"| held-out loss / AUC | {loss} / {auc} |\n"
        f"| final plan | {plan} |\n"
    )


__all__ = ["RecordStepResult", "read_profile", "record_markdown", "record_step"]
