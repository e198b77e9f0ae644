"""The resource plan: what a job should run with, which stage decided it, and why."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, Strict
from pydantic.dataclasses import dataclass

from dlrover_kfp.core.types import CONTRACT_CONFIG, CoresValue, MemoryMb, NonNegFloat, Str


class Stage(StrEnum):
    """Which planner stage produced a plan.

    cold_start -> (auto_scale | post_scale)*      a job with no similar history
    warm_start -> (auto_scale | post_scale)*      a job planned from similar finished jobs
    manual                                        the spec's own resources, kept to the end
                                                  (a ``--static`` run, like a plain TFJob)
    """

    COLD_START = "cold_start"
    WARM_START = "warm_start"
    AUTO_SCALE = "auto_scale"
    POST_SCALE = "post_scale"
    MANUAL = "manual"


#: Most pods in a group: what a spec may ask for (``spec.MAX_SIZE``, which imports this
#: module), so that ``count * cpu`` stays exact and finite in float arithmetic.
MAX_PODS = 2**53


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class NodeGroup:
    """A role's pods: how many, and the CPU (cores) and memory (MiB) of each.

    Every number is finite and bounded (a plan arrives as JSON, where Python reads
    ``Infinity`` and ``NaN``): an error names the field.
    """

    count: Annotated[int, Strict(), Field(ge=0, le=MAX_PODS)]
    cpu: CoresValue
    memory_mb: MemoryMb

    @property
    def total_cpu(self) -> float:
        return self.count * self.cpu

    @property
    def total_memory_mb(self) -> int:
        return self.count * self.memory_mb

    def text(self) -> str:
        """``2x0.5cpu/1024Mi``: how a table or a message names the group."""
        return f"{self.count}x{self.cpu:g}cpu/{self.memory_mb}Mi"


ActionKind = Literal["migrate_ps", "relaunch", "replace_worker", "reassign_shards"]


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class NodeAction:
    """A post-scaling action on one pod, applied by the runtime on top of the group sizes.

    ``migrate_ps``: start a bigger PS, move its rows, switch workers, delete the old one.
    ``relaunch``: restart the pod with the given resources (after or ahead of an OOM, or when
    it has been pending too long). ``replace_worker``: a persistent straggler gets a new pod.
    ``reassign_shards``: a slow worker's leased data shards go back to the queue.
    """

    kind: ActionKind
    node: Str
    reason: Str
    cpu: CoresValue | None = None
    memory_mb: MemoryMb | None = None


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class ResourcePlan:
    workers: NodeGroup
    ps: NodeGroup
    stage: Stage
    reason: Str
    predicted_throughput: NonNegFloat | None = Field(default=None, description="samples/s")
    similar_jobs: tuple[Str, ...] = Field(default=(), description="history ids used by warm start")
    actions: tuple[NodeAction, ...] = ()

    @property
    def total_cpu(self) -> float:
        return self.workers.total_cpu + self.ps.total_cpu

    @property
    def total_memory_mb(self) -> int:
        return self.workers.total_memory_mb + self.ps.total_memory_mb

    def same_resources(self, other: ResourcePlan) -> bool:
        """True when both plans ask for the same pods (stage, reason and actions aside)."""
        return self.workers == other.workers and self.ps == other.ps
