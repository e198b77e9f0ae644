"""Per-pod cgroups: the file layout each cgroup version gets (on a fake cgroup file system), and
the limits the kernel really enforces on local pods (on this machine's cgroups, as root).

The enforcement tests measure busy processes, so they take a few seconds each; they skip, with
the detector's own reason, where this process may not create cgroups (not root, no cgroup
controllers, not Linux).

They hold on a busy machine: a limited pod is measured beside an unlimited control pod of the
same backend, over the same window. The two are sibling groups of equal weight, so whatever
else runs on the machine, the kernel offers them the same share ``s`` of what it gives the
backend; a pod limited to ``q`` cores gets ``min(q, s)`` and the control at least that. So a
limit is checked as ``min(q, control) <= used <= q`` (with a margin), never against absolute
cores: on a quiet machine that is the old ``used ≈ q``, on a loaded one the control shows how
much less the machine gave. A limit that is not enforced still fails whenever the machine gives
the control more than the limit (on two cores, anything short of three other busy processes).
"""

from __future__ import annotations

import errno
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlrover_kfp.backends import LocalBackend, PodPhase, PodSpec, PodUsage
from dlrover_kfp.backends import cgroups as cg

# Spinning processes (threads would share one GIL): the pod asks for more CPU than it may use.
BUSY = (
    "import os, sys\n"
    "for _ in range(int(sys.argv[1]) - 1):\n"
    "    if os.fork() == 0:\n"
    "        break\n"
    "while True:\n"
    "    pass\n"
)

_found = cg.detect()
REAL_CGROUPS_REASON = (
    f"cannot create cgroups here: {_found}" if isinstance(_found, str) else "cgroups available"
)
if not isinstance(_found, str):
    _found.close()
needs_cgroups = pytest.mark.skipif(isinstance(_found, str), reason=REAL_CGROUPS_REASON)


def busy_pod(name: str, cpu: float, threads: int = 1, memory_mb: int = 256) -> PodSpec:
    return PodSpec(
        name=name,
        role="worker",
        index=0,
        command=(sys.executable, "-c", BUSY, str(threads)),
        cpu=cpu,
        memory_mb=memory_mb,
    )


def usage_over(backend: LocalBackend, seconds: float) -> dict[str, PodUsage]:
    """Every pod's usage over the same ``seconds`` (after a short warm-up), by its accounting."""
    time.sleep(0.5)  # interpreter start-up is not what we measure
    backend.usage()  # resets the pods' CPU marks
    time.sleep(seconds)
    return {u.name: u for u in backend.usage()}


def cores_over(backend: LocalBackend, seconds: float) -> dict[str, float]:
    """Mean cores each pod used over the same ``seconds``."""
    return {name: u.cpu_cores for name, u in usage_over(backend, seconds).items()}


# ------------------------------------------------------------------------- pure arithmetic


@pytest.mark.parametrize(
    ("periods", "wall_s", "share"),
    [(0, 1.0, 0.0), (5, 1.0, 0.5), (10, 1.0, 1.0), (30, 2.0, 1.0), (3, 0.0, 0.0), (-2, 1.0, 0.0)],
)
def test_throttled_share_is_per_period_of_wall_time(
    periods: int, wall_s: float, share: float
) -> None:
    # 100 ms periods: 10 a second; more throttles than periods (a late read) clamp to 1.
    assert cg.throttled_share(periods, wall_s) == pytest.approx(share)


@pytest.mark.parametrize(
    ("cpu", "quota"), [(0.5, 50_000), (0.25, 25_000), (1.5, 150_000), (0.001, 1_000), (4, 400_000)]
)
def test_quota_is_cores_times_the_period_with_the_kernel_minimum(cpu: float, quota: int) -> None:
    assert cg.cpu_quota_us(cpu) == quota


# ------------------------------------------------------------------- layout on a fake cgroupfs

MOUNTINFO_V1 = """\
25 30 0:23 / /sys rw - sysfs sysfs rw
33 25 0:28 / {root}/cpu rw,relatime shared:10 - cgroup cgroup rw,cpu
34 25 0:29 / {root}/cpuacct rw,relatime shared:11 - cgroup cgroup rw,cpuacct
35 25 0:30 / {root}/memory rw,relatime shared:12 - cgroup cgroup rw,memory
36 25 0:31 / {root}/unified rw,relatime shared:13 - cgroup2 cgroup2 rw
"""
PROC_CGROUP_V1 = "4:memory:/job/abc\n2:cpuacct:/\n1:cpu:/\n0::/\n"

