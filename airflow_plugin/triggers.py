"""The wait for a submitted job master, without holding a worker slot.

:class:`ElasticTrainTrigger` runs in Airflow's triggerer (or inline, under ``dag.test()``).
It polls the master's process every ``poll_interval`` seconds and fires one event when the
master has ended:

- ``{"status": "success", "run_id", "profile", "outcome", "exit_code"}``: the master ended
  and left ``profile.json`` (the run itself may have failed: ``outcome`` says);
- ``{"status": "error", "message", "exit_code", "log_tail"}``: it ended without a profile
  (a user error, a temporary failure, killed), the deadline passed, or the trigger runs on
  another machine than the master.

A process counts as the master only while its pid *and* its creation time match the ones
taken at submission, so that a recycled pid is not mistaken for it; a zombie counts as ended.

Everything the trigger needs is in :meth:`~ElasticTrainTrigger.serialize`'s JSON-able kwargs,
so that a triggerer that restarts, or another triggerer, takes the wait over where it was.

**Cancellation.** A user who marks the deferred task failed or success ends the run: Airflow
calls :meth:`~ElasticTrainTrigger.on_kill`, which says why in the run's directory (the master
then records the run as ``cancelled``), sends SIGTERM to the master's process group (the master
stops its pods) and waits up to :data:`STOP_BOUND_S` for it to end, then SIGKILLs the group.
A cleared task, a triggerer that restarts or hands the trigger to another, leave the job
running (:mod:`airflow_plugin.cancel`): the task's next attempt waits for the same master. A
deadline that passes stops the job: the task gave up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import psutil  # type: ignore[import-untyped, unused-ignore]
from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_plugin.cancel import stop_reason, warm_up
from airflow_plugin.runs import MASTER_EXIT, MASTER_LOG, PROFILE_FILE
from dlrover_kfp.steps.cancel import request_cancel

CLASSPATH: Final = "airflow_plugin.triggers.ElasticTrainTrigger"

#: How many lines of the master's log an error event carries.
LOG_TAIL_LINES: Final = 30
_LOG_TAIL_BYTES: Final = 16_384
#: psutil reports creation times rounded to the clock tick; equal within this is the same.
_CREATE_TIME_TOLERANCE_S: Final = 0.05
#: Seconds a cancelled master has to stop its pods and record the run before its process
#: group is killed: under Airflow's ``[triggerer] on_kill_timeout`` (30 s by default).
STOP_BOUND_S: Final = 20.0


def process_create_time(pid: int) -> float:
    """The creation time the trigger matches ``pid`` against (psutil's, seconds since epoch)."""
    return float(psutil.Process(pid).create_time())


def master_alive(pid: int, create_time: float) -> bool:
    """Whether the master submitted as ``pid`` at ``create_time`` is still running.

    A zombie is not running: it is reaped here when this process is its parent (under
    ``dag.test()`` the task that submitted it runs in this process), which also keeps it from
    piling up.
    """
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - create_time) > _CREATE_TIME_TOLERANCE_S:
            return False  # the pid now belongs to another process
        if proc.status() == psutil.STATUS_ZOMBIE:
            _reap(pid)
            return False
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # it exists and matched; another user's processes are not ours to judge
    return True


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def terminate_master(pid: int, create_time: float, sig: int = signal.SIGTERM) -> bool:
    """Send ``sig`` to the master's process group (it leads one: it was started in a session of
    its own), only if ``pid`` still is the master. True when a signal was sent."""
    if not master_alive(pid, create_time):
        return False
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        os.kill(pid, sig)
    return True


