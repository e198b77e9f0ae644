"""Stage 1: the plan a job starts with, from the history of similar jobs (or none).

Warm start plans from what similar jobs *used*, not from what they asked for: users ask for
three to five times what their jobs use, and planning from requests would copy the waste.

    worker cpu    = peak used by any worker x (1 + cpu_margin)               >= peak
    ps cpu        = peak used by any PS x (1 + cpu_margin)                   >= peak
    worker memory = peak used x (1 + worker_memory_margin)  [x oom factor]  >= peak, floor
    ps memory     = max(peak per PS, peak total / p) x (1 + ps_memory_margin) >= peak, floor
    counts        = from a model fitted on the jobs' pooled samples when they span enough
                    configurations (the search picks the cheapest near-best point); otherwise
                    the counts the most recent jobs ran with (median)

and the result is fitted into the quota (fewer workers first, then smaller pods); when even
that is above the quota, the user's own request (:func:`warm_start`). Without
similar jobs the plan is a cold start: the spec's own resources when it has them (the user's
guess is the best information there is), else a small default that Stage 2 grows.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

from dlrover_kfp.core.footprint import RUNTIME_MB
from dlrover_kfp.core.observation import Config, Observation
from dlrover_kfp.core.perf_model import PRIOR, PerfModel, fit
from dlrover_kfp.core.plan import NodeGroup, ResourcePlan, Stage
from dlrover_kfp.core.planner.context import (
    PlanningContext,
    clamp_cpu,
    clamp_memory,
    clamp_worker_memory,
)
from dlrover_kfp.core.planner.quota import (
    OVER_QUOTA,
    QuotaFit,
    memory_shortfalls,
    require_quota_fit,
)
from dlrover_kfp.core.planner.search import CpuBounds, InfeasiblePlanError, MemoryNeeds, search
from dlrover_kfp.core.planner.settings import PlannerSettings
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.core.summary import JobSummary
from dlrover_kfp.core.usage import cores_per_sample

DAY_S = 86400.0


def select_similar(
    ctx: PlanningContext,
    candidates: Sequence[JobSummary],
    settings: PlannerSettings,
    now: float,
) -> list[JobSummary]:
    """The jobs warm start may learn from: recent, with usage recorded, at a similar scale,
    newest first, at most ``max_jobs``. A failed job still tells its usage; it is kept."""
    ws = settings.warm_start
    since = now - ws.window_days * DAY_S
    chosen = []
    for job in sorted(candidates, key=lambda j: j.started_at, reverse=True):
        if job.started_at < since or not job.has_usage:
            continue
        if ctx.dataset_rows and job.dataset_rows:
            ratio = max(ctx.dataset_rows, job.dataset_rows) / min(
                ctx.dataset_rows, job.dataset_rows
            )
            if ratio > ws.dataset_scale_tolerance:
                continue
        chosen.append(job)
        if len(chosen) >= ws.max_jobs:
            break
    return chosen


def _own_request(spec: JobSpec, ctx: PlanningContext) -> QuotaFit | None:
    """The spec's own resources fitted into the quota (None: the spec gives none).

    Within the quota as every plan is: a spec without limits is held to the default quota,
    and on one machine to its capacity (settings.capacity). A request within its own limits
    always fits them unchanged."""
    res = spec.resources
    if res.workers is None or res.ps is None:
        return None
    return require_quota_fit(res.workers.to_group(), res.ps.to_group(), ctx)


def _cold_ps_memory_mb(ctx: PlanningContext, ps_count: int, settings: PlannerSettings) -> int:
    """A cold start's PS memory: the model's footprint floor x ``cold_start.memory_factor``."""
    return clamp_memory(
        ctx.ps_memory_floor_mb(ps_count) * settings.cold_start.memory_factor, ctx.node
    )


def _cold_ps(
    workers: NodeGroup,
    ps: NodeGroup,
    ctx: PlanningContext,
    settings: PlannerSettings,
    *,
    own_quota: bool,
) -> NodeGroup:
    """The user's PS with at least the default's memory, the model's footprint x
    ``memory_factor``, where the quota has room: a PS just above its footprint is OOM-killed in
    the job's first minutes, before its growth can be measured (memory_growth.py), from where
    Stage 3 raises it.

    A request below the footprint itself is raised the same way only when the spec states its
    own quota (``own_quota``: ``resources.limits``): the user then gave the planner room to
    plan in, and a PS the model cannot run in is a guess to correct, as any other. Without
    limits the request is the only statement of what the job may take: it is left as asked,
    and the runtime refuses it before any pod starts (quota.require_runnable), telling the
    user what it needs."""
    if memory_shortfalls(workers, ps, ctx) and not own_quota:
        return ps
    floored = dataclasses.replace(
        ps, memory_mb=max(ps.memory_mb, _cold_ps_memory_mb(ctx, ps.count, settings))
    )
    return floored if ctx.fits(workers, floored) else ps


def cold_start(spec: JobSpec, ctx: PlanningContext, settings: PlannerSettings) -> ResourcePlan:
    own = _own_request(spec, ctx)
    if own is not None:
        return ResourcePlan(
            workers=own.workers,
            ps=_cold_ps(
                own.workers, own.ps, ctx, settings, own_quota=spec.resources.limits is not None
            ),
            stage=Stage.COLD_START,
            reason="cold start: no similar jobs in history; the spec's own resources"
            + (f"; {own.note()}" if own.cut else ""),
        )
    cs = settings.cold_start
    cpu = clamp_cpu(min(cs.max_cpu, max(cs.min_cpu, ctx.quota_cpu * cs.cpu_quota_share)), ctx.node)
    workers = max(ctx.min_workers, min(cs.workers, ctx.max_workers))
    worker_mb = clamp_memory(ctx.worker_memory_floor_mb * cs.memory_factor, ctx.node)
    ps = ctx.min_ps
    # enough PS that each holds its rows within the per-pod memory clamp
    while (
        ps < ctx.max_ps and ctx.ps_memory_floor_mb(ps) * cs.memory_factor > ctx.node.max_memory_mb
    ):
        ps += 1
    ps_mb = _cold_ps_memory_mb(ctx, ps, settings)
    fitted = require_quota_fit(
        NodeGroup(count=workers, cpu=cpu, memory_mb=worker_mb),
        NodeGroup(count=ps, cpu=cpu, memory_mb=ps_mb),
        ctx,
    )
    return ResourcePlan(
        workers=fitted.workers,
        ps=fitted.ps,
        stage=Stage.COLD_START,
        reason=f"cold start: no similar jobs in history and no resources in the spec; "
        f"a small default ({workers} workers, {ps} PS) for auto-scaling to grow"
        + (f"; {fitted.note()}" if fitted.cut else ""),
        predicted_throughput=None,
    )


def warm_start(
    spec: JobSpec,
    ctx: PlanningContext,
    history: Sequence[JobSummary],
    settings: PlannerSettings,
    now: float,
    *,
    prior: PerfModel = PRIOR,
) -> ResourcePlan:
    """Plan a job before it starts. ``history`` holds candidate jobs (the store's answer to a
    similarity query); the ones used are named in the plan.

    When what the similar jobs needed does not fit the quota (memory, typically: a quota equal
    to a request those jobs outgrew), the plan is the user's own request, which fits any quota
    at least as large, and its reason says so (:data:`~.quota.OVER_QUOTA`): the job starts as
    the user would have run it, and Stage 3 reacts to what it then measures."""
    jobs = select_similar(ctx, history, settings, now)
    if not jobs:
        return cold_start(spec, ctx, settings)
    try:
        return _from_history(spec, ctx, jobs, settings, prior)
    except InfeasiblePlanError as exc:
        return _request_instead(spec, ctx, jobs, exc)


def _request_instead(
    spec: JobSpec, ctx: PlanningContext, jobs: Sequence[JobSummary], exc: InfeasiblePlanError
) -> ResourcePlan:
    """Warm start's plan when the history's needs exceed the quota: the user's request (a spec
    without one re-raises ``exc``; a request above its own limits raises its own error)."""
    own = _own_request(spec, ctx)
    if own is None:
        raise exc
    return ResourcePlan(
        workers=own.workers,
        ps=own.ps,
        stage=Stage.WARM_START,
        reason=f"warm start from {len(jobs)} similar job(s): {OVER_QUOTA} ({exc}); the "
        f"user's own request instead" + (f"; {own.note()}" if own.cut else ""),
        similar_jobs=tuple(j.run_id for j in jobs),
    )


def _from_history(
    spec: JobSpec,
    ctx: PlanningContext,
    jobs: Sequence[JobSummary],
    settings: PlannerSettings,
    prior: PerfModel,
) -> ResourcePlan:
    """Warm start's plan from ``jobs`` (module docstring); raises
    :class:`~.search.InfeasiblePlanError` when what they needed does not fit the quota."""
    ws = settings.warm_start
    node = ctx.node

    peak_w_cpu = _peak_cpu([(j.peak_worker_cpu, j.workers.cpu) for j in jobs])
    peak_p_cpu = _peak_cpu([(j.peak_ps_cpu, j.ps.cpu) for j in jobs])
    peak_w_mem = max(j.peak_worker_memory_mb for j in jobs)
    peak_p_mem = max(j.peak_ps_memory_mb for j in jobs)
    oom = any(j.oom_events for j in jobs)
    oom_factor = ws.oom_memory_factor if oom else 1.0

    worker_cpu = clamp_cpu(max(peak_w_cpu * (1 + ws.cpu_margin), node.min_cpu), node)
    ps_cpu = clamp_cpu(max(peak_p_cpu * (1 + ws.cpu_margin), node.min_cpu), node)
    worker_mb = clamp_worker_memory(
        max(ctx.worker_memory_floor_mb, peak_w_mem * (1 + ws.worker_memory_margin) * oom_factor),
        node,
    )
    # The rows a PS holds re-partition with the count: keep the state, not the per-pod figure.
    ps_state = max(ctx.ps_state_mb, *(_ps_state_seen_mb(j) for j in jobs))
    memory = MemoryNeeds(
        worker_mb=worker_mb,
        ps_fixed_mb=RUNTIME_MB,
        ps_state_mb=math.ceil(ps_state * (1 + ws.ps_memory_margin) * oom_factor),
        ps_min_mb=node.min_memory_mb,
    )

    observations: list[Observation] = [o for j in jobs for o in j.observations]
    configs = {o.config for o in observations}
    model = fit(observations, prior, settings=settings.model_fit) if observations else prior
    names = tuple(j.run_id for j in jobs)
    scope = f"scenario {spec.scenario}" if spec.scenario else "the same model shape"

    if len(configs) >= ws.min_configs_for_model:
        # Each role's measured work per sample, not a per-pod floor (search.CpuBounds): the
        # search may then split the workers' cores over more, smaller pods.
        bounds = CpuBounds(
            worker_cores_per_sample=cores_per_sample(observations, "worker"),
            ps_cores_per_sample=cores_per_sample(observations, "ps"),
            headroom=settings.auto_scale.idle_headroom,
            ps_headroom=settings.auto_scale.ps_demand_headroom,
        )
        target = search(
            model,
            ctx,
            memory,
            bounds,
            settings.auto_scale.throughput_floor,
            objective=settings.auto_scale.objective,
        ).target
        cfg = target.config
        how = f"model fitted on {len(configs)} configurations"
    else:
        counts_w = statistics.median_low([j.workers.count for j in jobs])
        counts_p = statistics.median_low([j.ps.count for j in jobs])
        cfg = Config(
            max(ctx.min_workers, min(ctx.max_workers, counts_w)),
            max(ctx.min_ps, min(ctx.max_ps, counts_p)),
            worker_cpu,
            ps_cpu,
        )
        how = "their pod counts, pods sized from peak use"
    # No PS gets less than a PS was seen to use, unless the plan has more PS than those jobs
    # had: then the rows re-partition and the state-based figure already covers each share.
    fewest_ps = min(_fewest_ps_seen(j) for j in jobs)
    per_ps_peak = peak_p_mem * (1 + ws.ps_memory_margin) if cfg.ps <= fewest_ps else 0
    ps_mb = clamp_memory(max(memory.ps_mb(cfg.ps), per_ps_peak), node)
    fitted = require_quota_fit(
        NodeGroup(count=cfg.workers, cpu=cfg.worker_cpu, memory_mb=worker_mb),
        NodeGroup(count=cfg.ps, cpu=max(cfg.ps_cpu, ps_cpu), memory_mb=ps_mb),
        ctx,
    )
    w_group, p_group = fitted.workers, fitted.ps
    predicted = model.throughput(
        Config(w_group.count, p_group.count, w_group.cpu, p_group.cpu),
        ctx.batch_size,
    )
    squeezed = f"; {fitted.note()}" if fitted.cut else ""
    return ResourcePlan(
        workers=w_group,
        ps=p_group,
        stage=Stage.WARM_START,
        reason=(
            f"warm start from {len(jobs)} similar job(s) ({scope}, last {ws.window_days:g} days): "
            f"{how}; peak use worker {peak_w_cpu:.2g}cpu/{peak_w_mem}Mi, "
            f"PS {peak_p_cpu:.2g}cpu/{peak_p_mem}Mi{' (an OOM seen: more memory)' if oom else ''}"
            f"{squeezed}"
        ),
        predicted_throughput=round(predicted, 1) if observations else None,
        similar_jobs=names,
    )


def _peak_cpu(jobs: Sequence[tuple[float, float]]) -> float:
    """The most a role's pod used, over ``(peak used, given per pod)`` of the similar jobs.

    A peak of 0 means the role was never measured (a run too short for a usage window, or a
    role whose pods all started late), not that it needs no CPU: sizing from it would shrink
    the pods to the node minimum. Measured peaks decide; with none, the most a pod was given.
    """
    measured = [used for used, _ in jobs if used > 0]
    return max(measured) if measured else max(given for _, given in jobs)


def _fewest_ps_seen(job: JobSummary) -> int:
    """The fewest PS ``job`` was measured with: the counts of its observations, else its
    plan's. A summary's ``ps`` is its last plan, which may never have been measured (a step at
    the end of a run), and its peaks were measured at the counts it ran with."""
    return min((o.config.ps for o in job.observations), default=job.ps.count)


def _ps_state_seen_mb(job: JobSummary) -> int:
    """The PS state ``job`` was measured to hold, all PS together, without their runtimes:

        state = peak total PS memory - runtime x (fewest PS it was measured with)

    Per job, with the fewest PS (the least runtime to take away: from above, as memory must
    be). A total from one job less the runtimes of another's count (a typical count of all
    the jobs) made the state small or negative when the job with the largest total ran fewer
    PS than the others (simulator, trainer, seed 2: 2,950 MiB measured at 5 PS less 7
    runtimes, so a warm start's 7 PS got the 512 MiB minimum and one was OOM-killed where the
    user's request would have held)."""
    return job.peak_total_ps_memory_mb - RUNTIME_MB * _fewest_ps_seen(job)


__all__ = ["cold_start", "select_similar", "warm_start"]
