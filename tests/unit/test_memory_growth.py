"""PS memory follows its measured growth (issue 30, step 4): never below the user's request
until the growth is measured, never below the end-of-job need it projects, given back only
once it has stopped; an OOM grows memory per PS, and adds PS only where a pod cannot have it."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from dlrover_kfp.core.footprint import RUNTIME_MB
from dlrover_kfp.core.plan import NodeGroup, ResourcePlan, Stage
from dlrover_kfp.core.planner import Instability, PlannerSettings, context_from_spec, post_scale
from dlrover_kfp.core.planner.auto_scale import memory_needs
from dlrover_kfp.core.planner.context import PlanningContext, clamp_memory
from dlrover_kfp.core.planner.memory_growth import ps_growth
from dlrover_kfp.core.planner.warm_start import cold_start
from dlrover_kfp.core.profile import JobEvent, NodeSample, RuntimeSample
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.sim.cluster.truth import MemoryTruth

SETTINGS = PlannerSettings()
G = SETTINGS.memory_growth
ROWS = 1_000_000  # batch 1: a sample's global step is its progress x ROWS


SPEC = JobSpec(
    name="grows",
    model={"table_sizes": [100_000] * 8},  # type: ignore[arg-type]
    data={"format": "synthetic", "rows": ROWS},  # type: ignore[arg-type]
    training={"batch_size": 1},  # type: ignore[arg-type]
)


def context(memory: str = "512Gi", max_ps: int = 8) -> PlanningContext:
    spec = dataclasses.replace(
        SPEC,
        resources={"limits": {"cpu": 64, "memory": memory}},  # type: ignore[arg-type]
        elastic={"max_ps": max_ps},  # type: ignore[arg-type]
    )
    return context_from_spec(spec, SETTINGS)


def request(ps_count: int = 2, ps_mb: int = 8192) -> ResourcePlan:
    """The user's request, as a cold start plans it."""
    return ResourcePlan(
        workers=NodeGroup(count=4, cpu=4.0, memory_mb=4096),
        ps=NodeGroup(count=ps_count, cpu=4.0, memory_mb=ps_mb),
        stage=Stage.COLD_START,
        reason="the spec's own resources",
    )


def readings(
    plan: ResourcePlan, progress: Sequence[float], used: Callable[[float, int], float]
) -> list[RuntimeSample]:
    """One sample per progress value, 120 s apart; PS ``k`` uses ``used(f, k)`` MiB."""
    out = []
    for i, f in enumerate(progress):
        ps = tuple(
            NodeSample(
                name=f"job-ps-{k}",
                role="ps",
                cpu_used=2.0,
                cpu_requested=plan.ps.cpu,
                memory_used_mb=int(used(f, k)),
                memory_requested_mb=plan.ps.memory_mb,
            )
            for k in range(plan.ps.count)
        )
        worker = NodeSample(
            name="job-worker-0",
            role="worker",
            cpu_used=3.8,
            cpu_requested=plan.workers.cpu,
            memory_used_mb=3500,  # near its request: no worker give-back in these tests
            memory_requested_mb=plan.workers.memory_mb,
            throughput=100.0,
        )
        out.append(
            RuntimeSample(
                time=120.0 * (i + 1),
                global_step=round(f * ROWS),
                throughput=400.0,
                workers=plan.workers.count,
                ps=plan.ps.count,
                worker_cpu=plan.workers.cpu,
                ps_cpu=plan.ps.cpu,
                nodes=(worker, *ps),
            )
        )
    return out


def steps(start: float, count: int, step: float) -> list[float]:
    return [start + step * i for i in range(count)]


def linear(start_mb: float, per_progress_mb: float) -> Callable[[float, int], float]:
    """Each of 2 PS holds half of ``start + per_progress · f``, plus its runtime."""
    return lambda f, _k: RUNTIME_MB + (start_mb + per_progress_mb * f) / 2


