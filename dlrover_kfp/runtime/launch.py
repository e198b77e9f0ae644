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
from pathlib import Path

from dlrover_kfp.backends import ClusterBackend, LocalBackend
from dlrover_kfp.core.documents import to_json
from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.errors import PermanentError, UserInputError
from dlrover_kfp.files import read_document, write_atomic
from dlrover_kfp.history import open_history
from dlrover_kfp.history.pending import keep_pending, record_or_keep
from dlrover_kfp.planning import (
    check_plan,
    known_points,
    local_planner_settings,
    plan_start,
    with_data_rows,
)
from dlrover_kfp.runtime import signals
from dlrover_kfp.runtime.elastic import elastic_run
from dlrover_kfp.runtime.job import Progress, RunResult, static_groups, static_run
from dlrover_kfp.runtime.options import RunOptions
from dlrover_kfp.runtime.reserve import reserve_path
from dlrover_kfp.runtime.rundir import hold_output_dir
from dlrover_kfp.runtime.runfile import RUN_FILE, close_run_file, finished_run_id
from dlrover_kfp.training.installed import require_trainer

log = logging.getLogger(__name__)


def unwind_on_sigterm() -> None:
    """Make SIGTERM (Kubernetes, Airflow, kill), SIGHUP (the terminal or ssh session closed)
    and SIGINT (Ctrl-C, once or more) end a run the same clean way: pods stopped, cgroups
    removed, shared memory released, the run left resumable; a second signal only cuts grace
    periods short (:mod:`dlrover_kfp.runtime.signals`). For a command's main thread."""
    signals.install()


def run_job(
    spec: JobSpec,
    backend: ClusterBackend,
    options: RunOptions,
    *,
    progress: Progress,
) -> RunResult:
    """Train ``spec`` to the end on ``backend``, writing ``options.output_dir`` (profile.json,
    the model, the checkpoints).

    Elastic unless ``options.static`` (the spec's own resources for the whole run), planned
    with ``options.planner`` (default: :func:`local_planner_settings`, for pods on one machine).
    The run starts from ``options.plan`` when one is given (a pipeline's plan step made it),
    else from Stage 1's plan. With ``options.history_url`` the start is planned from that
    history (or the given plan's similar jobs are read from it) and, with ``options.record``,
    the profile recorded in it. With ``options.resume``, a run an earlier master left
    unfinished in the output dir (killed) goes on from its last committed checkpoint
    (:class:`~dlrover_kfp.runtime.job.JobRun`).
    """
    done = finished_run(options.output_dir, progress) if options.resume else None
    if done is not None:
        result = done
    else:
        require_trainer(f"training {spec.name}")
        if options.static:
            result = _run_static(spec, backend, options, progress)
        else:
            result = _run_elastic(spec, backend, options, progress)
    if options.history_url is not None and options.record:
        result = record_run(options.history_url, result, progress)
    # Only now, the profile handed over (or left to the caller's record step), may the run
    # file go: a master killed before this leaves a finished run that the same command records.
    close_run_file(result.output_dir)
    return result


def finished_run(output_dir: Path, progress: Progress) -> RunResult | None:
    """The run that ended in ``output_dir`` but whose master was stopped before it handed its
    profile over (killed or stopped while recording): its result as written, to record now
    rather than train the whole job again under a new id. None where there is none."""
    output_dir = output_dir.absolute()
    run_id = finished_run_id(output_dir)
    if run_id is None:
        return None
    path = output_dir / "profile.json"
    profile = read_document(JobProfile, path)
    if profile.run_id != run_id:
        raise UserInputError(
            f"{path}: the profile of run {profile.run_id}, but {output_dir / RUN_FILE} says run "
            f"{run_id} finished here; to start afresh run again with --fresh"
        )
    model = output_dir / "model"
    succeeded = profile.outcome.status == "succeeded"
    progress(
        f"{run_id}: this run ended before (its master stopped while recording its profile); "
        "its profile is recorded now and nothing is trained again"
    )
    return RunResult(
        profile=profile,
        output_dir=output_dir,
        model_dir=model if succeeded and model.is_dir() else None,
    )


