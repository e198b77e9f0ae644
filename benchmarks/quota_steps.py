"""Plan-steps above the job's quota: every plan dlrover-kfp's planner emits in the cluster
simulator (Stage 1 at the start, Stage 3 after an instability or a failed pod, Stage 2's steps
and rollbacks), checked against the job's ``resources.limits``.

    python benchmarks/quota_steps.py [--jobs 500] [--seeds 3] [--families ...] [--regimes ...]

Prints one line per (family, regime, seed) with the plans checked and those above the quota
(each with its stage, its excess and its reason's head), then the totals. The check is the
quota itself, not the planner's own helpers: ``plan.total_cpu > limits.cpu`` or
``plan.total_memory_mb > limits.memory``.
"""

from __future__ import annotations

import argparse
import sys
import time

from dlrover_kfp.core.plan import ResourcePlan
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.sim.cluster.api import JobView, Role
from dlrover_kfp.sim.cluster.engine import ClusterSettings, FaultSettings, Simulation
from dlrover_kfp.sim.cluster.policies.planner import PlannerPolicy
from dlrover_kfp.sim.cluster.trace import cluster_size_for, in_regime, synthetic_trace

FAMILIES = ("ps-contention", "roofline", "trainer")


class CheckedPolicy(PlannerPolicy):
    """dlrover-kfp's policy, every plan it returns checked against its job's quota."""

    def __init__(self) -> None:
        super().__init__()
        self.plans = 0
        self.above: list[str] = []

    def _check(self, spec: JobSpec, plan: ResourcePlan | None) -> ResourcePlan | None:
        if plan is None:
            return None
        self.plans += 1
        limits = spec.resources.limits
        assert limits is not None
        cpu_over = plan.total_cpu - limits.cpu
        mem_over = plan.total_memory_mb - limits.memory
        if cpu_over > 1e-9 or mem_over > 0:
            self.above.append(
                f"{spec.name} {plan.stage}: cpu {plan.total_cpu:g}/{limits.cpu:g}, memory "
                f"{plan.total_memory_mb}/{limits.memory} Mi ({plan.reason[:90]})"
            )
        return plan

    def initial(self, spec: JobSpec, now: float) -> ResourcePlan:
        plan = super().initial(spec, now)
        self._check(spec, plan)
        return plan

    def decide(self, job: JobView) -> ResourcePlan | None:
        return self._check(job.spec, super().decide(job))

    def after_failure(self, job: JobView, role: Role, reason: str) -> ResourcePlan | None:
        return self._check(job.spec, super().after_failure(job, role, reason))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES))
    parser.add_argument("--regimes", nargs="+", default=["headroom", "request"])
    args = parser.parse_args(argv)
    plans = above = 0
    began = time.monotonic()
    for family in args.families:
        for regime in args.regimes:
            for seed in range(args.seeds):
                jobs = in_regime(synthetic_trace(args.jobs, seed, family=family), regime)
                nodes, cpu, memory = cluster_size_for(jobs)
                cluster = ClusterSettings(nodes=nodes, node_cpu=cpu, node_memory_mb=memory)
                policy = CheckedPolicy()
                Simulation(jobs, policy, cluster, FaultSettings(), seed=seed).run()
                plans += policy.plans
                above += len(policy.above)
                print(
                    f"{family:14s} {regime:8s} seed {seed}: {policy.plans} plans, "
                    f"{len(policy.above)} above the quota ({time.monotonic() - began:.0f}s)",
                    flush=True,
                )
                for line in policy.above[:5]:
                    print(f"    {line}", flush=True)
    print(f"total: {plans} plans, {above} above the quota")
    return 1 if above else 0


if __name__ == "__main__":
    sys.exit(main())
