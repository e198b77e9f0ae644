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

**Cancellation.** When the trigger is cancelled (the task was cleared or marked by hand, or
the triggerer moved it or shut down) the job keeps running by default: a triggerer's restart
cancels its triggers too, and killing a training run because a scheduler component restarted
would lose hours of work. With ``kill_on_cancel`` the master's process group gets SIGTERM (the
master stops its pods and exits). A deadline that passes stops the job: the task gave up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import psutil  # type: ignore[import-untyped, unused-ignore]
from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_plugin.runs import MASTER_EXIT, MASTER_LOG, PROFILE_FILE

CLASSPATH: Final = "airflow_plugin.triggers.ElasticTrainTrigger"

#: How many lines of the master's log an error event carries.
LOG_TAIL_LINES: Final = 30
_LOG_TAIL_BYTES: Final = 16_384
#: psutil reports creation times rounded to the clock tick; equal within this is the same.
_CREATE_TIME_TOLERANCE_S: Final = 0.05


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
    :param kill_on_cancel: stop the job when the trigger is cancelled (default: leave it).
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
        self.kill_on_cancel = kill_on_cancel

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
                "kill_on_cancel": self.kill_on_cancel,
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
        try:
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
        except asyncio.CancelledError:
            if self.kill_on_cancel and terminate_master(self.pid, self.create_time):
                self.log.warning("trigger cancelled: sent SIGTERM to job master %s", self.pid)
            raise
        yield _event(finished_event(output_dir, self.pid))


__all__ = [
    "CLASSPATH",
    "ElasticTrainTrigger",
    "finished_event",
    "log_tail",
    "master_alive",
    "process_create_time",
    "terminate_master",
]