MOUNTINFO_V2 = "29 23 0:26 / {root} rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
PROC_CGROUP_V2 = "0::/user.slice/me\n"


def test_v1_layout_follows_each_hierarchy_and_this_process_s_own_group(tmp_path: Path) -> None:
    for d in ("cpu", "cpuacct", "memory/job/abc", "unified"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "unified" / "cgroup.controllers").write_text("\n")  # v2 without controllers

    driver = cg.detect(mountinfo=MOUNTINFO_V1.format(root=tmp_path), proc_cgroup=PROC_CGROUP_V1)

    assert isinstance(driver, cg.CgroupV1), driver
    assert driver.description == "cgroup v1 (cpu, cpuacct, memory)"
    group = driver.create("job-ps-0", cpu=0.5, memory_mb=300)
    cpu_dir = next((tmp_path / "cpu").glob("dlrover-kfp-*")) / "job-ps-0-1"
    mem_dir = next((tmp_path / "memory" / "job" / "abc").glob("dlrover-kfp-*")) / "job-ps-0-1"
    assert (cpu_dir / "cpu.cfs_quota_us").read_text() == "50000"
    assert (cpu_dir / "cpu.cfs_period_us").read_text() == "100000"
    assert (mem_dir / "memory.limit_in_bytes").read_text() == str(300 << 20)
    assert cg.quota_cores(cpu_dir) == 0.5
    assert len(group.procs_files) == 3
    assert group.procs_files[2] == mem_dir / "cgroup.procs"
    assert group.limits_memory


def test_v2_layout_sets_cpu_max_memory_max_and_enables_the_controllers(tmp_path: Path) -> None:
    own = tmp_path / "user.slice" / "me"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")

    driver = cg.detect(mountinfo=MOUNTINFO_V2.format(root=tmp_path), proc_cgroup=PROC_CGROUP_V2)

    assert isinstance(driver, cg.CgroupV2), driver
    parent = next(own.glob("dlrover-kfp-*"))
    assert (parent / "cgroup.subtree_control").read_text() == "+cpu +memory"
    group = driver.create("job-worker-3", cpu=1.5, memory_mb=1024)
    leaf = parent / "job-worker-3-1"
    assert (leaf / "cpu.max").read_text() == "150000 100000"
    assert (leaf / "memory.max").read_text() == str(1024 << 20)
    assert cg.quota_cores(leaf) == 1.5
    assert group.procs_files == (leaf / "cgroup.procs",)
    # The accounting files as the kernel writes them.
    (leaf / "cpu.stat").write_text(
        "usage_usec 2500000\nuser_usec 2000000\nnr_periods 40\nnr_throttled 12\n"
    )
    (leaf / "memory.stat").write_text("anon 1048576\nfile 999999999\nshmem 2097152\n")
    (leaf / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
    assert group.usage() == cg.GroupUsage(
        cpu_seconds=2.5, memory_bytes=3 << 20, throttled_periods=12
    )
    assert group.oom_kills() == 1


def test_set_limits_rewrites_a_running_group_and_refuses_less_memory_than_it_holds(
    tmp_path: Path,
) -> None:
    """Both versions: the quota and the limit rewritten in place; a memory limit below the
    group's resident memory refused (EBUSY) naming the file, every file as it was."""
    for d in ("cpu", "cpuacct", "memory/job/abc", "unified"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "unified" / "cgroup.controllers").write_text("\n")
    v1 = cg.detect(mountinfo=MOUNTINFO_V1.format(root=tmp_path), proc_cgroup=PROC_CGROUP_V1)
    own = tmp_path / "v2" / "user.slice" / "me"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpu memory\n")
    v2 = cg.detect(mountinfo=MOUNTINFO_V2.format(root=tmp_path / "v2"), proc_cgroup=PROC_CGROUP_V2)
    assert isinstance(v1, cg.CgroupV1) and isinstance(v2, cg.CgroupV2), (v1, v2)
    g1, g2 = v1.create("job-worker-0", 1.0, 300), v2.create("job-worker-0", 1.0, 300)
    assert isinstance(g1, cg._V1Group) and isinstance(g2, cg._V2Group)
    assert g1.memory is not None
    (g1.memory / "memory.stat").write_text("total_rss 104857600\ntotal_shmem 52428800\n")
    (g2.path / "memory.stat").write_text("anon 104857600\nshmem 52428800\nfile 999\n")
    files = {
        "v1": (g1.cpu / "cpu.cfs_quota_us", g1.memory / "memory.limit_in_bytes", g1),
        "v2": (g2.path / "cpu.max", g2.path / "memory.max", g2),
    }
    for version, (quota, limit, group) in files.items():
        group.set_limits(0.25, 200)
        assert (cg.quota_cores(quota.parent), limit.read_text()) == (0.25, str(200 << 20))

        before = (quota.read_text(), limit.read_text())
        with pytest.raises(cg.CgroupError) as refused:
            group.set_limits(2.0, 100)  # it holds 150 MiB

        assert refused.value.errno == errno.EBUSY, version
        assert str(limit) in str(refused.value) and "holds 150 MiB" in str(refused.value)
        assert (quota.read_text(), limit.read_text()) == before, version


def test_no_usable_hierarchy_is_a_reason_not_an_error(tmp_path: Path) -> None:
    reason = cg.detect(mountinfo="25 30 0:23 / /sys rw - sysfs sysfs rw\n", proc_cgroup="0::/\n")

    assert isinstance(reason, str)
    assert "v1" in reason and "v2" in reason


def test_a_hierarchy_where_no_group_can_be_made_is_a_reason_naming_the_directory(
    tmp_path: Path,
) -> None:
    # Not a permission test (root ignores those): a mount point whose path cannot hold a
    # directory fails the same way, on the same mkdir.
    (tmp_path / "not-a-dir").write_text("")
    mountinfo = f"33 25 0:28 / {tmp_path}/not-a-dir rw - cgroup cgroup rw,cpu\n"

    reason = cg.detect(mountinfo=mountinfo, proc_cgroup="1:cpu:/\n")

    assert isinstance(reason, str)
    assert str(tmp_path / "not-a-dir") in reason


def test_the_wrapper_joins_every_group_before_the_command_runs(tmp_path: Path) -> None:
    procs = [tmp_path / "a.procs", tmp_path / "b.procs"]

    class Group:
        procs_files = tuple(procs)

    argv, env = cg.wrap_command(
        (sys.executable, "-c", "import os; print(os.getpid())"),
        Group(),  # type: ignore[arg-type]
    )
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)

    pid = out.stdout.strip()
    assert [p.read_text().strip() for p in procs] == [pid, pid]


