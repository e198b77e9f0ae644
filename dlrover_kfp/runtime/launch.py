"""Run a job end to end on a backend: Stage 1, the run, the record.

``dlrover-kfp run`` and the quickstart call :func:`run_job` (through :func:`run_local` for the
local backend, :mod:`dlrover_kfp.runtime.kube` for Kubernetes): an elastic run starts from
Stage 1's plan (warm start from the history's similar jobs, else a cold start) with the
measurements of those jobs handed to Stage 2 as known points, and its profile goes to the
history afterwards, failed runs included. The history store is opened only around the query and
the record, never held while the job trains.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
from pathlib import Path
from types import FrameType

from dlrover_kfp.backends import ClusterBackend, LocalBackend
from dlrover_kfp.core.documents import to_json
from dlrover_kfp.core.plan import ResourcePlan
from dlrover_kfp.core.planner import PlannerSettings
from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.files import read_document, write_atomic
from dlrover_kfp.history.pending import record_or_keep
from dlrover_kfp.planning import known_points, local_planner_settings, plan_start
from dlrover_kfp.runtime.elastic import ElasticRun
from dlrover_kfp.runtime.job import Progress, RunResult, RunSettings, StaticRun

log = logging.getLogger(__name__)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def unwind_on_sigterm() -> None:
    """Make SIGTERM (Kubernetes, Airflow, kill) unwind like Ctrl-C, so that the backend stops
    every pod of a run in progress. For a command's main thread."""
    signal.signal(signal.SIGTERM, _terminate)


def run_job(
    spec: JobSpec,
    backend: ClusterBackend,
    *,
    output_dir: Path,
    base_dir: Path,
    settings: RunSettings,
    progress: Progress,
    history_url: str | None = None,
    static: bool = False,
    run_id: str | None = None,
    resume: bool = False,
    planner: PlannerSettings | None = None,
    plan: ResourcePlan | None = None,
    record: bool = True,
) -> RunResult:
    """Train ``spec`` to the end on ``backend``, writing ``output_dir`` (profile.json, the
    model, the checkpoints).

    Elastic unless ``static`` (the spec's own resources for the whole run), planned with
    ``planner`` (default: :func:`local_planner_settings`, for pods on one machine). The run
    starts from ``plan`` when one is given (a pipeline's plan step made it), else from Stage
    1's plan. With ``history_url`` the start is planned from that history (or ``plan``'s
    similar jobs are read from it) and, with ``record``, the profile recorded in it. With
    ``resume``, a run an earlier master left unfinished in ``output_dir`` (killed) goes on from
    its last committed checkpoint (:class:`~dlrover_kfp.runtime.job.StaticRun`).
    """
    run: StaticRun
    if static:
        run = StaticRun(
            spec,
            backend,
            output_dir=output_dir,
            base_dir=base_dir,
            settings=settings,
            run_id=run_id,
            progress=progress,
            resume=resume,
        )
    else:
        planner = planner or local_planner_settings()
        if plan is None:
            plan, known = plan_start(spec, history_url, planner)
        else:
            known = known_points(history_url, plan)
        progress(f"{spec.name}: starting plan ({plan.stage.value}): {plan.reason}")
        run = ElasticRun(
            spec,
            backend,
            plan=plan,
            planner=planner,
            output_dir=output_dir,
            base_dir=base_dir,
            settings=settings,
            run_id=run_id,
            progress=progress,
            known=known,
            resume=resume,
        )
    result = run.run()
    if history_url is not None and record:
        result = record_run(history_url, result, progress)
    return result


def record_run(history_url: str, result: RunResult, progress: Progress) -> RunResult:
    """Record the run's profile, or keep it on disk when the store is unavailable
    (:func:`~dlrover_kfp.history.pending.record_or_keep`): then the run's ``profile.json``
    gets the event that says so, and the result carries it."""
    outcome = record_or_keep(history_url, result.profile)
    for run_id in outcome.drained:
        progress(f"history: recorded the pending profile of {run_id}")
    if outcome.kept is None:
        return result
    profile = read_document(JobProfile, outcome.kept)
    write_atomic(result.output_dir / "profile.json", to_json(profile) + "\n")
    progress(f"{profile.events[-1].detail}")
    return dataclasses.replace(result, profile=profile)


def run_local(
    spec: JobSpec,
    *,
    output_dir: Path,
    base_dir: Path,
    settings: RunSettings,
    progress: Progress,
    history_url: str | None = None,
    static: bool = False,
    run_id: str | None = None,
    resume: bool = False,
    plan: ResourcePlan | None = None,
    record: bool = True,
) -> RunResult:
    """:func:`run_job` with the pods as local processes (their logs under ``logs/``)."""
    with LocalBackend(output_dir / "logs") as backend:
        return run_job(
            spec,
            backend,
            output_dir=output_dir,
            base_dir=base_dir,
            settings=settings,
            progress=progress,
            history_url=history_url,
            static=static,
            run_id=run_id,
            resume=resume,
            plan=plan,
            record=record,
        )


__all__ = ["record_run", "run_job", "run_local", "unwind_on_sigterm"]
