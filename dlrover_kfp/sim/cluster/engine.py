"""A discrete-time cluster simulator: jobs arrive, queue, run, fail, resize and finish.

Time advances in steps of ``step_s`` simulated seconds. In each step, in this order:

1. jobs whose arrival time has come join the queue;
2. the scheduler starts queued jobs, first come first served with backfill: a job starts when
   all its pods fit on the nodes (first fit, largest pods first, CPU and memory both), else it
   waits and later jobs that fit may start;
3. every running job trains for the step at the throughput its hidden truth gives for its
   current pods (minus pauses, stragglers and a hot PS), produces one runtime sample as its
   pods would report it, and may meet a fault:

   * **OOM**: a pod's memory use (the truth's curve at the job's progress) passes its limit;
   * **node failure**: a node dies (rate per node-hour); every pod on it is lost;
   * **eviction**: a pod is preempted (rate per pod-hour);

   a non-elastic policy restarts the whole job from its last persisted checkpoint (the work
   since is lost) up to ``retry_limit`` times; an elastic one relaunches only the failed pod
   (a PS loses the work since its last flash checkpoint, a worker its current shard);
4. the policy is asked for a new plan every ``decision_interval_s``; a plan that does not fit
   the free capacity is cut to the workers that fit, or refused (a cut back to the pods the
   job already has changes nothing: no resize, no pause).

Workers differ in pace as measured in real per-worker batch times (Alibaba PAI): a persistent
imbalance per worker slot, drawn once per job (restarts and resizes keep it), and a straggler
episode for a share of jobs. A static job (no dynamic sharding) runs at its slowest worker's
pace and its pods use CPU at that pace; an elastic one at the sum of its workers' paces.

The scheduler is first come first served with backfill, and a job that has waited
``reserve_after_s`` stops the backfill until it starts (so no job waits forever behind smaller
ones). An elastic job whose plan does not fit the free capacity starts with the workers that
fit (at least its minimum), as an elastic runtime does, and grows later; a static one waits for
all its pods. Every rate is in :class:`FaultSettings`, fixed before any comparison and
documented in docs/simulator.md. Everything is deterministic per seed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dlrover_kfp.core.plan import NodeGroup, ResourcePlan, Stage
from dlrover_kfp.core.profile import (
    AppliedPlan,
    JobEvent,
    JobProfile,
    Metrics,
    NodeSample,
    Outcome,
    RuntimeSample,
    profile_job,
)
from dlrover_kfp.core.summary import format_timestamp
from dlrover_kfp.sim.cluster.api import EPOCH, JobOutcome, JobView, Policy, Role
from dlrover_kfp.sim.cluster.oracle import best_throughput
from dlrover_kfp.sim.cluster.stragglers import StragglerModel
from dlrover_kfp.sim.cluster.trace import TraceJob


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    nodes: int
    node_cpu: float
    node_memory_mb: int
    #: simulated seconds per step (and between two runtime samples of a job)
    step_s: float = 120.0
    #: None (the default): the simulation runs until every job of the trace has ended, however
    #: long the trace (see :meth:`Simulation.run` for when it stops otherwise); a number: it
    #: stops there even if jobs remain, and those, and any that had not arrived, count as not
    #: completed. (It was 60 days before issue 44: a 5,000-job trace, 83 days of arrivals,
    #: simulated 3,731 jobs and left the later arrivals out of the results.)
    max_time_s: float | None = None
    #: a queued job that has waited this long stops the backfill of later jobs until it starts
    reserve_after_s: float = 3600.0


#: The pause of a live PS move, measured (``benchmarks/ps_move_pause.py``, docs/benchmarks.md):
#: one PS of 1.0 GiB moved to a new PS process by the runtime's method (the new PS copies while
#: training goes on, then the workers pause while it fetches the rows updated since), from the
#: last applied push to the new PS's first answer. The largest figure measured: 2.14 s, under
#: load (load average 4.9-5.9) with 250 pushes/s (1.10-2.14 s over 2 rounds); quiet at 100
#: pushes/s it was 0.258 s (median of 3). A larger or busier PS re-sends more rows in the pause;
#: nothing larger than 1 GiB was measured.
LIVE_PS_MOVE_PAUSE_S = 2.14

#: The start of a pod on a cluster (scheduled, image present or pulled, container and process
#: started), stated, not measured: no real cluster is reachable from here (docs/kubernetes.md,
#: "Not done yet": the fake kubelet starts a process at once). It is the figure this simulator
#: already gives a new worker pod in an elastic resize (``elastic_resize_s``), so a PS pod
#: starts as fast as a worker pod. For scale: Kubernetes' SLO for a schedulable stateless pod
#: is 5 s at the 99th percentile, image pulls excluded (kubernetes/community,
#: sig-scalability/slos/pod_startup_latency.md), and a PS process is ready 1.6 s (small model)
#: to 10.5 s (medium, 1 CPU) after it starts (``benchmarks/ps_startup.py``,
#: docs/training-benchmarks.md); the rest of the 60 s is left to an image pull.
CLUSTER_POD_START_S = 60.0

#: The default price of an elastic resize that changes the PS: the new PS pods start
#: (:data:`CLUSTER_POD_START_S`), then the switch pauses the workers
#: (:data:`LIVE_PS_MOVE_PAUSE_S`), 62.14 s, all charged as a pause of the whole job. That is
#: what the runtime's stop-first change pays (the quota cannot hold old and new PS together:
#: the new PS start while the job is paused, runtime/ps_change.py), less its checkpoint and
#: restore; for a live change, whose new PS start while training goes on, it is an upper bound.
PS_RESIZE_S = CLUSTER_POD_START_S + LIVE_PS_MOVE_PAUSE_S


@dataclass(frozen=True, slots=True)
class FaultSettings:
    """Fault rates and recovery costs. Fixed before any comparison; see docs/results.md."""

    #: node failures per node-hour (a node lost every ~40 days)
    node_failure_per_hour: float = 1 / 1000
    #: evictions (preemption) per pod-hour
    eviction_per_pod_hour: float = 1 / 400
    #: process crashes (an error exit: a bad record, a lost connection) per pod-hour
    crash_per_pod_hour: float = 1 / 1000
    #: workers' paces from the PAI data (persistent imbalance, episodes); off: all equal
    stragglers: bool = True
    #: fraction of jobs with a straggling worker episode (PAI data give its size and timing)
    straggler_job_fraction: float = 0.15
    #: fraction of jobs with a hot PS (an unbalanced embedding partition)
    hot_ps_job_fraction: float = 0.10
    #: extra load on the hot PS (its share of lookups is (1 + this) times the others')
    hot_ps_imbalance: float = 1.0
    #: seconds between persisted checkpoints of a non-elastic job (a restart loses the rest)
    checkpoint_interval_s: float = 1800.0
    #: seconds a whole-job restart takes (pods scheduled, started, checkpoint restored)
    restart_s: float = 300.0
    #: retries of a non-elastic job before it fails
    retry_limit: int = 3
    #: seconds an elastic resize that leaves the PS as they were takes (new worker pods start,
    #: shards move): the whole job pauses this long when worker pods are replaced (their CPU
    #: or memory change); workers added alone start this long while the others train on
    #: (Simulation._resize)
    elastic_resize_s: float = 60.0
    #: seconds an elastic resize that changes the PS (their count, CPU or memory: new PS pods)
    #: pauses the whole job; from a measurement and a stated figure (:data:`PS_RESIZE_S`).
    #: ``dlrover-kfp simulate --ps-resize-s`` sets it.
    ps_resize_s: float = PS_RESIZE_S
    #: seconds a checkpoint-and-restart resize pauses training (non-elastic policies)
    restart_resize_s: float = 300.0
    #: seconds of work a PS failure loses under flash checkpoints (half their interval)
    flash_loss_s: float = 150.0
    #: seconds an elastic pod relaunch pauses the job (and a pod start costs a profiled
    #: configuration). DLRover-RM's own figure: its hot-PS experiment starts a new PS with about
    #: 1 min of flash save and 2 of load (docs/baselines.md), so ~3 minutes; was 60 s before
    #: issue 30. ``dlrover-kfp simulate --relaunch-s`` sets it.
    relaunch_s: float = 180.0
    #: OOM kills an elastic job survives (relaunched with its policy's plan) before it fails
    elastic_oom_limit: int = 5
    #: relative noise of measured throughput and CPU
    noise: float = 0.03
    #: steps a profiled configuration runs after its warm-up steps (policies that profile)
    profile_steps: int = 20
    profile_warmup_steps: int = 5


@dataclass
class _Run:
    """A job's mutable state in the simulation."""

    job: TraceJob
    total: float
    plan: ResourcePlan | None = None
    started_at: float | None = None
    incarnation_start: float = 0.0
    progress: float = 0.0
    checkpoint_progress: float = 0.0
    running_s: float = 0.0
    pause_until: float = 0.0
    placement: list[int] = field(default_factory=list)  # node index per pod, workers first
    samples: list[RuntimeSample] = field(default_factory=list)
    events: list[JobEvent] = field(default_factory=list)
    plans: list[AppliedPlan] = field(default_factory=list)
    restarts: int = 0
    ooms: int = 0
    self_inflicted_ooms: int = 0
    relaunches: int = 0
    resizes: int = 0
    ps_resizes: int = 0
    next_decision: float = 0.0
    straggler: tuple[float, float, float, int] | None = None  # onset, end, factor, worker
    slowdowns: tuple[float, ...] = ()
    profiled: dict[tuple[int, int], float] = field(default_factory=dict)
    #: (trace time, plan) each time the pods in effect change, from the job's start
    plan_log: list[tuple[float, ResourcePlan]] = field(default_factory=list)
    profile_s: float = 0.0
    #: (start, end, cores used) of each profiled configuration's training, in trace seconds
    profile_use: list[tuple[float, float, float]] = field(default_factory=list)
    hot: bool = False
    step: int = 0
    finished_at: float | None = None
    failed: str | None = None


