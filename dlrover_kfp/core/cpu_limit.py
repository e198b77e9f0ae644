"""A process's CPU limit from its control group's CFS quota: the parsing, kept pure.

A pod's ``limits.cpu`` is a CFS quota on its container's group: ``quota`` µs of CPU time per
``period`` µs, so

    cores = quota / period          (v2 ``cpu.max`` "quota period", "max" = unlimited;
                                     v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, -1 = none)

An in-place resize (Kubernetes' ``resize`` subresource, the local backend's
:meth:`~dlrover_kfp.backends.cgroups.PodGroup.set_limits`) rewrites that quota under the
running process; the ``DLROVER_KFP_POD_CPU`` variable the pod started with does not change. So
a process that follows its CPU reads its group's quota: its group is named by
``/proc/self/cgroup`` (``id:controllers:path``; v2 has the one line ``0::path``), inside the
cgroup mount that ``/proc/self/mountinfo`` lists (field 4 the mount's root in the hierarchy,
field 5 where it is mounted; in a container with its own cgroup namespace both are ``/``).

This module turns the texts of those files into the group's directory and its quota into
cores; :mod:`dlrover_kfp.training.cpu_limit` reads the files (I/O stays out of the core), and
the local backend's :func:`~dlrover_kfp.backends.cgroups.quota_cores` parses with the same
functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

#: The quota the local backend writes is ``round(cpu · 100 000)`` µs, at least the kernel's
#: 1 ms: a quota within this many cores of a pod's CPU is that CPU.
MATCH_CORES = 0.011


@dataclass(frozen=True, slots=True)
class CpuGroup:
    """Where a process's CPU quota is: ``directory`` holds ``cpu.max`` (``version`` 2) or
    ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us`` (``version`` 1)."""

    version: int
    directory: PurePosixPath


def cores_from_cpu_max(text: str) -> float | None:
    """Cores of a v2 ``cpu.max`` ("50000 100000"); None when unlimited ("max 100000")."""
    quota, _, period = text.strip().partition(" ")
    if quota == "max":
        return None
    return int(quota) / int(period or "100000")


def cores_from_cfs(quota_us: str, period_us: str) -> float | None:
    """Cores of a v1 group's ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``; None when the
    quota is -1 (unlimited)."""
    quota = int(quota_us.split(maxsplit=1)[0])
    return None if quota < 0 else quota / int(period_us.split(maxsplit=1)[0])


def cpu_group(mountinfo: str, proc_cgroup: str) -> CpuGroup | None:
    """The directory of this process's CPU group: in the v1 hierarchy that has the ``cpu``
    controller when one is mounted (a controller is bound to one hierarchy at a time, so the
    cgroup2 mount of a hybrid host then has no ``cpu``), else in the cgroup2 hierarchy; None
    without either."""
    own: dict[str, PurePosixPath] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                own[controller] = PurePosixPath(parts[2])
    # "36 35 0:30 /root /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu":
    # field 4 the mount's root in the hierarchy, field 5 the mount point.
    mounts = [
        (fields[3], fields[4], tail[0], tail[2].split(","))
        for pre, sep, post in (line.partition(" - ") for line in mountinfo.splitlines())
        for fields, tail in [(pre.split(), post.split())]
        if sep and len(fields) >= 5 and len(tail) >= 3
    ]
    for root, point, fstype, options in mounts:
        if fstype == "cgroup" and "cpu" in options and "cpu" in own:
            return CpuGroup(1, _inside(root, point, own["cpu"]))
    for root, point, fstype, _ in mounts:
        if fstype == "cgroup2" and "" in own:
            return CpuGroup(2, _inside(root, point, own[""]))
    return None


def _inside(root: str, point: str, own: PurePosixPath) -> PurePosixPath:
    """Where group ``own`` (a path in the hierarchy) is under a mount of the hierarchy's
    ``root`` at ``point``; the mount point itself when ``own`` is outside what it shows."""
    base = PurePosixPath(root)
    rel = own.relative_to(base) if own.is_relative_to(base) else PurePosixPath()
    return PurePosixPath(point) / rel


def pod_group_cores(quota: float | None, pod_cpu: float) -> bool:
    """Whether a group with ``quota`` cores is the pod's own, given the CPU the pod started
    with (its ``DLROVER_KFP_POD_CPU``): the backend set both to the same value at launch.

    A process outside any group of its own (the local backend without cgroups) sits in its
    master's group, whose quota, if any, is not the pod's; following it would size the pod's
    threads to the master's container."""
    return quota is not None and abs(quota - pod_cpu) <= MATCH_CORES


__all__ = [
    "MATCH_CORES",
    "CpuGroup",
    "cores_from_cfs",
    "cores_from_cpu_max",
    "cpu_group",
    "pod_group_cores",
]
