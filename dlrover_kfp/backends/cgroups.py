"""Per-pod control groups for the local backend: a CFS CPU quota, a memory limit, and accounting.

A Kubernetes pod's ``limits.cpu`` becomes a CFS quota on its container's cgroup: in every
period of ``P`` µs the group may run for ``cpu · P`` µs across all its threads, then it is
throttled until the next period. This module gives a local pod the same: its own group with

    cpu quota   = round(cpu · 100 000) µs per 100 000 µs period   (cgroup v2 ``cpu.max``,
                                                                  v1 ``cpu.cfs_quota_us``)
    memory max  = memory_mb MiB                                    (v2 ``memory.max``,
                                                                  v1 ``memory.limit_in_bytes``)

and changes them in place while the pod runs (:meth:`PodGroup.set_limits`, what a kubelet does
for an in-place resize: the same processes, a new quota). It reads what the pod used from the
group's own accounting (v2 ``cpu.stat`` ``usage_usec``,
v1 ``cpuacct.usage``), which counts every thread and child of the pod, including those that
already exited. Memory is reported as *resident* memory, anonymous plus shared (``memory.stat``
``anon + shmem``, v1 ``total_rss + total_shmem``): what the pod's processes hold, as their RSS
counts it, without the page cache that the kernel reclaims before it kills anything (a PS that
persists a checkpoint fills the cache; counting it would make the planner size memory for it).

cgroup v2 is tried first, then v1; these machines mount the v1 ``cpu``, ``cpuacct`` and
``memory`` controllers as separate hierarchies and root may create groups in them. A pod's
groups sit under one group per backend, created inside this process's own group of each
hierarchy (the delegation convention), named ``dlrover-kfp-<pid>-<token>``.

How a pod enters its groups: its command is wrapped in ``/bin/sh -c`` that writes its own pid
into every group's ``cgroup.procs`` and then ``exec``\\ s the real command (the same pid, so the
pod's process group and session stay as they were). The pod is therefore inside its limits
before its first instruction, and nothing it forks can escape them: what a container runtime
does before it starts a container's entry point. Writing the pid after ``Popen`` returns would
leave a window in which a fast child escapes.

A master killed by SIGKILL leaves its groups behind; :func:`tree_pids` and :func:`remove_tree`
let the local backend find what is still in them and remove them afterwards.

This module only touches the cgroup file system; it never kills or signals anything.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Protocol

from dlrover_kfp.core.cpu_limit import (
    CgroupMount,
    cgroup_mounts,
    cores_from_cfs,
    cores_from_cpu_max,
    group_dir,
    own_groups,
)

logger = logging.getLogger(__name__)

#: CFS period in µs: the kernel's and Kubernetes' default.
CFS_PERIOD_US = 100_000
#: The kernel refuses quotas below 1 ms.
_MIN_QUOTA_US = 1_000
_MIB = 1024 * 1024

#: Environment variable through which the wrapper learns where to write its pid (colon-separated
#: paths of ``cgroup.procs`` files; pod names are DNS labels, so paths hold no colon).
PROCS_ENV = "DLROVER_KFP_CGROUP_PROCS"

# Join every group, then become the pod's command. ``exit 126`` (as a shell does for a command it
# cannot run) when a group refuses the pid: a pod must not run unconstrained by accident.
_WRAPPER = (
    'IFS=:; for f in $DLROVER_KFP_CGROUP_PROCS; do echo $$ > "$f" || exit 126; done; '
    'unset DLROVER_KFP_CGROUP_PROCS; exec "$@"'
)


class CgroupError(OSError):
    """A cgroup could not be created or configured; the message says which file and why."""


def cpu_quota_us(cpu: float, period_us: int = CFS_PERIOD_US) -> int:
    """The CFS quota for ``cpu`` cores: ``cpu · period``, at least the kernel's 1 ms."""
    return max(_MIN_QUOTA_US, round(cpu * period_us))


