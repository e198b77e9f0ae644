"""Job traces for the cluster simulator: the contract, its JSONL file, and a synthetic generator.

A trace is a list of :class:`TraceJob`: when a job arrives, its spec as the user wrote it (the
"manual" request and the quota) and its hidden truth. On disk it is JSON Lines: an optional
header ``{"trace_version": 1, "description": "..."}`` then one job per line.

Synthetic traces (:func:`synthetic_trace`) are calibrated to the setting of the DLRover-RM paper
and blog (production PS jobs before DLRover). The figures were measured on 500 jobs, seeds 0-19
(min / mean / max over the seeds; :func:`calibration` computes them):

* **Recurring jobs.** 80 % of the jobs belong to jobs/10 scenarios, each a daily retraining job
  (one run a day on consecutive days, same time of day ± 15 min; more often than daily when the
  trace is shorter than a scenario's runs): same model shape, quota and user request every day;
  dataset rows and every truth parameter jittered ±5 % a day. The other 20 % are one-off jobs,
  each its own scenario. Arrivals spread uniformly over ``days`` (default jobs/60: 60 jobs a
  day, 8 runs per recurring scenario, ~4 jobs running at once on average).
* **Job length.** Dataset rows are set from the truth at the request so that the manual JCT (no
  failures, no queueing) is log-uniform in 20 min - 4 h. Measured: p10 / median / p90 of
  23-32 min / 63-97 min / 2.7-3.5 h.
* **Over-provisioning.** Users ask for 4-16 workers and 2-8 PS (never more PS than workers),
  8 (2/3 of the pods) or 16 cores per pod, memory 2-4x the real peak rounded up to a size users
  write (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64 GiB). Truths have thread caps of 6-14
  (workers) and 4-10 (PS) threads. Manual CPU utilisation (core-seconds used / requested, all
  pods of all jobs, at the request): 0.21 / 0.23 / 0.26 (workers ~0.30, PS ~0.15; paper and
  blog: 0.21-0.28, workers ~0.20, PS ~0.15). Memory utilisation (MiB-seconds likewise, the PS
  growing with progress): 0.24 / 0.25 / 0.26 (blog: 0.17-0.32).
* **Under-provisioning.** A user's PS memory request is a log-normal guess at the largest PS's
  end-of-job use (median 2x, sigma 0.9; :data:`PS_GUESS_MEDIAN`), rounded up to a size users
  write: the jobs whose guess falls short ask for less than their largest PS reaches, and OOM
  under manual configuration once it grows past it (paper: completion rate 89 %). Measured
  OOM share (:func:`manual_oom_progress`) 0.022 / 0.051 / 0.086 (seeds 0-19; issue 44: this
  line said 10 % of the scenarios, at a progress drawn in 0.3-0.85, which the code no longer
  draws).
  Another 5 % of the scenarios and one-off jobs (4.2 % of the jobs) ask for a third of the
  workers they should (1-3 instead of 4-16): manual JCTs of 1.3-2.7 h where 20-90 min was meant.
* **Quota** (``resources.limits``): 1.5-3x the request in CPU and in memory (the request the job
  should have made, for the few-worker ones), at least the spec's memory floor, whole cores and
  GiB. Within it, the truth's best shape trains ~2.6x (median) faster than the request.
  :func:`in_regime` gives the other regime, each quota the totals of the job's own request
  (``simulate --quota request``): every policy held to what manual runs with.

``family="roofline"`` gives the same jobs (ids, arrivals, specs: the same draws) with roofline
truths, scaled so that each job's throughput at its request equals the ps-contention truth's:
the same manual JCTs and memory, different shapes away from the request (see :mod:`.truth`).
Manual CPU utilisation 0.20 / 0.22 / 0.25.

:func:`cluster_size_for` sizes the simulated cluster for a trace (see there).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass as plain_dataclass
from typing import Annotated, Literal, TypeVar

from pydantic import Field, Strict, ValidationError, model_validator
from pydantic.dataclasses import dataclass

from dlrover_kfp.core.documents import parse, to_dict
from dlrover_kfp.core.footprint import min_ps_memory_mb, min_worker_memory_mb
from dlrover_kfp.core.quantity import Mebibytes
from dlrover_kfp.core.spec import (
    ElasticSpec,
    JobSpec,
    ModelSpec,
    NodeRequest,
    Quota,
    ResourcesSpec,
    SyntheticData,
    TrainingSpec,
)
from dlrover_kfp.core.types import CONTRACT_CONFIG, NonNegFloat, Str
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.files import iter_json_lines, write_atomic
from dlrover_kfp.sim.cluster.trainer_fit import packaged_fit, serial_at, trainer_truth
from dlrover_kfp.sim.cluster.truth import (
    JobTruth,
    MemoryTruth,
    PsContentionTruth,
    RooflineTruth,
    TrainerTruth,
)

TRACE_VERSION: Literal[1] = 1

T = TypeVar("T")

Family = Literal["ps-contention", "roofline", "trainer"]
FAMILIES: tuple[Family, ...] = ("ps-contention", "roofline", "trainer")

JobId = Annotated[str, Strict(), Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")]


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class TraceHeader:
    """The optional first line of a trace file."""

    trace_version: Literal[1] = TRACE_VERSION
    description: Str = ""


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class TraceJob:
    """One job of a trace: when it arrives, what the user asked for, and how it really behaves.

    The spec must carry the manual configuration (``resources.workers``, ``resources.ps``), the
    quota (``resources.limits``) and the dataset's row count: the simulator runs the manual
    policy from it and computes progress from rows x epochs.
    """

    id: JobId
    scenario: Str = Field(min_length=1)
    arrival_s: NonNegFloat = Field(
        description="seconds since the trace starts", allow_inf_nan=False
    )
    spec: JobSpec
    truth: JobTruth

    @model_validator(mode="after")
    def _complete(self) -> TraceJob:
        res = self.spec.resources
        for key, value in (("limits", res.limits), ("workers", res.workers), ("ps", res.ps)):
            if value is None:
                raise ValueError(f"spec.resources.{key}: required in a trace job (got nothing)")
        if self.spec.dataset_rows is None:
            raise ValueError("spec.data.rows: required in a trace job (got nothing)")
        for part in (self.truth.throughput, self.truth.memory):
            for item in dataclasses.fields(part):
                value = getattr(part, item.name)
                if isinstance(value, float) and not math.isfinite(value):
                    # Python's JSON reads Infinity and NaN; the simulator's arithmetic cannot.
                    raise ValueError(f"truth.{item.name}: must be a finite number, got {value}")
        if self.spec.scenario != self.scenario:
            raise ValueError(
                f"spec.scenario: {self.spec.scenario!r} differs from scenario {self.scenario!r}"
            )
        return self

    # The manual configuration, for the simulator's hot loops (validated present above).
    @property
    def workers(self) -> NodeRequest:
        assert self.spec.resources.workers is not None
        return self.spec.resources.workers

    @property
    def ps(self) -> NodeRequest:
        assert self.spec.resources.ps is not None
        return self.spec.resources.ps

    @property
    def quota(self) -> Quota:
        assert self.spec.resources.limits is not None
        return self.spec.resources.limits

    @property
    def total_samples(self) -> int:
        """Samples to train: dataset rows x epochs."""
        return (self.spec.dataset_rows or 0) * self.spec.training.epochs


# --------------------------------------------------------------------------------------------
# The JSONL file


def write_trace(
    path: str | os.PathLike[str], jobs: Sequence[TraceJob], description: str = ""
) -> None:
    """Write ``jobs`` (header first, one job a line) so that readers never see half a file."""
    lines = [json.dumps(to_dict(TraceHeader(description=description)), ensure_ascii=False)]
    lines.extend(
        json.dumps(to_dict(job), separators=(",", ":"), ensure_ascii=False) for job in jobs
    )
    write_atomic(path, "\n".join(lines) + "\n")


def read_trace(path: str | os.PathLike[str]) -> list[TraceJob]:
    """Every job of a trace file, validated, sorted by arrival (stable for equal arrivals).

    The first bad line is a :class:`UserInputError` naming ``<file>:<line>`` and the key; so is a
    job id that an earlier line already used (naming both lines) and a header anywhere but on
    the first line. Blank lines are ignored.
    """
    jobs: list[TraceJob] = []
    first_line: dict[str, int] = {}
    seen_content = False
    for where, number, data in iter_json_lines(path):
        if isinstance(data, dict) and "trace_version" in data:
            if seen_content:
                raise UserInputError(f"{where}: trace_version: a header must be the first line")
            version = data["trace_version"]
            if version != TRACE_VERSION or isinstance(version, bool):
                raise UserInputError(
                    f"{where}: trace_version: unsupported version {version!r} "
                    f"(this reader knows {TRACE_VERSION})"
                )
            parse(TraceHeader, data, where)
            seen_content = True
            continue
        seen_content = True
        job = parse(TraceJob, data, where)
        if job.id in first_line:
            raise UserInputError(
                f"{where}: id {job.id!r} already appears on line {first_line[job.id]}"
            )
        first_line[job.id] = number
        jobs.append(job)
    jobs.sort(key=lambda job: job.arrival_s)
    return jobs


# --------------------------------------------------------------------------------------------
# Quota regimes

#: ``headroom``: each job's quota as the trace gives it (the synthetic traces: 1.5-3x the
#: request); ``request``: each job's quota is its own request, so that every policy is held to
#: the resources manual runs with and a difference in JCT is planning, not resources.
QuotaRegime = Literal["headroom", "request"]
QUOTA_REGIMES: tuple[QuotaRegime, ...] = ("headroom", "request")


def request_quota(job: TraceJob) -> Quota:
    """The totals of the user's own request, all pods together:

    cpu    = workers.count x workers.cpu + ps.count x ps.cpu
    memory = workers.count x workers.memory + ps.count x ps.memory   (MiB)
    """
    w, p = job.workers, job.ps
    return Quota(
        cpu=w.count * w.cpu + p.count * p.cpu,
        memory=Mebibytes(w.count * w.memory + p.count * p.memory),
    )


def in_regime(jobs: Sequence[TraceJob], regime: QuotaRegime) -> list[TraceJob]:
    """``jobs`` under quota ``regime`` (:data:`QuotaRegime`); nothing but the quota
    (``spec.resources.limits``) changes. Pure: a synthetic trace and a ``--trace`` file alike.
    A request too small to be a quota (below one worker and one PS of its model, which a spec's
    limits may not be) is a :class:`UserInputError` naming the job."""
    if regime == "headroom":
        return list(jobs)
    if regime != "request":
        raise ValueError(f"regime: {regime!r} is not one of {', '.join(QUOTA_REGIMES)}")
    out = []
    for job in jobs:
        resources = dataclasses.replace(job.spec.resources, limits=request_quota(job))
        try:
            spec = dataclasses.replace(job.spec, resources=resources)
        except ValidationError as exc:  # a request below one worker and one PS of its model
            raise UserInputError(
                f"--quota request: job {job.id}: its request cannot be its quota: "
                f"{exc.errors()[0]['msg']}"
            ) from None
        out.append(dataclasses.replace(job, spec=spec))
    return out


# --------------------------------------------------------------------------------------------
# Manual configuration, measured on the truth


def manual_throughput(job: TraceJob) -> float:
    """Samples/s of the job at the user's own request (the manual policy)."""
    w, p = job.workers, job.ps
    return job.truth.throughput.throughput(
        w.count, p.count, w.cpu, p.cpu, job.spec.training.batch_size
    )


