"""The cluster simulator's engine: determinism, capacity, queueing, faults, and every policy.

Jobs are built from one synthetic job (its model and hidden truth) with a request, a dataset
size and a PS memory chosen by the test, so each test knows what the engine should do with
them. Small policies written here implement the :class:`~dlrover_kfp.sim.cluster.api.Policy`
protocol to observe the engine (what it shows a job's master) or to stress it (plans far
beyond the cluster); nothing in the library is patched.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import statistics

import pytest

from dlrover_kfp.core.plan import NodeAction, NodeGroup, ResourcePlan, Stage
from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.core.spec import JobSpec, NodeRequest, Quota, ResourcesSpec, SyntheticData
from dlrover_kfp.sim.cluster.api import JobOutcome, JobView, Policy, Role
from dlrover_kfp.sim.cluster.engine import (
    ClusterSettings,
    FaultSettings,
    Simulation,
    SimulationResult,
)
from dlrover_kfp.sim.cluster.policies.manual import ManualPolicy
from dlrover_kfp.sim.cluster.policies.planner import PlannerPolicy
from dlrover_kfp.sim.cluster.results import summarize
from dlrover_kfp.sim.cluster.runner import POLICIES
from dlrover_kfp.sim.cluster.stragglers import StragglerModel
from dlrover_kfp.sim.cluster.trace import (
    TraceJob,
    cluster_size_for,
    manual_oom_progress,
    synthetic_trace,
)

NODE_CPU = 64.0
NODE_MEMORY_MB = 256 * 1024
HOUR = 3600.0
MIB = 2**20

#: No random fault at all: no node failure, no eviction, no straggler episode, no hot PS.
QUIET = FaultSettings(
    node_failure_per_hour=0.0,
    eviction_per_pod_hour=0.0,
    crash_per_pod_hour=0.0,
    straggler_job_fraction=0.0,
    hot_ps_job_fraction=0.0,
)


def cluster(
    nodes: int = 16, *, step_s: float = 120.0, max_time_s: float = 20 * 86400.0
) -> ClusterSettings:
    return ClusterSettings(
        nodes=nodes,
        node_cpu=NODE_CPU,
        node_memory_mb=NODE_MEMORY_MB,
        step_s=step_s,
        max_time_s=max_time_s,
    )


@functools.cache
def template() -> TraceJob:
    """A synthetic job whose PS fit their request (its model and truth are reused below)."""
    return next(j for j in synthetic_trace(20, 7) if manual_oom_progress(j) is None)


def make_job(
    job_id: str,
    *,
    arrival_s: float = 0.0,
    workers: int = 4,
    ps: int = 2,
    cpu: float = 8.0,
    ps_cpu: float | None = None,
    ps_memory_mb: int | None = None,
    hours: float = 1.0,
) -> TraceJob:
    """The template's job with this request; rows set so that it trains ``hours`` at the
    request (no straggler); memory twice what the pods really use unless ``ps_memory_mb``."""
    base = template()
    truth = base.truth
    ps_cpu = cpu if ps_cpu is None else ps_cpu
    training = base.spec.training
    rate = truth.throughput.throughput(workers, ps, cpu, ps_cpu, training.batch_size)
    rows = max(1, round(rate * hours * HOUR / training.epochs))
    worker_mb = math.ceil(2 * truth.memory.worker_mb)
    if ps_memory_mb is None:
        ps_memory_mb = math.ceil(2 * truth.memory.ps_peak_mb(ps))
    total_cpu = workers * cpu + ps * ps_cpu
    total_mb = workers * worker_mb + ps * ps_memory_mb
    # A bare number in a memory quantity is bytes (as in Kubernetes); it is stored as MiB.
    resources = ResourcesSpec(
        limits=Quota(cpu=3 * total_cpu, memory=3 * total_mb * MIB),
        workers=NodeRequest(count=workers, cpu=cpu, memory=worker_mb * MIB),
        ps=NodeRequest(count=ps, cpu=ps_cpu, memory=ps_memory_mb * MIB),
    )
    spec = dataclasses.replace(base.spec, data=SyntheticData(rows=rows), resources=resources)
    return TraceJob(id=job_id, scenario=base.scenario, arrival_s=arrival_s, spec=spec, truth=truth)


def even_workers(
    *, onset: float = 0.3, duration: float = 0.4, slowdown: float = 2.0
) -> StragglerModel:
    """Stragglers without the PAI data's persistent imbalance: every worker at the same pace
    except during an episode, when worker 0 is ``slowdown`` times slower."""
    return StragglerModel(
        patterns=((1.0,) * 10,),
        slowdowns=(1.0,),
        episode_onset=onset,
        episode_duration=duration,
        episode_ratios=(slowdown,),
    )


def by_id(result: SimulationResult) -> dict[str, JobOutcome]:
    return {o.job_id: o for o in result.outcomes}


def jct(outcome: JobOutcome) -> float:
    assert outcome.succeeded, outcome.reason
    assert outcome.jct is not None
    return outcome.jct


def request_plan(spec: JobSpec) -> ResourcePlan:
    workers, ps = spec.resources.workers, spec.resources.ps
    assert workers is not None and ps is not None
    return ResourcePlan(
        workers=workers.to_group(), ps=ps.to_group(), stage=Stage.MANUAL, reason="the request"
    )


# --------------------------------------------------------------------------------------------
# Policies written for these tests


class FixedPolicy:
    """The user's request for the whole job, elastic or not; after an OOM, optionally twice
    the failed role's memory. Records what the engine shows it."""

    decision_interval_s = 120.0

    def __init__(self, *, elastic: bool, grow_on_oom: bool = False) -> None:
        self.name = "fixed-elastic" if elastic else "fixed"
        self.elastic = elastic
        self.grow_on_oom = grow_on_oom
        #: (now, progress, restarts, incarnation start) at every decision
        self.seen: list[tuple[float, float, int, float]] = []
        #: (now, progress, role, reason) at every failure
        self.failures: list[tuple[float, float, Role, str]] = []
        self.profiles: list[JobProfile] = []

    def initial(self, spec: JobSpec, now: float) -> ResourcePlan:
        return request_plan(spec)

    def decide(self, job: JobView) -> ResourcePlan | None:
        self.seen.append((job.now, job.progress, job.restarts, job.started_at))
        return None

    def after_failure(self, job: JobView, role: Role, reason: str) -> ResourcePlan | None:
        self.failures.append((job.now, job.progress, role, reason))
        if not self.grow_on_oom or reason != "OOMKilled":
            return None
        w, p = job.plan.workers, job.plan.ps
        if role == "ps":
            p = NodeGroup(count=p.count, cpu=p.cpu, memory_mb=2 * p.memory_mb)
        else:
            w = NodeGroup(count=w.count, cpu=w.cpu, memory_mb=2 * w.memory_mb)
        return ResourcePlan(workers=w, ps=p, stage=Stage.POST_SCALE, reason=f"{role} OOM: x2")

    def finished(self, profile: JobProfile) -> None:
        self.profiles.append(profile)


