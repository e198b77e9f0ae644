"""A :class:`~dlrover_kfp.backends.api.ClusterBackend` whose pods are local OS processes.

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

Each pod's stdout and stderr are appended to ``<log_dir>/<name>.log``, between a header and a
trailer line written by the backend (name, role, index, resources, outcome; never env values).

Use it as a context manager so that an exception in the job master does not leave processes
behind; an ``atexit`` hook is a second line of defence. Neither helps if the job master itself is
SIGKILLed: its pods then keep running in their own sessions.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

import psutil  # type: ignore[import-untyped, unused-ignore]

from dlrover_kfp.backends import cgroups as cg
from dlrover_kfp.backends.api import (
    BackendClosedError,
    PodExistsError,
    PodNotFoundError,
    PodPhase,
    PodReason,
    PodSpec,
    PodStatus,
    PodUsage,
)
from dlrover_kfp.ports import Clock, SystemClock

logger = logging.getLogger(__name__)

_MIB = 1024 * 1024
_SIGKILL_EXIT = 128 + signal.SIGKILL  # 137, what a container runtime reports for SIGKILL
# containerd reports a command that cannot be executed as exit code 128 with reason StartError.
_START_ERROR_EXIT = 128


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
    # Descendants seen at the last sample, by pid. A cache written by _sample() without the
    # lock: replaced whole, never mutated, so a race only costs a fresh psutil.Process.
    children: dict[int, psutil.Process] = field(default_factory=dict)
    # Processes started in the pod by exec_in(): they end with the pod.
    execs: list[subprocess.Popen[bytes]] = field(default_factory=list)

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
        )


class LocalBackend:
    """Pods as local process groups; see the module docstring for what is and is not enforced.

    ``clock`` stamps ``started_at``/``finished_at`` (epoch seconds); CPU rates are measured on
    the monotonic clock regardless, so a fixed clock in tests does not break :meth:`usage`.

    ``cgroups`` says how limits are enforced: ``"auto"`` (the default) looks for cgroups this
    process may create (:func:`.cgroups.detect`) and falls back to accounting only, saying so
    once; ``"off"`` only accounts; or a :class:`.cgroups.Cgroups` to use.
    """

    def __init__(
        self,
        log_dir: Path,
        *,
        watchdog_interval_s: float = 0.2,
        clock: Clock | None = None,
        cgroups: cg.Cgroups | Literal["auto", "off"] = "auto",
    ) -> None:
        if watchdog_interval_s <= 0:
            raise ValueError(f"watchdog_interval_s must be positive, got {watchdog_interval_s}")
        self._log_dir = Path(log_dir)
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self._interval = watchdog_interval_s
        self._clock: Clock = clock if clock is not None else SystemClock()
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
        # Reentrant: _finish() is called both from the watchdog and from methods holding it.
        self._lock = threading.RLock()
        self._pods: dict[str, _Pod] = {}
        self._stale_groups: list[cg.PodGroup] = []
        self._closed = False
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
                try:
                    group = self._create_group(pod)
                    command, extra_env = self._command(pod, group)
                    process = subprocess.Popen(
                        command,
                        env=os.environ | dict(pod.env) | pod.resource_env() | extra_env,
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

    def close(self, grace_s: float = 5.0) -> None:
        """Delete every running pod (all at once, one ``grace_s`` in total) and stop the
        watchdog. Idempotent; statuses stay readable."""
        with self._lock:
            if self._closed:
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
            self._remove_groups(patience_s=2.0)
            if self._cgroups is not None:
                self._cgroups.close()
            atexit.unregister(self.close)

    # -- local extras ------------------------------------------------------------------------

    def log_path(self, name: str) -> Path:
        """Where the pod's stdout and stderr go (appended across relaunches)."""
        return self._log_dir / f"{name}.log"

    def exec_in(self, name: str, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside running pod ``name``, as ``kubectl exec`` does: in the pod's
        cgroups, so that its CPU and memory count against the pod's limits (a sidecar, a
        debugging shell, or a noisy neighbour in a test). It is killed when the pod ends.
        Without cgroups it runs beside the pod, unconstrained."""
        with self._lock:
            pod = self._pods.get(name)
            if pod is None or not pod.running:
                raise PodNotFoundError(f"pod {name} is not running")
            command, extra_env = (
                cg.wrap_command(argv, pod.group) if pod.group is not None else (tuple(argv), {})
            )
            process = subprocess.Popen(
                command,
                env=os.environ | extra_env,
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
            if pod.group is not None:
                # Any OOM kill in the group ends the pod as OOMKilled, even when the kernel
                # chose a child and the main process then exited on its own: a container on a
                # current kubelet (cgroup v2 ``memory.oom.group``) is killed as a whole.
                if _oom_kills(pod.group) > 0:
                    pod.oom_killed = True
                # Removed once the killed processes have left it (the watchdog retries).
                self._stale_groups.append(pod.group)
                pod.group = None
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
        """SIGTERM every group, wait up to ``grace_s`` in total, SIGKILL what is left. Runs
        without the lock so that statuses and the watchdog go on meanwhile."""
        pods = [p for p in pods if p.process is not None]
        for pod in pods:
            assert pod.process is not None
            _kill_group(pod.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + max(0.0, grace_s)
        for pod in pods:
            assert pod.process is not None
            try:
                returncode = pod.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.info("pod %s ignored SIGTERM for %gs: SIGKILL", pod.spec.name, grace_s)
                _kill_group(pod.process.pid, signal.SIGKILL)
                returncode = pod.process.wait()
            self._finish(pod, returncode)

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


def _kill_group(pgid: int, sig: int) -> None:
    """Signal a pod's process group; an empty group (all exited) is fine.

    The group id cannot be reused while any member lives, so this never hits a stranger.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


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
