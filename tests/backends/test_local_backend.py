"""One behavioural suite for every :class:`~dlrover_kfp.ports.ClusterBackend`.

:class:`ClusterBackendContract` holds what any backend must do, written only against the port.
A backend's test class inherits it and provides three fixtures:

* ``backend``: a fresh backend, closed after the test;
* ``python``: the argv prefix that runs Python inside a pod (``(sys.executable,)`` locally,
  ``("python",)`` in a container image);
* ``shared_dir``: a directory that both the test and the pods can read and write (``tmp_path``
  locally; a mounted volume on a cluster, or ``pytest.skip`` where there is none).

The class attributes ``start_timeout_s`` and ``oom_timeout_s`` give a slower backend more time.
A backend whose pods do not run on this machine (a real cluster) overrides ``cpu_control`` with
``None``: a busy pod's use is then checked against absolute cores (see :class:`SpinningControl`).

:class:`TestLocalBackend` runs the contract on local processes and adds what only processes
have: pids, process groups, log files, the memory watchdog.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest

from dlrover_kfp.backends import (
    POD_CPU_ENV,
    POD_MEMORY_ENV,
    BackendClosedError,
    ClusterBackend,
    LocalBackend,
    PodExistsError,
    PodNotFoundError,
    PodPhase,
    PodSpec,
    PodStatus,
    PodUsage,
)
from dlrover_kfp.backends.local import (
    MIN_USAGE_WINDOW_S,
    POD_OWNER_ENV,
    exit_code_of,
    reap_pods,
)
from dlrover_kfp.core.profile import Role
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.ports import FixedClock

SECRET = "s3cr3t-value-that-must-not-leak"

SLEEP_FOREVER = "import time; time.sleep(60)"
IGNORE_SIGTERM = (
    "import signal, sys, time, pathlib\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "pathlib.Path(sys.argv[3]).write_text('ready')\n"
    "time.sleep(60)\n"
)
# Grows to 400 MiB in 20 MiB steps; bytes * n writes every page, so all of it is resident.
GROW_400_MB = (
    "import time\n"
    "chunks = []\n"
    "for _ in range(20):\n"
    "    chunks.append(b'x' * (20 << 20))\n"
    "    time.sleep(0.02)\n"
    "time.sleep(30)\n"
)
# Appends its pid to argv[3] (a restarted pod would add a second line), then spins.
BUSY_PID = (
    "import os, sys\n"
    "with open(sys.argv[3], 'a') as f:\n"
    "    f.write(f'{os.getpid()}\\n')\n"
    "while True:\n"
    "    pass\n"
)
# Where a pod's shared memory is, as the trainer's flash checkpoint finds it
# (training/checkpoint/shm.py default_shm_dir; importing it would cost every pod 0.3 s).
_SHM_DIR = "pathlib.Path(os.environ.get('DLROVER_KFP_SHM_DIR') or '/dev/shm')"
# Writes a snapshot into the pod's shared memory, then its directory to argv[3]; sleeps if
# argv[4] is given, else exits.
SHM_WRITE = (
    "import os, pathlib, sys, time\n"
    f"shm = {_SHM_DIR}\n"
    "(shm / 'a.snap').write_text('kept')\n"
    "pathlib.Path(sys.argv[3]).write_text(str(shm))\n"
    "if len(sys.argv) > 4:\n"
    "    time.sleep(60)\n"
)
# Fails, naming what it found, unless the pod's shared memory is empty.
SHM_EMPTY = (
    "import os, pathlib, sys\n"
    f"found = sorted(p.name for p in {_SHM_DIR}.iterdir())\n"
    "sys.exit(f'shared memory not empty: {found}' if found else 0)\n"
)


def wait_for(
    backend: ClusterBackend,
    name: str,
    predicate: Callable[[PodStatus], bool],
    timeout_s: float,
) -> PodStatus:
    deadline = time.monotonic() + timeout_s
    last: PodStatus | None = None
    while True:
        last = next((s for s in backend.statuses() if s.name == name), None)
        if last is not None and predicate(last):
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"pod {name} not as expected after {timeout_s}s: {last}")
        time.sleep(0.02)


def wait_gone(path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} still there after {timeout_s}s: {list(path.iterdir())}")
        time.sleep(0.02)


def usage_after(backend: ClusterBackend, name: str, seconds: float) -> PodUsage:
    """The pod's usage over the ``seconds`` from now (a cluster reports it from its own last
    sampling window: ``seconds`` must span two of them)."""
    backend.usage()
    time.sleep(seconds)
    deadline = time.monotonic() + 5.0
    while True:
        found = next((u for u in backend.usage() if u.name == name), None)
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"no usage of {name}")
        time.sleep(0.1)


# Holds 150 MiB, resident, then sleeps.
HOLD_150_MB = "import time\nx = b'x' * (150 << 20)\ntime.sleep(60)\n"


def wait_holding(backend: ClusterBackend, name: str, mb: float, timeout_s: float) -> None:
    """Wait until the pod's usage shows ``mb`` MiB resident (the kernel's accounting, like
    metrics-server's, lags an allocation a little)."""
    deadline = time.monotonic() + timeout_s
    while not any(u.name == name and u.memory_mb >= mb for u in backend.usage()):
        assert time.monotonic() < deadline, f"{name} never held {mb} MiB: {backend.usage()}"
        time.sleep(0.1)


