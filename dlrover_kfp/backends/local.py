"""A :class:`~dlrover_kfp.ports.ClusterBackend` whose pods are local OS processes.

Used to develop and test the job master, and to train small jobs on one machine. It imitates
what a Kubernetes pod gives a container, as far as a plain process allows:

* **Process group = pod.** Each pod is started in a new session (``start_new_session``), so
  deleting it signals the whole group, children included, and when the main process exits any
  child it left behind is killed, like the rest of a container. A child that starts its own
  session escapes this; the trainer does not do that.
* **CPU limit = cgroup quota.** Where the machine lets this process create cgroups (Linux, root
  or a delegated group; :mod:`.cgroups`), each pod runs in its own group with a CFS quota of its
  ``cpu`` cores and a kernel memory limit of its ``memory_mb``, and :meth:`LocalBackend.usage`
  reads the group's own accounting. Where it cannot, the backend says so once, at start, in one
  line, and only accounts: pods may then use more CPU than requested when the machine has it
  idle, and :attr:`LocalBackend.cpu_enforced` is False so that the job profile can say so.
  Either way the requested cores reach the process in ``DLROVER_KFP_POD_CPU`` (and the memory
  limit in ``DLROVER_KFP_POD_MEMORY_MB``) so that the trainer sizes its thread pools to them.
* **Memory limit = kernel, else watchdog.** With a memory cgroup the kernel enforces the limit,
  and a SIGKILL that the group counted as an OOM kill reads ``OOMKilled`` (137). Without one, a
  thread samples every running pod's resident memory (children included) every
  ``watchdog_interval_s`` and SIGKILLs the group once it exceeds ``memory_mb``, reporting the
  same. A pod can overshoot between two samples; summed RSS counts pages shared between
  processes more than once, so it is a little stricter than a cgroup's accounting.
* **/dev/shm = a directory of the pod's own.** On Kubernetes every ``emptyDir``, a pod's
  ``/dev/shm`` included, belongs to that pod: no other pod reads it, even on the same node, and
  the kubelet tears a memory-backed one down once the pod has terminated (kubernetes#36779;
  under ``restartPolicy: Never`` that is when its main process exits) or is deleted. Each pod
  incarnation here gets a new, empty directory (on tmpfs where ``/dev/shm`` is writable, so its
  pages count in the pod's memory cgroup as a container's do), named in
  ``DLROVER_KFP_SHM_DIR`` (:data:`~dlrover_kfp.core.pod_env.POD_SHM_ENV`; processes ``exec_in``'d
  get the same), and removed when the pod ends, however it ends. A relaunch under the same name
  is a new pod and starts empty: state that must outlive a pod goes over the network or to a
  volume, as on a cluster.

Each pod's stdout and stderr are appended to ``<log_dir>/<name>.log``, between a header and a
trailer line written by the backend (name, role, index, resources, outcome; never env values).

Use it as a context manager so that an exception in the job master does not leave processes
behind; an ``atexit`` hook is a second line of defence. :meth:`LocalBackend.close` stops every
pod, gives each one grace period to exit on SIGTERM and SIGKILLs the rest (at once when the
``cut_short`` callback says so: a second Ctrl-C), and then also kills any process still marked
as this backend's (:data:`POD_OWNER_ENV`: a pod's child that left its process group, or a
launch that an interrupt cut between start and bookkeeping) and removes every group under the
backend's own cgroups and every pod's shared-memory directory.

A master killed by SIGKILL can do none of this: its pods keep running in their own sessions
(a frozen one forever), its cgroups stay, and so does the PS's shared memory. Each backend
therefore records itself in its log directory (``.local-backend-<owner>.json``: its process,
cgroups and pods' shared-memory directory) and marks every pod's environment with
:data:`POD_OWNER_ENV` (which backend, which pod, which log directory; inherited by the pod's
children); :func:`reap_pods` finds and removes what a dead backend of a log directory left,
never touching a live one's pods or anyone else's.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import errno
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

import psutil  # type: ignore[import-untyped, unused-ignore]

from dlrover_kfp.backends import cgroups as cg
from dlrover_kfp.backends.api import BACKEND_LOG_PREFIX, last_error_line
from dlrover_kfp.core.pod_env import POD_SHM_ENV
from dlrover_kfp.files import memory_dir, write_atomic
from dlrover_kfp.ports import (
    BackendClosedError,
    PodEvent,
    PodExistsError,
    PodNotFoundError,
    PodPhase,
    PodReason,
    PodSpec,
    PodStatus,
    PodUsage,
    ResizeOutcome,
    SystemClock,
    WallClock,
)

logger = logging.getLogger(__name__)

_MIB = 1024 * 1024
_SIGKILL_EXIT = 128 + signal.SIGKILL  # 137, what a container runtime reports for SIGKILL
# containerd reports a command that cannot be executed as exit code 128 with reason StartError.
_START_ERROR_EXIT = 128


#: Environment variable on every pod's processes (and, inherited, their children's):
#: ``"<owner> <pod name> <log dir>"``, the owner being the backend (``<pid>-<start>-<token>``,
#: the master's pid and start time in clock ticks, so a reused pid is not mistaken for it). It
#: is how a later process tells a dead master's pods from everything else on the machine.
POD_OWNER_ENV = "DLROVER_KFP_POD_OWNER"
#: A backend's record in its log directory (removed when it closes cleanly).
_STATE_PREFIX = ".local-backend-"
#: The directory holding a backend's pods' shared-memory directories is this plus its owner:
#: ``/dev/shm/dlrover-kfp-pods.<owner>/<pod>.<incarnation>/``. Distinct from the trainer's own
#: snapshot names (``dlrover-kfp.<job>.g<n>...``), and checked by :func:`reap_pods` before it
#: removes a directory a record names.
_SHM_PREFIX = "dlrover-kfp-pods."
#: Seconds between two looks at pods being stopped: a tenth of the shortest usual grace period.
_STOP_POLL_S = 0.02
#: Seconds to wait for killed processes to be gone and their groups removable (a process
#: SIGKILLed while stopped or in a system call is gone in milliseconds; 2 s is ample).
_REAP_PATIENCE_S = 2.0


#: Shortest window a pod's CPU use is averaged over: five CFS periods. A quota is enforced per
#: 0.1 s period, so a window of ``n`` periods that straddles ``n + 1`` of them can see up to
#: ``(n + 1) / n`` times the quota (a pod launched 0.15 s before a sample used 0.67 cores at a
#: 0.5-core quota); over 5 periods at most 1.2x, over the default 2 s sampling 1.05x.
MIN_USAGE_WINDOW_S = 0.5


def exit_code_of(returncode: int) -> int:
    """A Popen return code as a container runtime reports it: killed by signal ``n`` -> 128+n."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass(eq=False)
