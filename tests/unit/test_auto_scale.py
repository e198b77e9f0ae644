"""Stage 2 in a closed loop against a known throughput function (tests/support/truth.py)."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlrover_kfp.core.footprint import RUNTIME_MB
from dlrover_kfp.core.observation import Config
from dlrover_kfp.core.plan import NodeGroup, ResourcePlan, Stage
from dlrover_kfp.core.planner import (
    PlannerSettings,
    ScalingStep,
    auto_scale,
    context_from_spec,
)
from dlrover_kfp.core.planner.auto_scale import memory_needs
from dlrover_kfp.core.planner.context import PlanningContext, clamp_worker_memory
from dlrover_kfp.core.planner.search import CPU_LADDER
from dlrover_kfp.core.planner.settings import NodeLimits
from dlrover_kfp.core.profile import NodeSample, RuntimeSample
from dlrover_kfp.core.reconcile import ChangeKind, plan_pods, reconcile
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.sim.workload import Truth

_DEFAULTS = PlannerSettings()
#: The throughput-first objective, which most convergence tests here are about (reach the
#: best, give back what does not slow the job); the default, "cost", has its own tests below.
SETTINGS = dataclasses.replace(
    _DEFAULTS,
    auto_scale=dataclasses.replace(
        _DEFAULTS.auto_scale, objective="fastest", throughput_floor=0.97
    ),
)
SAMPLES_PER_ROUND = SETTINGS.auto_scale.min_samples
ROUND_S = SETTINGS.auto_scale.min_interval_s + 10


def spec(
    quota_cpu: float, max_workers: int = 32, max_ps: int = 8, quota_memory: str = "512Gi"
) -> JobSpec:
    return JobSpec(
        name="loop",
        model={"table_sizes": [100_000] * 8},  # type: ignore[arg-type]
        data={"format": "synthetic", "rows": 1_000_000},  # type: ignore[arg-type]
        training={"batch_size": 512},  # type: ignore[arg-type]
        resources={"limits": {"cpu": quota_cpu, "memory": quota_memory}},  # type: ignore[arg-type]
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
    settings: PlannerSettings = SETTINGS,
) -> list[ResourcePlan]:
    """Apply each decision, measure the truth at the new plan, decide again."""
    ctx = context_from_spec(spec(quota_cpu, max_workers, max_ps), settings)
    rng = random.Random(seed)
    current, samples, last = start, [], None
    history = [start]
    t = 0.0
    for _ in range(rounds):
        samples += truth.samples(current, t, SAMPLES_PER_ROUND, rng)
        t = samples[-1].time + ROUND_S
        decision = auto_scale(ctx, current, samples, t, settings, last_step=last)
        if decision.plan is not None:
            measured = sum(s.throughput for s in samples[-SAMPLES_PER_ROUND:]) / SAMPLES_PER_ROUND
            last = ScalingStep(
                time=t,
                before=current,
                throughput_before=measured,
                kind=decision.kind,
                expected=decision.plan.predicted_throughput,
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
@pytest.mark.parametrize("seed", [7, 8, 9])
def test_stable_optimum_yields_no_change(start: ResourcePlan, seed: int) -> None:
    """Once converged, deciding again and again on fresh noisy samples changes nothing.
    (From 2 cores, the trust region takes 6 doublings to the optimum's ~110, plus a rollback
    or two on the way, and a growth tried and given back: 24 rounds.)"""
    truth = Truth()
    history = run_loop(truth, start, 160.0, rounds=24, seed=seed, max_workers=8, max_ps=4)
    settled = history[-5:]
    assert all(p.same_resources(settled[0]) for p in settled), [config(p) for p in settled]


def _random_loop(seed: int) -> tuple[list[ResourcePlan], float]:
    rng = random.Random(seed)
    quota = rng.choice([4.0, 8.0, 16.0, 32.0, 64.0, 160.0])
    w, p = rng.randint(1, 4), rng.randint(1, 2)
    lw = rng.choice([0.5, 1.0, 2.0])
    lp = rng.choice([0.5, 1.0])
    while w * lw + p * lp > quota:
        w = max(1, w - 1)
        lw, lp = 0.5, 0.5
    # a different job shape each time
    truth = Truth(
        worker_threads=rng.uniform(1.0, 8.0),
        ps_cost=rng.uniform(2e-6, 3e-5),
        compute=rng.uniform(2e-5, 8e-5),
    )
    history = run_loop(truth, plan(w, lw, p, lp), quota, rounds=6, seed=seed)
    return history, quota


@pytest.mark.parametrize("block", range(4))
def test_growth_stays_in_the_trust_region_and_never_returns_to_an_abandoned_plan(
    block: int,
) -> None:
    """Property, over 160 random jobs, quotas and starts: a step's CPU is at most
    max_job_cpu_growth x the most the job has run with, and a configuration the job left
    for an earlier one is never planned again."""
    growth = SETTINGS.auto_scale.max_job_cpu_growth
    for seed in range(block * 40, block * 40 + 40):
        history, quota = _random_loop(seed)
        configs = [config(h) for h in history]
        for i in range(1, len(history)):
            most = max(h.total_cpu for h in history[:i])
            assert history[i].total_cpu <= growth * most + 1e-9, (seed, configs)
            assert history[i].total_cpu <= quota + 1e-9
        abandoned: set[Config] = set()
        runs = [c for k, c in enumerate(configs) if k == 0 or configs[k - 1] != c]
        for k in range(1, len(runs)):
            assert runs[k] not in abandoned, (seed, runs)
            if k + 1 < len(runs) and runs[k + 1] in runs[:k]:
                abandoned.add(runs[k])


def test_the_cost_objective_gives_back_more_idle_cpu_than_the_fastest() -> None:
    truth = Truth()
    start = plan(8, 16.0, 4, 8.0)
    cost = dataclasses.replace(
        SETTINGS,
        auto_scale=dataclasses.replace(SETTINGS.auto_scale, objective="cost", throughput_floor=0.9),
    )

    def end(settings: PlannerSettings, seed: int) -> ResourcePlan:
        kw = {"max_workers": 8, "max_ps": 4, "settings": settings}
        return run_loop(truth, start, 160.0, rounds=8, seed=seed, **kw)[-1]  # type: ignore[arg-type]

    # The workers use at most 6 of their 16 cores (the truth's worker cap). With the model's
    # compute term held to that measured use (perf_model._bound_by_usage) the fastest
    # objective gives the idle cores back too, so the two may end equal; the cost objective
    # never ends holding more, and it gives back on every seed.
    for seed in (1, 2, 3):
        by_cost, fastest = end(cost, seed), end(SETTINGS, seed)
        assert by_cost.total_cpu <= fastest.total_cpu, (config(by_cost), config(fastest))
        assert by_cost.total_cpu <= 0.5 * start.total_cpu, config(by_cost)
        x0, x1 = truth.throughput(config(start)), truth.throughput(config(by_cost))
        # the floor is on predictions; a few points of model error below it
        assert x1 >= 0.85 * x0, (config(by_cost), x1 / x0)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_default_objective_trades_speed_for_cpu_above_its_floor(seed: int) -> None:
    """The default (cost, floor 0.95) from a small start: a plan with more throughput per core
    than the fastest objective's (floor 0.97) and at least ~0.95 of the best (the floor is on
    predictions: a few points of model error below it), within the quota throughout."""
    assert (_DEFAULTS.auto_scale.objective, _DEFAULTS.auto_scale.throughput_floor) == (
        "cost",
        0.95,
    )
    truth = Truth()
    quota = 64.0
    _, best = truth.best_within(quota, 32, 8, CPU_LADDER)
    # 10 rounds, not 8 (issue 30): with the workers' CPU floor their work per sample rather
    # than their pod size, the loop from this 1-core start first tries 0.5-core workers and
    # needs two more rounds to reach its plan.
    kw = {"rounds": 10, "seed": seed}
    by_cost = run_loop(truth, plan(1, 1.0, 1, 1.0), quota, settings=_DEFAULTS, **kw)[-1]  # type: ignore[arg-type]
    fastest = run_loop(truth, plan(1, 1.0, 1, 1.0), quota, **kw)[-1]  # type: ignore[arg-type]
    x_cost, x_fast = truth.throughput(config(by_cost)), truth.throughput(config(fastest))
    # measured 0.93-0.97 of the best on these seeds (0.86-0.88 at the floor 0.85, 0.70-0.71
    # at 0.7)
    assert x_cost >= 0.9 * best, (config(by_cost), x_cost / best)
    assert x_cost / by_cost.total_cpu > x_fast / fastest.total_cpu, (
        config(by_cost),
        config(fastest),
    )


def test_waits_for_samples_and_interval() -> None:
    truth = Truth()
    ctx = context_from_spec(spec(64.0), SETTINGS)
    current = plan(1, 1.0, 1, 1.0)
    # Issue 30: the plan a job started with is left as soon as its samples' mean can tell a
    # step of min_gain from noise (samples_needed), so a steady start decides on fewer than
    # min_samples; one sample never suffices. Any later plan waits for min_samples (below).
    one = truth.samples(current, 0.0, 1, random.Random(0))
    decision = auto_scale(ctx, current, one, 1000.0, SETTINGS)
    assert decision.plan is None and decision.reason.startswith("waiting")
    earlier = truth.samples(plan(2, 1.0, 1, 1.0), 0.0, SAMPLES_PER_ROUND, random.Random(1))
    few = earlier + truth.samples(current, 500.0, SAMPLES_PER_ROUND - 1, random.Random(0))
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


def test_samples_without_progress_are_no_measurement_and_no_crash() -> None:
    """A resumed job's first samples can all show 0 samples/s (its pods starting): there is
    nothing to fit, and the decision must say so rather than fail (a resumed run once died
    of it)."""
    truth = Truth()
    ctx = context_from_spec(spec(64.0), SETTINGS)
    current = plan(2, 1.0, 1, 1.0)
    idle = [
        dataclasses.replace(x, throughput=0.0)
        for x in truth.samples(current, 0.0, SAMPLES_PER_ROUND, random.Random(0))
    ]
    decision = auto_scale(ctx, current, idle, 1000.0, SETTINGS)
    assert decision.plan is None or decision.plan.total_cpu <= 2 * current.total_cpu


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
    assert decision.kind == "memory" and "right-sizes memory" in decision.reason
    new = decision.plan
    assert config(new) == config(current), "memory alone changes"
    # worker: peak x (1 + headroom), rounded up to the memory step
    assert new.workers.memory_mb == clamp_worker_memory(
        2000 * (1 + s.worker_memory_headroom), ctx.node
    )
    # PS: the full rows (more than the 100 MiB held now) split over 2, balanced, x (1 + headroom)
    assert ctx.ps_state_mb > 100
    expected_ps = RUNTIME_MB + math.ceil(math.ceil(ctx.ps_state_mb * 1.2) / 2)
    assert new.ps.memory_mb == max(ctx.node.min_memory_mb, expected_ps)
    assert new.total_memory_mb <= 0.8 * current.total_memory_mb


def test_a_memory_step_is_not_undone_by_a_throughput_dip() -> None:
    """Memory does not set the speed: a dip after right-sizing memory is noise or drift, and
    undoing the step would relaunch every pod for nothing (measured: an 11% drift on a local
    run once re-inflated memory that way)."""
    ctx, current = fixed_job(worker_mb=8192, ps_mb=8192)
    samples = measured(current, worker_used=2000, ps_used=[RUNTIME_MB + 50, RUNTIME_MB + 50])
    decision = auto_scale(ctx, current, samples, 1000.0, SETTINGS)
    assert decision.plan is not None and decision.kind == "memory"
    step = ScalingStep(
        time=1000.0,
        before=current,
        throughput_before=1000.0,
        kind=decision.kind,
        expected=decision.plan.predicted_throughput,
    )
    later = [
        dataclasses.replace(x, time=1000.0 + x.time + 30.0, throughput=850.0)
        for x in measured(decision.plan, worker_used=2000, ps_used=[RUNTIME_MB + 50] * 2)
    ]
    again = auto_scale(ctx, decision.plan, samples + later, 2000.0, SETTINGS, last_step=step)
    assert again.kind != "rollback", again.reason


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
    # Worker memory a quarter above its use: right-sizing would free < 20%.
    ctx, _ = fixed_job(worker_mb=3072, ps_mb=4096)
    sized_ps = RUNTIME_MB + math.ceil(ctx.ps_state_mb * 1.2 / 2)
    _, current = fixed_job(worker_mb=3072, ps_mb=sized_ps + 64)
    samples = measured(current, worker_used=2450, ps_used=[RUNTIME_MB + 100, RUNTIME_MB + 100])
    decision = auto_scale(ctx, current, samples, 1000.0, SETTINGS)
    assert decision.plan is None and decision.reason.startswith("stable"), decision.reason


def test_measured_worker_memory_goes_into_every_plan_without_a_memory_step_of_its_own() -> None:
    """Workers measured at a third of their memory, in a job whose PS hold most of it: right-
    sizing the workers alone frees under a fifth of the job's memory, not worth a relaunch of
    its own; but a step that replaces the workers anyway gives them what they were measured to
    need, and the search counts on it: with a memory quota equal to the user's request, the
    job's busy CPU-bound workers grow in number past the request only in that memory."""
    current = ResourcePlan(
        workers=NodeGroup(count=4, cpu=2.0, memory_mb=4096),
        ps=NodeGroup(count=2, cpu=4.0, memory_mb=24576),
        stage=Stage.COLD_START,
        reason="the user's request",
    )
    job = spec(64.0, max_workers=32, max_ps=2, quota_memory=f"{current.total_memory_mb}Mi")
    ctx = context_from_spec(job, SETTINGS)
    samples = measured(current, worker_used=1200, ps_used=[20500] * 2)
    sized = clamp_worker_memory(1200 * (1 + SETTINGS.auto_scale.worker_memory_headroom), ctx.node)
    needs, change = memory_needs(ctx, current, samples, SETTINGS.auto_scale, SETTINGS.memory_growth)
    assert change == "keep", "a fifth of the job's memory is not freed: no memory step"
    assert needs.worker_mb == sized
    decision = auto_scale(ctx, current, samples, 1000.0, SETTINGS)
    assert decision.plan is not None and decision.kind == "grow", decision.reason
    assert decision.plan.workers.count > 4, decision.reason
    assert decision.plan.workers.memory_mb == sized
    assert decision.plan.total_memory_mb <= current.total_memory_mb


