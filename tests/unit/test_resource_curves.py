"""The pure parts of ``benchmarks/resource_curves.py``: grid, window, files, split, forms, plot.

The benchmark's jobs are real and take minutes, so they are not run here; what decides its
figures without running a job is.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import random
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from dlrover_kfp.core.model_io import CSV_COLUMNS, observations_from_csv
from dlrover_kfp.core.observation import Config, Observation
from dlrover_kfp.core.perf_model import PerfModel

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "resource_curves.py"


def _load_benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("resource_curves_benchmark", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


bench: Any = _load_benchmark()

SHARD = 8192


def _profile(times: list[float], rates: list[float]) -> Any:
    """What steady_window reads of a JobProfile: samples with a time and a throughput."""
    samples = tuple(
        SimpleNamespace(time=t, throughput=x) for t, x in zip(times, rates, strict=True)
    )
    return SimpleNamespace(samples=samples)


def _shard_reports(rate: float, start: float, rows: int, interval: float) -> Any:
    """Samples every ``interval`` s of a job that reports a shard whenever one is done."""
    times, rates, reported, t = [], [], 0, 0.0
    while True:
        t += interval
        done = 0 if t < start else min(rows, math.floor((t - start) * rate / SHARD) * SHARD)
        times.append(round(t, 3))
        rates.append((done - reported) / interval)
        reported = done
        if done >= rows and len(times) > 2 and rates[-1] == 0 and rates[-2] == 0:
            return _profile(times, rates)


def test_the_default_grid_is_the_34_shapes_within_the_budget() -> None:
    grid = bench.grid(1.75)
    assert len(grid) == 34
    assert all(c.total_cpu <= 1.75 + 1e-9 for c in grid)
    assert {c.workers / c.ps for c in grid} == {0.5, 1.0, 1.5, 2.0, 3.0}
    assert len(bench.grid(2.0)) > 34


def test_labels_round_trip_and_reject_nonsense() -> None:
    for config in bench.grid(1.75):
        assert bench.parse_label(bench.label(config)) == config
    with pytest.raises(argparse.ArgumentTypeError):
        bench.parse_label("2w1p")
    with pytest.raises(argparse.ArgumentTypeError):
        bench.parse_label("0w1p@0.5/0.5")


def test_rows_aim_at_the_target_seconds_within_the_clamps() -> None:
    args = argparse.Namespace(
        rows=None, target_s=12.0, min_rows=150_000, max_rows=600_000, model="small"
    )
    size = bench.MODELS["small"]
    slow, fast = bench.Config(1, 1, 0.25, 0.25), bench.Config(3, 1, 0.5, 0.25)
    assert bench.rows_for(slow, args, size, SHARD) == 155_648  # the 150k floor, whole shards
    rows = bench.rows_for(fast, args, size, SHARD)
    assert rows % SHARD == 0 and 150_000 <= rows <= 600_000
    assert bench.rows_for(fast, args, size, SHARD, correction=10.0) <= 600_000
    args.rows = 123_456
    assert bench.rows_for(slow, args, size, SHARD) == 123_456


@pytest.mark.parametrize("interval", [0.25, 0.31, 0.5])
def test_the_steady_window_recovers_the_rate_despite_shard_sized_reports(interval: float) -> None:
    # 2 workers together at 30k samples/s, training from t = 10 s; reports come in whole shards.
    profile = _shard_reports(30_000.0, 10.0, 300_000, interval)
    window = bench.steady_window(profile, workers=2, shard_rows=SHARD, skip_s=1.0)
    assert window.throughput == pytest.approx(30_000.0, rel=0.02)
    assert profile.samples[window.first].time >= 11.0
    assert window.shards * SHARD <= 300_000 - 2 * SHARD
    assert abs(window.drift) < 0.1


def test_a_window_too_short_is_an_error_that_asks_for_more_rows() -> None:
    profile = _shard_reports(30_000.0, 10.0, 5 * SHARD, 0.25)
    with pytest.raises(RuntimeError, match="more rows"):
        bench.steady_window(profile, workers=2, shard_rows=SHARD, skip_s=1.0)


def test_the_csv_is_what_model_fit_reads(tmp_path: Path) -> None:
    runs = [
        {c: v for c, v in zip(CSV_COLUMNS, (1, 1, 0.25, 0.5, 512, 14501.9), strict=True)}
        | {"status": "ok"},
        {c: v for c, v in zip(CSV_COLUMNS, (2, 1, 0.5, 0.25, 512, 0), strict=True)}
        | {"status": "failed"},
    ]
    path = tmp_path / "s.csv"
    bench.write_csv(path, CSV_COLUMNS, bench.observation_rows(runs))
    observations = observations_from_csv(path.read_text(), str(path))
    assert observations == [Observation(Config(1, 1, 0.25, 0.5), 512, 14501.9)]


def test_the_split_keeps_repeats_together_and_leaves_something_out() -> None:
    observations = [Observation(c, 512, 1000.0 + k) for c in bench.grid(1.75) for k in range(2)]
    train, test = bench.split_configs(observations, 0.6, seed=0)
    assert len(train) == round(0.6 * 34) and len(test) == 34 - len(train)
    assert not train & test
    assert bench.split_configs(observations, 0.6, seed=0) == (train, test)
    assert bench.split_configs(observations[:4], 0.6, seed=0)[1]  # 2 configs: one each side
    assert not bench.split_configs(observations, 1.0, seed=0)[1]


def _pipelined_truth_observations(noise: float, seed: int) -> list[Observation]:
    """The benchmark's grid measured on an overlap-form truth with multiplicative noise."""
    truth = PerfModel((3e-4, 1.5e-5, 6e-6, 3e-4, 1e-4), overlap=True)
    rng = random.Random(seed)
    return [
        Observation(c, 512, truth.throughput(c, 512) * (1 + rng.gauss(0, noise)))
        for c in bench.grid(1.75)
    ]


def test_every_form_is_fitted_reported_and_plotted(tmp_path: Path) -> None:
    observations = _pipelined_truth_observations(noise=0.03, seed=1)
    train_keys, _ = bench.split_configs(observations, 0.6, seed=0)
    train = [o for o in observations if bench.key(o) in train_keys]
    test = [o for o in observations if bench.key(o) not in train_keys]
    forms = bench.make_forms(["v1", "v2", "v3", "capped"], (1.2, math.inf))
    assert [f.name for f in forms] == ["v1", "v2", "v3", "capped"]
    results = {form.name: bench.fit_form(form, train, test) for form in forms}
    # Only v3 may choose the overlap form, and on data of that form it does and predicts better.
    assert [r.model.overlap for r in results.values()] == [False, False, True, True]
    assert results["v3"].mape(test) < results["v2"].mape(test)
    for form in forms:
        result = results[form.name]
        assert 0 <= result.mape(test) < 1
        assert f"form {form.name}" in bench.describe(result)
        summary = bench.fit_summary(result)
        assert summary["test_configs"] and summary["mape_test"] is not None
    assert [f.name for f in bench.make_forms(["capped"], None)] == []
    pytest.importorskip("matplotlib")
    figure = tmp_path / "curves.png"
    bench.plot(bench.fit_form(forms[1], train, test), figure, "test", 1.75)
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
