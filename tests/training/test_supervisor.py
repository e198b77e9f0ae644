"""The PS pod's supervisor on its own, around a tiny child script (no trainer, no master).

The child appends ``<restarts> <cause>`` to a file at each start and then does the action its
argument list gives for that start: ``exitN`` (exit with N), ``killN`` (die of signal N),
``raise`` (an exception), ``asked`` (exit with the supervisor's restart code) or ``wait``
(sleep until stopped). Started by ``posix_spawn`` (a command), or forked from the supervisor
after it preloaded the child's module (``--fork``, as a PS pod's supervisor does).
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

#: The child's action at its start ``n``: exit, die of a signal, raise, return the restart
#: code (the caller exits with it) or wait.
_ACT = """\
import os, signal, sys, threading, time


def act(actions, n, restart_code):
    action = actions[min(n, len(actions) - 1)]
    if action.startswith("exit"):
        sys.exit(int(action[4:]))
    if action.startswith("kill"):
        os.kill(os.getpid(), int(action[4:]))
    if action == "raise":
        raise RuntimeError("a crash in main")
    if action == "asked":
        return restart_code
    time.sleep(60)
    return 0
"""

_CHILD = (
    _ACT
    + """
log, actions, restart_code = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
n = int(os.environ.get("DLROVER_KFP_RESTARTS", "0"))
with open(log, "a") as f:
    f.write(f"{n} {os.environ.get('DLROVER_KFP_RESTART_CAUSE', '-')}\\n")
sys.exit(act(actions, n, restart_code))
"""
)


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


# The fork path (``--fork MODULE``): a tiny module the supervisor preloads, standing in for the
# trainer. Its import is logged (``import <pid>``) and so is each start of its main
# (``<restarts> <cause> <pid> <blocked signals> <SIGTERM's disposition>``), then the action of
# that start, as _CHILD's.
_MODULE = (
    _ACT
    + """
LOG = os.environ["SUPERVISED_LOG"]
with open(LOG, "a") as f:
    f.write(f"import {os.getpid()}\\n")
if os.environ.get("SUPERVISED_THREAD"):  # a thread left running by an import
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()


def main(argv):
    n = int(os.environ.get("DLROVER_KFP_RESTARTS", "0"))
    cause = os.environ.get("DLROVER_KFP_RESTART_CAUSE", "-").replace(" ", "_")
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    term = "default" if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL else "other"
    with open(LOG, "a") as f:
        f.write(f"{n} {cause} {os.getpid()} {len(blocked)} {term}\\n")
    return act(argv[0].split(","), n, int(argv[1]))


if __name__ == "__main__":  # the same start as a new interpreter (no fork)
    sys.exit(main(sys.argv[1:]))
