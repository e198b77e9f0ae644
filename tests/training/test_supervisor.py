"""The PS pod's supervisor on its own, around a tiny child script (no trainer, no master).

The child appends ``<restarts> <cause>`` to a file at each start and then does the action its
argument list gives for that start: ``exitN`` (exit with N), ``killN`` (die of signal N),
``asked`` (exit with the supervisor's restart code) or ``wait`` (sleep until stopped).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest

from dlrover_kfp.backends import cgroups as cg
from dlrover_kfp.training import supervisor

_CHILD = """\
import os, sys, time
log, actions, restart_code = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
n = int(os.environ.get("DLROVER_KFP_RESTARTS", "0"))
with open(log, "a") as f:
    f.write(f"{n} {os.environ.get('DLROVER_KFP_RESTART_CAUSE', '-')}\\n")
action = actions[min(n, len(actions) - 1)]
if action.startswith("exit"):
    sys.exit(int(action[4:]))
if action.startswith("kill"):
    os.kill(os.getpid(), int(action[4:]))
if action == "asked":
    sys.exit(restart_code)
time.sleep(60)
"""


def _start(tmp_path: Path, actions: str) -> tuple[subprocess.Popen[bytes], Path]:
    script, log = tmp_path / "child.py", tmp_path / "starts.log"
    script.write_text(_CHILD)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dlrover_kfp.training.supervisor",
            "--",
            sys.executable,
            str(script),
            str(log),
            actions,
            str(supervisor.RESTART_EXIT),
        ],
        stderr=subprocess.PIPE,
        start_new_session=True,  # a pod: its own process group
    )
    return proc, log


def _run(tmp_path: Path, actions: str) -> tuple[int, list[str], str]:
    proc, log = _start(tmp_path, actions)
    _, err = proc.communicate(timeout=30)
    return proc.returncode, log.read_text().splitlines(), err.decode()


def _started(log: Path, count: int) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if log.exists() and len(log.read_text().splitlines()) >= count:
            time.sleep(0.2)  # past the write, into its sleep
            return
        time.sleep(0.02)
    raise AssertionError(f"the child did not start {count} time(s)")


def test_a_crashed_child_is_restarted_with_its_count_and_cause_until_it_exits_0(
    tmp_path: Path,
) -> None:
    code, starts, err = _run(tmp_path, "exit3,kill9,exit0")
    assert code == 0
    assert starts == ["0 -", "1 exit 3", "2 signal 9"]
    assert "crashed (exit 3); restarting it in this pod (restart 1)" in err
    assert "crashed (signal 9); restarting it in this pod (restart 2)" in err


def test_a_child_that_exits_0_ends_the_pod_at_once(tmp_path: Path) -> None:
    code, starts, _ = _run(tmp_path, "exit0")
    assert (code, starts) == (0, ["0 -"])


def test_more_crashes_than_the_bound_end_the_pod_with_the_childs_code(tmp_path: Path) -> None:
    code, starts, err = _run(tmp_path, "exit5")
    assert code == 5
    assert len(starts) == supervisor.MAX_CRASHES + 1
    assert "giving up, the pod fails" in err


def test_a_death_by_signal_past_the_bound_reads_128_plus_n(tmp_path: Path) -> None:
    code, starts, _ = _run(tmp_path, "kill9")
    assert code == 128 + 9
    assert len(starts) == supervisor.MAX_CRASHES + 1


def test_the_restart_code_restarts_without_counting_as_a_crash(tmp_path: Path) -> None:
    asked = ",".join(["asked"] * (supervisor.MAX_CRASHES + 2))
    code, starts, err = _run(tmp_path, f"{asked},exit0")
    assert code == 0
    assert len(starts) == supervisor.MAX_CRASHES + 3
    assert starts[1:] == [f"{n} asked" for n in range(1, supervisor.MAX_CRASHES + 3)]
    assert "asked to be restarted" in err and "crashed" not in err


@pytest.mark.parametrize("to_group", [False, True], ids=["supervisor", "group"])
def test_a_stop_signal_is_forwarded_and_not_taken_for_a_crash(
    tmp_path: Path, to_group: bool
) -> None:
    """SIGTERM to the supervisor alone (a kubelet signals the container's first process) is
    forwarded; SIGTERM to the whole group (a local pod's stop) reaches the child first, and its
    death of it must still read as a stop."""
    proc, log = _start(tmp_path, "wait")
    _started(log, 1)
    if to_group:
        os.killpg(proc.pid, signal.SIGTERM)
    else:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=15)
    assert proc.returncode == 128 + signal.SIGTERM
    assert log.read_text().splitlines() == ["0 -"]
    assert "stopped by signal 15" in err.decode()


def test_a_child_killed_from_outside_is_restarted_in_the_same_process_group(
    tmp_path: Path,
) -> None:
    """What a crash of a PS process looks like: its pid (a child of the pod's pid) SIGKILLed."""
    proc, log = _start(tmp_path, "wait")
    try:
        _started(log, 1)
        (child,) = psutil.Process(proc.pid).children()
        child.kill()
        _started(log, 2)
        (again,) = psutil.Process(proc.pid).children()
        assert again.pid != child.pid
        assert os.getpgid(again.pid) == proc.pid
        assert log.read_text().splitlines() == ["0 -", "1 signal 9"]
    finally:
        proc.terminate()
        proc.communicate(timeout=15)
    assert proc.returncode == 128 + signal.SIGTERM


def test_describe_and_exit_code_read_waitpid_statuses() -> None:
    killed = signal.SIGKILL  # status of a death by signal 9: the signal number itself
    assert supervisor.describe(killed) == "signal 9"
    assert supervisor.exit_code(killed) == 137
    assert supervisor.describe(3 << 8) == "exit 3"
    assert supervisor.exit_code(3 << 8) == 3
    assert supervisor.restarts({"DLROVER_KFP_RESTARTS": "2"}) == 2
    assert supervisor.restarts({"DLROVER_KFP_RESTARTS": "x"}) == 0
    assert supervisor.restarts({}) == 0


def _cgroup_root(tmp_path: Path, self_cgroup: str, files: dict[str, str]) -> Path:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(self_cgroup)
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_oom_kills_are_read_from_the_memory_cgroup_v1_and_v2(tmp_path: Path) -> None:
    """An OOM-killed PS is not restarted (the pod must fail, to be relaunched bigger): the
    supervisor compares its memory cgroup's OOM kill count before and after the child."""
    v2 = _cgroup_root(
        tmp_path / "v2",
        "0::/kubepods/pod1/ps\n",
        {"sys/fs/cgroup/kubepods/pod1/ps/memory.events": "low 0\noom 2\noom_kill 2\n"},
    )
    assert supervisor.oom_kills(v2) == 2
    v1 = _cgroup_root(
        tmp_path / "v1",
        "4:cpu,cpuacct:/a\n3:memory:/dlrover-kfp-1/ps-0\n",
        {
            "sys/fs/cgroup/memory/dlrover-kfp-1/ps-0/memory.oom_control": (
                "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"
            )
        },
    )
    assert supervisor.oom_kills(v1) == 1
    assert supervisor.oom_kills(_cgroup_root(tmp_path / "none", "4:cpu:/a\n", {})) is None
    assert supervisor.oom_kills(tmp_path / "nothing") is None


_EAT = "x = []\nwhile True:\n    x.append(bytearray(16 << 20))\n"


def test_a_child_killed_for_memory_ends_the_pod_without_a_restart(tmp_path: Path) -> None:
    """Under cgroup v1 the kernel kills the biggest process of a group over its limit (the
    PS), not the group: the supervisor sees the OOM kill in its memory cgroup and ends the
    pod after one start, for the relaunch policy to give it more memory. (A bare cgroup: the
    local backend's watchdog would end the pod itself, as ``memory.oom.group`` does.)"""
    found = cg.detect()
    if isinstance(found, str) or "memory" not in found.description:
        pytest.skip(f"no memory cgroup to create: {found}")
    log = tmp_path / "starts.log"
    child = f"open({str(log)!r}, 'a').write('start\\n')\n" + _EAT
    group = found.create("oom-ps-0", 0.5, 128)
    try:
        command = (sys.executable, "-m", "dlrover_kfp.training.supervisor", "--")
        argv, env = cg.wrap_command((*command, sys.executable, "-c", child), group)
        proc = subprocess.run(
            argv, env=os.environ | env, stderr=subprocess.PIPE, timeout=30, check=False
        )
    finally:
        group.remove()
        found.close()
    assert proc.returncode == 128 + signal.SIGKILL
    assert log.read_text().splitlines() == ["start"]
    assert "was killed for memory (signal 9); the pod fails" in proc.stderr.decode()
