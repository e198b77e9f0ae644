"""The run's events, told to the cluster: each :class:`~dlrover_kfp.core.profile.JobEvent` the
master records becomes a :class:`~dlrover_kfp.ports.PodEvent` on the backend (on Kubernetes an
Event on the pod; docs/observability.md lists the reasons).

The profile's event list stays the one record of what happened: the runtime appends to it where
it acts (a dozen places in the elastic policy and the PS change) and :class:`EventForwarder`
sends what is new at the master's loop turns, so that no code path has to remember a second
call, and the Events say exactly what the profile says. A turn is 0.1 s: an Event appears
within that of the master's decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from dlrover_kfp.core.profile import EventKind, JobEvent
from dlrover_kfp.ports import ClusterBackend, PodEvent

#: Per event kind: the Event's reason and whether it is a Warning (something went wrong) or
#: Normal (the master's own choice). The reasons are CamelCase words, as the kubelet's.
REASONS: Final[dict[EventKind, tuple[str, bool]]] = {
    "scale": ("Scaled", False),
    "migration": ("MigratedPS", False),
    "relaunch": ("Relaunched", False),
    "oom": ("OOMKilled", True),
    "failure": ("Failed", True),
    "straggler": ("Straggler", True),
}


def pod_event(event: JobEvent) -> PodEvent:
    """The :class:`PodEvent` of one of the run's events: on its pod (None: the job's)."""
    reason, warning = REASONS[event.kind]
    return PodEvent(pod=event.node, reason=reason, message=event.detail, warning=warning)


class EventForwarder:
    """Sends the events appended to a run's list since the last call. The list only grows
    while this master runs; the events it started with (a resumed run's, told by the master
    before) are not sent again."""

    def __init__(self, backend: ClusterBackend, already: int) -> None:
        self._backend = backend
        self._sent = already

    def forward(self, events: Sequence[JobEvent]) -> None:
        new = events[self._sent :]  # one read: an event another thread appends meanwhile
        self._sent += len(new)  # is sent at the next call
        for event in new:
            self._backend.emit_event(pod_event(event))


__all__ = ["REASONS", "EventForwarder", "pod_event"]
