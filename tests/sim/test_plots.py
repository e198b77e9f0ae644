"""The simulator's charts: one line per policy, the right shape, the documented rules, small files.

The charts are matplotlib figures (dlrover_kfp.report.plots); the tests read the data of the
lines they draw and their axes, then check that the SVG they are written as holds the text.
"""

from __future__ import annotations

import math
import random
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from dlrover_kfp.report.plots import (
    POLICY_COLOURS,
    jct_cdf_figure,
    jct_cdf_svg,
    log_ticks,
    policy_colours,
    utilisation_figure,
    utilisation_svg,
    window_means,
)
from dlrover_kfp.sim.cluster.plots import JCT_CDF_FILE, UTILISATION_FILE, write_plots

NS = "{http://www.w3.org/2000/svg}"
POLICIES = ["manual", "optimus", "dlrover-oss", "dlrover-kfp"]


def _lines(ax: Axes, prefix: str) -> list[Line2D]:
    return [line for line in ax.get_lines() if (line.get_gid() or "").startswith(prefix)]


def _xy(line: Line2D) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(line.get_xdata(), dtype=float), np.asarray(line.get_ydata(), dtype=float)


def _legend(figure: Figure) -> list[str]:
    (legend,) = figure.legends
    return [t.get_text() for t in legend.get_texts()]


def _tick_labels(figure: Figure, ax: Axes, axis: str) -> list[str]:
    figure.canvas.draw()  # tick labels are set when drawn
    labels = ax.get_xticklabels() if axis == "x" else ax.get_yticklabels()
    return [t.get_text() for t in labels]


def _svg_texts(svg: str) -> list[str]:
    root = ET.fromstring(svg)
    assert root.tag == f"{NS}svg"
    return ["".join(t.itertext()) for t in root.iter(f"{NS}text")]


def _jcts(seed: int, n: int, mu: float) -> list[float]:
    rng = random.Random(seed)
    return sorted(rng.lognormvariate(mu, 1.0) for _ in range(n))


def test_cdf_has_a_step_line_per_policy_ending_at_one() -> None:
    jct = {
        "manual": _jcts(0, 300, 3.5),
        "dlrover-kfp": _jcts(1, 300, 3.0),
        "custom": [5.0, 5.0, 5.0, 7.0],  # ties collapse into one step
    }
    figure = jct_cdf_figure(jct, title="JCT <seed 0> & more")
    (ax,) = figure.axes
    left = ax.get_xlim()[0]
    lines = _lines(ax, "cdf-")
    assert [line.get_gid() for line in lines] == [f"cdf-{name}" for name in jct]
    for line, name in zip(lines, jct, strict=True):
        xs, ys = _xy(line)
        assert np.all(np.diff(xs) >= 0), "x must not go back"
        assert np.all(np.diff(ys) >= 0), "the CDF never goes down"
        assert (xs[0], ys[0]) == (left, 0.0)
        assert ys[-1] == pytest.approx(1.0)
        assert xs[-1] == pytest.approx(max(jct[name]))
        # one step of 1/n per job
        assert len(set(ys.tolist())) == len(set(jct[name])) + 1
    # ties: 5.0 three times then 7.0 -> steps at 3/4 and 1
    xs, ys = _xy(lines[2])
    assert sorted(set(ys.tolist())) == pytest.approx([0.0, 0.75, 1.0])
    assert xs[ys.tolist().index(0.75)] == 5.0
    legend = _legend(figure)
    assert [entry.split("\n")[0] for entry in legend] == list(jct)
    notes = [entry.split("\n")[1] for entry in legend]
    assert all(n.startswith("median ") and n.endswith(" min") for n in notes)
    assert notes[2] == "median 5.0 min"
    # the known policies keep their colours
    assert lines[0].get_color() == POLICY_COLOURS["manual"]
    assert lines[1].get_color() == POLICY_COLOURS["dlrover-kfp"]
    # the SVG holds the title (escaped in the file, intact once parsed) and the axis' unit
    texts = _svg_texts(jct_cdf_svg(jct, title="JCT <seed 0> & more"))
    assert "JCT <seed 0> & more" in texts
    assert "JCT (min, log scale)" in texts
    assert "median 5.0 min" in texts


def test_cdf_log_axis_ticks_cover_the_data() -> None:
    figure = jct_cdf_figure({"manual": [2.0, 40.0, 700.0]}, title="t")
    (ax,) = figure.axes
    assert ax.get_xscale() == "log"
    assert _tick_labels(figure, ax, "x") == ["1", "3", "10", "30", "100", "300", "1000"]
    assert _tick_labels(figure, ax, "y") == ["0.0", "0.2", "0.4", "0.6", "0.8", "1.0"]
    assert ax.get_xlim() == pytest.approx((1.0, 1000.0))
    # the tick positions are evenly spaced per decade
    xs = [ax.transData.transform((tick, 0))[0] for tick in ax.get_xticks()]
    assert xs[2] - xs[0] == pytest.approx(xs[4] - xs[2], abs=0.2)