@settings(max_examples=60, deadline=None)
@given(worker_used=st.integers(min_value=600, max_value=20_000))
def test_a_measured_workers_memory_is_planned_within_one_fine_step_of_its_need(
    worker_used: int,
) -> None:
    """A worker's memory is flat once measured (benchmarks/worker_memory.py), so what a plan
    gives it above its need (peak x (1 + headroom)) is rounding alone, and rounding is paid
    once per worker: it stays under the worker step (64 MiB), not the PS' 256 MiB."""
    ctx, current = fixed_job(worker_mb=24_576, ps_mb=4096)
    samples = measured(current, worker_used=worker_used, ps_used=[RUNTIME_MB + 50] * 2)
    needs, _ = memory_needs(ctx, current, samples, SETTINGS.auto_scale, SETTINGS.memory_growth)
    need = max(
        ctx.worker_memory_floor_mb, worker_used * (1 + SETTINGS.auto_scale.worker_memory_headroom)
    )
    assert ctx.node.worker_memory_step_mb < ctx.node.memory_step_mb
    assert need <= needs.worker_mb < need + ctx.node.worker_memory_step_mb


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


def _judged(kind: str, before: float, after: float) -> str | None:
    """The reason ``auto_scale`` rolls back a step of ``kind`` measured ``before`` -> ``after``
    samples/s (the truth's noise scaled out), or None when the step stands."""
    truth = Truth()
    ctx = context_from_spec(spec(64.0), SETTINGS)
    previous = plan(8, 4.0, 2, 4.0)
    current = (
        dataclasses.replace(previous, workers=dataclasses.replace(previous.workers, memory_mb=2048))
        if kind == "memory"
        else plan(8, 2.0, 2, 2.0)
    )
    samples = truth.samples(current, 400.0, SAMPLES_PER_ROUND, random.Random(0))
    scale = after / statistics.fmean(x.throughput for x in samples)
    samples = [dataclasses.replace(x, throughput=x.throughput * scale) for x in samples]
    step = ScalingStep(time=350.0, before=previous, throughput_before=before, kind=kind)  # type: ignore[arg-type]
    decision = auto_scale(ctx, current, samples, 1000.0, SETTINGS, last_step=step)
    if decision.plan is not None and decision.kind == "rollback":
        return decision.plan.reason
    return None