def terminal(status: PodStatus) -> bool:
    return status.phase.terminal


def running(status: PodStatus) -> bool:
    return status.phase == PodPhase.RUNNING


class SpinningControl:
    """An unlimited spinning process beside a busy pod: what this machine gives one busy process
    now, by the kernel's own accounting of the control's CPU time.

    A busy pod's use is checked against it, not against absolute cores, so that the check holds
    on a loaded machine (two other busy processes on two cores leave each about 0.5 core). A
    pod's cgroup competes for the CPU as one process does (equal weight), so both get the same
    share whatever else runs.
    """

    def __init__(self) -> None:
        self._proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        self._process = psutil.Process(self._proc.pid)
        self._mark = (self._cpu_s(), time.monotonic())

    def _cpu_s(self) -> float:
        times = self._process.cpu_times()
        return float(times.user + times.system)

    def mark(self) -> None:
        """Starts a window."""
        self._mark = (self._cpu_s(), time.monotonic())

    def cores(self) -> float:
        """Mean cores the control used since :meth:`mark`."""
        cpu_s, t = self._mark
        return (self._cpu_s() - cpu_s) / (time.monotonic() - t)

    def close(self) -> None:
        self._proc.kill()
        self._proc.wait()


def wait_file(path: Path, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or not path.read_text():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} not written within {timeout_s}s")
        time.sleep(0.02)
    return path.read_text()


