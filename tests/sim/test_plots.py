"""The simulator's SVG charts: well-formed, one line per policy, the right shape, small files."""

from __future__ import annotations

import math
import random
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from dlrover_kfp.sim.cluster.plots import (
    JCT_CDF_FILE,
    POLICY_COLOURS,
    UTILISATION_FILE,
    jct_cdf_svg,
    log_ticks,
    policy_colours,
    utilisation_svg,
    window_means,
    write_plots,
)

NS = "{http://www.w3.org/2000/svg}"
POLICIES = ["manual", "optimus", "dlrover-oss", "dlrover-kfp"]


def _series_paths(root: ET.Element) -> list[ET.Element]:
    return [p for p in root.iter(f"{NS}path") if "series" in p.get("class", "").split()]


def _points(path: ET.Element) -> list[list[tuple[float, float]]]:
    """The path's segments (one per M command) as lists of points."""
    d = path.get("d", "")
    assert re.fullmatch(r"(?:[ML]-?[\d.]+,-?[\d.]+)+", d), d
    segments: list[list[tuple[float, float]]] = []
    for command, x, y in re.findall(r"([ML])(-?[\d.]+),(-?[\d.]+)", d):
        if command == "M":
            segments.append([])
        segments[-1].append((float(x), float(y)))
    return segments


def _plot_area(root: ET.Element, cls: str = "plot-area") -> tuple[float, float, float, float]:
    rect = next(r for r in root.iter(f"{NS}rect") if r.get("class") == cls)
    x, y = float(rect.get("x", "")), float(rect.get("y", ""))
    return x, y, x + float(rect.get("width", "")), y + float(rect.get("height", ""))


def _texts(root: ET.Element, cls: str | None = None) -> list[str]:
    return [t.text or "" for t in root.iter(f"{NS}text") if cls is None or t.get("class") == cls]


def _jcts(seed: int, n: int, mu: float) -> list[float]:
    rng = random.Random(seed)
    return sorted(rng.lognormvariate(mu, 1.0) for _ in range(n))


def test_cdf_has_a_step_line_per_policy_ending_at_one() -> None:
    jct = {
        "manual": _jcts(0, 300, 3.5),
        "dlrover-kfp": _jcts(1, 300, 3.0),
        "custom": [5.0, 5.0, 5.0, 7.0],  # ties collapse into one step
    }
    root = ET.fromstring(jct_cdf_svg(jct, title="JCT <seed 0> & more"))
    assert _texts(root, "title") == ["JCT <seed 0> & more"]
    left, top, right, bottom = _plot_area(root)
    paths = _series_paths(root)
    assert [p.get("data-policy") for p in paths] == list(jct)
    for path in paths:
        (points,) = _points(path)  # one unbroken line
        xs = [x for x, _ in points]
        ys = [y for _, y in points]
        assert xs == sorted(xs), "x must not go back"
        assert ys == sorted(ys, reverse=True), "the CDF never goes down (SVG y grows downwards)"
        assert points[0] == (left, bottom)
        assert ys[-1] == pytest.approx(top)
        assert all(left <= x <= right for x in xs)
    # ties: 5.0 three times then 7.0 -> steps at 3/4 and 1
    (custom,) = _points(paths[2])
    height = bottom - top
    assert sorted({y for _, y in custom}) == pytest.approx([top, bottom - 0.75 * height, bottom])
    names = _texts(root, "legend-name")
    assert names == list(jct)
    notes = _texts(root, "legend-note")
    assert all(n.startswith("median ") and n.endswith(" min") for n in notes)
    assert notes[2] == "median 5.0 min"
    # the known policies keep their colours
    assert paths[0].get("stroke") == POLICY_COLOURS["manual"]
    assert paths[1].get("stroke") == POLICY_COLOURS["dlrover-kfp"]