def throttled_share(periods: int, wall_s: float, period_us: int = CFS_PERIOD_US) -> float:
    """The share of a window's CFS periods in which a group was throttled:

        share = Δnr_throttled · P / wall        (clamped to [0, 1])

    per period of *wall* time, not per period the group was runnable (cAdvisor's ratio), so
    that a group throttled in a share ``s`` of the window has run at least ``s · quota`` cores
    on average: each throttled period used the whole quota. ``used / s`` then bounds the
    quota from above, whatever the pod requested (see the starved-PS rule of Stage 3)."""
    if wall_s <= 0 or periods <= 0:
        return 0.0
    return min(1.0, periods * period_us / 1e6 / wall_s)


@dataclass(frozen=True, slots=True)
class GroupUsage:
    """What a pod's group has used. ``cpu_seconds`` is cumulative since the group was created;
    ``memory_bytes`` is resident memory now (None where no memory group exists).

    ``throttled_periods`` counts the CFS periods, since the group was created, at whose end the
    group had run its whole quota and waited for the next (``cpu.stat`` ``nr_throttled``, the
    counter behind cAdvisor's ``container_cpu_cfs_throttled_periods_total``); None where the
    kernel does not report it."""

    cpu_seconds: float
    memory_bytes: int | None
    throttled_periods: int | None = None


class PodGroup(Protocol):
    """One pod's groups (one per hierarchy in v1, one directory in v2)."""

    @property
    def procs_files(self) -> tuple[Path, ...]:
        """The ``cgroup.procs`` files the pod's first process writes its pid into."""
        ...

    @property
    def limits_memory(self) -> bool:
        """Whether the kernel enforces the pod's memory limit (a memory group exists)."""
        ...

    def usage(self) -> GroupUsage: ...

    def set_limits(self, cpu: float, memory_mb: int) -> None:
        """Rewrite the running group's CPU quota and memory limit (an in-place resize).

        The memory limit goes first, being the one the kernel may refuse: below what the
        group holds now it would have to reclaim or OOM-kill. v1 refuses with EBUSY; v2 would
        kill, so the resident memory is checked before the write, as a kubelet checks a
        container's usage before it lowers its limit. Either way :class:`CgroupError` names
        the file and nothing was changed."""
        ...

    def oom_kills(self) -> int:
        """Processes of the group the kernel killed for exceeding its memory limit."""
        ...

    def remove(self) -> bool:
        """Remove the groups once their processes are gone; False if some are still busy."""
        ...


class Cgroups(Protocol):
    """Creates pods' groups under one parent per backend."""

    @property
    def description(self) -> str:
        """One line for logs and profiles, e.g. ``cgroup v1 (cpu, cpuacct, memory)``."""
        ...

    @property
    def directories(self) -> tuple[Path, ...]:
        """The per-backend parent groups, one per hierarchy: what a master that dies without
        :meth:`close` leaves behind (the local backend records them for a later cleanup)."""
        ...

    def create(self, name: str, cpu: float, memory_mb: int) -> PodGroup: ...

    def close(self) -> None:
        """Remove the parent groups and any pod group still under them (their processes must
        have ended: a group with processes is busy and stays)."""
        ...


def wrap_command(command: Sequence[str], group: PodGroup) -> tuple[tuple[str, ...], dict[str, str]]:
    """The argv and extra environment that start ``command`` inside ``group``.

    ``$0`` of the shell is the command's own name, so a failing wrapper names what it wrapped.
    """
    env = {PROCS_ENV: ":".join(str(p) for p in group.procs_files)}
    return ("/bin/sh", "-c", _WRAPPER, command[0], *command), env


# ------------------------------------------------------------------------------ file access


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise CgroupError(exc.errno, f"cannot write {value!r} to {path}: {exc.strerror}") from exc


def _refuse_below(resident: int | None, memory_mb: int, path: Path) -> None:
    """EBUSY, naming ``path``, when ``memory_mb`` MiB is less than the ``resident`` bytes a
    group holds: a limit below that would OOM-kill a pod that was only being resized."""
    if resident is not None and resident > memory_mb * _MIB:
        raise CgroupError(
            errno.EBUSY,
            f"cannot lower {path} to {memory_mb} MiB: the group holds {resident / _MIB:.0f} MiB",
        )


def _read_int(path: Path) -> int:
    return int(path.read_text().split()[0])


def _read_keyed(path: Path) -> dict[str, int]:
    """A ``key value`` per line file (``cpu.stat``, ``memory.stat``, ``memory.events``)."""
    out: dict[str, int] = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            out[key] = int(value)
    return out


