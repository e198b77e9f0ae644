"""Simulator traces: the synthetic generator's calibration, the JSONL file, the cluster size."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import time
from collections import defaultdict
from pathlib import Path

import pytest

from dlrover_kfp.core.documents import parse, to_dict
from dlrover_kfp.core.footprint import RUNTIME_MB, min_ps_memory_mb
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.sim.cluster.trace import (
    NODE_CPU,
    PEAK_FILL,
    TraceJob,
    calibration,
    cluster_size_for,
    manual_jct,
    manual_oom_progress,
    manual_throughput,
    read_trace,
    synthetic_trace,
    write_trace,
)
from dlrover_kfp.sim.cluster.truth import PsContentionTruth, RooflineTruth

DAY = 86_400.0


@pytest.fixture(scope="module")
def trace500() -> list[TraceJob]:
    return synthetic_trace(500, 11)


@pytest.fixture(scope="module")
def roofline500() -> list[TraceJob]:
    return synthetic_trace(500, 11, family="roofline")


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    first = synthetic_trace(120, 5)
    assert synthetic_trace(120, 5) == first
    other = synthetic_trace(120, 6)
    assert other != first
    assert [j.arrival_s for j in other] != [j.arrival_s for j in first]


def test_jobs_come_sorted_with_ids_in_arrival_order(trace500: list[TraceJob]) -> None:
    assert len(trace500) == 500
    arrivals = [j.arrival_s for j in trace500]
    assert arrivals == sorted(arrivals)
    assert [j.id for j in trace500] == [f"job-{i:05d}" for i in range(500)]
    span = max(1.0, 500 / 60) * DAY
    assert all(0 <= t < span for t in arrivals)
    assert all(isinstance(j.truth.throughput, PsContentionTruth) for j in trace500)


def test_manual_configuration_is_calibrated(trace500: list[TraceJob]) -> None:
    c = calibration(trace500)
    assert 0.20 <= c.cpu_utilisation <= 0.32
    assert 0.15 <= c.memory_utilisation <= 0.35
    assert 0.02 <= c.oom_fraction <= 0.12
    assert 0.02 <= c.few_workers_fraction <= 0.08
    assert c.recurring_fraction >= 0.7
    assert 15 * 60 <= c.jct_p10_s < c.jct_median_s < c.jct_p90_s <= 4.5 * 3600


def test_every_spec_is_valid_and_requests_are_plausible(trace500: list[TraceJob]) -> None:
    for job in trace500:
        assert parse(JobSpec, to_dict(job.spec), job.id) == job.spec
        w, p, quota = job.workers, job.ps, job.quota
        assert 1 <= w.count <= 16 and 2 <= p.count <= 8
        assert {w.cpu, p.cpu} <= {8.0, 16.0}
        cpu = w.count * w.cpu + p.count * p.cpu
        mem = w.count * w.memory + p.count * p.memory
        assert cpu * 1.5 - 1e-9 <= quota.cpu
        assert mem <= quota.memory
        if w.count >= 4:
            assert quota.cpu <= cpu * 3 + 1
            # Rows were drawn for a manual JCT of 20 min - 4 h (±5 % a day for the truth).
            assert 18 * 60 <= manual_jct(job) <= 4.5 * 3600
        # Users over-provision worker memory 2-4x, then round up to a size people write.
        assert 2.0 * job.truth.memory.worker_mb * 0.94 <= w.memory
        assert job.total_samples == (job.spec.dataset_rows or 0) * job.spec.training.epochs > 0


def test_short_ps_requests_come_from_the_users_guess_not_a_flag(trace500: list[TraceJob]) -> None:
    """A PS request is a log-normal guess at the peak, rounded up to a size users write: some
    fall short (those jobs OOM under manual once their PS grow past it), most hold it."""
    ooms = [(j, manual_oom_progress(j)) for j in trace500 if manual_oom_progress(j) is not None]
    assert 0.02 * len(trace500) <= len(ooms) <= 0.12 * len(trace500)
    for job, progress in ooms:
        assert progress is not None and 0.0 <= progress < 1.0
        memory = job.truth.memory
        assert memory.ps_peak_mb(job.ps.count) > job.ps.memory
        if progress > 0.01:
            assert memory.ps_used_mb(progress - 0.01, job.ps.count) <= job.ps.memory
        # a size a user writes (whole GiB), not the truth's usage at some progress
        assert job.ps.memory % 1024 == 0  # MiB
    ratios = sorted(j.ps.memory / j.truth.memory.ps_peak_mb(j.ps.count) for j in trace500)
    assert 1.5 <= ratios[len(ratios) // 2] <= 3.5  # the median guess is about 2x, rounded up
    assert ratios[-1] > 4 * ratios[len(ratios) // 10]  # a wide guess, not a fixed factor


def test_memory_truths_do_not_come_from_the_planners_footprint(trace500: list[TraceJob]) -> None:
    """The PS state per row is the truth's own (slots, hash entries, load factor, allocator):
    against the planner's floor formula, the ratio varies widely from job to job and lies on
    both sides of 1, so the planner's projection bounds nothing by construction."""
    ratios = []
    for job in trace500:
        model = job.spec.model
        floor = min_ps_memory_mb(model, 1) - RUNTIME_MB  # all rows, slots and snapshot
        ratios.append(job.truth.memory.ps_end_mb / floor)
    ratios.sort()
    assert ratios[len(ratios) // 10] < 0.8 and ratios[-len(ratios) // 10] > 1.0
    assert ratios[-len(ratios) // 10] / ratios[len(ratios) // 10] > 2.0


def test_recurring_scenarios_repeat_daily_with_small_drift(trace500: list[TraceJob]) -> None:
    runs: dict[str, list[TraceJob]] = defaultdict(list)
    for job in trace500:
        runs[job.scenario].append(job)
    recurring = {k: v for k, v in runs.items() if len(v) > 1}
    assert 40 <= len(recurring) <= 60  # ~jobs/10 scenarios
    for scenario, jobs in recurring.items():
        first = jobs[0]
        assert all(j.spec.name == scenario == j.spec.scenario for j in jobs)
        for job in jobs[1:]:
            assert job.spec.model == first.spec.model
            assert job.spec.resources == first.spec.resources
            assert job.spec.training == first.spec.training
            assert job.spec.data.rows == pytest.approx(first.spec.data.rows, rel=0.11)
            a, b = job.truth.throughput, first.truth.throughput
            assert isinstance(a, PsContentionTruth) and isinstance(b, PsContentionTruth)
            assert a.compute == pytest.approx(b.compute, rel=0.11)
            assert manual_throughput(job) == pytest.approx(manual_throughput(first), rel=0.3)
        gaps = [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(jobs)]
        assert all(abs(gap - DAY) <= 1800.0 + 1e-6 for gap in gaps)
    once = [k for k, v in runs.items() if len(v) == 1]
    assert 80 <= len(once) <= 120


def test_roofline_family_draws_the_same_jobs(
    trace500: list[TraceJob], roofline500: list[TraceJob]
) -> None:
    assert len(roofline500) == len(trace500)
    for a, b in zip(trace500, roofline500, strict=True):
        assert (a.id, a.scenario, a.arrival_s, a.spec) == (b.id, b.scenario, b.arrival_s, b.spec)
        assert b.truth.memory == a.truth.memory
        assert isinstance(b.truth.throughput, RooflineTruth)
        # Same throughput at the request, so the same manual JCT ...
        assert manual_throughput(b) == pytest.approx(manual_throughput(a), rel=1e-9)
    # ... but a different shape away from it.
    job_a, job_b = trace500[0], roofline500[0]
    batch = job_a.spec.training.batch_size
    assert job_b.truth.throughput.throughput(32, 1, 2.0, 2.0, batch) != pytest.approx(
        job_a.truth.throughput.throughput(32, 1, 2.0, 2.0, batch), rel=0.05
    )
    c = calibration(roofline500)
    assert 0.15 <= c.cpu_utilisation <= 0.35
    assert c.jct_median_s == pytest.approx(calibration(trace500).jct_median_s)


def test_days_spreads_the_arrivals() -> None:
    jobs = synthetic_trace(100, 3, days=2.0)
    assert all(0 <= j.arrival_s < 2 * DAY for j in jobs)
    assert max(j.arrival_s for j in jobs) > 1.5 * DAY
    assert synthetic_trace(0, 3) == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"family": "linear"}, "family"), ({"days": 0.0}, "days"), ({"days": -1.0}, "days")],
)
def test_bad_generator_arguments(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        synthetic_trace(10, 0, **kwargs)  # type: ignore[arg-type]


def test_a_thousand_jobs_generate_quickly() -> None:
    start = time.process_time()  # the CPU given, not wall time: holds on a busy machine
    jobs = synthetic_trace(1000, 1)
    assert time.process_time() - start < 2.0
    assert len(jobs) == 1000


# --------------------------------------------------------------------------------------------
# The file


def test_jsonl_round_trip(tmp_path: Path) -> None:
    jobs = synthetic_trace(40, 2)
    roof = synthetic_trace(5, 9, family="roofline")
    mixed = jobs + [dataclasses.replace(j, id=f"roof-{j.id}") for j in roof]
    mixed.sort(key=lambda j: j.arrival_s)
    path = tmp_path / "trace.jsonl"
    write_trace(path, mixed, "a test trace")
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"trace_version": 1, "description": "a test trace"}
    assert len(lines) == 1 + len(mixed)
    assert read_trace(path) == mixed


