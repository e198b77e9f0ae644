"""Open-source DLRover: the master's and the brain's thresholds, timing, warm start, closed loop."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import pytest

from dlrover_kfp.core.plan import NodeGroup, ResourcePlan, Stage
from dlrover_kfp.core.profile import JobProfile, NodeSample, RuntimeSample
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.sim.cluster.api import JobView
from dlrover_kfp.sim.cluster.policies.dlrover_oss import (
    DlroverOssPolicy,
    DlroverOssSettings,
    _Window,
    current_window,
    drop_ps_spikes,
    major_cluster,
    major_mean,
    worker_speed_ratio,
)
from dlrover_kfp.sim.workload import Truth
from tests.factories import DEFAULT_TABLES, make_profile

S = DlroverOssSettings()
GIB = 1024
DAY = 86400.0


def job_spec(
    quota_cpu: float = 64,
    quota_memory: str = "256Gi",
    rows: int = 50_000_000,
    scenario: str | None = "ads-ctr",
    max_workers: int = 32,
    max_ps: int = 8,
) -> JobSpec:
    return JobSpec(
        name="ctr",
        scenario=scenario,
        model={"table_sizes": list(DEFAULT_TABLES)},  # type: ignore[arg-type]
        data={"format": "synthetic", "rows": rows},  # type: ignore[arg-type]
        training={"batch_size": 512},  # type: ignore[arg-type]
        resources={"limits": {"cpu": quota_cpu, "memory": quota_memory}},  # type: ignore[arg-type]
        elastic={"max_workers": max_workers, "max_ps": max_ps},  # type: ignore[arg-type]
    )


def make_plan(
    workers: int = 4,
    worker_cpu: float = 4.0,
    worker_memory_mb: int = 8 * GIB,
    ps: int = 2,
    ps_cpu: float = 8.0,
    ps_memory_mb: int = 16 * GIB,
    brain: bool = True,
) -> ResourcePlan:
    """A plan as the policy would have returned it; ``brain``: warm-started from history."""
    return ResourcePlan(
        workers=NodeGroup(count=workers, cpu=worker_cpu, memory_mb=worker_memory_mb),
        ps=NodeGroup(count=ps, cpu=ps_cpu, memory_mb=ps_memory_mb),
        stage=Stage.WARM_START if brain else Stage.COLD_START,
        reason="test",
        similar_jobs=("hist-1",) if brain else (),
    )


def sample(
    t: float,
    plan: ResourcePlan,
    ps_util: float | Sequence[float],
    throughput: float = 10_000.0,
    worker_used: float = 2.0,
    worker_memory_used: int | None = None,
    ps_memory_used: int | Sequence[int] | None = None,
) -> RuntimeSample:
    """One sample at ``plan``: PS k uses ``ps_util[k]`` of its CPU."""
    w, p = plan.workers, plan.ps
    utils = [ps_util] * p.count if isinstance(ps_util, float | int) else list(ps_util)
    if ps_memory_used is None:
        ps_mem = [p.memory_mb // 2] * p.count
    elif isinstance(ps_memory_used, int):
        ps_mem = [ps_memory_used] * p.count
    else:
        ps_mem = list(ps_memory_used)
    nodes = [
        NodeSample(
            name=f"worker-{k}",
            role="worker",
            cpu_used=worker_used,
            cpu_requested=w.cpu,
            memory_used_mb=w.memory_mb // 2 if worker_memory_used is None else worker_memory_used,
            memory_requested_mb=w.memory_mb,
            throughput=throughput / w.count,
        )
        for k in range(w.count)
    ] + [
        NodeSample(
            name=f"ps-{k}",
            role="ps",
            cpu_used=utils[k] * p.cpu,
            cpu_requested=p.cpu,
            memory_used_mb=ps_mem[k],
            memory_requested_mb=p.memory_mb,
        )
        for k in range(p.count)
    ]
    return RuntimeSample(
        time=t,
        global_step=int(t),
        throughput=throughput,
        workers=w.count,
        ps=p.count,
        worker_cpu=w.cpu,
        ps_cpu=p.cpu,
        nodes=tuple(nodes),
    )


def run(
    plan: ResourcePlan, start: float, n: int, ps_util: float | Sequence[float], **kw: object
) -> list[RuntimeSample]:
    """``n`` samples at ``plan``, one every 60 s after ``start``."""
    return [sample(start + 60.0 * (i + 1), plan, ps_util, **kw) for i in range(n)]  # type: ignore[arg-type]


def view(
    spec: JobSpec,
    plan: ResourcePlan,
    samples: Sequence[RuntimeSample],
    now: float | None = None,
    job_id: str = "job-1",
    submitted_at: float = 0.0,
) -> JobView:
    return JobView(
        job_id=job_id,
        spec=spec,
        submitted_at=submitted_at,
        started_at=0.0,
        now=samples[-1].time + 1.0 if now is None else now,
        plan=plan,
        samples=tuple(samples),
        events=(),
        progress=0.1,
    )


def within_limits(plan: ResourcePlan, spec: JobSpec) -> bool:
    limits = spec.resources.limits
    assert limits is not None
    el = spec.elastic
    return (
        plan.total_cpu <= limits.cpu + 1e-9
        and plan.total_memory_mb <= limits.memory
        and el.min_workers <= plan.workers.count <= min(el.max_workers, S.max_workers)
        and el.min_ps <= plan.ps.count <= min(el.max_ps, S.max_ps)
    )


def within_clamps(plan: ResourcePlan) -> bool:
    return all(
        S.node_min_cpu <= g.cpu <= S.node_max_cpu
        and S.node_min_memory_mb <= g.memory_mb <= S.node_max_memory_mb
        for g in (plan.workers, plan.ps)
    )


def test_identity() -> None:
    policy = DlroverOssPolicy()
    assert policy.name == "dlrover-oss"
    assert policy.elastic is True
    assert policy.decision_interval_s == 30.0


# -- robust statistics and sample checks -------------------------------------------------------


def test_major_cluster_grows_from_the_median_toward_the_nearer_values() -> None:
    assert major_cluster([50, 1, 11, 13, 10]) == [10, 11, 13]
    assert major_mean([1, 10, 11, 13, 50]) == pytest.approx(34 / 3)
    assert major_cluster([6, 8, 12]) == [6, 8]
    # one side exhausted: keep growing on the other until more than half
    assert major_cluster([4.8, 8.0]) == [4.8, 8.0]
    assert major_cluster([]) == []


def test_ps_spikes_are_dropped() -> None:
    plan = make_plan()
    window = run(plan, 0.0, 5, 0.4)
    window[2] = sample(window[2].time, plan, [0.4, 0.9])
    kept = drop_ps_spikes(window, S.spike_factor)
    assert [s.time for s in kept] == [60.0, 120.0, 240.0, 300.0]


def test_the_window_kept_between_decisions_is_the_current_window() -> None:
    # The policy keeps each job's window up to date from the samples added since its last
    # decision; at every point it must equal the window read from all the samples.
    small, large = make_plan(workers=4), make_plan(workers=8)
    bare = dataclasses.replace(sample(0.0, small, 0.4), nodes=())  # no PS data: skipped
    samples: list[RuntimeSample] = []
    window = _Window()
    plans = [small] * 4 + [large] * 3 + [small] * 3 + [large] * 2
    for k, at in enumerate(plans):
        samples.append(bare if k == 2 else sample(60.0 * k, at, 0.4))
        for plan in (small, large):
            assert window.update(samples, plan) == current_window(samples, plan)
    assert [s.time for s in window.update(samples, large)] == [600.0, 660.0]
    # A new list of samples (a restarted job's) starts the window afresh.
    assert window.update(samples, small) == []
    fresh = samples[7:10]
    assert window.update(fresh, small) == current_window(fresh, small) != []


def test_worker_speed_ratio_of_the_last_scale_up() -> None:
    before, after = make_plan(workers=4), make_plan(workers=8)
    samples = run(before, 0.0, 3, 0.5, throughput=4000.0) + run(
        after, 180.0, 3, 0.5, throughput=4400.0
    )
    # +400 samples/s for 4 more workers, against 1000 per old worker
    assert worker_speed_ratio(samples) == pytest.approx(0.1)
    assert worker_speed_ratio(samples[:3]) is None


# -- warm start -------------------------------------------------------------------------------


def history() -> list[JobProfile]:
    """Three finished jobs, one sample each (so every peak is exact):

    job    PS            PS CPU used/PS   total PS CPU   PS mem/PS   worker CPU   worker mem
    h-1    2 x 8 cores   4.0              8.0            8192        4.0          4096
    h-2    4 x 4 cores   3.0              12.0           8192        12.8         20000
    h-3    2 x 10 cores  3.0              6.0            8192        2.0          4096
    """
    common = {"samples": 1, "ps_memory_mb": 16384, "memory_used_fraction": 0.5}
    return [
        make_profile(
            "h-1", ps=2, ps_cpu=8.0, ps_cpu_used_fraction=0.5, worker_cpu=8.0,
            worker_cpu_used_fraction=0.5, worker_memory_mb=8192, **common,  # type: ignore[arg-type]
        ),
        make_profile(
            "h-2", ps=4, ps_cpu=4.0, ps_cpu_used_fraction=0.75, worker_cpu=16.0,
            worker_cpu_used_fraction=0.8, worker_memory_mb=40000, **common,  # type: ignore[arg-type]
        ),
        make_profile(
            "h-3", ps=2, ps_cpu=10.0, ps_cpu_used_fraction=0.3, worker_cpu=4.0,
            worker_cpu_used_fraction=0.5, worker_memory_mb=8192, **common,  # type: ignore[arg-type]
        ),
    ]  # fmt: skip


def test_warm_start_reproduces_the_brains_formulas() -> None:
    policy = DlroverOssPolicy()
    for profile in history():
        policy.finished(profile)
    plan = policy.initial(job_spec(), now=3600.0)
    assert plan.stage is Stage.WARM_START
    assert set(plan.similar_jobs) == {"h-1", "h-2", "h-3"}
    # per-PS CPU = max mean PS CPU (4.0) + 4; total = 1.5 x mean(major([8, 12, 6]) = [6, 8])
    # = 10.5; count = ceil(10.5 / 8) = 2; memory = 1.2 x max(8192, 32768 / 2)
    assert plan.ps == NodeGroup(count=2, cpu=8.0, memory_mb=19661)
    # worker CPU = max(ceil(12.8), 12) = 13; memory = max(1.5 x 20000, 16 GiB) = 30000
    assert plan.workers == NodeGroup(count=1, cpu=13.0, memory_mb=30000)


def test_warm_start_uses_the_same_scenario_within_seven_days() -> None:
    policy = DlroverOssPolicy()
    for profile in history():
        policy.finished(profile)
    policy.finished(make_profile("other", scenario="search", ps=8, ps_cpu=30.0, samples=1))
    assert policy.initial(job_spec(), now=3600.0).similar_jobs == ("h-1", "h-2", "h-3")
    assert policy.initial(job_spec(scenario="search"), now=3600.0).similar_jobs == ("other",)
    # eight days later the history is too old
    late = policy.initial(job_spec(), now=8 * DAY)
    assert late.stage is Stage.COLD_START
    assert late.similar_jobs == ()


def test_history_is_dated_by_the_simulated_submission() -> None:
    policy = DlroverOssPolicy()
    spec = job_spec()
    plan = make_plan()
    policy.decide(view(spec, plan, run(plan, 0.0, 1, 0.3), job_id="h-1", submitted_at=5 * DAY))
    policy.finished(history()[0])  # run_id "h-1": submitted at day 5
    assert policy.initial(spec, now=11 * DAY).similar_jobs == ("h-1",)
    assert policy.initial(spec, now=12.5 * DAY).similar_jobs == ()


def test_no_history_gives_four_ps_of_12_cores_and_16_gib() -> None:
    spec = job_spec(quota_cpu=64)
    plan = DlroverOssPolicy().initial(spec, 0.0)
    assert plan.stage is Stage.COLD_START
    assert plan.ps == NodeGroup(count=4, cpu=12.0, memory_mb=16 * GIB)
    # the master's create rule: min(ceil(64 / 5), 16) cores, min(256Gi / 5, 8 GiB)
    assert plan.workers == NodeGroup(count=1, cpu=13.0, memory_mb=8 * GIB)


def test_no_history_is_clamped_to_a_small_quota() -> None:
    spec = job_spec(quota_cpu=32, quota_memory="40Gi")
    plan = DlroverOssPolicy().initial(spec, 0.0)
    assert within_limits(plan, spec)
    assert plan.ps.cpu == 12.0
    assert plan.ps.memory_mb == 16 * GIB
    # 4 x 12 cores and 4 x 16 GiB do not fit with a 7-core, 8 GiB worker: 2 PS do
    assert plan.ps.count == 2
    assert plan.workers.count == 1


# -- brain: worker scaling ------------------------------------------------------------------


def test_exhausted_ps_removes_a_worker() -> None:
    spec = job_spec(quota_cpu=400, quota_memory="1000Gi", max_workers=60)
    # PS already at the 32-core clamp, so the hot-PS rule has nothing to give
    plan = make_plan(workers=10, ps_cpu=32.0)
    new = DlroverOssPolicy().decide(view(spec, plan, run(plan, 0.0, 5, [1.0, 0.5])))
    assert new is not None
    assert new.stage is Stage.AUTO_SCALE
    assert new.workers.count == 9
    assert new.ps == plan.ps
    assert new.similar_jobs == plan.similar_jobs


def test_low_ps_utilisation_grows_workers_by_the_formula() -> None:
    spec = job_spec(quota_cpu=400, quota_memory="1000Gi", max_workers=60)
    policy = DlroverOssPolicy()
    plan = make_plan(workers=4)
    # first step, a long job (50M rows at 10k/s): ceil(0.8 / 0.2 x 4) = 16 <= 32
    first = policy.decide(view(spec, plan, run(plan, 0.0, 5, 0.2)))
    assert first is not None
    assert first.workers.count == 16
    samples = run(plan, 0.0, 5, 0.2) + run(first, 300.0, 5, 0.5, throughput=30_000.0)
    # later: ceil(0.8 / 0.5 x 16) = 26, at most +8 per step -> 24
    second = policy.decide(view(spec, first, samples))
    assert second is not None
    assert second.workers.count == 24
    samples += run(second, 600.0, 5, 0.7, throughput=40_000.0)
    # ceil(0.8 / 0.7 x 24) = 28 within +8
    third = policy.decide(view(spec, second, samples))
    assert third is not None
    assert third.workers.count == 28


def test_first_step_of_a_short_job_jumps_to_10_workers() -> None:
    spec = job_spec(quota_cpu=400, quota_memory="1000Gi", rows=1_000_000)  # 100 s at 10k/s
    plan = make_plan(workers=4)
    new = DlroverOssPolicy().decide(view(spec, plan, run(plan, 0.0, 5, 0.2)))
    assert new is not None
    assert new.workers.count == 10


def test_no_growth_at_high_utilisation_or_after_a_throughput_drop() -> None:
    spec = job_spec(quota_cpu=400, quota_memory="1000Gi")
    # PS at the 32-core clamp: the hot-PS rule (> 0.8) has nothing to give
    plan = make_plan(workers=8, ps_cpu=32.0)
    assert DlroverOssPolicy().decide(view(spec, plan, run(plan, 0.0, 5, 0.85))) is None
    assert DlroverOssPolicy().decide(view(spec, plan, run(plan, 0.0, 5, 0.84))) is not None
    before = make_plan(workers=4, ps_cpu=32.0)
    dropped = run(before, 0.0, 5, 0.2, throughput=10_000.0) + run(
        plan, 300.0, 5, 0.2, throughput=8_000.0
    )
    assert DlroverOssPolicy().decide(view(spec, plan, dropped)) is None
    kept = run(before, 0.0, 5, 0.2, throughput=10_000.0) + run(
        plan, 300.0, 5, 0.2, throughput=8_100.0
    )
    assert DlroverOssPolicy().decide(view(spec, plan, kept)) is not None


@pytest.mark.parametrize(
    ("memory", "used", "after"),
    [(8 * GIB, 7 * GIB, 11469), (20 * GIB, 19 * GIB, 28 * GIB)],  # 1.6 x used, <= +8 GiB
)
def test_brain_worker_memory_follows_use_by_at_most_8_gib(
    memory: int, used: int, after: int
) -> None:
    spec = job_spec(quota_cpu=400, quota_memory="1000Gi")
    plan = make_plan(workers=4, worker_memory_mb=memory)
    samples = run(plan, 0.0, 5, 0.2, worker_memory_used=used)
    new = DlroverOssPolicy().decide(view(spec, plan, samples))
    assert new is not None
    assert new.workers.memory_mb == after


def test_growth_respects_the_quota() -> None:
    spec = job_spec(quota_cpu=40, quota_memory="1000Gi")
    plan = make_plan(workers=4)  # 16 cores of workers + 16 of PS
    new = DlroverOssPolicy().decide(view(spec, plan, run(plan, 0.0, 5, 0.2)))
    assert new is not None
    assert new.workers.count == 6  # 24 cores left for 4-core workers
    assert within_limits(new, spec)


# -- hot PS -----------------------------------------------------------------------------------


def test_brain_hot_ps_raises_every_ps_cpu() -> None:
    spec = job_spec(quota_cpu=400, quota_memory="1000Gi")
    plan = make_plan(workers=8, ps_cpu=8.0)
    new = DlroverOssPolicy().decide(view(spec, plan, run(plan, 0.0, 5, [0.9, 0.5])))
    assert new is not None
    assert new.stage is Stage.POST_SCALE
    # ceil(7.2 used x 32 / 8 workers) = 29 cores, every PS
    assert new.ps == NodeGroup(count=2, cpu=29.0, memory_mb=plan.ps.memory_mb)
    assert new.workers == plan.workers


def test_brain_hot_ps_memory_adds_8_gib() -> None:
    spec = job_spec(quota_cpu=400, quota_memory="1000Gi")
    plan = make_plan(workers=8, ps_memory_mb=16 * GIB)
    samples = run(plan, 0.0, 5, 0.5, ps_memory_used=[15 * GIB, 8 * GIB])
    new = DlroverOssPolicy().decide(view(spec, plan, samples))
    assert new is not None
    assert new.ps.memory_mb == 24 * GIB
    assert new.ps.cpu == plan.ps.cpu


def test_master_hot_ps_after_ps_initial_at_most_once_an_hour() -> None:
    spec = job_spec(quota_cpu=64, quota_memory="256Gi")
    policy = DlroverOssPolicy()
    plan = make_plan(workers=4, worker_cpu=4.0, ps=2, ps_cpu=4.0, brain=False)
    samples = run(plan, 0.0, 5, 0.5)
    # the master's first plan is the PS initial adjustment: a = 4.0 / 4 = 1.0 per worker,
    # b = 2.0, max_w = 64 / 3; PS count = ceil((64 - 64/3 x 2) / 4) = 6
    first = policy.decide(view(spec, plan, samples))
    assert first is not None
    assert first.ps.count == 6
    assert first.ps.cpu == 4.0
    assert first.ps.memory_mb == 9831  # 1.2 x max(8 GiB used per PS, 16 GiB in all / 6)
    t0 = samples[-1].time + 1.0
    hot = run(first, t0, 10, 0.95)
    # ten minutes later the PS are hot, but PS changes wait an hour: only workers may move
    blocked = policy.decide(view(spec, first, samples + hot, now=t0 + 600.0))
    assert blocked is None or blocked.ps == first.ps
    # an hour after the PS initial: a = 6 x 3.8 / 4 = 5.7, b = 2; max_w = int(64 / 7.7) = 8
    # factor = 8 / 4 = 2 -> 3.8 x 2 = 7.6 -> 8 cores (half-core steps)
    later = run(first, t0, 60, 0.95)
    new = policy.decide(view(spec, first, samples + later, now=t0 + 3601.0))
    assert new is not None
    assert new.ps.cpu == 8.0
    assert new.ps.count == 6


# -- master: workers ----------------------------------------------------------------------------


def test_master_grows_workers_by_0_9_over_u_with_mean_used_cpu() -> None:
    spec = job_spec(quota_cpu=200, quota_memory="1000Gi")
    policy = DlroverOssPolicy()
    plan = make_plan(workers=4, worker_cpu=8.0, ps=2, ps_cpu=8.0, brain=False)
    state = policy._state(view(spec, plan, run(plan, 0.0, 1, 0.3)))
    state.ps_initial_done = True
    samples = run(plan, 0.0, 5, 0.3, worker_used=5.2, worker_memory_used=6 * GIB)
    new = policy.decide(view(spec, plan, samples))
    assert new is not None
    assert new.workers.count == 12  # int(4 x 0.9 / 0.3)
    assert new.workers.cpu == 5.5  # mean used 5.2, half-core steps
    assert new.workers.memory_mb == 9 * GIB  # 1.5 x max used


def test_master_stops_when_the_last_scale_up_gained_little() -> None:
    spec = job_spec(quota_cpu=200, quota_memory="1000Gi")
    policy = DlroverOssPolicy()
    before = make_plan(workers=4, ps_cpu=8.0, brain=False)
    plan = make_plan(workers=8, ps_cpu=8.0, brain=False)
    policy._state(view(spec, plan, run(plan, 0.0, 1, 0.3))).ps_initial_done = True
    samples = run(before, 0.0, 5, 0.3, throughput=4000.0) + run(
        plan, 300.0, 5, 0.3, throughput=4300.0
    )
    assert policy.decide(view(spec, plan, samples)) is None
    assert policy.decide(view(spec, plan, samples[:5] + run(plan, 300.0, 5, 0.3))) is not None


# -- timing -------------------------------------------------------------------------------------


def test_no_plan_before_5_samples_or_90_seconds() -> None:
    spec = job_spec(quota_cpu=64, quota_memory="256Gi")
    # the master's first plan (PS initial) would change the PS: 3 instead of 2
    plan = make_plan(workers=4, ps=2, ps_cpu=8.0, brain=False)

    def every(step: float, n: int) -> list[RuntimeSample]:
        return [sample(step * (k + 1), plan, 0.2) for k in range(n)]

    assert DlroverOssPolicy().decide(view(spec, plan, every(15.0, 4), now=61.0)) is None
    five = DlroverOssPolicy().decide(view(spec, plan, every(12.0, 5), now=61.0))
    assert five is not None
    assert five.ps.count == 3
    assert DlroverOssPolicy().decide(view(spec, plan, every(60.0, 1), now=80.0)) is None
    assert DlroverOssPolicy().decide(view(spec, plan, every(60.0, 1), now=95.0)) is not None


def test_no_plan_within_300_s_of_the_last() -> None:
    spec = job_spec(quota_cpu=400, quota_memory="1000Gi", max_workers=60)
    policy = DlroverOssPolicy()
    plan = make_plan(workers=4)
    samples = run(plan, 0.0, 5, 0.2)
    first = policy.decide(view(spec, plan, samples, now=301.0))
    assert first is not None
    more = samples + run(first, 301.0, 4, 0.2)
    assert policy.decide(view(spec, first, more, now=301.0 + 290.0)) is None
    assert policy.decide(view(spec, first, more, now=301.0 + 300.0)) is not None


def test_no_plan_until_the_worker_count_is_stable_for_60_s() -> None:
    spec = job_spec(quota_cpu=400, quota_memory="1000Gi")
    before, plan = make_plan(workers=3), make_plan(workers=4)
    # samples every 10 s here, so that a 3-sample window fits within a minute
    old = run(before, 0.0, 5, 0.2)  # the last at 300 s
    new = [sample(300.0 + 10.0 * k, plan, 0.2) for k in (1, 2, 3, 4, 5, 6)]
    assert DlroverOssPolicy().decide(view(spec, plan, old + new[:3], now=335.0)) is None
    assert DlroverOssPolicy().decide(view(spec, plan, old + new, now=361.0)) is not None
    # pods not all up yet: the samples still show the old count
    assert DlroverOssPolicy().decide(view(spec, plan, run(before, 0.0, 8, 0.2))) is None


# -- failures -----------------------------------------------------------------------------------


def test_failures_other_than_oom_keep_the_plan() -> None:
    spec = job_spec()
    plan = make_plan()
    policy = DlroverOssPolicy()
    now = view(spec, plan, run(plan, 0.0, 1, 0.3))
    assert policy.after_failure(now, "ps", "NodeLost") is None
    assert policy.after_failure(now, "worker", "Evicted") is None


@pytest.mark.parametrize(
    ("before", "after"),
    [(4 * GIB, 8 * GIB), (16 * GIB, 24 * GIB), (60 * GIB, 64 * GIB), (64 * GIB, None)],
)
def test_worker_oom_doubles_memory_by_at_most_8_gib_up_to_64(
    before: int, after: int | None
) -> None:
    spec = job_spec(quota_cpu=400, quota_memory="1000Gi")
    plan = make_plan(worker_memory_mb=before)
    new = DlroverOssPolicy().after_failure(
        view(spec, plan, run(plan, 0.0, 1, 0.3)), "worker", "OOMKilled"
    )
    if after is None:
        assert new is None
    else:
        assert new is not None
        assert new.stage is Stage.POST_SCALE
        assert new.workers.memory_mb == after
        assert new.workers.count == plan.workers.count


def test_worker_oom_within_a_tight_quota_gives_up_workers() -> None:
    spec = job_spec(quota_cpu=400, quota_memory="64Gi")
    plan = make_plan(workers=4, worker_memory_mb=8 * GIB, ps=2, ps_memory_mb=16 * GIB)
    new = DlroverOssPolicy().after_failure(
        view(spec, plan, run(plan, 0.0, 1, 0.3)), "worker", "OOMKilled"
    )
    assert new is not None
    assert new.workers == NodeGroup(count=2, cpu=4.0, memory_mb=16 * GIB)
    assert within_limits(new, spec)


def test_master_ps_oom_doubles_memory() -> None:
    spec = job_spec(quota_cpu=400, quota_memory="1000Gi")
    plan = make_plan(ps_memory_mb=6 * GIB, brain=False)
    new = DlroverOssPolicy().after_failure(
        view(spec, plan, run(plan, 0.0, 1, 0.3)), "ps", "OOMKilled"
    )
    assert new is not None
    assert new.ps == NodeGroup(count=2, cpu=8.0, memory_mb=12 * GIB)


def test_brain_ps_oom_unbalanced_doubles_memory_balanced_doubles_count() -> None:
    spec = job_spec(quota_cpu=400, quota_memory="1000Gi")
    plan = make_plan(ps=2, ps_memory_mb=16 * GIB)
    policy = DlroverOssPolicy()
    unbalanced = run(plan, 0.0, 1, 0.3, ps_memory_used=[16 * GIB, 8 * GIB])  # (16-12)/16 = 0.25
    new = policy.after_failure(view(spec, plan, unbalanced), "ps", "OOMKilled")
    assert new is not None
    assert new.ps == NodeGroup(count=2, cpu=8.0, memory_mb=32 * GIB)
    balanced = run(plan, 0.0, 1, 0.3, ps_memory_used=[16 * GIB, 14 * GIB])  # 1/16 < 0.2
    new = policy.after_failure(view(spec, plan, balanced), "ps", "OOMKilled")
    assert new is not None
    assert new.ps == NodeGroup(count=4, cpu=8.0, memory_mb=16 * GIB)
    assert new.similar_jobs == plan.similar_jobs


def test_brain_ps_oom_count_is_capped_by_the_quota() -> None:
    # workers 1 x 4 cores, PS 2 x 8: 20 of 30 cores; 4 PS would need 36 -> 3 PS
    spec = job_spec(quota_cpu=30, quota_memory="1000Gi")
    plan = make_plan(workers=1, ps=2, ps_memory_mb=16 * GIB)
    balanced = run(plan, 0.0, 1, 0.3, ps_memory_used=16 * GIB)
    new = DlroverOssPolicy().after_failure(view(spec, plan, balanced), "ps", "OOMKilled")
    assert new is not None
    assert new.ps.count == 3
    assert within_limits(new, spec)


# -- closed loop ----------------------------------------------------------------------------


def closed_loop(
    policy: DlroverOssPolicy, spec: JobSpec, minutes: int = 120, seed: int = 0
) -> list[ResourcePlan]:
    """A sample from the truth every 60 s, a decision every 60 s, plans applied at once."""
    truth = Truth()
    rng = random.Random(seed)
    plan = policy.initial(spec, 0.0)
    plans = [plan]
    samples: list[RuntimeSample] = []
    for minute in range(1, minutes + 1):
        t = 60.0 * minute
        samples.append(truth.samples(plan, t, 1, rng)[0])
        new = policy.decide(view(spec, plan, samples, now=t + 1.0))
        if new is not None:
            plan = new
            plans.append(new)
    return plans


@pytest.mark.parametrize("with_history", [False, True])
def test_closed_loop_on_truth_stays_within_quota_and_clamps(with_history: bool) -> None:
    spec = job_spec(quota_cpu=96, quota_memory="384Gi", max_workers=40)
    policy = DlroverOssPolicy()
    if with_history:
        for profile in history():
            policy.finished(profile)
    plans = closed_loop(policy, spec)
    assert len(plans) >= 3
    assert plans[0].stage is (Stage.WARM_START if with_history else Stage.COLD_START)
    for plan in plans:
        assert within_limits(plan, spec), plan
        assert within_clamps(plan), plan
        assert bool(plan.similar_jobs) is with_history
    assert plans[-1].workers.count > plans[0].workers.count
