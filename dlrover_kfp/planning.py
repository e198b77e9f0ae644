"""Plan a job before it starts: the one function the CLI, KFP components and Airflow call.

It queries the history for similar jobs (I/O, through the injected store) and hands them to the
pure warm-start planner; everything it needs comes in as arguments. No trainer is imported
here: a pipeline's plan step runs in a pod of its own and starts in a fraction of a second.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os

import psutil  # type: ignore[import-untyped, unused-ignore]

from dlrover_kfp.core.observation import Observation
from dlrover_kfp.core.plan import NodeGroup, ResourcePlan
from dlrover_kfp.core.planner import PlannerSettings, context_from_spec, warm_start
from dlrover_kfp.core.planner.quota import require_runnable
from dlrover_kfp.core.planner.settings import DefaultQuota
from dlrover_kfp.core.planner.warm_start import DAY_S
from dlrover_kfp.core.spec import JobSpec, TableData
from dlrover_kfp.core.summary import summarize
from dlrover_kfp.errors import MissingExtraError, NotFoundError
from dlrover_kfp.history import open_history
from dlrover_kfp.ports import HistoryStore, SimilarityQuery, SystemClock, WallClock

log = logging.getLogger(__name__)

#: The store returns this many times ``max_jobs`` candidates, newest first, so that the planner
#: still finds enough after dropping jobs of another scale or without usage.
CANDIDATE_FACTOR = 5


def similarity_query(spec: JobSpec, settings: PlannerSettings, now: float) -> SimilarityQuery:
    ws = settings.warm_start
    return SimilarityQuery(
        model_signature=spec.model.signature(),
        scenario=spec.scenario,
        since=now - ws.window_days * DAY_S,
        limit=ws.max_jobs * CANDIDATE_FACTOR,
    )


def plan_job(
    spec: JobSpec,
    store: HistoryStore | None,
    clock: WallClock,
    settings: PlannerSettings | None = None,
) -> ResourcePlan:
    """Stage 1 for ``spec``: warm start from ``store`` (cold start without one)."""
    return plan_job_with_history(spec, store, clock, settings)[0]


def plan_job_with_history(
    spec: JobSpec,
    store: HistoryStore | None,
    clock: WallClock,
    settings: PlannerSettings | None = None,
) -> tuple[ResourcePlan, list[Observation]]:
    """:func:`plan_job`, and the measured observations of the similar jobs the plan used.

    Stage 2 takes those observations as known points (``auto_scale(known=...)``), so that a
    recurring job does not re-learn what its earlier runs measured. One history query serves
    both.
    """
    settings = settings or PlannerSettings()
    now = clock.now()
    candidates = store.find_similar(similarity_query(spec, settings, now)) if store else []
    plan = warm_start(spec, context_from_spec(spec, settings), candidates, settings, now)
    used = set(plan.similar_jobs)
    known = [o for job in candidates if job.run_id in used for o in job.observations]
    return plan, known


def local_planner_settings() -> PlannerSettings:
    """The planner's settings for pods that are processes on one machine.

    The defaults are a cluster's (half-core steps, a decision every 5 minutes). A machine's
    quota is a few cores and a job a few minutes, so pods come in quarter cores, memory from
    512 MiB, and Stage 2 decides every 10 s once it has 3 samples at the current shape. No
    plan holds more than the machine (:func:`machine_capacity`): a cluster's default quota of
    32 cores would start 12 cores of pods on a 2-core laptop.
    """
    defaults = PlannerSettings()
    return dataclasses.replace(
        defaults,
        capacity=machine_capacity(),
        node=dataclasses.replace(defaults.node, min_cpu=0.25, cpu_step=0.25, min_memory_mb=512),
        auto_scale=dataclasses.replace(defaults.auto_scale, min_interval_s=10.0, min_samples=3),
        # Stage 3 looks one planning interval ahead for a memory trend.
        post_scale=dataclasses.replace(defaults.post_scale, oom_horizon_s=10.0),
    )


def check_plan(spec: JobSpec, workers: NodeGroup, ps: NodeGroup, *, source: str) -> None:
    """The check every plan a run starts from passes before any pod starts (the user's
    resources, ``--plan``, Stage 1's plan): each role's memory against the model's own
    footprint, the whole against ``resources.limits``
    (:func:`~dlrover_kfp.core.planner.quota.require_runnable`, which names ``source``)."""
    # The footprint alone decides the needs: any settings give the same ones.
    ctx = context_from_spec(spec, PlannerSettings())
    res = spec.resources
    own = (res.workers.to_group(), res.ps.to_group()) if res.workers and res.ps else None
    # The spec's own resources are named by their keys, which the user edits.
    spec_keys = ("resources.workers.memory", "resources.ps.memory")
    keys = spec_keys if own == (workers, ps) else ("workers", "ps")
    require_runnable(workers, ps, ctx, limits=res.limits, source=source, keys=keys)


@functools.cache
def machine_capacity() -> DefaultQuota:
    """This machine's cores (the ones this process may run on) and the memory available to new
    processes now (``MemAvailable``: free plus what the kernel can reclaim), the most a plan on
    the local backend holds. Not the total: pods planned against 24 GiB on a machine where
    others hold 21 are killed by the kernel, not refused. Read once per process (when the run
    plans its start), and said once in the log."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    memory_mb = psutil.virtual_memory().available // 2**20
    capacity = DefaultQuota(cpu=float(cores or 1), memory_mb=int(memory_mb))
    log.info(
        "local backend: plans are capped at this machine's %g cores and the %d MiB of memory "
        "available now (the quota where it is larger)",
        capacity.cpu,
        capacity.memory_mb,
    )
    return capacity


def with_data_rows(spec: JobSpec, base_dir: str | os.PathLike[str]) -> JobSpec:
    """``spec`` with ``data.rows`` read from its Parquet files' metadata when it gives none.

    The planner sizes a job by its rows (warm start matches jobs of a similar scale). A Parquet
    footer states its row count (a few kB read per file); a CSV or Criteo file states nothing,
    and counting its lines means reading all of it, which the master does anyway once it
    starts: there the planner goes without, as it does for a spec that leaves ``rows`` out.
    Without pyarrow (an install without the ``data`` extra) the plan goes without too.
    """
    data = spec.data
    if not isinstance(data, TableData) or data.format != "parquet" or data.rows is not None:
        return spec
    from dlrover_kfp.training.datasets import open_dataset  # noqa: PLC0415 (pyarrow: lazily)

    try:
        rows = sum(open_dataset(data, spec.model, base_dir).source_rows)
    except MissingExtraError as exc:
        log.info("data.rows not given and %s: planning without the row count", exc)
        return spec
    return dataclasses.replace(spec, data=dataclasses.replace(data, rows=rows))


def plan_start(
    spec: JobSpec, history_url: str | None, settings: PlannerSettings
) -> tuple[ResourcePlan, list[Observation]]:
    """Stage 1's plan from the history at ``history_url`` (a cold start without one), and the
    similar jobs' measurements. The store is open only for the query."""
    if history_url is None:
        return plan_job_with_history(spec, None, SystemClock(), settings)
    store = open_history(history_url)
    try:
        return plan_job_with_history(spec, store, SystemClock(), settings)
    finally:
        store.close()


def known_points(history_url: str | None, plan: ResourcePlan) -> list[Observation]:
    """The measured observations of the similar jobs ``plan`` was drawn from.

    A plan made earlier (a pipeline's plan step, ``dlrover-kfp plan``) names its similar jobs;
    Stage 2 takes their measurements as known points, as it does when it plans the start
    itself. A job the history no longer has is skipped.
    """
    if history_url is None or not plan.similar_jobs:
        return []
    store = open_history(history_url)
    try:
        known: list[Observation] = []
        for run_id in plan.similar_jobs:
            try:
                known.extend(summarize(store.get(run_id)).observations)
            except NotFoundError:
                log.warning("history: the plan's similar job %s is gone; skipped", run_id)
        return known
    finally:
        store.close()