def test_reading_sorts_by_arrival_and_needs_no_header(tmp_path: Path) -> None:
    jobs = synthetic_trace(12, 4)
    path = tmp_path / "trace.jsonl"
    body = [json.dumps(to_dict(j)) for j in reversed(jobs)]
    path.write_text("\n".join(body[:5]) + "\n\n" + "\n".join(body[5:]) + "\n")
    assert read_trace(path) == jobs


def _bad_file(tmp_path: Path, change: object, line: int = 3) -> Path:
    """A written trace whose line ``line`` (1: the header) is replaced by ``change(dict)``."""
    path = tmp_path / "bad.jsonl"
    write_trace(path, synthetic_trace(4, 8), "bad")
    lines = path.read_text().splitlines()
    if isinstance(change, str):
        lines[line - 1] = change
    else:
        data = json.loads(lines[line - 1])
        assert callable(change)
        change(data)
        lines[line - 1] = json.dumps(data)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["truth"]["memory"].update(swap_mb=1), r"truth\.memory\.swap_mb: unknown key"),
        (lambda d: d["truth"]["throughput"].update(base="fast"), r"truth\.throughput\.base: "),
        (lambda d: d.update(arrival_s="noon"), r"arrival_s: "),
        (lambda d: d["spec"]["training"].update(batch_size=0), r"spec\.training\.batch_size: "),
        (lambda d: d["spec"]["resources"].pop("ps"), r"spec\.resources\.ps: required"),
        (lambda d: d.pop("truth"), r"truth: required key is missing"),
        ('{"id": "job-1", ', r"malformed JSON"),
        ("[1, 2]", r"expected a mapping"),
    ],
)
def test_a_bad_line_names_file_line_and_key(tmp_path: Path, change: object, message: str) -> None:
    path = _bad_file(tmp_path, change)
    with pytest.raises(UserInputError, match=rf"^{path}:3: {message}"):
        read_trace(path)