def test_log_ticks() -> None:
    assert log_ticks(1.0, 1000.0) == [1, 3, 10, 30, 100, 300, 1000]
    assert log_ticks(2.0, 2.5) == [1, 3]
    assert log_ticks(3.0, 3.0) == [3, 10]
    assert log_ticks(0.5, 2.0) == pytest.approx([0.3, 1, 3])
    with pytest.raises(ValueError):
        log_ticks(0.0, 1.0)


def test_cdf_with_a_policy_without_completed_jobs() -> None:
    jct = {"manual": [10.0, 20.0], "optimus": [], "dlrover-kfp": [math.nan, 0.0]}
    figure = jct_cdf_figure(jct, title="t")
    (ax,) = figure.axes
    lines = _lines(ax, "cdf-")
    assert [line.get_gid() for line in lines] == ["cdf-manual", "cdf-dlrover-kfp"]
    legend = _legend(figure)
    assert [entry.split("\n")[0] for entry in legend] == list(jct)
    assert legend[1] == "optimus\nno completed jobs"
    # a zero JCT sits at the axis' left edge and still reaches 1
    xs, ys = _xy(lines[1])
    assert (xs[-1], ys[-1]) == (ax.get_xlim()[0], 1.0)


def test_cdf_with_nothing_at_all() -> None:
    figure = jct_cdf_figure({"manual": [], "optimus": []}, title="t")
    (ax,) = figure.axes
    assert _lines(ax, "cdf-") == []
    assert _legend(figure) == ["manual\nno completed jobs", "optimus\nno completed jobs"]
    assert _tick_labels(figure, ax, "x") == ["1", "3", "10"]
    assert "t" in _svg_texts(jct_cdf_svg({}, title="t"))


def test_window_means_average_hours_and_skip_idle_steps() -> None:
    step = 120 / 3600
    points = [(i * step, 0.5 if i < 30 else 0.0) for i in range(60)]  # hour 0 busy, 1 idle
    points += [(2 + i * step, 0.2 + 0.2 * (i % 2)) for i in range(30)]  # hour 2: mean 0.3
    segments = window_means(points)
    assert len(segments) == 2  # the idle hour is a gap
    ((h0, v0),), ((h2, v2),) = segments
    assert v0 == pytest.approx(0.5) and v2 == pytest.approx(0.3)
    assert h0 == pytest.approx(29 * step / 2) and 2 < h2 < 3
    assert window_means([(0.1, 0.0), (0.2, math.nan)]) == []
    with pytest.raises(ValueError):
        window_means(points, 0)


def _utilisation(n: int, seed: int) -> list[tuple[float, float, float]]:
    rng = random.Random(seed)
    return [
        (i * 120 / 3600, 0.0 if i % 97 == 0 else rng.random(), 0.0 if i < 30 else rng.random())
        for i in range(n)
    ]


def test_utilisation_has_two_panels_with_a_line_per_policy() -> None:
    series = {name: _utilisation(600, seed) for seed, name in enumerate(POLICIES)}
    figure = utilisation_figure(series, title="Utilisation & co")
    cpu_ax, memory_ax = figure.axes
    for ax, panel in ((cpu_ax, "cpu"), (memory_ax, "memory")):
        lines = [line for line in _lines(ax, f"{panel}-") if "dots" not in line.get_gid()]
        assert [line.get_gid() for line in lines] == [f"{panel}-{name}" for name in POLICIES]
        (x_low, x_high), (y_low, y_high) = ax.get_xlim(), ax.get_ylim()
        for line in lines:
            xs, ys = _xy(line)
            drawn = ~np.isnan(xs)
            assert np.all(np.diff(xs[drawn]) > 0)
            assert np.all((x_low <= xs[drawn]) & (xs[drawn] <= x_high))
            assert np.all((y_low <= ys[drawn]) & (ys[drawn] <= y_high))
            # 600 steps of 120 s are 20 hours: one point per 1-hour window at most
            assert drawn.sum() <= 20
        assert (y_low, y_high) == (0.0, 1.0)
        labels = _tick_labels(figure, ax, "y")
        assert labels[0] == "0%" and labels[-1] == "100%"
    assert cpu_ax.get_ylabel() == "CPU used / allocated (%)"
    assert memory_ax.get_xlabel() == "simulated time (h); 1-hour means, idle steps left out"
    assert _legend(figure) == POLICIES
    # the memory series is 0.0 (no data) for its first hour: that window is not drawn
    xs, _ = _xy(_lines(memory_ax, "memory-manual")[0])
    assert np.nanmin(xs) >= 1.0
    texts = _svg_texts(utilisation_svg(series, title="Utilisation & co"))
    assert "Utilisation & co" in texts and "100%" in texts and "CPU used / allocated (%)" in texts


