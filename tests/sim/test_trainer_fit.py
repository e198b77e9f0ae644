"""The trainer truth family: fitted to the trainer's measured curves, and the fit is current."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dlrover_kfp.errors import UserInputError
from dlrover_kfp.sim.cluster.trace import manual_throughput, synthetic_trace
from dlrover_kfp.sim.cluster.trainer_fit import (
    TrainerFit,
    fit_files,
    packaged_fit,
    read_runs,
    read_thread_scaling,
    serial_at,
)
from dlrover_kfp.sim.cluster.truth import TrainerTruth

ROOT = Path(__file__).resolve().parents[2]


def test_the_packaged_fit_is_what_the_committed_measurements_give() -> None:
    """python benchmarks/fit_trainer_truth.py regenerates dlrover_kfp/sim/data/trainer_fit.json."""
    assert fit_files(ROOT) == packaged_fit()


def test_the_fit_reproduces_the_measured_trainer() -> None:
    """Within the fit's stated error: samples/s about 10 % (12 % on the pods above one core),
    worker and PS cores a few %."""
    fit = packaged_fit()
    assert fit.runs >= 40 and fit.runs_above_one_core >= 6
    assert fit.throughput_rmse < 0.15
    assert fit.throughput_rmse_above_one_core is not None
    assert fit.throughput_rmse_above_one_core < 0.15
    assert fit.worker_cpu_rmse < 0.1 and fit.ps_cpu_rmse < 0.15
    # the PS does about a quarter of the worker's work per sample (measured use)
    assert 0.15 < fit.ps_work / fit.compute < 0.45
    # one compute thread below two cores (training/node.py) keeps ~1.15 cores busy with the
    # prefetch thread beside it, measured at 1.25-1.75-core pods
    assert 1.0 < fit.worker_threads < 1.4


def test_a_second_thread_was_measured_to_buy_well_below_twice() -> None:
    """Three model sizes, one thread against two with no quota: speed-ups 1.27-1.66, i.e.
    serial fractions 0.2-0.6, well above the 0.03-0.15 the family assumed before."""
    fit = packaged_fit()
    assert len(fit.serial_points) == 3
    assert all(0.1 < sigma < 0.7 for _, sigma in fit.serial_points)
    computes = [c for c, _ in fit.serial_points]
    assert max(computes) / min(computes) > 4  # the sizes span the trace's median compute


def test_the_serial_fraction_follows_the_measured_line_within_its_range() -> None:
    base = dataclass_fit(((1e-5, 0.6), (1e-4, 0.2)))
    assert serial_at(base, 1e-5) == pytest.approx(0.6)
    assert serial_at(base, 1e-4) == pytest.approx(0.2)
    assert serial_at(base, 10**-4.5) == pytest.approx(0.4)
    assert serial_at(base, 1e-7) == pytest.approx(0.6)  # not past the measured range
    assert serial_at(base, 1e-2) == pytest.approx(0.2)
    assert serial_at(dataclass_fit(()), 1e-5) is None
    assert serial_at(dataclass_fit(((3e-5, 0.3),)), 1e-3) == pytest.approx(0.3)


def dataclass_fit(points: tuple[tuple[float, float], ...]) -> TrainerFit:
    return dataclasses.replace(packaged_fit(), serial_points=points)


def test_trainer_jobs_carry_the_measured_serial_fraction() -> None:
    fit = packaged_fit()
    for job in synthetic_trace(40, 5, family="trainer"):
        truth = job.truth.throughput
        assert isinstance(truth, TrainerTruth)
        # the trace's compute before its time scaling is not kept; the jitter is 0.8-1.2 and
        # the line spans the measured σ, so every job's σ lies in that band
        low = min(s for _, s in fit.serial_points) * 0.8
        high = max(s for _, s in fit.serial_points) * 1.2
        assert low <= truth.serial <= high


def test_a_bad_thread_scaling_file_is_a_clear_error() -> None:
    with pytest.raises(UserInputError, match="missing columns"):
        read_thread_scaling("model,threads\nsmall,1\n", "t.csv")
    with pytest.raises(UserInputError, match="no round with both"):
        read_thread_scaling("model,round,threads,train_only\nsmall,0,1,100\n", "t.csv")


def test_a_bad_runs_file_is_a_clear_error() -> None:
    with pytest.raises(UserInputError, match="missing columns"):
        read_runs("workers,ps\n1,1\n", "x.csv")
    header = "workers,ps,worker_cpu,ps_cpu,batch_size,throughput,worker_cpu_used,ps_cpu_used,"
    header += "status,other_cpu_during\n"
    with pytest.raises(UserInputError, match=r"x\.csv:2"):
        read_runs(header + "1,1,1,1,512,1000,1,0.2,ok,busy\n", "x.csv")
    # a run other processes disturbed (more than 0.25 cores during it) is left out
    assert read_runs(header + "1,1,1,1,512,1000,1,0.2,ok,0.9\n", "x.csv") == []
    assert len(read_runs(header + "1,1,1,1,512,1000,1,0.2,ok,0.1\n", "x.csv")) == 1


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


def test_every_file_the_simulator_reads_is_packaged() -> None:
    """A wheel holds only the package data pyproject.toml names: the trainer fit was missing
    from it, so `dlrover-kfp simulate --family trainer` failed outside a source checkout."""
    import fnmatch  # noqa: PLC0415
    import tomllib  # noqa: PLC0415

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    globs = config["tool"]["setuptools"]["package-data"]["dlrover_kfp"]
    data = ROOT / "dlrover_kfp" / "sim" / "data"
    for path in data.iterdir():
        name = f"sim/data/{path.name}"
        assert any(fnmatch.fnmatch(name, g) for g in globs), name
