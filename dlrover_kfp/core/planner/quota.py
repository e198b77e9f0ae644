"""Fitting a plan into the job's quota: the one implementation every stage calls.

A plan that the planner would like (from history, from a cold-start default, from post-scaling
growth) may ask for more than the quota holds. It is cut in this order, each step only as far
as needed:

1. **Workers** are given up, down to ``min_workers``: they are the elastic role, and a job
   with fewer workers runs slower rather than failing. But not when trimming every pod's CPU
   by at most :data:`MAX_CPU_TRIM` is enough: a worker given up costs its whole share of the
   throughput and can leave much of the quota unused (2 workers x 1 + 2 PS x 0.25 under 2
   cores: one worker fewer leaves 0.5 idle, a 20% trim keeps both at 0.75).
2. **CPU** of every pod is scaled down by the same factor, rounded down to the CPU step and
   never below the node minimum; then, while the plan is still over (rounding and the minimum
   can leave it there), the pods with the most CPU lose one step at a time.
3. **PS** are given up, down to ``min_ps`` (when the caller allows it): their rows
   re-partition over the remaining PS, so each keeps the same runtime and takes a larger share
   of the state; the plan's total state is kept.

Memory is never cut below what was planned: a pod without the memory it needs dies, a pod with
less CPU only runs slower. When even the minimum job does not fit, the result says so
(:attr:`QuotaFit.fits` false) and :func:`require_quota_fit` raises
:class:`~dlrover_kfp.core.planner.search.InfeasiblePlanError` naming the quota and the
minimum job, never a plan above the quota.

:func:`require_runnable` is the other half: the one check every plan a run applies passes
before any pod starts (the user's resources, ``--plan``, Stage 1's plan), so that a pod given
less memory than the model's own footprint is refused with its numbers instead of being
OOM-killed at start. Stage 2 and 3 never produce such a plan: their memory starts from these
floors (:func:`at_least_minimum`). Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from dlrover_kfp.core.footprint import RUNTIME_MB, RUNTIME_MIN_MB
from dlrover_kfp.core.plan import NodeGroup
from dlrover_kfp.core.planner.context import PlanningContext, round_down, round_up
from dlrover_kfp.core.planner.search import InfeasiblePlanError
from dlrover_kfp.core.spec import Quota
from dlrover_kfp.errors import UserInputError

#: The largest CPU cut, as a share of every pod's CPU, that is taken instead of giving up a
#: worker (step 1).
MAX_CPU_TRIM = 0.25

#: What a plan's (or a kept plan's decision's) reason says when the planner's needs do not fit
#: the job's quota and it falls back instead of failing: at the start the job runs the user's
#: own request (which fits a quota at least as large); in a running job a stage keeps its plan,
#: or grows only as far as the quota allows. :func:`over_quota` recognises it.
OVER_QUOTA = "the planner's needs exceed the quota"


def over_quota(reason: str) -> bool:
    """Whether a plan's or a decision's ``reason`` says it fell back because the planner's
    needs exceed the quota (:data:`OVER_QUOTA`): what the simulator counts per job."""
    return OVER_QUOTA in reason


@dataclass(frozen=True, slots=True)
class QuotaFit:
    """The plan after :func:`fit_to_quota`, and what was cut to get there."""

    workers: NodeGroup
    ps: NodeGroup
    #: whether the result is within the quota (false: even the minimum job is above it)
    fits: bool
    workers_given_up: int = 0
    ps_given_up: int = 0
    cpu_cut: bool = False

    @property
    def cut(self) -> bool:
        return bool(self.workers_given_up or self.ps_given_up or self.cpu_cut)

    def note(self) -> str:
        """What was cut, for a plan's reason ("" when nothing was)."""
        parts = []
        if self.workers_given_up:
            parts.append(f"{self.workers_given_up} worker(s) given up")
        if self.cpu_cut:
            parts.append(f"CPU cut to {self.workers.cpu:g} per worker, {self.ps.cpu:g} per PS")
        if self.ps_given_up:
            parts.append(f"{self.ps_given_up} PS given up (rows re-partitioned)")
        return f"cut to the quota: {', '.join(parts)}" if parts else ""


def _cpu(workers: NodeGroup, ps: NodeGroup) -> float:
    return workers.total_cpu + ps.total_cpu


def _with(group: NodeGroup, *, count: int | None = None, cpu: float | None = None) -> NodeGroup:
    return NodeGroup(
        count=group.count if count is None else count,
        cpu=group.cpu if cpu is None else cpu,
        memory_mb=group.memory_mb,
    )