@pytest.mark.parametrize(
    ("kind", "after", "undone"),
    [
        # memory: a dip is noise (kept); a fall of rollback_drop (20%) or more is undone
        ("memory", 0.90, False),
        ("memory", 0.79, True),
        # a rollback returned to a measured configuration: never undone, however it measures
        ("rollback", 0.70, False),
    ],
)
def test_rollback_drop_undoes_a_memory_step_that_loses_a_fifth_and_never_a_rollback(
    kind: str, after: float, undone: bool
) -> None:
    reason = _judged(kind, 10_000.0, 10_000.0 * after)
    assert (reason is not None) is undone, reason
    if undone:
        assert reason is not None and "after the memory change" in reason


def test_a_start_plan_is_left_as_soon_as_its_mean_is_steady() -> None:
    """Issue 30: the plan a job started with is decided on after max(2, (z·cv/min_gain)²)
    samples; noisy samples, or a plan the job stepped to, wait for min_samples."""
    from dlrover_kfp.core.planner.auto_scale import samples_needed  # noqa: PLC0415
    from dlrover_kfp.core.usage import config_of  # noqa: PLC0415

    s = SETTINGS.auto_scale
    truth = Truth()
    start = plan(2, 1.0, 1, 1.0)
    steady = truth.samples(start, 0.0, 3, random.Random(0), noise=0.01)
    cur = config_of(steady[0])
    assert samples_needed(steady, steady, cur, s) == 2
    noisy = truth.samples(start, 0.0, 3, random.Random(0), noise=0.2)
    assert samples_needed(noisy, noisy, cur, s) == s.min_samples
    moved = truth.samples(plan(4, 1.0, 1, 1.0), 0.0, 3, random.Random(1), noise=0.01) + steady
    assert samples_needed(moved, steady, cur, s) == s.min_samples


