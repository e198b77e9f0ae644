"""A throughput measurement at one configuration: the resource-performance model's data point."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Config:
    """A job's shape for the model: ``w`` workers and ``p`` PS with ``λw`` and ``λp`` cores each."""

    workers: int
    ps: int
    worker_cpu: float
    ps_cpu: float

    @property
    def total_cpu(self) -> float:
        return self.workers * self.worker_cpu + self.ps * self.ps_cpu


@dataclass(frozen=True, slots=True)
class Observation:
    """Throughput (samples/s, all workers) measured at ``config`` with per-worker batch size.

    ``worker_cpu_used`` / ``ps_cpu_used`` are mean cores used per pod when known; the planner
    reads them to tell a CPU-bound role from one that idles on what it was given.
    """

    config: Config
    batch_size: int
    throughput: float
    worker_cpu_used: float | None = None
    ps_cpu_used: float | None = None
