"""The package's one plotting module: every chart dlrover-kfp draws, on matplotlib.

Each public ``*_figure`` function builds a :class:`matplotlib.figure.Figure` from plain data
and each ``*_svg`` one renders it (:func:`render_svg`, or :func:`render_png` for bytes). No
pyplot: a figure is created directly and given an Agg canvas, so nothing here touches
pyplot's global figure registry or the process's default backend, and importing this module
from a server or a test changes nothing for anyone else. Styles (fonts, SVG text as text)
apply only inside :func:`_style`.

Conventions every chart keeps:

* every axis says what it measures and its unit (s, min, h, samples/s, cores, MiB, %);
* a role or a policy has one colour everywhere (:data:`ROLE_COLOURS`, :data:`POLICY_COLOURS`),
  an event kind one colour and marker (:data:`EVENT_STYLES`);
* series longer than :data:`MAX_POINTS` are averaged into that many bins, so that an SVG of a
  long run stays small;
* artists a test or a reader needs to find carry a ``gid`` (an ``id`` in the SVG):
  ``cdf-POLICY``, ``cpu-POLICY``, ``memory-POLICY``, ``plan-worker``, ``throughput``,
  ``event-KIND``, ``model-parity`` ...

The simulator's two charts (``dlrover-kfp simulate``):

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

import functools
import io
import itertools
import math
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec

import matplotlib
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullLocator

from dlrover_kfp.core.observation import Observation
from dlrover_kfp.core.perf_model import PerfModel
from dlrover_kfp.core.profile import AppliedPlan, JobEvent, RuntimeSample

if TYPE_CHECKING:  # matplotlib >= 3.9 names its rc keys; the code runs on 3.8 too
    from matplotlib.typing import RcKeyType

#: The smoothing window of the utilisation chart, in simulated hours.
WINDOW_HOURS = 1.0
#: The most windows drawn per policy and panel; longer runs get wider (whole-hour) windows.
MAX_WINDOWS = 2000
#: The most points drawn per time series of a run report; longer ones are averaged into bins.
MAX_POINTS = 400

#: A fixed colour per known policy, so that the same policy looks the same in every chart.
POLICY_COLOURS: Mapping[str, str] = {
    "manual": "#7f7f7f",
    "optimus": "#1f77b4",
    "dlrover-oss": "#ff7f0e",
    "dlrover-kfp": "#2ca02c",
}
#: Colours for other policies, in order of appearance (none is a known policy's colour).
PALETTE: tuple[str, ...] = ("#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")

#: A fixed colour per role (and for the job's total), in every run chart.
ROLE_COLOURS: Mapping[str, str] = {"worker": "#1f77b4", "ps": "#ff7f0e", "total": "#2f2f2f"}
#: Shades for the pods of a role, darkest first (pod i gets shade i modulo the count).
_POD_SHADES: Mapping[str, tuple[str, ...]] = {
    "worker": ("#08306b", "#2171b5", "#4292c6", "#6baed6", "#08519c", "#9ecae1"),
    "ps": ("#7f2704", "#d94801", "#f16913", "#fd8d3c", "#a63603", "#fdae6b"),
}


@dataclass(frozen=True, slots=True)
class EventStyle:
    colour: str
    marker: str
    label: str


#: One colour, marker and legend label per event kind of a profile.
EVENT_STYLES: Mapping[str, EventStyle] = {
    "oom": EventStyle("#d62728", "v", "OOM"),
    "relaunch": EventStyle("#9467bd", "o", "relaunch"),
    "migration": EventStyle("#8c564b", "s", "PS migration"),
    "straggler": EventStyle("#e377c2", "D", "straggler"),
    "scale": EventStyle("#17becf", "^", "scale"),
    "failure": EventStyle("#000000", "X", "failure"),
}

_NO_JOBS = "no completed jobs"
_NO_DATA = "no utilisation data"
#: Width of every chart (inches): a report's column, or the simulator's file.
_WIDTH = 9.0
_RC: dict[RcKeyType, Any] = {
    "svg.fonttype": "none",  # text stays text: searchable, selectable, small
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Arial", "Helvetica"],
    "font.size": 9.0,
    "axes.titlesize": 11.0,
    "axes.titleweight": "bold",
    "axes.grid": True,
    "grid.color": "#dddddd",
    "grid.linewidth": 0.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.fontsize": 8.0,
    "legend.frameon": False,
    "lines.linewidth": 1.6,
}


@contextmanager
def _style(key: str) -> Iterator[None]:
    """The package's chart style, for building and rendering one figure.

    ``key`` salts the ids matplotlib writes into an SVG (clip paths, markers), so that several
    charts inlined into one HTML page do not share ids.
    """
    with matplotlib.rc_context({**_RC, "svg.hashsalt": key}):
        yield


P = ParamSpec("P")


def _styled(build: Callable[P, Figure]) -> Callable[P, Figure]:
    """Build the figure inside :func:`_style`: matplotlib reads most styles when an artist is
    created, not when it is drawn."""

    @functools.wraps(build)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Figure:
        with _style(build.__name__):
            return build(*args, **kwargs)

    return wrapper


def new_figure(width: float, height: float) -> Figure:
    """A figure with an Agg canvas and constrained layout; no pyplot involved."""
    figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


#: Where the plot area of a run's time charts ends and their legend begins (figure fraction).
_TIME_CHART_RIGHT = 0.79


def _time_chart(height: float, rows: int = 1) -> tuple[Figure, list[Axes]]:
    """A figure for one of a run's charts over time, with fixed margins instead of a layout
    engine: the plan, throughput and pod charts of a report then share their x positions, so
    that a moment lines up from one chart to the next. The legend goes right of
    :data:`_TIME_CHART_RIGHT` (:func:`_legend_right`)."""
    figure = Figure(figsize=(_WIDTH, height), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
    figure.subplots_adjust(
        left=0.095,
        right=_TIME_CHART_RIGHT,
        top=1 - 0.12 / height,
        bottom=0.5 / height,
        hspace=0.08 * rows,
    )
    return figure, list(axes)


def _legend_right(figure: Figure, handles: Sequence[Line2D]) -> None:
    if handles:
        figure.legend(
            handles=list(handles),
            loc="upper left",
            bbox_to_anchor=(_TIME_CHART_RIGHT + 0.015, 1 - 0.1 / figure.get_figheight()),
        )


def render_svg(figure: Figure, key: str = "") -> str:
    """The figure as an SVG document: text kept as text, no date or creator metadata.

    ``key`` (default: the figure's label) salts the ids in the document; give each chart of
    one page its own.
    """
    buffer = io.BytesIO()
    with _style(key or str(figure.get_label() or "figure")):
        figure.savefig(
            buffer,
            format="svg",
            metadata={"Date": None, "Creator": None, "Format": None, "Type": None},
        )
    return buffer.getvalue().decode("utf-8")


def render_png(figure: Figure, dpi: int = 100) -> bytes:
    """The figure as PNG bytes (Agg)."""
    buffer = io.BytesIO()
    with _style(str(figure.get_label() or "figure")):
        figure.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None})
    return buffer.getvalue()


def policy_colours(names: Sequence[str]) -> dict[str, str]:
    """A colour per policy: the fixed one for known policies, the palette in turn for others."""
    colours: dict[str, str] = {}
    others = 0
    for name in dict.fromkeys(names):
        if name in POLICY_COLOURS:
            colours[name] = POLICY_COLOURS[name]
        else:
            colours[name] = PALETTE[others % len(PALETTE)]
            others += 1
    return colours


# ------------------------------------------------------------------------ shared helpers


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


def _empty_note(ax: Axes, text: str) -> None:
    ax.text(
        0.5,
        0.5,
        text,
        transform=ax.transAxes,
        ha="center",
        va="center",
        color="#555555",
        fontsize=10,
    )


def _legend_outside(figure: Figure, handles: Sequence[Line2D]) -> None:
    if handles:
        figure.legend(handles=list(handles), loc="outside right upper")


def _shape(workers: int, worker_cpu: float, ps: int, ps_cpu: float) -> str:
    return f"{workers}w×{worker_cpu:g} + {ps}ps×{ps_cpu:g}"


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


# ------------------------------------------------------------------- a run: the plan


def _time_axis(ax: Axes, end_s: float) -> TimeUnit:
    """Label ``ax``'s x axis as time since the job started, 0 to ``end_s``; the unit used."""
    end = end_s if end_s > 0 else 1.0
    unit = time_unit(end)
    ax.set_xlim(0.0, end / unit.seconds)
    ax.set_xlabel(f"time since job start ({unit.label})")
    return unit


@_styled
def plan_timeline_figure(
    plans: Sequence[AppliedPlan], end_s: float, *, quota_cpu: float | None = None
) -> Figure:
    """CPU requested over the run, a step line per role and for the total, from the plans.

    Each plan holds from its time to the next plan's (the last to ``end_s``); each change is
    numbered and annotated with the stage that made it. ``quota_cpu``: the job's CPU limit,
    drawn dotted. The PS line is dashed, so that it does not hide the workers' where the two
    request the same.
    """
    figure, (ax,) = _time_chart(3.4)
    figure.set_label("plan")
    end = max([end_s, *(p.time for p in plans)])
    unit = _time_axis(ax, end)
    ax.set_ylabel("CPU requested (cores)")
    if not plans:
        _empty_note(ax, "no plan recorded")
        return figure
    xs = [p.time / unit.seconds for p in plans] + [end / unit.seconds]
    series = {
        "worker": [p.workers.total_cpu for p in plans],
        "ps": [p.ps.total_cpu for p in plans],
        "total": [p.workers.total_cpu + p.ps.total_cpu for p in plans],
    }
    labels = {"worker": "workers × CPU", "ps": "PS × CPU", "total": "total CPU requested"}
    styles = {"worker": "-", "ps": "--", "total": "-"}
    handles: list[Line2D] = []
    for role, values in series.items():
        (line,) = ax.step(
            xs,
            [*values, values[-1]],
            where="post",
            color=ROLE_COLOURS[role],
            linestyle=styles[role],
            linewidth=2.2 if role == "total" else 1.6,
            gid=f"plan-{role}",
            label=labels[role],
        )
        handles.append(line)
    top = max(series["total"])
    if quota_cpu is not None:
        line = ax.axhline(
            quota_cpu,
            color="#999999",
            linestyle=":",
            linewidth=1.2,
            gid="plan-quota",
            label=f"quota ({quota_cpu:g} cores)",
        )
        handles.append(line)
        top = max(top, quota_cpu)
    ax.set_ylim(0.0, top * 1.3 if top > 0 else 1.0)
    ax.yaxis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
    ax.plot(
        xs[:-1],
        series["total"],
        linestyle="none",
        marker="o",
        markersize=4,
        color=ROLE_COLOURS["total"],
        gid="plan-changes",
    )
    for index, plan in enumerate(plans):
        ax.annotate(
            f"{index + 1} {plan.stage.value}",
            xy=(plan.time / unit.seconds, series["total"][index]),
            xytext=(4, 5),
            textcoords="offset points",
            rotation=35,
            rotation_mode="anchor",
            fontsize=8,
            color="#333333",
            annotation_clip=False,
            gid=f"plan-stage-{index + 1}",
        )
    _legend_right(figure, handles)
    return figure


# ------------------------------------------------------ a run: throughput and events


@_styled
def throughput_figure(
    samples: Sequence[RuntimeSample], events: Sequence[JobEvent], end_s: float
) -> Figure:
    """Samples/s over time (0 to ``end_s``), the job's events as dotted vertical lines.

    Each event kind has its colour and marker (:data:`EVENT_STYLES`), drawn along the top in
    a row of its own so that two kinds at the same moment stay apart; the legend counts them.
    """
    figure, (ax,) = _time_chart(3.2)
    figure.set_label("throughput")
    end = max([end_s, *(s.time for s in samples), *(e.time for e in events)])
    unit = _time_axis(ax, end)
    ax.set_ylabel("throughput (samples/s)")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
    handles: list[Line2D] = []
    top = 0.0
    if samples:
        xs, ys = _series([s.time / unit.seconds for s in samples], [s.throughput for s in samples])
        (line,) = ax.plot(
            xs,
            ys,
            color=ROLE_COLOURS["worker"],
            marker=".",
            markersize=5,
            gid="throughput",
            label="samples/s (all workers)",
        )
        handles.append(line)
        top = max((y for y in ys if not math.isnan(y)), default=0.0)
    else:
        _empty_note(ax, "no runtime samples")
    kinds = [kind for kind in EVENT_STYLES if any(e.kind == kind for e in events)]
    top = top if top > 0 else 1.0
    # room above the data for one row of markers per kind present
    ax.set_ylim(0.0, top * (1.08 + 0.07 * len(kinds)))
    for row, kind in enumerate(kinds):
        style = EVENT_STYLES[kind]
        times = [e.time / unit.seconds for e in events if e.kind == kind]
        for t in times:
            ax.axvline(t, color=style.colour, linestyle=":", linewidth=1.1)
        ax.plot(
            times,
            [top * (1.04 + 0.07 * row)] * len(times),
            linestyle="none",
            marker=style.marker,
            markersize=6,
            color=style.colour,
            gid=f"event-{kind}",
        )
        handles.append(
            Line2D(
                [],
                [],
                color=style.colour,
                linestyle=":",
                marker=style.marker,
                label=f"{style.label} ({len(times)})",
            )
        )
    _legend_right(figure, handles)
    return figure


# --------------------------------------------------------- a run: pods, used vs given


@_styled
def pod_usage_figure(
    samples: Sequence[RuntimeSample], end_s: float, *, name_prefix: str = ""
) -> Figure:
    """Per pod, CPU (top) and memory (bottom) used (solid) against requested (dashed).

    Workers in shades of blue, PS in shades of orange; a pod's line has a gap where the pod
    did not exist (before it started, after it was replaced). ``name_prefix`` (the job's name
    and a dash, which every pod name repeats) is left out of the legend.
    """
    figure, (cpu_ax, mem_ax) = _time_chart(5.2, rows=2)
    figure.set_label("pods")
    end = max([end_s, *(s.time for s in samples)])
    unit = _time_axis(mem_ax, end)
    cpu_ax.set_ylabel("CPU (cores)")
    mem_ax.set_ylabel("memory (MiB)")
    mem_ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
    pods: dict[str, str] = {}
    for s in samples:
        for n in s.nodes:
            pods.setdefault(n.name, n.role)
    if not pods:
        _empty_note(cpu_ax, "no per-pod samples")
        return figure
    ordered = sorted(pods, key=lambda name: (pods[name] != "worker", name))
    handles: list[Line2D] = []
    shade_index = {"worker": 0, "ps": 0}
    for name in ordered:
        role = pods[name]
        shades = _POD_SHADES[role]
        colour = shades[shade_index[role] % len(shades)]
        shade_index[role] += 1
        times: list[float] = []
        values: dict[str, list[float]] = {k: [] for k in ("cpu", "cpu_req", "mem", "mem_req")}
        for s in samples:
            node = next((n for n in s.nodes if n.name == name), None)
            times.append(s.time / unit.seconds)
            # NaN while the pod did not exist: a gap, not a drop to zero
            values["cpu"].append(node.cpu_used if node else math.nan)
            values["cpu_req"].append(node.cpu_requested if node else math.nan)
            values["mem"].append(node.memory_used_mb if node else math.nan)
            values["mem_req"].append(node.memory_requested_mb if node else math.nan)
        for ax, used, given in ((cpu_ax, "cpu", "cpu_req"), (mem_ax, "mem", "mem_req")):
            xs, ys = _series(times, values[used])
            (line,) = ax.plot(
                xs,
                ys,
                color=colour,
                marker=".",
                markersize=3,
                gid=f"pod-{used}-{name}",
                label=name.removeprefix(name_prefix) or name,
            )
            xs, ys = _series(times, values[given])
            ax.plot(
                xs,
                ys,
                color=colour,
                linestyle="--",
                linewidth=1.1,
                drawstyle="steps-post",
                gid=f"pod-{given}-{name}",
            )
            if ax is cpu_ax:
                handles.append(line)
    for ax in (cpu_ax, mem_ax):
        ax.set_ylim(0.0, ax.get_ylim()[1] * 1.05)
    handles.append(Line2D([], [], color="#555555", label="used (solid)"))
    handles.append(Line2D([], [], color="#555555", linestyle="--", label="requested (dashed)"))
    _legend_right(figure, handles)
    return figure


# ------------------------------------------------------- a run: the fitted model


@_styled
def model_fit_figure(
    observations: Sequence[Observation], model: PerfModel, *, curve_through: Observation
) -> Figure:
    """The fitted resource-performance model against what the run measured.

    Left: predicted vs measured throughput, one point per configuration, with the line of
    perfect prediction and a ±10% band. Right: measured throughput against total CPU
    requested, the model's prediction at the same configurations, and the model's curve
    through ``curve_through``'s shape (its pod counts, CPU per pod scaled from 0.25x to 2x).
    """
    figure = new_figure(_WIDTH, 3.8)
    figure.set_label("model")
    parity, curve = figure.subplots(1, 2)
    measured = [o.throughput for o in observations]
    predicted = [model.throughput(o.config, o.batch_size) for o in observations]
    low = 0.0
    high = max([*measured, *predicted]) * 1.12
    parity.fill_between(
        [low, high],
        [low * 0.9, high * 0.9],
        [low * 1.1, high * 1.1],
        color="#dddddd",
        alpha=0.6,
        linewidth=0,
        label="±10%",
    )
    parity.plot(
        [low, high], [low, high], color="#777777", linewidth=1, label="prediction = measured"
    )
    parity.plot(
        measured,
        predicted,
        linestyle="none",
        marker="o",
        color=ROLE_COLOURS["worker"],
        gid="model-parity",
        label="configuration",
    )
    for o, x, y in zip(observations, measured, predicted, strict=True):
        c = o.config
        right = x > 0.6 * high  # labels of points on the right go left, inside the axes
        parity.annotate(
            _shape(c.workers, c.worker_cpu, c.ps, c.ps_cpu),
            xy=(x, y),
            xytext=(-5 if right else 5, -10),
            textcoords="offset points",
            ha="right" if right else "left",
            fontsize=7,
            color="#333333",
        )
    parity.set_xlim(low, high)
    parity.set_ylim(low, high)
    parity.set_aspect("equal", adjustable="box")
    for axis in (parity.xaxis, parity.yaxis):
        axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
        axis.set_major_locator(MaxNLocator(nbins=4))
    parity.set_xlabel("measured (samples/s)")
    parity.set_ylabel("predicted (samples/s)")
    parity.legend(loc="upper left")

    totals = [o.config.total_cpu for o in observations]
    curve.plot(
        totals,
        measured,
        linestyle="none",
        marker="o",
        color=ROLE_COLOURS["worker"],
        gid="model-measured",
        label="measured",
    )
    curve.plot(
        totals,
        predicted,
        linestyle="none",
        marker="x",
        color=ROLE_COLOURS["ps"],
        markersize=7,
        gid="model-predicted",
        label="model, same configuration",
    )
    base = curve_through.config
    factors = [0.25 + 0.05 * i for i in range(36)]
    curve_x = [base.total_cpu * f for f in factors]
    curve_y = [
        float(
            model.throughput_many(
                base.workers,
                base.ps,
                base.worker_cpu * f,
                base.ps_cpu * f,
                curve_through.batch_size,
            )
        )
        for f in factors
    ]
    curve.plot(
        curve_x,
        curve_y,
        color=ROLE_COLOURS["total"],
        linewidth=1.2,
        gid="model-curve",
        label=f"model at {base.workers}w + {base.ps}ps, CPU per pod scaled",
    )
    curve.set_xlabel("total CPU requested (cores)")
    curve.set_ylabel("throughput (samples/s)")
    curve.set_ylim(bottom=0.0)
    curve.set_xlim(left=0.0)
    curve.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
    curve.legend(loc="lower right")
    return figure


# ------------------------------------------------------------- a scenario's runs


@dataclass(frozen=True, slots=True)
class RunPoint:
    """One run of a scenario, as the scenario chart shows it."""

    label: str  #: x tick label (the start time, short)
    jct_s: float
    succeeded: bool
    #: total cores used / total cores requested over the run's samples; None: no samples
    cpu_utilisation: float | None
    start_cpu: float  #: total CPU requested by the first plan (cores)
    final_cpu: float  #: total CPU requested by the last plan (cores)
    start_shape: str
    final_shape: str


@_styled
def scenario_figure(runs: Sequence[RunPoint]) -> Figure:
    """JCT, CPU utilisation and CPU requested (start and final plan) per run, in time order."""
    figure = new_figure(_WIDTH, 7.4)
    figure.set_label("scenario")
    jct_ax, util_ax, cpu_ax = figure.subplots(3, 1, sharex=True)
    xs = list(range(1, len(runs) + 1))
    unit = time_unit(max((r.jct_s for r in runs), default=1.0))
    jcts = [r.jct_s / unit.seconds for r in runs]
    jct_ax.plot(xs, jcts, color=ROLE_COLOURS["total"], marker="o", gid="scenario-jct", label="JCT")
    failed = [(x, y) for x, y, r in zip(xs, jcts, runs, strict=True) if not r.succeeded]
    if failed:
        jct_ax.plot(
            [x for x, _ in failed],
            [y for _, y in failed],
            linestyle="none",
            marker="X",
            markersize=9,
            color=EVENT_STYLES["failure"].colour,
            gid="scenario-failed",
            label="failed run",
        )
        jct_ax.legend(loc="best")
    jct_ax.set_ylabel(f"JCT ({unit.label})")
    jct_ax.set_title("Job completion time", loc="left", fontsize=9.5)
    jct_ax.set_ylim(bottom=0.0, top=max(jcts, default=1.0) * 1.2 or 1.0)

    util = [math.nan if r.cpu_utilisation is None else r.cpu_utilisation * 100 for r in runs]
    util_ax.plot(xs, util, color=ROLE_COLOURS["worker"], marker="o", gid="scenario-utilisation")
    util_ax.set_ylabel("CPU used / requested (%)")
    util_ax.set_title("CPU utilisation: cores used / cores requested", loc="left", fontsize=9.5)
    finite = [u for u in util if not math.isnan(u)]
    util_ax.set_ylim(0.0, max(100.0, *finite) * 1.05 if finite else 100.0)

    start = [r.start_cpu for r in runs]
    final = [r.final_cpu for r in runs]
    cpu_ax.plot(
        xs,
        start,
        color=ROLE_COLOURS["ps"],
        marker="s",
        markersize=7,
        linestyle="--",
        gid="scenario-start-cpu",
        label="start plan",
    )
    cpu_ax.plot(
        xs,
        final,
        color=ROLE_COLOURS["total"],
        marker="o",
        markersize=5,
        gid="scenario-final-cpu",
        label="final plan",
    )
    for x, r in zip(xs, runs, strict=True):
        cpu_ax.annotate(
            r.final_shape,
            xy=(x, r.final_cpu),
            xytext=(0, 8),
            textcoords="offset points",
            ha="center",
            fontsize=7,
            color="#333333",
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0, "alpha": 0.85},
        )
        if r.start_shape != r.final_shape:
            cpu_ax.annotate(
                r.start_shape,
                xy=(x, r.start_cpu),
                xytext=(0, -18),
                textcoords="offset points",
                ha="center",
                fontsize=7,
                color=ROLE_COLOURS["ps"],
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0, "alpha": 0.85},
            )
    cpu_ax.set_ylabel("CPU requested (cores)")
    cpu_ax.set_title("Plan: CPU requested at the start and at the end", loc="left", fontsize=9.5)
    cpu_ax.set_ylim(0.0, max([*start, *final], default=1.0) * 1.35 or 1.0)
    cpu_ax.legend(loc="lower right")
    cpu_ax.set_xlabel("run (started at, UTC)")
    # at most about 15 labels: every k-th run's when there are more
    every = max(1, math.ceil(len(runs) / 15))
    cpu_ax.set_xticks(xs[::every], [r.label for r in runs][::every], rotation=30, ha="right")
    cpu_ax.set_xlim(0.5, len(runs) + 0.5)
    return figure