def test_the_workers_cpu_floor_is_their_work_per_sample_not_their_pod_size() -> None:
    """Issue 30: workers that use 2.5 of their 4 cores at 8 workers may be planned as more
    workers of fewer cores each (half the samples each needs half the cores); never with fewer
    cores in all than their measured work per sample times the predicted throughput (x 1.25).
    The per-pod floor this replaced held them at 2.5 x 1.25 -> 3.5 cores or more."""
    from dlrover_kfp.core.perf_model import PerfModel  # noqa: PLC0415
    from dlrover_kfp.core.planner.search import CpuBounds, MemoryNeeds, search  # noqa: PLC0415

    # Worker-bound overlap model with a per-step overhead: smaller pods do more per core.
    model = PerfModel(theta=(2e-3, 4e-5, 1e-7, 0.0, 0.0), overlap=True)
    ctx = context_from_spec(spec(36.0), SETTINGS)
    memory = MemoryNeeds(worker_mb=1024, ps_fixed_mb=RUNTIME_MB, ps_state_mb=512)
    cur = Config(8, 1, 4.0, 4.0)
    x_cur = model.throughput(cur, ctx.batch_size)
    per_sample = 8 * 2.5 / x_cur  # core-seconds per sample, all workers together
    bounds = CpuBounds(worker_cores_per_sample=per_sample)
    target = search(model, ctx, memory, bounds, 0.7, include=(cur,), objective="cost").target
    c = target.config
    assert c.worker_cpu < 2.5, c  # below the per-pod use: the old floor forbade it
    assert c.workers * c.worker_cpu >= per_sample * target.throughput * (1 + bounds.headroom)


