"""Search the configurations a job may run with for the best one and the one to aim for.

Shared by warm start (with a model fitted on history) and auto-scaling (with a model fitted on
the running job). The space is small enough to evaluate whole: workers x PS x a ladder of CPU
sizes per role, a few tens of thousands of points, vectorised in numpy in about a millisecond.

    best    = argmax_c  X(c)                       over feasible c (quota, elastic bounds)
    cost(c) = max(cpu(c) / quota_cpu, memory(c) / quota_memory)   (dominant share)

and the target, by the objective (:class:`Objective`):

    "cost":    target = argmax_c X(c) / cost(c)  s.t. X(c) >= floor · X(best)
    "fastest": target = argmin_c cost(c)         s.t. X(c) >= floor · X(best)

"cost" is DLRover-RM's: the most throughput per unit of resource, with a floor so that a job
is not starved for efficiency's sake. "fastest" with a floor near 1 is the throughput-first
planner: the cheapest configuration that is nearly as fast as the best.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from dlrover_kfp.core.observation import Config
from dlrover_kfp.core.perf_model import PerfModel
from dlrover_kfp.core.planner.context import PlanningContext
from dlrover_kfp.core.planner.settings import Objective
from dlrover_kfp.errors import PermanentError

#: Per-pod CPU sizes the search considers (cores), besides the current ones, the caps and the
#: first ``FINE_STEPS`` multiples of the node's CPU step (small pods differ by a step).
CPU_LADDER = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0)
FINE_STEPS = 8


class InfeasiblePlanError(PermanentError):
    """No configuration fits the quota with the memory the job needs."""


@dataclass(frozen=True, slots=True)
class MemoryNeeds:
    """Memory per pod a plan must give (MiB). PS memory shrinks as PS are added:

    ps_memory(p) = ps_fixed_mb + ps_state_mb / p
    """

    worker_mb: int
    ps_fixed_mb: int
    ps_state_mb: int
    ps_min_mb: int = 0

    def ps_mb(self, ps_count: int) -> int:
        return max(
            self.ps_min_mb, self.ps_fixed_mb + math.ceil(self.ps_state_mb / max(1, ps_count))
        )

    def total_mb(self, workers: int, ps: int) -> int:
        """MiB of ``workers`` workers and ``ps`` PS together."""
        return workers * self.worker_mb + ps * self.ps_mb(ps)


@dataclass(frozen=True, slots=True)
class CpuBounds:
    """Floors that measured usage sets on each role's CPU, whatever the model says.

    A role's pods together spend ``c`` core-seconds per sample, measured where the job ran
    (``c = n · u / X``: ``n`` pods each using ``u`` cores at ``X`` samples/s; the largest seen,
    usage.py). No plan processes X samples/s with fewer cores than ``c · X``, so plans keep

        w · λw >= cw · X · (1 + headroom)        p · λp >= cp · X · (1 + ps_headroom)

    for the predicted throughput X. The floor is on a role's cores in all, not per pod: a
    worker that uses 5 of its 8 cores needs 5 at its present share of the samples, and 2.5 when
    twice as many workers split them. (A per-pod floor, λw >= u · (1 + headroom), held every
    plan at the present pod size or above, whatever the worker count: it ruled out the smaller,
    more numerous workers that give more throughput per core.) Averages understate bursts, so
    usage is a floor, never a cap: whether fewer cores than given are enough is learned by
    measuring (auto_scale's probes and the judgement of each step).

    The margins (settings.AutoScaleSettings idle_headroom and ps_demand_headroom say how each
    is set and measured) differ by role: a worker that waits for its PS part of each step uses
    less on average than it needs while computing; a PS computes whenever a request waits.
    """

    worker_cores_per_sample: float | None = None
    ps_cores_per_sample: float | None = None
    headroom: float = 0.25
    ps_headroom: float = 0.10
    #: Per-pod CPU above which a role was measured to gain nothing (usage.cpu_saturation):
    #: bigger pods are not considered.
    worker_cap: float | None = None
    ps_cap: float | None = None


@dataclass(frozen=True, slots=True)
class Correction:
    """What a failed move measured, laid over the model in the direction it moved.

    A growth step from ``base`` to ``failed`` that measured less than the model predicts for
    it shows where the model is wrong: the job's own contention, a noisy node, a cliff the
    model's form cannot draw. Every configuration that goes further than ``base`` in *each*
    dimension the failed step grew (more workers, more PS, more CPU per worker or per PS) is
    predicted with the model's change from ``base`` scaled by what the step measured of it:

        X'(c) = X̂(base) + ratio · (X̂(c) − X̂(base))   if c > base in every grown dimension
        ratio = (g_m − 1) / (ĝ − 1),  clamped to [−1, 1]
        g_m = X_m(failed) / X_m(base) (measured),  ĝ = X̂(failed) / X̂(base) (the model, ĝ > 1)

    so X'(failed) reproduces the measurement, a step that lost (g_m < 1) makes every point
    beyond it predicted below ``base``, and a point in that direction is a candidate again
    only where the model's gain, scaled so, still clears ``needed`` (the step's threshold).
    Another direction (more CPU where workers were added) keeps the model's word."""

    base: Config
    failed: Config
    ratio: float
    #: the gain over ``base`` a point in the direction must still promise, corrected
    needed: float = 0.0

    @property
    def grows(self) -> bool:
        """Whether the failed step grew any dimension (a give-back's failure says nothing of
        growth, and is not laid over the model)."""
        b, f = self.base, self.failed
        return (
            f.workers > b.workers
            or f.ps > b.ps
            or f.worker_cpu > b.worker_cpu + 1e-9
            or f.ps_cpu > b.ps_cpu + 1e-9
        )

    def applies(self, c: Config) -> bool:
        return bool(self._grown(c.workers, c.ps, c.worker_cpu, c.ps_cpu))

    def _grown(self, w: object, p: object, lw: object, lp: object) -> object:
        """``c > base`` in every dimension the failed step grew (numpy arrays or scalars)."""
        b, f = self.base, self.failed
        if f.workers > b.workers:  # the step bet on more workers: that is its direction
            return self.grows & (w > b.workers)  # type: ignore[operator]
        out: object = self.grows
        for grew, now, was in (
            (f.ps > b.ps, p, b.ps),
            (f.worker_cpu > b.worker_cpu + 1e-9, lw, b.worker_cpu + 1e-9),
            (f.ps_cpu > b.ps_cpu + 1e-9, lp, b.ps_cpu + 1e-9),
        ):
            if grew:
                out = out & (now > was)  # type: ignore[operator]
        return out

    def corrected(self, x: float, x_base: float, c: Config) -> float:
        """The model's rate ``x`` at ``c`` with this correction (``x_base``: at the base)."""
        return x_base + self.ratio * (x - x_base) if self.applies(c) else x


