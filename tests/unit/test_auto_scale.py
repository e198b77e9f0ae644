"""Stage 2 in a closed loop against a known throughput function (tests/support/truth.py)."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from dlrover_kfp.core.footprint import RUNTIME_MB
from dlrover_kfp.core.observation import Config
from dlrover_kfp.core.plan import NodeGroup, ResourcePlan, Stage
from dlrover_kfp.core.planner import (
    PlannerSettings,
    ScalingStep,
    auto_scale,
    context_from_spec,
)
from dlrover_kfp.core.planner.context import PlanningContext, clamp_memory
from dlrover_kfp.core.planner.search import CPU_LADDER
from dlrover_kfp.core.profile import NodeSample, RuntimeSample
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.sim.workload import Truth

SETTINGS = PlannerSettings()
SAMPLES_PER_ROUND = SETTINGS.auto_scale.min_samples
ROUND_S = SETTINGS.auto_scale.min_interval_s + 10


def spec(quota_cpu: float, max_workers: int = 32, max_ps: int = 8) -> JobSpec:
    return JobSpec(
        name="loop",
        model={"table_sizes": [100_000] * 8},  # type: ignore[arg-type]
        data={"format": "synthetic", "rows": 1_000_000},  # type: ignore[arg-type]
        training={"batch_size": 512},  # type: ignore[arg-type]
        resources={"limits": {"cpu": quota_cpu, "memory": "512Gi"}},  # type: ignore[arg-type]
        elastic={"max_workers": max_workers, "max_ps": max_ps},  # type: ignore[arg-type]
    )


def plan(w: int, lw: float, p: int, lp: float) -> ResourcePlan:
    return ResourcePlan(
        workers=NodeGroup(count=w, cpu=lw, memory_mb=4096),
        ps=NodeGroup(count=p, cpu=lp, memory_mb=8192),
        stage=Stage.COLD_START,
        reason="test start",
    )


def config(p: ResourcePlan) -> Config:
    return Config(p.workers.count, p.ps.count, p.workers.cpu, p.ps.cpu)


def run_loop(
    truth: Truth,
    start: ResourcePlan,
    quota_cpu: float,
    rounds: int,
    seed: int,
    max_workers: int = 32,
    max_ps: int = 8,
) -> list[ResourcePlan]:
    """Apply each decision, measure the truth at the new plan, decide again."""
    ctx = context_from_spec(spec(quota_cpu, max_workers, max_ps), SETTINGS)
    rng = random.Random(seed)
    current, samples, last = start, [], None
    history = [start]
    t = 0.0
    for _ in range(rounds):
        samples += truth.samples(current, t, SAMPLES_PER_ROUND, rng)
        t = samples[-1].time + ROUND_S
        decision = auto_scale(ctx, current, samples, t, SETTINGS, last_step=last)
        if decision.plan is not None:
            measured = sum(s.throughput for s in samples[-SAMPLES_PER_ROUND:]) / SAMPLES_PER_ROUND
            last = ScalingStep(
                time=t, before=current, throughput_before=measured, kind=decision.kind
            )
            current = decision.plan
        history.append(current)
        total = current.total_cpu
        assert total <= quota_cpu + 1e-9, f"plan over quota: {total} > {quota_cpu}"
    return history


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_under_provisioned_start_reaches_90_percent_of_best_in_5_rounds(seed: int) -> None:
    truth = Truth()
    quota = 64.0
    _, best = truth.best_within(quota, 32, 8, CPU_LADDER)
    history = run_loop(truth, plan(1, 1.0, 1, 1.0), quota, rounds=5, seed=seed)
    reached = truth.throughput(config(history[-1]))
    assert reached >= 0.9 * best, (
        f"reached {reached:.0f} of best {best:.0f} samples/s ({reached / best:.0%}) via "
        f"{[config(h) for h in history]}"
    )


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_over_provisioned_start_gives_back_idle_cpu_and_keeps_throughput(seed: int) -> None:
    # The job may run at most 8 workers and 4 PS (its elastic bounds), and asked for fat pods:
    # 8 x 16 + 4 x 8 = 160 cores, while a worker can use at most 6 cores and the PS far less
    # than 8. Nothing the quota allows can use the idle cores, so they should be given back.
    truth = Truth()
    quota = 160.0
    start = plan(8, 16.0, 4, 8.0)
    history = run_loop(truth, start, quota, rounds=5, seed=seed, max_workers=8, max_ps=4)
    end = history[-1]

    def idle(p: ResourcePlan) -> float:
        wu, pu = truth.usage(config(p))
        return p.workers.count * (p.workers.cpu - wu) + p.ps.count * (p.ps.cpu - pu)

    x0, x1 = truth.throughput(config(start)), truth.throughput(config(end))
    given_back = 1 - idle(end) / idle(start)
    assert given_back >= 0.30, f"gave back only {given_back:.0%} of idle CPU: {config(end)}"
    assert x1 >= 0.95 * x0, f"throughput fell to {x1 / x0:.0%}: {config(end)}"


@pytest.mark.parametrize("start", [plan(1, 1.0, 1, 1.0), plan(8, 16.0, 4, 8.0)])
def test_stable_optimum_yields_no_change(start: ResourcePlan) -> None:
    """Once converged, deciding again and again on fresh noisy samples changes nothing."""
    truth = Truth()
    history = run_loop(truth, start, 160.0, rounds=12, seed=7, max_workers=8, max_ps=4)
    settled = history[-5:]
    assert all(p.same_resources(settled[0]) for p in settled), [config(p) for p in settled]


def test_waits_for_samples_and_interval() -> None:
    truth = Truth()
    ctx = context_from_spec(spec(64.0), SETTINGS)
    current = plan(1, 1.0, 1, 1.0)
    few = truth.samples(current, 0.0, SAMPLES_PER_ROUND - 1, random.Random(0))
    decision = auto_scale(ctx, current, few, 1000.0, SETTINGS)
    assert decision.plan is None and decision.reason.startswith("waiting")
    enough = truth.samples(current, 0.0, SAMPLES_PER_ROUND, random.Random(0))
    recent = ScalingStep(time=900.0, before=current, throughput_before=1.0)
    decision = auto_scale(ctx, current, enough, 1000.0, SETTINGS, last_step=recent)
    assert decision.plan is None and "last plan" in decision.reason


def test_rolls_back_when_throughput_drops_20_percent() -> None:
    truth = Truth()
    ctx = context_from_spec(spec(64.0), SETTINGS)
    good = plan(8, 4.0, 2, 4.0)
    bad = plan(8, 0.5, 2, 0.5)
    x_good = truth.throughput(config(good))
    samples = truth.samples(bad, 400.0, SAMPLES_PER_ROUND, random.Random(0))
    step = ScalingStep(time=350.0, before=good, throughput_before=x_good)
    decision = auto_scale(ctx, bad, samples, 1000.0, SETTINGS, last_step=step)
    assert decision.plan is not None
    assert decision.plan.same_resources(good)
    assert decision.plan.reason.startswith("rollback")


def test_a_step_with_nothing_measured_before_it_is_not_judged() -> None:
    """A restarted job's first step has no baseline (0 samples/s): it stands, no crash."""
    truth = Truth()
    ctx = context_from_spec(spec(64.0), SETTINGS)
    good = plan(8, 4.0, 2, 4.0)
    bad = plan(8, 0.5, 2, 0.5)
    samples = truth.samples(bad, 400.0, SAMPLES_PER_ROUND, random.Random(0))
    step = ScalingStep(time=350.0, before=good, throughput_before=0.0)
    decision = auto_scale(ctx, bad, samples, 1000.0, SETTINGS, last_step=step)
    assert decision.plan is None or not decision.plan.reason.startswith("rollback")


