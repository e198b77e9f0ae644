"""Long commands: a bar on a terminal, plain lines (and no control characters) otherwise."""

from __future__ import annotations

import io

from dlrover_kfp.cli.progress import TerminalProgress
from dlrover_kfp.runtime.job import Meter


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_only_the_lines_are_printed() -> None:
    stream = io.StringIO()
    with TerminalProgress("samples", stream=stream) as progress:
        progress("[ 10.0%] 1,000/10,000 samples")
        progress.advance(1_000, 10_000)
        progress("done")
    assert stream.getvalue() == "[ 10.0%] 1,000/10,000 samples\ndone\n"


def test_on_a_terminal_the_lines_scroll_above_a_bar_of_done_over_total() -> None:
    stream = _Terminal()
    with TerminalProgress("samples", stream=stream) as progress:
        assert progress.bar
        progress("a line with [brackets] kept as written")
        progress.advance(3, 10)
    out = stream.getvalue()
    assert "a line with [brackets] kept as written" in out
    assert "3/10" in out
    assert "samples" in out


def test_it_is_a_meter_that_runs_advance() -> None:
    assert isinstance(TerminalProgress("x", stream=io.StringIO()), Meter)
    assert not isinstance(print, Meter)