def test_duplicate_ids_name_both_lines(tmp_path: Path) -> None:
    path = _bad_file(tmp_path, lambda d: d.update(id="job-00000"), line=4)
    with pytest.raises(UserInputError, match=rf"{path}:4: id 'job-00000' already .* line 2"):
        read_trace(path)


def test_header_version_and_place_are_checked(tmp_path: Path) -> None:
    path = _bad_file(tmp_path, lambda d: d.update(trace_version=2), line=1)
    with pytest.raises(UserInputError, match=rf"{path}:1: trace_version: unsupported version 2"):
        read_trace(path)
    path = _bad_file(tmp_path, '{"trace_version": 1}', line=3)
    with pytest.raises(UserInputError, match=rf"{path}:3: trace_version: .* first line"):
        read_trace(path)
    with pytest.raises(UserInputError, match="no such file"):
        read_trace(tmp_path / "missing.jsonl")


def test_trace_job_scenario_must_match_its_spec() -> None:
    job = synthetic_trace(1, 0)[0]
    data = to_dict(job)
    data["spec"]["scenario"] = "elsewhere"
    with pytest.raises(UserInputError, match=r"spec\.scenario: 'elsewhere' differs"):
        parse(TraceJob, data, "job")


# --------------------------------------------------------------------------------------------
# Cluster size


def _alone(job: TraceJob, arrival: float, name: str) -> TraceJob:
    return dataclasses.replace(job, id=name, arrival_s=arrival)


def test_cluster_size_follows_the_busy_manual_demand() -> None:
    job = next(j for j in synthetic_trace(30, 1) if j.workers.count >= 4)
    demand = job.workers.count * job.workers.cpu + job.ps.count * job.ps.cpu
    one_node_share = PEAK_FILL * NODE_CPU
    nodes, cpu, memory = cluster_size_for([job])
    assert (cpu, memory) == (64.0, 256 * 1024)
    assert nodes == math.ceil(demand / one_node_share)
    # Two copies at once need twice the room; one after the other, the same as one.
    together = [_alone(job, 0.0, "a"), _alone(job, 1.0, "b")]
    assert cluster_size_for(together)[0] == math.ceil(2 * demand / one_node_share)
    apart = [_alone(job, 0.0, "a"), _alone(job, manual_jct(job) + 10.0, "b")]
    assert cluster_size_for(apart)[0] == nodes


def test_cluster_size_for_a_synthetic_trace(trace500: list[TraceJob]) -> None:
    nodes, cpu, _ = cluster_size_for(trace500)
    largest = max(j.workers.count * j.workers.cpu + j.ps.count * j.ps.cpu for j in trace500)
    assert nodes * cpu * PEAK_FILL >= largest
    # Mean manual demand (core-seconds / span) is a fraction of it: moderately loaded.
    end = max(j.arrival_s + manual_jct(j) for j in trace500)
    mean = (
        sum(
            manual_jct(j) * (j.workers.count * j.workers.cpu + j.ps.count * j.ps.cpu)
            for j in trace500
        )
        / end
    )
    assert 0.2 <= mean / (nodes * cpu) <= 0.6
    with pytest.raises(ValueError, match="fill"):
        cluster_size_for(trace500, fill=0.0)