@dataclass(frozen=True, slots=True)
class Utilisation:
    """Cluster use at one moment: allocated and used CPU and memory of running pods."""

    time: float
    cpu_allocated: float
    cpu_used: float
    memory_allocated_mb: float
    memory_used_mb: float
    running: int
    queued: int


@dataclass(frozen=True, slots=True)
class SimulationResult:
    policy: str
    outcomes: tuple[JobOutcome, ...]
    utilisation: tuple[Utilisation, ...]
    cluster: ClusterSettings


class Simulation:
    """One policy driving one cluster through one trace."""

    def __init__(
        self,
        jobs: Sequence[TraceJob],
        policy: Policy,
        cluster: ClusterSettings,
        faults: FaultSettings | None = None,
        *,
        seed: int = 0,
        stragglers: StragglerModel | None = None,
    ) -> None:
        self.jobs = sorted(jobs, key=lambda j: (j.arrival_s, j.id))
        self.policy = policy
        self.cluster = cluster
        self.faults = faults or FaultSettings()
        self.seed = seed
        self.rng = random.Random(seed)
        self.stragglers = stragglers or StragglerModel.from_package()
        self.free_cpu = [cluster.node_cpu] * cluster.nodes
        self.free_mem = [float(cluster.node_memory_mb)] * cluster.nodes

    # -- placement -----------------------------------------------------------------------------

    def _pods(self, plan: ResourcePlan) -> list[tuple[float, int]]:
        return [(plan.workers.cpu, plan.workers.memory_mb)] * plan.workers.count + [
            (plan.ps.cpu, plan.ps.memory_mb)
        ] * plan.ps.count

    def _place(self, plan: ResourcePlan) -> list[int] | None:
        """Nodes for every pod (first fit, largest first), or None; reserves them on success."""
        pods = self._pods(plan)
        order = sorted(range(len(pods)), key=lambda i: -pods[i][0])
        chosen = [0] * len(pods)
        taken: list[tuple[int, float, int]] = []
        for i in order:
            cpu, mem = pods[i]
            for n in range(self.cluster.nodes):
                if self.free_cpu[n] >= cpu - 1e-9 and self.free_mem[n] >= mem:
                    self.free_cpu[n] -= cpu
                    self.free_mem[n] -= mem
                    taken.append((n, cpu, mem))
                    chosen[i] = n
                    break
            else:
                for n, c, m in taken:
                    self.free_cpu[n] += c
                    self.free_mem[n] += m
                return None
        return chosen

    def _release(self, run: _Run) -> None:
        if run.plan is None or not run.placement:
            return
        for n, (cpu, mem) in zip(run.placement, self._pods(run.plan), strict=True):
            self.free_cpu[n] += cpu
            self.free_mem[n] += mem
        run.placement = []

    # -- the loop ------------------------------------------------------------------------------

    def run(self, progress: Callable[[float, int, int], None] | None = None) -> SimulationResult:
        step = self.cluster.step_s
        pending = list(self.jobs)
        queue: list[_Run] = []
        running: list[_Run] = []
        done: list[_Run] = []
        usage: list[Utilisation] = []
        t = 0.0
        limit = self.cluster.max_time_s
        stuck = False
        while (pending or queue or running) and (limit is None or t <= limit):
            while pending and pending[0].arrival_s <= t:
                job = pending.pop(0)
                queue.append(self._admit(job))
            for run in list(queue):
                if self._start(run, t):
                    queue.remove(run)
                    running.append(run)
                elif t - run.job.arrival_s >= self.cluster.reserve_after_s and self._could_fit(run):
                    break  # it has waited long enough: no backfill past it
            if queue and not running and not pending:
                # Nothing runs and nothing is to come, so the cluster is empty: every queued job
                # is tried on it, past any reservation (a job that waits for room cannot get
                # more than all of it). If none starts, none ever will.
                started = [run for run in queue if self._start(run, t)]
                if not started:
                    stuck = True
                    break
                queue = [run for run in queue if run not in started]
                running.extend(started)
            cpu_alloc = cpu_used = mem_alloc = mem_used = 0.0
            for run in list(running):
                used = self._advance(run, t, step)
                if used is not None:
                    cpu_alloc += used[0]
                    cpu_used += used[1]
                    mem_alloc += used[2]
                    mem_used += used[3]
                if run.finished_at is not None:
                    running.remove(run)
                    done.append(run)
            done.extend(self._node_failures(running, t, step))
            usage.append(
                Utilisation(t, cpu_alloc, cpu_used, mem_alloc, mem_used, len(running), len(queue))
            )
            t += step
            if progress is not None:
                progress(t, len(done), len(self.jobs))
        for run in queue:
            run.failed = run.failed or (
                "never started: its pods do not fit the empty cluster"
                if stuck
                else "not started when the simulation ended"
            )
            self._finish(run, t, failed=True)
            done.append(run)
        for run in running:
            run.failed = run.failed or "not finished when the simulation ended"
            self._finish(run, t, failed=True)
            done.append(run)
        for job in pending:  # only with a max_time_s: it had not arrived by then
            run = _Run(job=job, total=1.0, failed="not submitted when the simulation ended")
            self._finish(run, t, failed=True)
            done.append(run)
        outcomes = tuple(self._outcome(r) for r in sorted(done, key=lambda r: r.job.id))
        return SimulationResult(self.policy.name, outcomes, tuple(usage), self.cluster)

    def _admit(self, job: TraceJob) -> _Run:
        spec = job.spec
        total = float((spec.data.rows or 0) * spec.training.epochs)
        run = _Run(job=job, total=max(1.0, total))
        rng = random.Random(f"{self.seed}:{job.id}")
        straggles = rng.random() < self.faults.straggler_job_fraction
        onset, duration, factor = self.stragglers.episode(rng)
        if straggles and self.faults.stragglers:
            run.straggler = (onset, min(1.0, onset + duration), factor, 0)
        if rng.random() < self.faults.hot_ps_job_fraction:
            run.hot = True
        if self.faults.stragglers:  # one pace per worker slot for the whole job
            slots = max(job.spec.elastic.max_workers, job.workers.count, 64)
            pace_rng = random.Random(f"{self.seed}:{job.id}:pace")
            run.slowdowns = tuple(self.stragglers.slowdown_factors(pace_rng, slots))
        return run

    def _start(self, run: _Run, t: float) -> bool:
        if run.plan is None:
            # trace seconds, the protocol's one time base (api.py)
            run.plan = self._within_cluster(self.policy.initial(run.job.spec, t))
            run.plans.append(self._applied(run.plan, 0.0))
        placement = self._place(run.plan)
        if placement is None and self.policy.elastic:
            fitted = self._fit_workers(run.plan, run.job.spec.elastic.min_workers, "free capacity")
            if fitted is not None:
                placement, run.plan = fitted
                run.plans.append(self._applied(run.plan, 0.0))
        if placement is None:
            return False
        run.placement = placement
        first = run.started_at is None
        if first:
            run.started_at = t
            run.plan_log.append((t, run.plan))
        run.incarnation_start = t
        if first:
            self._profile(run, t)
        run.next_decision = t + run.profile_s + self.policy.decision_interval_s
        return True

    def _fit_workers(
        self, plan: ResourcePlan, least: int, why: str
    ) -> tuple[list[int], ResourcePlan] | None:
        """The most workers of ``plan`` (fewer than it asks, at least ``least``) whose pods
        fit the free capacity with its PS, placed; or None."""
        for count in range(plan.workers.count - 1, max(1, least) - 1, -1):
            trial = ResourcePlan(
                workers=NodeGroup(
                    count=count, cpu=plan.workers.cpu, memory_mb=plan.workers.memory_mb
                ),
                ps=plan.ps,
                stage=plan.stage,
                reason=plan.reason + f" (cut to {count} workers by {why})",
                similar_jobs=plan.similar_jobs,
            )
            placement = self._place(trial)
            if placement is not None:
                return placement, trial
        return None

    def _profile(self, run: _Run, t: float) -> None:
        """Run the configurations the policy asks to profile, a few steps each, before the job
        trains at its plan: each costs a pod start (``relaunch_s``) and its steps, trains at its
        own throughput meanwhile, and is measured with the usual noise. The job is paused for
        all of it; the cores each configuration uses while it trains are noted, so that the
        paused steps count them (:meth:`_profiling_cpu`)."""
        plans = getattr(self.policy, "profile_plans", None)
        if plans is None or run.plan is None:
            return
        f = self.faults
        held = run.plan
        spec = run.job.spec
        batch = spec.training.batch_size
        truth = run.job.truth.throughput
        for plan in plans(spec, held):
            if (
                plan.total_cpu > held.total_cpu + 1e-9
                or plan.total_memory_mb > held.total_memory_mb
            ):
                continue  # profiling runs inside the pods the job was given
            w, p = plan.workers.count, plan.ps.count
            x, wu, pu = truth.evaluate(w, p, plan.workers.cpu, plan.ps.cpu, batch)
            if x <= 0:
                continue
            steps = f.profile_warmup_steps + f.profile_steps
            seconds = steps * w * batch / x
            began = t + run.profile_s + f.relaunch_s  # its pods start, then it trains
            cores = w * min(plan.workers.cpu, wu) + p * min(plan.ps.cpu, pu)
            run.profile_use.append((began, began + seconds, cores))
            run.profile_s += f.relaunch_s + seconds
            run.progress = min(1.0, run.progress + x * seconds / run.total)
            run.profiled[(w, p)] = max(0.0, x * self.rng.gauss(1.0, f.noise))
        run.pause_until = max(run.pause_until, t + run.profile_s)

    def _within_cluster(self, plan: ResourcePlan) -> ResourcePlan:
        """``plan`` with workers cut until it could run on the whole (empty) cluster.

        A policy does not know the cluster's size; the scheduler would never place a job
        bigger than the cluster, so the admission controller trims it as a quota would.
        """
        c = self.cluster
        cap_cpu, cap_mem = c.nodes * c.node_cpu, c.nodes * c.node_memory_mb
        count = plan.workers.count
        while count > 1 and (
            count * plan.workers.cpu + plan.ps.total_cpu > cap_cpu
            or count * plan.workers.memory_mb + plan.ps.total_memory_mb > cap_mem
        ):
            count -= 1
        if count == plan.workers.count:
            return plan
        workers = NodeGroup(count=count, cpu=plan.workers.cpu, memory_mb=plan.workers.memory_mb)
        return ResourcePlan(
            workers=workers,
            ps=plan.ps,
            stage=plan.stage,
            reason=plan.reason + f" (cut to {count} workers: the cluster's size)",
            predicted_throughput=None,
            similar_jobs=plan.similar_jobs,
        )

    def _applied(self, plan: ResourcePlan, time: float) -> AppliedPlan:
        return AppliedPlan(
            time=round(time, 3),
            stage=plan.stage,
            reason=plan.reason,
            workers=plan.workers,
            ps=plan.ps,
        )

    # -- one job, one step ---------------------------------------------------------------------

    def _factors(self, run: _Run) -> list[float]:
        """Each worker's slowdown right now (1 = its nominal pace)."""
        assert run.plan is not None
        w = run.plan.workers.count
        factors = list(run.slowdowns[:w]) + [1.0] * max(0, w - len(run.slowdowns))
        if run.straggler is not None:
            onset, end, factor, k = run.straggler
            if onset <= run.progress < end and k < w:
                factors[k] = max(factors[k], factor)
        return factors

    def _rates(self, run: _Run) -> tuple[float, float, float]:
        """(samples/s, cores used per worker, cores used per PS) right now."""
        assert run.plan is not None
        plan = run.plan
        spec = run.job.spec
        truth = run.job.truth.throughput
        ps_cpu = plan.ps.cpu / (1.0 + self.faults.hot_ps_imbalance) if run.hot else plan.ps.cpu
        w, p = plan.workers.count, plan.ps.count
        batch = spec.training.batch_size
        x, wu, pu = truth.evaluate(w, p, plan.workers.cpu, ps_cpu, batch)
        factors = self._factors(run)
        per_worker = x / w
        if self.policy.elastic:  # dynamic sharding: every worker contributes its own pace
            eff = sum(per_worker / f for f in factors)
        else:  # static partitions: the job ends with its slowest worker
            eff = w * per_worker / max(factors)
            # and does the work of that pace: the faster workers' pods idle once their
            # partition is done, so over the job they use CPU in proportion
            wu *= eff / x if x > 0 else 0.0
        # PS work is per sample
        pu *= eff / x if x > 0 else 0.0
        return eff, wu, pu

    def _advance(
        self, run: _Run, t: float, step: float
    ) -> tuple[float, float, float, float] | None:
        assert run.plan is not None
        plan = run.plan
        truth = run.job.truth
        active = max(0.0, min(step, t + step - run.pause_until))
        x, wu, pu = self._rates(run)
        checkpoint_due = False
        if active > 0:
            run.progress = min(1.0, run.progress + x * active / run.total)
            run.running_s += active
            interval = self.faults.checkpoint_interval_s
            checkpoint_due = run.running_s // interval > (run.running_s - active) // interval
        w, p = plan.workers.count, plan.ps.count
        # PS 0 is the largest (the truth's imbalance); the others share the rest.
        snapshot = self.policy.elastic  # flash checkpoints keep a snapshot buffer in memory
        hot_mem = truth.memory.ps_used_mb(run.progress, p, 0, snapshot=snapshot)
        ps_mem = truth.memory.ps_used_mb(run.progress, p, 1, snapshot=snapshot)
        worker_mem = truth.memory.worker_mb
        cpu_alloc = w * plan.workers.cpu + p * plan.ps.cpu
        mem_alloc = float(w * plan.workers.memory_mb + p * plan.ps.memory_mb)
        cpu_used = mem_used = 0.0
        if active >= step:  # a full step of training: the pods report a sample
            sample = self._sample(run, t + step, x, wu, pu, ps_mem, hot_mem, worker_mem)
            run.samples.append(sample)
            cpu_used = sum(n.cpu_used for n in sample.nodes)
            mem_used = float(sum(n.memory_used_mb for n in sample.nodes))
        else:  # paused pods hold their memory; they work only over the step's active part
            cpu_used = self._cpu_used(run, wu, pu) * active / step
            cpu_used += self._profiling_cpu(run, t, t + step) / step
            mem_used = float(w * min(worker_mem, plan.workers.memory_mb))
            mem_used += min(hot_mem, plan.ps.memory_mb) + (p - 1) * min(ps_mem, plan.ps.memory_mb)
        if run.progress >= 1.0:
            self._finish(run, t + step, failed=False)
            return cpu_alloc, cpu_used, mem_alloc, mem_used
        # Faults: OOM first (deterministic from the truth), then evictions (random).
        events_before = len(run.events)
        if hot_mem > plan.ps.memory_mb:
            self._failure(run, t + step, "ps", "OOMKilled")
        elif worker_mem > plan.workers.memory_mb:
            self._failure(run, t + step, "worker", "OOMKilled")
        else:
            pods = w + p
            for reason, per_hour in (
                ("Evicted", self.faults.eviction_per_pod_hour),
                ("Error", self.faults.crash_per_pod_hour),
            ):
                rate = per_hour * pods * step / 3600
                if self.rng.random() < 1 - math.exp(-rate):
                    role: Role = "worker" if self.rng.random() < w / pods else "ps"
                    self._failure(run, t + step, role, reason)
                    break
        failed_now = len(run.events) > events_before
        if checkpoint_due and not failed_now:  # a checkpoint of a step that ended well
            run.checkpoint_progress = run.progress
        paused = run.pause_until > t + step
        if run.finished_at is None and not paused and t + step >= run.next_decision:
            run.next_decision = t + step + self.policy.decision_interval_s
            new = self.policy.decide(self._view(run, t + step))
            if new is not None:
                pause = self._resize_pause(run.plan, new)
                self._resize(run, new, t + step, pause=pause)
        return cpu_alloc, cpu_used, mem_alloc, mem_used

    def _sample(
        self,
        run: _Run,
        now: float,
        x: float,
        wu: float,
        pu: float,
        ps_mem: float,
        hot_mem: float,
        worker_mem: float,
    ) -> RuntimeSample:
        """What the job's pods would report for the step ending at ``now``."""
        assert run.plan is not None
        plan = run.plan
        rng = self.rng
        noise = self.faults.noise
        w, p = plan.workers.count, plan.ps.count
        measured = max(0.0, x * rng.gauss(1.0, noise))
        worker_cpu = plan.workers.cpu
        # Each worker reports its own pace: a straggler shows as a worker far below its peers.
        factors = self._factors(run)
        pace = [1.0 / f for f in factors]
        share = sum(pace)
        nodes = [
            NodeSample(
                name=f"{run.job.id}-worker-{k}",
                role="worker",
                cpu_used=round(min(worker_cpu, max(0.0, wu * rng.gauss(1.0, noise))), 3),
                cpu_requested=worker_cpu,
                memory_used_mb=int(min(worker_mem, plan.workers.memory_mb)),
                memory_requested_mb=plan.workers.memory_mb,
                throughput=round(measured * pace[k] / share, 1),
            )
            for k in range(w)
        ]
        for k in range(p):
            hot = k == 0
            busy = pu * (1.0 + self.faults.hot_ps_imbalance) if run.hot and hot else pu
            nodes.append(
                NodeSample(
                    name=f"{run.job.id}-ps-{k}",
                    role="ps",
                    cpu_used=round(min(plan.ps.cpu, max(0.0, busy * rng.gauss(1.0, noise))), 3),
                    cpu_requested=plan.ps.cpu,
                    memory_used_mb=int(min(hot_mem if hot else ps_mem, plan.ps.memory_mb)),
                    memory_requested_mb=plan.ps.memory_mb,
                )
            )
        batch = max(1, run.job.spec.training.batch_size)
        return RuntimeSample(
            time=round(now - run.incarnation_start, 3),
            global_step=int(run.progress * run.total / batch),
            throughput=round(measured, 1),
            workers=w,
            ps=p,
            worker_cpu=worker_cpu,
            ps_cpu=plan.ps.cpu,
            nodes=tuple(nodes),
        )

    def _cpu_used(self, run: _Run, wu: float, pu: float) -> float:
        """Cores the job's pods use while they train, without measurement noise: each worker
        ``wu``, each PS ``pu`` (the hot one ``1 + hot_ps_imbalance`` times that), each capped at
        its request, as :meth:`_sample` reports them.

        A step with a pause in it (a relaunch, a resize, a PS move) counts this for its active
        part only: over the pause the pods are held but idle (cpu used = 0), over the rest they
        train, ``used = cores · active / step``, the paper's accounting of CPU actually used.
        """
        assert run.plan is not None
        plan = run.plan
        workers = plan.workers.count * min(plan.workers.cpu, wu)
        hot = pu * (1.0 + self.faults.hot_ps_imbalance) if run.hot else pu
        ps = min(plan.ps.cpu, hot) + (plan.ps.count - 1) * min(plan.ps.cpu, pu)
        return workers + ps

    @staticmethod
    def _profiling_cpu(run: _Run, start: float, end: float) -> float:
        """Core-seconds the job's profiled configurations used between ``start`` and ``end``
        (trace seconds): ``Σ cores · overlap``, each configuration over its training only (its
        pod start uses none)."""
        return sum(cores * max(0.0, min(end, b) - max(start, a)) for a, b, cores in run.profile_use)

    def _resize_pause(self, old: ResourcePlan, new: ResourcePlan) -> float:
        """What a resize from ``old`` to ``new`` pauses the job: a checkpoint-and-restart for a
        non-elastic policy; for an elastic one, the PS-changing price when the PS change (their
        count, CPU or memory: new PS pods), else the price of a worker-only resize."""
        f = self.faults
        if not self.policy.elastic:
            return f.restart_resize_s
        return f.ps_resize_s if _ps_changed(old, new) else f.elastic_resize_s

    def _could_fit(self, run: _Run) -> bool:
        """Whether every pod of the run's plan fits an empty node (so waiting can help)."""
        c = self.cluster
        plan = run.plan
        return plan is not None and all(
            cpu <= c.node_cpu + 1e-9 and mem <= c.node_memory_mb for cpu, mem in self._pods(plan)
        )

    def _node_failures(self, running: list[_Run], t: float, step: float) -> list[_Run]:
        """Fail the pods of the nodes that die in this step; the runs that ended, removed
        from ``running``."""
        ended: list[_Run] = []
        p_fail = 1 - math.exp(-self.faults.node_failure_per_hour * step / 3600)
        for n in range(self.cluster.nodes):
            if self.rng.random() >= p_fail:
                continue
            for run in list(running):
                if n in run.placement and run.finished_at is None and run.plan is not None:
                    index = run.placement.index(n)
                    role: Role = "worker" if index < run.plan.workers.count else "ps"
                    self._failure(run, t + step, role, "NodeLost")
                    if run.finished_at is not None:
                        running.remove(run)
                        ended.append(run)
        return ended

    def _view(self, run: _Run, now: float) -> JobView:
        assert run.plan is not None and run.started_at is not None
        return JobView(
            job_id=run.job.id,
            spec=run.job.spec,
            submitted_at=run.job.arrival_s,
            started_at=run.incarnation_start,
            now=now,
            plan=run.plan,
            samples=run.samples,
            events=run.events,
            progress=run.progress,
            restarts=run.restarts,
            profiled=dict(run.profiled),
        )

    def _event(self, run: _Run, t: float, kind: str, role: Role, detail: str) -> None:
        run.events.append(
            JobEvent(
                time=round(t - run.incarnation_start, 3),
                kind=kind,  # type: ignore[arg-type]
                node=f"{run.job.id}-{role}-0",
                detail=detail,
            )
        )

    def _failure(self, run: _Run, t: float, role: Role, reason: str) -> None:
        f = self.faults
        if reason == "OOMKilled":
            run.ooms += 1
            if request_would_hold(run.job, role, snapshot=self.policy.elastic):
                run.self_inflicted_ooms += 1
        self._event(run, t, "oom" if reason == "OOMKilled" else "failure", role, reason)
        new = self.policy.after_failure(self._view(run, t), role, reason)
        if self.policy.elastic:
            if run.ooms > f.elastic_oom_limit:
                run.failed = f"{reason} ({role}) {run.ooms} times"
                self._finish(run, t, failed=True)
                return
            lost = f.flash_loss_s if role == "ps" else 0.0
            if lost:
                x, _, _ = self._rates(run)
                run.progress = max(0.0, run.progress - x * lost / run.total)
            run.pause_until = max(run.pause_until, t + f.relaunch_s)
            run.relaunches += 1
            self._event(run, t, "relaunch", role, f"{role} relaunched after {reason}")
            if new is not None:
                self._resize(run, new, t, pause=f.relaunch_s)
            return
        if run.restarts >= f.retry_limit:
            run.failed = f"{reason} ({role}); {f.retry_limit} restarts used"
            self._finish(run, t, failed=True)
            return
        run.restarts += 1
        run.progress = run.checkpoint_progress
        run.pause_until = t + f.restart_s
        # A new incarnation: its samples and times start afresh, as a restarted job's would.
        run.incarnation_start = t
        run.samples = []
        if new is not None:
            self._resize(run, new, t, pause=f.restart_s)

    def _resize(self, run: _Run, new: ResourcePlan, t: float, *, pause: float) -> None:
        assert run.plan is not None
        old = run.plan
        replaced = self._replace_workers(run, new, t)
        if new.workers == old.workers and new.ps == old.ps:
            if replaced:
                run.plan = new
                run.plans.append(self._applied(new, t - run.incarnation_start))
            return
        self._release(run)
        placement = self._place(new)
        if placement is None:  # cut the workers to what fits; else keep the old pods
            fitted = self._fit_workers(new, 1, "free capacity")
            if fitted is not None:
                placement, new = fitted
            if new.workers == old.workers and new.ps == old.ps and placement is not None:
                # cut back to the pods it has: nothing changes, so no resize and no pause
                run.placement = placement
                return
        if placement is None:
            restored = self._place(old)
            assert restored is not None, "the old pods' capacity was just released"
            run.placement = restored
            return
        run.placement = placement
        count_only = self.policy.elastic and _worker_count_only(old, new)
        x_old = self._rates(run)[0] if count_only else 0.0
        run.plan = new
        run.resizes += 1
        run.ps_resizes += _ps_changed(old, new)
        if count_only:
            # The job's workers lease shards from its master (runtime/elastic.py): new workers
            # start and lease as they come while the others train on, so for ``pause`` seconds
            # the job goes at its old rate, not its new one. As a whole-job pause (the same
            # progress): pause · (1 − X_old / X_new); none when workers are only removed (the
            # others train on; a removed worker's unreported shard, seconds of its work, goes
            # back to the queue and is not charged).
            x_new = self._rates(run)[0]
            pause *= max(0.0, 1.0 - x_old / x_new) if x_new > 0 else 1.0
        run.pause_until = max(run.pause_until, t + pause)
        run.plans.append(self._applied(new, t - run.incarnation_start))
        run.plan_log.append((t, new))

    def _replace_workers(self, run: _Run, plan: ResourcePlan, t: float) -> bool:
        """Apply ``replace_worker`` actions: the named workers get new pods at nominal pace."""
        prefix = f"{run.job.id}-worker-"
        done = False
        for action in plan.actions:
            if action.kind != "replace_worker" or not action.node.startswith(prefix):
                continue
            k = int(action.node[len(prefix) :])
            slow = list(run.slowdowns)
            if k < len(slow):
                slow[k] = 1.0
                run.slowdowns = tuple(slow)
            if run.straggler is not None and run.straggler[3] == k:
                run.straggler = None
            # One worker of w restarts while the others train on: its share of a relaunch.
            share = self.faults.relaunch_s / max(1, plan.workers.count)
            run.pause_until = max(run.pause_until, t + share)
            run.relaunches += 1
            self._event(run, t, "relaunch", "worker", f"{action.node} replaced: {action.reason}")
            done = True
        return done

    def _finish(self, run: _Run, t: float, *, failed: bool) -> None:
        self._release(run)
        run.finished_at = t
        if failed and run.failed is None:
            run.failed = "failed"
        if run.started_at is None:
            return
        profile = JobProfile(
            run_id=run.job.id,
            started_at=format_timestamp(EPOCH + run.incarnation_start),
            job=profile_job(run.job.spec),
            plans=tuple(run.plans),
            samples=tuple(run.samples[-200:]),
            events=tuple(run.events),
            outcome=Outcome(
                status="failed" if failed else "succeeded",
                jct_seconds=round(t - run.job.arrival_s, 3),
                samples_processed=int(run.progress * run.total),
                reason=run.failed or "",
            ),
            metrics=Metrics(),
        )
        self.policy.finished(profile)

    def _outcome(self, run: _Run) -> JobOutcome:
        succeeded = run.failed is None and run.finished_at is not None
        return JobOutcome(
            job_id=run.job.id,
            scenario=run.job.scenario,
            submitted_at=run.job.arrival_s,
            started_at=run.started_at,
            finished_at=run.finished_at if succeeded else None,
            succeeded=succeeded,
            reason=run.failed or "",
            restarts=run.restarts,
            oom_failures=run.ooms,
            resizes=run.resizes,
            ps_resizes=run.ps_resizes,
            profile_s=run.profile_s,
            failures=tuple(e.detail for e in run.events if e.kind in ("oom", "failure")),
            warm_started=bool(run.plans) and run.plans[0].stage is Stage.WARM_START,
            self_inflicted_ooms=run.self_inflicted_ooms,
            relaunches=run.relaunches,
            **self._plan_throughputs(run),
        )

    def _plan_throughputs(self, run: _Run) -> dict[str, float | None]:
        """The truth's throughput of the job's plans (no stragglers, no hot PS: the plan's
        worth, not the luck of its pods) and the oracle's best in the job's quota
        (:mod:`.oracle`, memory as this policy's runtime needs it):

        * ``final_plan_throughput``: X(the last plan in effect);
        * ``mean_plan_throughput``: Σ X(plan_i) · d_i / Σ d_i, d_i the seconds plan i held the
          job's pods between its start and its end (pauses included);
        * ``oracle_best``: the most any configuration in quota reaches.

        Empty for a job that never started.
        """
        if not run.plan_log or run.finished_at is None:
            return {}
        job = run.job
        truth, batch = job.truth.throughput, job.spec.training.batch_size

        def x(plan: ResourcePlan) -> float:
            g, p = plan.workers, plan.ps
            return truth.throughput(g.count, p.count, g.cpu, p.cpu, batch)

        ends = [t for t, _ in run.plan_log[1:]] + [max(run.finished_at, run.plan_log[-1][0])]
        spans = [(end - t, x(plan)) for (t, plan), end in zip(run.plan_log, ends, strict=True)]
        total = sum(d for d, _ in spans)
        c = self.cluster
        return {
            "final_plan_throughput": spans[-1][1],
            "mean_plan_throughput": (
                sum(d * v for d, v in spans) / total if total > 0 else spans[-1][1]
            ),
            "oracle_best": best_throughput(
                job, c.node_cpu, c.node_memory_mb, snapshot=self.policy.elastic
            ),
        }