# -- memory right-sizing ------------------------------------------------------------------


def measured(
    current: ResourcePlan, *, worker_used: int, ps_used: list[int], x: float = 1000.0
) -> list[RuntimeSample]:
    """``min_samples`` samples of a job at ``current`` whose pods use the given MiB and keep
    their CPU busy (so that no CPU probe competes with the memory decision)."""
    w, p = current.workers, current.ps
    assert len(ps_used) == p.count
    nodes = tuple(
        NodeSample(
            name=f"job-worker-{k}",
            role="worker",
            cpu_used=0.95 * w.cpu,
            cpu_requested=w.cpu,
            memory_used_mb=worker_used,
            memory_requested_mb=w.memory_mb,
            throughput=x / w.count,
        )
        for k in range(w.count)
    ) + tuple(
        NodeSample(
            name=f"job-ps-{k}",
            role="ps",
            cpu_used=0.95 * p.cpu,
            cpu_requested=p.cpu,
            memory_used_mb=used,
            memory_requested_mb=p.memory_mb,
        )
        for k, used in enumerate(ps_used)
    )
    return [
        RuntimeSample(
            time=30.0 * i,
            global_step=100 * i,
            throughput=x,
            workers=w.count,
            ps=p.count,
            worker_cpu=w.cpu,
            ps_cpu=p.cpu,
            nodes=nodes,
        )
        for i in range(SAMPLES_PER_ROUND)
    ]