def manual_jct(job: TraceJob) -> float:
    """Seconds the job trains at its request, without failures or queueing."""
    return job.total_samples / manual_throughput(job)


def manual_oom_progress(job: TraceJob) -> float | None:
    """Progress (0..1) at which the largest PS outgrows its request under manual, or None."""
    memory, p = job.truth.memory, job.ps
    limit = p.memory
    if memory.ps_used_mb(1.0, p.count) <= limit:
        return None
    if memory.ps_used_mb(0.0, p.count) > limit:
        return 0.0
    low, high = 0.0, 1.0
    for _ in range(40):
        mid = 0.5 * (low + high)
        if memory.ps_used_mb(mid, p.count) > limit:
            high = mid
        else:
            low = mid
    return high


@plain_dataclass(frozen=True, slots=True)
class Calibration:
    """How a trace's jobs behave under manual configuration (see :func:`calibration`)."""

    jobs: int
    #: core-seconds used / requested, all pods of all jobs, at the request
    cpu_utilisation: float
    #: MiB-seconds used (capped at the request) / requested, likewise
    memory_utilisation: float
    #: jobs whose largest PS outgrows its memory request before the end
    oom_fraction: float
    #: jobs whose request has fewer than 4 workers
    few_workers_fraction: float
    #: jobs whose scenario has more than one job in the trace
    recurring_fraction: float
    #: manual JCT quantiles (seconds): 10 %, 50 %, 90 %
    jct_p10_s: float
    jct_median_s: float
    jct_p90_s: float