def test_cdf_log_axis_ticks_cover_the_data() -> None:
    root = ET.fromstring(jct_cdf_svg({"manual": [2.0, 40.0, 700.0]}, title="t"))
    assert _texts(root, "x-tick") == ["1", "3", "10", "30", "100", "300", "1000"]
    assert _texts(root, "y-tick") == ["0.0", "0.2", "0.4", "0.6", "0.8", "1.0"]
    # the tick positions are evenly spaced per decade
    xs = [float(t.get("x", "")) for t in root.iter(f"{NS}text") if t.get("class") == "x-tick"]
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
    root = ET.fromstring(jct_cdf_svg(jct, title="t"))
    assert [p.get("data-policy") for p in _series_paths(root)] == ["manual", "dlrover-kfp"]
    assert _texts(root, "legend-name") == list(jct)
    assert "no completed jobs" in _texts(root, "legend-note")
    # a zero JCT sits at the axis' left edge and still reaches 1
    left, top, _, _ = _plot_area(root)
    (points,) = _points(_series_paths(root)[1])
    assert points[-1] == (left, top)


def test_cdf_with_nothing_at_all() -> None:
    root = ET.fromstring(jct_cdf_svg({"manual": [], "optimus": []}, title="t"))
    assert _series_paths(root) == []
    assert _texts(root, "legend-note") == ["no completed jobs"] * 2
    assert _texts(root, "x-tick") == ["1", "3", "10"]
    assert ET.fromstring(jct_cdf_svg({}, title="empty")).tag == f"{NS}svg"


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
    root = ET.fromstring(utilisation_svg(series, title="Utilisation & co"))
    for panel in ("cpu", "memory"):
        left, top, right, bottom = _plot_area(root, f"plot-area {panel}")
        paths = [p for p in _series_paths(root) if panel in p.get("class", "").split()]
        assert [p.get("data-policy") for p in paths] == POLICIES
        for path in paths:
            for segment in _points(path):
                xs = [x for x, _ in segment]
                assert xs == sorted(xs)
                assert all(left <= x <= right and top <= y <= bottom for x, y in segment)
    assert _texts(root, "legend-name") == POLICIES
    texts = _texts(root)
    assert "100%" in texts and "0%" in texts and "CPU used / allocated" in texts


def test_utilisation_output_stays_small_for_long_runs() -> None:
    series = {name: _utilisation(10_000, seed) for seed, name in enumerate(POLICIES)}
    text = utilisation_svg(series, title="t")
    assert len(text.encode()) < 300_000
    root = ET.fromstring(text)
    assert len(_series_paths(root)) == 2 * len(POLICIES)


def test_utilisation_with_a_policy_without_data() -> None:
    series = {"manual": _utilisation(100, 0), "optimus": [], "dlrover-kfp": [(0.0, 0.0, 0.0)]}
    root = ET.fromstring(utilisation_svg(series, title="t"))
    assert {p.get("data-policy") for p in _series_paths(root)} == {"manual"}
    assert _texts(root, "legend-name") == list(series)
    assert _texts(root, "legend-note") == ["no utilisation data"] * 2
    assert ET.fromstring(utilisation_svg({}, title="empty")).tag == f"{NS}svg"


def test_utilisation_axis_grows_above_full() -> None:
    root = ET.fromstring(utilisation_svg({"manual": [(0.5, 1.3, 0.5)]}, title="t"))
    assert "140%" in _texts(root)
    _, top, _, _ = _plot_area(root, "plot-area cpu")
    ((dot,),) = [_points(p) for p in _series_paths(root) if "cpu" in p.get("class", "")]
    assert len(dot) == 2 and dot[0] == dot[1]  # a lone window is a dot
    assert dot[0][1] > top


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
    for path in paths:
        root = ET.parse(path).getroot()
        assert any(t.endswith("(seed 3)") for t in _texts(root, "title"))
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(
        [JCT_CDF_FILE, UTILISATION_FILE]
    )
