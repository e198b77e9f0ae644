"""The look every chart shares, and how a figure is made and rendered.

The colours that mean one thing in every chart (a policy, a role, a pod of a role, an event
kind), the rc settings that apply only while a figure is built or rendered (:func:`_styled`,
:func:`_style`), figures made without pyplot (:func:`new_figure`, :func:`_time_chart`), their
legends, and their SVG and PNG forms.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec

import matplotlib
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

if TYPE_CHECKING:  # matplotlib >= 3.9 names its rc keys; the code runs on 3.8 too
    from matplotlib.typing import RcKeyType

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
