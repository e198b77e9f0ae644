"""Child processes that tests signal as a user's terminal would."""

from __future__ import annotations

import sys

# Resets SIGINT and SIGHUP to their defaults, then becomes the command (dispositions at their
# defaults survive exec; ignored ones would too).
_AT_DEFAULT = (
    "import os, signal, sys\n"
    "for s in (signal.SIGINT, signal.SIGHUP):\n"
    "    signal.signal(s, signal.SIG_DFL)\n"
    "os.execvp(sys.argv[1], sys.argv[1:])\n"
)


def as_typed_in_a_terminal(argv: list[str]) -> list[str]:
    """``argv`` started with SIGINT and SIGHUP at their defaults, as a command typed in a
    terminal has them. A suite started as a background job (``nohup``, ``&`` in a script)
    hands its children both ignored, and the master keeps an ignored signal ignored on purpose
    (runtime/signals.py): a test of what Ctrl-C or a hangup does must not inherit that."""
    return [sys.executable, "-c", _AT_DEFAULT, *argv]
