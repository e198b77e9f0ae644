"""A clock for the job master's logic that moves only when the code waits.

The runtime reads and waits only through :class:`dlrover_kfp.ports.Clock`; under this clock a
20-second pause timeout or a 180-second startup timeout passes in as many loop turns as the
code polls, in microseconds, and a test can assert exactly how long the code waited. ``world``
callbacks run at every sleep, with the new time: the pods' behaviour (a PS that registers after
3 s, a worker that exits at 40 s) is scripted against the clock the code sees.
"""

from __future__ import annotations

from collections.abc import Callable


class FakeClock:
    """Monotonic time starts at ``start``; the time of day is ``epoch`` plus it."""

    def __init__(self, start: float = 1_000.0, epoch: float = 1_800_000_000.0) -> None:
        self._t = start
        self._epoch = epoch
        #: every sleep the code made, in order
        self.sleeps: list[float] = []
        #: called after every sleep with the new monotonic time
        self.world: list[Callable[[float], None]] = []

    def now(self) -> float:
        return self._epoch + self._t

    def monotonic(self) -> float:
        return self._t

    def sleep(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"sleep length must be non-negative, got {seconds}")
        self.sleeps.append(seconds)
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        """Move time on (as a sleep does, without recording one)."""
        self._t += seconds
        for step in list(self.world):
            step(self._t)