def test_a_low_start_up_reading_keeps_the_request_until_growth_is_measured() -> None:
    ctx, plan = context(), request(ps_mb=8192)
    # The PS hold 600 MiB at start-up: a reading of the moment, not of the end state.
    for progress in ([0.01], steps(0.01, G.min_samples - 1, 0.02), [0.01, 0.015, 0.02, 0.025]):
        samples = readings(plan, progress, linear(500, 4000))
        assert ps_growth(ctx, samples, G) is None, progress  # too few, or too little progress
        needs, change = memory_needs(ctx, plan, samples, SETTINGS.auto_scale, G)
        assert change == "keep"
        assert needs.ps_mb(plan.ps.count) >= plan.ps.memory_mb  # never below the request
        assert post_scale(ctx, plan, Instability(samples), samples[-1].time, SETTINGS) is None


def test_measured_growth_plans_the_state_now_plus_the_growth_to_the_end() -> None:
    ctx, plan = context(), request(ps_mb=1536)  # a user's short request
    # S(f) = 500 + 4000 f, measured over f = 0.10 .. 0.20: E = S(0.2) + 4000 · 0.8 = 4500
    samples = readings(plan, steps(0.10, 6, 0.02), linear(500, 4000))
    growth = ps_growth(ctx, samples, G)
    assert growth is not None and math.isclose(growth.end_state_mb, 4500, rel_tol=0.01)
    needs, change = memory_needs(ctx, plan, samples, SETTINGS.auto_scale, G)
    assert change == "raise"
    want = RUNTIME_MB + math.ceil(4500 * (1 + G.margin) / 2)  # the even share of E x (1 + margin)
    assert abs(needs.ps_mb(2) - want) <= 2
    # Stage 3 raises the running PS now, before they reach their limit.
    raised = post_scale(ctx, plan, Instability(samples), samples[-1].time, SETTINGS)
    assert raised is not None and raised.ps.memory_mb >= want
    assert {a.node for a in raised.actions} == {"job-ps-0", "job-ps-1"}
    # With no room in the quota (19 GiB: exactly the plan), no worker is given up for a raise
    # the projection may overstate; the OOM prevention rule raises the PS nearer their limit.
    tight = context(memory="19Gi")
    assert tight.quota_memory_mb == plan.total_memory_mb
    assert post_scale(tight, plan, Instability(samples), samples[-1].time, SETTINGS) is None


def test_a_cold_start_gives_a_ps_at_least_its_footprint_x_memory_factor() -> None:
    ctx = context()
    floor = ctx.ps_memory_floor_mb(2)  # runtime + the model's state / 2
    cold = SETTINGS.cold_start.memory_factor * floor
    for asked, planned in ((floor + 10, clamp_memory(cold, ctx.node)), (4096, 4096)):
        spec = dataclasses.replace(
            SPEC,
            resources={  # type: ignore[arg-type]
                "limits": {"cpu": 64, "memory": "512Gi"},
                "workers": {"count": 4, "cpu": 4, "memory": "4Gi"},
                "ps": {"count": 2, "cpu": 4, "memory": f"{asked}Mi"},
            },
        )
        assert cold_start(spec, ctx, SETTINGS).ps.memory_mb == planned
    # Below the footprint itself, with the spec's own limits: raised as any guess (the user
    # gave the planner a quota to plan in) ...
    resources = {
        "limits": {"cpu": 64, "memory": "512Gi"},
        "workers": {"count": 4, "cpu": 4, "memory": "4Gi"},
        "ps": {"count": 2, "cpu": 4, "memory": "256Mi"},
    }
    low = dataclasses.replace(SPEC, resources=resources)  # type: ignore[arg-type]
    assert cold_start(low, ctx, SETTINGS).ps.memory_mb == clamp_memory(cold, ctx.node)
    # ... without limits, left as asked, for the runtime to refuse (require_runnable).
    del resources["limits"]
    unbounded = dataclasses.replace(SPEC, resources=resources)  # type: ignore[arg-type]
    assert cold_start(unbounded, ctx, SETTINGS).ps.memory_mb == 256


def test_memory_is_given_back_only_once_growth_has_stopped() -> None:
    ctx, plan = context(), request(ps_mb=8192)  # the user asked 4x the end state
    growing = readings(plan, steps(0.30, 6, 0.03), linear(500, 1500))
    needs, change = memory_needs(ctx, plan, growing, SETTINGS.auto_scale, G)
    assert change == "keep" and needs.ps_mb(2) == plan.ps.memory_mb  # still growing: kept
    flat = readings(plan, steps(0.60, 6, 0.03), lambda f, _k: RUNTIME_MB + 1000)
    needs, change = memory_needs(ctx, plan, flat, SETTINGS.auto_scale, G)
    assert change == "give_back"
    assert needs.ps_mb(2) == max(ctx.node.min_memory_mb, RUNTIME_MB + 1200)  # 2000 x 1.2 / 2


