"""Worker slowdowns drawn from the real PAI mini-batch times shipped with the package."""

from __future__ import annotations

import random
import statistics
from importlib import resources

import pytest

from dlrover_kfp.errors import UserInputError
from dlrover_kfp.sim.cluster.stragglers import (
    COV_FILE,
    JOB_FILES,
    MAX_SLOWDOWN,
    StragglerModel,
    parse_batch_times,
    straggler_slowdown,
)


@pytest.fixture(scope="module")
def model() -> StragglerModel:
    return StragglerModel.from_package()


def _packaged(name: str) -> str:
    return resources.files("dlrover_kfp.sim").joinpath("data", name).read_text(encoding="utf-8")


def test_the_package_ships_the_data_and_its_attribution() -> None:
    for name in (*JOB_FILES, COV_FILE):
        assert _packaged(name).startswith(",")
    readme = _packaged("README.md")
    assert "CC BY 4.0" in readme and "Alibaba Group" in readme and "7a6c496" in readme


def test_the_model_reads_every_measured_job(model: StragglerModel) -> None:
    assert len(model.patterns) == 3 and all(len(p) == 10 for p in model.patterns)
    assert len(model.slowdowns) == 100
    # Job 1's workers 0-2 are ~10 % slower for the whole run; job 2's worker 5 ~8 %.
    assert model.patterns[0][0] == pytest.approx(1.11, abs=0.01)
    assert model.patterns[1][5] == pytest.approx(1.08, abs=0.01)
    assert all(statistics.median(p) == pytest.approx(1.0) for p in model.patterns)
    assert StragglerModel.from_package() is model  # loaded once


@pytest.mark.parametrize("workers", [1, 4, 10, 16, 25])
def test_factors_are_slowdowns_one_per_worker(model: StragglerModel, workers: int) -> None:
    rng = random.Random(workers)
    for _ in range(200):
        factors = model.slowdown_factors(rng, workers)
        assert len(factors) == workers
        assert all(1.0 <= f <= MAX_SLOWDOWN for f in factors)


def test_persistent_imbalance_is_the_measured_size_and_kept_per_slot(
    model: StragglerModel,
) -> None:
    """Workers differ by up to the ~10 % the job files show, for the whole job: no heavy
    stragglers in the pattern (those are episodes), and the same seed gives the same factor
    to the same worker slot however many workers are asked for (restarts and resizes keep a
    worker's pace)."""
    largest = max(max(p) for p in model.patterns)
    assert 1.05 <= largest <= 1.15
    rng = random.Random(0)
    draws = [model.slowdown_factors(rng, 10) for _ in range(3000)]
    everything = [f for draw in draws for f in draw]
    assert all(1.0 <= f <= largest for f in everything)
    assert 1.0 <= statistics.median(everything) <= 1.05
    for seed in range(200):
        many = model.slowdown_factors(random.Random(seed), 37)
        for n in (1, 4, 10, 16, 30):
            assert model.slowdown_factors(random.Random(seed), n) == many[:n]


def test_the_cov_data_reads_as_stragglers_in_a_share_of_jobs(model: StragglerModel) -> None:
    """The single-straggler reading of the CoV file, kept as the reference for the share of
    jobs with a straggler (docs/simulator.md): 39 % slower than 1.5x, 49 % than 1.3x."""
    assert model.straggler_share(1.5) == pytest.approx(0.39, abs=0.005)
    assert model.straggler_share(1.3) == pytest.approx(0.49, abs=0.005)


def test_draws_are_deterministic_per_seed(model: StragglerModel) -> None:
    def draw(seed: int) -> tuple[list[float], tuple[float, float, float]]:
        rng = random.Random(seed)
        return model.slowdown_factors(rng, 16), model.episode(rng)

    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


def test_single_straggler_reading_of_the_cov_inverts_exactly() -> None:
    for slow in (1.0, 1.2, 1.74, 3.0):
        times = [1.0] * 9 + [slow]
        mean = statistics.fmean(times)
        cov = statistics.pstdev(times) / mean
        assert straggler_slowdown(cov) == pytest.approx(slow, rel=1e-9)
    assert straggler_slowdown(10.0) == MAX_SLOWDOWN
    assert straggler_slowdown(0.0) == 1.0


def test_single_straggler_reading_matches_job_1s_measured_straggler() -> None:
    """Where worker 6 of job 1 is slow, its ratio follows from that iteration's CoV."""
    times = parse_batch_times(_packaged(JOB_FILES[0]), JOB_FILES[0])
    checked = 0
    for by_worker in times.values():
        values = list(by_worker.values())
        ratio = by_worker[6] / statistics.median(values)
        if ratio > 1.3 and len(values) == 10:
            cov = statistics.pstdev(values) / statistics.fmean(values)
            assert straggler_slowdown(cov) == pytest.approx(ratio, rel=0.06)
            checked += 1
    assert checked >= 8


def test_the_observed_episode(model: StragglerModel) -> None:
    # Worker 6 of job 1: slow from iteration 1811 to 1950 of 1-2988.
    assert model.episode_onset == pytest.approx(1810 / 2988)
    assert model.episode_duration == pytest.approx(140 / 2988)
    assert len(model.episode_ratios) == 14
    assert statistics.fmean(model.episode_ratios) == pytest.approx(1.50, abs=0.01)


def test_episodes_vary_around_the_observed_one(model: StragglerModel) -> None:
    rng = random.Random(3)
    episodes = [model.episode(rng) for _ in range(2000)]
    for onset, duration, factor in episodes:
        assert 0.05 <= onset <= 0.95
        assert 0 < duration <= 1 - onset
        assert 1.0 <= factor <= max(model.episode_ratios)
    onsets, durations, factors = zip(*episodes, strict=True)
    assert statistics.fmean(onsets) == pytest.approx(model.episode_onset, abs=0.03)
    assert min(onsets) < 0.45 and max(onsets) > 0.75
    assert 0.5 * model.episode_duration <= min(durations)
    assert max(durations) <= 2.0 * model.episode_duration
    assert statistics.fmean(factors) == pytest.approx(1.50, abs=0.05)
    assert statistics.pstdev(factors) > 0.05


def test_malformed_data_names_the_file_and_line() -> None:
    good = _packaged(JOB_FILES[0])
    broken = good.replace("\n5,5,25,1,", "\n5,5,25,one,", 1)
    with pytest.raises(UserInputError, match=r"^job\.csv:7: malformed row"):
        parse_batch_times(broken, "job.csv")
    with pytest.raises(UserInputError, match=r"^job\.csv:1: expected the columns"):
        parse_batch_times("worker,time\n1,2\n", "job.csv")
    with pytest.raises(UserInputError, match=r"^cov\.csv:2: a CoV is not a number"):
        StragglerModel.from_texts([("job.csv", good)], ("cov.csv", ",0,1\njob_00,0.1,x\n"))
