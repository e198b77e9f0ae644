"""Plan a job before it starts: the one function the CLI, KFP components and Airflow call.

It queries the history for similar jobs (I/O, through the injected store) and hands them to the
pure warm-start planner; everything it needs comes in as arguments.
"""

from __future__ import annotations

from dlrover_kfp.core.observation import Observation
from dlrover_kfp.core.plan import ResourcePlan
from dlrover_kfp.core.planner import PlannerSettings, context_from_spec, warm_start
from dlrover_kfp.core.planner.warm_start import DAY_S
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.ports import Clock, HistoryStore, SimilarityQuery

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
    clock: Clock,
    settings: PlannerSettings | None = None,
) -> ResourcePlan:
    """Stage 1 for ``spec``: warm start from ``store`` (cold start without one)."""
    return plan_job_with_history(spec, store, clock, settings)[0]


def plan_job_with_history(
    spec: JobSpec,
    store: HistoryStore | None,
    clock: Clock,
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