def oom(ctx: PlanningContext, plan: ResourcePlan, used_mb: int) -> ResourcePlan:
    """Stage 3's plan after PS 0 of ``plan`` was OOM-killed, both PS using ``used_mb``."""
    samples = readings(plan, [0.01], lambda _f, _k: used_mb)  # growth not measured
    event = JobEvent(time=130.0, kind="oom", node="job-ps-0", detail="OOMKilled")
    new = post_scale(ctx, plan, Instability(samples, [event]), 130.0, SETTINGS)
    assert new is not None
    return new


def test_a_ps_oom_grows_memory_per_ps_while_a_pod_can_have_it() -> None:
    ctx, plan = context(), request(ps_count=2, ps_mb=8192)
    new = oom(ctx, plan, 8100)  # balanced: the old rule doubled the PS count
    assert (new.ps.count, new.ps.memory_mb) == (2, 16384)


def test_a_ps_oom_at_a_pods_maximum_adds_the_fewest_ps_that_fit() -> None:
    ctx, plan = context(memory="1024Gi"), request(ps_count=2, ps_mb=60 * 1024)
    new = oom(ctx, plan, 60 * 1024 - 100)
    # wanted = 60 GiB + 8 GiB > 64 GiB a pod: p' = ceil(2 (68 GiB - runtime) / (64 GiB - runtime))
    want = 68 * 1024
    count = math.ceil(2 * (want - RUNTIME_MB) / (64 * 1024 - RUNTIME_MB))
    assert count == 3 and new.ps.count == count  # one PS added, not a doubling
    assert new.ps.memory_mb <= 64 * 1024
    assert count * (new.ps.memory_mb - RUNTIME_MB) >= 2 * (want - RUNTIME_MB) - 256


@st.composite
def growth_curves(draw: st.DrawFn) -> tuple[MemoryTruth | Callable[[float], float], int]:
    """A PS state curve: the simulator's saturating truth (with a hot PS and a snapshot), or a
    concave power law of its own (not the truth's form)."""
    ps = draw(st.integers(1, 8))
    end = draw(st.floats(500.0, 40_000.0))
    if draw(st.booleans()):
        truth = MemoryTruth(
            worker_mb=1000.0,
            ps_start_mb=end * draw(st.floats(0.1, 0.3)),
            ps_end_mb=end,
            k=draw(st.floats(2.0, 4.0)),
            imbalance=draw(st.floats(0.0, 0.5)) if ps > 1 else 0.0,
            snapshot_mb=draw(st.floats(0.0, end)),
        )
        return truth, ps
    start, power = end * draw(st.floats(0.05, 0.5)), draw(st.floats(0.2, 1.0))
    return (lambda f: start + (end - start) * f**power), ps


@settings(max_examples=20, deadline=None)
@given(
    curve=growth_curves(),
    step=st.floats(0.01, 0.05),
    first=st.floats(0.001, 0.05),
)
def test_planned_ps_memory_covers_the_end_of_job_need_once_growth_is_measured(
    curve: tuple[MemoryTruth | Callable[[float], float], int], step: float, first: float
) -> None:
    truth, ps = curve

    def used(f: float, k: int) -> float:
        if isinstance(truth, MemoryTruth):
            return truth.ps_used_mb(f, ps, k, snapshot=True)
        return RUNTIME_MB + truth(f) / ps

    end_need = used(1.0, 0)  # the largest PS at the end of the job
    ctx, plan = context(memory="4096Gi", max_ps=8), request(ps_count=ps, ps_mb=512)
    progress = [f for f in steps(first, 100, step) if f < 1.0]
    samples = readings(plan, progress, used)
    for n in range(1, len(samples) + 1):
        seen = samples[:n]
        if ps_growth(ctx, seen, G) is None:
            continue
        needs, _ = memory_needs(ctx, plan, seen, SETTINGS.auto_scale, G)
        assert needs.ps_mb(ps) >= end_need, (n, progress[n - 1])