def fixed_job(worker_mb: int, ps_mb: int) -> tuple[PlanningContext, ResourcePlan]:
    """A job that cannot change its counts or CPU (elastic bounds and quota are exactly its
    request), so that memory is the only thing left to decide."""
    current = ResourcePlan(
        workers=NodeGroup(count=4, cpu=4.0, memory_mb=worker_mb),
        ps=NodeGroup(count=2, cpu=4.0, memory_mb=ps_mb),
        stage=Stage.COLD_START,
        reason="the user's request",
    )
    ctx = context_from_spec(spec(current.total_cpu, max_workers=4, max_ps=2), SETTINGS)
    return ctx, current


def test_over_provisioned_memory_is_cut_to_measured_use_plus_headroom() -> None:
    ctx, current = fixed_job(worker_mb=8192, ps_mb=8192)
    s = SETTINGS.auto_scale
    samples = measured(current, worker_used=2000, ps_used=[RUNTIME_MB + 50, RUNTIME_MB + 50])
    decision = auto_scale(ctx, current, samples, 1000.0, SETTINGS)
    assert decision.plan is not None, decision.reason
    assert decision.kind == "give_back" and "right-sizes memory" in decision.reason
    new = decision.plan
    assert config(new) == config(current), "memory alone changes"
    # worker: peak x (1 + headroom), rounded up to the memory step
    assert new.workers.memory_mb == clamp_memory(2000 * (1 + s.worker_memory_headroom), ctx.node)
    # PS: the full rows (more than the 100 MiB held now) split over 2, balanced, x (1 + headroom)
    assert ctx.ps_state_mb > 100
    expected_ps = RUNTIME_MB + math.ceil(math.ceil(ctx.ps_state_mb * 1.2) / 2)
    assert new.ps.memory_mb == max(ctx.node.min_memory_mb, expected_ps)
    assert new.total_memory_mb <= 0.8 * current.total_memory_mb


def test_ps_memory_covers_the_measured_imbalance_and_state_beyond_the_model_floor() -> None:
    ctx, current = fixed_job(worker_mb=8192, ps_mb=16384)
    big, small = 3000 + ctx.ps_state_mb, 1000 + ctx.ps_state_mb // 3
    samples = measured(current, worker_used=2000, ps_used=[RUNTIME_MB + big, RUNTIME_MB + small])
    decision = auto_scale(ctx, current, samples, 1000.0, SETTINGS)
    assert decision.plan is not None, decision.reason
    ps_mb = decision.plan.ps.memory_mb
    # the projection: total state x (largest / mean) x 1.2, split over 2 PS
    imbalance = big / ((big + small) / 2)
    assert ps_mb == RUNTIME_MB + math.ceil(math.ceil((big + small) * imbalance * 1.2) / 2)
    assert ps_mb >= RUNTIME_MB + 1.2 * big, "the largest PS keeps its headroom"


def test_small_memory_savings_do_not_relaunch_pods() -> None:
    # Worker memory 1.5x its use (a warm start's margin): right-sizing would free < 20%.
    ctx, _ = fixed_job(worker_mb=3072, ps_mb=4096)
    sized_ps = RUNTIME_MB + math.ceil(ctx.ps_state_mb * 1.2 / 2)
    _, current = fixed_job(worker_mb=3072, ps_mb=sized_ps + 64)
    samples = measured(current, worker_used=2048, ps_used=[RUNTIME_MB + 100, RUNTIME_MB + 100])
    decision = auto_scale(ctx, current, samples, 1000.0, SETTINGS)
    assert decision.plan is None and decision.reason.startswith("stable"), decision.reason


def test_memory_is_never_grown_by_auto_scaling() -> None:
    # Workers are at their limit (Stage 3's business), the PS are fat: only the PS shrink.
    ctx, current = fixed_job(worker_mb=2048, ps_mb=16384)
    samples = measured(current, worker_used=2040, ps_used=[RUNTIME_MB + 100, RUNTIME_MB + 100])
    decision = auto_scale(ctx, current, samples, 1000.0, SETTINGS)
    assert decision.plan is not None, decision.reason
    assert decision.plan.workers.memory_mb == 2048
    assert decision.plan.ps.memory_mb < 16384


def test_samples_without_pod_readings_keep_memory() -> None:
    ctx, current = fixed_job(worker_mb=8192, ps_mb=8192)
    samples = [
        dataclasses.replace(x, nodes=())
        for x in measured(current, worker_used=1000, ps_used=[RUNTIME_MB, RUNTIME_MB])
    ]
    decision = auto_scale(ctx, current, samples, 1000.0, SETTINGS)
    assert decision.plan is None or decision.plan.workers.memory_mb == 8192
