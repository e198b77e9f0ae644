"""Optimus (Peng et al., EuroSys 2018) as a baseline policy for the cluster simulator.

Optimus fits a speed model per job online and gives the job, one unit at a time, the PS or worker
whose predicted remaining-time reduction per unit of dominant resource is the largest. It is not
elastic: every resize is a checkpoint-and-restart of the whole job (the simulator charges the
pause), and a failed pod restarts the job from its last checkpoint.

What this policy does, per job:

1. **Initial plan.** The user's request (``spec.resources.workers`` / ``ps``), counts clamped to
   ``spec.elastic`` and the plan fitted into the quota; a role without a request gets a small
   pod (CPU = quota/8 within 1-8 cores, memory = 1.5 x the model's footprint floor), 2 workers and
   ``min_ps`` PS.
2. **Profiling, a few steps each.** Before the job trains at its plan, Optimus runs up to
   :data:`PROFILED_CONFIGS` - 1 small configurations for a few steps each (:meth:`profile_plans`:
   small ones such as (1,1), (2,1), (2,2), (4,2) scaled by the elastic minimums, within the
   starting counts, chosen so that the model's four coefficients are identifiable: each adds
   rank to the design matrix). The simulator runs them inside the job's pods (a pod start and
   the engine's ``profile_warmup_steps`` + ``profile_steps`` steps each, a few minutes per job
   in all) and hands the measured samples/s back in ``JobView.profiled``. The starting
   configuration itself is measured by training: :data:`MIN_SAMPLES` runtime samples (the first
   after a change is a warm-up and is skipped).
3. **Model** (asynchronous PS form)::

       f(p, w) = w / (θ0 + θ1·w/p + θ2·w + θ3·p)          [samples/s]

   With ``y = w / X`` this is linear in ``θ``; ``θ ≥ 0`` comes from NNLS over the mean throughput
   of every configuration seen, each row divided by its ``y`` so that the residuals are relative.
   The model has **no per-node CPU term**: Optimus runs fixed-size containers, so the per-pod
   CPU and memory stay those of the starting plan (the user's request) throughout; only the
   counts change. (Memory changes only after an OOM, see 5.)
4. **Allocation.** From ``(min_workers, p0)`` (``p0``: the fewest PS whose fixed memory holds
   their share of the embedding rows, a size Optimus knows from the model), repeatedly add the
   one PS or one worker with the larger ``(R(now) - R(after)) / dominant share of the unit
   within the quota``, ``R = remaining samples / f``, until nothing fits or nothing gains.
   The real Optimus estimates the remaining epochs from a fitted loss curve
   ``1/(β0·k + β1) + β2``; here the remaining work is known exactly as
   ``(1 - progress) x rows x epochs`` (rows = 1 if the spec does not know them: only ratios of
   ``R`` matter to the choice). Every decision refits and reallocates; a resize happens only when
   the model predicts at least :data:`MIN_GAIN` more throughput than the current configuration
   and the remaining time it saves exceeds the restart it costs (:data:`RESTART_S`) (our
   additions: each resize is a restart, and refits on noisy samples would otherwise flip
   between neighbours).
5. **Failures.** NodeLost / Evicted: keep the plan (the job restarts as it was). OOMKilled:
   double the failed role's memory (at most 64 GiB a pod), giving up workers if the quota needs
   room, capped by the quota. :meth:`OptimusPolicy.finished` keeps no history (Optimus has none).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from dlrover_kfp.core.footprint import min_ps_memory_mb, min_worker_memory_mb
from dlrover_kfp.core.perf_model import solve_nnls
from dlrover_kfp.core.plan import NodeGroup, ResourcePlan, Stage
from dlrover_kfp.core.planner.quota_rule import job_quota
from dlrover_kfp.core.planner.settings import ColdStartSettings, NodeLimits, PlannerSettings
from dlrover_kfp.core.profile import JobProfile, RuntimeSample
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.sim.cluster.api import JobView, Role

#: Distinct configurations profiled before the model is trusted (the paper: 4-5 suffice).
PROFILED_CONFIGS = 5
#: Runtime samples of a configuration (warm-up excluded) before it counts as measured.
MIN_SAMPLES = 3
#: A reallocation must promise this much more throughput than the current configuration ...
MIN_GAIN = 0.05
#: ... and save more remaining time than a checkpoint-and-restart costs (seconds; the
#: simulator's restart_resize_s).
RESTART_S = 300.0
#: Samples kept per configuration (the newest), so a long job's state stays bounded.
MAX_SAMPLES_PER_CONFIG = 200

Theta = tuple[float, float, float, float]
Shape = tuple[int, int]  # (workers, ps)

_NODE = NodeLimits()
#: the planner's default settings: the quota rule every policy of the simulator shares
_PLANNER = PlannerSettings()
_SMALL_WORKERS = ColdStartSettings().workers
_SMALL_EXAMPLES: tuple[Shape, ...] = (
    (1, 1),
    (2, 1),
    (2, 2),
    (4, 2),
    (4, 1),
    (1, 2),
    (3, 3),
    (6, 3),
    (8, 4),
)


@dataclass(frozen=True, slots=True)
class OptimusModel:
    """The fitted asynchronous-PS speed model ``f(p, w) = w / (θ0 + θ1·w/p + θ2·w + θ3·p)``."""

    theta: Theta

    def time_per_sample_x_workers(self, workers: int, ps: int) -> float:
        """The model's denominator ``θ0 + θ1·w/p + θ2·w + θ3·p`` (seconds x workers / sample)."""
        t0, t1, t2, t3 = self.theta
        return t0 + t1 * workers / ps + t2 * workers + t3 * ps

    def throughput(self, workers: int, ps: int) -> float:
        """Predicted samples/s with ``workers`` workers and ``ps`` PS."""
        denominator = self.time_per_sample_x_workers(workers, ps)
        return workers / denominator if denominator > 0 else 0.0


