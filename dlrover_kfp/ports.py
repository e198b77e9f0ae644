"""The outside world as small protocols. Implementations are passed in, never built inside.

Three ports, each with the values its signatures name: :class:`HistoryStore`, :class:`Clock` and
:class:`ClusterBackend`. A port with several implementations has one behavioural test suite
that each of them runs (tests/contract/ for the history stores;
``tests/backends/test_local_backend.py::ClusterBackendContract`` for local processes and
Kubernetes). This module performs no I/O and imports no adapter: code that only names a port
(the job master's logic, its tests) loads neither psutil, the cgroup probes, SQLAlchemy nor the
kubernetes client (tests/unit/test_ports.py).
"""

from __future__ import annotations

import builtins
import re
import time
import types
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from dlrover_kfp.core.pod_env import POD_CPU_ENV, POD_MEMORY_ENV, POD_SHM_ENV
from dlrover_kfp.core.profile import JobProfile, Role
from dlrover_kfp.core.summary import JobSummary
from dlrover_kfp.errors import DlroverKfpError, PermanentError, UserInputError

# ---- the history -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SimilarityQuery:
    """Which finished jobs count as "similar" for warm start.

    With a ``scenario`` the store matches on it; without one, on ``model_signature`` (the same
    model shape). Only jobs started at or after ``since`` (epoch seconds) are returned, newest
    first, at most ``limit``.
    """

    model_signature: str
    scenario: str | None = None
    since: float | None = None
    limit: int = 50


class HistoryStore(Protocol):
    """Finished jobs' profiles, queried by similarity. Recording is idempotent on ``run_id``."""

    def record(self, profile: JobProfile) -> bool:
        """Store a profile; False (and no change) if its ``run_id`` is already stored."""
        ...

    def record_many(self, profiles: Iterable[JobProfile]) -> int:
        """Store many profiles atomically (all or none); return how many were new."""
        ...

    def replace(self, profile: JobProfile) -> bool:
        """Store ``profile`` in place of the stored profile with its ``run_id`` (or as a new
        run): a re-run of the same logical run (an orchestrator's retry or re-run, which keeps
        the run id) supersedes the earlier attempt instead of adding a second run. False, and
        no change, when the stored profile is equal to it."""
        ...

    def get(self, run_id: str) -> JobProfile:
        """The stored profile; :class:`~dlrover_kfp.errors.NotFoundError` if absent."""
        ...

    def list(self, *, scenario: str | None = None, limit: int = 50) -> list[JobSummary]:
        """Summaries, newest first."""
        ...

    def find_similar(self, query: SimilarityQuery) -> builtins.list[JobSummary]: ...

    def iter_profiles(self) -> Iterator[JobProfile]:
        """Every profile, oldest first (for export)."""
        ...

    def count(self) -> int: ...

    def close(self) -> None: ...


# ---- the clock -------------------------------------------------------------------------------


class WallClock(Protocol):
    """The time of day: what planning "as of" a moment needs."""

    def now(self) -> float:
        """Seconds since the epoch."""
        ...


class Clock(WallClock, Protocol):
    """Time as a job master lives it: the time of day, an interval clock and waiting.

    The runtime reads and waits only through this port, so that its decisions (timeouts,
    grace periods, back-offs, silence) run under a test's fake clock in microseconds."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (intervals, deadlines)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (the monotonic clock moves on by at least that much)."""
        ...


@dataclass(frozen=True, slots=True)
class FixedClock:
    """A clock stopped at ``moment``: planning "as of" a given time (replays, simulation)."""

    moment: float

    def now(self) -> float:
        return self.moment


class SystemClock:
    """The machine's clocks."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


# ---- the cluster: where a job's pods run ------------------------------------------------------
#
# The job master decides *what* runs (how many PS and workers, with how much CPU and memory); a
# ClusterBackend decides *how*: local OS processes (dlrover_kfp.backends.local) or Kubernetes
# pods (dlrover_kfp.backends.kubernetes). The vocabulary follows Kubernetes on purpose (phases,
# ``OOMKilled``, exit code 137, requests equal to limits, a grace period between SIGTERM and
# SIGKILL): the job master's failure handling then means the same thing on both backends.

#: Variables every backend sets itself; a :class:`PodSpec` may not set them.
RESERVED_ENV = frozenset({POD_CPU_ENV, POD_MEMORY_ENV, POD_SHM_ENV})

# A DNS-1123 label: what Kubernetes accepts as a pod name (and a safe log-file name locally).
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_MAX_NAME = 63
_ROLES: frozenset[str] = frozenset({"worker", "ps"})


class PodPhase(StrEnum):
    """Where a pod is in its life. Transitions only go forward::

        PENDING ──► RUNNING ──► SUCCEEDED   (exit code 0)
           │           └──────► FAILED      (non-zero exit, OOM-killed, or deleted)
           └──────────────────► FAILED      (could not start, or deleted before it ran)

    ``PENDING`` means accepted but not yet running (waiting for a node, pulling an image). The
    local backend starts processes synchronously, so its pods are never seen ``PENDING``.
    ``SUCCEEDED`` and ``FAILED`` are terminal: a pod is never restarted in place (Kubernetes
    ``restartPolicy: Never``); the job master relaunches under the same name instead.
    """

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def terminal(self) -> bool:
        return self in (PodPhase.SUCCEEDED, PodPhase.FAILED)


class PodReason(StrEnum):
    """Why a pod stopped; the same strings Kubernetes puts in a container's terminated state."""

    COMPLETED = "Completed"
    """Exited 0."""
    ERROR = "Error"
    """Exited non-zero on its own (a signal ``n`` reads as exit code ``128 + n``)."""
    OOM_KILLED = "OOMKilled"
    """Killed (SIGKILL, exit code 137) for using more memory than its limit."""
    DELETED = "Deleted"
    """Stopped by :meth:`ClusterBackend.delete` (or ``close``) while it was running."""
    START_ERROR = "StartError"
    """The command could not be started at all (no such executable, not executable)."""
    EVICTED = "Evicted"
    """Stopped by its node (memory or disk pressure) or through the Eviction API (a drain)."""
    PREEMPTED = "Preempted"
    """Stopped by the scheduler to make room for a pod of higher priority."""
    NODE_LOST = "NodeLost"
    """Its node stopped answering; the pod was deleted from it (Kubernetes only)."""


