"""The relaunch policy: what the job master does when one of its pods stops.

A pure function of the pod's exit and the pod's earlier failures; the job master applies the
decision through its cluster backend.

    completed (exit 0)                         -> nothing to relaunch
    evicted, preempted, deleted by someone
      else, node lost                          -> relaunch as it was; not counted
    OOM-killed                                 -> relaunch with memory x oom_memory_factor
                                                  (at most +oom_max_step_mb, at most the node's
                                                  maximum, at most what the job's memory quota
                                                  leaves); counted
    error exit, could not start                -> relaunch as it was; counted
    the pod's counted failures within
      failure_window_s reach max_failures      -> the job fails, naming the pod and its exit
                                                  codes
    OOM-killed with the node's maximum memory  -> the job fails (more memory cannot be had)

"Counted" failures are the pod's own: its process or its input is at fault. Stops that come
from outside (the cluster reclaiming the node, an operator deleting the pod) say nothing about
the job and are relaunched however often they happen. A straggling worker and a memory trend
toward the limit are not stops: Stage 3 (:mod:`.post_scale`) handles them while the pod runs.

The pod's failure count is kept per pod *name* (``worker-3``), across its incarnations: a
relaunched pod that fails the same way is the same problem.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from dlrover_kfp.core.planner.context import clamp_memory
from dlrover_kfp.core.planner.settings import NodeLimits, PlannerSettings, PostScaleSettings
from dlrover_kfp.core.profile import Role


class ExitCause(StrEnum):
    """Why a pod stopped, in the job master's terms (a backend maps its own reasons here)."""

    COMPLETED = "completed"
    ERROR = "error"
    OOM_KILLED = "oom_killed"
    START_ERROR = "start_error"
    EVICTED = "evicted"
    PREEMPTED = "preempted"
    DELETED = "deleted"
    NODE_LOST = "node_lost"

    @property
    def counted(self) -> bool:
        """Whether a stop of this kind counts against the job (the pod's own fault)."""
        return self in (ExitCause.ERROR, ExitCause.OOM_KILLED, ExitCause.START_ERROR)


@dataclass(frozen=True, slots=True, kw_only=True)
class PodExit:
    """One pod's stop, with the resources it had."""

    node: str
    role: Role
    cause: ExitCause
    exit_code: int | None
    time: float
    cpu: float
    memory_mb: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Relaunch:
    """Start ``node`` again with these resources. ``counted``: the stop was the pod's own."""

    node: str
    cpu: float
    memory_mb: int
    counted: bool
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FailJob:
    """Stop the job: ``reason`` names the pod and its exit codes."""

    node: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class NoRelaunch:
    """The pod finished its work; nothing to do."""

    node: str
    reason: str


RelaunchDecision = Relaunch | FailJob | NoRelaunch


def oom_wanted_memory(requested_mb: int, s: PostScaleSettings) -> float:
    """Memory an OOM at ``requested_mb`` calls for, before any pod limit:

    wanted = min(requested x oom_memory_factor, requested + oom_max_step_mb)

    Stage 3 compares it with the node's maximum to choose between more memory per PS and more
    PS (post_scale.ps_oom_adds_ps)."""
    return min(requested_mb * s.oom_memory_factor, requested_mb + s.oom_max_step_mb)


def oom_grown_memory(requested_mb: int, s: PostScaleSettings, node: NodeLimits) -> int:
    """Memory for a pod that was OOM-killed at ``requested_mb``: the one rule, used by Stage 3
    and by the relaunch policy: :func:`oom_wanted_memory` clamped to the node's memory range
    and step."""
    return clamp_memory(oom_wanted_memory(requested_mb, s), node)


