"""The PS pod's first process: restarts a crashed PS inside its pod, as DLRover's agent does.

    python -m dlrover_kfp.training.supervisor --fork dlrover_kfp.training.node \
        --preload dlrover_kfp.training.ps_server -- ps 0 --master 10.0.0.5:41000
    python -m dlrover_kfp.training.supervisor -- COMMAND [ARG...]

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

How the child starts (the zygote pattern). With ``--fork MODULE`` the supervisor imports
MODULE (and each ``--preload`` module: the PS's torch and numpy) once, when the pod starts, and
starts every child by ``os.fork()`` and ``MODULE.main(ARGS)`` in it (MODULE is imported first, and
its ``announce(ARGS)``, if it has one, runs before the preloads: the PS's tells the master the
pod is loading, before torch takes its seconds): no new interpreter and no
second torch import. A PS restarted in its pod then serves again in the time its restore takes,
not the ~3 s an interpreter and torch take to start at half a core. The first start is not
slower (the import moves from the child to the supervisor, and one interpreter starts, not
two); the torch pages are shared copy-on-write by the supervisor and its child, so the pod's
memory does not double: a serving PS pod held 167 MiB (anon + shmem) forked against 163 MiB
with a new interpreter, though each of the two processes' RSS counts the shared pages (233 and
187 MiB). Without ``--fork`` the command is started by ``posix_spawn``: the supervisor then
imports nothing but the standard library (~10 MiB).

A fork copies only the forking thread: a lock another thread held stays locked in the child
forever. The supervisor therefore starts no thread and runs no torch op (torch's OpenMP pool
starts on first use), keeps numpy's OpenBLAS pool, which starts at import, at one thread (the
PS makes no BLAS call: its math is torch's), and checks before each fork that it is still
alone (:func:`fork_hazard`); where it is not, it logs why and starts the child as a new
interpreter instead (``python -m MODULE ARGS``, which must mean what ``MODULE.main(ARGS)`` does).

Signals are blocked and taken with ``sigtimedwait`` rather than handled: a stop signal sent to
the whole process group (a local pod's stop) reaches the child and the supervisor at once, and
a child that died of it must still read as stopped, not crashed; a blocked signal stays pending
until the supervisor looks, so no ordering between the child's death and the handler matters.
The child starts with an empty signal mask and the dispositions a new interpreter has (SIGINT
raises KeyboardInterrupt, the others are the default): ``posix_spawn``'s ``setsigmask`` and
``setsigdef``, or the forked child's first act.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import NoReturn, TypeVar

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
#: numpy's OpenBLAS starts (cores - 1) threads when it loads unless this says otherwise.
_BLAS_THREADS_ENV = "OPENBLAS_NUM_THREADS"

#: Starts the child: (restarts so far, the last child's cause or None) -> its pid.
Start = Callable[[int, "str | None"], int]
M = TypeVar("M", bound=MutableMapping[str, str])


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


def _child_env(env: M, restarted: int, cause: str | None) -> M:
    """``env`` (changed in place) with the child's restart count and cause."""
    env[RESTARTS_ENV] = str(restarted)
    if cause is None:
        env.pop(CAUSE_ENV, None)
    else:
        env[CAUSE_ENV] = cause
    return env


def spawner(argv: Sequence[str]) -> Start:
    """Start the command ``argv`` as a new process at each start."""

    def start(restarted: int, cause: str | None) -> int:
        env = _child_env(dict(os.environ), restarted, cause)
        return os.posix_spawnp(argv[0], list(argv), env, setsigmask=(), setsigdef=_WAITED)

    return start


def fork_hazard() -> str | None:
    """Why forking this process now would be unsafe (another thread runs), or None.

    Python's own threads and the native ones (OpenMP, OpenBLAS pools) are both counted: the
    kernel's task list has every thread, ``threading`` only Python's."""
    if threading.active_count() > 1:
        return f"{threading.active_count()} Python threads run"
    with contextlib.suppress(OSError):  # no /proc: Python's count is all there is
        tasks = len(os.listdir("/proc/self/task"))
        if tasks > 1:
            return f"{tasks} threads run (/proc/self/task)"
    return None


def preload(modules: Sequence[str]) -> float:
    """Import ``modules`` into this process, to be shared by every forked child; seconds taken.

    OpenBLAS is held to one thread (unless the pod says otherwise) so that numpy's import
    starts none; :func:`gc.freeze` then moves every object loaded so far out of the collector's
    reach, so that no collection in a child writes to (and so copies) the pages they are on.
    A bound for a long-lived child: in a 20 s run the pod held 167 MiB with or without it."""
    began = time.monotonic()
    os.environ.setdefault(_BLAS_THREADS_ENV, "1")
    for name in modules:
        importlib.import_module(name)
    gc.freeze()
    return time.monotonic() - began