def _features(workers: int, ps: int) -> list[float]:
    return [1.0, workers / ps, float(workers), float(ps)]


def design_rank(shapes: Iterable[Shape]) -> int:
    """Rank of the model's design matrix over ``shapes``: 4 means every θ is identifiable."""
    rows = [_features(w, p) for w, p in shapes]
    return int(np.linalg.matrix_rank(np.array(rows, dtype=float))) if rows else 0


def fit_optimus(observations: Mapping[Shape, float]) -> OptimusModel | None:
    """NNLS fit of θ from mean throughput (samples/s) per ``(workers, ps)``.

    Each row ``[1, w/p, w, p]·θ = w/X`` is divided by ``w/X``, so the fit minimises relative
    errors. None when no configuration has a positive throughput, or the fit is all zeros.
    """
    rows: list[list[float]] = []
    for (w, p), x in sorted(observations.items()):
        if w <= 0 or p <= 0 or not x > 0:
            continue
        y = w / x
        rows.append([v / y for v in _features(w, p)])
    if not rows:
        return None
    theta, _ = solve_nnls(np.array(rows, dtype=float), np.ones(len(rows)))
    values = tuple(float(v) for v in theta)
    if not any(v > 0 for v in values):
        return None
    return OptimusModel(theta=(values[0], values[1], values[2], values[3]))


@dataclass(frozen=True, slots=True)
class Pods:
    """Optimus's fixed container sizes: CPU (cores) and memory (MiB) of one worker and one PS."""

    worker_cpu: float
    worker_memory_mb: int
    ps_cpu: float
    ps_memory_mb: int

    def plan_groups(self, shape: Shape) -> tuple[NodeGroup, NodeGroup]:
        w, p = shape
        return (
            NodeGroup(count=w, cpu=self.worker_cpu, memory_mb=self.worker_memory_mb),
            NodeGroup(count=p, cpu=self.ps_cpu, memory_mb=self.ps_memory_mb),
        )


@dataclass(frozen=True, slots=True)
class Bounds:
    """The job's quota (total CPU cores, total memory MiB) and elastic counts."""

    quota_cpu: float
    quota_memory_mb: int
    min_workers: int
    max_workers: int
    min_ps: int
    max_ps: int

    def fits(self, pods: Pods, shape: Shape) -> bool:
        w, p = shape
        return (
            self.min_workers <= w <= self.max_workers
            and self.min_ps <= p <= self.max_ps
            and w * pods.worker_cpu + p * pods.ps_cpu <= self.quota_cpu + 1e-9
            and w * pods.worker_memory_mb + p * pods.ps_memory_mb <= self.quota_memory_mb
        )

    def share(self, cpu: float, memory_mb: float) -> float:
        """Dominant share of the quota that ``cpu`` cores and ``memory_mb`` MiB take."""
        return max(cpu / self.quota_cpu, memory_mb / self.quota_memory_mb)


