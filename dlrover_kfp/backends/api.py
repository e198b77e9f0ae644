"""What every cluster backend shares beyond the port: why a pod failed, read from its output.

The port itself (:class:`~dlrover_kfp.ports.ClusterBackend`, :class:`~dlrover_kfp.ports.PodSpec`,
:class:`~dlrover_kfp.ports.PodStatus`, ...) lives in :mod:`dlrover_kfp.ports` with the other
ports; this module holds the one rule both implementations apply to a failed pod's log, so that
a pod's ``message`` means the same locally and on Kubernetes. It performs no I/O.
"""

from __future__ import annotations

import re

#: The longest error line a status carries: a message, not a log.
MAX_MESSAGE_CHARS = 300
# The last line of a Python traceback ("OSError: [Errno 28] No space left on device") and a
# log record at ERROR or CRITICAL ("... ERROR worker-0: data: ..."), the trainer's two ways of
# saying why it stops.
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b")
_ERROR_RECORD = re.compile(r"\s(?:ERROR|CRITICAL)\s")
#: Lines the backend itself writes into a pod's log (launch header, exit trailer).
BACKEND_LOG_PREFIX = "--- dlrover-kfp "


def last_error_line(text: str) -> str | None:
    """The last line of ``text`` (a pod's output, or its tail) that says why it failed: a
    traceback's exception line or an ERROR/CRITICAL log record; None when there is none (a pod
    killed from outside wrote nothing about it). Cut to :data:`MAX_MESSAGE_CHARS`.

    Only the pod's own output is read, and it never holds the job secret: secrets reach a pod
    in its env, which no backend writes into a log (:class:`~dlrover_kfp.ports.PodSpec`).
    """
    for raw in reversed(text.splitlines()):
        line = raw.strip()
        if not line or line.startswith(BACKEND_LOG_PREFIX):
            continue
        record = _ERROR_RECORD.search(f" {line} ")
        if record is not None:
            line = line[max(0, record.start()) :]  # from the level on: no timestamp
        elif not _EXCEPTION_LINE.match(line):
            continue
        return line if len(line) <= MAX_MESSAGE_CHARS else line[: MAX_MESSAGE_CHARS - 3] + "..."
    return None
