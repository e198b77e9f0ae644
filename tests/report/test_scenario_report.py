"""The scenario page: a scenario's runs in the order they started, JCT, utilisation, plans."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.report import render_scenario_report
from dlrover_kfp.report.plots import RunPoint, scenario_figure
from tests.factories import make_profile

NS = "{http://www.w3.org/2000/svg}"


def _runs() -> list[JobProfile]:
    """Three daily runs, given newest first: each warm-started closer to what it used."""
    return [
        make_profile(
            "ads-3",
            started_at="2026-11-03T02:00:00Z",
            workers=2,
            worker_cpu=1.0,
            ps=1,
            ps_cpu=1.0,
            used_fraction=0.75,
            jct_seconds=200.0,
        ),
        make_profile(
            "ads-1",
            started_at="2026-11-01T02:00:00Z",
            workers=4,
            worker_cpu=4.0,
            ps=2,
            ps_cpu=4.0,
            used_fraction=0.25,
            jct_seconds=400.0,
        ),
        make_profile(
            "ads-2",
            started_at="2026-11-02T02:00:00Z",
            workers=3,
            worker_cpu=2.0,
            ps=2,
            ps_cpu=1.0,
            used_fraction=0.5,
            jct_seconds=300.0,
            status="failed",
            reason="worker-0 <OOM> 3 times",
        ),
    ]


def _table_rows(page: str) -> list[list[str]]:
    body = re.search(r'<table class="runs">.*?<tbody>(.*?)</tbody>', page, re.S)
    assert body is not None
    return [
        [re.sub(r"<[^>]+>", "", cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        for row in re.findall(r"<tr>(.*?)</tr>", body.group(1))
    ]


def test_runs_in_start_order_with_jct_utilisation_and_plans() -> None:
    page = render_scenario_report(_runs(), "ads-ctr")
    rows = _table_rows(page)
    assert [row[1] for row in rows] == ["ads-1", "ads-2", "ads-3"]
    assert [row[2] for row in rows] == ["2026-11-01 02:00", "2026-11-02 02:00", "2026-11-03 02:00"]
    assert [row[4] for row in rows] == ["400.0 s", "300.0 s", "200.0 s"]
    # cores used / requested over all samples and pods: the factory ramps use 0.6 -> 1.0
    assert [row[6] for row in rows] == ["20%", "40%", "60%"]
    assert rows[0][7] == rows[0][8] == "4w×4 + 2ps×4 = 24 cores"
    assert rows[2][8] == "2w×1 + 1ps×1 = 3 cores"
    assert rows[1][3] == "failed: worker-0 &lt;OOM&gt; 3 times"
    assert "From the first run to the last: JCT 400.0 → 200.0 s (-50%)" in page
    assert "20% → 60%" in page
    assert '<figure id="plot-scenario">' in page
    assert not re.search(r"(src|href)=\"?(https?:)?//", page)


def test_scenario_chart_has_units_and_marks_failed_runs() -> None:
    page = render_scenario_report(_runs(), "ads-ctr")
    svg = re.search(r"<svg .*?</svg>", page, re.S)
    assert svg is not None
    root = ET.fromstring(svg.group(0))
    texts = ["".join(t.itertext()) for t in root.iter(f"{NS}text")]
    for label in ("JCT (s)", "CPU used / requested (%)", "CPU requested (cores)", "final plan"):
        assert label in texts, label
    assert "run (started at, UTC)" in texts
    ids = {e.get("id") for e in root.iter()}
    assert {"scenario-jct", "scenario-utilisation", "scenario-failed"} <= ids


def test_scenario_figure_data() -> None:
    points = [
        RunPoint("a", 2400.0, True, 0.2, 8.0, 6.0, "2w×2 + 2ps×2", "2w×2 + 1ps×2"),
        RunPoint("b", 3600.0, False, None, 6.0, 6.0, "2w×2 + 1ps×2", "2w×2 + 1ps×2"),
    ]
    jct_ax, util_ax, cpu_ax = scenario_figure(points).axes
    (jct,) = [line for line in jct_ax.get_lines() if line.get_gid() == "scenario-jct"]
    assert list(jct.get_ydata()) == [40.0, 60.0]  # minutes above half an hour
    assert jct_ax.get_ylabel() == "JCT (min)"
    (util,) = util_ax.get_lines()
    assert util.get_ydata()[0] == pytest.approx(20.0)
    assert str(util.get_ydata()[1]) == "nan"  # no samples: no point
    starts = [line for line in cpu_ax.get_lines() if line.get_gid() == "scenario-start-cpu"]
    assert list(starts[0].get_ydata()) == [8.0, 6.0]


def test_one_run_has_no_trend_yet() -> None:
    page = render_scenario_report(_runs()[:1], "ads-ctr")
    assert "One run so far" in page
    assert len(_table_rows(page)) == 1


def test_no_runs_is_a_user_error() -> None:
    with pytest.raises(UserInputError, match="no runs of scenario 'ads-ctr' in the history"):
        render_scenario_report([], "ads-ctr")


def test_runs_in_the_same_minute_are_told_apart_by_the_second() -> None:
    runs = [
        make_profile("a", started_at="2026-11-01T02:00:05Z"),
        make_profile("b", started_at="2026-11-01T02:00:50Z"),
    ]
    rows = _table_rows(render_scenario_report(runs, "ads-ctr"))
    assert [row[2] for row in rows] == ["2026-11-01 02:00:05", "2026-11-01 02:00:50"]