def job_bounds(spec: JobSpec) -> Bounds:
    """The quota is the planner's (:func:`~dlrover_kfp.core.planner.quota_rule.job_quota`:
    ``spec.resources.limits``, else the default quota, which a larger request is cut to as the
    planner cuts it): the paper defines no quota rule of its own, and every policy of the
    simulator is given the same room."""
    quota = job_quota(spec, _PLANNER)
    return Bounds(
        quota_cpu=quota.cpu,
        quota_memory_mb=quota.memory_mb,
        min_workers=spec.elastic.min_workers,
        max_workers=spec.elastic.max_workers,
        min_ps=spec.elastic.min_ps,
        max_ps=spec.elastic.max_ps,
    )


def greedy_allocation(
    model: OptimusModel, pods: Pods, bounds: Bounds, remaining: float, start: Shape
) -> Shape | None:
    """Optimus's greedy: from ``start``, add the PS or worker with the larger remaining-time
    reduction per dominant share of its unit, while one fits and gains. None if ``start`` does
    not fit or the model predicts no throughput there."""
    if not bounds.fits(pods, start) or model.throughput(*start) <= 0:
        return None
    units = {
        (1, 0): bounds.share(pods.worker_cpu, pods.worker_memory_mb),
        (0, 1): bounds.share(pods.ps_cpu, pods.ps_memory_mb),
    }
    w, p = start
    while True:
        now = remaining / model.throughput(w, p)
        best: tuple[float, Shape] | None = None
        for (dw, dp), share in units.items():
            nxt = (w + dw, p + dp)
            if share <= 0 or not bounds.fits(pods, nxt):
                continue
            x = model.throughput(*nxt)
            if x <= 0:
                continue
            gain = (now - remaining / x) / share
            if gain > 0 and (best is None or gain > best[0]):
                best = (gain, nxt)
        if best is None:
            return (w, p)
        w, p = best[1]


def profiling_shapes(
    start: Shape, pods: Pods, bounds: Bounds, min_ps: int, within: Shape | None = None
) -> list[Shape]:
    """The configurations profiled first: ``start``, then small ones that add rank to the design
    matrix (or, once it has full rank, add a spare point), up to :data:`PROFILED_CONFIGS`;
    with ``within``, none with more workers or PS than it."""
    chosen = [start]
    for a, b in _SMALL_EXAMPLES:
        if len(chosen) >= PROFILED_CONFIGS:
            break
        shape = (a * bounds.min_workers, b * min_ps)
        if shape in chosen or not bounds.fits(pods, shape):
            continue
        if within is not None and (shape[0] > within[0] or shape[1] > within[1]):
            continue
        rank = design_rank(chosen)
        if rank >= 4 or design_rank([*chosen, shape]) > rank:
            chosen.append(shape)
    return chosen


@dataclass(slots=True)
class _JobState:
    pods: Pods
    #: throughput samples per (workers, ps), warm-up samples excluded
    samples: dict[Shape, list[float]] = field(default_factory=dict)
    profiled: dict[Shape, float] = field(default_factory=dict)
    model: OptimusModel | None = None
    # where the last decide left off reading view.samples
    seen: int = 0
    restarts: int = 0
    last_key: tuple[float, int, float] | None = None
    previous_shape: Shape | None = None


def _sample_key(s: RuntimeSample) -> tuple[float, int, float]:
    return (s.time, s.global_step, s.throughput)