def _run_forked(
    entry: Callable[[list[str]], int], argv: list[str], restarted: int, cause: str | None
) -> NoReturn:
    """The forked child: the dispositions and mask of a new interpreter, its restart count and
    cause in its environment, then ``entry(argv[1:])``. Whatever happens, it leaves with
    ``os._exit`` and never returns into the supervisor's loop."""
    code = 1
    try:
        for signum in _WAITED:
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as a new interpreter has
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        _child_env(os.environ, restarted, cause)
        sys.argv = argv
        code = entry(argv[1:])
    except SystemExit as exc:  # sys.exit() in the child, or argparse's usage error
        if isinstance(exc.code, int) or exc.code is None:
            code = exc.code or 0
        else:
            sys.stderr.write(f"{exc.code}\n")
    except KeyboardInterrupt:  # dies of SIGINT, as an interpreter does on an uncaught one
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # a crash: its traceback, then exit 1
        traceback.print_exc()
    finally:
        # As the trainer's own ``__main__`` leaves: no interpreter teardown under threads
        # still inside torch; the log flushed first.
        with contextlib.suppress(BaseException):
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def forker(module: str, args: Sequence[str], preloaded: Sequence[str] = ()) -> Start:
    """Preload ``module`` and ``preloaded`` now; start each child by forking and calling
    ``module.main(args)``, or as ``python -m module args`` when a fork is unsafe then."""
    # MODULE first (light: the PS's code loads with the preloads) so that it can say, before
    # the slow imports, that the pod runs and is loading (``MODULE.announce(args)``, if it has
    # one: training/node.py's tells the master). numpy's pool is held to one thread first.
    os.environ.setdefault(_BLAS_THREADS_ENV, "1")
    announce = getattr(importlib.import_module(module), "announce", None)
    if announce is not None:
        announce(list(args))
    took = preload([*preloaded, module])
    entry: Callable[[list[str]], int] = importlib.import_module(module).main
    _log(f"preloaded {', '.join([module, *preloaded])} in {took:.2f}s; children are forked")
    spawn = spawner([sys.executable, "-m", module, *args])

    def start(restarted: int, cause: str | None) -> int:
        hazard = fork_hazard()
        if hazard is not None:
            _log(f"not forking: {hazard}; starting a new interpreter instead")
            return spawn(restarted, cause)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _run_forked(entry, [module, *args], restarted, cause)
        return pid

    return start


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
    start: Start,
    *,
    max_crashes: int = MAX_CRASHES,
    window_s: float = CRASH_WINDOW_S,
) -> int:
    """Run the child ``start`` starts, restarting it as the module docstring says; the exit
    code."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _WAITED)
    crashes = _Crashes(max_crashes, window_s)
    restarted, cause = 0, None
    while True:
        ooms = oom_kills()
        pid = start(restarted, cause)
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


_USAGE = (
    "usage: python -m dlrover_kfp.training.supervisor -- COMMAND [ARG...]\n"
    "       python -m dlrover_kfp.training.supervisor --fork MODULE [--preload MODULE]... "
    "-- [ARG...]\n"
)


def parse(args: Sequence[str]) -> tuple[str | None, list[str], list[str]] | str:
    """(the module to fork or None, the modules to preload, the command or the module's
    arguments) from the supervisor's arguments, or what is wrong with them."""
    fork: str | None = None
    preloaded: list[str] = []
    rest = list(args)
    while rest and rest[0] != "--":
        flag = rest.pop(0)
        if flag not in ("--fork", "--preload") or not rest or rest[0].startswith("-"):
            return f"{flag!r}: expected --fork MODULE, --preload MODULE or --"
        if flag == "--fork":
            fork = rest.pop(0)
        else:
            preloaded.append(rest.pop(0))
    if not rest:
        return "missing '--' before the command"
    command = rest[1:]
    if fork is None and preloaded:
        return "--preload needs --fork"
    if fork is None and not command:
        return "no command"
    return fork, preloaded, command


def main(argv: Sequence[str] | None = None) -> int:
    parsed = parse(sys.argv[1:] if argv is None else argv)
    if isinstance(parsed, str):
        sys.stderr.write(f"supervisor: {parsed}\n{_USAGE}")
        return 2
    fork, preloaded, command = parsed
    try:
        start = spawner(command) if fork is None else forker(fork, command, preloaded)
    except (ImportError, AttributeError) as exc:  # no module, or no main: nothing to start
        _log(f"cannot load {fork!r}: {exc}")
        return 127
    try:
        return supervise(start)
    except OSError as exc:  # the command could not be started at all
        what = command[0] if fork is None else fork
        _log(f"cannot start {what!r}: {exc.strerror or exc}")
        return 127


if __name__ == "__main__":
    sys.exit(main())
