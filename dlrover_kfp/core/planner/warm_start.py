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

and the result is fitted into the quota (fewer workers first, then smaller pods). Without
similar jobs the plan is a cold start: the spec's own resources when it has them (the user's
guess is the best information there is), else a small default that Stage 2 grows.
"""

from __future__ import annotations

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
)
from dlrover_kfp.core.planner.quota import require_quota_fit
from dlrover_kfp.core.planner.search import CpuBounds, MemoryNeeds, search
from dlrover_kfp.core.planner.settings import PlannerSettings
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.core.summary import JobSummary
from dlrover_kfp.core.usage import ps_cores_per_sample

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


def cold_start(spec: JobSpec, ctx: PlanningContext, settings: PlannerSettings) -> ResourcePlan:
    res = spec.resources
    if res.workers is not None and res.ps is not None:
        # Within the quota as every plan is: a spec without limits is held to the default
        # quota, and on one machine to its capacity (settings.capacity).
        own = require_quota_fit(res.workers.to_group(), res.ps.to_group(), ctx)
        return ResourcePlan(
            workers=own.workers,
            ps=own.ps,
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
    ps_mb = clamp_memory(ctx.ps_memory_floor_mb(ps) * cs.memory_factor, ctx.node)
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
    similarity query); the ones used are named in the plan."""
    jobs = select_similar(ctx, history, settings, now)
    if not jobs:
        return cold_start(spec, ctx, settings)
    ws = settings.warm_start
    node = ctx.node

    peak_w_cpu = _peak_cpu([(j.peak_worker_cpu, j.workers.cpu) for j in jobs])
    peak_p_cpu = _peak_cpu([(j.peak_ps_cpu, j.ps.cpu) for j in jobs])
    peak_w_mem = max(j.peak_worker_memory_mb for j in jobs)
    peak_p_mem = max(j.peak_ps_memory_mb for j in jobs)
    peak_p_total = max(j.peak_total_ps_memory_mb for j in jobs)
    oom = any(j.oom_events for j in jobs)
    oom_factor = ws.oom_memory_factor if oom else 1.0

    worker_cpu = clamp_cpu(max(peak_w_cpu * (1 + ws.cpu_margin), node.min_cpu), node)
    ps_cpu = clamp_cpu(max(peak_p_cpu * (1 + ws.cpu_margin), node.min_cpu), node)
    worker_mb = clamp_memory(
        max(ctx.worker_memory_floor_mb, peak_w_mem * (1 + ws.worker_memory_margin) * oom_factor),
        node,
    )
    # The rows a PS holds re-partition with the count: keep the state, not the per-pod figure.
    ps_state = max(ctx.ps_state_mb, peak_p_total - RUNTIME_MB * _typical_ps_count(jobs))
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
        bounds = CpuBounds(
            worker_floor=worker_cpu,
            ps_cores_per_sample=ps_cores_per_sample(observations),
            headroom=ws.cpu_margin,
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
    fewest_ps = min(j.ps.count for j in jobs)
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


def _typical_ps_count(jobs: Sequence[JobSummary]) -> int:
    return max(1, statistics.median_low([j.ps.count for j in jobs]))


__all__ = ["cold_start", "select_similar", "warm_start"]
