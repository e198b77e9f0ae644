"""What the engine counts for each policy, driven through the engine as a simulation runs them:
warm starts from history (on the protocol's one clock), OOM kills and the self-inflicted ones,
relaunches, the CPU a step with a pause in it uses, and the relaunch cost as a setting."""

from __future__ import annotations

import dataclasses
import math

import pytest

from dlrover_kfp.core.plan import NodeGroup, ResourcePlan, Stage
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.sim.cluster.api import JobOutcome, JobView, Policy
from dlrover_kfp.sim.cluster.engine import (
    CLUSTER_POD_START_S,
    LIVE_PS_MOVE_PAUSE_S,
    FaultSettings,
    Simulation,
    Utilisation,
    request_would_hold,
)
from dlrover_kfp.sim.cluster.policies.dlrover_oss import DlroverOssPolicy
from dlrover_kfp.sim.cluster.policies.planner import PlannerPolicy
from dlrover_kfp.sim.cluster.results import summarize
from dlrover_kfp.sim.cluster.runner import POLICIES
from dlrover_kfp.sim.cluster.trace import TraceJob
from tests.sim.test_engine import (
    HOUR,
    QUIET,
    FixedPolicy,
    ProfilingPolicy,
    by_id,
    cluster,
    even_workers,
    jct,
    make_job,
    oom_job,
    request_plan,
    template,
)

DAY = 24 * HOUR


def history_window_s(policy: Policy) -> float:
    """How far back the policy's history reaches (0: it keeps none)."""
    if isinstance(policy, DlroverOssPolicy):
        return policy.settings.history_window_s
    if isinstance(policy, PlannerPolicy):
        return policy.settings.warm_start.window_days * DAY
    return 0.0


def recurring_trace(window_s: float) -> list[TraceJob]:
    """Three runs of one recurring job half a day apart, another job's first run in between,
    and a fourth run of the recurring job one day after its history has aged out."""
    base = make_job("day-0")
    other_spec = dataclasses.replace(base.spec, name="other-job", scenario="other")
    other = dataclasses.replace(base, id="other-0", scenario="other", spec=other_spec)
    return [
        base,
        dataclasses.replace(other, arrival_s=6 * HOUR),
        make_job("day-1", arrival_s=12 * HOUR),
        make_job("day-2", arrival_s=24 * HOUR),
        make_job("late", arrival_s=24 * HOUR + max(window_s, 7 * DAY) + DAY),
    ]


@pytest.mark.parametrize("name", list(POLICIES))
def test_each_policy_warm_starts_the_recurring_runs_through_the_engine(name: str) -> None:
    # Through the engine, not in trace time as the policies' unit tests call them: the engine
    # once started jobs on another clock than the one dlrover-oss dated its history in, and
    # no job of it warm-started.
    policy = POLICIES[name]()
    window = history_window_s(policy)
    jobs = recurring_trace(window)
    span = jobs[-1].arrival_s + 2 * DAY
    result = Simulation(jobs, policy, cluster(step_s=600.0, max_time_s=span), QUIET).run()
    outcomes = by_id(result)
    # The premise: every run ended before the next run of its job arrived.
    assert all(o.succeeded for o in outcomes.values()), [o.reason for o in outcomes.values()]
    assert outcomes["day-0"].finished_at is not None
    assert outcomes["day-0"].finished_at < 12 * HOUR

    warm = {job_id for job_id, o in outcomes.items() if o.warm_started}
    if window:  # learns from history: the recurring runs only, and only within its window
        assert warm == {"day-1", "day-2"}
    else:  # manual and optimus keep no history (docs/baselines.md)
        assert warm == set()
    assert summarize(result).warm_started == len(warm)