"""
)


_FORK = (sys.executable, "-m", "dlrover_kfp.training.supervisor", "--fork", "tiny_ps", "--")


def _start_forked(
    tmp_path: Path, actions: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    (tmp_path / "tiny_ps.py").write_text(_MODULE)
    log = tmp_path / "starts.log"
    proc = subprocess.Popen(
        [*_FORK, actions, str(supervisor.RESTART_EXIT)],
        env=os.environ
        | {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        | {"SUPERVISED_LOG": str(log)}
        | (env or {}),
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    return proc, log


def _starts(log: Path) -> tuple[list[str], list[list[str]]]:
    """(the pids that imported the module, each start's fields)."""
    lines = [line.split() for line in log.read_text().splitlines()]
    return [f[1] for f in lines if f[0] == "import"], [f for f in lines if f[0] != "import"]


def test_a_forked_child_crashes_then_serves_again_without_loading_its_module_again(
    tmp_path: Path,
) -> None:
    """The module is imported once, by the supervisor; every start (the first, after a crash in
    main, after a sys.exit, after a restart asked for) is a fork of it with its restart count
    and cause, an empty signal mask and SIGTERM at its default, as a new interpreter has."""
    proc, log = _start_forked(tmp_path, "raise,exit3,asked,wait")
    try:
        _started(log, 5)  # the import and four starts
        imported, starts = _starts(log)
        assert imported == [str(proc.pid)]
        causes = [["0", "-"], ["1", "exit_1"], ["2", "exit_3"], ["3", "asked"]]
        assert [s[:2] for s in starts] == causes
        assert all(s[2] != str(proc.pid) for s in starts)  # children, not the supervisor
        assert all(s[3:] == ["0", "default"] for s in starts)
        (child,) = psutil.Process(proc.pid).children()
        assert child.pid == int(starts[-1][2]) and os.getpgid(child.pid) == proc.pid
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 128 + signal.SIGTERM
    text = err.decode()
    assert "preloaded tiny_ps in" in text and "children are forked" in text
    assert "RuntimeError: a crash in main" in text  # the child's traceback, in the pod's log
    assert "crashed (exit 1); restarting it in this pod (restart 1)" in text
    assert "crashed (exit 3); restarting it in this pod (restart 2)" in text
    assert "asked to be restarted; restart 3" in text
    assert "stopped by signal 15" in text


def test_a_forked_child_past_the_crash_bound_ends_the_pod_with_its_code(tmp_path: Path) -> None:
    proc, log = _start_forked(tmp_path, "kill9")
    proc.communicate(timeout=30)
    imported, starts = _starts(log)
    assert proc.returncode == 128 + signal.SIGKILL
    assert (len(imported), len(starts)) == (1, supervisor.MAX_CRASHES + 1)


def test_a_forked_child_interrupted_dies_of_sigint_as_an_interpreter_does(tmp_path: Path) -> None:
    """SIGINT raises KeyboardInterrupt in the child, as in a new interpreter, which then dies of
    the signal (not exit 1): the same crash, read the same way, as a spawned child's."""
    proc, log = _start_forked(tmp_path, "kill2,exit0")
    proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert [s[:2] for s in _starts(log)[1]] == [["0", "-"], ["1", "signal_2"]]
    (tmp_path / "spawned").mkdir()
    code, starts, _ = _run(tmp_path / "spawned", "kill2,exit0")
    assert (code, starts) == (0, ["0 -", "1 signal 2"])


def test_a_supervisor_that_runs_a_thread_does_not_fork_but_starts_an_interpreter(
    tmp_path: Path,
) -> None:
    """A fork copies only the forking thread (a lock another one holds stays held in the
    child): with a thread running, each start is a new interpreter, which imports the module
    itself, and the log says why."""
    proc, log = _start_forked(tmp_path, "exit3,exit0", env={"SUPERVISED_THREAD": "1"})
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    imported, starts = _starts(log)
    assert [s[:2] for s in starts] == [["0", "-"], ["1", "exit_3"]]
    assert imported == [str(proc.pid)] + [s[2] for s in starts]  # each child imported it
    assert err.decode().count("not forking: 2 Python threads run") == 2


def test_fork_hazard_sees_a_running_thread() -> None:
    import threading  # noqa: PLC0415

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    try:
        assert supervisor.fork_hazard() is not None
    finally:
        stop.set()
        thread.join()


@pytest.mark.parametrize(
    "args",
    [["--fork"], ["--fork", "m"], ["--preload", "m", "--", "x"], ["--spawn", "--", "x"], ["--"]],
)
def test_bad_arguments_exit_2_with_the_usage(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert supervisor.main(args) == 2
    assert "usage:" in capsys.readouterr().err


def test_the_module_announces_the_pod_before_the_preloads_load(tmp_path: Path) -> None:
    """``MODULE.announce(args)`` runs in the supervisor before any ``--preload`` module is
    imported (the PS pod tells its master it is loading before torch loads: training/node.py),
    leaves no thread behind (the child is still forked), and the child then starts as before."""
    (tmp_path / "tiny_ps.py").write_text(
        _MODULE
        + """

def announce(argv):
    with open(LOG, "a") as f:
        f.write(f"announce {os.getpid()} {'tiny_dep' in sys.modules} {' '.join(argv)}\\n")
"""
    )
    (tmp_path / "tiny_dep.py").write_text(
        "import os\nwith open(os.environ['SUPERVISED_LOG'], 'a') as f:\n"
        "    f.write(f'dep {os.getpid()}\\n')\n"
    )
    log = tmp_path / "starts.log"
    command = [
        sys.executable, "-m", "dlrover_kfp.training.supervisor", "--fork", "tiny_ps",
        "--preload", "tiny_dep", "--", "wait", str(supervisor.RESTART_EXIT),
    ]  # fmt: skip
    proc = subprocess.Popen(
        command,
        env=os.environ
        | {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        | {"SUPERVISED_LOG": str(log)},
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        _started(log, 4)  # the module's import, its announce, the preload, the first start
        lines = [line.split() for line in log.read_text().splitlines()]
        assert [f[0] for f in lines[:3]] == ["import", "announce", "dep"], lines
        assert lines[1][1:] == [str(proc.pid), "False", "wait", str(supervisor.RESTART_EXIT)]
        assert lines[3][2] != str(proc.pid)  # forked: the announce left no thread running
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    assert "children are forked" in err.decode()