def test_the_wrapper_refuses_to_run_outside_its_group(tmp_path: Path) -> None:
    class Group:
        procs_files = (tmp_path / "missing-dir" / "cgroup.procs",)

    argv, env = cg.wrap_command(
        (sys.executable, "-c", "print('ran')"),
        Group(),  # type: ignore[arg-type]
    )
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)

    assert out.returncode == 126
    assert "ran" not in out.stdout


# ---------------------------------------------------------------- the kernel, on local pods


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[LocalBackend]:
    with LocalBackend(tmp_path / "logs") as backend:
        yield backend
        backend.close(grace_s=0.5)


@needs_cgroups
def test_a_busy_pod_at_half_a_core_uses_half_a_core(backend: LocalBackend) -> None:
    assert backend.cpu_enforced
    backend.launch(busy_pod("busy-0", cpu=0.5, threads=2))
    backend.launch(busy_pod("control-0", cpu=2.0, threads=2))  # a quota it cannot reach

    used = cores_over(backend, 4.0)

    # Two spinning processes would take both cores; the quota holds them to 0.5 (a CFS period
    # is 0.1 s, so 4 s average 40 periods), or to the control's share if the machine gave less.
    limited, control = used["busy-0"], used["control-0"]
    assert min(0.45, 0.7 * control) <= limited <= 0.55, used


@needs_cgroups
def test_a_quarter_core_pod_is_throttled_and_a_whole_core_pod_is_not(
    backend: LocalBackend,
) -> None:
    backend.launch(busy_pod("busy-q", cpu=0.25))
    backend.launch(busy_pod("busy-w", cpu=1.0))  # one process: the quarter-core pod's control

    usage = usage_over(backend, 3.0)
    q, w = usage["busy-q"], usage["busy-w"]

    assert q.cpu_cores <= 0.3, usage
    assert 0.8 * q.cpu_cores <= w.cpu_cores <= 1.1, usage  # one spinning process
    # The throttling signal of Stage 3's starved-PS rule. The whole-core pod's use bounds its
    # quota at its 1 core or more (one process never runs out of a whole core's quota).
    assert w.cpu_throttled is not None, w
    assert w.cpu_throttled == 0 or w.cpu_cores / w.cpu_throttled >= 0.9, w
    # The quarter-core pod used its whole quota in each throttled period and at most that in
    # the others: quota in [use, use / throttled share], whatever the machine gave it.
    assert q.cpu_throttled is not None, q
    assert q.cpu_throttled == 0 or q.cpu_cores / q.cpu_throttled >= 0.2, usage
    # Where the machine gave its control (the whole-core pod) well over that quota (2.4 quotas:
    # uneven load on the two cores can still leave the quarter-core pod one quota's share), it
    # ran out of it in nearly every period, which pins the quota near 0.25 cores; else it got
    # less than its quota, by no less than the control's share, allowing for that unevenness.
    if w.cpu_cores >= 0.6:
        assert q.cpu_throttled >= 0.8, usage
        assert 0.2 <= q.cpu_cores / q.cpu_throttled <= 0.35, usage
        assert q.cpu_cores >= 0.2, usage
    else:
        assert q.cpu_cores >= 0.4 * w.cpu_cores, usage