def test_a_self_inflicted_oom_is_a_kill_the_users_request_would_have_avoided() -> None:
    memory = template().truth.memory
    # The user asks for 20 % above the largest PS's peak in an elastic runtime (snapshots
    # included): the request holds for the whole job.
    peak = memory.ps_used_mb(1.0, 2, 0, snapshot=True)
    job = make_job("fits", ps_memory_mb=math.ceil(1.2 * peak))
    assert request_would_hold(job, "ps", snapshot=True)
    assert request_would_hold(job, "worker", snapshot=True)
    assert not request_would_hold(oom_job(), "ps", snapshot=False)

    class BelowRequest(FixedPolicy):
        """Plans the PS at what the truth needs at half the training: killed there."""

        def initial(self, spec: JobSpec, now: float) -> ResourcePlan:
            plan = request_plan(spec)
            low = math.floor(memory.ps_used_mb(0.5, plan.ps.count, 0, snapshot=True))
            ps = NodeGroup(count=plan.ps.count, cpu=plan.ps.cpu, memory_mb=low)
            return dataclasses.replace(plan, ps=ps, stage=Stage.COLD_START)

    def run(policy: Policy, job: TraceJob) -> JobOutcome:
        result = Simulation([job], policy, cluster(), QUIET, stragglers=even_workers()).run()
        assert summarize(result).self_inflicted_ooms == result.outcomes[0].self_inflicted_ooms
        return result.outcomes[0]

    below = run(BelowRequest(elastic=True, grow_on_oom=True), job)
    assert below.succeeded and below.oom_failures == 1 and below.self_inflicted_ooms == 1
    assert below.relaunches == 1 and below.resizes == 1
    # The request itself OOMs on oom_job: a kill there is not the policy's doing.
    at_request = run(FixedPolicy(elastic=True, grow_on_oom=True), oom_job())
    assert at_request.oom_failures == 1 and at_request.self_inflicted_ooms == 0
    assert at_request.relaunches == 1
    # Manual's kills are never self-inflicted (its plan is the request), and it restarts the
    # whole job rather than relaunch a pod.
    manual = run(POLICIES["manual"](), oom_job())
    assert manual.oom_failures > 0 and manual.self_inflicted_ooms == 0
    assert manual.relaunches == 0 and manual.restarts > 0


class OneMore(FixedPolicy):
    """The request, then one change at the first decision (an elastic resize): one more worker
    or PS (``worker``, ``ps``), or one more core for each worker or each PS (``worker-cpu``,
    ``ps-cpu``: those pods replaced)."""

    def __init__(self, role: str) -> None:
        super().__init__(elastic=True)
        self.role = role

    def decide(self, job: JobView) -> ResourcePlan | None:
        if job.plan.stage is not Stage.MANUAL:
            return None
        w, p = job.plan.workers, job.plan.ps
        if self.role == "worker":
            w = NodeGroup(count=w.count + 1, cpu=w.cpu, memory_mb=w.memory_mb)
        elif self.role == "worker-cpu":
            w = NodeGroup(count=w.count, cpu=w.cpu + 1, memory_mb=w.memory_mb)
        elif self.role == "ps-cpu":
            p = NodeGroup(count=p.count, cpu=p.cpu + 1, memory_mb=p.memory_mb)
        else:
            p = NodeGroup(count=p.count + 1, cpu=p.cpu, memory_mb=p.memory_mb)
        return ResourcePlan(workers=w, ps=p, stage=Stage.AUTO_SCALE, reason="+1")


def resized_steps(
    role: str, *, elastic_resize_s: float = 60.0, ps_resize_s: float = 60.0
) -> tuple[TraceJob, JobOutcome, list[Utilisation]]:
    """One job resized by ``OneMore(role)`` at its first decision: its outcome and its running
    steps after the resize (these resize prices, 120 s steps, noise off)."""
    faults = dataclasses.replace(
        QUIET, noise=0.0, elastic_resize_s=elastic_resize_s, ps_resize_s=ps_resize_s
    )
    job = make_job("resized")
    result = Simulation(
        [job], OneMore(role), cluster(step_s=120.0), faults, stragglers=even_workers()
    ).run()
    (outcome,) = result.outcomes
    assert outcome.resizes == 1
    running = [u for u in result.utilisation if u.running]
    allocs = sorted({round(u.cpu_allocated, 6) for u in running})
    assert len(allocs) == 2  # before and after the resize
    return job, outcome, [u for u in running if math.isclose(u.cpu_allocated, allocs[1])]


def test_a_step_with_a_pause_counts_the_cpu_its_active_part_used() -> None:
    # A PS added: the PS re-partition, the whole job pauses 60 s of a 120 s step. The pods
    # train for the other 60 s, so the step uses half the CPU of a full step at the same shape,
    # not nothing.
    _, _, after = resized_steps("ps")
    paused, full = after[0], after[1]
    assert full.cpu_used > 0
    assert paused.cpu_used == pytest.approx(full.cpu_used / 2, rel=1e-3)