class _Pod:
    """Mutable record of one launched pod; guarded by :attr:`LocalBackend._lock`."""

    spec: PodSpec
    process: subprocess.Popen[bytes] | None  # None: the command could not be started
    handle: psutil.Process | None  # while running
    started_at: float | None
    cpu_mark: tuple[float, float] = (0.0, 0.0)  # (CPU seconds, monotonic time) at last usage()
    throttled_mark: int = 0  # CFS periods throttled (the group's nr_throttled) at last usage()
    group: cg.PodGroup | None = None  # the pod's cgroup(s), while not yet removed
    returncode: int | None = None
    finished_at: float | None = None
    deleted: bool = False
    oom_killed: bool = False
    message: str | None = None  # a failed pod's last error line, from its log
    # Descendants seen at the last sample, by pid. A cache written by _sample() without the
    # lock: replaced whole, never mutated, so a race only costs a fresh psutil.Process.
    children: dict[int, psutil.Process] = field(default_factory=dict)
    # Processes started in the pod by exec_in(): they end with the pod.
    execs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    # The pod's own shared-memory directory while it runs (removed when it ends).
    shm_dir: Path | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.returncode is None

    def status(self) -> PodStatus:
        spec = self.spec
        if self.process is None:
            return PodStatus(
                name=spec.name,
                role=spec.role,
                index=spec.index,
                phase=PodPhase.FAILED,
                exit_code=_START_ERROR_EXIT,
                reason=PodReason.START_ERROR,
                finished_at=self.finished_at,
            )
        if self.returncode is None:
            return PodStatus(
                name=spec.name,
                role=spec.role,
                index=spec.index,
                phase=PodPhase.RUNNING,
                started_at=self.started_at,
            )
        code = exit_code_of(self.returncode)
        # Deletion wins over OOM: the job master had already given the pod up.
        if self.deleted:
            phase, reason = PodPhase.FAILED, PodReason.DELETED
        elif self.oom_killed:
            phase, reason, code = PodPhase.FAILED, PodReason.OOM_KILLED, _SIGKILL_EXIT
        elif code == 0:
            phase, reason = PodPhase.SUCCEEDED, PodReason.COMPLETED
        else:
            phase, reason = PodPhase.FAILED, PodReason.ERROR
        return PodStatus(
            name=spec.name,
            role=spec.role,
            index=spec.index,
            phase=phase,
            exit_code=code,
            reason=reason,
            started_at=self.started_at,
            finished_at=self.finished_at,
            message=self.message if phase is PodPhase.FAILED and not self.deleted else None,
        )


