"""Optimus: its model fit, its greedy allocation, its profiling, and a closed loop on a truth."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import pytest

from dlrover_kfp.core.plan import NodeGroup, ResourcePlan, Stage
from dlrover_kfp.core.profile import NodeSample, RuntimeSample
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.sim.cluster.api import JobView, Role
from dlrover_kfp.sim.cluster.policies.optimus import (
    MIN_SAMPLES,
    Bounds,
    OptimusModel,
    OptimusPolicy,
    Pods,
    design_rank,
    fit_optimus,
    greedy_allocation,
    job_bounds,
    profiling_shapes,
)
from dlrover_kfp.sim.workload import Truth
from tests.factories import DEFAULT_TABLES

THETA = (4e-4, 3e-4, 5e-5, 8e-5)
ROUND_S = 600.0
SAMPLE_S = 60.0


def job_spec(
    quota_cpu: float = 48,
    quota_memory: str = "192Gi",
    request: bool = True,
    max_workers: int = 32,
    max_ps: int = 8,
) -> JobSpec:
    resources: dict[str, object] = {"limits": {"cpu": quota_cpu, "memory": quota_memory}}
    if request:
        resources |= {
            "workers": {"count": 4, "cpu": 4, "memory": "8Gi"},
            "ps": {"count": 2, "cpu": 4, "memory": "8Gi"},
        }
    return JobSpec(
        name="ctr",
        scenario="ads-ctr",
        model={"table_sizes": list(DEFAULT_TABLES)},  # type: ignore[arg-type]
        data={"format": "synthetic", "rows": 2_000_000_000},  # type: ignore[arg-type]
        training={"batch_size": 512, "epochs": 2},  # type: ignore[arg-type]
        resources=resources,  # type: ignore[arg-type]
        elastic={"max_workers": max_workers, "max_ps": max_ps},  # type: ignore[arg-type]
    )


def model_sample(plan: ResourcePlan, t: float, rng: random.Random, noise: float) -> RuntimeSample:
    """A sample whose throughput follows the Optimus form with :data:`THETA` exactly."""
    x = OptimusModel(THETA).throughput(plan.workers.count, plan.ps.count) * rng.gauss(1, noise)
    groups: tuple[tuple[Role, NodeGroup], ...] = (("worker", plan.workers), ("ps", plan.ps))
    nodes = tuple(
        NodeSample(
            name=f"{role}-{k}",
            role=role,
            cpu_used=g.cpu / 2,
            cpu_requested=g.cpu,
            memory_used_mb=g.memory_mb // 2,
            memory_requested_mb=g.memory_mb,
        )
        for role, g in groups
        for k in range(g.count)
    )
    return RuntimeSample(
        time=t,
        global_step=int(t),
        throughput=x,
        workers=plan.workers.count,
        ps=plan.ps.count,
        worker_cpu=plan.workers.cpu,
        ps_cpu=plan.ps.cpu,
        nodes=nodes,
    )


Sampler = Callable[[ResourcePlan, float, random.Random], RuntimeSample]
Shape = tuple[int, int]


def run_loop(
    policy: OptimusPolicy, spec: JobSpec, sampler: Sampler, rounds: int = 20, seed: int = 0
) -> list[ResourcePlan]:
    """The profiled configurations measured first (a sample each, as the engine's few steps);
    then every round: 10 samples at the current plan, then a decision, which is applied."""
    rng = random.Random(seed)
    plan = policy.initial(spec, 0.0)
    profile = policy.profile_plans(spec, plan)
    plans = [plan, *profile]
    profiled = {  # a few steps' mean each
        (p.workers.count, p.ps.count): sum(sampler(p, 0.0, rng).throughput for _ in range(4)) / 4
        for p in profile
    }
    samples: list[RuntimeSample] = []
    t = 0.0
    for r in range(rounds):
        for _ in range(int(ROUND_S / SAMPLE_S)):
            t += SAMPLE_S
            samples.append(sampler(plan, t, rng))
        view = JobView(
            job_id="job-1",
            spec=spec,
            submitted_at=0.0,
            started_at=0.0,
            now=t,
            plan=plan,
            samples=tuple(samples),
            events=(),
            progress=r / (2 * rounds),
            profiled=profiled,
        )
        new = policy.decide(view)
        if new is not None:
            plan = new
            plans.append(new)
    return plans


def within_limits(plan: ResourcePlan, spec: JobSpec) -> bool:
    limits = spec.resources.limits
    assert limits is not None
    el = spec.elastic
    return (
        plan.total_cpu <= limits.cpu + 1e-9
        and plan.total_memory_mb <= limits.memory
        and el.min_workers <= plan.workers.count <= el.max_workers
        and el.min_ps <= plan.ps.count <= el.max_ps
    )


def test_identity() -> None:
    policy = OptimusPolicy()
    assert policy.name == "optimus"
    assert policy.elastic is False
    assert policy.decision_interval_s == 600.0


def test_fit_recovers_theta_from_exact_throughputs() -> None:
    truth = OptimusModel(THETA)
    shapes = [(1, 1), (2, 1), (2, 2), (4, 2), (4, 1)]
    model = fit_optimus({s: truth.throughput(*s) for s in shapes})
    assert model is not None
    assert model.theta == pytest.approx(THETA, rel=1e-6)


def test_fit_needs_a_positive_throughput() -> None:
    assert fit_optimus({}) is None
    assert fit_optimus({(2, 1): 0.0}) is None


def test_initial_is_the_users_request_with_fixed_containers() -> None:
    spec = job_spec()
    plan = OptimusPolicy().initial(spec, 0.0)
    assert plan.stage is Stage.COLD_START
    assert plan.workers == NodeGroup(count=4, cpu=4.0, memory_mb=8192)
    assert plan.ps == NodeGroup(count=2, cpu=4.0, memory_mb=8192)


def test_initial_without_request_is_small_and_within_quota() -> None:
    spec = job_spec(quota_cpu=8, quota_memory="16Gi", request=False)
    plan = OptimusPolicy().initial(spec, 0.0)
    assert within_limits(plan, spec)
    assert plan.workers.count == 2
    assert plan.ps.count == 1
    assert plan.workers.cpu == 1.0  # quota/8, at least 1 core


def test_profiling_shapes_identify_every_coefficient_within_the_quota() -> None:
    pods = Pods(worker_cpu=4.0, worker_memory_mb=8192, ps_cpu=4.0, ps_memory_mb=8192)
    bounds = Bounds(48.0, 192 * 1024, 1, 32, 1, 8)
    shapes = profiling_shapes((4, 2), pods, bounds, min_ps=1)
    assert shapes[0] == (4, 2)
    assert len(shapes) == len(set(shapes)) == 5
    assert design_rank(shapes) == 4
    assert all(bounds.fits(pods, s) for s in shapes)
    # a quota that holds two pods leaves only (1, 1)
    tiny = Bounds(8.0, 192 * 1024, 1, 32, 1, 8)
    assert profiling_shapes((1, 1), pods, tiny, min_ps=1) == [(1, 1)]


def test_closed_loop_fit_recovers_a_known_model() -> None:
    """Samples generated by f(p, w) with known θ: after profiling, θ is within 10%."""
    policy = OptimusPolicy()
    spec = job_spec()
    plans = run_loop(policy, spec, lambda p, t, rng: model_sample(p, t, rng, noise=0.01))
    shapes = {(p.workers.count, p.ps.count) for p in plans[:5]}
    assert len(shapes) == 5
    assert design_rank(shapes) == 4
    model = policy.model("job-1")
    assert model is not None
    for fitted, true in zip(model.theta, THETA, strict=True):
        assert fitted == pytest.approx(true, rel=0.10)
    assert all(within_limits(p, spec) for p in plans)
    assert all(p.workers.cpu == 4.0 and p.ps.cpu == 4.0 for p in plans)  # fixed containers


def _bounds(quota_cpu: float) -> Bounds:
    return Bounds(quota_cpu, 10**6, 1, 64, 1, 64)


UNIT = Pods(worker_cpu=1.0, worker_memory_mb=1024, ps_cpu=1.0, ps_memory_mb=1024)


def test_greedy_adds_ps_when_the_w_over_p_term_dominates() -> None:
    ps_bound = OptimusModel((1e-5, 1e-3, 0.0, 0.0))
    assert greedy_allocation(ps_bound, UNIT, _bounds(3), 1e6, (1, 1)) == (1, 2)
    w, p = greedy_allocation(ps_bound, UNIT, _bounds(24), 1e6, (1, 1)) or (0, 0)
    assert w + p == 24
    assert p > w


def test_greedy_adds_workers_when_the_w_over_p_term_is_small() -> None:
    worker_bound = OptimusModel((1e-3, 1e-6, 0.0, 1e-5))
    assert greedy_allocation(worker_bound, UNIT, _bounds(3), 1e6, (1, 1)) == (2, 1)
    w, p = greedy_allocation(worker_bound, UNIT, _bounds(24), 1e6, (1, 1)) or (0, 0)
    assert (w, p) == (23, 1)


def test_greedy_stops_when_nothing_gains() -> None:
    # only θ2·w: a worker adds as much time per sample as it brings, a PS adds nothing
    flat = OptimusModel((0.0, 0.0, 1e-3, 0.0))
    assert greedy_allocation(flat, UNIT, _bounds(24), 1e6, (1, 1)) == (1, 1)


def test_greedy_weighs_units_by_their_dominant_share() -> None:
    # the same model prefers PS, but a PS costs 8x a worker's CPU
    model = OptimusModel((1e-5, 1e-3, 0.0, 0.0))
    pricey_ps = Pods(worker_cpu=1.0, worker_memory_mb=1024, ps_cpu=8.0, ps_memory_mb=1024)
    assert greedy_allocation(model, pricey_ps, _bounds(10), 1e6, (1, 1)) == (2, 1)


def test_closed_loop_on_truth_stays_within_quota_and_improves() -> None:
    truth = Truth()
    spec = job_spec()
    policy = OptimusPolicy()
    plans = run_loop(policy, spec, lambda p, t, rng: truth.samples(p, t, 1, rng)[0])
    assert all(within_limits(p, spec) for p in plans)
    assert all(p.stage is Stage.AUTO_SCALE for p in plans[1:])
    assert len(plans) >= 5  # profiled, then allocated

    def speed(p: ResourcePlan) -> float:
        return truth.samples(p, 0.0, 1, random.Random(0), noise=0.0)[0].throughput

    assert speed(plans[-1]) > 1.5 * speed(plans[0])
    best = max(
        speed(p)
        for w in range(1, 13)
        for ps in range(1, 9)
        if (p := run_plan(w, ps)).total_cpu <= 48
    )
    assert speed(plans[-1]) >= 0.8 * best


def run_plan(w: int, p: int) -> ResourcePlan:
    return ResourcePlan(
        workers=NodeGroup(count=w, cpu=4.0, memory_mb=8192),
        ps=NodeGroup(count=p, cpu=4.0, memory_mb=8192),
        stage=Stage.AUTO_SCALE,
        reason="candidate",
    )


def profiled(policy: OptimusPolicy, spec: JobSpec, plan: ResourcePlan) -> dict[Shape, float]:
    """The profiling configurations, measured exactly on the Optimus form."""
    rng = random.Random(0)
    return {
        (p.workers.count, p.ps.count): model_sample(p, 0.0, rng, 0.0).throughput
        for p in policy.profile_plans(spec, plan)
    }


def view(
    spec: JobSpec,
    plan: ResourcePlan,
    samples: tuple[RuntimeSample, ...] = (),
    measured: dict[Shape, float] | None = None,
) -> JobView:
    return JobView(
        job_id="job-1",
        spec=spec,
        submitted_at=0.0,
        started_at=0.0,
        now=600.0,
        plan=plan,
        samples=samples,
        events=(),
        progress=0.2,
        profiled=measured or {},
    )


def test_failures_other_than_oom_keep_the_plan() -> None:
    spec = job_spec()
    policy = OptimusPolicy()
    plan = policy.initial(spec, 0.0)
    assert policy.after_failure(view(spec, plan), "worker", "NodeLost") is None
    assert policy.after_failure(view(spec, plan), "ps", "Evicted") is None


def test_oom_doubles_the_roles_memory_and_keeps_it() -> None:
    spec = job_spec()
    policy = OptimusPolicy()
    plan = policy.initial(spec, 0.0)
    new = policy.after_failure(view(spec, plan), "ps", "OOMKilled")
    assert new is not None
    assert new.stage is Stage.POST_SCALE
    assert new.ps == NodeGroup(count=2, cpu=4.0, memory_mb=16384)
    assert new.workers == plan.workers
    # later plans (the greedy allocation here) keep the bigger PS containers
    rng = random.Random(1)
    samples = tuple(model_sample(new, 60.0 * (i + 1), rng, 0.0) for i in range(MIN_SAMPLES + 1))
    nxt = policy.decide(view(spec, new, samples, profiled(policy, spec, plan)))
    assert nxt is not None
    assert nxt.ps.memory_mb == 16384


def test_oom_growth_is_capped_by_the_quota() -> None:
    # 4 workers x 8Gi + 2 PS x 8Gi = 48Gi of a 56Gi quota: doubling a worker needs 32Gi more
    spec = job_spec(quota_memory="56Gi")
    policy = OptimusPolicy()
    plan = policy.initial(spec, 0.0)
    new = policy.after_failure(view(spec, plan), "worker", "OOMKilled")
    assert new is not None
    assert new.workers.memory_mb == 16384
    assert new.workers.count == 2  # workers given up to make room
    assert within_limits(new, spec)


def test_a_restarted_incarnation_is_read_afresh() -> None:
    spec = job_spec()
    policy = OptimusPolicy()
    plan = policy.initial(spec, 0.0)
    rng = random.Random(2)
    measured = profiled(policy, spec, plan)
    first = tuple(model_sample(plan, 60.0 * (i + 1), rng, 0.0) for i in range(2))
    assert policy.decide(view(spec, plan, first, measured)) is None  # 1 after warm-up: too few
    # the job restarted: its samples start again; warm-up skipped again, then 3 count
    again = tuple(model_sample(plan, 60.0 * (i + 1), rng, 0.0) for i in range(4))
    restarted = JobView(
        job_id="job-1",
        spec=spec,
        submitted_at=0.0,
        started_at=1000.0,
        now=1300.0,
        plan=plan,
        samples=again,
        events=(),
        progress=0.1,
        restarts=1,
        profiled=measured,
    )
    nxt = policy.decide(restarted)
    assert nxt is not None
    assert "greedy" in nxt.reason  # the current shape is measured: the model allocates


def test_job_bounds_without_limits_are_the_planners_and_the_start_fits_them() -> None:
    """Without ``limits`` the quota is the planner's default (32 cores), not the larger request
    (80 cores): the start is cut into it, as the planner's cold start cuts it (issue 26)."""
    spec = JobSpec(
        name="big",
        model={"table_sizes": list(DEFAULT_TABLES)},  # type: ignore[arg-type]
        data={"format": "synthetic", "rows": 1000},  # type: ignore[arg-type]
        training={"batch_size": 512},  # type: ignore[arg-type]
        resources={"workers": {"count": 10, "cpu": 8, "memory": "8Gi"}},  # type: ignore[arg-type]
    )
    bounds = job_bounds(spec)
    assert bounds.quota_cpu == 32.0
    assert bounds.quota_memory_mb == 128 * 1024
    plan = OptimusPolicy().initial(spec, 0.0)
    assert plan.workers.total_cpu + plan.ps.total_cpu <= 32.0
    assert plan.workers.cpu == 8.0  # fixed-size containers: fewer of them, not smaller


def test_profiling_is_a_few_small_configurations_within_the_start() -> None:
    """Optimus profiles before it trains (a few steps each, run by the engine): small
    configurations within the starting counts, fixed containers, at most PROFILED_CONFIGS - 1."""
    spec = job_spec()
    policy = OptimusPolicy()
    plan = policy.initial(spec, 0.0)
    profile = policy.profile_plans(spec, plan)
    assert 3 <= len(profile) <= 4
    for p in profile:
        assert p.workers.count <= 4 and p.ps.count <= 2
        assert (p.workers.cpu, p.ps.cpu) == (4.0, 4.0)
        assert "profiling" in p.reason
    shapes = {(p.workers.count, p.ps.count) for p in profile} | {(4, 2)}
    assert design_rank(shapes) == 4


def test_a_resize_must_save_more_than_its_restart() -> None:
    """Near the end of a job, a faster allocation that would save less remaining time than a
    restart costs is not worth its restart."""
    spec = job_spec()
    policy = OptimusPolicy()
    plan = policy.initial(spec, 0.0)
    measured = profiled(policy, spec, plan)
    rng = random.Random(4)
    samples = tuple(model_sample(plan, 60.0 * (i + 1), rng, 0.0) for i in range(MIN_SAMPLES + 1))
    early = policy.decide(view(spec, plan, samples, measured))
    assert early is not None and "greedy" in early.reason
    late = dataclasses.replace(view(spec, plan, samples, measured), job_id="job-2", progress=0.9999)
    assert policy.decide(late) is None