class OptimusPolicy:
    """Optimus's online model and greedy allocation, one job at a time within its quota.

    Resizes are checkpoint-and-restart (``elastic`` is False): the simulator should pause the
    job for its restart cost on every plan returned by :meth:`decide`. The policy reads
    ``view.samples`` incrementally; it accepts either behaviour of the simulator after a resize
    or restart (samples kept, or a fresh incarnation whose samples start again).
    """

    def __init__(self) -> None:
        self._jobs: dict[str, _JobState] = {}

    @property
    def name(self) -> str:
        return "optimus"

    @property
    def elastic(self) -> bool:
        return False

    @property
    def decision_interval_s(self) -> float:
        return 600.0

    # -- the protocol ------------------------------------------------------------------------

    def initial(self, spec: JobSpec, now: float) -> ResourcePlan:
        bounds = job_bounds(spec)
        pods, shape = _requested(spec, bounds)
        pods, shape = _fit_start(pods, shape, bounds)
        workers, ps = pods.plan_groups(shape)
        return ResourcePlan(
            workers=workers,
            ps=ps,
            stage=Stage.COLD_START,
            reason="optimus: the user's request, fixed-size containers"
            if spec.resources.workers is not None or spec.resources.ps is not None
            else "optimus: no request, a small configuration to profile from",
        )

    def profile_plans(self, spec: JobSpec, plan: ResourcePlan) -> list[ResourcePlan]:
        """The small configurations to run a few steps each before training at ``plan``."""
        bounds = job_bounds(spec)
        pods = Pods(plan.workers.cpu, plan.workers.memory_mb, plan.ps.cpu, plan.ps.memory_mb)
        start = (plan.workers.count, plan.ps.count)
        min_ps = _min_feasible_ps(spec, pods, bounds)
        shapes = [
            s for s in profiling_shapes(start, pods, bounds, min_ps, within=start) if s != start
        ]
        return [
            self._plan(pods, s, f"optimus: profiling configuration {k}/{len(shapes)}", None)
            for k, s in enumerate(shapes, start=1)
        ]

    def decide(self, job: JobView) -> ResourcePlan | None:
        state = self._state(job)
        self._read(state, job)
        state.profiled.update(job.profiled)
        bounds = job_bounds(job.spec)
        current = (job.plan.workers.count, job.plan.ps.count)
        if len(state.samples.get(current, ())) < MIN_SAMPLES:
            return None  # the current configuration is not measured yet
        min_ps = _min_feasible_ps(job.spec, state.pods, bounds)
        model = fit_optimus({**state.profiled, **_means(state.samples)})
        state.model = model
        if model is None:
            return None
        remaining = _remaining(job)
        target = greedy_allocation(
            model, state.pods, bounds, remaining, (bounds.min_workers, min_ps)
        )
        if target is None or target == current:
            return None
        predicted = model.throughput(*target)
        now_x = model.throughput(*current)
        if predicted < (1 + MIN_GAIN) * now_x:
            return None
        if now_x > 0 and remaining / now_x - remaining / predicted <= RESTART_S:
            return None
        return self._plan(
            state.pods,
            target,
            f"optimus: greedy allocation, predicted {predicted:.0f} samples/s",
            predicted,
        )

    def after_failure(self, job: JobView, role: Role, reason: str) -> ResourcePlan | None:
        if reason != "OOMKilled":
            return None  # the job restarts with the plan it had
        state = self._state(job)
        bounds = job_bounds(job.spec)
        pods = state.pods
        shape = (job.plan.workers.count, job.plan.ps.count)
        old = pods.worker_memory_mb if role == "worker" else pods.ps_memory_mb
        wanted = min(2 * old, _NODE.max_memory_mb)
        if wanted <= old:
            return None
        grown = _with_memory(pods, role, wanted)
        w, p = shape
        while not bounds.fits(grown, (w, p)) and w > bounds.min_workers:
            w -= 1
        if not bounds.fits(grown, (w, p)):
            other = p * pods.ps_memory_mb if role == "worker" else w * pods.worker_memory_mb
            count = w if role == "worker" else p
            room = (bounds.quota_memory_mb - other) // max(1, count)
            grown = _with_memory(pods, role, max(old, min(wanted, room)))
            if not bounds.fits(grown, (w, p)) or grown == pods:
                return None
        state.pods = grown
        new = grown.worker_memory_mb if role == "worker" else grown.ps_memory_mb
        return self._plan(
            grown,
            (w, p),
            f"optimus: {role} OOMKilled, memory {old} -> {new} MiB",
            None,
            stage=Stage.POST_SCALE,
        )

    def finished(self, profile: JobProfile) -> None:
        # Optimus keeps no history; only this job's working state goes.
        self._jobs.pop(profile.run_id, None)

    # -- introspection (tests, reports) ------------------------------------------------------

    def model(self, job_id: str) -> OptimusModel | None:
        """The model last fitted for ``job_id`` (None before profiling ends)."""
        state = self._jobs.get(job_id)
        return state.model if state else None

    # -- internals ---------------------------------------------------------------------------

    def _state(self, job: JobView) -> _JobState:
        state = self._jobs.get(job.job_id)
        if state is None:
            plan = job.plan
            state = _JobState(
                pods=Pods(
                    worker_cpu=plan.workers.cpu,
                    worker_memory_mb=plan.workers.memory_mb,
                    ps_cpu=plan.ps.cpu,
                    ps_memory_mb=plan.ps.memory_mb,
                ),
                restarts=job.restarts,
            )
            self._jobs[job.job_id] = state
        return state

    @staticmethod
    def _read(state: _JobState, job: JobView) -> None:
        """Add the samples not read yet; a restarted or reset sample list is read afresh."""
        samples: Sequence[RuntimeSample] = job.samples
        continued = (
            state.seen > 0
            and job.restarts == state.restarts
            and len(samples) >= state.seen
            and _sample_key(samples[state.seen - 1]) == state.last_key
        )
        if not continued:
            state.seen = 0
            state.previous_shape = None
        for s in samples[state.seen :]:
            shape = (s.workers, s.ps)
            if shape == state.previous_shape and s.throughput > 0 and s.workers and s.ps:
                bucket = state.samples.setdefault(shape, [])
                bucket.append(s.throughput)
                del bucket[:-MAX_SAMPLES_PER_CONFIG]
            state.previous_shape = shape
        state.seen = len(samples)
        state.restarts = job.restarts
        state.last_key = _sample_key(samples[-1]) if samples else None

    @staticmethod
    def _plan(
        pods: Pods,
        shape: Shape,
        reason: str,
        predicted: float | None,
        stage: Stage = Stage.AUTO_SCALE,
    ) -> ResourcePlan:
        workers, ps = pods.plan_groups(shape)
        return ResourcePlan(
            workers=workers,
            ps=ps,
            stage=stage,
            reason=reason,
            predicted_throughput=predicted,
        )


