"""A process's CPU limit from its cgroup (core/cpu_limit.py: the parsing; training/cpu_limit.py:
the reading), on file trees laid out as the kernel and a container runtime lay them out."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

from dlrover_kfp.core.cpu_limit import (
    CpuGroup,
    cores_from_cfs,
    cores_from_cpu_max,
    cpu_group,
    pod_group_cores,
)
from dlrover_kfp.core.pod_env import POD_CPU_ENV
from dlrover_kfp.training.cpu_limit import PodCpu, env_cpu

V2_MOUNT = "30 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev shared:4 - cgroup2 cgroup2 rw\n"
V1_MOUNTS = (
    "36 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "37 30 0:32 /docker/abc /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup "
    "rw,cpu,cpuacct\n"
)


def test_quota_texts_read_as_cores() -> None:
    assert cores_from_cpu_max("50000 100000\n") == 0.5
    assert cores_from_cpu_max("max 100000\n") is None
    assert cores_from_cfs("150000\n", "100000\n") == 1.5
    assert cores_from_cfs("-1\n", "100000\n") is None


def test_the_own_group_is_found_in_v2_then_in_the_v1_cpu_hierarchy() -> None:
    assert cpu_group(V2_MOUNT, "0::/pods/job-worker-0-1\n") == CpuGroup(
        2, PurePosixPath("/sys/fs/cgroup/pods/job-worker-0-1")
    )
    # In a container with its own cgroup namespace: its group is the mount's root.
    assert cpu_group(V2_MOUNT, "0::/\n") == CpuGroup(2, PurePosixPath("/sys/fs/cgroup"))
    # v1: the cpu line, under a mount whose root is the container's group.
    proc = "5:memory:/docker/abc/x\n4:cpu,cpuacct:/docker/abc/pod-1\n"
    assert cpu_group(V1_MOUNTS, proc) == CpuGroup(
        1, PurePosixPath("/sys/fs/cgroup/cpu,cpuacct/pod-1")
    )
    assert cpu_group("", "0::/\n") is None
    # A hybrid host: a cgroup2 mount without controllers beside the v1 ones, which hold cpu.
    hybrid = V1_MOUNTS + V2_MOUNT.replace("/sys/fs/cgroup ", "/sys/fs/cgroup/unified ")
    assert cpu_group(hybrid, proc + "0::/\n") == CpuGroup(
        1, PurePosixPath("/sys/fs/cgroup/cpu,cpuacct/pod-1")
    )


def test_a_group_is_the_pods_when_its_quota_is_the_cpu_the_pod_started_with() -> None:
    assert pod_group_cores(0.5, 0.5)
    assert pod_group_cores(0.01, 0.005)  # the kernel's 1 ms floor
    assert not pod_group_cores(2.0, 0.5)  # its master's container
    assert not pod_group_cores(None, 0.5)


def _tree(root: Path, quota: str, own: str = "/pods/w-1") -> Path:
    """A v2 host as the process sees it under ``root``; returns the group's cpu.max."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/mountinfo").write_text(V2_MOUNT)
    (root / "proc/self/cgroup").write_text(f"0::{own}\n")
    group = root / "sys/fs/cgroup" / own.lstrip("/")
    group.mkdir(parents=True, exist_ok=True)
    (group / "cpu.max").write_text(quota)
    return group / "cpu.max"


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_pod_follows_its_quota_at_most_every_interval(tmp_path: Path) -> None:
    cpu_max = _tree(tmp_path, "50000 100000")
    clock = _Clock()
    cpu = PodCpu({POD_CPU_ENV: "0.5"}, root=tmp_path, clock=clock, interval_s=1.0)
    assert cpu.cores == 0.5 and cpu.group is not None
    cpu_max.write_text("200000 100000")  # resized in place to 2 cores
    clock.t = 0.5
    assert cpu.changed() is None  # not looked at yet
    clock.t = 1.0
    assert cpu.changed() == 2.0 and cpu.cores == 2.0
    clock.t = 2.5
    assert cpu.changed() is None  # unchanged since


@pytest.mark.parametrize(
    ("quota", "why"), [("max 100000", "no quota"), ("200000 100000", "the master's group")]
)
def test_without_a_quota_of_its_own_the_pod_keeps_its_variable(
    tmp_path: Path, quota: str, why: str
) -> None:
    cpu_max = _tree(tmp_path, quota, own="/")
    clock = _Clock()
    cpu = PodCpu({POD_CPU_ENV: "0.5"}, root=tmp_path, clock=clock)
    assert (cpu.cores, cpu.group) == (0.5, None), why
    cpu_max.write_text("400000 100000")
    clock.t = 10.0
    assert cpu.changed() is None, why


def test_the_variable_reads_as_one_core_when_unset_or_bad() -> None:
    assert [env_cpu(e) for e in ({}, {POD_CPU_ENV: "x"}, {POD_CPU_ENV: "-1"})] == [1.0] * 3
    assert env_cpu({POD_CPU_ENV: "2.5"}) == 2.5
