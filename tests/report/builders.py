"""A profile as an elastic run records one: three plans, pods that come and go, every event."""

from __future__ import annotations

import dataclasses

from dlrover_kfp.core.plan import NodeGroup, Stage
from dlrover_kfp.core.profile import (
    AppliedPlan,
    JobEvent,
    JobProfile,
    LimitEnforcement,
    Metrics,
    NodeSample,
    Outcome,
    RuntimeSample,
)
from dlrover_kfp.core.spec import Quota
from tests.factories import make_profile

#: Reasons as the planner writes them, one with markup that the report must escape.
REASONS = (
    "cold start: no similar jobs in history; the spec's own resources",
    "auto-scale 1w x 1cpu + 1ps x 1cpu -> 2w x 1cpu + 1ps x 1cpu: model predicts +80% throughput",
    "hot PS <script>alert('ps')</script> & co: ps-0 at 95% of its CPU",
)
#: One event of each kind, with text that the report must escape.
EVENTS = (
    JobEvent(time=60.0, kind="scale", detail="auto-scale to 2 workers"),
    JobEvent(
        time=100.0,
        kind="straggler",
        node="ctr-daily-worker-0",
        detail="step time 2.1x the median <slow>",
    ),
    JobEvent(
        time=120.0,
        kind="migration",
        node="ctr-daily-ps-0",
        detail="PS 0 moved to new pods & re-partitioned",
    ),
    JobEvent(time=150.0, kind="oom", node="ctr-daily-worker-1", detail="OOMKilled (exit 137)"),
    JobEvent(
        time=151.0, kind="relaunch", node="ctr-daily-worker-1", detail="relaunched with 3072 MiB"
    ),
    JobEvent(time=170.0, kind="failure", node="ctr-daily-worker-1", detail='exit code 1 "crash"'),
)
#: samples/s at each plan's shape
THROUGHPUT = (10_000.0, 18_000.0, 24_000.0)


def _group(count: int, memory_mb: int = 2048) -> NodeGroup:
    return NodeGroup(count=count, cpu=1.0, memory_mb=memory_mb)


def elastic_profile(
    run_id: str = "ctr-daily-20261124T080000", started_at: str = "2026-11-24T08:00:00Z"
) -> JobProfile:
    """190 s of an elastic run: 1w+1ps (cold start), 2w+1ps at 60 s, 2w+2ps at 120 s."""
    base = make_profile(run_id, started_at=started_at, name="ctr-daily", samples=0)
    plans = (
        AppliedPlan(
            time=0.0, stage=Stage.COLD_START, reason=REASONS[0], workers=_group(1), ps=_group(1)
        ),
        AppliedPlan(
            time=60.0, stage=Stage.AUTO_SCALE, reason=REASONS[1], workers=_group(2), ps=_group(1)
        ),
        AppliedPlan(
            time=120.0, stage=Stage.POST_SCALE, reason=REASONS[2], workers=_group(2), ps=_group(2)
        ),
    )
    samples = []
    for i, t in enumerate(range(5, 190, 5)):
        stage = 0 if t < 60 else 1 if t < 120 else 2
        plan = plans[stage]
        throughput = 0.0 if t < 10 else THROUGHPUT[stage] * (1 + 0.02 * ((i % 3) - 1))
        nodes = [
            NodeSample(
                name=f"ctr-daily-worker-{k}",
                role="worker",
                cpu_used=0.8,
                cpu_requested=1.0,
                memory_used_mb=900 + 10 * i,
                memory_requested_mb=3072 if (k == 1 and t > 151) else 2048,
                throughput=throughput / plan.workers.count,
            )
            for k in range(plan.workers.count)
        ]
        ps_names = ["ctr-daily-ps-0"] if stage < 2 else ["ctr-daily-ps-0-g1", "ctr-daily-ps-1-g1"]
        nodes += [
            NodeSample(
                name=name,
                role="ps",
                cpu_used=0.95 if stage == 1 else 0.5,
                cpu_requested=1.0,
                memory_used_mb=600,
                memory_requested_mb=2048,
            )
            for name in ps_names
        ]
        samples.append(
            RuntimeSample(
                time=float(t),
                global_step=i * 10,
                throughput=throughput,
                workers=plan.workers.count,
                ps=plan.ps.count,
                worker_cpu=1.0,
                ps_cpu=1.0,
                nodes=tuple(nodes),
                loss=0.5,
            )
        )
    resources = base.job.resources
    assert resources is not None
    quota = Quota(cpu=4, memory=16 * 2**30)
    job = dataclasses.replace(base.job, resources=dataclasses.replace(resources, limits=quota))
    return JobProfile(
        run_id=run_id,
        started_at=started_at,
        job=job,
        outcome=Outcome(status="succeeded", jct_seconds=190.0, samples_processed=3_000_000),
        plans=plans,
        samples=tuple(samples),
        events=EVENTS,
        metrics=Metrics(loss=0.4321, auc=0.8123),
        limits=LimitEnforcement(cpu=True, detail="cgroup v2"),
    )