def _run_static(
    spec: JobSpec, backend: ClusterBackend, options: RunOptions, progress: Progress
) -> RunResult:
    if options.history_url is not None:
        # A static run reads no history, but it records into one: a store that cannot be
        # opened should fail the command now, not after the whole job has trained.
        open_history(options.history_url).close()
    check_plan(spec, *static_groups(spec), source="resources (a --static run)")
    return static_run(spec, backend, options, progress=progress).run()


def _run_elastic(
    spec: JobSpec, backend: ClusterBackend, options: RunOptions, progress: Progress
) -> RunResult:
    """The elastic run from the given plan, else Stage 1's, checked against the minimums
    first. The planner's default is filled in here, once: Stage 1 and the run's later stages
    then plan with the same settings."""
    planner = options.planner or local_planner_settings()
    options = dataclasses.replace(options, planner=planner)
    if options.plan is None:
        planned = with_data_rows(spec, options.base_dir)
        plan, known = plan_start(planned, options.history_url, planner)
        source = f"the starting plan ({plan.stage.value})"
    else:
        plan = options.plan
        known = known_points(options.history_url, plan)
        source = "the given plan (--plan)"
    check_plan(spec, plan.workers, plan.ps, source=source)
    progress(f"{spec.name}: starting plan ({plan.stage.value}): {plan.reason}")
    return elastic_run(spec, backend, options, plan=plan, known=known, progress=progress).run()


def record_run(history_url: str, result: RunResult, progress: Progress) -> RunResult:
    """Record the run's profile, or keep it on disk when the store is unavailable
    (:func:`~dlrover_kfp.history.pending.record_or_keep`): then the run's ``profile.json``
    gets the event that says so, and the result carries it. On a full disk both writes use
    the run's reserved space (:mod:`~dlrover_kfp.runtime.reserve`), released at the end."""
    reserve = reserve_path(result.output_dir)
    try:
        # The hand-off: the profile is durable in the store's pending directory before the
        # record starts, so that a master killed during the record leaves it for the next run
        # into this store (record_or_keep removes the copy once the store holds the profile).
        kept_first = _keep_first(history_url, result.profile, reserve)
        try:
            outcome = record_or_keep(history_url, result.profile, reserve=reserve)
        except PermanentError as exc:
            if kept_first is None:
                raise
            raise type(exc)(
                f"{exc} (the profile of {result.profile.run_id} is kept in {kept_first}; once "
                "the history is fixed, `dlrover-kfp record --pending` records it)"
            ) from None
        for run_id in outcome.drained:
            progress(f"history: recorded the pending profile of {run_id}")
        if outcome.kept is None:
            return result
        profile = read_document(JobProfile, outcome.kept)
        text = to_json(profile) + "\n"
        try:
            write_atomic(result.output_dir / "profile.json", text, reserve=reserve)
        except UserInputError as exc:  # the pending copy has the event; this one does not
            progress(f"{exc}")
    finally:
        reserve.unlink(missing_ok=True)
    progress(f"{profile.events[-1].detail}")
    return dataclasses.replace(result, profile=profile)


def _keep_first(history_url: str, profile: JobProfile, reserve: Path) -> Path | None:
    try:
        return keep_pending(history_url, profile, reserve=reserve)
    except UserInputError as exc:  # no room even in the reserve: the record is tried all the same
        log.warning("the profile of %s was not kept before its record: %s", profile.run_id, exc)
        return None


def run_local(spec: JobSpec, options: RunOptions, *, progress: Progress) -> RunResult:
    """:func:`run_job` with the pods as local processes (their logs under ``logs/``), holding
    ``options.output_dir`` for the whole run (:func:`~dlrover_kfp.runtime.rundir.hold_output_dir`:
    a second run into it is refused; with ``options.fresh`` an earlier run's files are archived
    first)."""
    with (
        hold_output_dir(options.output_dir, fresh=options.fresh, progress=progress) as held,
        LocalBackend(held / "logs", cut_short=signals.hurried) as backend,
    ):
        return run_job(
            spec, backend, dataclasses.replace(options, output_dir=held), progress=progress
        )


__all__ = ["finished_run", "record_run", "run_job", "run_local", "unwind_on_sigterm"]
