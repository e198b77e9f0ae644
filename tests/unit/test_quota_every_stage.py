"""Every plan a running job's stages emit fits its quota (``resources.limits``), checked
against the quota itself, not the planner's helpers: Stage 3 answering an OOM kill, and
Stage 2 rolling a step back while the PS' measured memory growth raises what they need.

Found in the simulator (benchmarks/quota_steps.py): Stage 3 raised an OOM-killed PS to its own
footprint after fitting the quota (0.9-4.8% above it), and Stage 2's rollback raised the PS'
memory with no fit at all."""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given, reject, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dlrover_kfp.core.footprint import RUNTIME_MB
from dlrover_kfp.core.plan import NodeGroup, ResourcePlan, Stage
from dlrover_kfp.core.planner import (
    Instability,
    PlannerSettings,
    ScalingStep,
    auto_scale,
    context_from_spec,
    post_scale,
)
from dlrover_kfp.core.planner.quota import require_runnable
from dlrover_kfp.core.profile import JobEvent, NodeSample, RuntimeSample
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.errors import SpecError, UserInputError
from dlrover_kfp.sim.workload import Truth

SETTINGS = PlannerSettings()
TABLES = ((100_000,) * 8, (2_000_000,) * 4, (8_000_000,) * 6, (1_000, 2_000, 500))


def job(
    tables: tuple[int, ...], w: tuple[int, float, int], p: tuple[int, float, int], headroom: float
) -> JobSpec:
    (wn, wc, wm), (pn, pc, pm) = w, p
    return JobSpec(
        name="held",
        model={"table_sizes": list(tables)},  # type: ignore[arg-type]
        data={"format": "synthetic", "rows": 1_000_000},  # type: ignore[arg-type]
        training={"batch_size": 512},  # type: ignore[arg-type]
        resources={  # type: ignore[arg-type]
            "limits": {
                "cpu": round((wn * wc + pn * pc) * headroom, 2),
                "memory": f"{int((wn * wm + pn * pm) * headroom)}Mi",
            },
            "workers": {"count": wn, "cpu": wc, "memory": f"{wm}Mi"},
            "ps": {"count": pn, "cpu": pc, "memory": f"{pm}Mi"},
        },
    )


@st.composite
def jobs(draw: st.DrawFn) -> tuple[JobSpec, ResourcePlan]:
    tables = draw(st.sampled_from(TABLES))
    w = (
        draw(st.integers(1, 8)),
        draw(st.sampled_from([0.5, 1.0, 2.0])),
        draw(st.integers(2, 32)) * 256,
    )
    p = (
        draw(st.integers(1, 4)),
        draw(st.sampled_from([0.5, 1.0, 2.0])),
        draw(st.integers(2, 64)) * 256,
    )
    try:
        spec = job(tables, w, p, draw(st.sampled_from([1.0, 1.0, 1.1, 1.5])))
        ctx = context_from_spec(spec, SETTINGS)
        res = spec.resources
        assert res.workers is not None and res.ps is not None
        request = ResourcePlan(
            workers=res.workers.to_group(),
            ps=res.ps.to_group(),
            stage=Stage.MANUAL,
            reason="the request",
        )
        require_runnable(request.workers, request.ps, ctx, limits=res.limits, source="test")
    except (SpecError, UserInputError, ValidationError):
        reject()  # a request below its model's own footprint is refused before any pod
    return spec, request


def within(plan: ResourcePlan | None, spec: JobSpec) -> bool:
    limits = spec.resources.limits
    assert limits is not None
    return plan is None or (
        plan.total_cpu <= limits.cpu + 1e-9 and plan.total_memory_mb <= limits.memory
    )


def ps_growing(
    plan: ResourcePlan, n: int, t0: float, mb_per_s: float, rng: random.Random
) -> list[RuntimeSample]:
    """n samples of ``plan`` from the truth's rates, the PS' memory rising ``mb_per_s``."""
    out = Truth(worker_threads=2.0, ps_cost=1e-5, compute=4e-5).samples(plan, t0, n, rng)

    def grown(x: NodeSample, t: float) -> NodeSample:
        used = min(x.memory_requested_mb, int(x.memory_used_mb + mb_per_s * t))
        return dataclasses.replace(x, memory_used_mb=used) if x.role == "ps" else x

    return [dataclasses.replace(s, nodes=tuple(grown(x, s.time) for x in s.nodes)) for s in out]


@settings(max_examples=150, deadline=None, database=None, derandomize=True)
@given(jobs(), st.sampled_from(["job-ps-0", "job-worker-0"]), st.floats(0.0, 20.0))
def test_stage_3_answers_an_oom_kill_within_the_quota(
    case: tuple[JobSpec, ResourcePlan], killed: str, mb_per_s: float
) -> None:
    spec, request = case
    ctx = context_from_spec(spec, SETTINGS)
    window = ps_growing(request, 6, 0.0, mb_per_s, random.Random(0))
    event = JobEvent(time=window[-1].time, kind="oom", node=killed, detail="OOMKilled")
    plan = post_scale(ctx, request, Instability(window, [event]), window[-1].time, SETTINGS)
    assert within(plan, spec), (plan, spec.resources.limits)


@settings(max_examples=150, deadline=None, database=None, derandomize=True)
@given(jobs(), st.floats(0.5, 40.0), st.sampled_from(["worker", "ps"]))
def test_stage_2_rolls_back_within_the_quota_while_the_ps_grow(
    case: tuple[JobSpec, ResourcePlan], mb_per_s: float, added: str
) -> None:
    """A growth step (one more worker, or one more PS taking a share of the rows) that
    measured worse is rolled back while the PS' memory grows: the rollback carries the raise
    to the PS it goes back to, and still fits."""
    spec, request = case
    ctx = context_from_spec(spec, SETTINGS)
    before = request
    w, p = before.workers, before.ps
    if added == "worker":
        w = NodeGroup(count=w.count + 1, cpu=w.cpu, memory_mb=w.memory_mb)
    else:
        share = RUNTIME_MB + -(-p.count * (p.memory_mb - RUNTIME_MB) // (p.count + 1))
        p = NodeGroup(count=p.count + 1, cpu=p.cpu, memory_mb=max(share, p.memory_mb // 2))
    grown = ResourcePlan(workers=w, ps=p, stage=Stage.AUTO_SCALE, reason="a growth step")
    if not within(grown, spec):
        reject()
    rng = random.Random(1)
    n = SETTINGS.auto_scale.min_samples
    samples = ps_growing(before, n, 0.0, mb_per_s, rng)
    start = samples[-1].time + 30.0
    after = ps_growing(grown, n, start, mb_per_s, rng)
    # measured at half the rate before: the step did not pay
    after = [dataclasses.replace(s, throughput=s.throughput / 2) for s in after]
    step = ScalingStep(time=start, before=before, throughput_before=samples[-1].throughput)
    now = after[-1].time + SETTINGS.auto_scale.min_interval_s
    decision = auto_scale(ctx, grown, samples + after, now, SETTINGS, last_step=step)
    assert within(decision.plan, spec), (decision.plan, spec.resources.limits)
