"""The simulator's two charts (``dlrover-kfp simulate``).

* :func:`jct_cdf_svg`: the empirical CDF of job completion times, one step line per policy, on
  a log-scaled minutes axis (ticks at 1, 3, 10, 30, ... within the data's range). The fraction
  is over each policy's *completed* jobs, so a policy that finishes fewer jobs is not penalised
  here; the summary table's completion rate says that. A policy with no completed job gets no
  line, only a legend entry reading "no completed jobs".
* :func:`utilisation_svg`: CPU and memory utilisation (used / allocated) over simulated hours,
  two stacked panels, one line per policy.

  - Smoothing: the series has one point per simulated step (120 s), which is noisy and, over a
    long run, far too many points for a readable (and small) file. Points are averaged over
    fixed windows of :data:`WINDOW_HOURS` (1 hour) aligned to hour 0, and each window is drawn
    at the mean time of the points it averaged. A run longer than :data:`MAX_WINDOWS` hours
    widens the window to a whole number of hours so that at most that many are drawn.
  - No data: the runner writes 0.0 for a step where nothing was allocated, which cannot be told
    apart from "allocated but idle". Exact 0.0 is therefore treated as *no data*: it is left out
    of the window averages, and a window with no data leaves a gap in the line (a window
    alone between gaps is drawn as a dot).
  - The y axis runs 0-100 %; it grows in steps of 20 % only if a window's mean exceeds 100 %.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterator, Mapping, Sequence

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from dlrover_kfp.report.plots.style import (
    _WIDTH,
    _legend_outside,
    _styled,
    new_figure,
    policy_colours,
    render_svg,
)

#: The smoothing window of the utilisation chart, in simulated hours.
WINDOW_HOURS = 1.0
#: The most windows drawn per policy and panel; longer runs get wider (whole-hour) windows.
MAX_WINDOWS = 2000

_NO_JOBS = "no completed jobs"
_NO_DATA = "no utilisation data"


# ---------------------------------------------------------------------------- the JCT CDF


def log_ticks(low: float, high: float) -> list[float]:
    """The 1-3-10 ticks from the largest one <= ``low`` to the smallest one >= ``high``.

    Both must be positive. There are always at least two ticks, so the axis has a width.
    """
    if not (0 < low <= high) or not math.isfinite(high):
        raise ValueError(f"log_ticks needs 0 < low <= high, finite; got {low}, {high}")
    first = math.floor(math.log10(low)) - 1
    last = math.ceil(math.log10(high)) + 1
    candidates = [m * 10.0**k for k in range(first, last + 1) for m in (1.0, 3.0)]
    slack = 1e-9
    start = max(c for c in candidates if c <= low * (1 + slack))
    end = min(c for c in candidates if c >= high * (1 - slack))
    ticks = [c for c in candidates if start <= c <= end]
    if len(ticks) < 2:
        ticks.append(candidates[candidates.index(ticks[-1]) + 1])
    return ticks


def cdf_points(values: Sequence[float], left: float) -> list[tuple[float, float]]:
    """The step line of the empirical CDF of ``values`` (sorted, finite, >= 0).

    Starts at ``(left, 0)`` and steps up by 1/n at every value (ties: one step of k/n); values
    below ``left`` are drawn at ``left``.
    """
    points = [(left, 0.0)]
    done = 0
    for value, group in itertools.groupby(values):
        before = done
        done += sum(1 for _ in group)
        x = max(value, left)
        points += [(x, before / len(values)), (x, done / len(values))]
    return points


def _tick_label(value: float) -> str:
    return str(round(value)) if value >= 1 else f"{value:g}"


def _minutes(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    if value >= 1:
        return f"{value:.1f}"
    return f"{value:.2g}"


@_styled
def jct_cdf_figure(jct_minutes: Mapping[str, Sequence[float]], *, title: str) -> Figure:
    """The empirical CDF of JCT (minutes) per policy.

    Each line steps up by 1/n at every completed job's JCT and ends at y = 1 at the largest.
    Values that are not finite or negative are ignored; values below the axis (including 0)
    are drawn at its left edge. The legend gives each policy's median JCT, or "no completed
    jobs" (a policy without a line).
    """
    names = list(jct_minutes)
    colours = policy_colours(names)
    values = {
        name: sorted(v for v in jct_minutes[name] if math.isfinite(v) and v >= 0) for name in names
    }
    positive = [v for vs in values.values() for v in vs if v > 0]
    ticks = log_ticks(min(positive), max(positive)) if positive else log_ticks(1.0, 10.0)

    figure = new_figure(_WIDTH, 4.4)
    figure.set_label("jct-cdf")
    ax = figure.add_subplot()
    ax.set_title(title)
    ax.set_xscale("log")
    ax.set_xlim(ticks[0], ticks[-1])
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _tick_label(v)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_ylim(0.0, 1.0)
    ax.yaxis.set_major_locator(FixedLocator([i / 5 for i in range(6)]))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:.1f}"))
    ax.set_xlabel("JCT (min, log scale)")
    ax.set_ylabel("fraction of completed jobs with JCT ≤ x")
    handles: list[Line2D] = []
    for name in names:
        vs = values[name]
        if not vs:
            handles.append(Line2D([], [], color=colours[name], label=f"{name}\n{_NO_JOBS}"))
            continue
        xs, ys = zip(*cdf_points(vs, ticks[0]), strict=True)
        (line,) = ax.plot(
            xs,
            ys,
            color=colours[name],
            gid=f"cdf-{name}",
            label=f"{name}\nmedian {_minutes(statistics.median(vs))} min",
            clip_on=False,
        )
        handles.append(line)
    _legend_outside(figure, handles)
    return figure


def jct_cdf_svg(jct_minutes: Mapping[str, Sequence[float]], *, title: str) -> str:
    """:func:`jct_cdf_figure` as an SVG document."""
    return render_svg(jct_cdf_figure(jct_minutes, title=title), "jct-cdf")


# -------------------------------------------------------------------------- utilisation


def window_means(
    points: Sequence[tuple[float, float]] | Iterator[tuple[float, float]],
    window_hours: float = WINDOW_HOURS,
) -> list[list[tuple[float, float]]]:
    """``(hour, value)`` points averaged over windows of ``window_hours`` aligned to hour 0.

    Exact 0.0 and non-finite values are *no data* and left out. Each window with data gives one
    point, (mean hour, mean value) of its points; runs of consecutive windows with data form
    the segments returned, so a window without data splits the line.
    """
    if not window_hours > 0:
        raise ValueError(f"window_hours must be positive, got {window_hours}")
    windows: dict[int, list[tuple[float, float]]] = {}
    for hour, value in points:
        if value == 0.0 or not (math.isfinite(hour) and math.isfinite(value)):
            continue
        windows.setdefault(math.floor(hour / window_hours), []).append((hour, value))
    segments: list[list[tuple[float, float]]] = []
    previous: int | None = None
    for index in sorted(windows):
        members = windows[index]
        mean = (
            math.fsum(h for h, _ in members) / len(members),
            math.fsum(v for _, v in members) / len(members),
        )
        if previous is None or index != previous + 1:
            segments.append([])
        segments[-1].append(mean)
        previous = index
    return segments


def _joined(segments: Sequence[Sequence[tuple[float, float]]]) -> tuple[list[float], list[float]]:
    """Segments as one x, y series with a NaN between segments (matplotlib breaks the line)."""
    xs: list[float] = []
    ys: list[float] = []
    for segment in segments:
        if xs:
            xs.append(math.nan)
            ys.append(math.nan)
        xs += [h for h, _ in segment]
        ys += [v for _, v in segment]
    return xs, ys


@_styled
def utilisation_figure(
    series: Mapping[str, Sequence[tuple[float, float, float]]], *, title: str
) -> Figure:
    """CPU (top) and memory (bottom) utilisation per policy over simulated hours.

    ``series`` maps a policy to its ``(hour, cpu used/allocated, memory used/allocated)``
    points. See the module's docstring for the smoothing and for what counts as no data.
    """
    names = list(series)
    colours = policy_colours(names)
    hours = [p[0] for name in names for p in series[name] if math.isfinite(p[0])]
    x_low = min(0.0, *hours) if hours else 0.0
    x_high = max(hours) if hours else 1.0
    if x_high <= x_low:
        x_high = x_low + 1.0
    window = max(WINDOW_HOURS, float(math.ceil((x_high - x_low) / MAX_WINDOWS)))
    panels = {
        "cpu": {n: window_means([(p[0], p[1]) for p in series[n]], window) for n in names},
        "memory": {n: window_means([(p[0], p[2]) for p in series[n]], window) for n in names},
    }
    peak = max(
        (v for by in panels.values() for s in by.values() for g in s for _, v in g), default=1
    )
    y_high = max(1.0, math.ceil(round(peak / 0.2, 9)) * 0.2)
    labels = {"cpu": "CPU used / allocated (%)", "memory": "memory used / allocated (%)"}

    figure = new_figure(_WIDTH, 5.6)
    figure.set_label("utilisation")
    figure.suptitle(title, fontweight="bold")
    axes = figure.subplots(2, 1, sharex=True)
    for ax, panel in zip(axes, panels, strict=True):
        ax.set_xlim(x_low, x_high)
        ax.set_ylim(0.0, y_high)
        ax.yaxis.set_major_locator(FixedLocator([i * 0.2 for i in range(round(y_high / 0.2) + 1)]))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:.0%}"))
        ax.set_ylabel(labels[panel])
        ax.patch.set_gid(f"plot-area-{panel}")
        for name in names:
            segments = panels[panel][name]
            if not segments:
                continue
            xs, ys = _joined(segments)
            ax.plot(xs, ys, color=colours[name], gid=f"{panel}-{name}", linewidth=1.4)
            lone = [seg[0] for seg in segments if len(seg) == 1]
            if lone:  # a window alone between gaps: a dot, or it would not show
                ax.plot(
                    [h for h, _ in lone],
                    [v for _, v in lone],
                    linestyle="none",
                    marker="o",
                    markersize=2.5,
                    color=colours[name],
                    gid=f"{panel}-{name}-dots",
                )
    smoothing = f"{window:g}-hour means" if window != 1 else "1-hour means"
    axes[1].set_xlabel(f"simulated time (h); {smoothing}, idle steps left out")
    handles = [
        Line2D(
            [],
            [],
            color=colours[name],
            label=name if any(panels[p][name] for p in panels) else f"{name}\n{_NO_DATA}",
        )
        for name in names
    ]
    _legend_outside(figure, handles)
    return figure


def utilisation_svg(
    series: Mapping[str, Sequence[tuple[float, float, float]]], *, title: str
) -> str:
    """:func:`utilisation_figure` as an SVG document."""
    return render_svg(utilisation_figure(series, title=title), "utilisation")
