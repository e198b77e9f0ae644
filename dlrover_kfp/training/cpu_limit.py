"""This pod's CPU as it is now: the trainer's one reader of its CPU limit.

A pod starts knowing its CPU from ``DLROVER_KFP_POD_CPU``; an in-place resize then changes its
group's CFS quota and nothing else (:mod:`dlrover_kfp.core.cpu_limit` says where the quota is
and how it reads). :class:`PodCpu` reads the quota when the group is the pod's own (at start
its quota is the pod's CPU) and the variable otherwise (no quota: a local pod without
cgroups, whose group is its master's), and :meth:`PodCpu.changed` tells a process polling
between batches, at most every ``interval_s``, that its CPU moved: a worker then sets its
torch threads (:mod:`.node`), a PS its snapshot-copy threads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

from dlrover_kfp.core.cpu_limit import (
    CpuGroup,
    cores_from_cfs,
    cores_from_cpu_max,
    cpu_group,
    pod_group_cores,
)
from dlrover_kfp.core.pod_env import POD_CPU_ENV

#: How often a process looks at its quota: a few small file reads, every second at most.
POLL_S = 1.0


def env_cpu(env: Mapping[str, str]) -> float:
    """The CPU the pod started with (``DLROVER_KFP_POD_CPU``); 1 when unset or not a positive
    number."""
    try:
        cpu = float(env.get(POD_CPU_ENV, "1"))
    except ValueError:
        return 1.0
    return cpu if 0 < cpu < float("inf") else 1.0


def read_quota(group: CpuGroup, root: Path = Path("/")) -> float | None:
    """Cores of ``group``'s quota now (None: unlimited, or the group is gone)."""
    where = root / str(group.directory).lstrip("/")
    try:
        if group.version == 2:
            return cores_from_cpu_max((where / "cpu.max").read_text())
        return cores_from_cfs(
            (where / "cpu.cfs_quota_us").read_text(), (where / "cpu.cfs_period_us").read_text()
        )
    except (OSError, ValueError):
        return None


def own_group(root: Path = Path("/")) -> CpuGroup | None:
    """This process's CPU group (``root``: where ``/proc`` and the cgroup mounts are; a test's
    directory)."""
    try:
        mountinfo = (root / "proc/self/mountinfo").read_text()
        proc_cgroup = (root / "proc/self/cgroup").read_text()
    except OSError:
        return None  # not Linux
    return cpu_group(mountinfo, proc_cgroup)


class PodCpu:
    """This pod's CPU in cores, following its quota where the quota is the pod's own."""

    def __init__(
        self,
        env: Mapping[str, str],
        *,
        root: Path = Path("/"),
        clock: Callable[[], float] = time.monotonic,
        interval_s: float = POLL_S,
    ) -> None:
        self._root = root
        self._clock = clock
        self._interval_s = interval_s
        started = env_cpu(env)
        group = own_group(root)
        quota = read_quota(group, root) if group is not None else None
        #: the group followed; None when the quota is not the pod's (the variable holds)
        self.group = group if pod_group_cores(quota, started) else None
        self.cores = started if self.group is None or quota is None else quota
        self._read_at = clock()

    def changed(self) -> float | None:
        """The new cores if the quota changed since the last look (looking at most every
        ``interval_s``), else None."""
        now = self._clock()
        if self.group is None or now - self._read_at < self._interval_s:
            return None
        self._read_at = now
        quota = read_quota(self.group, self._root)
        if quota is None or abs(quota - self.cores) < 1e-9:
            return None
        self.cores = quota
        return quota


__all__ = ["POLL_S", "PodCpu", "env_cpu", "own_group", "read_quota"]
