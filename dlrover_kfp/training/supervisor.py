"""The PS pod's first process: restarts a crashed PS inside its pod, as DLRover's agent does.

    python -m dlrover_kfp.training.supervisor -- python -m dlrover_kfp.training.node ps 0 ...

A PS keeps its flash snapshot in the pod's own ``/dev/shm`` (an ``emptyDir``: private to the
pod, gone with it). A PS *process* that dies while its pod lives (a crash, a SIGKILL of the
process alone) would take the pod down with it if it were the pod's main process, and the
snapshot with the pod: the relaunched pod restores from the volume. Run under this supervisor,
the process is started again in the same pod, on the same shared memory, and restores from its
own snapshot in seconds (:func:`~dlrover_kfp.training.checkpoint.restore_own_part`). Pod and
node loss still end the pod: that is what relaunching a pod is for.

What ends the supervisor, with which code (a container's exit code, as the backend reads it):

* a stop signal (SIGTERM, SIGINT, SIGHUP) it receives: forwarded to the child, whose end it
  then takes as its own (exit code, or 128 + n when the child died of signal n);
* the child exiting 0 (the job is done with this PS);
* a crash past the bound: more than :data:`MAX_CRASHES` crashes within :data:`CRASH_WINDOW_S`
  (a PS that cannot start is not restarted forever; the pod then fails and the master's
  relaunch policy takes over);
* the child killed for memory (its memory cgroup counted an OOM kill): a pod out of memory
  needs more, which only a relaunch gives it (the relaunch policy's OOM rule). A kubelet with
  cgroup v2 kills the whole container then (``memory.oom.group``); under cgroup v1 the kernel
  kills the biggest process, the PS, and the supervisor ends the pod itself.

A crash is a non-zero exit or a death by a signal the supervisor did not forward. A child that
exits with :data:`RESTART_EXIT` asks to be restarted (the master rolls every PS back to one
step: runtime/elastic.py) and is restarted without counting as a crash. The child learns how
often it was restarted and why from :data:`RESTARTS_ENV` and :data:`CAUSE_ENV`.

It sits in every PS pod's memory for the pod's life, so it imports nothing but the standard
library (no torch, no numpy): ~10 MiB resident.

Signals are blocked and taken with ``sigtimedwait`` rather than handled: a stop signal sent to
the whole process group (a local pod's stop) reaches the child and the supervisor at once, and
a child that died of it must still read as stopped, not crashed; a blocked signal stays pending
until the supervisor looks, so no ordering between the child's death and the handler matters.
The child starts with an empty signal mask and default dispositions (``posix_spawn``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

#: Exit code with which a PS asks its supervisor to start it again (not a crash).
RESTART_EXIT = 79
#: Crashes tolerated within CRASH_WINDOW_S; one more ends the pod (DLRover's agent restarts a
#: failed process 3 times by default before it gives the node up).
MAX_CRASHES = 3
CRASH_WINDOW_S = 600.0
#: How many times the child was started again in this pod (absent or "0": its first start).
RESTARTS_ENV = "DLROVER_KFP_RESTARTS"
#: Why the last child ended: "signal 9", "exit 1", or "asked" (it exited with RESTART_EXIT).
CAUSE_ENV = "DLROVER_KFP_RESTART_CAUSE"
#: The cause a restart asked for by the child itself carries.
ASKED = "asked"

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_WAITED = (*_STOP_SIGNALS, signal.SIGCHLD)
#: Seconds between waitpid polls besides SIGCHLD (a safety net: SIGCHLD is never lost while
#: blocked, but a poll costs nothing).
_POLL_S = 1.0


def oom_kills(root: Path = Path("/")) -> int | None:
    """OOM kills counted in this process's memory cgroup (cgroup v2 ``memory.events``, v1
    ``memory.oom_control``); None where there is none to read (no cgroup, an old kernel)."""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if not controllers:
            file = root / "sys/fs/cgroup" / path.lstrip("/") / "memory.events"
        elif "memory" in controllers.split(","):
            file = root / "sys/fs/cgroup/memory" / path.lstrip("/") / "memory.oom_control"
        else:
            continue
        try:
            rows = file.read_text().splitlines()
        except OSError:
            continue
        for row in rows:
            key, _, value = row.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


def restarts(env: Mapping[str, str]) -> int:
    """How many times the process with ``env`` was restarted in its pod (0: its first start)."""
    try:
        return max(0, int(env.get(RESTARTS_ENV, "0")))
    except ValueError:
        return 0


def describe(status: int) -> str:
    """A ``waitpid`` status in words: ``"exit 1"``, ``"signal 9"``."""
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit {os.waitstatus_to_exitcode(status)}"


def exit_code(status: int) -> int:
    """The code a container reports for a process that ended with ``status`` (128 + n for a
    death by signal n)."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


