"""The environment a backend gives every pod it runs: the pod's own resources.

A contract between the backends (which set these variables) and the trainer's processes (which
read them), kept in the core so that neither side imports the other.
"""

from __future__ import annotations

#: A pod's CPU (cores, a decimal such as ``"1.5"``). The trainer sizes its thread pools from it:
#: a process cannot learn its own CPU limit portably (a local process has none; a container's
#: cgroup quota is not what ``os.cpu_count()`` reports).
POD_CPU_ENV = "DLROVER_KFP_POD_CPU"
#: A pod's memory limit in MiB (an integer such as ``"2048"``), so the trainer can size caches
#: below the limit instead of discovering it by being OOM-killed.
POD_MEMORY_ENV = "DLROVER_KFP_POD_MEMORY_MB"

#: The pod's own shared-memory directory (its ``/dev/shm``), private to the pod and gone with it
#: as a memory-backed ``emptyDir`` is on Kubernetes: where a PS keeps its flash snapshot. On
#: Kubernetes it is unset and the pod's own ``/dev/shm`` is used.
POD_SHM_ENV = "DLROVER_KFP_SHM_DIR"

__all__ = ["POD_CPU_ENV", "POD_MEMORY_ENV", "POD_SHM_ENV"]