def _shrink_cpu(
    workers: NodeGroup, ps: NodeGroup, ctx: PlanningContext
) -> tuple[NodeGroup, NodeGroup]:
    """Step 2: proportional scaling, then one step at a time off the largest pods."""
    node = ctx.node
    step = node.cpu_step
    total = _cpu(workers, ps)
    if total <= ctx.quota_cpu + 1e-9:
        return workers, ps
    # Every pod × (quota / total), rounded down to the step: the ratio between roles is kept.
    scale = ctx.quota_cpu / total
    workers = _with(workers, cpu=max(node.min_cpu, round_down(workers.cpu * scale, step)))
    ps = _with(ps, cpu=max(node.min_cpu, round_down(ps.cpu * scale, step)))
    # The minimum and the rounding can leave it above; rounding down can also leave room, which
    # is not given back (the plan stays below the proportional point, never above the quota).
    while _cpu(workers, ps) > ctx.quota_cpu + 1e-9:
        can_w = workers.cpu - step >= node.min_cpu - 1e-9
        can_p = ps.cpu - step >= node.min_cpu - 1e-9
        if not (can_w or can_p):
            break
        # The role whose pods have more CPU gives a step (workers on a tie: they are elastic).
        if can_w and (not can_p or workers.cpu >= ps.cpu):
            workers = _with(workers, cpu=round_down(workers.cpu - step, step))
        else:
            ps = _with(ps, cpu=round_down(ps.cpu - step, step))
    return workers, ps


def _workers_to_keep(
    workers: NodeGroup, ps: NodeGroup, ctx: PlanningContext, max_trim: float
) -> NodeGroup:
    """Step 1: give up workers until the plan fits, or fits once its CPU is trimmed by at most
    ``max_trim`` (step 2 must then reach the quota: the node minimum can stop it)."""
    count = workers.count
    while count > ctx.min_workers:
        kept = _with(workers, count=count)
        if ctx.fits(kept, ps):
            break
        if 1 - ctx.quota_cpu / _cpu(kept, ps) <= max_trim and ctx.fits(*_shrink_cpu(kept, ps, ctx)):
            break
        count -= 1
    return _with(workers, count=count)


def _repartitioned(ps: NodeGroup, count: int, state_mb: int, ctx: PlanningContext) -> NodeGroup:
    """``ps`` with ``count`` pods holding the plan's ``state_mb``: each takes a larger share.

    per-PS memory = runtime + ceil(state / count), rounded up to the memory step
    """
    memory = RUNTIME_MB + math.ceil(state_mb / count)
    memory = int(round_up(memory, ctx.node.memory_step_mb))
    return NodeGroup(count=count, cpu=ps.cpu, memory_mb=max(ps.memory_mb, memory))


def fit_to_quota(
    workers: NodeGroup,
    ps: NodeGroup,
    ctx: PlanningContext,
    *,
    drop_ps: bool = True,
    max_trim: float = MAX_CPU_TRIM,
) -> QuotaFit:
    """Cut ``workers`` and ``ps`` into the quota (module docstring); never above it when
    :attr:`QuotaFit.fits`. ``drop_ps`` false keeps the PS count (a running job's post-scaling
    does not migrate its rows to make room); ``max_trim`` 0 gives up workers before any CPU
    (post-scaling: the pods it grows need the cores it gives them)."""
    original_w, original_p = workers, ps
    # 1. Workers, down to the minimum, unless a small CPU trim is enough.
    workers = _workers_to_keep(workers, ps, ctx, max_trim)
    # 2. CPU of every pod.
    if not ctx.fits(workers, ps):
        workers, ps = _shrink_cpu(workers, ps, ctx)
    # 3. PS, down to the minimum, each taking a larger share of the rows. The state is the
    # planned one, counted once: state = count₀ × (memory₀ − runtime).
    state_mb = original_p.count * max(0, original_p.memory_mb - RUNTIME_MB)
    while drop_ps and not ctx.fits(workers, ps) and ps.count > ctx.min_ps:
        fewer = _repartitioned(ps, ps.count - 1, state_mb, ctx)
        if fewer.memory_mb > ctx.node.max_memory_mb:
            break  # the rows no longer fit in a pod: fewer PS cannot hold them
        ps = fewer
        workers, ps = _shrink_cpu(workers, ps, ctx)
    return QuotaFit(
        workers=workers,
        ps=ps,
        fits=ctx.fits(workers, ps),
        workers_given_up=original_w.count - workers.count,
        ps_given_up=original_p.count - ps.count,
        cpu_cut=(workers.cpu, ps.cpu) != (original_w.cpu, original_p.cpu),
    )


def require_quota_fit(workers: NodeGroup, ps: NodeGroup, ctx: PlanningContext) -> QuotaFit:
    """:func:`fit_to_quota`, raising :class:`InfeasiblePlanError` when the result is still
    above the quota: the message names the quota and the smallest job that was tried."""
    fitted = fit_to_quota(workers, ps, ctx)
    if not fitted.fits:
        w, p = fitted.workers, fitted.ps
        raise InfeasiblePlanError(
            f"the quota (cpu {ctx.quota_cpu:g}, memory {ctx.quota_memory_mb}Mi) cannot hold "
            f"the smallest job: {w.count} worker(s) of {w.cpu:g} cpu / {w.memory_mb}Mi and "
            f"{p.count} PS of {p.cpu:g} cpu / {p.memory_mb}Mi (cpu "
            f"{w.total_cpu + p.total_cpu:g}, memory {w.total_memory_mb + p.total_memory_mb}Mi); "
            f"raise resources.limits or lower elastic.min_workers / min_ps"
        )
    return fitted


