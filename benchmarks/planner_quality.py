"""Planner quality figures for the issue's Must-show, printed per seed.

- Stage 2 from an under-provisioned start: rounds until >= 90% of the best throughput reachable
  within the quota (truth: dlrover_kfp/sim/workload.py, not of the model's form).
- Stage 2 from an over-provisioned start: share of the idle CPU given back, throughput kept.
- Warm start from 6 over-provisioned jobs (30% used): the plan against their request and peak.

    python benchmarks/planner_quality.py

Stage 2 runs with each objective (settings.py): "fastest" (floor 0.97, the default) and
"cost" (floor 0.9).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrover_kfp.core.plan import ResourcePlan
from dlrover_kfp.core.planner import PlannerSettings, context_from_spec, warm_start
from dlrover_kfp.core.planner.search import CPU_LADDER
from dlrover_kfp.sim.workload import Truth
from tests.unit.test_auto_scale import config, plan, run_loop
from tests.unit.test_warm_start import (
    NOW,
    SETTINGS,
    job_spec,
    over_provisioned_history,
)


def stage2(truth: Truth, settings: PlannerSettings) -> None:
    _, best = truth.best_within(64.0, 32, 8, CPU_LADDER)
    print("Stage 2, under-provisioned start 1w x 1cpu + 1ps x 1cpu, quota 64 cpu")
    for seed in range(1, 11):
        history = run_loop(
            truth, plan(1, 1.0, 1, 1.0), 64.0, rounds=10, seed=seed, settings=settings
        )
        share = [truth.throughput(config(h)) / best for h in history]
        reached = next((i for i, s in enumerate(share) if s >= 0.9), None)
        print(
            f"  seed {seed:2d}: >= 90% of best after {reached} rounds; after 5 rounds "
            f"{share[5]:.1%}, after 10 {share[10]:.1%} at {history[-1].total_cpu:g} cpu"
        )

    print("Stage 2, over-provisioned start 8w x 16cpu + 4ps x 8cpu (<= 8w, 4ps), quota 160 cpu")

    def idle(p: ResourcePlan) -> float:
        wu, pu = truth.usage(config(p))
        return p.workers.count * (p.workers.cpu - wu) + p.ps.count * (p.ps.cpu - pu)

    start = plan(8, 16.0, 4, 8.0)
    for seed in range(1, 11):
        history = run_loop(
            truth, start, 160.0, rounds=8, seed=seed, max_workers=8, max_ps=4, settings=settings
        )
        end = history[-1]
        kept = truth.throughput(config(end)) / truth.throughput(config(start))
        print(
            f"  seed {seed:2d}: gave back {1 - idle(end) / idle(start):.0%} of idle CPU, kept "
            f"{kept:.0%} throughput, ends at {config(end)}"
        )


def main() -> None:
    truth = Truth()
    base = PlannerSettings()
    for objective, floor in (("fastest", 0.97), ("cost", 0.9)):
        print(f"== objective {objective}, throughput floor {floor}")
        auto = dataclasses.replace(base.auto_scale, objective=objective, throughput_floor=floor)
        stage2(truth, dataclasses.replace(base, auto_scale=auto))  # type: ignore[arg-type]

    print("Warm start from 6 jobs that asked for 8w x 8cpu/16Gi + 4ps x 8cpu/32Gi and used 30%")
    jobs = over_provisioned_history()
    spec = job_spec(quota_cpu=128, quota_memory="512Gi")
    p = warm_start(spec, context_from_spec(spec, SETTINGS), jobs, SETTINGS, NOW)
    print(f"  plan: {p.workers} {p.ps}")
    print(
        f"  total cpu {p.total_cpu:g} of requested 96 ({p.total_cpu / 96:.0%}); memory "
        f"{p.total_memory_mb} of {8 * 16384 + 4 * 32768} MiB ({p.total_memory_mb / 262144:.0%})"
    )
    print(
        f"  peak use: worker {max(j.peak_worker_cpu for j in jobs):.2f} cpu / "
        f"{max(j.peak_worker_memory_mb for j in jobs)} MiB, "
        f"PS {max(j.peak_ps_cpu for j in jobs):.2f} cpu / "
        f"{max(j.peak_ps_memory_mb for j in jobs)} MiB"
    )
    print(f"  similar jobs named: {', '.join(p.similar_jobs)}")


if __name__ == "__main__":
    main()
