"""The plotting module's rules for a run's time series, and what it renders to."""

from __future__ import annotations

import math

import pytest

from dlrover_kfp.report.plots import (
    EVENT_STYLES,
    MAX_POINTS,
    ROLE_COLOURS,
    bin_means,
    break_gaps,
    plan_timeline_figure,
    pod_usage_figure,
    render_png,
    render_svg,
    throughput_figure,
    time_unit,
)
from tests.report.builders import elastic_profile


def test_long_series_are_averaged_into_bins() -> None:
    xs = [float(i) for i in range(800)]
    ys = [float(i % 2) for i in range(800)]  # bins of 2 points: every mean is 0.5
    assert bin_means(xs[:10], ys[:10]) == (xs[:10], ys[:10])
    bx, by = bin_means(xs, ys)
    assert len(bx) <= MAX_POINTS
    assert by == pytest.approx([0.5] * len(by))
    assert bx[:2] == [0.5, 2.5]
    # a bin of gaps stays a gap; a gap inside a bin is left out of its mean
    _, gapped = bin_means(xs, [math.nan] * 3 + [1.0] * 797)
    assert math.isnan(gapped[0]) and gapped[1] == 1.0


def test_a_stretch_without_samples_breaks_the_line() -> None:
    xs, ys = break_gaps([0.0, 2.0, 4.0, 6.0, 30.0, 32.0], [1.0] * 6)
    assert len(xs) == 7
    assert math.isnan(ys[4]) and xs[4] == 6.0  # on the last point before the gap
    assert break_gaps([0.0, 2.0, 4.0], [1.0, 2.0, 3.0]) == ([0.0, 2.0, 4.0], [1.0, 2.0, 3.0])


def test_time_unit() -> None:
    assert time_unit(1800).label == "s"
    assert time_unit(1801).label == "min"
    assert time_unit(40_000) == type(time_unit(1))(3600.0, "h")


def test_run_charts_share_their_time_axis_and_colours() -> None:
    profile = elastic_profile()
    figures = [
        plan_timeline_figure(profile.plans, 190.0),
        throughput_figure(profile.samples, profile.events, 190.0),
        pod_usage_figure(profile.samples, 190.0),
    ]
    for figure in figures:
        for ax in figure.axes:
            assert ax.get_xlim() == (0.0, 190.0)
            assert ax.get_position().x0 == pytest.approx(figures[0].axes[0].get_position().x0)
            assert ax.get_position().x1 == pytest.approx(figures[0].axes[0].get_position().x1)
    plan_lines = {line.get_gid(): line for line in figures[0].axes[0].get_lines()}
    assert plan_lines["plan-worker"].get_color() == ROLE_COLOURS["worker"]
    assert plan_lines["plan-ps"].get_color() == ROLE_COLOURS["ps"]
    # the total steps 2 -> 3 -> 4 cores at 0, 60 and 120 s and holds to the end
    total = plan_lines["plan-total"]
    assert list(total.get_xdata()) == [0.0, 60.0, 120.0, 190.0]
    assert list(total.get_ydata()) == [2.0, 3.0, 4.0, 4.0]
    events = {line.get_gid(): line for line in figures[1].axes[0].get_lines()}
    assert events["event-oom"].get_color() == EVENT_STYLES["oom"].colour
    assert list(events["event-relaunch"].get_xdata()) == [151.0]


def test_renders_svg_text_and_png_bytes() -> None:
    figure = plan_timeline_figure(elastic_profile().plans, 190.0)
    svg = render_svg(figure, "t")
    assert svg.lstrip().startswith("<?xml") and "<text" in svg and "CPU requested (cores)" in svg
    assert "Date" not in svg and "matplotlib.org" not in svg
    png = render_png(figure)
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
