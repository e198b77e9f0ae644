"""Where a training job's pods run: the implementations of the :class:`ClusterBackend` port.

:mod:`.local` runs pods as local processes (psutil, cgroups); :mod:`.kubernetes` runs them as
pods of a cluster (the one module that imports the kubernetes client), its manifests and status
rules in :mod:`.k8s_objects`. Both answer to the same behavioural suite. The port and its values
live in :mod:`dlrover_kfp.ports`; they are re-exported here so that ``from dlrover_kfp.backends
import LocalBackend, PodSpec`` reads as one place.

:class:`LocalBackend` is loaded on first use (PEP 562 ``__getattr__``), not on import: a module
that only names the port, or builds Kubernetes objects, then does not pay for psutil and the
cgroup probes, nor depend on them being importable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dlrover_kfp.core.pod_env import POD_CPU_ENV, POD_MEMORY_ENV
from dlrover_kfp.ports import (
    BackendClosedError,
    BackendError,
    ClusterBackend,
    PodEvent,
    PodExistsError,
    PodNotFoundError,
    PodPhase,
    PodReason,
    PodSpec,
    PodStatus,
    PodUsage,
    ResizeOutcome,
)

if TYPE_CHECKING:
    from dlrover_kfp.backends.local import LocalBackend

__all__ = [
    "POD_CPU_ENV",
    "POD_MEMORY_ENV",
    "BackendClosedError",
    "BackendError",
    "ClusterBackend",
    "LocalBackend",
    "PodEvent",
    "PodExistsError",
    "PodNotFoundError",
    "PodPhase",
    "PodReason",
    "PodSpec",
    "PodStatus",
    "PodUsage",
    "ResizeOutcome",
]


def __getattr__(name: str) -> Any:
    """``LocalBackend`` on first access (see the module docstring); anything else is missing."""
    if name == "LocalBackend":
        from dlrover_kfp.backends.local import LocalBackend  # noqa: PLC0415 - psutil: on use

        return LocalBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
