"""The job profile: what a finished (or failed) run leaves behind for the next one.

Schema version 1. Fields may be added in later versions but never renamed or removed; a reader
of version N accepts every version <= N. Times are seconds since the job started; ``started_at``
anchors them to the wall clock (ISO 8601, UTC).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from dlrover_kfp.core.plan import NodeGroup, Stage
from dlrover_kfp.core.spec import CriteoData, JobSpec, ModelSpec, NodeRequest, Quota, TableData
from dlrover_kfp.core.types import (
    CONTRACT_CONFIG,
    CoresValue,
    MemoryMb,
    NonNegFloat,
    NonNegInt,
    PosInt,
    Seconds,
    Str,
)

SCHEMA_VERSION: Literal[1] = 1


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class ProfileData:
    rows: NonNegInt
    path: Str | None = None
    format: Str | None = None


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class ProfileTraining:
    batch_size: PosInt
    epochs: PosInt
    learning_rate: NonNegFloat | None = None


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class ProfileRequest:
    """The user's own resources from the spec, kept to compare plans against."""

    limits: Quota | None = None
    workers: NodeRequest | None = None
    ps: NodeRequest | None = None


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class ProfileJob:
    """The features that make two jobs similar."""

    name: Str
    model: ModelSpec
    data: ProfileData
    training: ProfileTraining
    scenario: Str | None = None
    resources: ProfileRequest | None = None


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class AppliedPlan:
    time: Seconds
    stage: Stage
    reason: Str
    workers: NodeGroup
    ps: NodeGroup


Role = Literal["worker", "ps"]


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class NodeSample:
    """One pod at one sample time: what it used against what it was given."""

    name: Str
    role: Role
    cpu_used: CoresValue
    cpu_requested: CoresValue
    memory_used_mb: MemoryMb
    memory_requested_mb: MemoryMb
    throughput: NonNegFloat | None = Field(
        default=None, description="samples/s this worker processed (workers only)"
    )
    cpu_throttled: float | None = Field(
        default=None,
        ge=0,
        le=1,
        strict=True,
        description="share of the sample's CFS periods (of wall time) in which the pod had run "
        "its whole CPU quota and waited for the next; absent where the backend cannot see it",
    )


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class RuntimeSample:
    time: Seconds
    global_step: NonNegInt
    throughput: NonNegFloat = Field(description="samples/s, all workers together")
    workers: NonNegInt
    ps: NonNegInt
    worker_cpu: CoresValue = Field(description="CPU requested per worker (cores)")
    ps_cpu: CoresValue = Field(description="CPU requested per PS (cores)")
    nodes: tuple[NodeSample, ...] = ()
    loss: float | None = Field(
        default=None, description="mean training loss of the samples trained since the last one"
    )


EventKind = Literal["oom", "relaunch", "migration", "straggler", "scale", "failure"]


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class JobEvent:
    time: Seconds
    kind: EventKind
    node: Str | None = None
    detail: Str = ""


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class Outcome:
    """How a run ended. ``cancelled``: a user stopped it (an orchestrator's "mark failed",
    ``dlrover-kfp`` told to cancel), not a fault of the job; its partial measurements are kept."""

    status: Literal["succeeded", "failed", "cancelled"]
    jct_seconds: NonNegFloat
    samples_processed: NonNegInt
    reason: Str = ""


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class Metrics:
    """Final metrics. ``loss`` and ``auc`` are measured on the held-out split."""

    loss: float | None = None
    auc: float | None = None
    train_loss: float | None = Field(default=None, description="mean loss of the last shards")
    eval_rows: NonNegInt | None = None
    bad_rows: NonNegInt | None = Field(default=None, description="input rows skipped as malformed")
    applied_twice: dict[Str, NonNegInt] | None = Field(
        default=None,
        description=(
            "samples whose gradients the PS applied more than once (a shard trained again after"
            " a worker stopped part-way through it), by why the shard was given back: the event"
            " kind the worker was stopped for, relaunch (it ended on its own), rollback or"
            " resume (in flight at the checkpoint gone back to); {} when none"
        ),
    )


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class LimitEnforcement:
    """Whether the pods' requests were hard limits during the run. With ``cpu`` False a pod
    could use more CPU than it asked for, so its samples say little about what its request
    buys: the resource-performance model must not be fitted on them as if it had."""

    cpu: bool
    detail: Str = Field(default="", description="how limits were enforced, or why they were not")


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class JobProfile:
    """Everything the history keeps about one run."""

    run_id: Str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")
    started_at: Str = Field(description="ISO 8601 UTC wall-clock time of job start")
    job: ProfileJob
    outcome: Outcome
    schema_version: Literal[1] = SCHEMA_VERSION
    plans: tuple[AppliedPlan, ...] = ()
    samples: tuple[RuntimeSample, ...] = ()
    events: tuple[JobEvent, ...] = ()
    metrics: Metrics = Metrics()
    limits: LimitEnforcement | None = Field(
        default=None, description="how the backend enforced the pods' limits (None: unknown)"
    )


def profile_job(spec: JobSpec, rows: int | None = None) -> ProfileJob:
    """The similarity features of ``spec`` as a profile records them (``rows``: if measured)."""
    res = spec.resources
    data_rows = rows if rows is not None else (spec.dataset_rows or 0)
    path = spec.data.path if isinstance(spec.data, CriteoData | TableData) else None
    return ProfileJob(
        name=spec.name,
        scenario=spec.scenario,
        model=spec.model,
        data=ProfileData(rows=data_rows, format=spec.data.format, path=path),
        training=ProfileTraining(
            batch_size=spec.training.batch_size,
            epochs=spec.training.epochs,
            learning_rate=spec.training.learning_rate,
        ),
        resources=ProfileRequest(limits=res.limits, workers=res.workers, ps=res.ps),
    )
