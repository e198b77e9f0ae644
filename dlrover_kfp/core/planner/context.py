"""What the planner needs to know about a job, read once from its spec."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dlrover_kfp.core.footprint import RUNTIME_MB, min_ps_memory_mb, min_worker_memory_mb
from dlrover_kfp.core.plan import NodeGroup
from dlrover_kfp.core.planner.quota_rule import job_quota
from dlrover_kfp.core.planner.settings import NodeLimits, PlannerSettings
from dlrover_kfp.core.spec import JobSpec


@dataclass(frozen=True, slots=True)
class PlanningContext:
    """The bounds every plan for one job must respect."""

    quota_cpu: float
    quota_memory_mb: int
    min_workers: int
    max_workers: int
    min_ps: int
    max_ps: int
    batch_size: int
    #: floor of a worker's memory (MiB), from the model's shape
    worker_memory_floor_mb: int
    #: what a worker of this model needs at least (MiB), the node minimum left out: the bar a
    #: plan's workers must clear (:func:`~dlrover_kfp.core.planner.quota.require_runnable`)
    worker_memory_need_mb: int
    #: embedding rows and optimizer slots of the whole model (MiB), spread over the PS
    ps_state_mb: int
    dataset_rows: int | None
    node: NodeLimits
    #: samples the whole job trains (dataset rows x epochs): a sample's progress is
    #: ``global_step · batch_size / total_samples`` (None: the rows are not known, so the job's
    #: progress and the growth of its PS memory over it cannot be measured)
    total_samples: int | None = None

    def ps_memory_floor_mb(self, ps_count: int) -> int:
        """Per-PS floor: runtime + its share of the rows (they re-partition with the count)."""
        return RUNTIME_MB + math.ceil(self.ps_state_mb / max(1, ps_count))

    def fits(self, workers: NodeGroup, ps: NodeGroup) -> bool:
        """Whether both groups together stay within the quota's CPU and memory."""
        return (
            workers.total_cpu + ps.total_cpu <= self.quota_cpu + 1e-9
            and workers.total_memory_mb + ps.total_memory_mb <= self.quota_memory_mb
        )

    def workers_that_fit(self, workers: NodeGroup, ps: NodeGroup) -> NodeGroup:
        """``workers`` with as many pods given up (never below ``min_workers``) as the quota
        needs: workers are the elastic role, so they make room first."""
        count = workers.count
        while count > self.min_workers and not self.fits(
            NodeGroup(count=count, cpu=workers.cpu, memory_mb=workers.memory_mb), ps
        ):
            count -= 1
        return NodeGroup(count=count, cpu=workers.cpu, memory_mb=workers.memory_mb)

    def dominant_share(self, cpu: float, memory_mb: float) -> float:
        """Cost of an allocation: its dominant share of the quota (as DRF defines it)."""
        return max(cpu / self.quota_cpu, memory_mb / self.quota_memory_mb)


def context_from_spec(spec: JobSpec, settings: PlannerSettings) -> PlanningContext:
    """The bounds of ``spec``'s plans; its quota is :func:`job_quota`'s, the rule the
    simulator's baseline policies call too."""
    quota = job_quota(spec, settings)
    one_ps = min_ps_memory_mb(spec.model, 1)
    worker_need = min_worker_memory_mb(spec.model, spec.training)
    return PlanningContext(
        quota_cpu=quota.cpu,
        quota_memory_mb=quota.memory_mb,
        min_workers=spec.elastic.min_workers,
        max_workers=spec.elastic.max_workers,
        min_ps=spec.elastic.min_ps,
        max_ps=spec.elastic.max_ps,
        batch_size=spec.training.batch_size,
        worker_memory_floor_mb=max(settings.node.min_memory_mb, worker_need),
        worker_memory_need_mb=worker_need,
        ps_state_mb=one_ps - RUNTIME_MB,
        dataset_rows=spec.dataset_rows,
        node=settings.node,
        total_samples=spec.dataset_rows * spec.training.epochs if spec.dataset_rows else None,
    )


def round_up(value: float, step: float) -> float:
    """Round up to a multiple of ``step`` (with a tolerance for float noise)."""
    return math.ceil(value / step - 1e-9) * step


def round_down(value: float, step: float) -> float:
    return math.floor(value / step + 1e-9) * step


def clamp_cpu(cpu: float, node: NodeLimits) -> float:
    return min(node.max_cpu, max(node.min_cpu, round_up(cpu, node.cpu_step)))


def clamp_memory(memory_mb: float, node: NodeLimits) -> int:
    """A pod's memory within the node's clamps, rounded up to the memory step."""
    return _clamp(memory_mb, node, node.memory_step_mb)


def clamp_worker_memory(memory_mb: float, node: NodeLimits) -> int:
    """A worker's memory sized from its measured use, rounded up to the worker step
    (settings.NodeLimits.worker_memory_step_mb says why it is finer)."""
    return _clamp(memory_mb, node, node.worker_memory_step_mb)


def _clamp(memory_mb: float, node: NodeLimits, step_mb: int) -> int:
    rounded = int(round_up(memory_mb, step_mb))
    return min(node.max_memory_mb, max(node.min_memory_mb, rounded))