def _means(samples: Mapping[Shape, Sequence[float]]) -> dict[Shape, float]:
    return {shape: sum(xs) / len(xs) for shape, xs in samples.items() if xs}


def _remaining(job: JobView) -> float:
    rows = job.spec.dataset_rows or 1
    return max(1.0 - job.progress, 1e-6) * rows * job.spec.training.epochs


def _with_memory(pods: Pods, role: Role, memory_mb: int) -> Pods:
    if role == "worker":
        return replace(pods, worker_memory_mb=memory_mb)
    return replace(pods, ps_memory_mb=memory_mb)


def _min_feasible_ps(spec: JobSpec, pods: Pods, bounds: Bounds) -> int:
    """The fewest PS whose fixed memory holds their share of the embedding rows."""
    for p in range(bounds.min_ps, bounds.max_ps + 1):
        if min_ps_memory_mb(spec.model, p) <= pods.ps_memory_mb:
            return p
    return bounds.max_ps


def _small_cpu(bounds: Bounds) -> float:
    cold = ColdStartSettings()
    cpu = math.ceil(bounds.quota_cpu * cold.cpu_quota_share * 2) / 2
    return min(cold.max_cpu, max(cold.min_cpu, cpu))


def _requested(spec: JobSpec, bounds: Bounds) -> tuple[Pods, Shape]:
    """Per-pod sizes and counts from the user's request, a small pod for a role without one."""
    res = spec.resources
    cold = ColdStartSettings()
    p_small = bounds.min_ps
    if res.workers is not None:
        w, w_cpu, w_mem = res.workers.count, float(res.workers.cpu), int(res.workers.memory)
    else:
        w = _SMALL_WORKERS
        w_cpu = _small_cpu(bounds)
        w_mem = math.ceil(min_worker_memory_mb(spec.model, spec.training) * cold.memory_factor)
        w_mem = max(w_mem, _NODE.min_memory_mb)
    if res.ps is not None:
        p, p_cpu, p_mem = res.ps.count, float(res.ps.cpu), int(res.ps.memory)
    else:
        p = p_small
        p_cpu = _small_cpu(bounds)
        p_mem = math.ceil(min_ps_memory_mb(spec.model, p_small) * cold.memory_factor)
        p_mem = max(p_mem, _NODE.min_memory_mb)
    w = min(bounds.max_workers, max(bounds.min_workers, w))
    p = min(bounds.max_ps, max(bounds.min_ps, p))
    return Pods(w_cpu, w_mem, p_cpu, p_mem), (w, p)


def _fit_start(pods: Pods, shape: Shape, bounds: Bounds) -> tuple[Pods, Shape]:
    """Fit the starting plan into the quota: fewer workers, then fewer PS, then smaller pods."""
    w, p = shape
    while not bounds.fits(pods, (w, p)) and w > bounds.min_workers:
        w -= 1
    while not bounds.fits(pods, (w, p)) and p > bounds.min_ps:
        p -= 1
    if bounds.fits(pods, (w, p)):
        return pods, (w, p)
    cpu = w * pods.worker_cpu + p * pods.ps_cpu
    mem = w * pods.worker_memory_mb + p * pods.ps_memory_mb
    f_cpu = min(1.0, bounds.quota_cpu / cpu)
    f_mem = min(1.0, bounds.quota_memory_mb / mem)
    scaled = Pods(
        worker_cpu=math.floor(pods.worker_cpu * f_cpu * 100) / 100,
        worker_memory_mb=math.floor(pods.worker_memory_mb * f_mem),
        ps_cpu=math.floor(pods.ps_cpu * f_cpu * 100) / 100,
        ps_memory_mb=math.floor(pods.ps_memory_mb * f_mem),
    )
    return scaled, (w, p)
