"""Every threshold of the three planning stages, in one place, with its default and why.

Settings are frozen and read once at the edge (the CLI, a component, the runtime's start-up);
the planning functions take them as an argument and read nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from dlrover_kfp.core.perf_model import FitSettings

#: What a plan's target optimises (planner/search.py): the most throughput per unit of cost
#: above a throughput floor, or the cheapest plan nearly as fast as the best.
Objective = Literal["cost", "fastest"]


@dataclass(frozen=True, slots=True)
class NodeLimits:
    """Clamps on one pod. DLRover's master clamps CPU to 4-32 and memory to 6-64 GiB for
    production pods; we allow smaller pods (CPU 0.5, 512 MiB) because small DLRM jobs fit them."""

    min_cpu: float = 0.5
    max_cpu: float = 32.0
    min_memory_mb: int = 512
    max_memory_mb: int = 64 * 1024
    #: CPU is planned in steps of this many cores (Kubernetes schedules millicores, but plans
    #: that differ by 0.1 core are noise; half cores keep plans stable and readable).
    cpu_step: float = 0.5
    #: Memory is planned in steps of this many MiB.
    memory_step_mb: int = 256
    #: ... except a worker's sized from its measured use (Stage 2, a warm start's history),
    #: in steps of this many. A worker's memory is flat once measured (benchmarks/
    #: worker_memory.py: its peak at most 4.5% above its first samples'), so rounding it up
    #: buys nothing but fewer workers in a memory quota (a worker that needs 2,100 MiB gets
    #: 2,304 in 256 MiB steps, 2,112 in 64; 32 of them, 6 GiB more). A PS's memory grows, and a
    #: coarse step spaces out the moves its growth costs. Measured (issue 30, seeds 0-2 x 500
    #: jobs, quota = request, final plans / oracle's best): trainer 0.839 -> 0.857, roofline
    #: 0.809 -> 0.828, ps-contention 0.859 -> 0.865; with headroom within +-0.002.
    worker_memory_step_mb: int = 64


@dataclass(frozen=True, slots=True)
class DefaultQuota:
    """The quota assumed when a spec sets no ``resources.limits``: a modest share of a node
    pool, so that an unconstrained job cannot plan itself onto the whole cluster."""

    cpu: float = 32.0
    memory_mb: int = 128 * 1024


@dataclass(frozen=True, slots=True)
class ColdStartSettings:
    """A job with no similar history and no resources of its own starts small and safe;
    Stage 2 grows it. (DLRover's default: 2 workers + 1 PS.)"""

    workers: int = 2
    #: CPU per pod: this share of the quota, within the clamps below.
    cpu_quota_share: float = 1 / 8
    min_cpu: float = 1.0
    max_cpu: float = 8.0
    #: Memory: the model's footprint floor times this factor.
    memory_factor: float = 1.5


@dataclass(frozen=True, slots=True)
class WarmStartSettings:
    #: Only jobs started within this many days count (DLRover's brain: 7; weekly jobs need more).
    window_days: float = 30.0
    #: At most this many of the newest similar jobs are used.
    max_jobs: int = 20
    #: Without a scenario key, jobs whose dataset size differs by more than this factor are not
    #: similar even when the model shape matches.
    dataset_scale_tolerance: float = 4.0
    #: CPU per pod = peak observed use x (1 + margin): at least the peak, with headroom for bursts.
    cpu_margin: float = 0.25
    #: Worker memory = peak x (1 + margin). DLRover's brain: 1.5 x max for the first worker.
    worker_memory_margin: float = 0.5
    #: PS memory = peak x (1 + margin). DLRover: 1.2 x max.
    ps_memory_margin: float = 0.2
    #: Memory factor on top when a similar job ran out of memory.
    oom_memory_factor: float = 1.5
    #: Plan counts from a model fitted on the history when it spans this many configurations;
    #: with fewer, keep the counts the jobs ran with and right-size each pod.
    min_configs_for_model: int = 4


@dataclass(frozen=True, slots=True)
class AutoScaleSettings:
    #: Samples needed at the current configuration before deciding (DLRover: 5 step samples).
    min_samples: int = 5
    #: ... except to leave the plan a job started with (cold or warm start: the user's request,
    #: or history's guess, never measured here): n >= max(2, (z · cv / min_gain)²) samples, cv
    #: their measured relative spread, i.e. as soon as the mean's error is z standard errors
    #: below the gain a step must promise. At the simulator's 3 % noise that is 2 samples, not
    #: 5: a cold start no longer holds the user's request for min_samples samples (12 min at a
    #: 2-min sample, issue 30). The step it takes is judged on min_samples, as every step.
    #: (inf: every plan waits for min_samples, the start plan too)
    leave_start_z: float = 2.0
    #: Seconds between two plans (DLRover: 300 s since the last plan).
    min_interval_s: float = 300.0
    #: Seconds after an in-place step before the next plan, when shorter than min_interval_s:
    #: the pods went on, so the samples are steady at once (no start-up, no re-read to wait
    #: out) and min_samples of them at the new shape, not this, set the pace. It bounds how
    #: fast probes and their judgments follow each other.
    in_place_min_interval_s: float = 60.0
    #: The target (search.py): with "cost" (DLRover-RM's objective), the configuration with
    #: the most throughput per unit of cost (dominant share) among those predicted at least
    #: ``throughput_floor`` of the best the quota allows; with "fastest", the cheapest of them.
    #: Default cost at 0.95 (issue 30), chosen on one seed the docs' tables do not use (300
    #: jobs, seed 7, every family, both quota regimes) among 0.85, 0.9 and 0.95: 0.95 gave the
    #: best median JCT and plan throughput against the oracle's best in every family and
    #: regime (quota = request: JCT -51.7 / -40.2 / -43.3 % against manual, trainer /
    #: ps-contention / roofline, where 0.85 gave -50.0 / -33.7 / -40.1 %; plans 0.79-0.85 of
    #: the oracle's best against 0.72-0.79), the same CPU utilisation at quota = request and
    #: 4-6 points less where quotas leave headroom (+10.6-12.4 points against +16.1-17.2);
    #: then measured on seeds 0-2 (docs/results.md). Earlier 0.85, and 0.7 before that (the
    #: lowest floor whose median JCT stayed within 15 % of the fastest setting's: the frontier
    #: in docs/results.md); "fastest" at 0.97 is the throughput-first planner of earlier
    #: releases.
    objective: Objective = "cost"
    throughput_floor: float = 0.95
    #: A move must promise this much more throughput ...
    min_gain: float = 0.05
    #: ... or, when it only changes the workers' CPU (their memory kept or grown) on a backend
    #: that resizes pods in place (core/reconcile.py ``in_place``), this much: such a step
    #: restarts nothing and reads no data again, so it costs only the quota it adds, and need
    #: only promise more than the noise of a 5-sample mean (~1-2 %, see give_back_tolerance).
    #: Its growth is judged against half of it, as min_gain's is.
    in_place_min_gain: float = 0.02
    #: ... or save this share of the job's cost (dominant resource share) ...
    min_saving: float = 0.10
    #: ... while losing at most this share of throughput ("fastest"; with "cost" the target
    #: is already above the floor, and the step is judged against its own prediction).
    max_loss: float = 0.03
    #: Growth is planned within a trust region: a job's CPU after a step at most this many
    #: times the most it has been measured with. The model is fitted on what was measured;
    #: four times further out it is a guess, and a wrong guess costs a relaunch of every pod.
    max_job_cpu_growth: float = 2.0
    #: Bounds on one step, so that a wrong model costs one short detour, not a disaster.
    #: DLRover grows workers by at most 8 per step; 16 here (issue 30): where the quota is the
    #: user's request the job's CPU cannot grow, so a reshape to more, smaller workers (7 ->
    #: 24 on the simulator's oracle) is bounded only by this, and at 8 a cold start spent its
    #: steps, each a relaunch, getting there. Measured on seed 7, 300 jobs, floor 0.95, 8
    #: against 16: median JCT against manual better by 1.0-2.2 points in all six family x
    #: quota cases (quota = request: trainer -52.9 -> -54.5 %, ps-contention -40.1 -> -41.7,
    #: roofline -45.3 -> -46.9), final plans / oracle's best within +-0.015 (0.812 -> 0.811,
    #: 0.856 -> 0.867, 0.791 -> 0.788; with headroom 0.938 -> 0.950, 0.910 -> 0.908, 0.858 ->
    #: 0.872), OOM kills and self-inflicted ones unchanged (53 / 0 at quota = request).
    max_worker_step: int = 16
    max_ps_step: int = 2
    #: Per-pod CPU may at most grow by this factor in one step.
    max_cpu_growth: float = 2.0
    #: A role whose pods use less than this share of their CPU leaves CPU idle: if the model
    #: has never seen it with less, a give-back probe tries fewer cores and measures.
    busy_utilization: float = 0.8
    #: A probe cuts a role's CPU per pod to this share of what it has ...
    probe_factor: float = 0.5
    #: ... but never below its mean use x (1 + headroom); and every plan keeps the workers'
    #: cores at least their measured work per sample x the predicted throughput x (1 + this)
    #: (search.CpuBounds). Not only noise (~2-3 % for that ratio of two 5-sample means): a
    #: worker that waits for its PS part of each step uses less on average than it needs
    #: while it computes, and the mean hides that. Measured (issue 30, seed 7, 300 jobs, PS
    #: headroom 0.1): 0.05 instead of 0.25 raised ps-contention's median JCT from 49.0 to
    #: 53.3 min for no CPU utilisation gained (46.7 % / 46.5 %).
    idle_headroom: float = 0.25
    #: The PS' cores are kept at least their measured work per sample x the predicted
    #: throughput x (1 + this). A PS computes whenever a request waits, so its mean use is its
    #: need; the margin covers the noise of that measurement (~2-3 %) and the queueing a PS
    #: near saturation adds to every worker's step (~1/(1 − ρ)), which the fitted model does
    #: not express. Measured (issue 30, seed 7, 300 jobs): 0.10 against 0.25, trainer median
    #: JCT 44.4 / 46.1 min and CPU utilisation 55.9 / 54.1 %, ps-contention 49.0 / 48.7 min,
    #: 46.7 / 46.5 %; 0.05 cost ps-contention 4 min (52.9).
    ps_demand_headroom: float = 0.10
    #: Undo a memory-only step when throughput falls this much after it (DLRover's guard:
    #: no further scaling after a fall of 20%). Memory steps are judged by nothing finer:
    #: memory does not set the speed. A growth step is judged by ``min_gain / 2`` instead
    #: (it must gain), a rollback never (it returned to a measured configuration) ...
    rollback_drop: float = 0.2
    #: ... and a step that lowers the job's cost (a give-back, a probe) is undone when it
    #: measures more than this below what it promised: the lower of its prediction and the
    #: throughput before it. Above the noise of a 5-sample mean (~1-2%).
    give_back_tolerance: float = 0.05
    #: Memory right-sizing. Once measured, a worker gets its peak use x (1 + this): a worker's
    #: memory is flat per batch, so its peak after ``min_samples`` samples is its need. Measured
    #: on this package's trainer (benchmarks/worker_memory.py: synthetic and Parquet data, batch
    #: 128-2048, 1M rows): the run's peak is at most 4.5% above the peak of its first
    #: ``min_samples`` samples (median 0.6%); 0.15 is three times that. (0.3 before issue 30,
    #: unmeasured: at a quota equal to the user's request the margin held memory the workers
    #: never used, and fitted fewer of them: plans 0.816 -> 0.875 of the oracle's best, trainer,
    #: seed 7, 300 jobs.) ...
    worker_memory_headroom: float = 0.15
    #: ... and the PS the end-of-job need their measured growth projects (MemoryGrowthSettings)
    #: ... but only when that frees this share of the job's memory: a memory change relaunches
    #: pods, which is worth it for the 2-4x users ask for, not for a few percent.
    min_memory_saving: float = 0.2


@dataclass(frozen=True, slots=True)
class MemoryGrowthSettings:
    """How a running job's PS memory growth is measured and projected to the end of the job
    (core/planner/memory_growth.py). The PS hold the embedding rows touched so far, which grow
    with progress and saturate: a start-up reading says little about the end state."""

    #: The growth is fitted on the PS state of the last this many samples with progress ...
    window: int = 6
    #: ... and measured once at least this many span at least ``min_progress`` of the job (one
    #: start-up reading, or readings a few steps apart, give a slope noise dominates) ...
    min_samples: int = 3
    min_progress: float = 0.05
    #: ... the projected end-of-job state x (1 + this) is what the PS are planned: the reading
    #: noise and a curve not quite concave (the projection's assumption) ...
    margin: float = 0.2
    #: ... and growth has stopped (memory may be given back) once the growth still to come at
    #: the measured rate is at most this share of the state held now.
    stop_share: float = 0.2


@dataclass(frozen=True, slots=True)
class PostScaleSettings:
    #: Hot PS: CPU used / requested above this for ``hot_ps_samples`` samples in a row
    #: (DLRover's brain: 0.8 over 3 samples).
    hot_ps_utilization: float = 0.8
    hot_ps_samples: int = 3
    #: ... and using at least this many times the median CPU of the other PS: a hot shard
    #: (DLRover-RM: an unbalanced partition). PS that are all busy alike run at their demand,
    #: which Stage 2 sizes; 1.5 is far outside the noise between balanced PS (a few %) and
    #: well inside a hot shard's 2x (the simulator's hot_ps_imbalance 1.0). 0: no peer
    #: condition (every busy PS, a lone one too, is hot).
    hot_ps_peer_ratio: float = 1.5
    #: The hot PS moves to a pod with its CPU times the measured imbalance (its use over its
    #: peers'), at most this many times (DLRover's brain: 2).
    hot_ps_cpu_growth: float = 2.0
    #: Starved PS: throttled in at least ``starved_ps_throttled`` of a sample's CFS periods
    #: while its CPU use puts its quota below ``starved_ps_share`` of what it requested (each
    #: throttled period used the whole quota, so quota <= used / throttled share), for
    #: ``starved_ps_samples`` samples in a row -> it moves to a new pod of the size it asked
    #: for (its quota was cut, or its node cannot give it its request).
    starved_ps_throttled: float = 0.2
    starved_ps_share: float = 0.5
    starved_ps_samples: int = 3
    #: Slow worker: its throughput below this share of its peers' median ...
    straggler_ratio: float = 0.5
    #: ... for this many samples in a row: its shards flow to the others ...
    straggler_samples: int = 3
    #: ... and after this many it is replaced by a new pod.
    straggler_replace_samples: int = 6
    #: Hung worker: it has held a data shard without reporting it for this many times the
    #: time a worker takes for one shard at the job's median speed, and at least
    #: ``hung_lease_min_s``: it is replaced (a frozen process, a dead NIC). The comparison with
    #: its peers above cannot see it once they have drained every other shard and wait too.
    hung_lease_factor: float = 10.0
    hung_lease_min_s: float = 60.0
    #: OOM prevention: extrapolate each pod's memory over the last ``oom_trend_samples`` samples
    #: to ``oom_horizon_s`` ahead (one planning interval); relaunch it bigger when that reaches
    #: ``oom_threshold`` of its limit.
    oom_trend_samples: int = 4
    oom_horizon_s: float = 300.0
    oom_threshold: float = 0.95
    #: New memory after a predicted OOM: the predicted need x this factor.
    oom_prevention_headroom: float = 1.25
    #: After a real OOM: memory x this factor (DLRover: x2) ...
    oom_memory_factor: float = 2.0
    #: ... growing by at most this much per relaunch (DLRover: +8 GiB).
    oom_max_step_mb: int = 8 * 1024
    #: A PS OOM with balanced PS memory (spread below this share) adds PS instead of memory:
    #: the rows re-partition, so each PS holds fewer.
    ps_memory_balance: float = 0.2
    #: Pending longer than this (seconds) -> relaunch with CPU and memory scaled by the factor
    #: (DLRover: 900 s, halved).
    pending_timeout_s: float = 900.0
    pending_shrink: float = 0.5


@dataclass(frozen=True, slots=True)
class RelaunchSettings:
    """When a pod that stopped is relaunched, and when the job gives up instead.

    A pod that fails on its own (non-zero exit, OOM kill, could not start) ``max_failures``
    times within ``failure_window_s`` fails the job: the cause is then the pod or its
    input, not bad luck, and relaunching it forever would hide that. Pods stopped by someone
    else (evicted, preempted, deleted, their node lost) are relaunched as they were and not
    counted. Kubernetes' own Job controller backs off after 6 failures; a training job that
    loses a pod three times in ten minutes is better told so early.
    """

    max_failures: int = 3
    failure_window_s: float = 600.0

    def __post_init__(self) -> None:
        if self.max_failures < 1:
            raise ValueError(f"max_failures: must be >= 1, got {self.max_failures}")
        if not self.failure_window_s > 0:
            raise ValueError(f"failure_window_s: must be > 0, got {self.failure_window_s}")


@dataclass(frozen=True, slots=True)
class SteadySettings:
    """The running job's guard against steps it inflicts on itself (core/planner/steadiness.py):
    no step too late to repay its measured price, no shape re-entered soon after it was left
    unless the measurements contradict the move that left it."""

    #: A left shape is held for h = max(auto_scale.min_interval_s, 2·c / this), c the measured
    #: price of one step: a flip-flop A -> B -> A is two steps and, held, recurs at most once
    #: per h, so it costs the job at most this share of its time. 10%: the loss a planner
    #: may inflict on a job by changing its mind is of the order of the objective's own
    #: tolerances (max_loss 3%, give_back_tolerance 5%), not of its gains (min_gain 5% per
    #: step). A step that costs a cluster's ~3-min relaunch holds a shape for an hour, one
    #: that costs 2 s (a live PS move on one machine) for 40 s.
    flip_flop_share: float = 0.1

    def __post_init__(self) -> None:
        if not 0 < self.flip_flop_share <= 1:
            raise ValueError(f"flip_flop_share: must be in (0, 1], got {self.flip_flop_share}")


@dataclass(frozen=True, slots=True)
class PlannerSettings:
    node: NodeLimits = field(default_factory=NodeLimits)
    default_quota: DefaultQuota = field(default_factory=DefaultQuota)
    cold_start: ColdStartSettings = field(default_factory=ColdStartSettings)
    warm_start: WarmStartSettings = field(default_factory=WarmStartSettings)
    auto_scale: AutoScaleSettings = field(default_factory=AutoScaleSettings)
    post_scale: PostScaleSettings = field(default_factory=PostScaleSettings)
    memory_growth: MemoryGrowthSettings = field(default_factory=MemoryGrowthSettings)
    relaunch: RelaunchSettings = field(default_factory=RelaunchSettings)
    steady: SteadySettings = field(default_factory=SteadySettings)
    #: The most one job may hold on its backend at all, whatever its quota says: on the local
    #: backend the machine's cores and memory (pods beyond them only take turns on the same
    #: cores, or swap). None on a cluster, where the quota is the cap.
    capacity: DefaultQuota | None = None
    #: Two configurations already tell a slope along the one dimension they differ in (the
    #: fit pins the rest to the prior), which a running job needs after its first step.
    model_fit: FitSettings = field(default_factory=lambda: FitSettings(min_configs_for_full_fit=2))

    def with_objective(
        self, objective: Objective | None = None, floor: float | None = None
    ) -> PlannerSettings:
        """These settings with the planning objective and its throughput floor replaced
        (None keeps the current one)."""
        auto = self.auto_scale
        return replace(
            self,
            auto_scale=replace(
                auto,
                objective=auto.objective if objective is None else objective,
                throughput_floor=auto.throughput_floor if floor is None else floor,
            ),
        )