#: Points of the midpoint rule that averages PS memory over a job's progress.
_MEMORY_POINTS = 16


def _mean_used_mb(memory: MemoryTruth, ps: int, index: int, limit: float) -> float:
    total = 0.0
    for i in range(_MEMORY_POINTS):
        total += min(limit, memory.ps_used_mb((i + 0.5) / _MEMORY_POINTS, ps, index))
    return total / _MEMORY_POINTS


def calibration(jobs: Sequence[TraceJob]) -> Calibration:
    """Utilisation and failure figures of the manual configuration of ``jobs``.

    Each job runs at its request for its :func:`manual_jct` (progress linear in time); usage is
    the truth's. Utilisation is the ratio of the sums over all pods of all jobs (the cluster's
    figure, as the paper reports it): a pod-time-weighted mean of per-pod utilisation.
    """
    cpu_used = cpu_req = mem_used = mem_req = 0.0
    jcts: list[float] = []
    ooms = few = 0
    for job in jobs:
        w, p = job.workers, job.ps
        batch = job.spec.training.batch_size
        _, w_cores, p_cores = job.truth.throughput.evaluate(w.count, p.count, w.cpu, p.cpu, batch)
        jct = manual_jct(job)
        jcts.append(jct)
        cpu_used += jct * (w.count * w_cores + p.count * p_cores)
        cpu_req += jct * (w.count * w.cpu + p.count * p.cpu)
        memory = job.truth.memory
        ps_mb = _mean_used_mb(memory, p.count, 0, p.memory)
        if p.count > 1:
            ps_mb += (p.count - 1) * _mean_used_mb(memory, p.count, 1, p.memory)
        mem_used += jct * (w.count * min(memory.worker_mb, w.memory) + ps_mb)
        mem_req += jct * (w.count * w.memory + p.count * p.memory)
        ooms += manual_oom_progress(job) is not None
        few += w.count < MIN_WORKERS
    n = len(jobs)
    runs = Counter(job.scenario for job in jobs)
    recurring = sum(1 for job in jobs if runs[job.scenario] > 1)
    jcts.sort()

    def quantile(q: float) -> float:
        return jcts[min(n - 1, int(q * n))] if n else 0.0

    return Calibration(
        jobs=n,
        cpu_utilisation=cpu_used / cpu_req if cpu_req else 0.0,
        memory_utilisation=mem_used / mem_req if mem_req else 0.0,
        oom_fraction=ooms / n if n else 0.0,
        few_workers_fraction=few / n if n else 0.0,
        recurring_fraction=recurring / n if n else 0.0,
        jct_p10_s=quantile(0.1),
        jct_median_s=quantile(0.5),
        jct_p90_s=quantile(0.9),
    )