class LocalBackend:
    """Pods as local process groups; see the module docstring for what is and is not enforced.

    ``clock`` stamps ``started_at``/``finished_at`` (epoch seconds); CPU rates are measured on
    the monotonic clock regardless, so a fixed clock in tests does not break :meth:`usage`.

    ``cgroups`` says how limits are enforced: ``"auto"`` (the default) looks for cgroups this
    process may create (:func:`.cgroups.detect`) and falls back to accounting only, saying so
    once; ``"off"`` only accounts; or a :class:`.cgroups.Cgroups` to use.

    ``cut_short`` is asked while pods are being stopped: once it answers True (the master got
    a second stop signal) the pods still in their grace period are SIGKILLed at once.
    """

    def __init__(
        self,
        log_dir: Path,
        *,
        watchdog_interval_s: float = 0.2,
        clock: WallClock | None = None,
        cgroups: cg.Cgroups | Literal["auto", "off"] = "auto",
        cut_short: Callable[[], bool] = lambda: False,
    ) -> None:
        if watchdog_interval_s <= 0:
            raise ValueError(f"watchdog_interval_s must be positive, got {watchdog_interval_s}")
        self._log_dir = Path(log_dir)
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self._cut_short = cut_short
        self._owner = _Owner.me()
        self._marker_dir = str(self._log_dir.resolve())
        self._interval = watchdog_interval_s
        self._clock: WallClock = clock if clock is not None else SystemClock()
        self._cgroups: cg.Cgroups | None
        if cgroups == "off":
            self._cgroups, self._enforcement = None, "off: accounting only (cgroups='off')"
        elif cgroups == "auto":
            found = cg.detect()
            if isinstance(found, str):
                self._cgroups, self._enforcement = None, f"not enforced: {found}"
                logger.warning(
                    "local backend: pods' CPU limits are NOT enforced (%s); CPU is only accounted",
                    found,
                )
            else:
                self._cgroups, self._enforcement = found, found.description
        else:
            self._cgroups, self._enforcement = cgroups, cgroups.description
        self._state_file = self._log_dir / f"{_STATE_PREFIX}{self._owner}.json"
        # Made at the first launch; each pod incarnation gets <pod>.<n> in it.
        self._shm_dir = memory_dir() / f"{_SHM_PREFIX}{self._owner}"
        self._incarnations = 0
        groups = [] if self._cgroups is None else [str(d) for d in self._cgroups.directories]
        record = {"owner": str(self._owner), "cgroups": groups, "shm": str(self._shm_dir)}
        # Before any pod starts: a master SIGKILLed from now on leaves what reap_pods() needs.
        try:
            write_atomic(self._state_file, json.dumps(record))
        except OSError as exc:  # a full disk: the pods' own marks still find their processes
            logger.warning("local backend: cannot record itself in %s: %s", self._log_dir, exc)
        # Reentrant: _finish() is called both from the watchdog and from methods holding it.
        self._lock = threading.RLock()
        self._pods: dict[str, _Pod] = {}
        self._stale_groups: list[cg.PodGroup] = []
        self._closed = False  # no more launches
        self._released = False  # close() ran to its end
        self._stop = threading.Event()
        self._watchdog = threading.Thread(
            target=self._watch, name="dlrover-kfp-local-watchdog", daemon=True
        )
        self._watchdog.start()
        # Second line of defence after the context manager: an interpreter that exits without
        # close() (a forgotten ``with``, sys.exit in a callback) still stops its pods.
        atexit.register(self.close)

    @property
    def cpu_enforced(self) -> bool:
        """Whether pods' CPU limits are enforced (a CFS quota per pod) or only accounted."""
        return self._cgroups is not None

    @property
    def enforcement(self) -> str:
        """One line for logs and profiles: how limits are enforced, or why they are not."""
        return self._enforcement

    # -- context manager ---------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the port ----------------------------------------------------------------------------

    def launch(self, pod: PodSpec) -> None:
        with self._lock:
            if self._closed:
                raise BackendClosedError(f"backend closed: cannot launch {pod.name}")
            old = self._pods.get(pod.name)
            if old is not None:
                self._poll(old)
                if old.running:
                    raise PodExistsError(f"pod {pod.name} is still running")
            log_path = self.log_path(pod.name)
            with log_path.open("ab") as log:
                log.write(
                    (
                        f"--- dlrover-kfp launch {pod.name} role={pod.role} index={pod.index}"
                        f" cpu={pod.cpu:g} memory_mb={pod.memory_mb}"
                        f" env_keys={sorted(pod.env)} argv={list(pod.command)}\n"
                    ).encode()
                )
                log.flush()
                group: cg.PodGroup | None = None
                shm_dir: Path | None = None
                try:
                    group = self._create_group(pod)
                    command, extra_env = self._command(pod, group)
                    shm_dir = self._create_shm_dir(pod.name)
                    process = subprocess.Popen(
                        command,
                        env=os.environ
                        | dict(pod.env)
                        | pod.resource_env()
                        | extra_env
                        | self._pod_env(pod.name, shm_dir),
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        close_fds=True,
                    )
                except OSError as e:
                    # A cluster reports a command that cannot run as a failed pod, not as an
                    # API error; so does this backend, so the job master has one path for it.
                    if group is not None:
                        group.remove()
                    if shm_dir is not None:
                        _remove_dir(shm_dir)
                    log.write(f"--- dlrover-kfp StartError: {e}\n".encode())
                    logger.warning("pod %s could not start: %s", pod.name, e)
                    self._register(
                        _Pod(
                            spec=pod,
                            process=None,
                            handle=None,
                            started_at=None,
                            finished_at=self._clock.now(),
                        )
                    )
                    return
            try:
                handle: psutil.Process | None = psutil.Process(process.pid)
            except psutil.Error:  # gone already (and reaped by someone else): poll() will tell
                handle = None
            self._register(
                _Pod(
                    spec=pod,
                    process=process,
                    handle=handle,
                    started_at=self._clock.now(),
                    cpu_mark=(0.0, time.monotonic()),
                    group=group,
                    shm_dir=shm_dir,
                )
            )
            logger.info(
                "launched pod %s (role=%s index=%d pid=%d cpu=%g memory_mb=%d env_keys=%s)",
                pod.name,
                pod.role,
                pod.index,
                process.pid,
                pod.cpu,
                pod.memory_mb,
                sorted(pod.env),
            )

    def delete(self, name: str, grace_s: float = 5.0) -> None:
        with self._lock:
            pod = self._pods.get(name)
            if pod is None:
                return
            self._poll(pod)
            if not pod.running:
                return
            pod.deleted = True
        self._stop_pods([pod], grace_s)

    def resize(
        self, name: str, cpu: float, memory_mb: int, timeout_s: float = 30.0
    ) -> ResizeOutcome:
        """Give running pod ``name`` new limits in place: its group's CFS quota and memory
        limit are rewritten (the same pid, nothing restarted), and from then on
        :meth:`usage` reports the new requests and the memory watchdog holds it to the new
        limit. Without cgroups nothing enforces CPU: only the record changes, and the outcome
        is still ``in_place=True``, since no process had to change.

        A memory limit below what the pod holds now is refused (``in_place=False``, the
        reason naming the limit file or the watchdog), the pod unchanged: the kernel or the
        watchdog would otherwise OOM-kill it, and a kubelet refuses the same. ``timeout_s`` is
        the port's; a local change takes no time to apply. :class:`PodNotFoundError` if no
        pod of that name is running; a bad ``cpu``/``memory_mb`` is a
        :class:`~dlrover_kfp.errors.UserInputError`."""
        started = time.monotonic()
        with self._lock:
            pod = self._pods.get(name)
            if pod is not None:
                self._poll(pod)
            if pod is None or not pod.running:
                raise PodNotFoundError(f"pod {name} is not running")
            resized = dataclasses.replace(pod.spec, cpu=cpu, memory_mb=memory_mb)
            refused = self._apply_limits(pod, cpu, memory_mb)
            if refused is None:
                pod.spec = resized
        seconds = time.monotonic() - started
        if refused is not None:
            logger.warning(
                "pod %s: resize to cpu=%g memory_mb=%d refused: %s", name, cpu, memory_mb, refused
            )
            return ResizeOutcome(in_place=False, reason=refused, seconds=seconds)
        logger.info("pod %s resized in place: cpu=%g memory_mb=%d", name, cpu, memory_mb)
        return ResizeOutcome(in_place=True, seconds=seconds)

    def statuses(self) -> list[PodStatus]:
        with self._lock:
            for pod in self._pods.values():
                self._poll(pod)
            return [pod.status() for pod in self._pods.values()]

    def usage(self) -> list[PodUsage]:
        running = self._running_pods()
        result = []
        for pod in running:
            sample = _sample(pod)
            if sample is None:
                continue
            cpu_s, rss, throttled = sample
            now = time.monotonic()
            with self._lock:
                if not pod.running:
                    continue
                last_cpu, last_t = pod.cpu_mark
                if now - last_t < MIN_USAGE_WINDOW_S:
                    continue  # too short to average a CFS quota over; the next call reports it
                pod.cpu_mark = (max(cpu_s, last_cpu), now)
                last_throttled = pod.throttled_mark
                if throttled is not None:
                    pod.throttled_mark = max(throttled, last_throttled)
            wall = now - last_t
            # CPU time of a child that exits without being waited for is lost from the sum;
            # clamp instead of reporting negative use.
            cores = max(0.0, cpu_s - last_cpu) / wall if wall > 0 else 0.0
            spec = pod.spec
            result.append(
                PodUsage(
                    name=spec.name,
                    role=spec.role,
                    index=spec.index,
                    cpu_cores=cores,
                    memory_mb=rss / _MIB,
                    cpu_requested=spec.cpu,
                    memory_requested_mb=spec.memory_mb,
                    cpu_throttled=(
                        None
                        if throttled is None
                        else round(cg.throttled_share(throttled - last_throttled, wall), 3)
                    ),
                )
            )
        return result

    def emit_event(self, event: PodEvent) -> None:
        """A debug log line: a machine has no event stream, and the run's own progress
        lines already say the same to whoever started it."""
        logger.debug(
            "event %s %s on %s: %s",
            "Warning" if event.warning else "Normal",
            event.reason,
            event.pod or "the job",
            event.message,
        )

    def close(self, grace_s: float = 5.0) -> None:
        """Delete every running pod (all at once, one ``grace_s`` in total), kill any other
        process marked as this backend's, remove its cgroups and stop the watchdog. Idempotent;
        statuses stay readable. A close that an exception cut short is finished by the next
        call (the context manager's, or the ``atexit`` hook's)."""
        with self._lock:
            if self._released:
                return
            self._closed = True
            running = self._running_pods()
            for pod in running:
                pod.deleted = True
        try:
            self._stop_pods(running, grace_s)
        finally:
            self._stop.set()
            if threading.current_thread() is not self._watchdog:
                self._watchdog.join(timeout=5.0)
            strays = _kill(_marked(lambda owner, _pod, _dir: owner == str(self._owner)))
            if strays:
                logger.warning("local backend: killed %d stray pod process(es)", len(strays))
            _wait_gone(strays, _REAP_PATIENCE_S)
            self._remove_groups(patience_s=2.0)
            if self._cgroups is not None:
                self._cgroups.close()
            # Every pod's directory went when it ended; a child that escaped its group and
            # wrote after that was killed just now.
            shm_left = not _remove_dir(self._shm_dir)
            groups_left = self._cgroups is not None and any(
                d.exists() for d in self._cgroups.directories
            )
            if not (groups_left or shm_left):
                self._state_file.unlink(missing_ok=True)
            self._released = True
            atexit.unregister(self.close)

    # -- local extras ------------------------------------------------------------------------

    def log_path(self, name: str) -> Path:
        """Where the pod's stdout and stderr go (appended across relaunches)."""
        return self._log_dir / f"{name}.log"

    def exec_in(self, name: str, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside running pod ``name``, as ``kubectl exec`` does: in the pod's
        cgroups, so that its CPU and memory count against the pod's limits (a sidecar, a
        debugging shell, or a noisy neighbour in a test), with the pod's shared-memory
        directory. It is killed when the pod ends. Without cgroups it runs beside the pod,
        unconstrained."""
        with self._lock:
            pod = self._pods.get(name)
            if pod is None or not pod.running:
                raise PodNotFoundError(f"pod {name} is not running")
            command, extra_env = (
                cg.wrap_command(argv, pod.group) if pod.group is not None else (tuple(argv), {})
            )
            process = subprocess.Popen(
                command,
                env=os.environ | extra_env | self._pod_env(name, pod.shm_dir),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                close_fds=True,
            )
            pod.execs.append(process)
            return process

    def pid_of(self, name: str) -> int | None:
        """The pod's main process id (also its process group id); None if it never started."""
        with self._lock:
            pod = self._pods.get(name)
            if pod is None or pod.process is None:
                return None
            return pod.process.pid

    # -- internals ---------------------------------------------------------------------------

    def _pod_env(self, pod_name: str, shm_dir: Path | None) -> dict[str, str]:
        """What this backend tells every process of a pod: whose pod it is (the mark
        :func:`reap_pods` finds) and where its shared memory is."""
        env = {POD_OWNER_ENV: f"{self._owner} {pod_name} {self._marker_dir}"}
        if shm_dir is not None:
            env[POD_SHM_ENV] = str(shm_dir)
        return env

    def _create_shm_dir(self, pod_name: str) -> Path:
        """A new, empty directory for one pod incarnation, readable by its owner only (another
        user's pod on a shared machine must not read a snapshot either)."""
        self._incarnations += 1
        self._shm_dir.mkdir(mode=0o700, exist_ok=True)
        path = self._shm_dir / f"{pod_name}.{self._incarnations}"
        path.mkdir(mode=0o700)
        return path

    def _create_group(self, pod: PodSpec) -> cg.PodGroup | None:
        """The pod's cgroup, or None when limits are only accounted. A group that cannot be
        made fails the launch (as ``StartError``): a pod never runs unconstrained by accident."""
        if self._cgroups is None:
            return None
        return self._cgroups.create(pod.name, pod.cpu, pod.memory_mb)

    def _command(
        self, pod: PodSpec, group: cg.PodGroup | None
    ) -> tuple[tuple[str, ...], dict[str, str]]:
        if group is None:
            return pod.command, {}
        # The wrapper shell would turn a missing executable into exit code 127; look it up
        # first so that it stays a StartError, as without cgroups and on a cluster.
        path = os.environ.get("PATH") if "PATH" not in pod.env else pod.env["PATH"]
        if shutil.which(pod.command[0], path=path) is None:
            raise FileNotFoundError(
                errno.ENOENT, "no such executable (or not executable)", pod.command[0]
            )
        return cg.wrap_command(pod.command, group)

    def _apply_limits(self, pod: _Pod, cpu: float, memory_mb: int) -> str | None:
        """Put a running pod under new limits; why not, or None once done. With a group the
        kernel enforces them; without one only the watchdog's memory limit exists, and it is
        checked against the pod's resident memory as the kernel's would be."""
        if pod.group is not None:
            try:
                pod.group.set_limits(cpu, memory_mb)
            except cg.CgroupError as exc:
                return str(exc.strerror or exc)  # the message, without "[Errno 16]"
            return None
        sample = _sample(pod)
        if sample is not None and sample[1] > memory_mb * _MIB:
            return (
                f"cannot lower the memory limit to {memory_mb} MiB: the pod holds"
                f" {sample[1] / _MIB:.0f} MiB (the watchdog would kill it)"
            )
        return None

    def _register(self, pod: _Pod) -> None:
        """Record a launch, replacing a finished pod of the same name. Popping first moves the
        name to the end, so that statuses() lists pods in launch order."""
        with self._lock:
            self._pods.pop(pod.spec.name, None)
            self._pods[pod.spec.name] = pod

    def _poll(self, pod: _Pod) -> None:
        """Notice whether a running pod's main process has exited."""
        if pod.running and pod.process is not None:
            returncode = pod.process.poll()
            if returncode is not None:
                self._finish(pod, returncode)

    def _running_pods(self) -> list[_Pod]:
        with self._lock:
            for pod in self._pods.values():
                self._poll(pod)
            return [pod for pod in self._pods.values() if pod.running]

    def _finish(self, pod: _Pod, returncode: int) -> None:
        with self._lock:
            if pod.returncode is not None:
                return
            pod.returncode = returncode
            pod.finished_at = self._clock.now()
            pod.handle = None
            pod.children = {}
            assert pod.process is not None
            # The main process is gone; like a container's, the rest of its group goes too,
            # and so does whatever was exec'd into it.
            _kill_group(pod.process.pid, signal.SIGKILL)
            for extra in pod.execs:
                with contextlib.suppress(OSError):
                    extra.kill()
                extra.wait()
            # The pod has terminated: its emptyDir goes (a kubelet tears a terminated pod's
            # memory-backed volumes down); a relaunch gets a new one.
            if pod.shm_dir is not None:
                _remove_dir(pod.shm_dir)
                pod.shm_dir = None
                # And the backend's own once no pod has one (the next launch makes it again):
                # a process killed with no pod running leaves nothing in /dev/shm.
                with contextlib.suppress(OSError):
                    self._shm_dir.rmdir()
            if pod.group is not None:
                # Any OOM kill in the group ends the pod as OOMKilled, even when the kernel
                # chose a child and the main process then exited on its own: a container on a
                # current kubelet (cgroup v2 ``memory.oom.group``) is killed as a whole.
                if _oom_kills(pod.group) > 0:
                    pod.oom_killed = True
                # Removed once the killed processes have left it (the watchdog retries).
                self._stale_groups.append(pod.group)
                pod.group = None
            if pod.returncode != 0 and not pod.deleted:
                pod.message = _last_error(self.log_path(pod.spec.name))
            status = pod.status()
            trailer = (
                f"--- dlrover-kfp {status.phase} {pod.spec.name}: reason={status.reason}"
                f" exit_code={status.exit_code}\n"
            )
            try:
                with self.log_path(pod.spec.name).open("ab") as log:
                    log.write(trailer.encode())
            except OSError as e:  # a full disk must not break status tracking
                logger.warning("cannot append to the log of pod %s: %s", pod.spec.name, e)
            log_at = logging.WARNING if status.phase == PodPhase.FAILED else logging.INFO
            logger.log(
                log_at,
                "pod %s %s: reason=%s exit_code=%s",
                pod.spec.name,
                status.phase,
                status.reason,
                status.exit_code,
            )

    def _stop_pods(self, pods: Iterable[_Pod], grace_s: float) -> None:
        """SIGTERM every group, wait up to ``grace_s`` in total (less once ``cut_short`` says
        so), SIGKILL what is left. Runs without the lock so that statuses and the watchdog go
        on meanwhile."""
        waiting = [p for p in pods if p.process is not None]
        for pod in waiting:
            assert pod.process is not None
            _kill_group(pod.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + max(0.0, grace_s)
        cut = False
        while waiting:
            still = []
            for pod in waiting:
                assert pod.process is not None
                returncode = pod.process.poll()
                if returncode is None:
                    still.append(pod)
                else:
                    self._finish(pod, returncode)
            waiting = still
            if not waiting:
                break
            cut = self._cut_short()
            if cut or time.monotonic() >= deadline:
                break
            time.sleep(_STOP_POLL_S)
        why = "grace period cut short" if cut else f"ignored SIGTERM for {grace_s:g}s"
        for pod in waiting:
            assert pod.process is not None
            logger.info("pod %s %s: SIGKILL", pod.spec.name, why)
            _kill_group(pod.process.pid, signal.SIGKILL)
        for pod in waiting:
            assert pod.process is not None
            self._finish(pod, pod.process.wait())

    def _remove_groups(self, patience_s: float = 0.0) -> None:
        """Remove finished pods' cgroups; a group whose processes are still exiting is kept
        for the next try (or, at ``close``, waited for up to ``patience_s``)."""
        deadline = time.monotonic() + patience_s
        while True:
            with self._lock:
                stale, self._stale_groups = self._stale_groups, []
            left = [g for g in stale if not g.remove()]
            if not left:
                return
            if time.monotonic() >= deadline:
                with self._lock:
                    self._stale_groups.extend(left)
                if patience_s > 0:
                    logger.warning(
                        "local backend: %d pod cgroup(s) could not be removed", len(left)
                    )
                return
            with self._lock:
                self._stale_groups.extend(left)
            time.sleep(0.02)

    def _watch(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._check_all()
                self._remove_groups()
            except (OSError, psutil.Error):  # a pod vanished between two calls: next tick
                logger.warning("local backend watchdog: sampling failed", exc_info=True)

    def _check_all(self) -> None:
        for pod in self._running_pods():
            group = pod.group
            if group is not None and group.limits_memory:
                # The kernel enforces the limit, but kills only the largest process of the
                # group; a pod, like a container on a current kubelet (cgroup v2
                # ``memory.oom.group``), goes as a whole once any of its processes was.
                if _oom_kills(group) == 0:
                    continue
                rss = None
            else:
                sample = _sample(pod)
                if sample is None:
                    continue
                rss = sample[1]
                if rss <= pod.spec.memory_mb * _MIB:
                    continue
            with self._lock:
                if not pod.running or pod.oom_killed:
                    continue
                pod.oom_killed = True
                assert pod.process is not None
                _kill_group(pod.process.pid, signal.SIGKILL)
            used = "a process" if rss is None else f"{rss / _MIB:.0f} MiB"
            logger.warning(
                "pod %s: %s over its memory limit of %d MiB: OOMKilled",
                pod.spec.name,
                used,
                pod.spec.memory_mb,
            )
            # Reap now so the status reads OOMKilled without waiting for the next tick.
            with contextlib.suppress(subprocess.TimeoutExpired):
                assert pod.process is not None
                self._finish(pod, pod.process.wait(timeout=1.0))


@dataclass(frozen=True, slots=True)
class _Owner:
    """Which backend started a pod: the master's pid, its start time in clock ticks since boot
    (a pid is reused; the pair is not) and a token (several backends in one process)."""

    pid: int
    started: int
    token: str

    @classmethod
    def me(cls) -> _Owner:
        return cls(os.getpid(), _start_ticks(os.getpid()) or 0, secrets.token_hex(3))

    @classmethod
    def parse(cls, text: str) -> _Owner | None:
        pid, _, rest = text.partition("-")
        started, _, token = rest.partition("-")
        if not (pid.isdigit() and started.isdigit() and token):
            return None
        return cls(int(pid), int(started), token)

    def alive(self) -> bool:
        """Whether the master that owns these pods still runs."""
        return _start_ticks(self.pid) == self.started

    def __str__(self) -> str:
        return f"{self.pid}-{self.started}-{self.token}"


def _start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22);
    None if it does not exist, or is a zombie: it has ended. Without /proc: psutil's time."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            if process.status() != psutil.STATUS_ZOMBIE:
                return round(float(process.create_time()) * 100)
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _marked(select: Callable[[str, str, str], bool]) -> dict[int, str]:
    """Live processes whose :data:`POD_OWNER_ENV` (owner, pod, log dir) ``select`` accepts:
    pid -> pod name. Reads ``/proc/<pid>/environ`` (a process's environment at its start; only
    processes of this user or, as root, all); nothing where there is no /proc."""
    key = POD_OWNER_ENV.encode() + b"="
    found: dict[int, str] = {}
    me = os.getpid()
    for pid in _pids():
        if pid == me:
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:  # gone, or another user's
            continue
        for entry in environ.split(b"\0"):
            if entry.startswith(key):
                owner, _, rest = entry[len(key) :].decode(errors="replace").partition(" ")
                pod, _, where = rest.partition(" ")
                if select(owner, pod, where) and _start_ticks(pid) is not None:
                    found[pid] = pod
                break
    return found


def _pids() -> Iterator[int]:
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                yield int(entry.name)


def _kill(pids: dict[int, str]) -> dict[int, str]:
    """SIGKILL each process (and the process group it leads: a pod); returns those signalled."""
    done = {}
    for pid, pod in pids.items():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid:
                _kill_group(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
            done[pid] = pod
    return done


def _wait_gone(pids: Iterable[int], patience_s: float) -> None:
    """Wait until the processes have ended (a zombie has: its parent reaps it when it can)."""
    deadline = time.monotonic() + patience_s
    left = [p for p in pids if _start_ticks(p) is not None]
    while left and time.monotonic() < deadline:
        time.sleep(_STOP_POLL_S)
        left = [p for p in left if _start_ticks(p) is not None]


@dataclass(frozen=True, slots=True)
class ReapedPods:
    """What :func:`reap_pods` removed of a log directory's dead masters: the pod processes it
    killed (pid -> pod name, ``"?"`` for a process found only in a group), the cgroups and
    the pods' shared-memory directories (one per backend) it removed; ``left`` names what
    could not be removed."""

    processes: dict[int, str] = field(default_factory=dict)
    cgroups: tuple[Path, ...] = ()
    shm: tuple[Path, ...] = ()
    left: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.processes or self.cgroups or self.shm or self.left)


def reap_pods(log_dir: Path) -> ReapedPods:
    """Kill the pod processes and remove the cgroups and shared-memory directories that local
    backends of ``log_dir`` left when their master died without closing them (SIGKILL, a
    crash of the interpreter).

    A pod process is recognised by its :data:`POD_OWNER_ENV` (this log directory, an owner
    that no longer runs) or by being in a cgroup such a backend recorded; pods of a backend
    whose master still runs, and every other process on the machine, are left alone. The
    caller should hold the run's output directory (no master may start pods in it meanwhile).
    """
    log_dir = Path(log_dir)
    if not log_dir.is_dir():
        return ReapedPods()
    where = str(log_dir.resolve())
    records: dict[Path, list[Path]] = {}  # a dead backend's record -> its cgroups
    shm_dirs: dict[Path, Path] = {}  # a dead backend's record -> its pods' shm directory
    left: list[str] = []
    for record in sorted(log_dir.glob(f"{_STATE_PREFIX}*.json")):
        try:
            data = json.loads(record.read_text())
            owner = _Owner.parse(str(data["owner"]))
            groups = [Path(str(g)) for g in data.get("cgroups") or []]
            shm = data.get("shm")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            left.append(f"{record}: unreadable ({exc})")
            continue
        if owner is not None and owner.alive():
            continue
        records[record] = groups
        # Only a directory this backend named after itself: a record is a file anyone of this
        # user could edit, and nothing else may be removed on its word.
        if owner is not None and shm and Path(str(shm)).name == f"{_SHM_PREFIX}{owner}":
            shm_dirs[record] = Path(str(shm))

    def dead_pod(owner: str, _pod: str, pod_dir: str) -> bool:
        parsed = _Owner.parse(owner)
        return pod_dir == where and parsed is not None and not parsed.alive()

    victims = _marked(dead_pod)
    for groups in records.values():
        for group in groups:
            for pid in sorted(cg.tree_pids(group) - {os.getpid()}):
                victims.setdefault(pid, "?")
    killed = _kill(victims)
    _wait_gone(killed, _REAP_PATIENCE_S)
    removed, busy = _remove_trees([g for groups in records.values() for g in groups])
    left += [f"cgroup {g}: busy" for g in busy]
    # After the kill: no pod of these backends writes into its directory any more.
    shm_removed = [d for d in shm_dirs.values() if d.exists() and _remove_dir(d)]
    shm_left = [d for d in shm_dirs.values() if d.exists()]
    left += [f"shm {d}: not removable" for d in shm_left]
    for record, groups in records.items():
        if not set(groups) & set(busy) and shm_dirs.get(record) not in shm_left:
            record.unlink(missing_ok=True)
    return ReapedPods(
        processes=killed, cgroups=tuple(removed), shm=tuple(shm_removed), left=tuple(left)
    )


def _remove_trees(groups: list[Path]) -> tuple[list[Path], list[Path]]:
    """Remove each group tree, retrying a busy one (its last killed tasks still exiting) for
    up to :data:`_REAP_PATIENCE_S`; returns (removed groups, roots left busy)."""
    removed: list[Path] = []
    deadline = time.monotonic() + _REAP_PATIENCE_S
    while True:
        busy = []
        for group in groups:
            gone, stays = cg.remove_tree(group)
            removed += gone
            if stays:
                busy.append(group)
        if not busy or time.monotonic() >= deadline:
            return removed, busy
        groups = busy
        time.sleep(_STOP_POLL_S)


def _remove_dir(path: Path) -> bool:
    """Remove a directory tree (tmpfs memory is freed only when its files are unlinked);
    returns whether it is gone. A file a process still maps keeps its pages until unmapped."""
    shutil.rmtree(path, ignore_errors=True)
    return not path.exists()


def _kill_group(pgid: int, sig: int) -> None:
    """Signal a pod's process group; an empty group (all exited) is fine.

    The group id cannot be reused while any member lives, so this never hits a stranger.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


#: Bytes of a failed pod's log read back for its last error line (a traceback's tail).
_LOG_TAIL_BYTES = 16 * 1024


def _last_error(path: Path) -> str | None:
    """The last error line (:func:`~dlrover_kfp.backends.api.last_error_line`) the pod's
    latest incarnation wrote to its log; the log is appended across relaunches, so only what
    follows its last launch header counts."""
    try:
        with path.open("rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - _LOG_TAIL_BYTES))
            tail = log.read().decode("utf-8", "replace")
    except OSError:
        return None
    return last_error_line(tail.rpartition(f"{BACKEND_LOG_PREFIX}launch ")[2])


def _oom_kills(group: cg.PodGroup) -> int:
    try:
        return group.oom_kills()
    except (OSError, ValueError):  # the group is unreadable: no evidence of an OOM kill
        return 0


def _sample(pod: _Pod) -> tuple[float, int, int | None] | None:
    """(CPU seconds, resident bytes, CFS periods throttled) of the pod, or None if its main
    process is gone.

    From the pod's cgroup when it has one (every thread and process that ever ran in it);
    otherwise from the main process and its live descendants, whose CPU counts only while they
    live (plus what the process collected from the children it waited for), and nothing throttles
    them."""
    main = pod.handle
    if main is None:
        return None
    group = pod.group
    if group is not None:
        try:
            used = group.usage()
        except (OSError, ValueError):  # no cpuacct hierarchy, or the group just went away
            pass
        else:
            if used.memory_bytes is not None:
                return used.cpu_seconds, used.memory_bytes, used.throttled_periods
            with contextlib.suppress(psutil.Error):
                return used.cpu_seconds, int(main.memory_info().rss), used.throttled_periods
            return None
    try:
        t = main.cpu_times()
        cpu = float(t.user + t.system + t.children_user + t.children_system)
        rss = int(main.memory_info().rss)
        kids = main.children(recursive=True)
    except psutil.Error:  # exited (or a zombie) between the poll and now
        return None
    # Reuse Process objects across samples: psutil then checks a pid is still the same process.
    known = pod.children
    live: dict[int, psutil.Process] = {}
    for kid in kids:
        proc = known.get(kid.pid, kid)
        try:
            kt = proc.cpu_times()
            cpu += float(kt.user + kt.system)
            rss += int(proc.memory_info().rss)
        except psutil.Error:
            continue
        live[kid.pid] = proc
    pod.children = live
    return cpu, rss, None