class ClusterBackendContract:
    """The behaviour every cluster backend shares; see the module docstring for the fixtures."""

    start_timeout_s = 10.0
    oom_timeout_s = 3.0

    @pytest.fixture
    def pod(self, python: tuple[str, ...]) -> Callable[..., PodSpec]:
        """Builds a pod running ``code`` with ``python -c``; argv names role and index."""

        def make(
            name: str,
            code: str,
            *,
            role: Role = "worker",
            index: int = 0,
            extra_args: tuple[str, ...] = (),
            env: dict[str, str] | None = None,
            cpu: float = 1.0,
            memory_mb: int = 256,
        ) -> PodSpec:
            return PodSpec(
                name=name,
                role=role,
                index=index,
                command=(*python, "-c", code, f"--role={role}", f"--index={index}", *extra_args),
                env=env or {},
                cpu=cpu,
                memory_mb=memory_mb,
                labels={"job": "test", "role": role},
            )

        return make

    @pytest.fixture
    def cpu_control(self) -> Iterator[SpinningControl | None]:
        """The control a busy pod is measured against; ``None`` where pods run elsewhere."""
        control = SpinningControl()
        yield control
        control.close()

    def test_pod_runs_to_success(
        self, backend: ClusterBackend, pod: Callable[..., PodSpec]
    ) -> None:
        backend.launch(pod("ctr-ps-0", "import time; time.sleep(0.3)", role="ps", index=0))
        first = wait_for(backend, "ctr-ps-0", lambda s: True, self.start_timeout_s)
        assert first.phase in (PodPhase.PENDING, PodPhase.RUNNING)
        wait_for(backend, "ctr-ps-0", running, self.start_timeout_s)

        done = wait_for(backend, "ctr-ps-0", terminal, self.start_timeout_s)

        assert (done.phase, done.reason, done.exit_code) == (PodPhase.SUCCEEDED, "Completed", 0)
        assert (done.role, done.index) == ("ps", 0)
        assert done.started_at is not None and done.finished_at is not None
        assert done.started_at <= done.finished_at

    def test_nonzero_exit_is_an_error_with_its_code(
        self, backend: ClusterBackend, pod: Callable[..., PodSpec]
    ) -> None:
        backend.launch(pod("ctr-worker-1", "import sys; sys.exit(3)", index=1))

        done = wait_for(backend, "ctr-worker-1", terminal, self.start_timeout_s)

        assert (done.phase, done.reason, done.exit_code) == (PodPhase.FAILED, "Error", 3)
        assert (done.role, done.index) == ("worker", 1)

    def test_pod_over_its_memory_limit_is_oom_killed(
        self, backend: ClusterBackend, pod: Callable[..., PodSpec]
    ) -> None:
        backend.launch(pod("ctr-ps-1", GROW_400_MB, role="ps", index=1, memory_mb=200))
        wait_for(backend, "ctr-ps-1", running, self.start_timeout_s)
        started = time.monotonic()

        done = wait_for(backend, "ctr-ps-1", terminal, self.oom_timeout_s)

        assert (done.phase, done.reason, done.exit_code) == (PodPhase.FAILED, "OOMKilled", 137)
        assert time.monotonic() - started < self.oom_timeout_s

    def test_delete_terminates_and_is_idempotent(
        self, backend: ClusterBackend, pod: Callable[..., PodSpec]
    ) -> None:
        backend.launch(pod("ctr-worker-0", SLEEP_FOREVER))
        wait_for(backend, "ctr-worker-0", running, self.start_timeout_s)

        backend.delete("ctr-worker-0", grace_s=5.0)
        after = wait_for(backend, "ctr-worker-0", lambda s: True, 0)
        backend.delete("ctr-worker-0", grace_s=5.0)
        backend.delete("never-launched")

        assert (after.phase, after.reason, after.exit_code) == (PodPhase.FAILED, "Deleted", 143)
        again = wait_for(backend, "ctr-worker-0", lambda s: True, 0)
        assert again == after

    def test_pod_ignoring_sigterm_is_killed_after_the_grace_period(
        self, backend: ClusterBackend, pod: Callable[..., PodSpec], shared_dir: Path
    ) -> None:
        ready = shared_dir / "ready"
        backend.launch(pod("ctr-worker-2", IGNORE_SIGTERM, index=2, extra_args=(str(ready),)))
        wait_file(ready, self.start_timeout_s)

        started = time.monotonic()
        backend.delete("ctr-worker-2", grace_s=0.5)
        elapsed = time.monotonic() - started
        done = wait_for(backend, "ctr-worker-2", terminal, self.start_timeout_s)

        assert 0.5 <= elapsed < 3.0
        assert (done.phase, done.reason, done.exit_code) == (PodPhase.FAILED, "Deleted", 137)

    def test_duplicate_running_name_raises_but_a_finished_one_relaunches(
        self, backend: ClusterBackend, pod: Callable[..., PodSpec]
    ) -> None:
        backend.launch(pod("ctr-worker-0", SLEEP_FOREVER))

        with pytest.raises(PodExistsError):
            backend.launch(pod("ctr-worker-0", "pass"))

        backend.delete("ctr-worker-0", grace_s=1.0)
        backend.launch(pod("ctr-worker-0", "import sys; sys.exit(7)"))
        done = wait_for(backend, "ctr-worker-0", terminal, self.start_timeout_s)
        assert (done.reason, done.exit_code) == ("Error", 7)
        assert [s.name for s in backend.statuses()] == ["ctr-worker-0"]

    def test_usage_reports_cpu_and_memory_of_running_pods_only(
        self,
        backend: ClusterBackend,
        pod: Callable[..., PodSpec],
        cpu_control: SpinningControl | None,
    ) -> None:
        backend.launch(pod("ctr-worker-0", "while True: pass", cpu=2.0, memory_mb=300))
        backend.launch(pod("ctr-worker-1", "pass", index=1))
        wait_for(backend, "ctr-worker-1", terminal, self.start_timeout_s)
        wait_for(backend, "ctr-worker-0", running, self.start_timeout_s)
        time.sleep(0.3)
        backend.usage()  # since start: includes the interpreter's start-up
        if cpu_control is not None:
            cpu_control.mark()

        time.sleep(1.0)
        (busy,) = backend.usage()

        # One spinning process: at most a core, and what the machine gave the control beside
        # it (a whole core on a quiet machine) within 40 %.
        given = 1.0 if cpu_control is None else min(1.0, cpu_control.cores())
        assert busy.name == "ctr-worker-0"
        assert 0.6 * given <= busy.cpu_cores <= 1.3, (busy.cpu_cores, given)
        assert 0 < busy.memory_mb < 300
        assert (busy.role, busy.index) == ("worker", 0)
        assert (busy.cpu_requested, busy.memory_requested_mb) == (2.0, 300)
        backend.delete("ctr-worker-0", grace_s=1.0)
        assert backend.usage() == []

    def test_resize_changes_a_running_pods_cpu_in_place(
        self, backend: ClusterBackend, pod: Callable[..., PodSpec], shared_dir: Path
    ) -> None:
        """The same process goes on under the new quota: one pid, the new request in usage(),
        and, where CPU is enforced, its use held below the new quota though it spun freely
        before (compared with its own use, measured here: the machine may be loaded)."""
        pids = shared_dir / "pids"
        backend.launch(pod("ctr-worker-0", BUSY_PID, extra_args=(str(pids),), cpu=1.0))
        wait_file(pids, self.start_timeout_s)
        started = wait_for(backend, "ctr-worker-0", running, self.start_timeout_s).started_at
        before = usage_after(backend, "ctr-worker-0", 1.2)

        outcome = backend.resize("ctr-worker-0", 0.1, 256, timeout_s=self.start_timeout_s)
        after = usage_after(backend, "ctr-worker-0", 1.2)

        assert outcome.in_place, outcome.reason
        assert 0 <= outcome.seconds < self.start_timeout_s
        cores = f"{before.cpu_cores:.2f} -> {after.cpu_cores:.2f}"
        print(f"in place in {outcome.seconds:.3f} s; cores {cores}")
        assert len(pids.read_text().split()) == 1  # never restarted
        assert wait_for(backend, "ctr-worker-0", running, 0).started_at == started
        assert (before.cpu_requested, after.cpu_requested) == (1.0, 0.1)
        assert after.memory_requested_mb == 256
        if backend.cpu_enforced:
            assert after.cpu_cores <= 0.1 * 1.3 + 0.02, (before, after)
            assert before.cpu_cores >= 1.5 * after.cpu_cores, (before, after)
        backend.delete("ctr-worker-0", grace_s=1.0)
        with pytest.raises(PodNotFoundError):
            backend.resize("ctr-worker-0", 0.5, 256)
        with pytest.raises(PodNotFoundError):
            backend.resize("never-launched", 0.5, 256)

    def test_env_and_resources_reach_the_pod(
        self, backend: ClusterBackend, pod: Callable[..., PodSpec], shared_dir: Path
    ) -> None:
        out = shared_dir / "env.txt"
        code = (
            "import os, sys, pathlib\n"
            "pathlib.Path(sys.argv[3]).write_text(os.environ['DLROVER_TEST_SECRET'])\n"
            f"ok = os.environ[{POD_CPU_ENV!r}] == '1.5'\n"
            f"ok = ok and os.environ[{POD_MEMORY_ENV!r}] == '256'\n"
            "sys.exit(0 if ok else 5)\n"
        )
        backend.launch(
            pod(
                "ctr-worker-0",
                code,
                extra_args=(str(out),),
                env={"DLROVER_TEST_SECRET": SECRET},
                cpu=1.5,
                memory_mb=256,
            )
        )

        done = wait_for(backend, "ctr-worker-0", terminal, self.start_timeout_s)

        assert (done.reason, done.exit_code) == ("Completed", 0)
        assert out.read_text() == SECRET
        assert SECRET not in repr(backend.statuses())

    def test_close_stops_every_pod_and_refuses_new_ones(
        self, backend: ClusterBackend, pod: Callable[..., PodSpec]
    ) -> None:
        backend.launch(pod("ctr-ps-0", SLEEP_FOREVER, role="ps"))
        backend.launch(pod("ctr-worker-0", SLEEP_FOREVER))
        backend.launch(pod("ctr-worker-1", "pass", index=1))
        wait_for(backend, "ctr-worker-1", terminal, self.start_timeout_s)

        backend.close()
        backend.close()

        by_name = {s.name: s for s in backend.statuses()}
        assert by_name["ctr-ps-0"].reason == "Deleted"
        assert by_name["ctr-worker-0"].reason == "Deleted"
        assert by_name["ctr-worker-1"].reason == "Completed"  # finished before: left as it was
        assert [s.name for s in backend.statuses()] == ["ctr-ps-0", "ctr-worker-0", "ctr-worker-1"]
        with pytest.raises(BackendClosedError):
            backend.launch(pod("ctr-worker-2", "pass", index=2))

    def test_no_pod_reads_another_pods_shared_memory(
        self, backend: ClusterBackend, pod: Callable[..., PodSpec], shared_dir: Path
    ) -> None:
        """Each pod's /dev/shm is its own, as every emptyDir on Kubernetes: a new PS cannot
        read a live one's snapshot, even beside it on one node."""
        where = shared_dir / "where-0"
        backend.launch(pod("ctr-ps-0", SHM_WRITE, role="ps", extra_args=(str(where), "stay")))
        wait_file(where, self.start_timeout_s)

        backend.launch(pod("ctr-ps-1", SHM_EMPTY, role="ps", index=1))
        done = wait_for(backend, "ctr-ps-1", terminal, self.start_timeout_s)

        assert (done.reason, done.exit_code) == ("Completed", 0), done.message
        assert wait_for(backend, "ctr-ps-0", running, 0)  # its snapshot was there all along

    def test_a_pods_shared_memory_lives_and_ends_with_the_pod(
        self, backend: ClusterBackend, pod: Callable[..., PodSpec], shared_dir: Path
    ) -> None:
        """Kept while the pod runs; torn down once it has terminated (a kubelet removes a
        terminated pod's memory-backed volumes) or is deleted; a relaunch under the same name
        is a new pod, with a new, empty directory."""
        where = [shared_dir / "where-0", shared_dir / "where-1"]
        backend.launch(pod("ctr-ps-0", SHM_WRITE, role="ps", extra_args=(str(where[0]), "x")))
        backend.launch(pod("ctr-ps-1", SHM_WRITE, role="ps", index=1, extra_args=(str(where[1]),)))
        live = Path(wait_file(where[0], self.start_timeout_s))
        assert (live / "a.snap").read_text() == "kept"

        done = wait_for(backend, "ctr-ps-1", terminal, self.start_timeout_s)
        assert done.reason == "Completed"
        ended = Path(where[1].read_text())
        assert ended != live
        wait_gone(ended, self.start_timeout_s)
        backend.launch(pod("ctr-ps-1", SHM_EMPTY, role="ps", index=1))
        again = wait_for(backend, "ctr-ps-1", terminal, self.start_timeout_s)
        assert (again.reason, again.exit_code) == ("Completed", 0), again.message

        assert (live / "a.snap").read_text() == "kept"  # the running pod's is untouched
        backend.delete("ctr-ps-0", grace_s=1.0)
        wait_gone(live, self.start_timeout_s)


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie awaiting its (re)parent's wait()."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def wait_dead(pid: int, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# Starts a grandchild that sleeps, writes its pid to argv[3], then runs argv[4] as its own body.
SPAWN_GRANDCHILD = (
    "import pathlib, subprocess, sys\n"
    "kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "pathlib.Path(sys.argv[3]).write_text(str(kid.pid))\n"
    "exec(sys.argv[4])\n"
)