# --------------------------------------------------------------------------------------------
# Cluster size

#: Node shape of the simulated cluster: a common cloud shape, 4 GiB per core. A node fits the
#: largest pod any baseline policy asks for (32 cores, 64 GiB).
NODE_CPU = 64.0
NODE_MEMORY_MB = 256 * 1024
#: The manual demand's "peak": its time-weighted quantile (the busy hours, not the one busiest
#: instant, which grows with the trace's length) ...
PEAK_QUANTILE = 0.95
#: ... fills this share of the cluster.
PEAK_FILL = 0.8


def _busy_level(steps: list[tuple[float, float]], quantile: float) -> float:
    """Time-weighted ``quantile`` of a step function given as (level, duration) pairs."""
    steps = sorted(steps)
    total = sum(duration for _, duration in steps)
    if total <= 0:
        return max((level for level, _ in steps), default=0.0)
    acc = 0.0
    for level, duration in steps:
        acc += duration
        if acc >= quantile * total:
            return level
    return steps[-1][0]


def cluster_size_for(
    jobs: Sequence[TraceJob], *, fill: float = PEAK_FILL, quantile: float = PEAK_QUANTILE
) -> tuple[int, float, int]:
    """``(nodes, cpu_per_node, memory_mb_per_node)`` for simulating ``jobs``.

    Rule: every job holds its manual request from its arrival for its :func:`manual_jct` (no
    queueing, no failures). Over the trace (first arrival to last finish) that demand's
    time-weighted ``quantile`` (95th percentile: the busy hours), in CPU and in memory, fills
    ``fill`` (80 %) of the cluster in the scarcer resource; and the largest job alone fits in
    ``fill`` of it. Nodes are :data:`NODE_CPU` cores and :data:`NODE_MEMORY_MB` MiB (grown if
    one pod of the trace would not fit). On 500-job synthetic traces this gives 23-31 nodes;
    CPU binds (memory peaks at ~30 % of the cluster), the demand averages ~35 % of the CPU and
    its busiest instants ask for 1.1-1.2x the cluster for 0-3 hours of the 8 days: the manual
    policy queues then (more so with failures and restarts), and the trace completes.
    """
    if not 0 < fill <= 1 or not 0 < quantile <= 1:
        raise ValueError(f"fill and quantile: must be in (0, 1], got {fill}, {quantile}")
    node_cpu, node_mem = NODE_CPU, NODE_MEMORY_MB
    events: list[tuple[float, float, float]] = []
    largest_cpu = largest_mem = 0.0
    for job in jobs:
        w, p = job.workers, job.ps
        node_cpu = max(node_cpu, w.cpu, p.cpu)
        node_mem = max(node_mem, _ceil_gib(max(w.memory, p.memory)))
        cpu = w.count * w.cpu + p.count * p.cpu
        mem = float(w.count * w.memory + p.count * p.memory)
        largest_cpu, largest_mem = max(largest_cpu, cpu), max(largest_mem, mem)
        events.append((job.arrival_s, cpu, mem))
        events.append((job.arrival_s + manual_jct(job), -cpu, -mem))
    events.sort(key=lambda event: (event[0], event[1]))
    cpu_steps: list[tuple[float, float]] = []
    mem_steps: list[tuple[float, float]] = []
    cpu_now = mem_now = 0.0
    for i, (time, cpu, mem) in enumerate(events):
        cpu_now += cpu
        mem_now += mem
        duration = events[i + 1][0] - time if i + 1 < len(events) else 0.0
        cpu_steps.append((cpu_now, duration))
        mem_steps.append((mem_now, duration))
    busy_cpu = max(_busy_level(cpu_steps, quantile), largest_cpu)
    busy_mem = max(_busy_level(mem_steps, quantile), largest_mem)
    nodes = max(
        1,
        math.ceil(busy_cpu / (fill * node_cpu) - 1e-9),
        math.ceil(busy_mem / (fill * node_mem) - 1e-9),
    )
    return nodes, node_cpu, node_mem


