"""The quickstart: scheduled retraining of a daily CTR job, several rounds, on embedded defaults.

Each round plans the job from the SQLite history (cold start the first time: the user's own,
over-provisioned guess), runs it, and records its profile, so that the next round warm-starts
from what this one used. Until the DLRM trainer lands, a round runs the job in simulated time
against a synthetic workload with a known throughput function (dlrover_kfp.sim): the planner,
the auto-scaling loop and the history store are the real ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dlrover_kfp.core.plan import NodeGroup, ResourcePlan
from dlrover_kfp.core.planner import PlannerSettings
from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.core.summary import format_timestamp
from dlrover_kfp.planning import plan_job_with_history
from dlrover_kfp.ports import Clock, FixedClock, HistoryStore
from dlrover_kfp.sim.job import simulate_job
from dlrover_kfp.sim.workload import Truth

DAY_S = 86400.0

#: The job a platform team might run every night: 26 tables, a day of logs, and the resources
#: a user typically asks for -- far more CPU per pod than the trainer can use.
QUICKSTART_SPEC = JobSpec(
    name="ctr-daily",
    scenario="ads-ctr-quickstart",
    model={  # type: ignore[arg-type]
        "embedding_dim": 16,
        "table_sizes": [100_000, 50_000, 50_000, 20_000, 10_000, 10_000, 5_000, 5_000]
        + [1_000] * 8
        + [100] * 10,
    },
    data={"format": "synthetic", "rows": 400_000_000, "seed": 1},  # type: ignore[arg-type]
    training={"batch_size": 512, "epochs": 1},  # type: ignore[arg-type]
    resources={  # type: ignore[arg-type]
        "limits": {"cpu": 128, "memory": "512Gi"},
        "workers": {"count": 8, "cpu": 8, "memory": "16Gi"},
        "ps": {"count": 4, "cpu": 8, "memory": "32Gi"},
    },
    elastic={"max_workers": 32, "max_ps": 8},  # type: ignore[arg-type]
)


@dataclass(frozen=True, slots=True)
class RoundResult:
    round: int
    plan: ResourcePlan
    profile: JobProfile
    new: bool

    @property
    def final(self) -> tuple[NodeGroup, NodeGroup]:
        last = self.profile.plans[-1]
        return last.workers, last.ps

    @property
    def cpu_utilization(self) -> float:
        """CPU used / requested over the whole run, all pods together."""
        used = sum(n.cpu_used for s in self.profile.samples for n in s.nodes)
        given = sum(n.cpu_requested for s in self.profile.samples for n in s.nodes)
        return used / given if given else 0.0

    @property
    def resizes(self) -> int:
        return len(self.profile.plans) - 1


def run_quickstart(
    store: HistoryStore,
    clock: Clock,
    rounds: int,
    progress: Callable[[str], None],
    spec: JobSpec = QUICKSTART_SPEC,
    settings: PlannerSettings | None = None,
) -> list[RoundResult]:
    settings = settings or PlannerSettings()
    truth = Truth(batch=spec.training.batch_size)
    results = []
    start = clock.now() - rounds * DAY_S
    for r in range(1, rounds + 1):
        day = start + (r - 1) * DAY_S

        plan, known = plan_job_with_history(spec, store, FixedClock(day), settings)
        progress(f"round {r}/{rounds}: {plan.stage.value}: {plan.reason}")
        profile = simulate_job(
            spec,
            plan,
            truth,
            run_id=f"{spec.name}-{int(day)}",
            started_at=format_timestamp(day),
            seed=r,
            settings=settings,
            known=known,
        )
        new = store.record(profile)
        result = RoundResult(round=r, plan=plan, profile=profile, new=new)
        progress(
            f"round {r}/{rounds}: {profile.outcome.status} in "
            f"{profile.outcome.jct_seconds / 60:.1f} min, {result.resizes} resize(s), "
            f"CPU utilisation {result.cpu_utilization:.0%}"
        )
        results.append(result)
    return results


def _shape(w: NodeGroup, p: NodeGroup) -> str:
    return f"{w.count}x{w.cpu:g}cpu + {p.count}x{p.cpu:g}cpu"


def format_table(results: list[RoundResult]) -> str:
    head = (
        f"{'round':>5}  {'stage':<11}  {'starts with':<24}  {'ends with':<24}  "
        f"{'resizes':>7}  {'JCT min':>7}  {'CPU util':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        w, p = r.final
        lines.append(
            f"{r.round:>5}  {r.plan.stage.value:<11}  {_shape(r.plan.workers, r.plan.ps):<24}  "
            f"{_shape(w, p):<24}  {r.resizes:>7}  {r.profile.outcome.jct_seconds / 60:>7.1f}  "
            f"{r.cpu_utilization:>8.0%}"
        )
    return "\n".join(lines)


__all__ = ["QUICKSTART_SPEC", "RoundResult", "format_table", "run_quickstart"]
