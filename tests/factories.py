"""Builders of valid contract objects for tests, with realistic runtime samples.

``make_profile`` builds a :class:`JobProfile` the way the runtime would record one: a plan
applied at time 0, then ``samples`` runtime samples at ``interval_s`` apart in which every pod
reports CPU and memory used against what it requested. Usage ramps up linearly and reaches its
peak at the last sample, so a test knows the summary's peaks exactly:

* peak worker CPU used  = ``worker_cpu * worker_cpu_used_fraction``
* peak PS CPU used      = ``ps_cpu * ps_cpu_used_fraction``
* peak memory used      = ``memory_mb * memory_used_fraction`` (rounded down, per role)
* peak total PS CPU     = ``ps * ps_cpu * ps_cpu_used_fraction``

The three fractions default to ``used_fraction`` (0.3: the ~20-30% utilisation of manually
configured jobs that the paper reports). ``hot_ps`` makes PS 0 use ``hot_ps_fraction`` of its CPU
instead (a hot PS for post-scaling tests).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime

from dlrover_kfp.core.plan import NodeGroup, Stage
from dlrover_kfp.core.profile import (
    AppliedPlan,
    EventKind,
    JobEvent,
    JobProfile,
    Metrics,
    NodeSample,
    Outcome,
    ProfileData,
    ProfileJob,
    ProfileRequest,
    ProfileTraining,
    RuntimeSample,
)
from dlrover_kfp.core.spec import ModelSpec, NodeRequest

DEFAULT_TABLES = (100_000, 50_000, 20_000, 5_000)
#: make_profile's pods for a job that asked for far more than it uses: 8 workers of 8 cpu /
#: 16 GiB and 4 PS of 8 cpu / 32 GiB (the warm-start and CLI tests' daily job).
OVER_PROVISIONED_PODS = {
    "workers": 8,
    "worker_cpu": 8.0,
    "worker_memory_mb": 16384,
    "ps": 4,
    "ps_cpu": 8.0,
    "ps_memory_mb": 32768,
}
#: A bare number in a memory quantity is bytes (as in Kubernetes).
MIB = 2**20


def iso(moment: str | float | datetime) -> str:
    """An ISO 8601 UTC text from epoch seconds, a datetime or (unchanged) a string."""
    if isinstance(moment, str):
        return moment
    if isinstance(moment, datetime):
        value = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return datetime.fromtimestamp(moment, UTC).isoformat().replace("+00:00", "Z")


def make_model(
    table_sizes: Sequence[int] = DEFAULT_TABLES, embedding_dim: int = 16, dense_features: int = 13
) -> ModelSpec:
    return ModelSpec(
        table_sizes=tuple(table_sizes),
        embedding_dim=embedding_dim,
        dense_features=dense_features,
        bottom_mlp=(64, 32, embedding_dim),
        top_mlp=(64, 32, 1),
    )


def make_profile(
    run_id: str = "run-0001",
    *,
    scenario: str | None = "ads-ctr",
    started_at: str | float | datetime = "2026-11-01T00:00:00Z",
    name: str = "ctr-daily",
    model: ModelSpec | None = None,
    table_sizes: Sequence[int] = DEFAULT_TABLES,
    embedding_dim: int = 16,
    dataset_rows: int = 200_000,
    batch_size: int = 512,
    epochs: int = 1,
    workers: int = 4,
    worker_cpu: float = 4.0,
    worker_memory_mb: int = 8192,
    ps: int = 2,
    ps_cpu: float = 4.0,
    ps_memory_mb: int = 16384,
    used_fraction: float = 0.3,
    worker_cpu_used_fraction: float | None = None,
    ps_cpu_used_fraction: float | None = None,
    memory_used_fraction: float | None = None,
    hot_ps: bool = False,
    hot_ps_fraction: float = 0.95,
    samples: int = 5,
    interval_s: float = 60.0,
    throughput: float = 20_000.0,
    status: str = "succeeded",
    reason: str = "",
    jct_seconds: float | None = None,
    stage: Stage = Stage.COLD_START,
    with_request: bool = True,
    oom_events: int = 0,
    events: Sequence[JobEvent] = (),
    loss: float | None = 0.45,
    auc: float | None = 0.78,
) -> JobProfile:
    """A valid profile of one run; see the module docstring for what the samples contain.

    ``oom_events`` adds that many OOM events on ``worker-0`` (after ``events``), at times spread
    over the run. ``samples=0`` gives a profile without runtime samples (a job that died early).
    """
    spec_model = model or make_model(table_sizes, embedding_dim)
    w_frac = used_fraction if worker_cpu_used_fraction is None else worker_cpu_used_fraction
    p_frac = used_fraction if ps_cpu_used_fraction is None else ps_cpu_used_fraction
    m_frac = used_fraction if memory_used_fraction is None else memory_used_fraction
    worker_group = NodeGroup(count=workers, cpu=float(worker_cpu), memory_mb=worker_memory_mb)
    ps_group = NodeGroup(count=ps, cpu=float(ps_cpu), memory_mb=ps_memory_mb)

    runtime = tuple(
        _sample(
            index=i,
            total=samples,
            interval_s=interval_s,
            throughput=throughput,
            batch_size=batch_size,
            workers=worker_group,
            ps=ps_group,
            worker_cpu_fraction=w_frac,
            ps_cpu_fraction=p_frac,
            memory_fraction=m_frac,
            hot_ps_fraction=hot_ps_fraction if hot_ps else None,
        )
        for i in range(samples)
    )
    duration = jct_seconds if jct_seconds is not None else max(samples, 1) * interval_s
    all_events = list(events)
    for k in range(oom_events):
        all_events.append(
            JobEvent(
                time=duration * (k + 1) / (oom_events + 1),
                kind=_OOM,
                node="worker-0",
                detail="OOMKilled (exit 137)",
            )
        )
    request = (
        ProfileRequest(
            workers=NodeRequest(count=workers, cpu=worker_cpu, memory=worker_memory_mb * MIB),
            ps=NodeRequest(count=ps, cpu=ps_cpu, memory=ps_memory_mb * MIB),
        )
        if with_request and workers > 0 and ps > 0
        else None
    )
    return JobProfile(
        run_id=run_id,
        started_at=iso(started_at),
        job=ProfileJob(
            name=name,
            scenario=scenario,
            model=spec_model,
            data=ProfileData(rows=dataset_rows, format="synthetic"),
            training=ProfileTraining(batch_size=batch_size, epochs=epochs, learning_rate=0.05),
            resources=request,
        ),
        outcome=Outcome(
            status="failed" if status == "failed" else "succeeded",
            jct_seconds=float(duration),
            samples_processed=int(throughput * duration) if status != "failed" else 0,
            reason=reason,
        ),
        plans=(
            AppliedPlan(
                time=0.0,
                stage=stage,
                reason="test plan",
                workers=worker_group,
                ps=ps_group,
            ),
        ),
        samples=runtime,
        events=tuple(all_events),
        metrics=Metrics(loss=loss, auc=auc),
    )


def node_sample(
    name: str,
    role: str,
    *,
    cpu_used: float,
    cpu_requested: float = 0.5,
    memory_used_mb: int = 300,
    memory_requested_mb: int = 1024,
    throughput: float | None = None,
    cpu_throttled: float | None = None,
) -> NodeSample:
    """One pod's reading in a runtime sample; the defaults are a small job's pod (0.5 CPU,
    1 GiB) using 300 MiB."""
    return NodeSample(
        name=name,
        role=role,  # type: ignore[arg-type]
        cpu_used=cpu_used,
        cpu_requested=cpu_requested,
        memory_used_mb=memory_used_mb,
        memory_requested_mb=memory_requested_mb,
        throughput=throughput,
        cpu_throttled=cpu_throttled,
    )


def runtime_sample(
    time: float,
    nodes: Sequence[NodeSample],
    *,
    throughput: float,
    global_step: int = 0,
    workers: int = 2,
    ps: int = 2,
    cpu: float = 0.5,
) -> RuntimeSample:
    """A runtime sample of a job of ``workers`` + ``ps`` pods of ``cpu`` cores each."""
    return RuntimeSample(
        time=time,
        global_step=global_step,
        throughput=throughput,
        workers=workers,
        ps=ps,
        worker_cpu=cpu,
        ps_cpu=cpu,
        nodes=tuple(nodes),
    )


_OOM: EventKind = "oom"


def _sample(
    *,
    index: int,
    total: int,
    interval_s: float,
    throughput: float,
    batch_size: int,
    workers: NodeGroup,
    ps: NodeGroup,
    worker_cpu_fraction: float,
    ps_cpu_fraction: float,
    memory_fraction: float,
    hot_ps_fraction: float | None,
) -> RuntimeSample:
    # Linear ramp from 60% of the final usage to 100% at the last sample.
    ramp = 1.0 if total <= 1 else 0.6 + 0.4 * index / (total - 1)
    nodes: list[NodeSample] = []
    for k in range(workers.count):
        nodes.append(
            NodeSample(
                name=f"worker-{k}",
                role="worker",
                cpu_used=workers.cpu * worker_cpu_fraction * ramp,
                cpu_requested=workers.cpu,
                memory_used_mb=math.floor(workers.memory_mb * memory_fraction * ramp),
                memory_requested_mb=workers.memory_mb,
                throughput=throughput / workers.count,
            )
        )
    for k in range(ps.count):
        fraction = hot_ps_fraction if (hot_ps_fraction is not None and k == 0) else ps_cpu_fraction
        nodes.append(
            NodeSample(
                name=f"ps-{k}",
                role="ps",
                cpu_used=ps.cpu * fraction * ramp,
                cpu_requested=ps.cpu,
                memory_used_mb=math.floor(ps.memory_mb * memory_fraction * ramp),
                memory_requested_mb=ps.memory_mb,
            )
        )
    time_s = (index + 1) * interval_s
    return RuntimeSample(
        time=time_s,
        global_step=int(throughput * time_s / max(batch_size * max(workers.count, 1), 1)),
        throughput=throughput,
        workers=workers.count,
        ps=ps.count,
        worker_cpu=workers.cpu,
        ps_cpu=ps.cpu,
        nodes=tuple(nodes),
    )