# --------------------------------------------------------------------------------------------
# The synthetic generator

_DAY = 86_400.0
#: Jobs a day by default: with jobs/10 scenarios holding 80 % of the jobs, ~8 daily runs each.
JOBS_PER_DAY = 60.0
RECURRING_SHARE = 0.8
JOBS_PER_SCENARIO = 10
#: Day-to-day jitter of a recurring job's rows and truth parameters (±).
DAILY_JITTER = 0.05
#: Arrival jitter around a scenario's time of day (±, seconds).
ARRIVAL_JITTER_S = 900.0
#: Share of scenarios (and of one-off jobs) that ask for too few workers.
FEW_WORKERS_SHARE = 0.05
#: Workers a well-provisioned request has at least.
MIN_WORKERS = 4
#: Manual JCT range the rows are drawn for (seconds).
JCT_RANGE_S = (20 * 60.0, 4 * 3600.0)
_MIB = 2**20
_GIB_MB = 1024


@plain_dataclass(frozen=True, slots=True)
class _Template:
    """A scenario as drawn: everything that is the same every day, before the daily jitter."""

    scenario: str
    model: ModelSpec
    batch: int
    epochs: int
    rows: float
    contention: PsContentionTruth
    roofline_seed: int
    memory: MemoryTruth
    request_workers: NodeRequest
    request_ps: NodeRequest
    quota: Quota


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def _ceil_gib(mb: float) -> int:
    return max(1, math.ceil(mb / _GIB_MB - 1e-9)) * _GIB_MB


#: Memory sizes (GiB) users write; larger requests are rounded up to a multiple of 32 GiB.
_NICE_GIB = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def _nice_gib(mb: float) -> int:
    """``mb`` rounded up to a size a user would write (MiB)."""
    gib = mb / _GIB_MB - 1e-9
    for nice in _NICE_GIB:
        if nice >= gib:
            return nice * _GIB_MB
    return math.ceil(gib / 32) * 32 * _GIB_MB


#: Bytes of one embedding value (float32).
_VALUE_BYTES = 4


def _model(rng: random.Random, rows: float) -> tuple[ModelSpec, int]:
    """A DLRM shape with about ``rows`` embedding rows in all; also its MLP size class (0-3),
    which sets its compute per sample."""
    dim = rng.choice((8, 16, 16, 32, 32, 64))
    size = rng.randrange(4)
    tables = rng.randint(8, 40)
    rows = max(tables, round(rows))
    weights = [math.exp(rng.uniform(0.0, math.log(1000.0))) for _ in range(tables)]
    scale = rows / sum(weights)
    width = 64 << size
    model = ModelSpec(
        table_sizes=tuple(max(1, round(x * scale)) for x in weights),
        embedding_dim=dim,
        dense_features=13,
        bottom_mlp=(2 * width, width, dim),
        top_mlp=(4 * width, 2 * width, 1),
    )
    return model, size


def _memory(rng: random.Random, model: ModelSpec, batch: int, ps: int) -> MemoryTruth:
    """What the pods of a job with this shape really hold, from parameters of its own (none
    taken from the planner's footprint formulas, which the planner may get wrong):

    * a PS row costs ``(dim · 4 B · (1 + slots) + entry) / load · allocator``: one or two
      optimizer slots (Adagrad, Adam), a hash-table entry of 24-64 B (key, pointer, metadata)
      at a load factor of 0.5-0.9, and an allocator overhead of 5-35 %;
    * the rows touched grow with progress and saturate at 50-100 % of the tables' rows;
      training starts with 10-30 % of the end state (pre-sized tables, the first batches);
    * a flash checkpoint's snapshot holds the dense weights and slots of every row;
    * a worker holds a runtime of 0.8-2 GiB (the framework, the input pipeline) and a batch's
      activations, 3-10 copies of B · (tables + 1) · dim · 4 B, plus its dense parameters
      and their gradients and slots.
    """
    dim = model.embedding_dim
    slots = rng.choice((1, 1, 2))
    row_state = dim * _VALUE_BYTES * (1 + slots)
    row_bytes = (row_state + rng.uniform(24.0, 64.0)) / rng.uniform(0.5, 0.9)
    row_bytes *= rng.uniform(1.05, 1.35)
    rows = model.embedding_rows
    touched = rng.uniform(0.5, 1.0)
    ps_end = rows * touched * row_bytes / _MIB
    chains = ([model.dense_features, *model.bottom_mlp], [dim, *model.top_mlp])
    dense = sum(a * b + b for chain in chains for a, b in itertools.pairwise(chain))
    activations = batch * (len(model.table_sizes) + 1) * dim * _VALUE_BYTES
    worker = (
        rng.uniform(800.0, 2048.0)
        + (activations * rng.uniform(3.0, 10.0) + dense * _VALUE_BYTES * (2 + slots)) / _MIB
    )
    imbalance = rng.uniform(0.1, 0.5) if rng.random() < 0.3 and ps > 1 else 0.0
    return MemoryTruth(
        worker_mb=worker,
        ps_start_mb=ps_end * rng.uniform(0.1, 0.3),
        ps_end_mb=ps_end,
        k=rng.uniform(2.0, 4.0),
        imbalance=imbalance,
        snapshot_mb=rows * row_state / _MIB,
    )