def test_utilisation_window_without_data_breaks_the_line() -> None:
    points = [(h / 10, 0.5, 0.5) for h in range(0, 20)]  # hours 0 and 1
    points += [(h / 10, 0.0, 0.5) for h in range(20, 30)]  # hour 2: CPU idle (no data)
    points += [(h / 10, 0.7, 0.5) for h in range(30, 40)]  # hour 3
    cpu_ax, memory_ax = utilisation_figure({"manual": points}, title="t").axes
    xs, ys = _xy(_lines(cpu_ax, "cpu-manual")[0])
    assert np.isnan(ys).sum() == 1  # one gap, where hour 2 would be
    assert ys[~np.isnan(ys)] == pytest.approx([0.5, 0.5, 0.7])
    gap = int(np.flatnonzero(np.isnan(ys))[0])
    assert xs[gap - 1] < 2 and xs[gap + 1] >= 3
    # hour 3 is alone after the gap: it is also drawn as a dot
    (dots,) = _lines(cpu_ax, "cpu-manual-dots")
    assert _xy(dots)[1] == pytest.approx([0.7])
    _, memory = _xy(_lines(memory_ax, "memory-manual")[0])
    assert not np.isnan(memory).any()


def test_utilisation_output_stays_small_for_long_runs() -> None:
    series = {name: _utilisation(10_000, seed) for seed, name in enumerate(POLICIES)}
    text = utilisation_svg(series, title="t")
    assert len(text.encode()) < 300_000
    root = ET.fromstring(text)
    ids = {g.get("id") for g in root.iter(f"{NS}g")}
    assert {f"{panel}-{name}" for panel in ("cpu", "memory") for name in POLICIES} <= ids


def test_utilisation_window_widens_for_runs_longer_than_the_window_limit() -> None:
    hours = 5000  # > MAX_WINDOWS (2000): 3-hour windows
    series = {"manual": [(float(h), 0.5, 0.5) for h in range(hours)]}
    figure = utilisation_figure(series, title="t")
    xs, _ = _xy(_lines(figure.axes[0], "cpu-manual")[0])
    assert len(xs) == math.ceil(hours / 3)
    assert figure.axes[1].get_xlabel().startswith("simulated time (h); 3-hour means")


def test_utilisation_with_a_policy_without_data() -> None:
    series = {"manual": _utilisation(100, 0), "optimus": [], "dlrover-kfp": [(0.0, 0.0, 0.0)]}
    figure = utilisation_figure(series, title="t")
    gids = {line.get_gid() for ax in figure.axes for line in ax.get_lines()}
    assert {gid.split("-", 1)[1] for gid in gids if gid} == {"manual"}
    assert _legend(figure) == [
        "manual",
        "optimus\nno utilisation data",
        "dlrover-kfp\nno utilisation data",
    ]
    assert "empty" in _svg_texts(utilisation_svg({}, title="empty"))


def test_utilisation_axis_grows_above_full() -> None:
    figure = utilisation_figure({"manual": [(0.5, 1.3, 0.5)]}, title="t")
    cpu_ax = figure.axes[0]
    assert cpu_ax.get_ylim() == pytest.approx((0.0, 1.4))
    assert _tick_labels(figure, cpu_ax, "y")[-1] == "140%"
    (dot,) = _lines(cpu_ax, "cpu-manual-dots")  # a lone window is a dot
    assert _xy(dot)[1] == pytest.approx([1.3])
    assert dot.get_marker() == "o"


def test_colours_fixed_for_known_policies_and_distinct_for_others() -> None:
    colours = policy_colours(["a", "dlrover-kfp", "b", "manual"])
    assert colours["dlrover-kfp"] == POLICY_COLOURS["dlrover-kfp"]
    assert len(set(colours.values())) == 4


def test_write_plots(tmp_path: Path) -> None:
    paths = write_plots(
        tmp_path / "plots",
        {"manual": [1.0, 2.0], "dlrover-kfp": []},
        {"manual": _utilisation(50, 0), "dlrover-kfp": []},
        label="seed 3",
    )
    assert [p.name for p in paths] == [JCT_CDF_FILE, UTILISATION_FILE]
    titles = []
    for path in paths:
        texts = _svg_texts(path.read_text())
        titles += [t for t in texts if t.endswith("(seed 3)")]
        assert "http" not in "".join(texts)
    assert titles == ["Job completion time CDF (seed 3)", "Cluster utilisation (seed 3)"]
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(
        [JCT_CDF_FILE, UTILISATION_FILE]
    )
