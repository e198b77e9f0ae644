"""The simulator's two charts, as SVG written by hand (no plotting dependency for two charts).

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
    of the window averages, and a window with no data leaves a gap in the line.
  - The y axis runs 0-100 %; it grows in steps of 20 % only if a window's mean exceeds 100 %.

:func:`write_plots` writes both files atomically into a directory.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from dlrover_kfp.files import write_atomic

JCT_CDF_FILE = "jct_cdf.svg"
UTILISATION_FILE = "utilisation.svg"

#: The smoothing window of the utilisation chart, in simulated hours.
WINDOW_HOURS = 1.0
#: The most windows drawn per policy and panel; longer runs get wider (whole-hour) windows.
MAX_WINDOWS = 2000

#: A fixed colour per known policy, so that the same policy looks the same in every chart.
POLICY_COLOURS: Mapping[str, str] = {
    "manual": "#7f7f7f",
    "optimus": "#1f77b4",
    "dlrover-oss": "#ff7f0e",
    "dlrover-kfp": "#2ca02c",
}
#: Colours for other policies, in order of appearance (none is a known policy's colour).
PALETTE: tuple[str, ...] = ("#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")

_SVG_NS = "http://www.w3.org/2000/svg"
_FONT_SIZE = 12
_LEGEND_WIDTH = 190
_NO_JOBS = "no completed jobs"
_NO_DATA = "no utilisation data"


@dataclass(frozen=True, slots=True)
class _Area:
    """A plot area in pixels."""

    left: float
    top: float
    width: float
    height: float

    @property
    def right(self) -> float:
        return self.left + self.width

    @property
    def bottom(self) -> float:
        return self.top + self.height


def policy_colours(names: Iterable[str]) -> dict[str, str]:
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


def jct_cdf_svg(jct_minutes: Mapping[str, Sequence[float]], *, title: str) -> str:
    """The empirical CDF of JCT (minutes) per policy as an SVG document.

    Each line steps up by 1/n at every completed job's JCT and ends at y = 1 at the largest.
    Values that are not finite are ignored; values below the axis (including 0) are drawn at
    its left edge. The legend gives each policy's median JCT, or "no completed jobs".
    """
    names = list(jct_minutes)
    colours = policy_colours(names)
    values = {
        name: sorted(v for v in jct_minutes[name] if math.isfinite(v) and v >= 0) for name in names
    }
    positive = [v for vs in values.values() for v in vs if v > 0]
    ticks = log_ticks(min(positive), max(positive)) if positive else log_ticks(1.0, 10.0)
    log_low, log_high = math.log10(ticks[0]), math.log10(ticks[-1])

    width, height = 760, 440
    area = _Area(left=64, top=44, width=width - 64 - _LEGEND_WIDTH - 24, height=height - 44 - 56)

    def x_px(value: float) -> float:
        logged = math.log10(max(value, ticks[0]))
        return area.left + (logged - log_low) / (log_high - log_low) * area.width

    def y_px(fraction: float) -> float:
        return area.top + (1.0 - fraction) * area.height

    out = _open(width, height, title)
    out += _frame(area)
    for tick in ticks:
        x = x_px(tick)
        out.append(_vline(x, area))
        out.append(_text(x, area.bottom + 16, _tick_label(tick), anchor="middle", cls="x-tick"))
    for i in range(6):
        fraction = i / 5
        y = y_px(fraction)
        out.append(_hline(y, area))
        out.append(_text(area.left - 6, y + 4, f"{fraction:.1f}", anchor="end", cls="y-tick"))
    out.append(
        _text(area.left + area.width / 2, height - 14, "JCT (minutes, log scale)", anchor="middle")
    )
    out.append(_y_label(area, "fraction of completed jobs with JCT ≤ x"))

    legend: list[tuple[str, str]] = []
    for name in names:
        vs = values[name]
        if not vs:
            legend.append((name, _NO_JOBS))
            continue
        legend.append((name, f"median {_minutes(statistics.median(vs))} min"))
        points = [(area.left, y_px(0.0))]
        done = 0
        for value, group in itertools.groupby(vs):
            before = done
            done += sum(1 for _ in group)
            x = x_px(value)
            points += [(x, y_px(before / len(vs))), (x, y_px(done / len(vs)))]
        out.append(_series(name, colours[name], [points], cls="cdf"))
    out += _legend(area.right + 24, area.top, legend, colours)
    return _close(out)


# -------------------------------------------------------------------------- utilisation


def window_means(
    points: Iterable[tuple[float, float]], window_hours: float = WINDOW_HOURS
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


def utilisation_svg(
    series: Mapping[str, Sequence[tuple[float, float, float]]], *, title: str
) -> str:
    """CPU (top) and memory (bottom) utilisation per policy over simulated hours, as SVG.

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
        "cpu": {n: window_means(((p[0], p[1]) for p in series[n]), window) for n in names},
        "memory": {n: window_means(((p[0], p[2]) for p in series[n]), window) for n in names},
    }
    peak = max(
        (v for by in panels.values() for s in by.values() for g in s for _, v in g), default=1
    )
    y_high = max(1.0, math.ceil(round(peak / 0.2, 9)) * 0.2)

    width, height, panel_height = 760, 540, 190
    plot_width = width - 64 - _LEGEND_WIDTH - 24
    areas = {
        "cpu": _Area(left=64, top=44, width=plot_width, height=panel_height),
        "memory": _Area(left=64, top=44 + panel_height + 56, width=plot_width, height=panel_height),
    }
    labels = {"cpu": "CPU used / allocated", "memory": "memory used / allocated"}
    step = _nice_step(x_high - x_low)
    x_ticks = [
        k * step for k in range(math.ceil(x_low / step), math.floor(x_high / step + 1e-9) + 1)
    ]

    out = _open(width, height, title)
    for panel, area in areas.items():

        def x_px(hour: float, area: _Area = area) -> float:
            return area.left + (hour - x_low) / (x_high - x_low) * area.width

        def y_px(value: float, area: _Area = area) -> float:
            return area.top + (1.0 - value / y_high) * area.height

        out += _frame(area, cls=f"plot-area {panel}")
        for tick in x_ticks:
            out.append(_vline(x_px(tick), area))
            out.append(_text(x_px(tick), area.bottom + 16, f"{tick:g}", anchor="middle"))
        for i in range(round(y_high / 0.2) + 1):
            value = i * 0.2
            out.append(_hline(y_px(value), area))
            out.append(_text(area.left - 6, y_px(value) + 4, f"{value:.0%}", anchor="end"))
        out.append(_y_label(area, labels[panel]))
        for name in names:
            segments = [[(x_px(h), y_px(v)) for h, v in seg] for seg in panels[panel][name]]
            if segments:
                out.append(_series(name, colours[name], segments, cls=panel))
    smoothing = f"{window:g}-hour means" if window != 1 else "1-hour means"
    bottom = areas["memory"].bottom
    out.append(
        _text(
            areas["memory"].left + plot_width / 2,
            bottom + 36,
            f"simulated time (hours); {smoothing}, idle steps left out",
            anchor="middle",
        )
    )
    legend = [(name, "" if any(panels[p][name] for p in panels) else _NO_DATA) for name in names]
    out += _legend(areas["cpu"].right + 24, areas["cpu"].top, legend, colours)
    return _close(out)