def test_workers_added_alone_pause_no_pod_the_job_trains_at_its_old_rate_meanwhile() -> None:
    # A worker added (same pods, same PS): the others train on while it starts (runtime/
    # elastic.py), so over the 60 s start the job goes at its old rate. Charged as a whole-job
    # pause of 60 · (1 - X_old / X_new) s: the step after the resize is active for the rest.
    job, _, after = resized_steps("worker")
    batch = job.spec.training.batch_size
    x_old = job.truth.throughput.evaluate(4, 2, 8.0, 8.0, batch)[0]
    x_new = job.truth.throughput.evaluate(5, 2, 8.0, 8.0, batch)[0]
    assert x_new > x_old
    active = 120.0 - 60.0 * (1.0 - x_old / x_new)
    resized, full = after[0], after[1]
    assert resized.cpu_used == pytest.approx(full.cpu_used * active / 120.0, rel=1e-3)


@pytest.mark.parametrize(
    ("change", "changes_ps"), [("ps", True), ("ps-cpu", True), ("worker-cpu", False)]
)
def test_a_resize_that_changes_the_ps_pays_its_own_price_one_of_workers_the_elastic_one(
    change: str, changes_ps: bool
) -> None:
    # Two prices told apart: 90 s for a resize that changes the PS (one more PS, or every PS
    # replaced by one with another core), 30 s for one that replaces the workers alone. The
    # whole job pauses that long in the 120 s step after the resize and trains the rest, so
    # that step uses (120 - pause) / 120 of the CPU of a full step at the same shape.
    _, outcome, after = resized_steps(change, elastic_resize_s=30.0, ps_resize_s=90.0)
    pause = 90.0 if changes_ps else 30.0
    resized, full = after[0], after[1]
    assert full.cpu_used > 0
    assert resized.cpu_used == pytest.approx(full.cpu_used * (120.0 - pause) / 120.0, rel=1e-3)
    assert outcome.ps_resizes == int(changes_ps)


def test_the_ps_resize_price_is_a_stated_pod_start_plus_the_measured_move_pause() -> None:
    # The default is made of its two figures, named in engine.py and docs/simulator.md: a
    # cluster pod start of 60 s (stated) and the live PS move's largest measured pause, 2.14 s
    # (benchmarks/ps_move_pause.py, under load, 250 pushes/s). A worker-only resize keeps 60 s.
    assert CLUSTER_POD_START_S == 60.0
    assert LIVE_PS_MOVE_PAUSE_S == 2.14
    assert FaultSettings().ps_resize_s == pytest.approx(62.14)
    assert FaultSettings().elastic_resize_s == 60.0


def test_profiling_steps_count_the_cpu_the_profiled_configurations_used() -> None:
    # Optimus-style profiling pauses the job at its plan while smaller configurations train in
    # its pods: those steps count what the configurations use, not nothing. First a pod start
    # (180 s, idle), then 1 worker x 2 PS, then 2 workers x 2 PS; enough profiled steps that
    # the first configuration trains through a few whole 120 s steps.
    job = make_job("profiled")
    batch = job.spec.training.batch_size
    x, wu, pu = job.truth.throughput.evaluate(1, 2, 8.0, 8.0, batch)
    steps = math.ceil(400.0 * x / batch)
    faults = dataclasses.replace(QUIET, noise=0.0, profile_warmup_steps=0, profile_steps=steps)
    result = Simulation(
        [job], ProfilingPolicy(elastic=False), cluster(), faults, stragglers=even_workers()
    ).run()
    (outcome,) = result.outcomes
    profiling = [u for u in result.utilisation if u.running and u.time + 120 <= outcome.profile_s]
    assert profiling[0].cpu_used == 0.0  # the first configuration's pods start
    assert profiling[2].cpu_used == pytest.approx(wu + 2 * pu, rel=1e-9)  # it trains
    assert all(0.0 <= u.cpu_used < u.cpu_allocated for u in profiling)


def test_the_relaunch_cost_is_a_setting_an_elastic_relaunch_pauses_for() -> None:
    # DLRover-RM's ~3 minutes by default; a relaunch at 180 s costs the job 120 s more than
    # one at 60 s (the same OOM, the same relaunch, steps of 60 s).
    assert FaultSettings().relaunch_s == 180.0
    jcts = {}
    for seconds in (60.0, 180.0):
        faults = dataclasses.replace(QUIET, relaunch_s=seconds)
        policy = FixedPolicy(elastic=True, grow_on_oom=True)
        sim = Simulation(
            [oom_job()], policy, cluster(step_s=60.0), faults, stragglers=even_workers()
        )
        (outcome,) = sim.run().outcomes
        assert outcome.relaunches == 1
        jcts[seconds] = jct(outcome)
    assert jcts[180.0] - jcts[60.0] == pytest.approx(120.0, abs=60.0)