@needs_cgroups
def test_a_finished_pod_s_groups_are_removed_and_close_removes_the_parents(
    tmp_path: Path,
) -> None:
    backend = LocalBackend(tmp_path / "logs")
    driver = backend._cgroups
    assert driver is not None
    quick = PodSpec(
        name="quick-0",
        role="ps",
        index=0,
        command=(sys.executable, "-c", "pass"),
        cpu=0.5,
        memory_mb=128,
    )
    backend.launch(quick)
    parents = _parents(driver)
    assert all(_children(p) for p in parents)  # the pod's own group in every hierarchy

    deadline = time.monotonic() + 10
    while any(_children(p) for p in parents):  # the watchdog removes it once the pod ended
        assert time.monotonic() < deadline, [_children(p) for p in parents]
        time.sleep(0.05)

    assert [s.phase for s in backend.statuses()] == [PodPhase.SUCCEEDED]
    backend.close()
    assert not any(p.exists() for p in parents)


def _parents(driver: cg.Cgroups) -> list[Path]:
    if isinstance(driver, cg.CgroupV1):
        return list(dict.fromkeys(driver.parents.values()))
    assert isinstance(driver, cg.CgroupV2)
    return [driver.parent]


def _children(parent: Path) -> list[Path]:
    return [p for p in parent.iterdir() if p.is_dir()]


@needs_cgroups
def test_usage_counts_the_threads_and_children_of_a_pod(backend: LocalBackend) -> None:
    code = (
        "import subprocess, sys\n"
        f"kid = subprocess.Popen([sys.executable, '-c', {BUSY!r}, '1'])\n"
        "sys.argv = ['', '1']\n"
        f"exec({BUSY!r})\n"
    )
    backend.launch(
        PodSpec(
            name="family-0",
            role="worker",
            index=0,
            command=(sys.executable, "-c", code),
            cpu=1.0,
            memory_mb=256,
        )
    )
    backend.launch(busy_pod("control-0", cpu=2.0, threads=2))

    used = cores_over(backend, 3.0)

    # Parent and child spin together, under one quota of 1 core, or the control's share; one
    # of them left out of the count would read half that.
    family, control = used["family-0"], used["control-0"]
    assert min(0.85, 0.75 * control) <= family <= 1.1, used


@needs_cgroups
def test_the_kernel_memory_limit_kills_the_pod_as_oom_killed(backend: LocalBackend) -> None:
    grow = "chunks = []\nwhile True:\n    chunks.append(b'x' * (16 << 20))\n"
    backend.launch(
        PodSpec(
            name="hog-0",
            role="ps",
            index=0,
            command=(sys.executable, "-c", grow),
            cpu=1.0,
            memory_mb=150,
        )
    )
    deadline = time.monotonic() + 10
    while True:
        (status,) = backend.statuses()
        if status.phase.terminal:
            break
        assert time.monotonic() < deadline
        time.sleep(0.02)

    assert (status.reason, status.exit_code) == ("OOMKilled", 137)


def test_without_cgroups_the_backend_says_so_once_and_only_accounts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cg, "detect", lambda: "no cgroup v1 cpu hierarchy")
    with caplog.at_level(logging.WARNING, logger="dlrover_kfp.backends.local"):
        backend = LocalBackend(tmp_path / "logs")
        backend.launch(busy_pod("busy-0", cpu=0.25))
        backend.launch(busy_pod("busy-1", cpu=0.25))
        time.sleep(0.5)
        backend.close()

    assert not backend.cpu_enforced
    assert backend.enforcement == "not enforced: no cgroup v1 cpu hierarchy"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([w for w in warnings if "NOT enforced" in w]) == 1
    assert all("\n" not in w for w in warnings)