# -------------------------------------------------------------------------- objective frontier


@_styled
def frontier_figure(
    means: Mapping[str, Mapping[str, Mapping[str, float]]], *, title: str
) -> Figure:
    """Median JCT (min) against CPU utilisation (%), one panel per truth family.

    ``means``: family -> run label -> metrics (``median_jct_min``, ``cpu_utilization``). A
    label ``"dlrover-kfp OBJECTIVE FLOOR"`` is a point of that objective's curve (joined in
    order of floor, each point labelled with its floor); any other label is a peer, drawn as
    one marker.
    """
    families = list(means)
    figure = new_figure(_WIDTH, 3.6 * max(1, len(families)))
    figure.set_label("frontier")
    figure.suptitle(title)
    axes = figure.subplots(max(1, len(families)), 1, squeeze=False)[:, 0]
    peers = sorted({label for f in families for label in means[f] if " " not in label})
    colours = policy_colours([*peers, "dlrover-kfp"])
    objective_styles = {"cost": "-", "fastest": "--"}
    for ax, family in zip(axes, families, strict=False):
        runs = means[family]
        ax.set_title(family)
        ax.set_xlabel("CPU utilisation, used / allocated (%)")
        ax.set_ylabel("median JCT (min)")
        for label in peers:
            if label in runs:
                m = runs[label]
                ax.plot(
                    [100 * m["cpu_utilization"]],
                    [m["median_jct_min"]],
                    marker="o",
                    linestyle="none",
                    color=colours[label],
                    label=label,
                    gid=f"frontier-{family}-{label}",
                )
        curves: dict[str, list[tuple[float, float, float]]] = {}
        for label, m in runs.items():
            parts = label.split(" ")
            if len(parts) == 3:
                curves.setdefault(parts[1], []).append(
                    (float(parts[2]), 100 * m["cpu_utilization"], m["median_jct_min"])
                )
        for objective, points in sorted(curves.items()):
            points.sort(reverse=True)
            ax.plot(
                [p[1] for p in points],
                [p[2] for p in points],
                linestyle=objective_styles.get(objective, ":"),
                marker="s",
                color=colours["dlrover-kfp"],
                label=f"dlrover-kfp, {objective} (floor)",
                gid=f"frontier-{family}-{objective}",
            )
            for floor, x, y in points:
                ax.annotate(f"{floor:g}", (x, y), textcoords="offset points", xytext=(4, 4))
        ax.set_ylim(bottom=0)
        ax.legend(loc="upper right")
    return figure


def frontier_svg(means: Mapping[str, Mapping[str, Mapping[str, float]]], *, title: str) -> str:
    """:func:`frontier_figure` as an SVG document."""
    return render_svg(frontier_figure(means, title=title), "frontier")