def _ps_changed(old: ResourcePlan, new: ResourcePlan) -> bool:
    """Whether ``new`` changes the PS: their count, CPU or memory (new PS pods either way)."""
    return new.ps != old.ps


def _worker_count_only(old: ResourcePlan, new: ResourcePlan) -> bool:
    """Whether ``new`` differs from ``old`` in the worker count alone: no pod is replaced."""
    w, v = old.workers, new.workers
    return new.ps == old.ps and v.cpu == w.cpu and v.memory_mb == w.memory_mb


def request_would_hold(job: TraceJob, role: Role, *, snapshot: bool) -> bool:
    """Whether the user's own request holds ``role``'s memory for the whole job, on the truth.

    * worker: the truth's worker memory (constant over the job) is within the user's worker
      memory;
    * PS: the truth's largest PS (PS 0, which holds ``1 + imbalance`` times its share) with the
      user's PS count, at the end of training, is within the user's PS memory. PS memory only
      grows with progress (``MemoryTruth``), so the end is the peak: the request never OOMs.
      ``snapshot``: the runtime keeps flash-checkpoint snapshots (an elastic policy's does), so
      the question is asked of the same runtime the killed pod ran in.

    An OOM kill of ``role`` is *self-inflicted* when this holds: the user's request would have
    held the role for the whole job and the policy's plan (its count and memory) did not. Manual's
    kills are never self-inflicted (its plan is the request, in a runtime without snapshots).
    """
    memory = job.truth.memory
    if role == "worker":
        return memory.worker_mb <= job.workers.to_group().memory_mb
    ps = job.ps.to_group()
    return memory.ps_used_mb(1.0, ps.count, 0, snapshot=snapshot) <= ps.memory_mb


def stage_of(plan: ResourcePlan) -> Stage:
    return plan.stage