def _mkdir(path: Path) -> None:
    try:
        path.mkdir()
    except FileExistsError:
        pass
    except OSError as exc:
        raise CgroupError(exc.errno, f"cannot create cgroup {path}: {exc.strerror}") from exc


def tree_pids(root: Path) -> set[int]:
    """The processes in group ``root`` and every group below it (their ``cgroup.procs``);
    empty when ``root`` is gone."""
    pids: set[int] = set()
    for here, _, _ in os.walk(root):
        with contextlib.suppress(OSError):
            pids.update(int(x) for x in (Path(here) / "cgroup.procs").read_text().split())
    return pids


def remove_tree(root: Path) -> tuple[list[Path], list[Path]]:
    """Remove group ``root`` and every group below it, deepest first. Returns (removed,
    left): a group that still has processes, or whose last ones are still exiting, is left
    (and so are its parents); a group that is already gone counts as neither."""
    removed: list[Path] = []
    left: list[Path] = []
    if not root.is_dir():
        return removed, left
    for here, _, _ in os.walk(root, topdown=False):
        path = Path(here)
        if any(p.is_relative_to(path) for p in left):
            left.append(path)
        elif _rmdir(path):
            removed.append(path)
        else:
            left.append(path)
    return removed, left


def _rmdir(path: Path) -> bool:
    """Remove a group directory; False while it is busy. A group whose last processes are still
    exiting answers EBUSY for a moment after its main process was reaped: the caller retries."""
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            logger.warning("cannot remove cgroup %s: %s", path, exc.strerror)
        return False
    return True


# ------------------------------------------------------------------------------ cgroup v2


@dataclass(slots=True)
class _V2Group:
    path: Path

    @property
    def procs_files(self) -> tuple[Path, ...]:
        return (self.path / "cgroup.procs",)

    @property
    def limits_memory(self) -> bool:
        return True

    def usage(self) -> GroupUsage:
        cpu = _read_keyed(self.path / "cpu.stat")
        return GroupUsage(cpu.get("usage_usec", 0) / 1e6, self._resident(), cpu.get("nr_throttled"))

    def _resident(self) -> int:
        stat = _read_keyed(self.path / "memory.stat")
        return stat.get("anon", 0) + stat.get("shmem", 0)

    def set_limits(self, cpu: float, memory_mb: int) -> None:
        memory_max = self.path / "memory.max"
        _refuse_below(self._resident(), memory_mb, memory_max)
        _write(memory_max, str(memory_mb * _MIB))
        _write(self.path / "cpu.max", f"{cpu_quota_us(cpu)} {CFS_PERIOD_US}")

    def oom_kills(self) -> int:
        return _read_keyed(self.path / "memory.events").get("oom_kill", 0)

    def remove(self) -> bool:
        return _rmdir(self.path)


@dataclass(slots=True)
class CgroupV2:
    """Groups in the unified hierarchy: ``<mount><own group>/dlrover-kfp-…/<pod>``."""

    parent: Path
    _created: bool = False
    _count: int = 0

    @property
    def description(self) -> str:
        return "cgroup v2 (cpu.max, memory.max)"

    @property
    def directories(self) -> tuple[Path, ...]:
        return (self.parent,)

    def setup(self) -> None:
        controllers = set((self.parent.parent / "cgroup.controllers").read_text().split())
        missing = {"cpu", "memory"} - controllers
        if missing:
            raise CgroupError(
                errno.ENOTSUP, f"{self.parent.parent} does not offer {sorted(missing)}"
            )
        _mkdir(self.parent)
        self._created = True
        # Children get the cpu and memory controllers. The kernel refuses this for a group with
        # processes of its own; ours is new and empty.
        _write(self.parent / "cgroup.subtree_control", "+cpu +memory")

    def create(self, name: str, cpu: float, memory_mb: int) -> PodGroup:
        self._count += 1
        path = self.parent / f"{name}-{self._count}"
        _mkdir(path)
        group = _V2Group(path)
        try:
            _write(path / "cpu.max", f"{cpu_quota_us(cpu)} {CFS_PERIOD_US}")
            _write(path / "memory.max", str(memory_mb * _MIB))
            # Like a container without swap: the limit is on memory, not memory + swap; and
            # like a current kubelet's container, an OOM kill takes the whole group.
            for knob, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                if (path / knob).exists():
                    _write(path / knob, value)
        except CgroupError:
            group.remove()
            raise
        return group

    def close(self) -> None:
        if self._created:
            remove_tree(self.parent)