async def stop_master(pid: int, create_time: float, bound_s: float) -> str:
    """SIGTERM to the master's process group, then SIGKILL if it is still running after
    ``bound_s`` seconds; what happened, for the log."""
    if not terminate_master(pid, create_time):
        return "had already ended"
    started = time.monotonic()
    while time.monotonic() - started < bound_s:
        await asyncio.sleep(0.2)
        if not master_alive(pid, create_time):
            return f"stopped in {time.monotonic() - started:.1f}s"
    terminate_master(pid, create_time, signal.SIGKILL)
    return f"did not stop within {bound_s:g}s and was killed"


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ("" when there is none)."""
    try:
        with path.open("rb") as file:
            file.seek(0, os.SEEK_END)
            size = file.tell()
            file.seek(max(0, size - _LOG_TAIL_BYTES))
            data = file.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def read_exit_code(output_dir: Path) -> int | None:
    """The master's exit status from ``master-exit.json``; None when it left none (killed)."""
    try:
        data = json.loads((output_dir / MASTER_EXIT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    code = data.get("exit_code") if isinstance(data, dict) else None
    return code if isinstance(code, int) else None


def finished_event(output_dir: Path, pid: int) -> dict[str, Any]:
    """The event payload for a master that has ended (see the module docstring)."""
    exit_code = read_exit_code(output_dir)
    profile = output_dir / PROFILE_FILE
    summary = _profile_summary(profile)
    if summary is not None:
        run_id, outcome = summary
        return {
            "status": "success",
            "run_id": run_id,
            "profile": str(profile),
            "outcome": outcome,
            "exit_code": exit_code,
        }
    how = "was killed" if exit_code is None else f"exited with status {exit_code}"
    return {
        "status": "error",
        "message": f"the job master (pid {pid}) {how} without writing {profile}",
        "exit_code": exit_code,
        "log_tail": log_tail(output_dir / MASTER_LOG),
    }


def _profile_summary(path: Path) -> tuple[str, str] | None:
    """The run id and outcome of a profile file; None when there is no readable one. (The
    operator validates the whole profile; the trigger only needs to know that it is there.)"""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        run_id = data["run_id"]
        outcome = data["outcome"]["status"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(run_id, str) or not isinstance(outcome, str):
        return None
    return run_id, outcome


def _event(payload: dict[str, Any]) -> TriggerEvent:
    # Airflow's TriggerEvent.__init__ has no annotations
    return TriggerEvent(payload)  # type: ignore[no-untyped-call]


class ElasticTrainTrigger(BaseTrigger):
    """Wait for a dlrover-kfp job master started as a local process (see the module docstring).

    :param pid: the master's process id.
    :param create_time: its creation time (:func:`process_create_time`), against pid reuse.
    :param output_dir: the run's output directory (``profile.json``, ``master.log``).
    :param host: the machine the master runs on: a process id means nothing on another one.
    :param poll_interval: seconds between two looks at the process.
    :param deadline: seconds since the epoch after which the wait fails and the job is stopped;
        None waits for ever. An absolute time, so that a restarted trigger keeps it.
    :param kill_on_cancel: ignored; accepted so that a trigger serialized by an earlier version
        (which had the option) still loads. A user's cancel now always stops the job, a
        triggerer's restart never does.
    """

    def __init__(
        self,
        *,
        pid: int,
        create_time: float,
        output_dir: str,
        host: str,
        poll_interval: float = 5.0,
        deadline: float | None = None,
        kill_on_cancel: bool = False,
    ) -> None:
        # Airflow's BaseTrigger.__init__ has no annotations
        super().__init__()  # type: ignore[no-untyped-call]
        self.pid = pid
        self.create_time = create_time
        self.output_dir = output_dir
        self.host = host
        self.poll_interval = poll_interval
        self.deadline = deadline
        del kill_on_cancel  # see the docstring

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            CLASSPATH,
            {
                "pid": self.pid,
                "create_time": self.create_time,
                "output_dir": self.output_dir,
                "host": self.host,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        here = socket.gethostname()
        if here != self.host:
            yield _event(
                {
                    "status": "error",
                    "message": f"the job master runs on {self.host} but this trigger on {here}: "
                    "the local backend needs the triggerer on the worker's machine",
                    "exit_code": None,
                    "log_tail": "",
                }
            )
            return
        output_dir = Path(self.output_dir)
        self._warming = asyncio.ensure_future(warm_up(self))  # kept: a task needs a reference
        while master_alive(self.pid, self.create_time):
            if self.deadline is not None and time.time() >= self.deadline:
                stopped = terminate_master(self.pid, self.create_time)
                yield _event(
                    {
                        "status": "error",
                        "message": f"the job master (pid {self.pid}) was still running at "
                        "the deadline" + ("; it was sent SIGTERM" if stopped else ""),
                        "exit_code": None,
                        "log_tail": log_tail(output_dir / MASTER_LOG),
                    }
                )
                return
            await asyncio.sleep(self.poll_interval)
        yield _event(finished_event(output_dir, self.pid))

    async def on_kill(self) -> None:
        """A user acted on the deferred task (Airflow 3.3+): stop the job unless the task was
        cleared (:mod:`airflow_plugin.cancel`). The run is recorded as cancelled by its master."""
        reason = await stop_reason(self)
        if reason is None:
            self.log.info(
                "the task was cleared: job master %s keeps running; the next attempt waits "
                "for it again",
                self.pid,
            )
            return
        if socket.gethostname() != self.host:
            self.log.error("cannot stop job master %s: it runs on %s", self.pid, self.host)
            return
        await asyncio.to_thread(request_cancel, self.output_dir, reason)
        stopped = await stop_master(self.pid, self.create_time, STOP_BOUND_S)
        self.log.warning("%s: job master %s %s", reason, self.pid, stopped)


# ---- a master in the cluster -------------------------------------------------------------------

KUBE_CLASSPATH: Final = "airflow_plugin.triggers.KubernetesTrainTrigger"
#: Log lines read back when the trigger starts (again): enough context, bounded.
_FIRST_LOG_LINES: Final = 1000


def _stamp_key(stamp: str) -> tuple[str, int]:
    """An RFC 3339 timestamp as a sortable key: the API server trims the nanoseconds' trailing
    zeros, so that the strings themselves do not sort."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    digits = "".join(ch for ch in fraction if ch.isdigit())[:9]
    return whole, int(digits.ljust(9, "0") or 0)


class KubernetesTrainTrigger(BaseTrigger):
    """Wait for a job master that runs as a pod (``ElasticTrainOperator(backend=
    "kubernetes")``), through the Kubernetes API only: any triggerer host can run it.

    Every ``poll_interval`` seconds it reads the pod and the new lines of its log, which go to
    the task's log as the master writes them; it fires one event when the pod has ended:
    ``{"status": "success", "backend": "kubernetes", "namespace", "pod", "uid", "exit_code"}``
    when the master printed its profile (the run may still have failed: the operator reads the
    profile), else ``{"status": "error", "message", "exit_code", "log_tail"}`` (the pod failed
    without a profile, was deleted, or the deadline passed: the pod is then deleted).

    :param namespace: the pod's namespace. :param pod: its name. :param uid: its uid (a pod of
        the same name created later is not this one).
    :param kubeconfig: the kubeconfig file; None: in-cluster, else ``$KUBECONFIG``.
    :param context: the kubeconfig context.
    """

    def __init__(
        self,
        *,
        namespace: str,
        pod: str,
        uid: str,
        kubeconfig: str | None = None,
        context: str | None = None,
        poll_interval: float = 5.0,
        deadline: float | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.namespace = namespace
        self.pod = pod
        self.uid = uid
        self.kubeconfig = kubeconfig
        self.context = context
        self.poll_interval = poll_interval
        self.deadline = deadline

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            KUBE_CLASSPATH,
            {
                "namespace": self.namespace,
                "pod": self.pod,
                "uid": self.uid,
                "kubeconfig": self.kubeconfig,
                "context": self.context,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
            },
        )

    async def _pods(self) -> Any:
        from airflow_plugin.kube import MasterPods, load_api  # noqa: PLC0415 - the client: here

        api = await asyncio.to_thread(load_api, self.kubeconfig, self.context)
        return MasterPods(api, self.namespace)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_plugin.kube import PROFILE_PREFIX  # noqa: PLC0415

        self._warming = asyncio.ensure_future(warm_up(self))  # kept: a task needs a reference
        pods = await self._pods()
        last: tuple[str, int] | None = None
        last_time = time.time()
        while True:
            state = await asyncio.to_thread(pods.state, self.pod, self.uid)
            last, last_time = await self._stream(pods, last, last_time, PROFILE_PREFIX)
            if state.ended:
                break
            if self.deadline is not None and time.time() >= self.deadline:
                await asyncio.to_thread(pods.delete, self.pod, self.uid)
                yield _event(
                    {
                        "status": "error",
                        "message": f"the job master pod {self.pod} was still running at the "
                        "deadline; it was deleted",
                        "exit_code": None,
                        "log_tail": "",
                    }
                )
                return
            await asyncio.sleep(self.poll_interval)
        yield _event(await self._finished(pods, state, PROFILE_PREFIX))

    async def _stream(
        self, pods: Any, last: tuple[str, int] | None, last_time: float, prefix: str
    ) -> tuple[tuple[str, int] | None, float]:
        """Log the master's lines written since the last look (the task log streams them)."""
        from airflow_plugin.kube import parse_log  # noqa: PLC0415

        now = time.time()
        if last is None:
            raw = await asyncio.to_thread(pods.log, self.pod, None, _FIRST_LOG_LINES)
        else:
            since = math.ceil(now - last_time) + 2  # a margin: lines are matched by stamp
            raw = await asyncio.to_thread(pods.log, self.pod, since)
        for line in parse_log(raw):
            key = _stamp_key(line.stamp) if line.stamp else None
            if key is not None and last is not None and key <= last:
                continue
            if not line.text.startswith(prefix):  # the profile: read by the operator
                self.log.info("[master] %s", line.text)
            if key is not None:
                last = key
        return last, now

    async def _finished(self, pods: Any, state: Any, prefix: str) -> dict[str, Any]:
        from airflow_plugin.kube import parse_log  # noqa: PLC0415

        raw = await asyncio.to_thread(pods.log, self.pod, None, LOG_TAIL_LINES + 1)
        lines = [line.text for line in parse_log(raw)]
        has_profile = any(text.startswith(prefix) for text in lines)
        tail = "\n".join(text for text in lines if not text.startswith(prefix))
        if state.exists and has_profile:
            return {
                "status": "success",
                "backend": "kubernetes",
                "namespace": self.namespace,
                "pod": self.pod,
                "uid": self.uid,
                "exit_code": state.exit_code,
            }
        how = (
            f"ended ({state.phase}{', ' + state.reason if state.reason else ''}) with exit "
            f"code {state.exit_code} without a profile"
            if state.exists
            else "was deleted before it ended"
        )
        return {
            "status": "error",
            "message": f"the job master pod {self.pod} {how}",
            "exit_code": state.exit_code,
            "log_tail": tail,
        }

    async def on_kill(self) -> None:
        """A user acted on the deferred task: stop the job unless the task was cleared
        (:mod:`airflow_plugin.cancel`). The master, told why through its pod's annotation,
        stops its pods and records the run as cancelled; its pod is deleted."""
        reason = await stop_reason(self)
        if reason is None:
            self.log.info("the task was cleared: the job master pod %s keeps running", self.pod)
            return
        pods = await self._pods()
        await asyncio.to_thread(pods.cancel, self.pod, self.uid, reason)
        started = time.monotonic()
        gone = await asyncio.to_thread(pods.wait_gone, self.pod, self.uid, STOP_BOUND_S)
        if not gone:
            await asyncio.to_thread(pods.delete, self.pod, self.uid, 0)
        self.log.warning(
            "%s: job master pod %s %s",
            reason,
            self.pod,
            f"stopped in {time.monotonic() - started:.1f}s"
            if gone
            else f"did not stop within {STOP_BOUND_S:g}s and was deleted at once",
        )


__all__ = [
    "CLASSPATH",
    "ElasticTrainTrigger",
    "KubernetesTrainTrigger",
    "finished_event",
    "log_tail",
    "master_alive",
    "process_create_time",
    "stop_master",
    "terminate_master",
]