#: A user's PS memory request is the end-of-job peak times a log-normal guess: median 2x,
#: sigma 0.9, rounded up to a size users write; 4-7 % of the jobs then ask for less than
#: their largest PS reaches and OOM under manual configuration once it grows past it.
PS_GUESS_MEDIAN = 2.0
PS_GUESS_SIGMA = 0.9


def _template(rng: random.Random, scenario: str, *, few_workers: bool) -> _Template:
    batch = rng.choice((256, 512, 512, 1024, 1024, 2048))
    epochs = 2 if rng.random() < 0.25 else 1
    # The request a user writes: 4-16 workers, 2-8 PS (at most one per worker), 8 or 16 cores.
    workers = rng.randint(MIN_WORKERS, 16)
    ps = rng.randint(2, min(8, workers))
    worker_cpu = rng.choice((8.0, 8.0, 16.0))
    ps_cpu = rng.choice((8.0, 8.0, 16.0))
    # Model: 2-40 million embedding rows per PS the user asked for (a PS of a few GiB).
    model, size = _model(rng, _log_uniform(rng, 2e6, 4e7) * ps / 8)
    training = TrainingSpec(batch_size=batch, epochs=epochs)
    memory = _memory(rng, model, batch, ps)
    # Throughput (see truth.PsContentionTruth): compute grows with the MLP and the tables.
    compute = 1.5e-5 * (1 << size) * math.sqrt(len(model.table_sizes) / 26) * rng.uniform(0.8, 1.25)
    contention = PsContentionTruth(
        base=rng.uniform(5e-4, 2e-3),
        compute=compute,
        worker_threads=rng.uniform(6.0, 14.0),
        ps_cost=compute * rng.uniform(0.2, 0.5),
        ps_threads=rng.uniform(4.0, 10.0),
        rtt=rng.uniform(2e-4, 1e-3),
        fanout=rng.uniform(5e-5, 2e-4),
    )
    # Requests: worker memory 2-4x its real use, rounded up to a size users write; PS memory
    # a log-normal guess at the end-of-job peak (PS_GUESS_*), rounded likewise: some are short.
    worker_mem = _nice_gib(memory.worker_mb * rng.uniform(2.0, 4.0))
    guess = math.exp(rng.gauss(math.log(PS_GUESS_MEDIAN), PS_GUESS_SIGMA))
    ps_mem = _nice_gib(memory.ps_peak_mb(ps) * guess)
    # Dataset rows: the manual JCT at the (well-provisioned) request is 20 min - 4 h (20-90 min
    # for the few-worker ones, which then take several times that with 1-3 workers).
    jct = _log_uniform(rng, *JCT_RANGE_S)
    if few_workers:
        jct = _log_uniform(rng, JCT_RANGE_S[0], 1.5 * 3600.0)
    rows = contention.throughput(workers, ps, worker_cpu, ps_cpu, batch) * jct / epochs
    # Quota: 1.5-3x the well-provisioned request, never below the spec's memory floor.
    cpu = workers * worker_cpu + ps * ps_cpu
    mem = workers * worker_mem + ps * ps_mem
    floor = min_worker_memory_mb(model, training) + min_ps_memory_mb(model, 1)
    quota = Quota(
        cpu=float(math.ceil(cpu * rng.uniform(1.5, 3.0))),
        memory=_ceil_gib(max(mem * rng.uniform(1.5, 3.0), floor)) * _MIB,
    )
    if few_workers:
        workers = min(MIN_WORKERS - 1, max(1, round(workers / 3)))
    return _Template(
        scenario=scenario,
        model=model,
        batch=batch,
        epochs=epochs,
        rows=rows,
        contention=contention,
        roofline_seed=rng.getrandbits(64),
        memory=memory,
        request_workers=NodeRequest(count=workers, cpu=worker_cpu, memory=worker_mem * _MIB),
        request_ps=NodeRequest(count=ps, cpu=ps_cpu, memory=ps_mem * _MIB),
        quota=quota,
    )


