"""A job's quota: the one rule, called by the planner and by every policy of the simulator.

    quota = resources.limits                  when the spec sets them
          = PlannerSettings.default_quota     otherwise (32 cores, 128 GiB)
    then, per resource, min(quota, PlannerSettings.capacity) where a capacity is set

Without ``limits`` the quota is the default, not the user's request when that is larger: the
default is what docs/contracts.md promises for an unset ``limits`` ("the quota no plan
exceeds"), and a request above it is cut to it like any plan (cold start, docs/planner.md).
A user's own resources still run as written on a static run (:func:`~dlrover_kfp.core.planner.
quota.require_runnable` checks only ``limits``): the quota caps what a planner plans.

The simulator's baselines (Optimus, open-source DLRover) once raised the default to the
request; neither peer's paper defines a quota rule (docs/baselines.md: both only read
``quota_cpu``), so every policy gets the planner's quota and a comparison between them is a
comparison of their decisions, not of the room they were given. Pure: no I/O.

This module sits apart from :mod:`~dlrover_kfp.core.planner.quota` (fitting a plan into the
quota), which imports the planning context; the context imports this rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlrover_kfp.core.planner.settings import PlannerSettings
from dlrover_kfp.core.spec import JobSpec


@dataclass(frozen=True, slots=True)
class JobQuota:
    """The most CPU (cores) and memory (MiB) one job's pods may hold at once, all together."""

    cpu: float
    memory_mb: int


def job_quota(spec: JobSpec, settings: PlannerSettings) -> JobQuota:
    """The quota of ``spec`` under ``settings`` (the module docstring's rule)."""
    limits = spec.resources.limits
    if limits is not None:
        cpu, memory_mb = float(limits.cpu), int(limits.memory)
    else:
        cpu, memory_mb = float(settings.default_quota.cpu), settings.default_quota.memory_mb
    capacity = settings.capacity
    if capacity is not None:
        # No plan holds more than the backend has, whatever the quota says (a machine's cores).
        cpu, memory_mb = min(cpu, capacity.cpu), min(memory_mb, capacity.memory_mb)
    return JobQuota(cpu=cpu, memory_mb=memory_mb)


__all__ = ["JobQuota", "job_quota"]