# ------------------------------------------------------------------------------ cgroup v1


@dataclass(slots=True)
class _V1Group:
    cpu: Path
    cpuacct: Path | None
    memory: Path | None

    @property
    def dirs(self) -> tuple[Path, ...]:
        # cpu and cpuacct are often one hierarchy ("cpu,cpuacct"): one directory, listed once.
        out: list[Path] = []
        for d in (self.cpu, self.cpuacct, self.memory):
            if d is not None and d not in out:
                out.append(d)
        return tuple(out)

    @property
    def procs_files(self) -> tuple[Path, ...]:
        return tuple(d / "cgroup.procs" for d in self.dirs)

    @property
    def limits_memory(self) -> bool:
        return self.memory is not None

    def usage(self) -> GroupUsage:
        if self.cpuacct is None:
            raise CgroupError(errno.ENOTSUP, "no cpuacct hierarchy: CPU is not accounted here")
        cpu_ns = _read_int(self.cpuacct / "cpuacct.usage")
        memory = self._resident()
        throttled = None
        with contextlib.suppress(OSError, ValueError):  # a kernel without CFS bandwidth stats
            throttled = _read_keyed(self.cpu / "cpu.stat").get("nr_throttled")
        return GroupUsage(cpu_ns / 1e9, memory, throttled)

    def _resident(self) -> int | None:
        if self.memory is None:
            return None
        stat = _read_keyed(self.memory / "memory.stat")
        return stat.get("total_rss", 0) + stat.get("total_shmem", 0)

    def set_limits(self, cpu: float, memory_mb: int) -> None:
        if self.memory is not None:
            # Checked first: with swap the kernel would page the pod out to meet the limit.
            # Past the check it reclaims cache, and answers EBUSY when it cannot get below.
            limit = self.memory / "memory.limit_in_bytes"
            _refuse_below(self._resident(), memory_mb, limit)
            _write(limit, str(memory_mb * _MIB))
        _write(self.cpu / "cpu.cfs_quota_us", str(cpu_quota_us(cpu)))

    def oom_kills(self) -> int:
        if self.memory is None:
            return 0
        return _read_keyed(self.memory / "memory.oom_control").get("oom_kill", 0)

    def remove(self) -> bool:
        return all([_rmdir(d) for d in self.dirs])


@dataclass(slots=True)
class CgroupV1:
    """Groups in the v1 hierarchies; ``cpu`` is required, ``cpuacct`` and ``memory`` are used
    when present. ``parents`` maps each controller to its per-backend parent directory."""

    parents: Mapping[str, Path]
    _created: list[Path] = field(default_factory=list)
    _count: int = 0

    @property
    def description(self) -> str:
        return f"cgroup v1 ({', '.join(sorted(self.parents))})"

    @property
    def directories(self) -> tuple[Path, ...]:
        return tuple(dict.fromkeys(self.parents.values()))

    def setup(self) -> None:
        for d in dict.fromkeys(self.parents.values()):
            _mkdir(d)
            self._created.append(d)

    def create(self, name: str, cpu: float, memory_mb: int) -> PodGroup:
        self._count += 1
        leaf = f"{name}-{self._count}"
        cpu_dir = self.parents["cpu"] / leaf
        acct = self.parents.get("cpuacct")
        mem = self.parents.get("memory")
        group = _V1Group(
            cpu_dir,
            acct / leaf if acct is not None else None,
            mem / leaf if mem is not None else None,
        )
        try:
            for d in group.dirs:
                _mkdir(d)
            _write(cpu_dir / "cpu.cfs_period_us", str(CFS_PERIOD_US))
            _write(cpu_dir / "cpu.cfs_quota_us", str(cpu_quota_us(cpu)))
            if group.memory is not None:
                _write(group.memory / "memory.limit_in_bytes", str(memory_mb * _MIB))
        except CgroupError:
            group.remove()
            raise
        return group

    def close(self) -> None:
        for d in reversed(self._created):
            remove_tree(d)
        self._created.clear()


