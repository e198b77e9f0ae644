"""A cluster with no processes, for the job master's own logic under a fake clock.

Its pods are only statuses: each starts in the phase the test chose and stays there until the
test (directly, or from a :class:`~tests.fakes.clock.FakeClock` ``world`` callback) moves it
on, or until the master deletes it. That is all the runtime asks of a backend
(launch, delete, statuses, usage, events, close, and what it says about limits), so the master's
decisions (when it launches the workers, when it stops a pod) can be asserted on the fake
clock's time without a pod ever running.
"""

from __future__ import annotations

import dataclasses

from dlrover_kfp.ports import (
    PodEvent,
    PodNotFoundError,
    PodPhase,
    PodSpec,
    PodStatus,
    PodUsage,
    ResizeOutcome,
)


class RunningPods:
    """Pods that stay in their phase (``phase``, RUNNING by default) until deleted or moved on
    by :meth:`set_phase`."""

    enforcement = "none"

    def __init__(self, phase: PodPhase = PodPhase.RUNNING) -> None:
        self.phase = phase
        self.pods: dict[str, PodStatus] = {}
        #: every pod's current (cpu, memory_mb) limits
        self.limits: dict[str, tuple[float, int]] = {}
        #: every resize asked for: (name, cpu, memory_mb)
        self.resizes: list[tuple[str, float, int]] = []
        #: when set, every resize is refused with this reason (an older cluster: the API has no
        #: ``resize`` subresource; a node without room: ``PodResizePending`` Infeasible)
        self.refuse_resize: str | None = None
        #: seconds a resize takes to apply (what ResizeOutcome reports)
        self.resize_s = 0.25
        #: every pod launched, by name, in order
        self.launched: list[str] = []
        #: every event the master told the cluster, in order
        self.events: list[PodEvent] = []

    def launch(self, pod: PodSpec) -> None:
        # Every pod its own start, as a backend gives it: a pod relaunched under the same name
        # is another pod (the master keys failures by name and start).
        self.pods[pod.name] = PodStatus(
            name=pod.name,
            role=pod.role,
            index=pod.index,
            phase=self.phase,
            started_at=float(len(self.launched)),
        )
        self.limits[pod.name] = (pod.cpu, pod.memory_mb)
        self.launched.append(pod.name)

    def resize(
        self, name: str, cpu: float, memory_mb: int, timeout_s: float = 30.0
    ) -> ResizeOutcome:
        """As the port says: new limits on the running pod, or refused and the pod unchanged.
        A memory decrease is refused, as Kubernetes' ``resizePolicy`` for memory does."""
        self.resizes.append((name, cpu, memory_mb))
        status = self.pods.get(name)
        if status is None or status.phase is not PodPhase.RUNNING:
            raise PodNotFoundError(f"no running pod {name}")
        if self.refuse_resize is not None:
            return ResizeOutcome(in_place=False, reason=self.refuse_resize)
        if memory_mb < self.limits[name][1]:
            return ResizeOutcome(in_place=False, reason="memory cannot be decreased in place")
        self.limits[name] = (cpu, memory_mb)
        return ResizeOutcome(in_place=True, seconds=self.resize_s)

    def set_phase(self, name: str, phase: PodPhase, message: str | None = None) -> None:
        """Move pod ``name`` on to ``phase`` (a terminal one with exit code 0 or 1), with the
        backend's ``message`` (a Pending pod's: why no node took it)."""
        exit_code = None if not phase.terminal else int(phase is PodPhase.FAILED)
        self.pods[name] = dataclasses.replace(
            self.pods[name], phase=phase, exit_code=exit_code, message=message
        )

    def delete(self, name: str, grace_s: float = 5.0) -> None:
        self.pods.pop(name, None)
        self.limits.pop(name, None)

    def statuses(self) -> list[PodStatus]:
        return list(self.pods.values())

    def usage(self) -> list[PodUsage]:
        return []

    def emit_event(self, event: PodEvent) -> None:
        self.events.append(event)

    def close(self) -> None:
        pass


__all__ = ["RunningPods"]