class GreedyPolicy:
    """Asks for twice the workers at every decision, soon far more than the whole cluster."""

    decision_interval_s = 240.0

    def __init__(self, *, elastic: bool) -> None:
        self.name = "greedy"
        self.elastic = elastic
        self.plans: list[ResourcePlan] = []

    def initial(self, spec: JobSpec, now: float) -> ResourcePlan:
        plan = request_plan(spec)
        self.plans.append(plan)
        return plan

    def decide(self, job: JobView) -> ResourcePlan | None:
        w = job.plan.workers
        plan = ResourcePlan(
            workers=NodeGroup(count=2 * w.count, cpu=w.cpu, memory_mb=w.memory_mb),
            ps=job.plan.ps,
            stage=Stage.AUTO_SCALE,
            reason="twice the workers",
        )
        self.plans.append(plan)
        return plan

    def after_failure(self, job: JobView, role: Role, reason: str) -> ResourcePlan | None:
        return None

    def finished(self, profile: JobProfile) -> None:
        return None


class QuotaGuard:
    """Delegates to a real policy and notes every plan it returns beyond the job's quota."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.plans = 0
        self.violations: list[str] = []

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def elastic(self) -> bool:
        return self.inner.elastic

    @property
    def decision_interval_s(self) -> float:
        return self.inner.decision_interval_s

    def _check(self, spec: JobSpec, plan: ResourcePlan | None, where: str) -> None:
        if plan is None:
            return
        self.plans += 1
        quota = spec.resources.limits
        assert quota is not None
        if plan.total_cpu > quota.cpu + 1e-9 or plan.total_memory_mb > quota.memory:
            self.violations.append(
                f"{spec.name} {where}: cpu {plan.total_cpu:g} / {quota.cpu:g}, "
                f"memory {plan.total_memory_mb} / {quota.memory} MiB ({plan.reason})"
            )

    def initial(self, spec: JobSpec, now: float) -> ResourcePlan:
        plan = self.inner.initial(spec, now)
        self._check(spec, plan, "initial")
        return plan

    def decide(self, job: JobView) -> ResourcePlan | None:
        plan = self.inner.decide(job)
        self._check(job.spec, plan, "decide")
        return plan

    def after_failure(self, job: JobView, role: Role, reason: str) -> ResourcePlan | None:
        plan = self.inner.after_failure(job, role, reason)
        self._check(job.spec, plan, f"after {reason}")
        return plan

    def finished(self, profile: JobProfile) -> None:
        self.inner.finished(profile)


# --------------------------------------------------------------------------------------------
# Determinism


@pytest.mark.parametrize("name", ["manual", "dlrover-kfp"])
def test_same_seed_same_run_and_another_seed_other_faults(name: str) -> None:
    trace = synthetic_trace(10, 4)
    settings = ClusterSettings(*cluster_size_for(trace))
    faults = FaultSettings(eviction_per_pod_hour=1 / 20, node_failure_per_hour=1 / 50)

    def run(seed: int) -> SimulationResult:
        return Simulation(trace, POLICIES[name](), settings, faults, seed=seed).run()

    first, again, other = run(1), run(1), run(2)
    assert again.outcomes == first.outcomes
    assert again.utilisation == first.utilisation
    # The faults (and the measurement noise) are drawn from the seed: they differ...
    assert other.utilisation != first.utilisation
    assert other.outcomes != first.outcomes
    # ... on the same trace: same jobs, same arrivals, and the trace is left as it was.
    assert [(o.job_id, o.submitted_at) for o in other.outcomes] == [
        (o.job_id, o.submitted_at) for o in first.outcomes
    ]
    assert trace == synthetic_trace(10, 4)


# --------------------------------------------------------------------------------------------
# Capacity


@pytest.mark.parametrize("elastic", [False, True])
def test_allocation_never_exceeds_the_cluster(elastic: bool) -> None:
    jobs = [make_job(f"g{i}", arrival_s=i * 600.0, hours=1.5) for i in range(6)]
    per_job = jobs[0].spec.resources
    assert per_job.workers is not None and per_job.ps is not None
    job_mb = per_job.workers.count * per_job.workers.memory + per_job.ps.count * per_job.ps.memory
    # Two nodes: two requests fit in CPU (48 of 64 cores each), memory binds as well.
    settings = ClusterSettings(nodes=2, node_cpu=NODE_CPU, node_memory_mb=math.ceil(1.5 * job_mb))
    faults = FaultSettings(eviction_per_pod_hour=1 / 50, node_failure_per_hour=1 / 50)
    policy = GreedyPolicy(elastic=elastic)
    result = Simulation(jobs, policy, settings, faults, seed=3).run()

    cap_cpu = settings.nodes * settings.node_cpu
    cap_mem = settings.nodes * settings.node_memory_mb
    for u in result.utilisation:
        assert u.cpu_allocated <= cap_cpu + 1e-6, u
        assert u.memory_allocated_mb <= cap_mem, u
        assert u.cpu_used <= u.cpu_allocated + 1e-6, u
        assert u.memory_used_mb <= u.memory_allocated_mb, u
    # The guard was tested: the policy asked for more than the cluster, the cluster was full
    # (and jobs queued), and resizes happened (cut to the free capacity).
    assert max(p.total_cpu for p in policy.plans) > cap_cpu
    assert max(u.cpu_allocated for u in result.utilisation) > 0.9 * cap_cpu
    assert max(u.memory_allocated_mb for u in result.utilisation) > 0.6 * cap_mem
    assert any(u.queued for u in result.utilisation)
    assert sum(o.resizes for o in result.outcomes) > 0
    assert {o.job_id for o in result.outcomes} == {j.id for j in jobs}


def test_a_trace_longer_than_sixty_days_is_simulated_whole() -> None:
    # The engine stopped at 60 simulated days until issue 44 and left every later arrival out
    # of the results (a 5,000-job trace, 83 days of arrivals, gave 3,731 outcomes). With no
    # time limit (the default) it runs until every job has ended, however long the trace.
    day = 86400.0
    jobs = [make_job("first"), make_job("day-61", arrival_s=61 * day)]
    jobs.append(make_job("day-150", arrival_s=150 * day))
    settings = ClusterSettings(
        nodes=4, node_cpu=NODE_CPU, node_memory_mb=NODE_MEMORY_MB, step_s=600.0
    )
    result = Simulation(jobs, ManualPolicy(), settings, QUIET, seed=0).run()
    outcomes = by_id(result)
    assert set(outcomes) == {"first", "day-61", "day-150"}
    assert all(o.succeeded for o in outcomes.values()), [o.reason for o in outcomes.values()]
    assert settings.max_time_s is None
    finished = outcomes["day-150"].finished_at
    assert finished is not None and finished > 150 * day
    # ... and stops once the last job has ended: no step more than the one it ended in.
    assert result.utilisation[-1].time < finished


def test_a_time_limit_counts_the_jobs_it_cut_and_those_not_yet_arrived() -> None:
    day = 86400.0
    jobs = [make_job("first", hours=48.0), make_job("late", arrival_s=5 * day)]
    result = Simulation(jobs, ManualPolicy(), cluster(2, max_time_s=day), QUIET, seed=0).run()
    outcomes = by_id(result)
    assert set(outcomes) == {"first", "late"}  # every job of the trace, none left out
    assert not outcomes["first"].succeeded
    assert outcomes["first"].reason == "not finished when the simulation ended"
    assert outcomes["late"].started_at is None
    assert outcomes["late"].reason == "not submitted when the simulation ended"
    assert summarize(result).completion_rate == 0.0


def test_without_a_time_limit_a_job_that_fits_no_node_ends_the_simulation() -> None:
    # Nothing runs, nothing is to come, and the queued job was tried on the empty cluster:
    # the simulation ends there instead of waiting forever, and says why.
    huge = make_job("huge", ps_cpu=96.0)  # a PS of 96 cores, on nodes of 64
    small = make_job("small", arrival_s=600.0)
    settings = ClusterSettings(nodes=2, node_cpu=NODE_CPU, node_memory_mb=NODE_MEMORY_MB)
    result = Simulation([huge, small], ManualPolicy(), settings, QUIET, seed=0).run()
    outcomes = by_id(result)
    assert outcomes["huge"].reason == "never started: its pods do not fit the empty cluster"
    assert outcomes["huge"].started_at is None
    assert jct(outcomes["small"]) > 0
    assert summarize(result).never_started == 1


def test_a_job_that_fits_no_node_never_starts_and_does_not_block_others() -> None:
    huge = make_job("huge", ps_cpu=96.0)  # a PS of 96 cores, on nodes of 64
    small = make_job("small", arrival_s=600.0)
    settings = cluster(2, max_time_s=86400.0)
    result = Simulation([huge, small], ManualPolicy(), settings, QUIET, seed=0).run()
    outcomes = by_id(result)

    never = outcomes["huge"]
    assert never.started_at is None
    assert not never.succeeded and never.finished_at is None and never.jct is None
    assert never.reason
    assert jct(outcomes["small"]) > 0  # backfilled past the job that waits forever
    assert summarize(result).completion_rate == 0.5
    assert all(u.cpu_allocated <= 2 * NODE_CPU for u in result.utilisation)


# --------------------------------------------------------------------------------------------
# Queueing


def test_two_jobs_on_a_cluster_for_one_run_one_after_the_other() -> None:
    first_job = make_job("q-a")  # 48 cores each, on one 64-core node
    second_job = make_job("q-b")
    result = Simulation(
        [second_job, first_job],
        ManualPolicy(),
        cluster(1),
        QUIET,
        seed=0,
        stragglers=even_workers(),
    ).run()
    first, second = by_id(result)["q-a"], by_id(result)["q-b"]

    assert first.started_at == 0.0
    assert first.finished_at is not None and second.started_at is not None
    assert second.started_at >= first.finished_at
    # JCT counts from submission: the wait, then the same training time as the first job.
    assert jct(second) == pytest.approx(second.started_at + jct(first))
    assert jct(second) > 1.9 * jct(first)
    assert max(u.running for u in result.utilisation) == 1
    assert any(u.queued == 1 for u in result.utilisation)


# --------------------------------------------------------------------------------------------
# OOM


#: Where the OOM job's largest PS outgrows its request (fraction of the training).
OOM_AT = 0.56
#: Checkpoints every 5 steps of 120 s; with even workers the job gains 1/30 a step, so it
#: checkpoints at 0.17, 0.33, 0.5 and first fails at 0.57, between two checkpoints.
CHECKPOINTED = dataclasses.replace(QUIET, checkpoint_interval_s=600.0)


def oom_job() -> TraceJob:
    """A one-hour job whose largest PS outgrows its memory request at 56 % of the training."""
    memory = template().truth.memory
    return make_job("oom", ps_memory_mb=int(memory.ps_used_mb(OOM_AT, 2)))


def run_oom(policy: Policy, faults: FaultSettings = QUIET) -> JobOutcome:
    result = Simulation([oom_job()], policy, cluster(), faults, seed=0, stragglers=even_workers())
    (outcome,) = result.run().outcomes
    return outcome


def test_manual_restarts_an_oom_job_from_its_checkpoint_until_the_retry_limit() -> None:
    job = oom_job()
    threshold = manual_oom_progress(job)
    assert threshold is not None and threshold == pytest.approx(OOM_AT, abs=0.01)
    outcome = run_oom(ManualPolicy(), CHECKPOINTED)
    recorder = FixedPolicy(elastic=False)
    assert run_oom(recorder, CHECKPOINTED) == outcome  # the manual policy, observed

    limit = CHECKPOINTED.retry_limit
    assert not outcome.succeeded and outcome.finished_at is None
    assert "OOMKilled" in outcome.reason and "ps" in outcome.reason
    assert outcome.oom_failures == limit + 1
    assert [(role, why) for _, _, role, why in recorder.failures] == [("ps", "OOMKilled")] * (
        limit + 1
    )
    assert all(progress >= threshold for _, progress, _, _ in recorder.failures)

    # Every restart is a new incarnation that resumes from the last checkpoint: not from zero,
    # and behind the progress where the job failed (the work since the checkpoint is lost).
    incarnations = sorted({(restarts, start) for _, _, restarts, start in recorder.seen})
    assert [restarts for restarts, _ in incarnations] == list(range(limit + 1))
    for restarts, start in incarnations[1:]:
        failed_at, progress_then, _, _ = recorder.failures[restarts - 1]
        assert start == failed_at
        resumed = min(p for _, p, r, s in recorder.seen if (r, s) == (restarts, start))
        assert 0.4 < resumed < progress_then


def test_a_failed_job_counts_only_the_restarts_it_was_given() -> None:
    # The job fails at its (retry_limit + 1)-th OOM: it was restarted retry_limit times (its
    # reason says so); the last failure ends the job, it is not a restart.
    outcome = run_oom(ManualPolicy(), CHECKPOINTED)
    limit = CHECKPOINTED.retry_limit
    assert outcome.reason == f"OOMKilled (ps); {limit} restarts used"
    assert outcome.restarts == limit


def test_a_checkpoint_never_holds_progress_past_the_failure_that_ended_its_step() -> None:
    # A checkpoint at every step: the step in which the PS outgrows its memory must not
    # checkpoint (the PS died during it). Each restart then resumes below the OOM point and
    # trains again before the next OOM, so two OOMs are more than the restart time apart.
    recorder = FixedPolicy(elastic=False)
    every_step = dataclasses.replace(QUIET, checkpoint_interval_s=120.0)
    outcome = run_oom(recorder, every_step)
    assert outcome.oom_failures == every_step.retry_limit + 1
    times = [now for now, _, _, _ in recorder.failures]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(gap > every_step.restart_s for gap in gaps), gaps


def test_an_elastic_policy_that_doubles_memory_after_an_oom_completes_the_job() -> None:
    grower = FixedPolicy(elastic=True, grow_on_oom=True)
    grown = run_oom(grower)
    assert grown.succeeded, grown.reason
    assert grown.oom_failures == 1 and grown.resizes == 1 and grown.restarts == 0
    assert [(role, why) for _, _, role, why in grower.failures] == [("ps", "OOMKilled")]
    (profile,) = grower.profiles
    assert profile.plans[-1].ps.memory_mb == 2 * profile.plans[0].ps.memory_mb
    # Only the PS was relaunched: the job finished soon after its hour of training.
    assert jct(grown) < 1.2 * HOUR

    # Relaunching the same pod does not help: the elastic job fails after its OOM limit.
    failed = run_oom(FixedPolicy(elastic=True))
    assert not failed.succeeded and "OOMKilled" in failed.reason
    assert failed.oom_failures == QUIET.elastic_oom_limit + 1

    planned = run_oom(PlannerPolicy())
    assert planned.succeeded, planned.reason


# --------------------------------------------------------------------------------------------
# Stragglers


def straggler_jct(policy: Policy, fraction: float, stragglers: StragglerModel | None) -> float:
    faults = dataclasses.replace(QUIET, straggler_job_fraction=fraction)
    job = make_job("slow", hours=2.0)
    result = Simulation(
        [job], policy, cluster(step_s=60.0), faults, seed=5, stragglers=stragglers
    ).run()
    return jct(result.outcomes[0])


def test_a_straggler_slows_a_static_job_and_an_elastic_one_less() -> None:
    model = even_workers()
    static = straggler_jct(ManualPolicy(), 1.0, model) / straggler_jct(ManualPolicy(), 0.0, model)
    elastic = straggler_jct(FixedPolicy(elastic=True), 1.0, model) / straggler_jct(
        FixedPolicy(elastic=True), 0.0, model
    )
    # A static job runs at its slowest worker's pace: half speed for the whole episode.
    assert static > 1.15
    # Dynamic sharding: the other three workers keep their pace.
    assert elastic > 1.0
    assert elastic - 1 < 0.5 * (static - 1)


class ReplacingPolicy(FixedPolicy):
    """Elastic; replaces any worker reporting under half its peers' median pace."""

    def decide(self, job: JobView) -> ResourcePlan | None:
        if not job.samples:
            return None
        workers = [n for n in job.samples[-1].nodes if n.role == "worker"]
        paces = sorted(n.throughput or 0.0 for n in workers)
        median = paces[len(paces) // 2]
        slow = [n for n in workers if (n.throughput or 0.0) < 0.5 * median]
        if not slow:
            return None
        actions = tuple(NodeAction(kind="replace_worker", node=n.name, reason="slow") for n in slow)
        return dataclasses.replace(job.plan, actions=actions)


def test_workers_report_their_own_pace_and_a_replaced_straggler_recovers() -> None:
    model = even_workers(onset=0.1, duration=0.8, slowdown=4.0)
    faults = dataclasses.replace(QUIET, straggler_job_fraction=1.0)
    job = make_job("slow", hours=2.0)
    seen: list[list[float]] = []

    class Watching(FixedPolicy):
        def decide(self, view: JobView) -> ResourcePlan | None:
            if view.samples:
                seen.append(
                    [n.throughput or 0.0 for n in view.samples[-1].nodes if n.role == "worker"]
                )
            return None

    Simulation(
        [job], Watching(elastic=True), cluster(step_s=60.0), faults, seed=5, stragglers=model
    ).run()
    # During the episode worker 0 reports a quarter of its peers' pace.
    assert any(paces[0] < 0.3 * max(paces[1:]) for paces in seen)

    kept = straggler_jct(FixedPolicy(elastic=True), 1.0, model)
    replaced = Simulation(
        [job],
        ReplacingPolicy(elastic=True),
        cluster(step_s=60.0),
        faults,
        seed=5,
        stragglers=model,
    ).run()
    outcome = replaced.outcomes[0]
    assert outcome.succeeded
    assert jct(outcome) < kept


def test_pai_straggler_episodes_slow_static_jobs() -> None:
    faults = dataclasses.replace(QUIET, straggler_job_fraction=1.0)
    jobs = [make_job(f"pai-{i}", arrival_s=i * 8 * HOUR, hours=2.0) for i in range(6)]

    def run(f: FaultSettings) -> dict[str, JobOutcome]:
        return by_id(Simulation(jobs, ManualPolicy(), cluster(step_s=60.0), f, seed=2).run())

    hit, clean = run(faults), run(QUIET)
    slowdowns = [jct(hit[j.id]) / jct(clean[j.id]) for j in jobs]
    assert all(s >= 1.0 for s in slowdowns)
    assert sum(s > 1.0 for s in slowdowns) >= 2


# --------------------------------------------------------------------------------------------
# Restarts


def test_evictions_restart_static_jobs_and_cost_them_time() -> None:
    jobs = [make_job(f"ev-{i}", arrival_s=i * 8 * HOUR, hours=1.5) for i in range(5)]
    evicting = dataclasses.replace(QUIET, eviction_per_pod_hour=0.2, retry_limit=100)

    def run(faults: FaultSettings) -> dict[str, JobOutcome]:
        return by_id(Simulation(jobs, ManualPolicy(), cluster(), faults, seed=4).run())

    evicted, clean = run(evicting), run(QUIET)
    assert all(o.restarts == 0 for o in clean.values())
    assert sum(o.restarts for o in evicted.values()) > 0
    for job in jobs:
        after, before = evicted[job.id], clean[job.id]
        if after.restarts:
            assert jct(after) > jct(before) + after.restarts * evicting.restart_s * 0.99
        else:
            assert jct(after) == jct(before)
    assert statistics.fmean(jct(evicted[j.id]) for j in jobs) > statistics.fmean(
        jct(clean[j.id]) for j in jobs
    )


# --------------------------------------------------------------------------------------------
# Utilisation


def test_manual_cpu_utilisation_matches_the_calibrated_trace() -> None:
    trace = synthetic_trace(40, 9)
    settings = ClusterSettings(*cluster_size_for(trace))
    result = Simulation(trace, ManualPolicy(), settings, QUIET, seed=0).run()
    summary = summarize(result)
    assert 0.15 <= summary.cpu_utilization <= 0.35
    assert 0.0 < summary.memory_utilization <= 1.0
    assert summary.jobs == 40 and summary.resizes == 0


# --------------------------------------------------------------------------------------------
# Every policy, end to end


@pytest.fixture(scope="module")
def trace30() -> list[TraceJob]:
    return synthetic_trace(30, 5)


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_policy_runs_a_trace_to_the_end_within_quotas(
    name: str, trace30: list[TraceJob]
) -> None:
    guard = QuotaGuard(POLICIES[name]())
    settings = ClusterSettings(*cluster_size_for(trace30))
    result = Simulation(trace30, guard, settings, FaultSettings(), seed=0).run()

    assert result.policy == name
    assert [o.job_id for o in result.outcomes] == sorted(j.id for j in trace30)
    summary = summarize(result)
    assert 0.0 <= summary.completion_rate <= 1.0
    assert summary.completed == sum(o.succeeded for o in result.outcomes)
    for o in result.outcomes:
        assert "not finished when the simulation ended" not in o.reason
        assert o.started_at is not None and o.started_at >= o.submitted_at
        if o.succeeded:
            assert o.finished_at is not None and o.finished_at >= o.started_at
        else:
            assert o.reason
    assert guard.plans >= len(trace30)
    assert guard.violations == []


# --------------------------------------------------------------------------------------------
# Recurring jobs


def test_the_planner_keeps_overlapping_runs_of_one_scenario_apart() -> None:
    # Two runs of one recurring job (same spec name) overlap: a run is still going when the
    # next one is submitted (a late or queued run). Each must keep its own planning state.
    first, second = make_job("day-1"), make_job("day-2", arrival_s=600.0)
    assert first.spec.name == second.spec.name
    result = Simulation([first, second], PlannerPolicy(), cluster(), QUIET, seed=0).run()
    assert all(o.succeeded for o in result.outcomes)


# --------------------------------------------------------------------------------------------
# Paces, CPU at pace, profiling, elastic starts, reservations


def test_a_static_jobs_pods_use_cpu_at_its_slowest_workers_pace() -> None:
    """Every worker on a node at half speed: a static job does half the work per second and
    its pods use half the CPU (the fast pace's cores idle, as a static partition's do); an
    elastic job's workers keep their cores busy at the slow pace. PS work follows samples."""
    model = StragglerModel(
        patterns=((2.0,) * 10,),
        slowdowns=(1.0,),
        episode_onset=0.5,
        episode_duration=0.1,
        episode_ratios=(1.0,),
    )

    def mean_cpu(elastic: bool, role: str) -> float:
        recorder = FixedPolicy(elastic=elastic)
        sim = Simulation([make_job("pace")], recorder, cluster(), QUIET, seed=0, stragglers=model)
        sim.run()
        (profile,) = recorder.profiles
        return statistics.fmean(
            n.cpu_used for s in profile.samples for n in s.nodes if n.role == role
        )

    assert mean_cpu(False, "worker") == pytest.approx(mean_cpu(True, "worker") / 2, rel=0.02)
    assert mean_cpu(False, "ps") == pytest.approx(mean_cpu(True, "ps"), rel=0.02)
    paced = Simulation([make_job("pace")], ManualPolicy(), cluster(), QUIET, seed=0).run()
    slow = Simulation(
        [make_job("pace")], ManualPolicy(), cluster(), QUIET, seed=0, stragglers=model
    ).run()
    assert jct(by_id(slow)["pace"]) > 1.8 * jct(by_id(paced)["pace"])


class ResizingPolicy(FixedPolicy):
    """Grows to 8 workers at its first decision, then back to 4 at its fourth."""

    def decide(self, job: JobView) -> ResourcePlan | None:
        super().decide(job)
        w = job.plan.workers
        count = {1: 8, 4: 4}.get(len(self.seen))
        if count is None:
            return None
        return ResourcePlan(
            workers=NodeGroup(count=count, cpu=w.cpu, memory_mb=w.memory_mb),
            ps=job.plan.ps,
            stage=Stage.AUTO_SCALE,
            reason="resize",
        )


def test_a_workers_pace_is_kept_through_resizes() -> None:
    """Paces are drawn once per job and slot: after growing and shrinking, worker k reports
    the same share of the throughput as before (no redraw at every resize)."""
    model = StragglerModel(
        patterns=((1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9),),
        slowdowns=(1.0,),
        episode_onset=0.5,
        episode_duration=0.1,
        episode_ratios=(1.0,),
    )
    policy = ResizingPolicy(elastic=True)
    job = make_job("resized", hours=2.0)
    Simulation([job], policy, cluster(), QUIET, seed=5, stragglers=model).run()
    (profile,) = policy.profiles
    four = [s for s in profile.samples if s.workers == 4]
    first = [s for s in four if s.time < 200]
    last = four[-1]

    def shares(sample: object) -> list[float]:
        nodes = [n for n in sample.nodes if n.role == "worker"]  # type: ignore[attr-defined]
        total = sum(n.throughput or 0.0 for n in nodes)
        return [round((n.throughput or 0.0) / total, 3) for n in nodes]

    assert any(s.workers == 8 for s in profile.samples)
    assert first and shares(first[0]) == shares(last)
    assert len(set(shares(last))) > 1  # the paces differ, so the check means something


class ProfilingPolicy(FixedPolicy):
    """Asks the engine to profile two smaller configurations before training."""

    def profile_plans(self, spec: JobSpec, plan: ResourcePlan) -> list[ResourcePlan]:
        return [
            dataclasses.replace(plan, workers=dataclasses.replace(plan.workers, count=c))
            for c in (1, 2)
        ] + [dataclasses.replace(plan, workers=dataclasses.replace(plan.workers, count=99))]

    def decide(self, job: JobView) -> ResourcePlan | None:
        self.profiled = dict(job.profiled)
        return super().decide(job)


def test_profiling_runs_a_few_steps_per_configuration_and_reports_them() -> None:
    job = make_job("profiled")
    policy = ProfilingPolicy(elastic=False)
    result = Simulation([job], policy, cluster(), QUIET, seed=0, stragglers=even_workers())
    (outcome,) = result.run().outcomes
    truth = job.truth.throughput
    batch = job.spec.training.batch_size
    steps = QUIET.profile_warmup_steps + QUIET.profile_steps
    expected = 0.0
    for w in (1, 2):  # the 99-worker one does not fit the job's pods and is skipped
        x = truth.throughput(w, 2, 8.0, 8.0, batch)
        expected += QUIET.relaunch_s + steps * w * batch / x
        assert policy.profiled[(w, 2)] == pytest.approx(x, rel=4 * QUIET.noise)
    assert set(policy.profiled) == {(1, 2), (2, 2)}
    assert outcome.profile_s == pytest.approx(expected)
    assert 60 < outcome.profile_s < 900  # minutes, not the hour an interval-based one took


def test_an_elastic_job_starts_with_the_workers_that_fit_and_a_static_one_waits() -> None:
    """One 64-core node holds a 48-core job; a second job (4 workers x 8 + 1 PS x 8) finds
    16 cores: elastic, it starts with what fits now (its PS and one worker); static, it
    waits for the first to end."""
    jobs = [make_job("a"), make_job("b", ps=1, arrival_s=120.0)]
    elastic = Simulation(jobs, FixedPolicy(elastic=True), cluster(1), QUIET, seed=0).run()
    static = Simulation(jobs, FixedPolicy(elastic=False), cluster(1), QUIET, seed=0).run()
    eb, sb = by_id(elastic)["b"], by_id(static)["b"]
    assert eb.started_at is not None and eb.started_at <= 240.0

    assert sb.started_at is not None and sb.started_at >= by_id(static)["a"].finished_at  # type: ignore[operator]
    assert max(u.cpu_allocated for u in elastic.utilisation) <= NODE_CPU + 1e-9


def test_a_long_waiting_job_stops_the_backfill_until_it_starts() -> None:
    """A big job behind a stream of small ones: without the reservation the small ones keep
    the node busy and it waits for the stream to end; with it, it starts within a job's
    length of its reservation."""
    big = make_job("big", workers=6, arrival_s=60.0)  # 64 cores: the whole node
    small = [make_job(f"s{i}", workers=1, ps=1, arrival_s=1800.0 * i, hours=1.0) for i in range(40)]
    jobs = [big, *small]

    def wait(reserve_after_s: float) -> float:
        settings = dataclasses.replace(cluster(1), reserve_after_s=reserve_after_s)
        result = Simulation(jobs, ManualPolicy(), settings, QUIET, seed=0).run()
        started = by_id(result)["big"].started_at
        assert started is not None
        return started - big.arrival_s

    assert wait(3600.0) <= 3600.0 + 2 * HOUR
    assert wait(1e12) > 10 * HOUR
