"""Where a training job's pods run: the :class:`ClusterBackend` port and its implementations.

:mod:`.api` is the port and its values (no I/O); :mod:`.local` runs pods as local processes.
A Kubernetes implementation will answer to the same port and the same behavioural test suite.
"""

from dlrover_kfp.backends.api import (
    BackendClosedError,
    BackendError,
    ClusterBackend,
    PodExistsError,
    PodNotFoundError,
    PodPhase,
    PodReason,
    PodSpec,
    PodStatus,
    PodUsage,
)
from dlrover_kfp.backends.local import LocalBackend
from dlrover_kfp.core.pod_env import POD_CPU_ENV, POD_MEMORY_ENV

__all__ = [
    "POD_CPU_ENV",
    "POD_MEMORY_ENV",
    "BackendClosedError",
    "BackendError",
    "ClusterBackend",
    "LocalBackend",
    "PodExistsError",
    "PodNotFoundError",
    "PodPhase",
    "PodReason",
    "PodSpec",
    "PodStatus",
    "PodUsage",
]
