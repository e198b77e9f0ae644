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
the local backend (:mod:`dlrover_kfp.backends.cgroups`: where to make a pod's groups, and
``quota_cores``) parses with the same functions.
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


@dataclass(frozen=True, slots=True)
class CgroupMount:
    """A cgroup file system as ``/proc/self/mountinfo`` lists it."""

    point: PurePosixPath  # where it is mounted (field 5)
    root: PurePosixPath  # the mount's root inside the hierarchy (field 4)
    fstype: str  # "cgroup" (v1) or "cgroup2"
    options: frozenset[str]  # super options: the v1 controllers of the hierarchy


def cgroup_mounts(mountinfo: str) -> list[CgroupMount]:
    """The cgroup mounts of a ``/proc/self/mountinfo`` text."""
    out = []
    for line in mountinfo.splitlines():
        # "36 35 0:30 /root /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu"
        pre, sep, post = line.partition(" - ")
        if not sep:
            continue
        fields, tail = pre.split(), post.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        out.append(
            CgroupMount(
                PurePosixPath(fields[4]),
                PurePosixPath(fields[3]),
                tail[0],
                frozenset(tail[2].split(",")),
            )
        )
    return out


def own_groups(proc_cgroup: str) -> dict[str, PurePosixPath]:
    """This process's group per controller ("" for the unified hierarchy), from
    ``/proc/self/cgroup`` lines ``id:controllers:path``."""
    out: dict[str, PurePosixPath] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            out[controller] = PurePosixPath(parts[2])
    return out


def group_dir(mount: CgroupMount, own: PurePosixPath) -> PurePosixPath:
    """Where group ``own`` (a path in the hierarchy) is under ``mount``; the mount point itself
    when ``own`` is outside what the mount shows."""
    rel = own.relative_to(mount.root) if own.is_relative_to(mount.root) else PurePosixPath()
    return mount.point / rel


def cpu_group(mountinfo: str, proc_cgroup: str) -> CpuGroup | None:
    """The directory of this process's CPU group: in the v1 hierarchy that has the ``cpu``
    controller when one is mounted (a controller is bound to one hierarchy at a time, so the
    cgroup2 mount of a hybrid host then has no ``cpu``), else in the cgroup2 hierarchy; None
    without either."""
    own = own_groups(proc_cgroup)
    mounts = cgroup_mounts(mountinfo)
    for mount in mounts:
        if mount.fstype == "cgroup" and "cpu" in mount.options and "cpu" in own:
            return CpuGroup(1, group_dir(mount, own["cpu"]))
    for mount in mounts:
        if mount.fstype == "cgroup2" and "" in own:
            return CpuGroup(2, group_dir(mount, own[""]))
    return None


def pod_group_cores(quota: float | None, pod_cpu: float) -> bool:
    """Whether a group with ``quota`` cores is the pod's own, given the CPU the pod started
    with (its ``DLROVER_KFP_POD_CPU``): the backend set both to the same value at launch.

    A process outside any group of its own (the local backend without cgroups) sits in its
    master's group, whose quota, if any, is not the pod's; following it would size the pod's
    threads to the master's container."""
    return quota is not None and abs(quota - pod_cpu) <= MATCH_CORES


__all__ = [
    "MATCH_CORES",
    "CgroupMount",
    "CpuGroup",
    "cgroup_mounts",
    "cores_from_cfs",
    "cores_from_cpu_max",
    "cpu_group",
    "group_dir",
    "own_groups",
    "pod_group_cores",
]