def _jitter(rng: random.Random) -> float:
    return rng.uniform(1.0 - DAILY_JITTER, 1.0 + DAILY_JITTER)


def _contention_run(rng: random.Random, t: PsContentionTruth) -> PsContentionTruth:
    return PsContentionTruth(
        base=t.base * _jitter(rng),
        compute=t.compute * _jitter(rng),
        worker_threads=t.worker_threads * _jitter(rng),
        ps_cost=t.ps_cost * _jitter(rng),
        ps_threads=t.ps_threads * _jitter(rng),
        rtt=t.rtt * _jitter(rng),
        fanout=t.fanout * _jitter(rng),
    )


def _memory_run(rng: random.Random, m: MemoryTruth) -> MemoryTruth:
    start = m.ps_start_mb * _jitter(rng)
    return MemoryTruth(
        worker_mb=m.worker_mb * _jitter(rng),
        ps_start_mb=start,
        ps_end_mb=max(start, m.ps_end_mb * _jitter(rng)),
        k=m.k * _jitter(rng),
        imbalance=m.imbalance * _jitter(rng),
        snapshot_mb=m.snapshot_mb,
    )


def _time_scale(
    template: _Template, reference: PsContentionTruth, shape: RooflineTruth | TrainerTruth
) -> float:
    """The factor on every time coefficient of ``shape`` that gives it ``reference``'s
    throughput at the user's request (the step time is homogeneous of degree 1 in them)."""
    w, p = template.request_workers, template.request_ps
    want = reference.throughput(w.count, p.count, w.cpu, p.cpu, template.batch)
    have = shape.throughput(w.count, p.count, w.cpu, p.cpu, template.batch)
    return have / want


def _roofline_for(template: _Template, day: int, reference: PsContentionTruth) -> RooflineTruth:
    """A roofline truth for one run, with the same throughput as ``reference`` at the request.

    Its shape is drawn from a stream of its own (the template's ``roofline_seed`` and the day),
    so the ps-contention draws, and hence the specs, are the same whichever family is asked.
    Every time coefficient is then scaled by one factor: the step time is homogeneous of
    degree 1 in them, so the throughput at the request matches exactly.
    """
    rng = random.Random(template.roofline_seed + day)
    model = template.model
    # wire: bytes a sample pulls and pushes (one row per table, float32) over a 10-25 Gbit NIC.
    wire = len(model.table_sizes) * model.embedding_dim * 4 * 2 / (rng.uniform(1.25, 3.0) * 1e9)
    shape = RooflineTruth(
        base=rng.uniform(1e-3, 3e-3),
        compute=reference.compute * rng.uniform(0.8, 1.25),
        serial=rng.uniform(0.03, 0.15),
        wire=wire,
        ps_cost=reference.ps_cost * rng.uniform(0.8, 1.25),
        ps_threads=reference.ps_threads,
        fanout=rng.uniform(3e-4, 1e-3),
    )
    alpha = _time_scale(template, reference, shape)
    return RooflineTruth(
        base=shape.base * alpha,
        compute=shape.compute * alpha,
        serial=shape.serial,
        wire=shape.wire * alpha,
        ps_cost=shape.ps_cost * alpha,
        ps_threads=shape.ps_threads,
        fanout=shape.fanout * alpha,
    )


def _trainer_for(template: _Template, day: int, reference: PsContentionTruth) -> TrainerTruth:
    """A trainer truth for one run: the measured shape (trainer_fit) at the job's compute per
    sample, with the same throughput as ``reference`` at the request.

    The thread caps are the reference's draws. The serial fraction above one core is the
    measured one (trainer_fit.serial_at: the trainer's worker with two torch threads against
    one, at three model sizes) at the job's compute per sample, times a draw in [0.8, 1.2]
    (runs of one model differ), within [0, 1]. Every time coefficient is then scaled by one
    factor, as in :func:`_roofline_for`.
    """
    rng = random.Random(template.roofline_seed + 7919 * (day + 1))
    fit = packaged_fit()
    measured = serial_at(fit, reference.compute)
    jitter = rng.uniform(0.8, 1.2)
    serial = rng.uniform(0.03, 0.15) if measured is None else min(1.0, measured * jitter)
    shape = trainer_truth(
        fit,
        compute=reference.compute,
        worker_threads=reference.worker_threads,
        ps_threads=reference.ps_threads,
        serial=serial,
    )
    alpha = _time_scale(template, reference, shape)
    return TrainerTruth(
        base=shape.base * alpha,
        compute=shape.compute * alpha,
        alpha=shape.alpha,
        serial=shape.serial,
        worker_threads=shape.worker_threads,
        ps_work=shape.ps_work * alpha,
        critical=shape.critical,
        ps_threads=shape.ps_threads,
    )