def test_no_probe_of_a_shape_whose_memory_need_has_outgrown_the_quota(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Workers idle on half their CPU (a probe's cue), but the PS' measured growth now needs
    more memory than the current shape holds in the quota. A probe keeps the shape, so it
    cannot be applied; it used to be swapped for the search's target, a different shape
    applied under the probe's name and judged as one. Now the probe waits (Stage 3 reshapes
    for memory)."""
    import importlib  # noqa: PLC0415

    from dlrover_kfp.core.planner.search import MemoryNeeds  # noqa: PLC0415

    # the module, not the function the package exports under the same name
    module = importlib.import_module("dlrover_kfp.core.planner.auto_scale")

    truth = Truth()
    current = plan(8, 4.0, 2, 4.0)
    # the job's CPU quota is what it has: no growth competes with the probe
    ctx = context_from_spec(spec(current.total_cpu, max_workers=8, max_ps=2), SETTINGS)
    quota_mb = ctx.quota_memory_mb
    # 8 workers and 2 PS no longer fit; 4 workers do.
    need = MemoryNeeds(
        worker_mb=4096, ps_fixed_mb=RUNTIME_MB, ps_state_mb=quota_mb - 6 * 4096 - 2 * RUNTIME_MB
    )
    assert need.total_mb(8, 2) > quota_mb >= need.total_mb(4, 2)
    monkeypatch.setattr(module, "memory_needs", lambda *a, **k: (need, "raise"))
    samples = truth.samples(current, 400.0, SAMPLES_PER_ROUND, random.Random(0))
    idle = [
        dataclasses.replace(
            x,
            nodes=tuple(
                dataclasses.replace(n, cpu_used=0.4 * n.cpu_requested) if n.role == "worker" else n
                for n in x.nodes
            ),
        )
        for x in samples
    ]
    decision = auto_scale(ctx, current, idle, 1000.0, SETTINGS)
    assert decision.plan is None or "probe" not in decision.plan.reason, decision.plan.reason
    # the cue is real: with memory that fits, the same samples probe the workers
    monkeypatch.setattr(
        module,
        "memory_needs",
        lambda *a, **k: (dataclasses.replace(need, ps_state_mb=1024), "keep"),
    )
    probed = auto_scale(ctx, current, idle, 1000.0, SETTINGS)
    assert probed.plan is not None and "probe" in probed.plan.reason, probed.reason


class _Cliff(Truth):
    """A job whose workers beyond three contend for a node they share with a noisy neighbour:
    every plan with more than three workers runs at ``loss`` of three workers' rate with the
    same pods otherwise (the quickstart's round 3 under load: growth steps from 3 workers
    measured -58%, -63% and -51% where the model predicted +124%, +26%, +32%)."""

    def __init__(self, worker_threads: float, loss: float) -> None:
        super().__init__(worker_threads=worker_threads, ps_cost=5e-6, compute=4e-5)
        self.loss = loss

    def throughput(self, c: Config) -> float:
        if c.workers <= 3:
            return super().throughput(c)
        return self.loss * super().throughput(Config(3, c.ps, c.worker_cpu, c.ps_cpu))


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("quota", [3.0, 4.0])
@pytest.mark.parametrize("worker_threads", [0.5, 1.0])
def test_a_direction_that_measured_worse_is_tried_at_most_once_more_and_the_run_ends_on_its_best(
    worker_threads: float, quota: float, seed: int
) -> None:
    """The thrash of quickstart round 3 (3w -> 5w, 6w, 7w, each rolled back) replayed with a
    scripted truth and a fake clock: the model predicts +124% for 5 workers where the job
    measures -58%. After the first rolled-back step to more workers, more workers are tried
    at most once more, and the run ends on the fastest plan it ran. Without the measured
    corrections (search.Correction) the 3-core quota's runs tried 4, 5 and 4 workers."""
    truth = _Cliff(worker_threads, loss=0.42)
    start = plan(3, 0.5, 1, 0.25)
    history = run_loop(truth, start, quota, 24, seed, max_workers=8, max_ps=3, settings=_DEFAULTS)
    configs = [config(h) for h in history]
    runs = [c for k, c in enumerate(configs) if k == 0 or configs[k - 1] != c]
    assert runs[1].workers > 3, runs  # the model's first step: more workers
    assert len([c for c in runs if c.workers > 3]) <= 2, runs
    assert truth.throughput(runs[-1]) >= 0.97 * max(truth.throughput(c) for c in runs), runs


def test_a_step_that_moves_the_ps_keeps_its_workers_resize_in_place() -> None:
    """One worker at 0.25 core and 2 GiB using 300 MiB, its PS at 1 core: the step gives the
    worker 0.5 core and the PS less. The PS moves (never in place); the worker's CPU change can
    still be an in-place resize, and the measured memory's cut (2048 -> 512 MiB) would make it a
    replacement: the worker keeps its memory. (An elastic run of one worker had its first step
    replace worker 0 so.)"""
    limits = PlannerSettings(node=NodeLimits(min_cpu=0.25, cpu_step=0.25, min_memory_mb=512))
    ctx = context_from_spec(spec(4.0, max_workers=1, max_ps=1, quota_memory="8Gi"), limits)
    current = ResourcePlan(
        workers=NodeGroup(count=1, cpu=0.25, memory_mb=2048),
        ps=NodeGroup(count=1, cpu=1.0, memory_mb=2048),
        stage=Stage.MANUAL,
        reason="the request",
    )
    truth = Truth(worker_threads=4.0, ps_cost=1e-6, compute=4e-5)
    samples = [
        dataclasses.replace(
            s,
            nodes=tuple(
                dataclasses.replace(n, memory_used_mb=300) if n.role == "worker" else n
                for n in s.nodes
            ),
        )
        for s in truth.samples(current, 0.0, 12, random.Random(0))
    ]
    for resize_in_place, kept in ((True, True), (False, False)):
        decision = auto_scale(
            ctx, current, samples, samples[-1].time + 60, limits, resize_in_place=resize_in_place
        )
        assert decision.plan is not None and decision.plan.workers.cpu > 0.25, decision.reason
        assert decision.plan.ps != current.ps  # the PS move, not in place
        kinds = {
            c.kind
            for c in reconcile(plan_pods(current), decision.plan, math.inf, 1 << 62)
            if c.kind in (ChangeKind.RESIZE_WORKER, ChangeKind.REMOVE_WORKER)
        }
        # In place where the backend resizes; a replacement (memory right-sized) where not.
        assert kinds == ({ChangeKind.RESIZE_WORKER} if kept else {ChangeKind.REMOVE_WORKER})
        assert (decision.plan.workers.memory_mb == 2048) is kept, decision.plan.workers


def _at(plan_: ResourcePlan, t0: float, n: int, rate: float) -> list[RuntimeSample]:
    """n samples of ``plan_`` measuring ``rate`` samples/s."""
    truth = Truth(worker_threads=2.0, ps_cost=5e-6, compute=4e-5)
    return [
        dataclasses.replace(x, throughput=rate * (1 + 0.01 * (i % 3 - 1)))
        for i, x in enumerate(truth.samples(plan_, t0, n, random.Random(0)))
    ]


@pytest.mark.parametrize("cheaper", [False, True])
def test_a_run_does_not_stay_on_a_plan_measured_slower_than_one_it_left(cheaper: bool) -> None:
    """The run left 3 workers (20,000 samples/s measured) for 5 workers and 2 PS, which
    measure 6,000 (no step on record to judge: a resumed master, a step taken as a repair).
    It goes back to the faster shape, which costs less: a rollback, whatever the model says.
    A shape left for a cheaper one is the objective's trade and stays, unless it is also
    slower by min_gain at no more cost, which the cheaper case's rates are not."""
    ctx = context_from_spec(spec(8.0, max_workers=8, max_ps=3), _DEFAULTS)
    fast = plan(3, 0.5, 1, 0.25)
    slow = plan(5, 0.5, 2, 0.5) if not cheaper else plan(2, 0.5, 1, 0.25)
    rate_slow = 6_000.0 if not cheaper else 19_000.0
    n = _DEFAULTS.auto_scale.min_samples
    samples = _at(fast, 0.0, n, 20_000.0) + _at(slow, 30.0 * n + 60, n, rate_slow)
    now = samples[-1].time + _DEFAULTS.auto_scale.min_interval_s
    decision = auto_scale(ctx, slow, samples, now, _DEFAULTS)
    if cheaper:
        assert decision.plan is None or decision.kind != "rollback", decision.reason
    else:
        assert decision.plan is not None and decision.kind == "rollback", decision.reason
        assert config(decision.plan) == config(fast), decision.plan
        assert "back to 3w x 0.5cpu + 1ps x 0.25cpu: measured 19960" in decision.plan.reason