def resume_within_quota(workers: NodeGroup, ps: NodeGroup, ctx: PlanningContext) -> QuotaFit:
    """The shape a resumed run goes on at: its checkpoint's, within the spec as it is now.

    The spec may have changed since the checkpoint (``resources.limits`` lowered, the elastic
    bounds moved): the workers come within ``[min_workers, max_workers]``, then the whole is
    cut into the quota as a running job's post-scaling cuts it (:func:`fit_to_quota` keeping
    the PS count, whose rows the checkpoint holds). ``fits`` false: even so it is above the
    quota (the caller refuses the resume, naming ``resources.limits``)."""
    count = min(max(workers.count, ctx.min_workers), ctx.max_workers)
    bounded = _with(workers, count=count)
    fitted = fit_to_quota(bounded, ps, ctx, drop_ps=False)
    return dataclasses.replace(fitted, workers_given_up=workers.count - fitted.workers.count)


class BelowMinimumError(UserInputError):
    """A plan gives a role less memory than the model needs, or more than the job's quota:
    its pods would be OOM-killed at start, or the plan breaks the user's own limit."""


def memory_shortfalls(
    workers: NodeGroup,
    ps: NodeGroup,
    ctx: PlanningContext,
    keys: tuple[str, str] = ("workers", "ps"),
) -> list[str]:
    """Each role whose pods have less memory than the model's footprint needs, with the given
    and the needed memory ([] when both roles have enough); ``keys`` name the roles (the
    spec's keys when the plan is the spec's own resources).

    The needs are :mod:`dlrover_kfp.core.footprint`'s, as the planner reads them from the
    context: a worker's runtime, dense parameters and one batch's activations; a PS's runtime
    and its share of the embedding rows (weights, Adagrad slots, the snapshot copy), which
    shrinks as PS are added.
    """
    # The planner's figures carry RUNTIME_MB's margin; a refusal uses the measured low end.
    slack = RUNTIME_MB - RUNTIME_MIN_MB
    out = []
    worker_bar = ctx.worker_memory_need_mb - slack
    if workers.memory_mb < worker_bar:
        out.append(
            f"{keys[0]}: {workers.memory_mb}Mi each, but a worker of this model needs at least "
            f"{worker_bar}Mi (runtime, dense parameters and one batch)"
        )
    need = ctx.ps_memory_floor_mb(ps.count) - slack
    if ps.memory_mb < need:
        more = min(ctx.max_ps, max(ps.count + 1, ps.count * 2))
        hint = (
            f"; with {more} PS each needs {ctx.ps_memory_floor_mb(more) - slack}Mi"
            if more > ps.count
            else ""
        )
        out.append(
            f"{keys[1]}: {ps.memory_mb}Mi each, but with {ps.count} PS each needs at least "
            f"{need}Mi (runtime and its share of the {ctx.ps_state_mb}Mi of embedding rows, "
            f"optimizer slots and snapshot){hint}"
        )
    return out


def require_runnable(
    workers: NodeGroup,
    ps: NodeGroup,
    ctx: PlanningContext,
    *,
    limits: Quota | None,
    source: str,
    keys: tuple[str, str] = ("workers", "ps"),
) -> None:
    """The one check of a plan before its pods start; raises :class:`BelowMinimumError`
    naming ``source`` (where the plan came from), each role short of memory with the given and
    the needed figure, and a total above ``limits`` (the spec's ``resources.limits``).

    Only the user's own quota is checked, not a default or a machine's capacity: those cap
    what the planner plans, while a user's own resources above them only run slower."""
    problems = memory_shortfalls(workers, ps, ctx, keys)
    if limits is not None:
        cpu = workers.total_cpu + ps.total_cpu
        memory = workers.total_memory_mb + ps.total_memory_mb
        if cpu > limits.cpu + 1e-9 or memory > limits.memory:
            problems.append(
                f"the plan holds cpu {cpu:g} and memory {memory}Mi, more than "
                f"resources.limits (cpu {limits.cpu:g}, memory {limits.memory}Mi)"
            )
    if problems:
        raise BelowMinimumError(f"{source}: {'; '.join(problems)}; no pod was started")


def at_least_minimum(group: NodeGroup, role: str, ctx: PlanningContext) -> NodeGroup:
    """``group`` with at least the memory its role needs: what Stage 3 cuts (a growth capped
    to the room left in the quota) never goes below the model's own footprint."""
    need = ctx.worker_memory_need_mb if role == "worker" else ctx.ps_memory_floor_mb(group.count)
    if group.memory_mb >= need:
        return group
    return NodeGroup(count=group.count, cpu=group.cpu, memory_mb=need)


__all__ = [
    "MAX_CPU_TRIM",
    "OVER_QUOTA",
    "BelowMinimumError",
    "QuotaFit",
    "at_least_minimum",
    "fit_to_quota",
    "memory_shortfalls",
    "over_quota",
    "require_quota_fit",
    "require_runnable",
    "resume_within_quota",
]