# --------------------------------------------------------------------------- the files


def write_plots(
    directory: Path,
    jct_minutes: Mapping[str, Sequence[float]],
    utilisation: Mapping[str, Sequence[tuple[float, float, float]]],
    *,
    label: str = "",
) -> list[Path]:
    """Write ``jct_cdf.svg`` and ``utilisation.svg`` into ``directory`` (atomically each).

    ``label`` (e.g. "seed 0") is appended to both titles. Returns the two paths.
    """
    suffix = f" ({label})" if label else ""
    jct_path = directory / JCT_CDF_FILE
    util_path = directory / UTILISATION_FILE
    write_atomic(jct_path, jct_cdf_svg(jct_minutes, title=f"Job completion time CDF{suffix}"))
    write_atomic(util_path, utilisation_svg(utilisation, title=f"Cluster utilisation{suffix}"))
    return [jct_path, util_path]


# ------------------------------------------------------------------------- SVG helpers


def _open(width: int, height: int, title: str) -> list[str]:
    return [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="{_SVG_NS}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="{_FONT_SIZE}">',
        f"<title>{escape(title)}</title>",
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        _text(width / 2, 24, title, anchor="middle", size=15, cls="title"),
    ]


def _close(parts: list[str]) -> str:
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _num(value: float) -> str:
    text = f"{value + 0.0:.1f}"
    return text[:-2] if text.endswith(".0") else text