def _arrivals(rng: random.Random, runs: int, span_s: float) -> list[float]:
    """A daily job's arrivals: same time of day on consecutive days (or evenly spaced, more
    often than daily, when the span is shorter than the runs), ± ARRIVAL_JITTER_S."""
    period = min(_DAY, span_s / runs)
    start = rng.uniform(0.0, span_s - (runs - 1) * period)
    out = []
    for k in range(runs):
        t = start + k * period + rng.uniform(-ARRIVAL_JITTER_S, ARRIVAL_JITTER_S)
        out.append(min(max(t, 0.0), math.nextafter(span_s, 0.0)))
    return out


def synthetic_trace(
    jobs: int, seed: int, *, family: str = "ps-contention", days: float | None = None
) -> list[TraceJob]:
    """``jobs`` jobs calibrated to the paper's setting (see the module docstring), sorted by
    arrival, ids ``job-00000`` onwards; the same for the same ``seed`` and arguments.

    ``family`` picks the truth's throughput family; the jobs are otherwise the same.
    ``days`` spreads the arrivals (default ``jobs / 60``, at least one day).
    """
    if jobs < 0:
        raise ValueError(f"jobs: must be >= 0, got {jobs}")
    if family not in FAMILIES:
        raise ValueError(f"family: {family!r} is not one of {', '.join(FAMILIES)}")
    span_days = max(1.0, jobs / JOBS_PER_DAY) if days is None else days
    if not span_days > 0 or not math.isfinite(span_days):
        raise ValueError(f"days: must be a positive number, got {days!r}")
    span_s = span_days * _DAY
    rng = random.Random(seed)
    n_recurring = round(RECURRING_SHARE * jobs)
    n_scenarios = min(n_recurring, max(1, round(jobs / JOBS_PER_SCENARIO)))
    n_recurring = n_recurring if n_scenarios else 0
    n_once = jobs - n_recurring

    def flags(n: int) -> list[bool]:
        n_few = round(FEW_WORKERS_SHARE * n)
        out = [i < n_few for i in range(n)]
        rng.shuffle(out)
        return out

    # (template, day, arrival) for every run, in a fixed draw order.
    runs: list[tuple[_Template, int, float]] = []
    for s, few in enumerate(flags(n_scenarios)):
        template = _template(rng, f"rec-{s:04d}", few_workers=few)
        count = n_recurring // n_scenarios + (s < n_recurring % n_scenarios)
        runs.extend((template, day, t) for day, t in enumerate(_arrivals(rng, count, span_s)))
    for i, few in enumerate(flags(n_once)):
        template = _template(rng, f"once-{i:05d}", few_workers=few)
        runs.append((template, 0, rng.uniform(0.0, span_s)))

    drafts: list[tuple[float, str, JobSpec, JobTruth]] = []
    for template, day, arrival in runs:
        contention = _contention_run(rng, template.contention)
        memory = _memory_run(rng, template.memory)
        rows = max(1, round(template.rows * _jitter(rng)))
        spec = JobSpec(
            name=template.scenario,
            scenario=template.scenario,
            model=template.model,
            data=SyntheticData(rows=rows, seed=day),
            training=TrainingSpec(batch_size=template.batch, epochs=template.epochs),
            resources=ResourcesSpec(
                limits=template.quota,
                workers=template.request_workers,
                ps=template.request_ps,
            ),
            elastic=ElasticSpec(),
        )
        throughput: PsContentionTruth | RooflineTruth | TrainerTruth = contention
        if family == "roofline":
            throughput = _roofline_for(template, day, contention)
        elif family == "trainer":
            throughput = _trainer_for(template, day, contention)
        drafts.append(
            (arrival, template.scenario, spec, JobTruth(throughput=throughput, memory=memory))
        )

    order = sorted(range(len(drafts)), key=lambda i: drafts[i][0])
    return [
        TraceJob(
            id=f"job-{rank:05d}",
            scenario=drafts[i][1],
            arrival_s=drafts[i][0],
            spec=drafts[i][2],
            truth=drafts[i][3],
        )
        for rank, i in enumerate(order)
    ]


__all__ = [
    "FAMILIES",
    "QUOTA_REGIMES",
    "TRACE_VERSION",
    "Calibration",
    "QuotaRegime",
    "TraceHeader",
    "TraceJob",
    "calibration",
    "cluster_size_for",
    "in_regime",
    "manual_jct",
    "manual_oom_progress",
    "manual_throughput",
    "read_trace",
    "request_quota",
    "synthetic_trace",
    "write_trace",
]