class BackendError(DlroverKfpError):
    """Base of the errors a cluster backend raises on purpose."""


class PodExistsError(BackendError, PermanentError, ValueError):
    """A pod of that name is still running; delete it (or wait for it) before relaunching."""


class PodNotFoundError(BackendError, PermanentError, LookupError):
    """No running pod of that name."""


class BackendClosedError(BackendError, PermanentError):
    """The backend was closed: it launches nothing more."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PodSpec:
    """One pod to run. Requests equal limits: ``cpu`` cores and ``memory_mb`` MiB.

    ``command`` is the full argv; it must itself name the role and index (the trainer reads them
    from its command line) and is logged, so it must hold no secrets: anyone on a machine can
    read a process's argv. Secrets go in ``env``, whose values no backend ever logs and which
    ``repr`` masks.
    """

    name: str
    role: Role
    index: int
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict, hash=False)
    cpu: float
    memory_mb: int
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if len(self.name) > _MAX_NAME or not _DNS1123_LABEL.fullmatch(self.name):
            raise UserInputError(
                f"pod name {self.name!r} is not a DNS-1123 label: at most {_MAX_NAME} characters"
                " of a-z, 0-9 and '-', starting and ending with a letter or digit"
            )
        if self.role not in _ROLES:
            raise UserInputError(f"pod {self.name}: role {self.role!r} is not 'worker' or 'ps'")
        if self.index < 0:
            raise UserInputError(f"pod {self.name}: index {self.index} is negative")
        if not self.cpu > 0:
            raise UserInputError(f"pod {self.name}: cpu {self.cpu} must be positive")
        if self.memory_mb <= 0:
            raise UserInputError(f"pod {self.name}: memory_mb {self.memory_mb} must be positive")
        command = tuple(self.command)
        if not command or not all(isinstance(a, str) for a in command):
            raise UserInputError(f"pod {self.name}: command must be a non-empty argv of strings")
        reserved = RESERVED_ENV.intersection(self.env)
        if reserved:
            raise UserInputError(
                f"pod {self.name}: env may not set {sorted(reserved)}; the backend sets them"
            )
        # Freeze copies: a caller mutating its own dict later must not change a launched spec.
        object.__setattr__(self, "command", command)
        object.__setattr__(self, "env", types.MappingProxyType(dict(self.env)))
        object.__setattr__(self, "labels", types.MappingProxyType(dict(self.labels)))

    def __repr__(self) -> str:
        # Hand-written so that env values (tokens, passwords) never reach a log or a traceback.
        env = "{" + ", ".join(f"{k!r}: '***'" for k in sorted(self.env)) + "}"
        return (
            f"PodSpec(name={self.name!r}, role={self.role!r}, index={self.index}, "
            f"command={self.command!r}, env={env}, cpu={self.cpu}, "
            f"memory_mb={self.memory_mb}, labels={dict(self.labels)!r})"
        )

    def resource_env(self) -> dict[str, str]:
        """The :data:`POD_CPU_ENV` / :data:`POD_MEMORY_ENV` values a backend gives this pod."""
        return {POD_CPU_ENV: f"{self.cpu:g}", POD_MEMORY_ENV: str(self.memory_mb)}


@dataclass(frozen=True, slots=True, kw_only=True)
class PodStatus:
    """A pod as last observed.

    ``exit_code`` and ``reason`` are set once the pod is terminal (``reason`` is a
    :class:`PodReason` value). Times are seconds since the epoch from the backend's clock;
    ``finished_at`` is when the backend *noticed* the end, which may lag the real exit by up to
    the backend's polling interval. ``message`` is the last error line of a failed pod's own
    output (:func:`~dlrover_kfp.backends.api.last_error_line`), the cause a user can act on
    ("No space left on device", "file changed since it was indexed"), None when it wrote none;
    for a pod still Pending, why the scheduler placed it on no node (Kubernetes' ``PodScheduled``
    ``Unschedulable`` message: "0/2 nodes are available: 2 Insufficient cpu.").
    """

    name: str
    role: Role
    index: int
    phase: PodPhase
    exit_code: int | None = None
    reason: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PodUsage:
    """What a running pod used, next to what it was given (for the profile's ``NodeSample``).

    ``cpu_cores`` is averaged over the time since the previous :meth:`ClusterBackend.usage`
    call that reported this pod (since its start for the first), so one caller should own the
    sampling. A backend may leave a pod out of a call whose window would be too short to
    average its CPU limit over (the local backend: under 0.5 s) and report it next time.
    ``memory_mb`` is resident memory in MiB, child processes included. ``cpu_throttled`` is the
    share of the window's CFS periods in which the pod had run its whole CPU quota and waited
    (:func:`dlrover_kfp.backends.cgroups.throttled_share`), None where the backend cannot see it.
    """

    name: str
    role: Role
    index: int
    cpu_cores: float
    memory_mb: float
    cpu_requested: float
    memory_requested_mb: int
    cpu_throttled: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResizeOutcome:
    """What :meth:`ClusterBackend.resize` did.

    ``in_place``: the running pod now has the new limits and its processes went on (the same
    pids, nothing restarted). Otherwise the pod is unchanged and ``reason`` says why, in the
    backend's words (the API refused the ``resize`` subresource: an older cluster; the node
    cannot fit it: ``PodResizePending`` ``Infeasible``; a memory decrease; not applied within
    the timeout): the caller replaces the pod instead. ``seconds``: from the request until the
    new limits were applied (or refused).
    """

    in_place: bool
    reason: str = ""
    seconds: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PodEvent:
    """Something the job master did to a pod or saw of it (a scale, a move, a relaunch, an
    OOM kill), told to whoever watches the cluster rather than the run: on Kubernetes an Event
    on the pod, which ``kubectl describe pod`` and ``kubectl get events`` show beside the
    kubelet's own (docs/observability.md).

    ``pod`` is the pod's name; None for the job as a whole (a new plan), which a backend puts on
    the master's own pod where it runs in one. ``reason`` is one CamelCase word, as the
    kubelet's (``Scaled``, ``OOMKilled``); ``warning`` marks what went wrong (Kubernetes' type
    ``Warning``) apart from what the master chose to do (``Normal``).
    """

    pod: str | None
    reason: str
    message: str
    warning: bool = False


class ClusterBackend(Protocol):
    """Launches, watches and stops one job's pods. Safe to call from several threads.

    ``statuses`` reports every pod launched through this backend, deleted and finished ones
    included, until the same name is launched again (the new pod replaces the old record).
    """

    @property
    def cpu_enforced(self) -> bool:
        """Whether a pod's ``cpu`` is a hard limit (a CFS quota) rather than only accounted."""
        ...

    @property
    def enforcement(self) -> str:
        """One line for logs and the job profile: how limits are enforced, or why they are not."""
        ...

    def launch(self, pod: PodSpec) -> None:
        """Start a pod. :class:`PodExistsError` if a pod of that name is still running;
        :class:`BackendClosedError` after :meth:`close`. A command that cannot start is not an
        exception here but a pod ``FAILED`` with reason ``StartError``, as on a cluster."""
        ...

    def delete(self, name: str, grace_s: float = 5.0) -> None:
        """Stop a pod: SIGTERM, then SIGKILL if it is still running after ``grace_s``. Returns
        once it has stopped. Idempotent: a finished, already deleted or unknown pod is left as
        it is. A running pod ends ``FAILED`` with reason ``Deleted`` whatever its exit code."""
        ...

    def resize(
        self, name: str, cpu: float, memory_mb: int, timeout_s: float = 30.0
    ) -> ResizeOutcome:
        """Change a running pod's CPU and memory limits in place, as Kubernetes' ``resize``
        subresource does: its processes go on under the new CFS quota and memory limit, and
        :meth:`usage` reports the new requests from then on. Returns once the new limits are
        applied, or, when the backend cannot apply them (see :class:`ResizeOutcome`), with
        ``in_place=False`` and the pod unchanged. :class:`PodNotFoundError` if no pod of that
        name is running."""
        ...

    def statuses(self) -> list[PodStatus]:
        """Every known pod, in launch order."""
        ...

    def usage(self) -> list[PodUsage]:
        """CPU and memory of the running pods only (a pod that just ended is left out)."""
        ...

    def emit_event(self, event: PodEvent) -> None:
        """Tell the cluster's users about ``event`` (see :class:`PodEvent`). Best effort: an
        event the cluster does not take (an API error, no right to create Events, a closed
        backend) is logged and dropped, never raised, and is retried for a moment at most, so
        that telling about a run never slows or fails it."""
        ...

    def close(self) -> None:
        """Delete every pod still running and stop background work. Idempotent; statuses stay
        readable afterwards."""
        ...
