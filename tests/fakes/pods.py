"""A cluster with no processes, for the job master's own logic under a fake clock.

Its pods are only statuses: each starts in the phase the test chose and stays there until the
test (directly, or from a :class:`~tests.fakes.clock.FakeClock` ``world`` callback) moves it
on, or until the master deletes it. That is all the runtime asks of a backend
(launch, delete, statuses, usage, close, and what it says about limits), so the master's
decisions (when it launches the workers, when it stops a pod) can be asserted on the fake
clock's time without a pod ever running.
"""

from __future__ import annotations

import dataclasses

from dlrover_kfp.ports import PodPhase, PodSpec, PodStatus, PodUsage


class RunningPods:
    """Pods that stay in their phase (``phase``, RUNNING by default) until deleted or moved on
    by :meth:`set_phase`."""

    enforcement = "none"

    def __init__(self, phase: PodPhase = PodPhase.RUNNING) -> None:
        self.phase = phase
        self.pods: dict[str, PodStatus] = {}

    def launch(self, pod: PodSpec) -> None:
        self.pods[pod.name] = PodStatus(
            name=pod.name, role=pod.role, index=pod.index, phase=self.phase
        )

    def set_phase(self, name: str, phase: PodPhase) -> None:
        """Move pod ``name`` on to ``phase`` (a terminal one with exit code 0 or 1)."""
        exit_code = None if not phase.terminal else int(phase is PodPhase.FAILED)
        self.pods[name] = dataclasses.replace(self.pods[name], phase=phase, exit_code=exit_code)

    def delete(self, name: str, grace_s: float = 5.0) -> None:
        self.pods.pop(name, None)

    def statuses(self) -> list[PodStatus]:
        return list(self.pods.values())

    def usage(self) -> list[PodUsage]:
        return []

    def close(self) -> None:
        pass


__all__ = ["RunningPods"]
