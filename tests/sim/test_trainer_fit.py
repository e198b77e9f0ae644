"""The trainer truth family: fitted to the trainer's measured curves, and the fit is current."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlrover_kfp.errors import UserInputError
from dlrover_kfp.sim.cluster.trace import manual_throughput, synthetic_trace
from dlrover_kfp.sim.cluster.trainer_fit import fit_trainer, packaged_fit, read_runs
from dlrover_kfp.sim.cluster.truth import TrainerTruth

ROOT = Path(__file__).resolve().parents[2]
RUNS = "benchmarks/data/resource_curves_small.runs.csv"


def test_the_packaged_fit_is_what_the_committed_measurements_give() -> None:
    """python benchmarks/fit_trainer_truth.py regenerates dlrover_kfp/sim/data/trainer_fit.json."""
    runs = read_runs((ROOT / RUNS).read_text(encoding="utf-8"), RUNS)
    assert fit_trainer(runs, RUNS) == packaged_fit()


def test_the_fit_reproduces_the_measured_trainer() -> None:
    """Within the fit's stated error: samples/s about 10 %, worker and PS cores a few %."""
    fit = packaged_fit()
    assert fit.runs >= 30
    assert fit.throughput_rmse < 0.15
    assert fit.worker_cpu_rmse < 0.1 and fit.ps_cpu_rmse < 0.15
    # the PS does about a quarter of the worker's work per sample (measured use)
    assert 0.15 < fit.ps_work / fit.compute < 0.45


def test_a_bad_runs_file_is_a_clear_error() -> None:
    with pytest.raises(UserInputError, match="missing columns"):
        read_runs("workers,ps\n1,1\n", "x.csv")


def test_trainer_jobs_match_the_trace_at_the_request_and_differ_away_from_it() -> None:
    contention = synthetic_trace(30, 3)
    trainer = synthetic_trace(30, 3, family="trainer")
    assert [j.spec for j in trainer] == [j.spec for j in contention]
    for a, b in zip(contention, trainer, strict=True):
        assert isinstance(b.truth.throughput, TrainerTruth)
        assert manual_throughput(b) == pytest.approx(manual_throughput(a), rel=1e-9)
        w, p = a.workers, a.ps
        batch = a.spec.training.batch_size
        half = (max(1, w.count // 2), p.count, w.cpu / 2, p.cpu, batch)
        assert b.truth.throughput.throughput(*half) != pytest.approx(
            a.truth.throughput.throughput(*half), rel=0.01
        )