def decide_relaunch(
    stop: PodExit,
    earlier: Sequence[PodExit],
    settings: PlannerSettings,
    *,
    memory_room_mb: int | None = None,
) -> RelaunchDecision:
    """What to do about ``stop``, given the job's ``earlier`` stops (any pods, any order).

    Only ``earlier`` stops of the same pod name, counted, and within ``failure_window_s``
    before ``stop`` count toward ``max_failures``; ``stop`` itself counts when it is counted.

    ``memory_room_mb``: MiB the job's memory quota leaves beyond its pods' (the stopped one's
    included); None: no quota to keep. An OOM-killed pod grows by at most that much, rounded
    down to the node's memory step. With no room it is relaunched as it was: the OOM is in the
    job's events, where Stage 3 may reshape the job within its quota (fewer workers, more PS);
    if it is killed again, that counts toward ``max_failures`` like any other failure.
    """
    r = settings.relaunch
    if stop.cause is ExitCause.COMPLETED:
        return NoRelaunch(node=stop.node, reason=f"{stop.node} completed (exit code 0)")
    if not stop.cause.counted:
        return Relaunch(
            node=stop.node,
            cpu=stop.cpu,
            memory_mb=stop.memory_mb,
            counted=False,
            reason=f"{stop.node} {_describe(stop)}: relaunched as it was, not counted against "
            f"the job",
        )
    recent = sorted(
        (
            e
            for e in earlier
            if e.node == stop.node
            and e.cause.counted
            and stop.time - r.failure_window_s < e.time <= stop.time
            and e is not stop
        ),
        key=lambda e: e.time,
    )
    failures = [*recent, stop]
    oom = stop.cause is ExitCause.OOM_KILLED
    # Less than one memory step left in the job's quota: an OOM-killed pod cannot grow.
    no_room = oom and memory_room_mb is not None and memory_room_mb < settings.node.memory_step_mb
    if len(failures) >= r.max_failures:
        codes = ", ".join(_code(e) for e in failures)
        last = f"{_describe(stop)} at {stop.memory_mb}Mi" if oom else _describe(stop)
        why = (
            f"{stop.node} failed {len(failures)} times within {r.failure_window_s:g} s (exit "
            f"codes {codes}; last: {last}); the job stops (relaunch.max_failures = "
            f"{r.max_failures})"
        )
        if no_room:
            why += (
                f"; the job's memory quota leaves no room for more ({memory_room_mb}Mi free): "
                "raise resources.limits.memory"
            )
        return FailJob(node=stop.node, reason=why)
    count = f"failure {len(failures)} of {r.max_failures} within {r.failure_window_s:g} s"
    if oom:
        grown = oom_grown_memory(stop.memory_mb, settings.post_scale, settings.node)
        if grown <= stop.memory_mb:
            return FailJob(
                node=stop.node,
                reason=f"{stop.node} was OOM-killed at {stop.memory_mb}Mi, the most a pod may "
                f"have (node.max_memory_mb); more PS or a smaller model is needed",
            )
        what = f"relaunched with {grown}Mi"
        if no_room:
            grown = stop.memory_mb
            what = (
                f"the job's memory quota leaves no room for more ({memory_room_mb}Mi free): "
                "relaunched as it was"
            )
        elif memory_room_mb is not None and grown > stop.memory_mb + memory_room_mb:
            step = settings.node.memory_step_mb
            grown = stop.memory_mb + memory_room_mb // step * step
            what = (
                f"relaunched with {grown}Mi, the most the job's memory quota leaves "
                f"({memory_room_mb}Mi free)"
            )
        return Relaunch(
            node=stop.node,
            cpu=stop.cpu,
            memory_mb=grown,
            counted=True,
            reason=f"{stop.node} OOM-killed at {stop.memory_mb}Mi: {what} ({count})",
        )
    return Relaunch(
        node=stop.node,
        cpu=stop.cpu,
        memory_mb=stop.memory_mb,
        counted=True,
        reason=f"{stop.node} {_describe(stop)}: relaunched as it was ({count})",
    )


def _code(stop: PodExit) -> str:
    return "?" if stop.exit_code is None else str(stop.exit_code)


def _describe(stop: PodExit) -> str:
    what = {
        ExitCause.ERROR: "exited with an error",
        ExitCause.OOM_KILLED: "was OOM-killed",
        ExitCause.START_ERROR: "could not start",
        ExitCause.EVICTED: "was evicted",
        ExitCause.PREEMPTED: "was preempted",
        ExitCause.DELETED: "was deleted by someone else",
        ExitCause.NODE_LOST: "lost its node",
        ExitCause.COMPLETED: "completed",
    }[stop.cause]
    return what if stop.exit_code is None else f"{what} (exit code {stop.exit_code})"


__all__ = [
    "ExitCause",
    "FailJob",
    "NoRelaunch",
    "PodExit",
    "Relaunch",
    "RelaunchDecision",
    "decide_relaunch",
    "oom_grown_memory",
    "oom_wanted_memory",
]
