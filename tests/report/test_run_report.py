"""The HTML report of one run: self-contained, every chart, units, events and reasons escaped."""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import matplotlib
import pytest

from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.core.summary import cpu_utilisation, summarize
from dlrover_kfp.report import render_run_report
from dlrover_kfp.report.run import fit_run_model, format_seconds
from tests.factories import make_profile
from tests.report.builders import EVENTS, REASONS, elastic_profile

NS = "{http://www.w3.org/2000/svg}"
CHARTS = ("plot-plan", "plot-throughput", "plot-pods", "plot-model")


class _Page(HTMLParser):
    """The page's tags, ids, the text outside SVG, and every inline SVG as its own document."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self._in_svg = 0
        self.feed(page)
        self.svgs = {
            match.group(1): match.group(2)
            for match in re.finditer(r'<figure id="([^"]+)">\s*(<svg .*?</svg>)', page, re.S)
        }

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_svg += tag == "svg"

    def handle_endtag(self, tag: str) -> None:
        self._in_svg -= tag == "svg"

    def handle_data(self, data: str) -> None:
        if not self._in_svg:
            self.text.append(data)

    def ids(self) -> set[str]:
        return {a["id"] or "" for _, a in self.tags if "id" in a}

    def svg_texts(self, chart: str) -> list[str]:
        root = ET.fromstring(self.svgs[chart])
        return ["".join(t.itertext()) for t in root.iter(f"{NS}text")]

    def svg_ids(self, chart: str) -> set[str]:
        root = ET.fromstring(self.svgs[chart])
        return {e.get("id") or "" for e in root.iter()}


@pytest.fixture(scope="module")
def profile() -> JobProfile:
    return elastic_profile()


@pytest.fixture(scope="module")
def page(profile: JobProfile) -> str:
    return render_run_report(profile)


def test_the_page_is_self_contained(page: str) -> None:
    parsed = _Page(page)
    assert page.startswith("<!DOCTYPE html>")
    for tag, attrs in parsed.tags:
        assert tag not in {"script", "link", "iframe", "img", "object", "embed"}, tag
        for name in ("src", "href", "xlink:href"):
            value = attrs.get(name) or ""
            assert not re.match(r"\s*(https?:)?//", value), (tag, name, value)
    assert "@import" not in page and "url(http" not in page
    # no reference to anything outside the page (SVG namespaces are names, not fetched)
    outside = re.findall(r"https?://[^\s\"'<>]+", page)
    assert set(outside) <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}


def test_header_says_what_ran_and_how_it_ended(page: str, profile: JobProfile) -> None:
    text = " ".join(_Page(page).text)
    for expected in (
        "ctr-daily",
        profile.run_id,
        "2026-11-24T08:00:00Z",
        "succeeded",
        "190.0 s",  # JCT
        "3,000,000",  # samples processed
        "15,789 samples/s",  # mean throughput
        "0.8123",  # AUC
        "0.4321",  # loss
        "1w×1 + 1ps×1 = 2 cores",  # start plan
        "2w×1 + 2ps×1 = 4 cores",  # final plan
        "enforced (cgroup v2)",
    ):
        assert expected in text, expected


def test_every_chart_is_there_with_units(page: str) -> None:
    parsed = _Page(page)
    assert set(CHARTS) <= parsed.ids()
    assert set(parsed.svgs) == set(CHARTS)
    units = {
        "plot-plan": ["time since job start (s)", "CPU requested (cores)", "quota (4 cores)"],
        "plot-throughput": ["time since job start (s)", "throughput (samples/s)"],
        "plot-pods": ["time since job start (s)", "CPU (cores)", "memory (MiB)"],
        "plot-model": [
            "measured (samples/s)",
            "predicted (samples/s)",
            "total CPU requested (cores)",
            "throughput (samples/s)",
        ],
    }
    for chart, labels in units.items():
        texts = parsed.svg_texts(chart)
        for label in labels:
            assert label in texts, (chart, label)


def test_plan_chart_annotates_every_change_with_its_stage(page: str) -> None:
    parsed = _Page(page)
    texts = parsed.svg_texts("plot-plan")
    assert [t for t in texts if t[:1].isdigit() and "_" in t] == [
        "1 cold_start",
        "2 auto_scale",
        "3 post_scale",
    ]
    assert {"plan-worker", "plan-ps", "plan-total", "plan-quota"} <= parsed.svg_ids("plot-plan")


def test_events_are_marked_on_the_timeline_and_listed(page: str) -> None:
    parsed = _Page(page)
    texts = parsed.svg_texts("plot-throughput")
    for label in ("OOM (1)", "relaunch (1)", "PS migration (1)", "straggler (1)", "scale (1)"):
        assert label in texts, label
    assert "failure (1)" in texts
    ids = parsed.svg_ids("plot-throughput")
    assert {f"event-{e.kind}" for e in EVENTS} <= ids
    # the events table: every event, its detail escaped
    assert "step time 2.1x the median &lt;slow&gt;" in page
    assert "PS 0 moved to new pods &amp; re-partitioned" in page
    assert "exit code 1 &quot;crash&quot;" in page
    text = " ".join(parsed.text)
    for event in EVENTS:
        assert event.detail in text


def test_plan_reasons_are_listed_and_escaped(page: str) -> None:
    assert "<script" not in page
    assert "hot PS &lt;script&gt;alert(&#x27;ps&#x27;)&lt;/script&gt; &amp; co" in page
    text = " ".join(_Page(page).text)
    for reason in REASONS:
        assert reason in text


def test_pods_chart_has_used_and_requested_per_pod(page: str) -> None:
    parsed = _Page(page)
    ids = parsed.svg_ids("plot-pods")
    for pod in ("worker-0", "worker-1", "ps-0", "ps-0-g1", "ps-1-g1"):
        for series in ("cpu", "cpu_req", "mem", "mem_req"):
            assert f"pod-{series}-ctr-daily-{pod}" in ids, (pod, series)
    texts = parsed.svg_texts("plot-pods")
    assert "worker-1" in texts  # the legend leaves the job's name out
    assert "requested (dashed)" in texts


def test_model_is_fitted_on_the_runs_configurations(page: str, profile: JobProfile) -> None:
    parsed = _Page(page)
    assert "model-not-fitted" not in parsed.ids()
    assert {"model-parity", "model-curve"} <= parsed.svg_ids("plot-model")
    assert "3 configurations" in page
    model = fit_run_model(summarize(profile).observations)
    assert not isinstance(model, str)
    assert model.diagnostics is not None and model.diagnostics.n_configs == 3


def test_too_few_configurations_say_so_instead_of_a_chart() -> None:
    page = render_run_report(make_profile("one-shape"))  # one plan, one shape
    parsed = _Page(page)
    assert "model-not-fitted" in parsed.ids()
    assert "plot-model" not in parsed.ids()
    text = " ".join(parsed.text)
    assert "measured its throughput at 1 configuration(s)" in text
    assert "needs at least 3" in text
    assert {"plot-plan", "plot-throughput", "plot-pods"} <= parsed.ids()
    assert "No events" in text


def test_a_run_without_samples_still_renders() -> None:
    page = render_run_report(make_profile("died-early", samples=0, status="failed", reason="OOM"))
    parsed = _Page(page)
    assert "model-not-fitted" in parsed.ids()
    assert "no runtime samples" in parsed.svg_texts("plot-throughput")
    assert "no per-pod samples" in parsed.svg_texts("plot-pods")
    assert "failed: OOM" in " ".join(parsed.text)


def test_rendering_leaves_matplotlib_as_it_was(profile: JobProfile) -> None:
    before = dict(matplotlib.rcParams)
    had_pyplot = "matplotlib.pyplot" in sys.modules
    render_run_report(profile)
    assert dict(matplotlib.rcParams) == before
    assert ("matplotlib.pyplot" in sys.modules) == had_pyplot


def test_helpers() -> None:
    assert format_seconds(12.06) == "12.1 s"
    assert format_seconds(599.9) == "599.9 s"
    assert format_seconds(800) == "13 min 20 s"
    assert format_seconds(3599) == "59 min 59 s"
    assert format_seconds(12 * 3600 + 300) == "12 h 05 min"
    # used / requested over all samples and pods: factories ramp usage 0.6 -> 1.0 of 30%
    assert cpu_utilisation(make_profile(samples=5)) == pytest.approx(0.3 * 0.8)
    assert cpu_utilisation(make_profile(samples=0)) is None
