"""A container's log as the fake kubelet keeps and serves it: the pieces of ``pods/NAME/log``.

A container runtime reads a container's stdout and stderr from pipes and writes each line to
the pod's log file with the time it read it (the CRI log format: ``2016-10-06T00:17:09.669794202Z
stdout F text``); the kubelet serves that file for ``GET pods/NAME/log``, from a tail, since a
time, with each line's time in front, up to a number of bytes, following it while the
container runs. The local backend instead appends a pod's output straight to a file, with a
header line before it and an outcome line after it (:class:`dlrover_kfp.backends.LocalBackend`);
:class:`ContainerLog` reads that file as the runtime reads the pipe: it leaves the backend's two
lines out and stamps each line when it reads it (:meth:`ContainerLog.pump`, every
``LOG_POLL_S`` of the kubelet: a line's time is when it was read, as on a node, up to that
much after it was written). :func:`read_log` is the kubelet's ``ReadLogs``.

Not modelled: stdout and stderr are one stream (the backend writes both to one file); a line
longer than the runtime's 16 KiB buffer is one record, not several partial ones (``tailLines``
counts it once); the kubelet's log rotation.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

#: How often the kubelet reads its running containers' output.
LOG_POLL_S = 0.05
#: The backend's line before a pod's output (its name follows).
_HEADER = b"--- dlrover-kfp launch "


@dataclass(frozen=True, slots=True)
class PodLogOptions:
    """A ``pods/NAME/log`` request's query (core/v1 PodLogOptions), decoded and validated by
    the API server. ``since_time`` is in seconds since the epoch."""

    container: str = ""
    follow: bool = False
    previous: bool = False
    since_seconds: int | None = None
    since_time: float | None = None
    timestamps: bool = False
    tail_lines: int | None = None
    limit_bytes: int | None = None

    def since_ns(self, now: float) -> int | None:
        """The oldest line time served (ns), or None: the later of ``sinceSeconds`` before
        ``now`` and ``sinceTime``, as the kubelet's NewLogOptions takes them."""
        bounds = []
        if self.since_seconds is not None:
            bounds.append(now - self.since_seconds)
        if self.since_time is not None:
            bounds.append(self.since_time)
        return math.floor(max(bounds) * 1e9) if bounds else None


def timestamp(ns: int) -> bytes:
    """A line's time as the kubelet writes it before the line: RFC 3339 in UTC with exactly
    nine fractional digits (its ``timeFormatOut``, ``2006-01-02T15:04:05.000000000Z07:00``)."""
    seconds, nanos = divmod(ns, 1_000_000_000)
    whole = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{nanos:09d}Z".encode()


@dataclass(eq=False)
class ContainerLog:
    """One container's output as its runtime recorded it: ``(ns, line)`` records, each line
    with its ``\\n`` but the last one of a container that ended mid-line. ``path`` is the
    backend's log of the pod, read from ``offset`` (where this incarnation's header starts).
    ``drained`` once the process has ended and its last output is read; ``ended`` once the
    kubelet has reported the container terminated (or its pod went): followers then stop, as
    a real kubelet's stop once the runtime says the container is no longer running."""

    path: Path
    offset: int
    #: the backend's outcome line after this container's output (its pod's name in it)
    trailer: re.Pattern[bytes]
    lines: list[tuple[int, bytes]] = field(default_factory=list)
    drained: bool = False
    ended: bool = False
    changed: threading.Condition = field(default_factory=threading.Condition)
    _pending: bytes = b""
    _started: bool = False
    _last_stamp: int = 0

    @classmethod
    def at_end_of(cls, path: Path, local_name: str) -> ContainerLog:
        """The log of a container about to start, whose backend pod is ``local_name``: its
        output is what the backend appends to ``path`` from now on."""
        try:
            offset = path.stat().st_size
        except FileNotFoundError:
            offset = 0
        name = re.escape(local_name.encode())
        trailer = re.compile(rb"(.*?)--- dlrover-kfp \w+ " + name + rb": reason=\S* exit_code=\S*")
        return cls(path, offset, trailer)

    def pump(self, *, final: bool = False) -> None:
        """Record the lines written since the last call, stamped now; ``final`` (the process
        has ended and the backend written its outcome): also the last unterminated line, and
        nothing more is read."""
        with self.changed:
            if self.drained or self.ended:
                return
            data = self._read_new()
            *complete, self._pending = (self._pending + data).split(b"\n")
            fresh = [r for line in complete if (r := self._record(line)) is not None]
            if final:
                if self._pending and self._started:
                    fresh.append((self._stamp(), self._pending))
                self._pending, self.drained = b"", True
            self.lines.extend(fresh)
            if fresh or final:
                self.changed.notify_all()

    def end(self) -> None:
        """The container is reported terminated, or its pod is gone: whoever follows the log
        stops."""
        with self.changed:
            self.ended = True
            self.changed.notify_all()

    def _read_new(self) -> bytes:
        try:
            if self.path.stat().st_size <= self.offset:
                return b""
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return b""
        self.offset += len(data)
        return data

    def _stamp(self) -> int:
        """Now, in ns, after the last line's time: a runtime stamps each line as it reads it,
        so lines read together still have times of their own, in order."""
        self._last_stamp = max(time.time_ns(), self._last_stamp + 1)
        return self._last_stamp

    def _record(self, line: bytes) -> tuple[int, bytes] | None:
        """The record of one complete line read, None for the backend's own lines: the header
        (and anything before it: an earlier pod's outcome line) and the outcome line, whose
        text before it (output that did not end its last line) is the container's last."""
        if not self._started:
            self._started = line.startswith(_HEADER)
            return None
        outcome = self.trailer.fullmatch(line)
        if outcome is not None:
            return (self._stamp(), outcome.group(1)) if outcome.group(1) else None
        return self._stamp(), line + b"\n"


def read_log(
    log: ContainerLog, options: PodLogOptions, alive: Callable[[], bool]
) -> Iterator[bytes]:
    """The kubelet's ReadLogs: the last ``tail_lines`` records (all without it), those of them
    at or after ``since``, each after its time and a space when ``timestamps``, cut after
    ``limit_bytes``; with ``follow``, then each new record as it comes, until the container
    has ended (or ``alive()`` turns False: the kubelet or the server is going away)."""
    since = options.since_ns(time.time())
    remaining = options.limit_bytes if options.limit_bytes is not None else math.inf
    with log.changed:
        tail = options.tail_lines
        index = len(log.lines) if tail == 0 else max(0, len(log.lines) - (tail or len(log.lines)))
    while remaining > 0:
        with log.changed:
            while options.follow and index >= len(log.lines) and not log.ended and alive():
                log.changed.wait(0.25)
            batch = log.lines[index:]
        index += len(batch)
        out = b"".join(
            (timestamp(at) + b" " + text if options.timestamps else text)
            for at, text in batch
            if since is None or at >= since
        )
        if len(out) > remaining:
            out = out[: int(remaining)]
        remaining -= len(out)
        if out:
            yield out
        if not options.follow or (not batch and (log.ended or not alive())):
            return