def _text(
    x: float,
    y: float,
    text: str,
    *,
    anchor: str = "start",
    size: int | None = None,
    cls: str | None = None,
    fill: str | None = None,
    transform: str | None = None,
) -> str:
    attributes = [f'x="{_num(x)}"', f'y="{_num(y)}"']
    if anchor != "start":
        attributes.append(f'text-anchor="{anchor}"')
    if size is not None:
        attributes.append(f'font-size="{size}"')
    if cls is not None:
        attributes.append(f"class={quoteattr(cls)}")
    if fill is not None:
        attributes.append(f'fill="{fill}"')
    if transform is not None:
        attributes.append(f'transform="{transform}"')
    return f"<text {' '.join(attributes)}>{escape(text)}</text>"


def _frame(area: _Area, cls: str = "plot-area") -> list[str]:
    return [
        f'<rect class={quoteattr(cls)} x="{_num(area.left)}" y="{_num(area.top)}" '
        f'width="{_num(area.width)}" height="{_num(area.height)}" fill="none" stroke="#333333"/>'
    ]


def _vline(x: float, area: _Area) -> str:
    return (
        f'<line x1="{_num(x)}" y1="{_num(area.top)}" x2="{_num(x)}" y2="{_num(area.bottom)}" '
        'stroke="#dddddd"/>'
    )


def _hline(y: float, area: _Area) -> str:
    return (
        f'<line x1="{_num(area.left)}" y1="{_num(y)}" x2="{_num(area.right)}" y2="{_num(y)}" '
        'stroke="#dddddd"/>'
    )


def _y_label(area: _Area, text: str) -> str:
    x, y = area.left - 44, area.top + area.height / 2
    return _text(x, y, text, anchor="middle", transform=f"rotate(-90 {_num(x)} {_num(y)})")


def _series(
    name: str, colour: str, segments: Sequence[Sequence[tuple[float, float]]], *, cls: str
) -> str:
    """One policy's line: a ``<path>`` of M/L commands, a new M for each segment."""
    parts = []
    for segment in segments:
        points = _simplify([(round(x, 1), round(y, 1)) for x, y in segment])
        if len(points) == 1:  # an isolated window: a zero-length line, a dot with round caps
            points.append(points[0])
        if points:
            parts.append("M" + "L".join(f"{_num(x)},{_num(y)}" for x, y in points))
    return (
        f"<path class={quoteattr('series ' + cls)} data-policy={quoteattr(name)} "
        f'd="{"".join(parts)}" fill="none" stroke="{colour}" stroke-width="1.8" '
        'stroke-linejoin="round" stroke-linecap="round"/>'
    )


def _simplify(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Drop repeated points and the middle of three on one horizontal or vertical line."""
    kept: list[tuple[float, float]] = []
    for point in points:
        if kept and kept[-1] == point:
            continue
        if len(kept) >= 2:
            (ax, ay), (bx, by) = kept[-2], kept[-1]
            if (ax == bx == point[0] and (ay - by) * (by - point[1]) >= 0) or (
                ay == by == point[1] and (ax - bx) * (bx - point[0]) >= 0
            ):
                kept[-1] = point
                continue
        kept.append(point)
    return kept


def _legend(
    x: float, y: float, entries: Sequence[tuple[str, str]], colours: Mapping[str, str]
) -> list[str]:
    out = ['<g class="legend">']
    for name, note in entries:
        out.append(
            f'<line x1="{_num(x)}" y1="{_num(y + 8)}" x2="{_num(x + 22)}" y2="{_num(y + 8)}" '
            f'stroke="{colours[name]}" stroke-width="3"/>'
        )
        out.append(_text(x + 28, y + 12, name, cls="legend-name"))
        if note:
            out.append(_text(x + 28, y + 27, note, size=11, cls="legend-note", fill="#555555"))
        y += 38 if note else 24
    out.append("</g>")
    return out


def _tick_label(value: float) -> str:
    return str(round(value)) if value >= 1 else f"{value:g}"


def _minutes(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    if value >= 1:
        return f"{value:.1f}"
    return f"{value:.2g}"


def _nice_step(span: float, target: int = 8) -> float:
    """A 1-2-5 step giving about ``target`` ticks over ``span``."""
    raw = span / target
    magnitude = 10.0 ** math.floor(math.log10(raw))
    for multiple in (1.0, 2.0, 5.0):
        if multiple * magnitude >= raw:
            return multiple * magnitude
    return 10.0 * magnitude