# Starts a grandchild in a session of its own (out of the pod's process group), writes its pid
# to argv[3], and sleeps.
ESCAPE_THE_GROUP = (
    "import pathlib, subprocess, sys, time\n"
    "kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],\n"
    "                       start_new_session=True)\n"
    "pathlib.Path(sys.argv[3]).write_text(str(kid.pid))\n"
    "time.sleep(60)\n"
)
# A master with a local backend of its own: launches two pods that sleep, prints their pids,
# and waits to be killed.
MASTER_WITH_PODS = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from dlrover_kfp.backends import LocalBackend, PodSpec\n"
    "backend = LocalBackend(Path(sys.argv[1]), cgroups=sys.argv[2])\n"
    "for i in range(2):\n"
    "    backend.launch(PodSpec(name=f'ctr-worker-{i}', role='worker', index=i, cpu=1.0,\n"
    "        memory_mb=100, command=(sys.executable, '-c', 'import time; time.sleep(60)')))\n"
    "print(backend.pid_of('ctr-worker-0'), backend.pid_of('ctr-worker-1'), flush=True)\n"
    "time.sleep(60)\n"
)


def pods_shm_dir(log_dir: Path) -> Path:
    """The directory of a backend's pods' shared memory, as its record in ``log_dir`` says."""
    (record,) = log_dir.glob(".local-backend-*.json")
    return Path(json.loads(record.read_text())["shm"])


