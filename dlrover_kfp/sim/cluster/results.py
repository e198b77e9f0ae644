"""From simulated outcomes to the figures the comparison reports.

* JCT is submission to completion (queueing included), over the jobs that completed; the
  completion rate says how many did, so a policy cannot look fast by failing its slow jobs.
* CPU (memory) utilisation is used / allocated, summed over every running pod and every step:
  the pod-time-weighted share of what jobs held that they used, the figure the paper and the
  DLRover blog report for production clusters (~20% before, 21-28% after for CPU).
* What each policy did, so that a figure can be traced to its cause: jobs warm-started from
  history, OOM kills and the self-inflicted ones among them (kills the user's own request would
  have avoided, :func:`~dlrover_kfp.sim.cluster.engine.request_would_hold`), single-pod
  relaunches and resizes; the jobs whose planner needs exceeded their quota (``infeasible_jobs``,
  counted by the policy: the run's outcomes do not say it).
* How good the plans are, apart from the cluster's luck: each started job's plan throughput on
  its truth (no stragglers, no hot PS) over the oracle's best within its quota
  (:mod:`~dlrover_kfp.sim.cluster.oracle`), for its final plan and for its plans weighted by the
  time each was in effect; the median and mean over jobs.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from dlrover_kfp.sim.cluster.engine import SimulationResult

METRICS = (
    "median_jct",
    "mean_jct",
    "p95_jct",
    "completion_rate",
    "cpu_utilization",
    "memory_utilization",
    "oom_failures",
    "self_inflicted_ooms",
    "infeasible_jobs",
    "warm_started",
    "relaunches",
    "resizes",
    "ps_resizes",
    "plan_vs_oracle_final",
    "plan_vs_oracle_timed",
)

#: Table labels of the metrics whose name does not say it.
LABELS = {
    "plan_vs_oracle_final": "plan X / oracle best (final)",
    "plan_vs_oracle_timed": "plan X / oracle best (time-weighted)",
}


@dataclass(frozen=True, slots=True)
class PolicySummary:
    policy: str
    jobs: int
    completed: int
    median_jct: float | None
    mean_jct: float | None
    p95_jct: float | None
    completion_rate: float
    cpu_utilization: float
    memory_utilization: float
    oom_failures: int
    resizes: int
    restarts: int
    #: jobs whose first plan came from the history of earlier jobs
    warm_started: int = 0
    #: OOM kills the user's own request would have avoided (a subset of ``oom_failures``)
    self_inflicted_ooms: int = 0
    #: jobs whose planner needs exceeded their quota at least once and that fell back instead
    #: (the user's request at the start, the plan kept or grown only within the quota in a
    #: stage); the policy counts them (``infeasible_jobs``; 0 for a policy without the count)
    infeasible_jobs: int = 0
    #: single pods relaunched (elastic policies); whole-job restarts are ``restarts``
    relaunches: int = 0
    #: the resizes among ``resizes`` that changed the PS (their count, CPU or memory), which
    #: an elastic policy pays ``FaultSettings.ps_resize_s`` for
    ps_resizes: int = 0
    #: jobs that never started (still queued when the simulation ended)
    never_started: int = 0
    #: mean seconds per job spent profiling configurations before training (Optimus)
    profile_s_per_job: float = 0.0
    #: pod failures by reason (OOMKilled, Evicted, Error, NodeLost), all jobs together
    failures: dict[str, int] = field(default_factory=dict)
    #: jobs that failed, by the reason of their last failure
    failed_jobs: dict[str, int] = field(default_factory=dict)
    #: median over started jobs of final plan throughput / oracle best in quota (truth, no
    #: stragglers); the ``_mean`` fields are the means
    plan_vs_oracle_final: float | None = None
    plan_vs_oracle_final_mean: float | None = None
    #: the same with the plans weighted by the time each was in effect
    plan_vs_oracle_timed: float | None = None
    plan_vs_oracle_timed_mean: float | None = None
    #: started jobs whose quota holds no configuration on the truth (the truth's memory for one
    #: worker and one PS does not fit): left out of the ``plan_vs_oracle`` figures
    no_oracle_jobs: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ratios(result: SimulationResult, attribute: str) -> list[float]:
    """Per started job whose quota fits a configuration: plan throughput / oracle best."""
    out = []
    for o in result.outcomes:
        value = getattr(o, attribute)
        if value is not None and o.oracle_best:
            out.append(value / o.oracle_best)
    return out


def summarize(result: SimulationResult) -> PolicySummary:
    jcts = [o.jct for o in result.outcomes if o.succeeded and o.jct is not None]
    final = _ratios(result, "final_plan_throughput")
    timed = _ratios(result, "mean_plan_throughput")
    cpu_alloc = sum(u.cpu_allocated for u in result.utilisation)
    mem_alloc = sum(u.memory_allocated_mb for u in result.utilisation)
    return PolicySummary(
        policy=result.policy,
        jobs=len(result.outcomes),
        completed=len(jcts),
        median_jct=statistics.median(jcts) if jcts else None,
        mean_jct=statistics.fmean(jcts) if jcts else None,
        p95_jct=float(np.percentile(jcts, 95)) if jcts else None,
        completion_rate=len(jcts) / len(result.outcomes) if result.outcomes else 0.0,
        cpu_utilization=(
            sum(u.cpu_used for u in result.utilisation) / cpu_alloc if cpu_alloc else 0.0
        ),
        memory_utilization=(
            sum(u.memory_used_mb for u in result.utilisation) / mem_alloc if mem_alloc else 0.0
        ),
        oom_failures=sum(o.oom_failures for o in result.outcomes),
        resizes=sum(o.resizes for o in result.outcomes),
        restarts=sum(o.restarts for o in result.outcomes),
        warm_started=sum(1 for o in result.outcomes if o.warm_started),
        self_inflicted_ooms=sum(o.self_inflicted_ooms for o in result.outcomes),
        relaunches=sum(o.relaunches for o in result.outcomes),
        ps_resizes=sum(o.ps_resizes for o in result.outcomes),
        never_started=sum(1 for o in result.outcomes if o.started_at is None),
        profile_s_per_job=(
            statistics.fmean(o.profile_s for o in result.outcomes) if result.outcomes else 0.0
        ),
        failures=dict(sorted(Counter(f for o in result.outcomes for f in o.failures).items())),
        failed_jobs=dict(
            sorted(
                Counter(
                    (o.failures[-1] if o.failures else "never finished")
                    for o in result.outcomes
                    if not o.succeeded
                ).items()
            )
        ),
        plan_vs_oracle_final=statistics.median(final) if final else None,
        plan_vs_oracle_final_mean=statistics.fmean(final) if final else None,
        plan_vs_oracle_timed=statistics.median(timed) if timed else None,
        plan_vs_oracle_timed_mean=statistics.fmean(timed) if timed else None,
        no_oracle_jobs=sum(
            1 for o in result.outcomes if o.final_plan_throughput is not None and not o.oracle_best
        ),
    )


@dataclass(frozen=True, slots=True)
class Spread:
    """Mean and spread (min, max, standard deviation) of one metric over seeds."""

    mean: float | None
    low: float | None
    high: float | None
    stdev: float | None

    def to_dict(self) -> dict[str, float | None]:
        return asdict(self)


def spread(values: Sequence[float | None]) -> Spread:
    known = [float(v) for v in values if v is not None]
    if not known:
        return Spread(None, None, None, None)
    sd = statistics.stdev(known) if len(known) > 1 else 0.0
    return Spread(statistics.fmean(known), min(known), max(known), sd)


def aggregate(per_seed: Sequence[Sequence[PolicySummary]]) -> dict[str, dict[str, Spread]]:
    """Per policy, per metric: the spread over seeds (``per_seed[i]`` is seed i's summaries)."""
    out: dict[str, dict[str, Spread]] = {}
    policies = [s.policy for s in per_seed[0]]
    for policy in policies:
        rows = [next(s for s in seed if s.policy == policy) for seed in per_seed]
        out[policy] = {m: spread([getattr(r, m) for r in rows]) for m in METRICS}
    return out


def _fmt(metric: str, value: float | None, *, unit: bool = True) -> str:
    if value is None:
        return "-"
    if metric.endswith("jct"):
        return f"{value / 60:.1f}" + (" min" if unit else "")
    if metric in ("completion_rate", "cpu_utilization", "memory_utilization"):
        return f"{100 * value:.1f}" + ("%" if unit else "")
    if metric.startswith("plan_vs_oracle"):
        return f"{value:.3f}"
    return f"{value:.0f}"


def format_table(table: dict[str, dict[str, Spread]], baseline: str = "manual") -> str:
    """A text table: mean (min-max) per metric, and the change against ``baseline``."""
    policies = list(table)
    rows: list[list[str]] = []
    for metric in METRICS:
        cells = []
        for p in policies:
            s = table[p][metric]
            text = _fmt(metric, s.mean)
            if s.low is not None and s.high is not None and s.high != s.low:
                low, high = _fmt(metric, s.low, unit=False), _fmt(metric, s.high, unit=False)
                text += f" ({low}-{high})"
            cells.append(text)
        rows.append(cells)
    widths = [2 + max(len(p), *(len(row[k]) for row in rows)) for k, p in enumerate(policies)]
    labels = [LABELS.get(metric, metric) for metric in METRICS]
    first = max(20, *(len(label) for label in labels))
    header = f"{'metric':<{first}}" + "".join(
        f"{p:>{w}}" for p, w in zip(policies, widths, strict=True)
    )
    lines = [header, "-" * len(header)]
    for label, cells in zip(labels, rows, strict=True):
        lines.append(
            f"{label:<{first}}" + "".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True))
        )
    if baseline in table:
        lines.append("")
        base = table[baseline]
        for p in policies:
            if p == baseline:
                continue
            parts = []
            b, v = base["median_jct"].mean, table[p]["median_jct"].mean
            if b and v is not None:
                parts.append(f"median JCT {100 * (v - b) / b:+.1f}%")
            for m, label in (
                ("completion_rate", "completion"),
                ("cpu_utilization", "CPU"),
                ("memory_utilization", "memory"),
            ):
                bm, vm = base[m].mean, table[p][m].mean
                if bm is not None and vm is not None:
                    parts.append(f"{label} {100 * (vm - bm):+.1f} pts")
            lines.append(f"{p} vs {baseline}: " + ", ".join(parts))
    return "\n".join(lines)
