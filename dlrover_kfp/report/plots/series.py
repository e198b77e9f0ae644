"""Time on a chart's axis, and a run's long series thinned and broken at gaps before drawing."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

#: The most points drawn per time series of a run report; longer ones are averaged into bins.
MAX_POINTS = 400


@dataclass(frozen=True, slots=True)
class TimeUnit:
    """How a chart shows seconds: divide by ``seconds`` and write ``label``."""

    seconds: float
    label: str


def time_unit(span_s: float) -> TimeUnit:
    """Seconds up to 30 minutes, minutes up to 10 hours, hours beyond."""
    if span_s <= 1800:
        return TimeUnit(1.0, "s")
    if span_s <= 36000:
        return TimeUnit(60.0, "min")
    return TimeUnit(3600.0, "h")


def bin_means(
    xs: Sequence[float], ys: Sequence[float], max_points: int = MAX_POINTS
) -> tuple[list[float], list[float]]:
    """``xs, ys`` unchanged when short; else averaged over ``max_points`` equal runs of points.

    NaN in ``ys`` (a gap) is left out of a bin's mean; a bin of gaps only stays a gap.
    """
    if len(xs) <= max_points:
        return list(xs), list(ys)
    size = math.ceil(len(xs) / max_points)
    out_x, out_y = [], []
    for start in range(0, len(xs), size):
        chunk_y = [y for y in ys[start : start + size] if not math.isnan(y)]
        out_x.append(statistics.fmean(xs[start : start + size]))
        out_y.append(statistics.fmean(chunk_y) if chunk_y else math.nan)
    return out_x, out_y


def break_gaps(
    xs: Sequence[float], ys: Sequence[float], factor: float = 3.0
) -> tuple[list[float], list[float]]:
    """``xs, ys`` with a NaN point (a break in the line) wherever two neighbours are more than
    ``factor`` times the median spacing apart: a stretch without samples is shown as one, not
    as a straight line that pretends to know what happened in it."""
    if len(xs) < 3:
        return list(xs), list(ys)
    spacing = statistics.median(b - a for a, b in itertools.pairwise(xs))
    out_x, out_y = [xs[0]], [ys[0]]
    for (a, b), y in zip(itertools.pairwise(xs), ys[1:], strict=True):
        if spacing > 0 and b - a > factor * spacing:
            # the break sits on the last point before the gap, so that a step line
            # (drawstyle steps-post) does not carry its value into the gap either
            out_x.append(a)
            out_y.append(math.nan)
        out_x.append(b)
        out_y.append(y)
    return out_x, out_y


def _series(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    """A time series as drawn: binned when long (:func:`bin_means`), broken at gaps."""
    return break_gaps(*bin_means(xs, ys))
