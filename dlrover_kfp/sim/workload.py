"""A synthetic PS workload with a known throughput function, for closed-loop planning.

It is deliberately NOT the planner's model form: workers stop gaining from CPU beyond a thread
cap and gain sub-linearly below it, PS contention grows super-linearly in w/p, and PS have a
thread cap too. It also produces the CPU usage a real pod would show, which the planner reads.

    T(w, p, λw, λp) = base + c·B / min(λw, tw)^0.9 + s·(w/p)·B / min(λp, tp)
                      + r·(w/p)^1.3 + f·p
    X = w·B / T
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from dlrover_kfp.core.observation import Config
from dlrover_kfp.core.plan import ResourcePlan
from dlrover_kfp.core.profile import NodeSample, RuntimeSample


@dataclass(frozen=True)
class Truth:
    """Iteration time of a PS job as a function of its shape (see the module docstring).
    Defaults give a small DLRM: ~50k samples/s per worker core, a 6-thread worker."""

    batch: int = 512
    base: float = 2e-3
    compute: float = 4e-5  # core-seconds per sample on a worker
    worker_threads: float = 6.0
    ps_cost: float = 8e-6  # core-seconds per sample on a PS
    ps_threads: float = 8.0
    rtt: float = 1e-3
    fanout: float = 3e-4

    def parts(self, c: Config) -> tuple[float, float, float]:
        ew = min(c.worker_cpu, self.worker_threads)
        ep = min(c.ps_cpu, self.ps_threads)
        r = c.workers / c.ps
        compute_t = self.compute * self.batch / ew**0.9
        ps_t = self.ps_cost * r * self.batch / ep
        total = self.base + compute_t + ps_t + self.rtt * r**1.3 + self.fanout * c.ps
        return total, compute_t, ps_t

    def throughput(self, c: Config) -> float:
        return c.workers * self.batch / self.parts(c)[0]

    def usage(self, c: Config) -> tuple[float, float]:
        """Mean cores used per worker and per PS."""
        total, compute_t, ps_t = self.parts(c)
        ew = min(c.worker_cpu, self.worker_threads)
        ep = min(c.ps_cpu, self.ps_threads)
        return ew * compute_t / total, ep * min(1.0, ps_t / total)

    def samples(
        self, plan: ResourcePlan, start: float, n: int, rng: random.Random, noise: float = 0.03
    ) -> list[RuntimeSample]:
        c = Config(plan.workers.count, plan.ps.count, plan.workers.cpu, plan.ps.cpu)
        x = self.throughput(c)
        wu, pu = self.usage(c)
        out = []
        for i in range(n):
            xi = x * rng.gauss(1, noise)
            nodes = [
                NodeSample(
                    name=f"job-worker-{k}",
                    role="worker",
                    cpu_used=round(wu * rng.gauss(1, noise), 3),
                    cpu_requested=c.worker_cpu,
                    memory_used_mb=plan.workers.memory_mb // 2,
                    memory_requested_mb=plan.workers.memory_mb,
                    throughput=xi / c.workers,
                )
                for k in range(c.workers)
            ] + [
                NodeSample(
                    name=f"job-ps-{k}",
                    role="ps",
                    cpu_used=round(pu * rng.gauss(1, noise), 3),
                    cpu_requested=c.ps_cpu,
                    memory_used_mb=plan.ps.memory_mb // 2,
                    memory_requested_mb=plan.ps.memory_mb,
                )
                for k in range(c.ps)
            ]
            out.append(
                RuntimeSample(
                    time=start + 30.0 * i,
                    global_step=int(i * 100),
                    throughput=xi,
                    workers=c.workers,
                    ps=c.ps,
                    worker_cpu=c.worker_cpu,
                    ps_cpu=c.ps_cpu,
                    nodes=tuple(nodes),
                )
            )
        return out

    def best_within(
        self, quota_cpu: float, max_workers: int, max_ps: int, ladder: tuple[float, ...]
    ) -> tuple[Config, float]:
        """Brute force over the same space the planner searches (memory not binding)."""
        best = (Config(1, 1, ladder[0], ladder[0]), 0.0)
        for w, p, lw, lp in itertools.product(
            range(1, max_workers + 1), range(1, max_ps + 1), ladder, ladder
        ):
            c = Config(w, p, lw, lp)
            if c.total_cpu <= quota_cpu:
                x = self.throughput(c)
                if x > best[1]:
                    best = (c, x)
        return best