class _Crashes:
    """The crashes within the last ``window_s``: more than ``limit`` of them end the pod."""

    def __init__(self, limit: int, window_s: float) -> None:
        self.limit = limit
        self.window_s = window_s
        self.times: list[float] = []

    def add(self, now: float) -> bool:
        """Record a crash at ``now``; False once there were more than ``limit`` in the window."""
        self.times = [t for t in self.times if now - t < self.window_s] + [now]
        return len(self.times) <= self.limit


def _log(text: str) -> None:
    """A line in the pod's log (stderr), with the same prefix shape as the trainer's."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    sys.stderr.write(f"{stamp} supervisor[{os.getpid()}]: {text}\n")
    sys.stderr.flush()


def _spawn(argv: Sequence[str], restarted: int, cause: str | None) -> int:
    env = dict(os.environ)
    env[RESTARTS_ENV] = str(restarted)
    if cause is None:
        env.pop(CAUSE_ENV, None)
    else:
        env[CAUSE_ENV] = cause
    return os.posix_spawnp(argv[0], list(argv), env, setsigmask=(), setsigdef=_WAITED)


def _wait(pid: int) -> tuple[int, int | None]:
    """Until the child ``pid`` ends: (its waitpid status, the stop signal forwarded to it, if
    any). Stop signals that arrive are forwarded as they come."""
    forwarded: int | None = None
    while True:
        info = signal.sigtimedwait(_WAITED, _POLL_S)
        if info is not None and info.si_signo in _STOP_SIGNALS:
            forwarded = info.si_signo
            with contextlib.suppress(ProcessLookupError):  # it died of the group's signal
                os.kill(pid, forwarded)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            # A stop signal that came with the child's death (a group's stop) is still pending.
            pending = signal.sigpending() & set(_STOP_SIGNALS)
            if forwarded is None and pending:
                forwarded = min(pending)
            return status, forwarded


def supervise(
    argv: Sequence[str],
    *,
    max_crashes: int = MAX_CRASHES,
    window_s: float = CRASH_WINDOW_S,
) -> int:
    """Run ``argv`` as the child, restarting it as the module docstring says; the exit code."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _WAITED)
    crashes = _Crashes(max_crashes, window_s)
    restarted, cause = 0, None
    while True:
        ooms = oom_kills()
        pid = _spawn(argv, restarted, cause)
        status, forwarded = _wait(pid)
        code = exit_code(status)
        if forwarded is not None:
            _log(f"stopped by signal {forwarded}: the child ended with {describe(status)}")
            return code
        if code == 0:
            return 0
        now = oom_kills()
        if ooms is not None and now is not None and now > ooms:
            _log(f"child {pid} was killed for memory ({describe(status)}); the pod fails")
            return code
        if code == RESTART_EXIT:
            cause = ASKED
            _log(f"child {pid} asked to be restarted; restart {restarted + 1}")
        else:
            cause = describe(status)
            if not crashes.add(time.monotonic()):
                _log(
                    f"child {pid} crashed ({cause}): {len(crashes.times)} crashes within "
                    f"{window_s:g}s; giving up, the pod fails"
                )
                return code
            _log(
                f"child {pid} crashed ({cause}); restarting it in this pod "
                f"(restart {restarted + 1})"
            )
        restarted += 1


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        sys.stderr.write("usage: python -m dlrover_kfp.training.supervisor -- COMMAND [ARG...]\n")
        return 2
    try:
        return supervise(args)
    except OSError as exc:  # the command could not be started at all
        _log(f"cannot start {args[0]!r}: {exc.strerror or exc}")
        return 127


if __name__ == "__main__":
    sys.exit(main())
