"""Progress of long commands: a bar on a terminal, plain lines otherwise.

On a terminal (stderr is a TTY) the lines a command prints scroll above a progress bar drawn by
rich; piped to a file or a CI log, the same lines are printed one by one and no bar is drawn
(control characters would litter the log). Either way the lines go to stderr, so that stdout
stays the command's result (JSON, a table).
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class TerminalProgress:
    """A :class:`~dlrover_kfp.runtime.job.Meter`: lines, and a bar on a terminal.

    Use as a context manager; ``bar`` forces the bar on or off (default: on a TTY only).
    """

    def __init__(
        self, description: str, *, stream: TextIO | None = None, bar: bool | None = None
    ) -> None:
        self._stream = stream or sys.stderr
        self.bar = self._stream.isatty() if bar is None else bar
        self._description = description
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> TerminalProgress:
        if self.bar:
            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TaskProgressColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(file=self._stream),
            )
            self._progress.start()
            self._task = self._progress.add_task(self._description, total=None)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __call__(self, line: str) -> None:
        if self._progress is not None:
            # above the bar; the text is ours, not rich markup
            self._progress.console.print(line, markup=False, highlight=False)
        else:
            print(line, file=self._stream, flush=True)

    def advance(self, done: int, total: int) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=done, total=total)

    def describe(self, description: str) -> None:
        """A new label for the bar (the quickstart's round, the simulator's seed)."""
        self._description = description
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=description)


__all__ = ["TerminalProgress"]
