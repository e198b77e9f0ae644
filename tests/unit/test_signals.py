"""The stop-signal rules of :mod:`dlrover_kfp.runtime.signals`, in a real process.

A small script installs the handlers, sleeps in its "run", and on the way out calls an
``uninterruptible`` cleanup that waits up to a given time unless :func:`hurried` says to stop
waiting. The test sends it signals and reads what it printed: the cleanup must always run to
its end, a second signal may only shorten it, and the exit status is ``128 + signum``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.processes import as_typed_in_a_terminal

SCRIPT = """
import sys, time
from dlrover_kfp.runtime import signals

signals.install()
wait_s, body_s = float(sys.argv[1]), float(sys.argv[2])

def say(line):
    print(line, flush=True)

@signals.uninterruptible
def cleanup():
    say("cleanup started")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and not signals.hurried():
        time.sleep(0.01)
    say(f"cleanup done hurried={signals.hurried()}")

try:
    try:
        say("ready")
        time.sleep(body_s)
    finally:
        cleanup()
    say("went on")
except KeyboardInterrupt as exc:
    say(f"interrupted {exc}")
    sys.exit(signals.exit_code(exc))
"""
ROOT = Path(__file__).resolve().parents[2]


class Script:
    def __init__(self, wait_s: float, body_s: float, *, nohup: bool = False) -> None:
        self.process = subprocess.Popen(
            as_typed_in_a_terminal(
                [
                    *(["nohup"] if nohup else []),
                    sys.executable,
                    "-c",
                    SCRIPT,
                    *(str(wait_s), str(body_s)),
                ]
            ),
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self.lines: list[str] = []

    def wait_for(self, line: str, timeout_s: float = 20.0) -> None:
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        while line not in self.lines:
            assert time.monotonic() < deadline, self.lines
            out = self.process.stdout.readline()
            assert out, (self.lines, self.process.stderr.read() if self.process.stderr else "")
            self.lines.append(out.strip())

    def send(self, signum: int) -> None:
        self.process.send_signal(signum)

    def finish(self) -> tuple[int, list[str], str]:
        out, err = self.process.communicate(timeout=30)
        return self.process.returncode, self.lines + out.split("\n")[:-1], err


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_each_stop_signal_unwinds_through_the_whole_cleanup(signum: int) -> None:
    script = Script(wait_s=0.3, body_s=30)
    script.wait_for("ready")

    script.send(signum)
    code, lines, err = script.finish()

    name = signal.Signals(signum).name
    assert lines == [
        "ready",
        "cleanup started",
        "cleanup done hurried=False",
        f"interrupted {name}",
    ]
    assert code == 128 + signum
    assert "Traceback" not in err and name in err  # one line saying what happens


def test_a_second_signal_cuts_the_cleanup_short_but_never_interrupts_it() -> None:
    script = Script(wait_s=30, body_s=30)
    script.wait_for("ready")
    script.send(signal.SIGINT)
    script.wait_for("cleanup started")

    started = time.monotonic()
    for _ in range(3):  # Ctrl-C pressed again and again
        script.send(signal.SIGINT)
        time.sleep(0.05)
    code, lines, err = script.finish()

    assert lines[-2:] == ["cleanup done hurried=True", "interrupted SIGINT"]
    assert time.monotonic() - started < 10  # the cleanup would wait 30 s otherwise
    assert code == 130
    assert "Traceback" not in err and "grace periods cut short" in err


def test_a_first_signal_during_the_cleanup_is_held_until_it_ends() -> None:
    script = Script(wait_s=1.0, body_s=0)
    script.wait_for("cleanup started")

    script.send(signal.SIGTERM)
    code, lines, err = script.finish()

    assert lines == [
        "ready",
        "cleanup started",
        "cleanup done hurried=False",
        "interrupted SIGTERM",
    ]
    assert code == 143
    assert "Traceback" not in err


def test_without_a_signal_the_program_goes_on() -> None:
    code, lines, _ = Script(wait_s=0, body_s=0).finish()

    assert lines == ["ready", "cleanup started", "cleanup done hurried=False", "went on"]
    assert code == 0


@pytest.mark.skipif(shutil.which("nohup") is None, reason="no nohup here")
def test_under_nohup_a_hangup_stays_ignored() -> None:
    script = Script(wait_s=0, body_s=1.0, nohup=True)
    script.wait_for("ready")

    script.send(signal.SIGHUP)
    code, lines, _ = script.finish()

    assert lines[-1] == "went on"
    assert code == 0