# ------------------------------------------------------------------------------ detection


def detect(
    *,
    mountinfo: str | None = None,
    proc_cgroup: str | None = None,
    prefer: Iterable[str] = ("v2", "v1"),
) -> Cgroups | str:
    """The cgroups this process can create pods' groups in, or one line saying why none.

    Creates the per-backend parent group(s) as a test: a driver is returned only once a group
    could really be made. ``mountinfo``/``proc_cgroup`` are the contents of
    ``/proc/self/mountinfo`` and ``/proc/self/cgroup`` (read here when not given).
    """
    try:
        mountinfo = mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text()
        own = own_groups(
            proc_cgroup if proc_cgroup is not None else Path("/proc/self/cgroup").read_text()
        )
    except OSError as exc:
        return f"cannot read this process's cgroups ({exc.strerror}): not Linux?"
    mounts = cgroup_mounts(mountinfo)
    name = f"dlrover-kfp-{os.getpid()}-{secrets.token_hex(3)}"
    reasons = []
    for version in prefer:
        try:
            if version == "v2":
                driver2 = _detect_v2(mounts, own, name)
                if driver2 is not None:
                    return driver2
                reasons.append("no cgroup v2 hierarchy with cpu and memory")
            else:
                driver1 = _detect_v1(mounts, own, name)
                if driver1 is not None:
                    return driver1
                reasons.append("no cgroup v1 cpu hierarchy")
        except (CgroupError, OSError) as exc:
            reasons.append(f"{version}: {exc}")
    return "; ".join(reasons)


def _detect_v2(
    mounts: list[CgroupMount], own: Mapping[str, PurePosixPath], name: str
) -> CgroupV2 | None:
    mount = next((m for m in mounts if m.fstype == "cgroup2"), None)
    if mount is None or "" not in own:
        return None
    base = Path(group_dir(mount, own[""]))
    if not (base / "cgroup.controllers").read_text().split():
        return None  # a v2 mount without controllers (they are all bound to v1 hierarchies)
    driver = CgroupV2(base / name)
    try:
        driver.setup()
    except (CgroupError, OSError):
        driver.close()
        raise
    return driver


def _detect_v1(
    mounts: list[CgroupMount], own: Mapping[str, PurePosixPath], name: str
) -> CgroupV1 | None:
    parents: dict[str, Path] = {}
    for controller in ("cpu", "cpuacct", "memory"):
        mount = next((m for m in mounts if m.fstype == "cgroup" and controller in m.options), None)
        if mount is None:
            continue
        parents[controller] = Path(group_dir(mount, own.get(controller, PurePosixPath("/")))) / name
    if "cpu" not in parents:
        return None
    driver = CgroupV1(parents)
    try:
        driver.setup()
    except CgroupError as exc:
        driver.close()
        if len(parents) == 1:
            raise
        # Without cpuacct or memory the quota still holds (accounting falls back to the
        # processes' own CPU times); without cpu nothing does.
        logger.debug("cgroup v1: setup failed (%s); trying the cpu controller alone", exc)
        driver = CgroupV1({"cpu": parents["cpu"]})
        driver.setup()
    return driver


def quota_cores(group_dir: Path) -> float | None:
    """The CPU limit of a v1 or v2 group directory in cores (None when unlimited), parsed as a
    pod's own process parses it (:mod:`dlrover_kfp.core.cpu_limit`)."""
    cpu_max = group_dir / "cpu.max"
    if cpu_max.exists():
        return cores_from_cpu_max(cpu_max.read_text())
    return cores_from_cfs(
        (group_dir / "cpu.cfs_quota_us").read_text(), (group_dir / "cpu.cfs_period_us").read_text()
    )


__all__ = [
    "CFS_PERIOD_US",
    "PROCS_ENV",
    "CgroupError",
    "CgroupV1",
    "CgroupV2",
    "Cgroups",
    "GroupUsage",
    "PodGroup",
    "cpu_quota_us",
    "detect",
    "quota_cores",
    "remove_tree",
    "throttled_share",
    "tree_pids",
    "wrap_command",
]
