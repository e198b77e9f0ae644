"""How much of the distance from dlrover-kfp's plans to the oracle's best is memory estimation.

    python benchmarks/memory_bound.py [--family roofline] [--quota request] [--jobs 500]
                                      [--seeds 3] [--processes 2]

The oracle sizes every pod to the truth's memory (a worker's use, the largest PS's at the end of
the job): no planner knows it. dlrover-kfp's Stage 2 sizes them from what it measured, with
margins (a worker's peak x 1.15 in 64 MiB steps; the PS' growth projected by a straight line
from its latest readings, x 1.2), so at a quota equal to the user's request, where memory is
often the binding share, it fits fewer pods than the oracle. Each seed runs dlrover-kfp as it is
("planner") and with Stage 2 told the truth's memory, every decision, in four variants:

- "workers told": the workers' memory is the truth's (no margin, no rounding);
- "PS told": the PS' state is the truth's at the end of the job, hot shard and flash-checkpoint
  snapshot included (what the oracle gives every PS);
- "both told".

Warm start and Stage 3 are as they are. The variants are bounds, not policies: they read the
truth, which the simulator keeps from every policy; the benchmark does so by replacing Stage 2's
memory rule (``auto_scale.memory_needs``) in its own processes. Printed: the median over the
jobs of the final plan's throughput on the truth / the oracle's best in the quota (the results
tables' "plan X / oracle best (final)"), median JCT and self-inflicted OOM kills per seed.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import os
import platform
import statistics
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrover_kfp.core.plan import ResourcePlan
from dlrover_kfp.core.planner.context import PlanningContext
from dlrover_kfp.core.planner.search import MemoryNeeds
from dlrover_kfp.core.planner.settings import AutoScaleSettings, MemoryGrowthSettings
from dlrover_kfp.core.profile import RuntimeSample
from dlrover_kfp.sim.cluster.engine import ClusterSettings, FaultSettings
from dlrover_kfp.sim.cluster.oracle import worker_need_mb
from dlrover_kfp.sim.cluster.runner import run_policy
from dlrover_kfp.sim.cluster.trace import (
    FAMILIES,
    QUOTA_REGIMES,
    QuotaRegime,
    TraceJob,
    cluster_size_for,
    in_regime,
    synthetic_trace,
)
from dlrover_kfp.sim.cluster.truth import MemoryTruth

VARIANTS = ("planner", "workers told", "PS told", "both told")


def _job_id(samples: Sequence[RuntimeSample]) -> str | None:
    """The job a Stage-2 decision is for: its pods are named ``<job>-<role>-<index>``."""
    if not samples or not samples[-1].nodes:
        return None
    return samples[-1].nodes[0].name.rsplit("-", 2)[0]


def _tell_memory(jobs: Sequence[TraceJob], variant: str) -> None:
    """Replace Stage 2's memory rule in this process by one told ``jobs``' truths."""
    if variant == "planner":
        return
    module = importlib.import_module("dlrover_kfp.core.planner.auto_scale")
    measured = module.memory_needs
    truths: dict[str, MemoryTruth] = {job.id: job.truth.memory for job in jobs}

    def told(
        ctx: PlanningContext,
        current: ResourcePlan,
        samples: Sequence[RuntimeSample],
        s: AutoScaleSettings,
        g: MemoryGrowthSettings,
    ) -> tuple[MemoryNeeds, str]:
        needs, change = measured(ctx, current, samples, s, g)
        truth = truths.get(_job_id(samples) or "")
        if truth is None:
            return needs, change
        if variant in ("workers told", "both told"):
            needs = dataclasses.replace(needs, worker_mb=worker_need_mb(truth))
        if variant in ("PS told", "both told"):
            # every PS holds the largest one's share, p of them: oracle.ps_need_mb in
            # MemoryNeeds' form (runtime + state / p), for any p of 2 or more
            state = truth.ps_total_mb(1.0) * (1 + truth.imbalance) + truth.snapshot_mb
            needs = dataclasses.replace(needs, ps_state_mb=math.ceil(state))
        return needs, change

    setattr(module, "memory_needs", told)  # noqa: B010 (mypy: a module has no such attribute)


def _run(
    family: str, quota: QuotaRegime, jobs_n: int, seed: int, variant: str
) -> tuple[float, ...]:
    jobs = synthetic_trace(jobs_n, seed, family=family)
    nodes, cpu, memory = cluster_size_for(jobs)
    cluster = ClusterSettings(nodes=nodes, node_cpu=cpu, node_memory_mb=memory)
    jobs = in_regime(jobs, quota)
    _tell_memory(jobs, variant)
    summary, _, _ = run_policy("dlrover-kfp", jobs, cluster, FaultSettings(), seed)
    return (
        summary.plan_vs_oracle_final or 0.0,
        (summary.median_jct or 0.0) / 60,
        float(summary.self_inflicted_ooms),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--family", default="roofline", choices=FAMILIES)
    parser.add_argument("--quota", default="request", choices=QUOTA_REGIMES)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    print(f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"{args.family}, quota {args.quota}, {args.jobs} jobs, seeds 0-{args.seeds - 1}")
    runs = [(v, s) for v in VARIANTS for s in range(args.seeds)]
    # one run per process: a run replaces Stage 2's memory rule for the rest of its process
    with ProcessPoolExecutor(args.processes, max_tasks_per_child=1) as pool:
        futures = {
            run: pool.submit(_run, args.family, args.quota, args.jobs, run[1], run[0])
            for run in runs
        }
        results = {run: f.result() for run, f in futures.items()}
    print(f"{'':14s} {'plan X / oracle best (final), per seed':>42s}  median JCT min  self-OOM")
    for variant in VARIANTS:
        rows = [results[(variant, s)] for s in range(args.seeds)]
        plans = " / ".join(f"{r[0]:.3f}" for r in rows)
        mean = statistics.fmean(r[0] for r in rows)
        jct = " / ".join(f"{r[1]:.1f}" for r in rows)
        ooms = " / ".join(f"{r[2]:.0f}" for r in rows)
        print(f"{variant:14s} {plans:>32s} (mean {mean:.3f})  {jct}  {ooms}")


if __name__ == "__main__":
    main()
