"""Open-source DLRover (release 0.6.1) as a baseline policy for the cluster simulator.

Two components of DLRover decide resources: the **job master's local optimizer** (Python, one job,
no history) and the **cluster brain** (Go, a service with the history of finished jobs). This
policy models both with the thresholds of docs/baselines.md. Where they overlap, one decides:

=====================================  =====================================================
decision                               who decides
=====================================  =====================================================
initial PS                             brain: warm start from history; without history the
                                       brain's cold default, 4 PS x 12 CPU x 16 GiB
initial worker                         brain with history (CPU ``max(ceil(max used), 12)``,
                                       memory ``max(1.5 x max used, 16 GiB)``); without, the
                                       master's create rule (``min(ceil(quota_cpu/5), 16)``
                                       cores, ``min(quota_mem/5, 8 GiB)``); one worker
PS initial adjustment                  master, once, only for a job without history (a warm
                                       start already sized the PS from history)
worker scaling, hot PS, PS OOM         brain for a job warm-started from history, the master
                                       otherwise (the brain has nothing to learn from yet)
worker OOM                             master (the brain has no worker OOM rule)
timing (start, stability, intervals)   master, for every plan: it is the master that executes
clamps per node and counts             master, for every plan
=====================================  =====================================================

A job is "brain-managed" when its plan carries ``similar_jobs`` (set by the warm start and
carried through every later plan of this policy).

**Intended behaviour, not the code's accidents.** In the open-source code the brain's similarity
key is never set (every job of the last 7 days counts as similar) and the master's stage names do
not match the brain's (the brain answers running jobs with empty plans). We model what was
intended: history is the finished jobs of the **same scenario** (``spec.scenario``; without one,
the same model signature) that were submitted within the last 7 days of simulated time, and the
brain's running-job rules do apply. Also intended rather than literal: the "major cluster" grows
to more than half of the values even when one side runs out first; the master's PS initial sizes
PS memory for the rows each PS will hold, ``1.2 x max(max used, max total used / count)`` as the
brain's warm start does (the code takes ``1.2 x max used``, which under-sizes PS when the count
falls).

**Master (local optimizer) rules**, on the last 5 samples with the current PS set and counts:

* PS initial (the master's first plan): ``a = mean total PS CPU used / w``,
  ``b = mean worker CPU used``, ``max_w = quota_cpu / (a + b)``; PS count
  ``ceil((quota_cpu - max_w·b) / per-PS CPU)``; PS memory
  ``1.2 x max(max used, max total used / count)``.
* Workers: ``u = max over PS of used/requested``; stop if ``u > 0.95`` or if the last scale-up's
  marginal speed per added worker fell below ``0.2 x`` the old per-worker speed; else
  ``w' = int(w x 0.9/u)`` when the factor is > 1, capped by the quota left after the PS; worker
  CPU = mean used, memory = 1.5 x max used.
* Hot PS (a PS at ``≥ 0.9`` of its CPU): every PS gets ``avg used x factor`` cores, factor =
  ``max(1, int(quota_cpu / (a + b)) / w)``, at most ``32 / avg`` of the hot PS (≤ 32 cores).
* OOM: memory x 2, at most +8 GiB per relaunch, at most 64 GiB.
* Timing: auto-scaling starts after 5 samples or 90 s; a plan only when the worker count has
  been stable ≥ 60 s and ≥ 300 s have passed since the last plan; PS changes at most once an
  hour. Clamps: CPU 4-32 cores and memory 6-64 GiB per pod, ≤ 60 workers, ≤ 15 PS.

**Brain rules**, on the samples with the current PS set and counts, PS-spike samples dropped
(a sample whose highest PS utilisation exceeds 1.5 x the window's median of that highest):

* Warm start (history): per-PS CPU = max over jobs and PS of the PS's mean CPU used + 4; total
  PS CPU = 1.5 x major-cluster mean over jobs of each job's major-cluster mean of its per-sample
  total PS CPU; PS count = ``ceil(total / per-PS)`` ≤ 15; PS memory = 1.2 x max(max PS memory,
  max total PS memory / count); worker as in the table.
* Workers: a PS exhausted (mean > 0.99 over 3 samples) -> one worker fewer; else if
  ``u < 0.85`` (mean of 5) and the throughput did not fall ≥ 20 % after the last worker change
  (5 samples before vs after): ``w' = ceil(0.8/u x w)``, at most +8 per step, but on the first
  step up to 10 workers for a job estimated to take ≤ 1800 s, else up to 32; cap 60. Worker
  memory = max used x 1.6, at most +8 GiB per step.
* Hot PS: a PS whose 3-sample mean CPU used/requested is > 0.8 -> every PS gets
  ``ceil(avg used x 32 / w)`` cores (≤ 32); a PS above 0.9 of its memory for 3 samples ->
  +8 GiB per PS. DLRover applies this by migration (training continues).
* PS OOM: PS memory unbalanced (``(max - mean) / max > 0.2``) -> double the memory, else double
  the PS count.

Everything is clamped to the job's quota: a rule that would exceed it is scaled down (fewer
workers first, then fewer PS, then smaller pods; after an OOM, fewer workers, then a smaller
growth). Failure reactions (:meth:`DlroverOssPolicy.after_failure`) are immediate: the timing
rules gate only :meth:`DlroverOssPolicy.decide`, and an OOM plan does not restart their clocks.
Hot-PS plans have stage ``post_scale`` (instability: docs/planner.md, Stage 3), scaling plans
``auto_scale``. The pending-pod rule (relaunch halved after 900 s) is not modelled: a
:class:`~dlrover_kfp.sim.cluster.api.JobView` carries no pending state.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from dlrover_kfp.core.plan import NodeGroup, ResourcePlan, Stage
from dlrover_kfp.core.planner.quota_rule import job_quota
from dlrover_kfp.core.planner.settings import PlannerSettings
from dlrover_kfp.core.profile import JobProfile, NodeSample, RuntimeSample
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.sim.cluster.api import JobView, Role

GIB = 1024
#: the planner's default settings: the quota rule every policy of the simulator shares
_PLANNER = PlannerSettings()


@dataclass(frozen=True, slots=True)
class DlroverOssSettings:
    """Every threshold of the open-source DLRover heuristics (docs/baselines.md)."""

    # -- master: timing
    loop_interval_s: float = 30.0
    start_samples: int = 5
    start_after_s: float = 90.0
    stable_workers_s: float = 60.0
    min_plan_interval_s: float = 300.0
    min_ps_change_interval_s: float = 3600.0
    # -- master: clamps
    node_min_cpu: float = 4.0
    node_max_cpu: float = 32.0
    node_min_memory_mb: int = 6 * GIB
    node_max_memory_mb: int = 64 * GIB
    max_workers: int = 60
    max_ps: int = 15
    # -- master: create (no history), PS initial, workers, hot PS, OOM
    create_workers: int = 1
    create_cpu_share: float = 1 / 5
    create_max_cpu: float = 16.0
    create_memory_share: float = 1 / 5
    create_max_memory_mb: int = 8 * GIB
    master_window: int = 5
    ps_memory_margin: float = 0.2
    master_stop_util: float = 0.95
    master_target_util: float = 0.9
    min_worker_speed_ratio: float = 0.2
    master_worker_memory_margin: float = 0.5
    master_hot_ps_util: float = 0.9
    oom_factor: float = 2.0
    oom_max_step_mb: int = 8 * GIB
    # -- brain: history and warm start
    history_window_s: float = 7 * 86400.0
    ps_cpu_margin: float = 4.0
    ps_total_cpu_factor: float = 1.5
    worker_min_cpu: float = 12.0
    worker_memory_factor: float = 1.5
    worker_min_memory_mb: int = 16 * GIB
    cold_ps: int = 4
    cold_ps_cpu: float = 12.0
    cold_ps_memory_mb: int = 16 * GIB
    # -- brain: running job
    brain_window: int = 3
    spike_factor: float = 1.5
    exhausted_util: float = 0.99
    grow_below_util: float = 0.85
    brain_target_util: float = 0.8
    speed_window: int = 5
    speed_drop: float = 0.2
    max_worker_step: int = 8
    short_job_s: float = 1800.0
    initial_workers_short: int = 10
    initial_workers_long: int = 32
    brain_worker_memory_factor: float = 1.6
    worker_memory_max_step_mb: int = 8 * GIB
    brain_hot_ps_util: float = 0.8
    hot_ps_target_workers: int = 32
    hot_ps_memory_util: float = 0.9
    hot_ps_memory_step_mb: int = 8 * GIB
    ps_memory_unbalance: float = 0.2


# ---------------------------------------------------------------------------------------------
# Bounds: the job's quota and counts, with the master's clamps


@dataclass(frozen=True, slots=True)
class Bounds:
    quota_cpu: float
    quota_memory_mb: int
    min_workers: int
    max_workers: int
    min_ps: int
    max_ps: int

    def fits(self, workers: NodeGroup, ps: NodeGroup) -> bool:
        return (
            workers.total_cpu + ps.total_cpu <= self.quota_cpu + 1e-9
            and workers.total_memory_mb + ps.total_memory_mb <= self.quota_memory_mb
        )


def job_bounds(spec: JobSpec, settings: DlroverOssSettings) -> Bounds:
    """The quota is the planner's (:func:`~dlrover_kfp.core.planner.quota_rule.job_quota`:
    ``spec.resources.limits``, else the default quota, which a larger request is cut to as the
    planner cuts it): DLRover reads ``quota_cpu`` but defines no rule for it, and every policy
    of the simulator is given the same room. Counts: ``spec.elastic`` within the master's caps
    (≤ 60 workers, ≤ 15 PS)."""
    quota = job_quota(spec, _PLANNER)
    el = spec.elastic
    max_w = max(el.min_workers, min(el.max_workers, settings.max_workers))
    max_p = max(el.min_ps, min(el.max_ps, settings.max_ps))
    return Bounds(quota.cpu, quota.memory_mb, el.min_workers, max_w, el.min_ps, max_p)


def _clamp_cpu(cpu: float, s: DlroverOssSettings) -> float:
    return min(s.node_max_cpu, max(s.node_min_cpu, math.ceil(cpu * 2 - 1e-9) / 2))


def _clamp_memory(memory_mb: float, s: DlroverOssSettings) -> int:
    return min(s.node_max_memory_mb, max(s.node_min_memory_mb, math.ceil(memory_mb - 1e-9)))


def _group(count: int, cpu: float, memory_mb: float, s: DlroverOssSettings) -> NodeGroup:
    return NodeGroup(count=count, cpu=_clamp_cpu(cpu, s), memory_mb=_clamp_memory(memory_mb, s))


def _resized(g: NodeGroup, count: int | None = None, cpu: float | None = None) -> NodeGroup:
    return NodeGroup(
        count=g.count if count is None else count,
        cpu=g.cpu if cpu is None else cpu,
        memory_mb=g.memory_mb,
    )


def fit_to_quota(workers: NodeGroup, ps: NodeGroup, b: Bounds) -> tuple[NodeGroup, NodeGroup]:
    """Counts into the elastic range, then into the quota: fewer workers first (the elastic
    role), then fewer PS, then every pod scaled down by the same factor (the quota beats the
    per-node clamps)."""
    w = _resized(workers, count=min(b.max_workers, max(b.min_workers, workers.count)))
    p = _resized(ps, count=min(b.max_ps, max(b.min_ps, ps.count)))
    while not b.fits(w, p) and w.count > b.min_workers:
        w = _resized(w, count=w.count - 1)
    while not b.fits(w, p) and p.count > b.min_ps:
        p = _resized(p, count=p.count - 1)
    if b.fits(w, p):
        return w, p
    f_cpu = min(1.0, b.quota_cpu / (w.total_cpu + p.total_cpu))
    f_mem = min(1.0, b.quota_memory_mb / (w.total_memory_mb + p.total_memory_mb))

    def shrink(g: NodeGroup) -> NodeGroup:
        return NodeGroup(
            count=g.count,
            cpu=math.floor(g.cpu * f_cpu * 100) / 100,
            memory_mb=math.floor(g.memory_mb * f_mem),
        )

    return shrink(w), shrink(p)


# ---------------------------------------------------------------------------------------------
# Reading samples


def major_cluster(values: Sequence[float]) -> list[float]:
    """The brain's robust subset: start at the median of the sorted values and add the nearer
    neighbour (to the cluster's middle value) until the cluster holds more than half of them."""
    xs = sorted(values)
    if not xs:
        return []
    mid = len(xs) // 2
    lo, hi = mid, mid  # the cluster is xs[lo : hi + 1]
    need = len(xs) // 2 + 1
    while hi - lo + 1 < need:
        kernel = xs[(lo + hi + 1) // 2]
        if lo == 0:
            hi += 1
        elif hi == len(xs) - 1 or kernel - xs[lo - 1] < xs[hi + 1] - kernel:
            lo -= 1
        else:
            hi += 1
    return xs[lo : hi + 1]


def major_mean(values: Sequence[float]) -> float:
    cluster = major_cluster(values)
    return sum(cluster) / len(cluster) if cluster else 0.0


@dataclass(frozen=True, slots=True)
class _Split:
    """One sample's nodes by role, and its workers' largest memory, read once."""

    sample: RuntimeSample
    workers: tuple[NodeSample, ...]
    ps: tuple[NodeSample, ...]
    max_worker_memory_mb: float
    #: the highest CPU utilisation of its PS (0 without PS data)
    top_ps_util: float


#: Splits by the sample's identity. The rules read every sample of the current window at every
#: decision (30 s apart, a window of hundreds of samples of up to 60 workers): without it a
#: warm-started (brain-managed) job's decisions cost O(window x nodes) each and a 1,000-job
#: simulation twice as long. An entry keeps its sample alive, so an id is never reused while
#: cached; the cache is emptied when it reaches ``_SPLITS_MAX``.
_SPLITS: dict[int, _Split] = {}
_SPLITS_MAX = 20_000


def _split(s: RuntimeSample) -> _Split:
    hit = _SPLITS.get(id(s))
    if hit is not None and hit.sample is s:
        return hit
    if len(_SPLITS) >= _SPLITS_MAX:
        _SPLITS.clear()
    workers = tuple(n for n in s.nodes if n.role == "worker")
    ps = tuple(n for n in s.nodes if n.role == "ps")
    peak = max((n.memory_used_mb for n in workers), default=0.0)
    split = _Split(s, workers, ps, peak, max((_util(n) for n in ps), default=0.0))
    _SPLITS[id(s)] = split
    return split


def _nodes(s: RuntimeSample, role: Role) -> tuple[NodeSample, ...]:
    split = _split(s)
    return split.workers if role == "worker" else split.ps


def _util(n: NodeSample) -> float:
    return n.cpu_used / n.cpu_requested if n.cpu_requested > 0 else 0.0


def _mem_util(n: NodeSample) -> float:
    return n.memory_used_mb / n.memory_requested_mb if n.memory_requested_mb > 0 else 0.0


def _taken_with(s: RuntimeSample, plan: ResourcePlan) -> bool:
    return (
        s.workers == plan.workers.count
        and s.ps == plan.ps.count
        and math.isclose(s.worker_cpu, plan.workers.cpu)
        and math.isclose(s.ps_cpu, plan.ps.cpu)
    )


def current_window(samples: Sequence[RuntimeSample], plan: ResourcePlan) -> list[RuntimeSample]:
    """The trailing samples taken with the plan's counts and per-pod CPU, with PS node data."""
    out: list[RuntimeSample] = []
    for s in reversed(samples):
        if not _taken_with(s, plan):
            break
        if _nodes(s, "ps"):
            out.append(s)
    out.reverse()
    return out


@dataclass(slots=True)
class _Window:
    """:func:`current_window` of a job's growing samples, kept up to date from the samples
    added since the last decision (the same samples: those after the last one not taken with
    the plan, with PS data), so that a decision does not read the whole window again."""

    plan: ResourcePlan | None = None
    seen: int = 0
    last: RuntimeSample | None = None
    samples: list[RuntimeSample] = field(default_factory=list)

    def update(self, samples: Sequence[RuntimeSample], plan: ResourcePlan) -> list[RuntimeSample]:
        same_run = self.seen <= len(samples) and (
            self.seen == 0 or samples[self.seen - 1] is self.last
        )
        if plan != self.plan or not same_run:
            self.plan, self.seen, self.samples = plan, 0, []
        for s in samples[self.seen :]:
            if not _taken_with(s, plan):
                self.samples = []
            elif _nodes(s, "ps"):
                self.samples.append(s)
        self.seen = len(samples)
        self.last = samples[-1] if samples else None
        return list(self.samples)


def _per_ps(window: Sequence[RuntimeSample], value: str) -> dict[str, list[float]]:
    """Per PS (by name): its ``cpu`` used, CPU ``util``isation or ``mem`` utilisation, in order."""
    out: dict[str, list[float]] = {}
    for s in window:
        for n in _nodes(s, "ps"):
            v = n.cpu_used if value == "cpu" else _util(n) if value == "util" else _mem_util(n)
            out.setdefault(n.name, []).append(v)
    return out


def _means(series: dict[str, list[float]]) -> dict[str, float]:
    return {k: sum(v) / len(v) for k, v in series.items() if v}


def drop_ps_spikes(window: Sequence[RuntimeSample], factor: float) -> list[RuntimeSample]:
    """Drop samples whose highest PS utilisation exceeds ``factor`` x the window's median of it."""
    peaks = [_split(s).top_ps_util for s in window]
    if not peaks:
        return []
    median = statistics.median(peaks)
    if median <= 0:
        return list(window)
    return [s for s, peak in zip(window, peaks, strict=True) if peak <= factor * median]


def _runs(samples: Sequence[RuntimeSample]) -> list[list[RuntimeSample]]:
    """Consecutive samples with the same worker count."""
    runs: list[list[RuntimeSample]] = []
    for s in samples:
        if runs and runs[-1][-1].workers == s.workers:
            runs[-1].append(s)
        else:
            runs.append([s])
    return runs


def _mean_speed(run: Sequence[RuntimeSample]) -> float:
    return sum(s.throughput for s in run) / len(run)


def worker_speed_ratio(samples: Sequence[RuntimeSample]) -> float | None:
    """The master's check of the last scale-up: marginal speed per added worker over the old
    per-worker speed. None if the last worker change was not a scale-up (or there was none)."""
    runs = _runs(samples)
    if len(runs) < 2:
        return None
    pre, post = runs[-2], runs[-1]
    w0, w1 = pre[0].workers, post[0].workers
    x0, x1 = _mean_speed(pre), _mean_speed(post)
    if w1 <= w0 or w0 == 0 or x0 <= 0:
        return None
    return ((x1 - x0) / (w1 - w0)) / (x0 / w0)


def speed_fell(samples: Sequence[RuntimeSample], window: int, drop: float) -> bool:
    """The brain's check: mean throughput of up to ``window`` samples after the last worker
    change is at least ``drop`` below that of the ``window`` samples before it."""
    runs = _runs(samples)
    if len(runs) < 2:
        return False
    before = _mean_speed(runs[-2][-window:])
    after = _mean_speed(runs[-1][-window:])
    return before > 0 and after <= (1 - drop) * before


# ---------------------------------------------------------------------------------------------
# History (the brain's store)


@dataclass(frozen=True, slots=True)
class HistoryJob:
    """What the brain keeps of one finished job: its observed usage."""

    run_id: str
    key: str
    created_at: float
    #: max over its PS of the PS's mean CPU used (cores)
    max_ps_mean_cpu: float
    #: major-cluster mean of its per-sample total PS CPU used (cores)
    total_ps_cpu: float
    max_ps_memory_mb: float
    max_total_ps_memory_mb: float
    max_worker_cpu: float
    max_worker_memory_mb: float


def similarity_key(scenario: str | None, model_signature: str) -> str:
    return f"scenario:{scenario}" if scenario else f"model:{model_signature}"


def summarize(profile: JobProfile, created_at: float) -> HistoryJob | None:
    """The brain's summary of a finished job; None if it has no PS samples."""
    ps_cpu: dict[str, list[float]] = {}
    totals: list[float] = []
    max_ps_mem = max_total_mem = max_w_cpu = max_w_mem = 0.0
    for s in profile.samples:
        ps = _nodes(s, "ps")
        if not ps:
            continue
        totals.append(sum(n.cpu_used for n in ps))
        for n in ps:
            ps_cpu.setdefault(n.name, []).append(n.cpu_used)
            max_ps_mem = max(max_ps_mem, n.memory_used_mb)
        max_total_mem = max(max_total_mem, sum(n.memory_used_mb for n in ps))
        for n in _nodes(s, "worker"):
            max_w_cpu = max(max_w_cpu, n.cpu_used)
            max_w_mem = max(max_w_mem, n.memory_used_mb)
    if not totals:
        return None
    job = profile.job
    return HistoryJob(
        run_id=profile.run_id,
        key=similarity_key(job.scenario, job.model.signature()),
        created_at=created_at,
        max_ps_mean_cpu=max(_means(ps_cpu).values()),
        total_ps_cpu=major_mean(totals),
        max_ps_memory_mb=max_ps_mem,
        max_total_ps_memory_mb=max_total_mem,
        max_worker_cpu=max_w_cpu,
        max_worker_memory_mb=max_w_mem,
    )


# ---------------------------------------------------------------------------------------------
# The policy


@dataclass(slots=True)
class _JobState:
    submitted_at: float
    last_plan_at: float | None = None
    last_ps_change_at: float | None = None
    ps_initial_done: bool = False
    initial_phase: bool = True
    window: _Window = field(default_factory=_Window)


class DlroverOssPolicy:
    """The open-source DLRover heuristics (see the module docstring for every rule).

    Elastic: a failed pod is relaunched alone; hot-PS plans are applied by migration (a new PS
    starts while training continues). One instance serves every job of a simulation and keeps
    the brain's history from :meth:`finished`.
    """

    def __init__(self, settings: DlroverOssSettings | None = None) -> None:
        self.settings = settings or DlroverOssSettings()
        self._history: list[HistoryJob] = []
        self._jobs: dict[str, _JobState] = {}
        #: the simulated clock, in trace seconds (the protocol's one time base, like the
        #: history's ``created_at``): the latest ``now`` seen
        self._clock = 0.0

    @property
    def name(self) -> str:
        return "dlrover-oss"

    @property
    def elastic(self) -> bool:
        return True

    @property
    def decision_interval_s(self) -> float:
        return self.settings.loop_interval_s

    # -- the protocol ------------------------------------------------------------------------

    def initial(self, spec: JobSpec, now: float) -> ResourcePlan:
        s = self.settings
        self._clock = max(self._clock, now)
        bounds = job_bounds(spec, s)
        history = self.similar(spec, now)
        count = min(bounds.max_workers, max(bounds.min_workers, s.create_workers))
        if history:
            workers, ps = self._warm_start(history, count, bounds)
            stage, reason = Stage.WARM_START, f"dlrover-oss brain: {len(history)} similar jobs"
        else:
            ps = _group(s.cold_ps, s.cold_ps_cpu, s.cold_ps_memory_mb, s)
            cpu = min(math.ceil(bounds.quota_cpu * s.create_cpu_share), s.create_max_cpu)
            mem = min(bounds.quota_memory_mb * s.create_memory_share, s.create_max_memory_mb)
            workers = _group(count, cpu, mem, s)
            stage, reason = Stage.COLD_START, "dlrover-oss: no history, brain's cold PS default"
        workers, ps = fit_to_quota(workers, ps, bounds)
        return ResourcePlan(
            workers=workers,
            ps=ps,
            stage=stage,
            reason=reason,
            similar_jobs=tuple(h.run_id for h in history),
        )

    def decide(self, job: JobView) -> ResourcePlan | None:
        s = self.settings
        self._clock = max(self._clock, job.now)
        state = self._state(job)
        samples = job.samples
        if not samples or (len(samples) < s.start_samples and job.elapsed < s.start_after_s):
            return None
        if state.last_plan_at is not None and job.now - state.last_plan_at < s.min_plan_interval_s:
            return None
        if not self._workers_stable(job):
            return None
        window = state.window.update(samples, job.plan)
        if not window:
            return None
        ps_change_ok = (
            state.last_ps_change_at is None
            or job.now - state.last_ps_change_at >= s.min_ps_change_interval_s
        )
        bounds = job_bounds(job.spec, s)
        if job.plan.similar_jobs:
            proposal = self._brain_decide(job, state, window, bounds, ps_change_ok)
        else:
            recent = window[-s.master_window :]
            proposal = self._master_decide(job, state, recent, bounds, ps_change_ok)
        if proposal is None:
            return None
        wanted, wanted_ps, stage, reason = proposal
        workers, ps = fit_to_quota(wanted, wanted_ps, bounds)
        if (workers.count, ps.count) != (wanted.count, wanted_ps.count):
            reason += f"; quota allows {workers.count} workers, {ps.count} PS"
        if workers == job.plan.workers and ps == job.plan.ps:
            return None
        if ps != job.plan.ps and not ps_change_ok:
            return None
        if ps != job.plan.ps:
            state.last_ps_change_at = job.now
        if workers.count > job.plan.workers.count:
            state.initial_phase = False
        state.last_plan_at = job.now
        return self._plan(job.plan, workers, ps, stage, reason)

    def after_failure(self, job: JobView, role: Role, reason: str) -> ResourcePlan | None:
        if reason != "OOMKilled":
            return None  # the runtime relaunches the pod as it was
        s = self.settings
        self._clock = max(self._clock, job.now)
        bounds = job_bounds(job.spec, s)
        workers, ps = job.plan.workers, job.plan.ps
        if role == "worker":
            mem = self._master_oom(workers.memory_mb)
            why = f"worker OOMKilled: memory {workers.memory_mb} -> {mem} MiB (x2, <= +8 GiB)"
            workers = NodeGroup(count=workers.count, cpu=workers.cpu, memory_mb=mem)
        elif job.plan.similar_jobs and not self._ps_memory_unbalanced(job.samples):
            count = min(bounds.max_ps, 2 * ps.count)
            if count > ps.count:
                why = f"PS OOMKilled, memory balanced: PS {ps.count} -> {count}"
                ps = NodeGroup(count=count, cpu=ps.cpu, memory_mb=ps.memory_mb)
            else:
                mem = min(s.node_max_memory_mb, 2 * ps.memory_mb)
                why = f"PS OOMKilled at the PS cap: memory {ps.memory_mb} -> {mem} MiB"
                ps = NodeGroup(count=ps.count, cpu=ps.cpu, memory_mb=mem)
        elif job.plan.similar_jobs:
            mem = min(s.node_max_memory_mb, 2 * ps.memory_mb)
            why = f"PS OOMKilled, memory unbalanced: memory {ps.memory_mb} -> {mem} MiB"
            ps = NodeGroup(count=ps.count, cpu=ps.cpu, memory_mb=mem)
        else:
            mem = self._master_oom(ps.memory_mb)
            why = f"PS OOMKilled: memory {ps.memory_mb} -> {mem} MiB (x2, <= +8 GiB)"
            ps = NodeGroup(count=ps.count, cpu=ps.cpu, memory_mb=mem)
        wanted, wanted_ps = workers, ps
        workers, ps = self._fit_failure(workers, ps, job.plan, role, bounds)
        if workers == job.plan.workers and ps == job.plan.ps:
            return None
        if (workers, ps) != (wanted, wanted_ps):
            why += (
                f"; quota allows {workers.count} workers x {workers.memory_mb} MiB,"
                f" {ps.count} PS x {ps.memory_mb} MiB"
            )
        return self._plan(job.plan, workers, ps, Stage.POST_SCALE, why)

    def finished(self, profile: JobProfile) -> None:
        state = self._jobs.pop(profile.run_id, None)
        created = (
            state.submitted_at if state is not None else self._clock - profile.outcome.jct_seconds
        )
        entry = summarize(profile, created)
        if entry is not None:
            self._history.append(entry)
        horizon = self._clock - self.settings.history_window_s
        self._history = [h for h in self._history if h.created_at >= horizon]

    # -- history -----------------------------------------------------------------------------

    def similar(self, spec: JobSpec, now: float) -> list[HistoryJob]:
        """Finished jobs of the same scenario (or model) created in the window before ``now``."""
        key = similarity_key(spec.scenario, spec.model.signature())
        horizon = now - self.settings.history_window_s
        return [h for h in self._history if h.key == key and horizon <= h.created_at <= now]

    def _warm_start(
        self, history: Sequence[HistoryJob], workers: int, bounds: Bounds
    ) -> tuple[NodeGroup, NodeGroup]:
        s = self.settings
        per_ps = max(h.max_ps_mean_cpu for h in history) + s.ps_cpu_margin
        total = s.ps_total_cpu_factor * major_mean([h.total_ps_cpu for h in history])
        count = min(bounds.max_ps, max(bounds.min_ps, math.ceil(total / per_ps - 1e-9)))
        max_mem = max(h.max_ps_memory_mb for h in history)
        max_total = max(h.max_total_ps_memory_mb for h in history)
        ps_mem = (1 + s.ps_memory_margin) * max(max_mem, max_total / count)
        w_cpu = max(math.ceil(max(h.max_worker_cpu for h in history) - 1e-9), s.worker_min_cpu)
        w_mem = max(
            s.worker_memory_factor * max(h.max_worker_memory_mb for h in history),
            s.worker_min_memory_mb,
        )
        return _group(workers, w_cpu, w_mem, s), _group(count, per_ps, ps_mem, s)

    # -- master --------------------------------------------------------------------------------

    def _master_decide(
        self,
        job: JobView,
        state: _JobState,
        window: Sequence[RuntimeSample],
        bounds: Bounds,
        ps_change_ok: bool,
    ) -> tuple[NodeGroup, NodeGroup, Stage, str] | None:
        if not state.ps_initial_done and ps_change_ok:
            state.ps_initial_done = True
            ps = self._master_ps_initial(job.plan, window, bounds)
            if ps is not None and ps != job.plan.ps:
                return job.plan.workers, ps, Stage.AUTO_SCALE, "dlrover-oss master: PS initial"
        if ps_change_ok:
            hot = self._master_hot_ps(job.plan, window, bounds)
            if hot is not None:
                return job.plan.workers, hot, Stage.POST_SCALE, "dlrover-oss master: hot PS"
        return self._master_workers(job, window, bounds)

    @staticmethod
    def _demand(window: Sequence[RuntimeSample]) -> tuple[float, float]:
        """(mean total PS CPU used per worker, mean CPU used per worker) over ``window``."""
        per_worker = [
            sum(n.cpu_used for n in _nodes(s, "ps")) / s.workers for s in window if s.workers
        ]
        worker_cpu = [n.cpu_used for s in window for n in _nodes(s, "worker")]
        a = sum(per_worker) / len(per_worker) if per_worker else 0.0
        b = sum(worker_cpu) / len(worker_cpu) if worker_cpu else 0.0
        return a, b

    def _master_ps_initial(
        self, plan: ResourcePlan, window: Sequence[RuntimeSample], bounds: Bounds
    ) -> NodeGroup | None:
        s = self.settings
        a, b = self._demand(window)
        if a + b <= 0:
            return None
        max_w = bounds.quota_cpu / (a + b)
        total_ps = bounds.quota_cpu - max_w * b
        count = math.ceil(total_ps / plan.ps.cpu - 1e-9)
        count = min(bounds.max_ps, max(bounds.min_ps, count))
        max_mem = max(n.memory_used_mb for w in window for n in _nodes(w, "ps"))
        max_total = max(sum(n.memory_used_mb for n in _nodes(w, "ps")) for w in window)
        mem = (1 + s.ps_memory_margin) * max(max_mem, max_total / count)
        return _group(count, plan.ps.cpu, mem, s)

    def _master_hot_ps(
        self, plan: ResourcePlan, window: Sequence[RuntimeSample], bounds: Bounds
    ) -> NodeGroup | None:
        s = self.settings
        avg = _means(_per_ps(window, "cpu"))
        util = _means(_per_ps(window, "util"))
        hot = [k for k, u in util.items() if u >= s.master_hot_ps_util]
        if not hot:
            return None
        a, b = self._demand(window)
        max_w = int(bounds.quota_cpu / (a + b)) if a + b > 0 else 0
        factor = max(1.0, max_w / plan.workers.count)
        for k in hot:
            if avg[k] > 0:
                factor = min(factor, s.node_max_cpu / avg[k])
        cpu = min(s.node_max_cpu, max(avg.values()) * factor)
        cpu = _clamp_cpu(cpu, s)
        if cpu <= plan.ps.cpu:
            return None
        return _resized(plan.ps, cpu=cpu)

    def _master_workers(
        self, job: JobView, window: Sequence[RuntimeSample], bounds: Bounds
    ) -> tuple[NodeGroup, NodeGroup, Stage, str] | None:
        s = self.settings
        plan = job.plan
        util = _means(_per_ps(window, "util"))
        u = max(util.values()) if util else 0.0
        if u <= 0 or u > s.master_stop_util:
            return None
        ratio = worker_speed_ratio(job.samples)
        if ratio is not None and ratio < s.min_worker_speed_ratio:
            return None
        count = plan.workers.count
        factor = s.master_target_util / u
        if factor > 1:
            count = int(count * factor)
        used = [n for w in window for n in _nodes(w, "worker")]
        if not used:
            return None
        cpu = _clamp_cpu(sum(n.cpu_used for n in used) / len(used), s)
        mem = _clamp_memory(
            (1 + s.master_worker_memory_margin) * max(n.memory_used_mb for n in used), s
        )
        room = min(
            (bounds.quota_cpu - plan.ps.total_cpu) / cpu,
            (bounds.quota_memory_mb - plan.ps.total_memory_mb) / mem,
        )
        count = max(bounds.min_workers, min(count, math.floor(room + 1e-9), bounds.max_workers))
        workers = NodeGroup(count=count, cpu=cpu, memory_mb=mem)
        why = f"dlrover-oss master: PS CPU util {u:.2f}, workers {plan.workers.count} -> {count}"
        return workers, plan.ps, Stage.AUTO_SCALE, why

    def _master_oom(self, memory_mb: int) -> int:
        s = self.settings
        grown = min(memory_mb * s.oom_factor, memory_mb + s.oom_max_step_mb, s.node_max_memory_mb)
        return max(memory_mb, math.ceil(grown))

    # -- brain ---------------------------------------------------------------------------------

    def _brain_decide(
        self,
        job: JobView,
        state: _JobState,
        window: Sequence[RuntimeSample],
        bounds: Bounds,
        ps_change_ok: bool,
    ) -> tuple[NodeGroup, NodeGroup, Stage, str] | None:
        s = self.settings
        kept = drop_ps_spikes(window, s.spike_factor)
        if len(kept) < s.brain_window:
            return None
        if ps_change_ok:
            hot = self._brain_hot_ps(job.plan, kept[-s.brain_window :])
            if hot is not None:
                return job.plan.workers, hot[0], Stage.POST_SCALE, hot[1]
        return self._brain_workers(job, state, kept, bounds)

    def _brain_hot_ps(
        self, plan: ResourcePlan, last: Sequence[RuntimeSample]
    ) -> tuple[NodeGroup, str] | None:
        s = self.settings
        ps = plan.ps
        why: list[str] = []
        avg = _means(_per_ps(last, "cpu"))
        util = _means(_per_ps(last, "util"))
        if any(u > s.brain_hot_ps_util for u in util.values()):
            target = s.hot_ps_target_workers / plan.workers.count
            cpu = min(s.node_max_cpu, max(math.ceil(a * target - 1e-9) for a in avg.values()))
            if cpu > ps.cpu:
                why.append(f"hot PS CPU: {ps.cpu:g} -> {cpu:g} cores")
                ps = _resized(ps, cpu=cpu)
        memory = _per_ps(last, "mem")
        if any(min(v) > s.hot_ps_memory_util for v in memory.values()):
            mem = min(s.node_max_memory_mb, ps.memory_mb + s.hot_ps_memory_step_mb)
            if mem > ps.memory_mb:
                why.append(f"hot PS memory: {ps.memory_mb} -> {mem} MiB")
                ps = NodeGroup(count=ps.count, cpu=ps.cpu, memory_mb=mem)
        if not why:
            return None
        return ps, "dlrover-oss brain: " + "; ".join(why)

    def _brain_workers(
        self,
        job: JobView,
        state: _JobState,
        kept: Sequence[RuntimeSample],
        bounds: Bounds,
    ) -> tuple[NodeGroup, NodeGroup, Stage, str] | None:
        s = self.settings
        plan = job.plan
        w = plan.workers.count
        last = _means(_per_ps(kept[-s.brain_window :], "util"))
        peaks = [_split(x).max_worker_memory_mb for x in kept if _split(x).workers]
        memory = plan.workers.memory_mb
        if peaks:
            wanted = s.brain_worker_memory_factor * max(peaks)
            memory = _clamp_memory(min(wanted, memory + s.worker_memory_max_step_mb), s)
        if any(u > s.exhausted_util for u in last.values()):
            count = max(bounds.min_workers, w - 1)
            why = f"dlrover-oss brain: PS exhausted, workers {w} -> {count}"
        else:
            util = _means(_per_ps(kept[-s.speed_window :], "util"))
            u = max(util.values()) if util else 0.0
            if u <= 0 or u >= s.grow_below_util:
                return None
            if speed_fell(job.samples, s.speed_window, s.speed_drop):
                return None
            target = math.ceil(s.brain_target_util / u * w - 1e-9)
            if state.initial_phase:
                short = self._estimated_s(job, kept) <= s.short_job_s
                cap = s.initial_workers_short if short else s.initial_workers_long
                count = max(w, min(target, cap))
            else:
                count = min(target, w + s.max_worker_step)
            count = min(count, bounds.max_workers)
            why = f"dlrover-oss brain: PS CPU util {u:.2f}, workers {w} -> {count}"
        if count == w and memory == plan.workers.memory_mb:
            return None
        workers = NodeGroup(count=count, cpu=plan.workers.cpu, memory_mb=memory)
        return workers, plan.ps, Stage.AUTO_SCALE, why

    @staticmethod
    def _estimated_s(job: JobView, kept: Sequence[RuntimeSample]) -> float:
        """The brain's estimate of the job's duration: all its samples at the current speed."""
        rows = job.spec.dataset_rows
        speed = _mean_speed(kept)
        if rows is None or speed <= 0:
            return math.inf
        return rows * job.spec.training.epochs / speed

    # -- failures ------------------------------------------------------------------------------

    def _ps_memory_unbalanced(self, samples: Sequence[RuntimeSample]) -> bool:
        for s in reversed(samples):
            used = [n.memory_used_mb for n in _nodes(s, "ps")]
            if used:
                top = max(used)
                mean = sum(used) / len(used)
                return top > 0 and (top - mean) / top > self.settings.ps_memory_unbalance
        return True  # nothing known: grow memory, the master's answer

    @staticmethod
    def _fit_failure(
        workers: NodeGroup, ps: NodeGroup, old: ResourcePlan, role: Role, b: Bounds
    ) -> tuple[NodeGroup, NodeGroup]:
        """Make room for the failed role's growth by giving up workers; then cap the growth
        (PS count back toward the old one, memory down to what the quota leaves)."""
        while not b.fits(workers, ps) and workers.count > b.min_workers:
            workers = _resized(workers, count=workers.count - 1)
        while not b.fits(workers, ps) and ps.count > old.ps.count:
            ps = _resized(ps, count=ps.count - 1)
        if b.fits(workers, ps):
            return workers, ps
        if role == "worker":
            room = (b.quota_memory_mb - ps.total_memory_mb) // max(1, workers.count)
            mem = max(old.workers.memory_mb, min(workers.memory_mb, room))
            workers = NodeGroup(count=workers.count, cpu=workers.cpu, memory_mb=mem)
        else:
            room = (b.quota_memory_mb - workers.total_memory_mb) // max(1, ps.count)
            mem = max(old.ps.memory_mb, min(ps.memory_mb, room))
            ps = NodeGroup(count=ps.count, cpu=ps.cpu, memory_mb=mem)
        if not b.fits(workers, ps):
            return old.workers, old.ps
        return workers, ps

    # -- helpers -------------------------------------------------------------------------------

    def _state(self, job: JobView) -> _JobState:
        state = self._jobs.get(job.job_id)
        if state is None:
            state = _JobState(submitted_at=job.submitted_at)
            self._jobs[job.job_id] = state
        return state

    def _workers_stable(self, job: JobView) -> bool:
        """The worker count equals the plan's and has not changed for the last 60 s."""
        samples = job.samples
        count = job.plan.workers.count
        if samples[-1].workers != count:
            return False
        since = 0.0
        for s in reversed(samples):
            if s.workers != count:
                since = s.time
                break
        return job.elapsed - since >= self.settings.stable_workers_s

    @staticmethod
    def _plan(
        old: ResourcePlan, workers: NodeGroup, ps: NodeGroup, stage: Stage, reason: str
    ) -> ResourcePlan:
        return ResourcePlan(
            workers=workers,
            ps=ps,
            stage=stage,
            reason=reason,
            similar_jobs=old.similar_jobs,
        )