class TestLocalBackend(ClusterBackendContract):
    oom_timeout_s = 3.0
    cgroups: Literal["auto", "off"] = "auto"

    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[LocalBackend]:
        with LocalBackend(tmp_path / "logs") as backend:
            yield backend
            backend.close(grace_s=0.5)

    @pytest.fixture
    def python(self) -> tuple[str, ...]:
        return (sys.executable,)

    @pytest.fixture
    def shared_dir(self, tmp_path: Path) -> Path:
        path = tmp_path / "shared"
        path.mkdir()
        return path

    def test_close_leaves_no_process_alive(
        self, backend: LocalBackend, pod: Callable[..., PodSpec], tmp_path: Path
    ) -> None:
        kid_file, ready = tmp_path / "kid", tmp_path / "ready"
        backend.launch(
            pod("ctr-ps-0", SPAWN_GRANDCHILD, role="ps", extra_args=(str(kid_file), SLEEP_FOREVER))
        )
        backend.launch(pod("ctr-worker-0", IGNORE_SIGTERM, extra_args=(str(ready),)))
        grandchild = int(wait_file(kid_file, 5.0))
        wait_file(ready, 5.0)
        pids = [backend.pid_of("ctr-ps-0"), backend.pid_of("ctr-worker-0")]
        assert all(pid is not None and alive(pid) for pid in pids)

        started = time.monotonic()
        backend.close(grace_s=0.5)

        assert time.monotonic() - started < 2.0  # one grace period for all pods, not one each
        assert not any(psutil.pid_exists(pid) for pid in pids if pid is not None)  # reaped
        assert wait_dead(grandchild)

    def test_context_manager_kills_pods_when_the_caller_raises(
        self, tmp_path: Path, pod: Callable[..., PodSpec]
    ) -> None:
        pid = None
        with (
            pytest.raises(RuntimeError, match="job master crashed"),
            LocalBackend(tmp_path / "logs") as backend,
        ):
            backend.launch(pod("ctr-worker-0", SLEEP_FOREVER))
            pid = backend.pid_of("ctr-worker-0")
            raise RuntimeError("job master crashed")

        assert pid is not None and not psutil.pid_exists(pid)
        assert backend.statuses()[0].reason == "Deleted"

    def test_interpreter_exit_without_close_still_stops_pods(self, tmp_path: Path) -> None:
        script = (
            "import sys\n"
            "from pathlib import Path\n"
            "from dlrover_kfp.backends import LocalBackend, PodSpec\n"
            "backend = LocalBackend(Path(sys.argv[1]))\n"
            "backend.launch(PodSpec(name='ctr-worker-0', role='worker', index=0, cpu=1.0,\n"
            "    memory_mb=100, command=(sys.executable, '-c', 'import time; time.sleep(60)')))\n"
            "print(backend.pid_of('ctr-worker-0'))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / "logs")],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=Path(__file__).parents[2],
            check=True,
        )

        assert wait_dead(int(done.stdout))

    def test_cut_short_ends_the_grace_period_of_a_pod_that_ignores_sigterm(
        self, tmp_path: Path, pod: Callable[..., PodSpec]
    ) -> None:
        hurry = threading.Event()
        ready = tmp_path / "ready"
        with LocalBackend(tmp_path / "logs", cgroups=self.cgroups, cut_short=hurry.is_set) as b:
            b.launch(pod("ctr-worker-0", IGNORE_SIGTERM, extra_args=(str(ready),)))
            wait_file(ready, 5.0)
            pid = b.pid_of("ctr-worker-0")
            threading.Timer(0.3, hurry.set).start()  # a second Ctrl-C, 0.3 s into the grace

            started = time.monotonic()
            b.close(grace_s=30.0)
            took = time.monotonic() - started

        assert took < 5.0, took  # not the 30 s grace period
        assert pid is not None and wait_dead(pid)
        assert (b.statuses()[0].reason, b.statuses()[0].exit_code) == ("Deleted", 137)

    def test_close_kills_a_pod_process_that_left_the_pods_process_group(
        self, backend: LocalBackend, pod: Callable[..., PodSpec], tmp_path: Path
    ) -> None:
        kid_file = tmp_path / "kid"
        backend.launch(pod("ctr-worker-0", ESCAPE_THE_GROUP, extra_args=(str(kid_file),)))
        kid = int(wait_file(kid_file, 5.0))
        assert os.getpgid(kid) != backend.pid_of("ctr-worker-0")

        backend.close(grace_s=0.5)

        assert wait_dead(kid)  # found by the mark it inherited, though out of the group
        assert not list((tmp_path / "logs").glob(".local-backend-*"))  # a clean close

    def test_reap_pods_removes_what_a_sigkilled_master_left_and_nothing_else(
        self, tmp_path: Path, pod: Callable[..., PodSpec]
    ) -> None:
        logs = tmp_path / "logs"
        master = subprocess.Popen(
            [sys.executable, "-c", MASTER_WITH_PODS, str(logs), self.cgroups],
            cwd=Path(__file__).parents[2],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert master.stdout is not None
        dead_pods = [int(p) for p in master.stdout.readline().split()]
        (record,) = logs.glob(".local-backend-*.json")
        groups = [Path(g) for g in json.loads(record.read_text())["cgroups"]]
        dead_shm = pods_shm_dir(logs)
        assert sorted(p.name for p in dead_shm.iterdir()) == ["ctr-worker-0.1", "ctr-worker-1.2"]
        os.kill(dead_pods[0], signal.SIGSTOP)  # a frozen one: it would never exit by itself
        master.kill()
        master.wait()
        # What must stay: a live master's pod in the same directory, and a process marked as
        # a dead master's pod of another directory.
        other = subprocess.Popen(
            [sys.executable, "-c", SLEEP_FOREVER],
            env=os.environ | {POD_OWNER_ENV: f"1-1-dead ctr-worker-0 {tmp_path / 'other'}"},
        )
        where = tmp_path / "where"
        with LocalBackend(logs, cgroups=self.cgroups) as live:
            live.launch(pod("ctr-ps-0", SHM_WRITE, role="ps", extra_args=(str(where), "stay")))
            live_pid = live.pid_of("ctr-ps-0")
            live_shm = Path(wait_file(where, 5.0))
            try:
                assert all(alive(pid) for pid in dead_pods)
                assert all(g.exists() for g in groups)

                reaped = reap_pods(logs)

                assert sorted(reaped.processes) == sorted(dead_pods)
                assert set(reaped.processes.values()) == {"ctr-worker-0", "ctr-worker-1"}
                assert all(wait_dead(pid) for pid in dead_pods)
                assert not any(g.exists() for g in groups)
                assert all(g in reaped.cgroups for g in groups)
                assert reaped.shm == (dead_shm,) and not dead_shm.exists()
                assert not record.exists() and reaped.left == ()
                assert live_pid is not None and alive(live_pid) and alive(other.pid)
                assert (live_shm / "a.snap").read_text() == "kept"
                assert not reap_pods(logs)  # nothing more: idempotent
            finally:
                other.kill()
                other.wait()

    def test_exec_d_processes_share_the_pods_shared_memory_and_close_removes_it_all(
        self, backend: LocalBackend, pod: Callable[..., PodSpec], tmp_path: Path
    ) -> None:
        where = tmp_path / "where"
        backend.launch(pod("ctr-ps-0", SHM_WRITE, role="ps", extra_args=(str(where), "stay")))
        shm = Path(wait_file(where, 5.0))
        same = f"import os, pathlib, sys\nsys.exit({_SHM_DIR} != pathlib.Path(sys.argv[1]))\n"

        exec_d = backend.exec_in("ctr-ps-0", (sys.executable, "-c", same, str(shm)))

        assert exec_d.wait(timeout=10) == 0
        backend.close(grace_s=0.5)
        assert not shm.parent.exists()  # every pod's directory, and the backend's own
        assert not list((tmp_path / "logs").glob(".local-backend-*"))

    def test_leftover_children_die_with_the_main_process(
        self, backend: LocalBackend, pod: Callable[..., PodSpec], tmp_path: Path
    ) -> None:
        kid_file = tmp_path / "kid"
        backend.launch(pod("ctr-worker-0", SPAWN_GRANDCHILD, extra_args=(str(kid_file), "pass")))

        done = wait_for(backend, "ctr-worker-0", terminal, 5.0)

        assert done.reason == "Completed"
        assert wait_dead(int(wait_file(kid_file, 1.0)))

    def test_memory_of_child_processes_counts_against_the_limit(
        self, backend: LocalBackend, pod: Callable[..., PodSpec], tmp_path: Path
    ) -> None:
        code = "import subprocess, sys\nsubprocess.run([sys.executable, '-c', sys.argv[3]])\n"
        backend.launch(pod("ctr-ps-0", code, role="ps", memory_mb=200, extra_args=(GROW_400_MB,)))

        done = wait_for(backend, "ctr-ps-0", terminal, self.oom_timeout_s + 1.0)

        assert (done.reason, done.exit_code) == ("OOMKilled", 137)

    def test_a_process_exec_d_into_a_pod_counts_against_it_and_ends_with_it(
        self, backend: LocalBackend, pod: Callable[..., PodSpec]
    ) -> None:
        backend.launch(pod("ctr-ps-0", SLEEP_FOREVER, role="ps", memory_mb=200))
        wait_for(backend, "ctr-ps-0", lambda s: s.phase is PodPhase.RUNNING, 5.0)
        with pytest.raises(PodNotFoundError, match="ctr-ps-9"):
            backend.exec_in("ctr-ps-9", (sys.executable, "-c", "pass"))
        grower = backend.exec_in("ctr-ps-0", (sys.executable, "-c", GROW_400_MB))
        if backend.cpu_enforced:
            # In the pod's cgroup: its 400 MiB are the pod's, over the pod's 200 MiB limit.
            done = wait_for(backend, "ctr-ps-0", terminal, self.oom_timeout_s + 5.0)
            assert (done.reason, done.exit_code) == ("OOMKilled", 137)
        else:
            backend.delete("ctr-ps-0", grace_s=0.5)
        # Either way, it ended with the pod.
        assert grower.poll() is not None
        assert wait_dead(grower.pid)

    def test_usage_waits_for_a_window_long_enough_to_average_a_quota_over(
        self, backend: LocalBackend, pod: Callable[..., PodSpec]
    ) -> None:
        backend.launch(pod("ctr-worker-0", "while True: pass", cpu=0.5))
        time.sleep(MIN_USAGE_WINDOW_S + 0.1)
        assert [u.name for u in backend.usage()] == ["ctr-worker-0"]
        # Straight after: a window of a few ms is no measurement; the pod is left out.
        assert backend.usage() == []
        time.sleep(MIN_USAGE_WINDOW_S + 0.1)
        assert [u.name for u in backend.usage()] == ["ctr-worker-0"]

    def test_a_memory_limit_below_what_the_pod_holds_is_refused_and_the_pod_runs_on(
        self, backend: LocalBackend, pod: Callable[..., PodSpec]
    ) -> None:
        """The kernel would OOM-kill it (the watchdog too, without cgroups); a kubelet refuses
        the same. The reason names the limit file or the watchdog; nothing changed."""
        backend.launch(pod("mem-0", HOLD_150_MB, memory_mb=300))
        wait_holding(backend, "mem-0", 140, 10)
        pid = backend.pid_of("mem-0")

        outcome = backend.resize("mem-0", 1.0, 100)

        assert not outcome.in_place
        where = "memory.limit_in_bytes" if self.cgroups == "auto" else "watchdog"
        assert outcome.reason.startswith("cannot lower") and where in outcome.reason, outcome
        time.sleep(0.5)  # a watchdog tick: it would kill a pod now over its limit
        assert wait_for(backend, "mem-0", running, 0) and backend.pid_of("mem-0") == pid
        (used,) = backend.usage() or [None]
        assert used is None or used.memory_requested_mb == 300
        assert backend.resize("mem-0", 0.5, 400).in_place  # an increase is taken

    def test_secrets_stay_out_of_log_file_logging_and_repr(
        self,
        backend: LocalBackend,
        pod: Callable[..., PodSpec],
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        caplog.set_level(logging.DEBUG)
        spec = pod(
            "ctr-worker-0", "print('hello from the pod')", env={"DLROVER_TEST_SECRET": SECRET}
        )

        backend.launch(spec)
        wait_for(backend, "ctr-worker-0", terminal, 5.0)

        log = backend.log_path("ctr-worker-0").read_text()
        assert "hello from the pod" in log
        assert "DLROVER_TEST_SECRET" in log  # the key is named: it tells what the pod was given
        assert "--role=worker" in log and "reason=Completed" in log
        for text in (log, caplog.text, repr(spec), str(spec)):
            assert SECRET not in text

    def test_relaunch_appends_to_the_same_log(
        self, backend: LocalBackend, pod: Callable[..., PodSpec]
    ) -> None:
        for attempt in range(2):
            backend.launch(pod("ctr-worker-0", f"print('attempt {attempt}')"))
            wait_for(backend, "ctr-worker-0", terminal, 5.0)

        log = backend.log_path("ctr-worker-0").read_text()
        assert log.index("attempt 0") < log.index("attempt 1")

    def test_command_that_cannot_start_is_a_failed_pod(
        self, backend: LocalBackend, tmp_path: Path
    ) -> None:
        missing = str(tmp_path / "no-such-binary")
        backend.launch(
            PodSpec(
                name="ctr-worker-0",
                role="worker",
                index=0,
                command=(missing, "--role=worker", "--index=0"),
                cpu=1.0,
                memory_mb=100,
            )
        )

        (status,) = backend.statuses()

        assert (status.phase, status.reason, status.exit_code) == (
            PodPhase.FAILED,
            "StartError",
            128,
        )
        assert "StartError" in backend.log_path("ctr-worker-0").read_text()
        assert backend.usage() == []
        assert not list(pods_shm_dir(backend.log_path("x").parent).glob("*"))

    def test_times_come_from_the_injected_clock(
        self, tmp_path: Path, pod: Callable[..., PodSpec]
    ) -> None:
        with LocalBackend(tmp_path / "logs", clock=FixedClock(1_000.0)) as backend:
            backend.launch(pod("ctr-worker-0", "pass"))
            done = wait_for(backend, "ctr-worker-0", terminal, 5.0)

        assert (done.started_at, done.finished_at) == (1_000.0, 1_000.0)

    def test_signal_deaths_read_as_container_exit_codes(self) -> None:
        assert exit_code_of(-signal.SIGKILL) == 137
        assert exit_code_of(-signal.SIGTERM) == 143
        assert exit_code_of(3) == 3
        assert exit_code_of(0) == 0


class TestLocalBackendAccountingOnly(TestLocalBackend):
    """The same behaviour where no cgroup can be made: the watchdog enforces memory and the
    processes' own CPU times are the accounting."""

    cgroups: Literal["auto", "off"] = "off"

    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[LocalBackend]:
        with LocalBackend(tmp_path / "logs", cgroups="off") as backend:
            assert not backend.cpu_enforced
            yield backend
            backend.close(grace_s=0.5)


class TestPodSpec:
    def make(self, **changes: object) -> PodSpec:
        fields: dict[str, object] = {
            "name": "ctr-daily-ps-0",
            "role": "ps",
            "index": 0,
            "command": ("python", "-m", "trainer", "--role=ps", "--index=0"),
            "env": {"TOKEN": SECRET},
            "cpu": 2.0,
            "memory_mb": 1024,
        } | changes
        return PodSpec(**fields)  # type: ignore[arg-type]

    @pytest.mark.parametrize(
        "changes",
        [
            {"name": "Ctr_PS_0"},
            {"name": "-ps-0"},
            {"name": "a" * 64},
            {"role": "chief"},
            {"index": -1},
            {"cpu": 0.0},
            {"memory_mb": 0},
            {"command": ()},
            {"env": {POD_CPU_ENV: "8"}},
            {"env": {"DLROVER_KFP_SHM_DIR": "/dev/shm"}},
        ],
    )
    def test_invalid_specs_are_refused(self, changes: dict[str, object]) -> None:
        with pytest.raises(UserInputError):
            self.make(**changes)

    def test_repr_masks_env_values_and_the_spec_is_frozen(self) -> None:
        env = {"TOKEN": SECRET}
        spec = self.make(env=env, command=["python", "--role=ps", "--index=0"])
        env["TOKEN"] = "changed"

        assert SECRET not in repr(spec) and "'TOKEN'" in repr(spec)
        assert spec.env["TOKEN"] == SECRET  # a copy, not the caller's dict
        assert spec.command == ("python", "--role=ps", "--index=0")
        assert spec.resource_env() == {POD_CPU_ENV: "2", POD_MEMORY_ENV: "1024"}
        with pytest.raises(TypeError):
            spec.env["TOKEN"] = "x"  # type: ignore[index]
