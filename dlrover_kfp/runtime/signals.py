"""How a master stops on a signal: every stop signal ends in the same clean shutdown.

Users stop a run by Ctrl-C (SIGINT, often twice), by closing the terminal or the ssh session
(SIGHUP), or through a scheduler (SIGTERM: Kubernetes, Airflow, ``kill``). Each must leave the
machine as a finished run does: pods stopped, their cgroups removed, shared memory released;
and the run resumable (its run file and committed checkpoints kept). Before, SIGHUP killed the
master outright, and a second Ctrl-C interrupted the cleanup itself: a frozen worker, its
cgroups and the PS's ``/dev/shm`` snapshots stayed behind.

The rules (:func:`install`):

* The **first** signal raises :class:`Interrupted` (a ``KeyboardInterrupt``) in the main
  thread, wherever it is, so that the run unwinds through its ``finally`` blocks.
* Code in an :func:`uninterruptible` function (the run's release of its pods, server and
  memory) is never interrupted: a first signal that arrives there is held until the function
  returns, and raised then. Whether a frame is inside one is read from the interrupted frame's
  call chain, so there is no window between "an exception is unwinding" and "the cleanup has
  begun" in which a signal could skip it.
* Every **later** signal (after the first was raised, or a second one inside the cleanup) only
  sets :func:`hurried`: waits that honour it (the local backend's grace period for pods that
  ignore SIGTERM or are frozen) end at once. A signal never skips a cleanup step.

The handlers write with ``os.write`` on the standard error descriptor: a signal handler that
runs while the main thread is inside a buffered write must not write through the same buffer.
On SIGHUP a terminal on stdout or stderr is gone (writes to it fail with EIO), so those
descriptors are pointed at ``/dev/null`` first; output redirected to a file or pipe is kept.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import ParamSpec, TypeVar

#: The signals a master stops on, the same way.
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_P = ParamSpec("_P")
_R = TypeVar("_R")


class Interrupted(KeyboardInterrupt):
    """A stop signal arrived; the command unwinds, cleaning up, and exits ``128 + signum``
    (the shell's convention: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@dataclass(slots=True)
class _State:
    """What the handler has seen. Written only by the handler, which runs in the main thread
    between two bytecodes: plain attributes, no locks (a lock the interrupted code holds
    would deadlock the handler)."""

    signals: int = 0
    raised: bool = False
    hurried: bool = False
    held: int = 0  # a first signal that arrived inside a cleanup: raised when it returns

    def reset(self) -> None:
        self.signals, self.raised, self.hurried, self.held = 0, False, False, 0


_state = _State()


def install() -> None:
    """Make SIGINT, SIGTERM and SIGHUP stop the command as the module docstring says. For a
    command's main thread (elsewhere, where Python cannot install handlers, it does nothing).

    A signal the command was started with ignored stays ignored: ``nohup`` ignores SIGHUP so
    that the run outlives the terminal, and a shell ignores SIGINT for a background job."""
    if threading.current_thread() is not threading.main_thread():
        return
    _state.reset()
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _on_signal)


def hurried() -> bool:
    """Whether a second stop signal asked for grace periods to be cut short."""
    return _state.hurried


def uninterruptible(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Mark ``fn`` as a cleanup that stop signals do not interrupt (see the module docstring).
    Keep such functions bounded in time: only a SIGKILL ends them early."""

    @functools.wraps(fn)
    def shielded(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        result = fn(*args, **kwargs)
        state = _state
        if state.held and not state.raised and not _in_cleanup(sys._getframe(1)):
            state.raised = True
            raise Interrupted(state.held)
        return result

    return shielded


# Every function uninterruptible() wraps runs inside this one code object (the nested def's).
_SHIELD = uninterruptible(lambda: None).__code__


def _in_cleanup(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code is _SHIELD:
            return True
        frame = frame.f_back
    return False


def _say(line: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, f"dlrover-kfp: {line}\n".encode())


def _detach_terminal() -> None:
    """After a hangup the terminal is gone: point stdout and stderr at /dev/null if they were
    on it, so that a progress line or the final message cannot fail the cleanup."""
    ttys = [fd for fd in (1, 2) if _isatty(fd)]
    if not ttys:
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in ttys:
            os.dup2(null, fd)
    finally:
        os.close(null)


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _on_signal(signum: int, frame: FrameType | None) -> None:
    state = _state
    state.signals += 1
    name = signal.Signals(signum).name
    if signum == signal.SIGHUP:
        _detach_terminal()
    if _in_cleanup(frame) or state.raised:
        if state.signals == 1:
            state.held = signum
            _say(f"{name}: stopping once the cleanup in progress is done")
        elif not state.hurried:
            state.hurried = True
            _say(f"{name}: cleaning up; grace periods cut short (pods are killed now)")
        return
    state.raised = True
    _say(
        f"{name}: stopping; pods, cgroups and shared memory are released first (a second "
        "signal cuts the grace periods short)"
    )
    raise Interrupted(signum)


def exit_code(exc: KeyboardInterrupt) -> int:
    """The exit status for a command stopped by ``exc`` (130 for a plain Ctrl-C)."""
    return exc.exit_code if isinstance(exc, Interrupted) else 128 + signal.SIGINT


__all__ = [
    "STOP_SIGNALS",
    "Interrupted",
    "exit_code",
    "hurried",
    "install",
    "uninterruptible",
]