@dataclass(frozen=True, slots=True)
class Candidate:
    config: Config
    worker_memory_mb: int
    ps_memory_mb: int
    throughput: float
    cost: float

    @property
    def total_cpu(self) -> float:
        return self.config.total_cpu

    @property
    def total_memory_mb(self) -> int:
        c = self.config
        return c.workers * self.worker_memory_mb + c.ps * self.ps_memory_mb


@dataclass(frozen=True, slots=True)
class SearchResult:
    best: Candidate
    target: Candidate


def _ladder(ctx: PlanningContext, extra: Sequence[float], cap: float | None) -> np.ndarray:
    node = ctx.node
    values = {v for v in CPU_LADDER if node.min_cpu <= v <= node.max_cpu}
    values.update(
        k * node.cpu_step
        for k in range(1, FINE_STEPS + 1)
        if node.min_cpu <= k * node.cpu_step <= node.max_cpu
    )
    values.update(v for v in extra if node.min_cpu <= v <= node.max_cpu)
    if cap is not None:
        values = {v for v in values if v <= cap + 1e-9} or {min(values)}
    return np.array(sorted(values), dtype=float)


def search(
    model: PerfModel,
    ctx: PlanningContext,
    memory: MemoryNeeds,
    bounds: CpuBounds,
    floor: float,
    include: Sequence[Config] = (),
    objective: Objective = "fastest",
    cpu_limit: float | None = None,
    upper: Config | None = None,
    exclude: Collection[Config] = (),
    corrections: Sequence[Correction] = (),
) -> SearchResult:
    """Best and target candidates over the whole feasible space (see module docstring).

    ``exclude`` removes configurations from the space (ones measurement already rejected).

    ``corrections`` lay what failed moves measured over the model (:class:`Correction`).

    ``cpu_limit`` and ``upper`` narrow the space to a trust region without changing what a
    core costs: at most ``cpu_limit`` cores in all, and at most ``upper``'s counts and CPU per
    pod in each role.

    The quota wins over usage floors: a floor that no configuration in the quota meets is
    dropped (the plan is then below observed use, and its predicted rate says so).
    """
    w_values = np.arange(ctx.min_workers, ctx.max_workers + 1)
    p_values = np.arange(ctx.min_ps, ctx.max_ps + 1)
    lw_values = _ladder(ctx, [c.worker_cpu for c in include], bounds.worker_cap)
    lp_values = _ladder(ctx, [c.ps_cpu for c in include], bounds.ps_cap)
    w, p, lw, lp = (a.ravel() for a in np.meshgrid(w_values, p_values, lw_values, lp_values))
    ps_mem = np.array([memory.ps_mb(int(n)) for n in p_values])[p - ctx.min_ps]
    cpu = w * lw + p * lp
    mem = w * memory.worker_mb + p * ps_mem
    limit = ctx.quota_cpu if cpu_limit is None else min(ctx.quota_cpu, cpu_limit)
    feasible = (cpu <= limit + 1e-9) & (mem <= ctx.quota_memory_mb)
    if upper is not None:
        feasible &= (w <= upper.workers) & (p <= upper.ps)
        feasible &= (lw <= upper.worker_cpu + 1e-9) & (lp <= upper.ps_cpu + 1e-9)
    for c in exclude:
        feasible &= ~(
            (w == c.workers) & (p == c.ps) & np.isclose(lw, c.worker_cpu) & np.isclose(lp, c.ps_cpu)
        )
    if not feasible.any():
        raise InfeasiblePlanError(
            f"no configuration fits the quota (cpu {ctx.quota_cpu:g}, memory "
            f"{ctx.quota_memory_mb}Mi): one worker needs {memory.worker_mb}Mi and one PS "
            f"{memory.ps_mb(ctx.min_ps)}Mi"
        )
    w, p, lw, lp, ps_mem, cpu, mem = (a[feasible] for a in (w, p, lw, lp, ps_mem, cpu, mem))
    x = model.throughput_many(w, p, lw, lp, ctx.batch_size)
    # A direction a failed step measured worse in (Correction) keeps only the points whose
    # corrected rate still clears the correction's gain over its base. The others go before
    # the usage floors below, which would otherwise keep exactly those (a lower rate needs
    # fewer cores) and drop the rest of the space.
    keep = np.ones_like(x, dtype=bool)
    for k in corrections:
        x_base = model.throughput(k.base, ctx.batch_size)
        corrected = x_base + k.ratio * (x - x_base)
        keep &= ~(np.asarray(k._grown(w, p, lw, lp)) & (corrected < (1 + k.needed) * x_base))
    if keep.any():
        w, p, lw, lp, ps_mem, cpu, mem, x = (a[keep] for a in (w, p, lw, lp, ps_mem, cpu, mem, x))
    # Usage floors (CpuBounds), role by role: n · λ >= c · X · (1 + headroom). A floor no
    # candidate meets is left out (the quota wins over usage; the plan says so by its rate).
    for role, per_sample in (
        ("worker", bounds.worker_cores_per_sample),
        ("ps", bounds.ps_cores_per_sample),
    ):
        if per_sample is None:
            continue
        role_cpu, margin = (
            (w * lw, bounds.headroom) if role == "worker" else (p * lp, bounds.ps_headroom)
        )
        enough = role_cpu >= per_sample * x * (1 + margin)
        if enough.any():
            w, p, lw, lp, ps_mem, cpu, mem, x = (
                a[enough] for a in (w, p, lw, lp, ps_mem, cpu, mem, x)
            )
    cost = np.maximum(cpu / ctx.quota_cpu, mem / ctx.quota_memory_mb)
    i_best = int(np.argmax(x))
    near = np.flatnonzero(x >= floor * x[i_best])
    if objective == "cost":
        # most throughput per unit of cost; among equals, the fastest
        order = np.lexsort((-x[near], -np.round(x[near] / cost[near], 9)))
    else:
        # cheapest near-best; among equally cheap, the fastest
        order = np.lexsort((-x[near], np.round(cost[near], 9)))
    i_target = int(near[order[0]])

    def candidate(i: int) -> Candidate:
        return Candidate(
            config=Config(int(w[i]), int(p[i]), float(lw[i]), float(lp[i])),
            worker_memory_mb=memory.worker_mb,
            ps_memory_mb=int(ps_mem[i]),
            throughput=float(x[i]),
            cost=float(cost[i]),
        )

    return SearchResult(best=candidate(i_best), target=candidate(i_target))
