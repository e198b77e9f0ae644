"""The resource-performance model: equation, fit, identifiability, file formats, accuracy.

The accuracy tests run the same experiments as ``benchmarks/model_accuracy.py`` (loaded from
there, so that the figures in docs/model.md and the thresholds asserted here cannot drift apart).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from scipy.optimize import nnls

from dlrover_kfp.core.model_io import (
    FORM,
    FORM_V1,
    FORM_V2,
    GAMMA_NAME,
    OVERLAP_NAME,
    model_from_dict,
    model_to_dict,
    observations_from_csv,
)
from dlrover_kfp.core.observation import Config, Observation
from dlrover_kfp.core.perf_model import (
    PRIOR,
    THETA_NAMES,
    FitSettings,
    PerfModel,
    fit,
)
from dlrover_kfp.errors import UserInputError

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "model_accuracy.py"


def _load_benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("model_accuracy_benchmark", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


bench: Any = _load_benchmark()

TRUE = PerfModel(theta=(1e-3, 2.5e-5, 7e-6, 8e-4, 1e-4))
#: The same coefficients with superlinear PS contention.
CONTENDED = dataclasses.replace(TRUE, theta=(1e-3, 2.5e-5, 4e-6, 8e-4, 1e-4), gamma=1.4)
#: γ never searched: the original, linear-contention form.
GAMMA_ONE = FitSettings(max_exponent=1.0)
#: The overlap form, T = θ0 + max(worker, PS) + θ4·p, with coefficients of the size measured on
#: the real trainer (docs/resource-model-fit.md): ~18 µs·core per sample on a worker, ~4 µs on
#: a PS, ~0.8 ms per request.
PIPELINED = PerfModel(theta=(5e-4, 1.8e-5, 4e-6, 8e-4, 5e-5), overlap=True)


def _obs(w: int, p: int, lw: float, lp: float, x: float, *, b: int = 512) -> Observation:
    return Observation(config=Config(w, p, lw, lp), batch_size=b, throughput=x)


def _from_model(
    model: PerfModel, configs: list[tuple[int, int, float, float]]
) -> list[Observation]:
    return [_obs(*c, model.throughput(Config(*c), 512)) for c in configs]


SPREAD = [
    (1, 1, 2.0, 1.0),
    (4, 1, 8.0, 2.0),
    (8, 2, 4.0, 4.0),
    (16, 4, 16.0, 8.0),
    (12, 8, 2.0, 1.0),
    (2, 6, 12.0, 3.0),
    (6, 3, 6.0, 6.0),
    (16, 2, 10.0, 5.0),
    (3, 5, 14.0, 2.0),
    (10, 7, 3.0, 7.0),
]


# --- the equation --------------------------------------------------------------------------


@pytest.mark.parametrize("gamma", [1.0, 1.4])
def test_iteration_time_is_the_documented_equation(gamma: float) -> None:
    model = dataclasses.replace(TRUE, gamma=gamma)
    config = Config(workers=6, ps=3, worker_cpu=4.0, ps_cpu=2.0)
    t0, t1, t2, t3, t4 = TRUE.theta
    # γ applies to θ2's term only; θ3·(w/p) stays linear.
    expected = t0 + t1 * 256 / 4.0 + t2 * (6 / 3) ** gamma * 256 / 2.0 + t3 * (6 / 3) + t4 * 3
    assert model.iteration_time(config, 256) == pytest.approx(expected, rel=1e-12)
    assert model.throughput(config, 256) == pytest.approx(6 * 256 / expected, rel=1e-12)


@pytest.mark.parametrize(
    "model", [TRUE, CONTENDED, PIPELINED], ids=["gamma=1", "gamma=1.4", "overlap"]
)
def test_throughput_many_matches_scalar_and_broadcasts(model: PerfModel) -> None:
    rng = np.random.default_rng(0)
    w = rng.integers(1, 33, 200)
    p = rng.integers(1, 16, 200)
    lw = rng.uniform(0.5, 16, 200)
    lp = rng.uniform(0.5, 8, 200)
    many = model.throughput_many(w, p, lw, lp, 512)
    assert many.shape == (200,)
    for i in range(0, 200, 17):
        config = Config(int(w[i]), int(p[i]), float(lw[i]), float(lp[i]))
        assert many[i] == pytest.approx(model.throughput(config, 512), rel=1e-12)


@pytest.mark.parametrize("model", [TRUE, CONTENDED], ids=["gamma=1", "gamma=1.4"])
def test_throughput_many_is_fast_enough_for_the_planner(model: PerfModel) -> None:
    # Every shape up to 32 workers, 8 PS, 16 cores per worker and 8 per PS: 32,768 candidates,
    # more than a planner's sweep; the budget is for the whole decision (docs/model.md).
    grid = np.meshgrid(
        np.arange(1, 33), np.arange(1, 9), np.arange(1, 17), np.arange(1, 9), indexing="ij"
    )
    w, p, lw, lp = (g.ravel() for g in grid)
    assert w.size == 32_768
    best = math.inf
    for _ in range(5):
        start = time.process_time()  # the CPU given, not wall time: holds on a busy machine
        model.throughput_many(w, p, lw, lp, 512)
        best = min(best, time.process_time() - start)
    assert best < 0.005


@pytest.mark.parametrize("field", ["workers", "ps", "worker_cpu", "ps_cpu", "batch_size"])
@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_throughput_many_rejects_bad_values_naming_the_field(field: str, bad: float) -> None:
    values: dict[str, Any] = {"workers": 4, "ps": 2, "worker_cpu": 4.0, "ps_cpu": 2.0}
    values["batch_size"] = 512
    values[field] = np.array([1.0, bad])
    with pytest.raises(ValueError, match=field):
        TRUE.throughput_many(**values)


def test_scalar_api_rejects_bad_config_naming_the_field() -> None:
    with pytest.raises(ValueError, match="ps_cpu"):
        TRUE.throughput(Config(2, 1, 4.0, 0.0), 512)
    with pytest.raises(ValueError, match="batch_size"):
        TRUE.iteration_time(Config(2, 1, 4.0, 1.0), 0)


@pytest.mark.parametrize(
    ("theta", "message"),
    [
        ((1.0, 1.0, 1.0, 1.0), "5 coefficients"),
        ((1.0, -1e-6, 0.0, 0.0, 0.0), "theta1"),
        ((1.0, 0.0, math.nan, 0.0, 0.0), "theta2"),
        ((0.0, 0.0, 0.0, 0.0, 0.0), "at least one"),
    ],
)
def test_model_rejects_impossible_coefficients(theta: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PerfModel(theta=theta)


@pytest.mark.parametrize("gamma", [0.0, -1.0, math.nan, math.inf, True])
def test_model_rejects_impossible_exponents(gamma: Any) -> None:
    with pytest.raises(ValueError, match="gamma"):
        PerfModel(theta=TRUE.theta, gamma=gamma)


def test_prior_is_in_the_range_measured_for_a_small_dlrm() -> None:
    # docs/model.md, "The prior": a one-core step of the small DLRM ran at ~49-61k samples/s in
    # one process; split over one worker and one PS of one core each it must be slower, but not
    # by 10x.
    x = PRIOR.throughput(Config(1, 1, 1.0, 1.0), 512)
    assert 25_000 < x < 61_000
    # More workers on one PS: throughput grows, but less than linearly.
    assert PRIOR.throughput(Config(8, 1, 1.0, 1.0), 512) < 8 * x


# --- fitting -------------------------------------------------------------------------------


def test_fit_recovers_coefficients_of_data_of_the_model_form() -> None:
    model = fit(_from_model(TRUE, SPREAD))
    assert model.theta == pytest.approx(TRUE.theta, rel=1e-6)
    assert model.pinned == (False,) * 5
    assert model.diagnostics is not None
    assert model.diagnostics.identifiable == (True,) * 5
    assert not model.diagnostics.scale_only
    assert model.diagnostics.max_abs_relative_residual < 1e-9


def test_fit_residuals_are_relative_throughput_errors() -> None:
    observations = bench._measure(
        bench.contention_truth,
        bench._random_configs(np.random.default_rng(3), 10),
        np.random.default_rng(4),
    )
    model = fit(observations)
    d = model.diagnostics
    assert d is not None
    expected = [model.throughput(o.config, o.batch_size) / o.throughput - 1 for o in observations]
    assert d.residuals == pytest.approx(expected, rel=1e-9)
    assert d.mape == pytest.approx(float(np.mean(np.abs(expected))))
    assert d.rmse_relative == pytest.approx(float(np.sqrt(np.mean(np.square(expected)))))
    assert d.max_abs_relative_residual == pytest.approx(max(abs(r) for r in expected))
    assert (d.n_observations, d.n_configs) == (10, 10)


def test_fit_minimises_relative_not_absolute_errors() -> None:
    # Optimality (KKT) of Σ ((T_pred − T_obs) / T_obs)² over θ ≥ 0: the gradient vanishes for
    # every positive coefficient and points inward for a zero one. An unweighted fit, which
    # lets the slowest configurations decide, fails this.
    # The θ are checked at the γ the fit chose, with θ2's column (w/p)^γ·B/λp.
    configs = bench._random_configs(np.random.default_rng(5), 12)
    observations = bench._measure(bench.contention_truth, configs, np.random.default_rng(6))
    model = fit(observations)
    assert model.pinned == (False,) * 5
    columns = np.array(
        [
            [1.0, 512 / c.worker_cpu, load**model.gamma * 512 / c.ps_cpu, load, c.ps]
            for c in configs
            for load in [c.workers / c.ps]
        ]
    )
    t_obs = np.array([o.config.workers * 512 / o.throughput for o in observations])
    weighted = columns / t_obs[:, None]
    relative = columns @ np.array(model.theta) / t_obs - 1
    gradient = weighted.T @ relative
    scale = np.linalg.norm(weighted, axis=0) * np.linalg.norm(relative)
    for j, theta in enumerate(model.theta):
        if theta > 0:
            assert abs(gradient[j]) < 1e-6 * scale[j], THETA_NAMES[j]
        else:
            assert gradient[j] > -1e-6 * scale[j], THETA_NAMES[j]


def test_repeated_observations_average_their_noise() -> None:
    rng = np.random.default_rng(7)
    configs = SPREAD[:6]

    def noisy(repeats: int) -> PerfModel:
        observations = [
            _obs(*c, TRUE.throughput(Config(*c), 512) * math.exp(rng.normal(0, 0.05)))
            for c in configs
            for _ in range(repeats)
        ]
        return fit(observations)

    def error(model: PerfModel) -> float:
        return max(
            abs(model.throughput(Config(*c), 512) / TRUE.throughput(Config(*c), 512) - 1)
            for c in configs
        )

    once, many = noisy(1), noisy(40)
    assert many.diagnostics is not None and many.diagnostics.n_configs == 6
    assert many.diagnostics.n_observations == 240
    assert error(many) < 0.02 < error(once)


def test_zero_observations_return_the_prior_unchanged() -> None:
    assert fit([]) is PRIOR
    custom = PerfModel(theta=(1.0, 0.0, 0.0, 0.0, 0.0))
    assert fit([], prior=custom) is custom


@pytest.mark.parametrize(
    ("observation", "field"),
    [
        (_obs(4, 2, 4.0, 2.0, math.nan), "observations[1].throughput"),
        (_obs(4, 2, 4.0, 2.0, 0.0), "observations[1].throughput"),
        (_obs(4, 2, 4.0, 2.0, -5.0), "observations[1].throughput"),
        (_obs(0, 2, 4.0, 2.0, 1000.0), "observations[1].workers"),
        (_obs(4, 2, math.inf, 2.0, 1000.0), "observations[1].worker_cpu"),
        (_obs(4, 2, 4.0, 2.0, 1000.0, b=-1), "observations[1].batch_size"),
    ],
)
def test_fit_rejects_bad_observations_naming_the_field(
    observation: Observation, field: str
) -> None:
    good = _obs(2, 1, 4.0, 2.0, 50_000.0)
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        fit([good, observation])


# --- the contention exponent γ ---------------------------------------------------------------


def _objective(model: PerfModel, observations: list[Observation]) -> float:
    """The fit's objective, Σ ((T_pred − T_obs) / T_obs)²."""
    return sum(
        (model.iteration_time(o.config, o.batch_size) * o.throughput / (o.config.workers * 512) - 1)
        ** 2
        for o in observations
    )


def test_gamma_is_recovered_from_data_of_the_extended_form() -> None:
    model = fit(_from_model(CONTENDED, SPREAD))
    assert model.gamma == pytest.approx(1.4, abs=1e-9)
    assert model.gamma_pinned is False
    assert model.theta == pytest.approx(CONTENDED.theta, rel=1e-6)
    assert model.diagnostics is not None
    assert model.diagnostics.gamma_identifiable is True
    assert model.diagnostics.max_abs_relative_residual < 1e-9


def test_data_of_the_original_form_keep_gamma_at_one() -> None:
    model = fit(_from_model(TRUE, SPREAD))
    assert model.gamma == 1.0
    assert model.gamma_pinned is False  # searched: nothing beat γ = 1
    assert model.diagnostics is not None and model.diagnostics.gamma_identifiable is True


def test_chosen_gamma_is_the_best_grid_point_and_beats_one_by_the_margin() -> None:
    configs = bench._random_configs(np.random.default_rng(5), 12)
    observations = bench._measure(bench.contention_truth, configs, np.random.default_rng(6))
    model = fit(observations)
    assert model.gamma > 1.0
    # The NNLS at each fixed γ: a prior with that γ, never searched (all θ are identifiable
    # here, so the prior's θ play no part).
    fixed = FitSettings(min_configs_for_exponent=10**6)
    at = {
        round(float(g), 2): fit(observations, dataclasses.replace(PRIOR, gamma=g), settings=fixed)
        for g in FitSettings().exponent_grid()
    }
    assert len(at) == 21 and min(at) == 1.0 and max(at) == 2.0
    assert all(m.pinned == (False,) * 5 for m in at.values())
    best = min(_objective(m, observations) for m in at.values())
    assert _objective(model, observations) == pytest.approx(best, rel=1e-9)
    # The relative RMSE falls by more than 5% against γ = 1.
    assert _objective(model, observations) < 0.95**2 * _objective(at[1.0], observations)


def test_a_small_gain_does_not_move_gamma() -> None:
    observations = bench._measure(
        bench.contention_truth,
        bench._random_configs(np.random.default_rng(5), 12),
        np.random.default_rng(6),
    )
    linear = fit(observations, settings=GAMMA_ONE)
    moved = fit(observations)
    gain = 1 - math.sqrt(_objective(moved, observations) / _objective(linear, observations))
    assert gain > 0.05
    # Asking for more than the gain keeps γ = 1, searched.
    kept = fit(observations, settings=FitSettings(exponent_margin=gain + 0.01))
    assert kept.gamma == 1.0 and kept.gamma_pinned is False
    assert kept.theta == linear.theta


def test_contention_truth_fits_gamma_above_one() -> None:
    # Noiseless, many configurations: the truth's PS cost grows like (w/p)^1.25.
    configs = bench._random_configs(np.random.default_rng(99), 200)
    model = fit([Observation(c, 512, bench.contention_truth(c, 512)) for c in configs])
    assert model.gamma_pinned is False
    assert 1.15 <= model.gamma <= 1.45
    # A dozen noisy measurements: γ > 1 on most seeds (docs/model.md: 27 of 30).
    gammas = [bench.contention_accuracy(seed).model.gamma for seed in range(10)]
    assert gammas[0] > 1.0
    assert sum(g > 1.0 for g in gammas) >= 8
    # The same truth with linear contention: γ stays 1.
    linear = fit([Observation(c, 512, bench.linear_contention_truth(c, 512)) for c in configs])
    assert linear.gamma == 1.0


def test_fit_with_the_gamma_search_is_fast_enough_for_the_planner() -> None:
    # Stage 2 fits on every decision, within 5 ms for the whole decision. 50 distinct
    # configurations (more than a decision sees) with the γ search (21 NNLS) and the overlap
    # form (a dozen starting assignments and a coarse-to-fine γ walk, ~25 NNLS) took 2.5-3.5 ms
    # on the 2-vCPU development VM, the additive form alone about 1 ms; twelve configurations,
    # what benchmarks/planner_speed.py's decision sees, take about half of that. Timed in the
    # CPU the process was given (process_time), not wall time: on a machine busy with other
    # work (two busy loops beside the suite: 7.7 ms of wall time) a fit gets its CPU late,
    # not more of it.
    observations = bench._measure(
        bench.contention_truth,
        bench._random_configs(np.random.default_rng(1), 50),
        np.random.default_rng(2),
    )
    assert fit(observations).gamma_pinned is False
    best = math.inf
    for _ in range(5):
        start = time.process_time()
        fit(observations)
        best = min(best, time.process_time() - start)
    assert best < 0.005


def _contention_at(configs: list[Config], seed: int = 11) -> list[Observation]:
    return bench._measure(bench.contention_truth, configs, np.random.default_rng(seed))  # type: ignore[no-any-return]


ONE_RATIO = [
    Config(2 * p, p, float(lw), float(lp))
    for p, lw, lp in [
        (1, 2, 1),
        (2, 4, 2),
        (3, 8, 3),
        (4, 16, 4),
        (1, 6, 8),
        (2, 12, 1),
        (3, 3, 5),
        (4, 10, 6),
        (1, 14, 2),
        (2, 5, 7),
    ]
]


@pytest.mark.parametrize(
    ("configs", "settings"),
    [
        # Five configurations: fewer than min_configs_for_exponent (6).
        (bench.SINGLE_PS[:5], FitSettings()),
        # Six, but the threshold raised to seven.
        (bench.SINGLE_PS[:6], FitSettings(min_configs_for_exponent=7)),
        # Ten configurations, all at w/p = 2: (w/p)^γ is a constant that θ2 absorbs.
        (ONE_RATIO, FitSettings()),
        # Six spread configurations fit all five θ: γ would leave no configuration spare.
        (bench._random_configs(np.random.default_rng(0), 6), FitSettings()),
    ],
    ids=["too-few-configs", "threshold", "one-w/p-ratio", "no-spare-config"],
)
def test_gamma_is_pinned_when_the_data_cannot_identify_it(
    configs: list[Config], settings: FitSettings
) -> None:
    model = fit(_contention_at(configs), settings=settings)
    assert model.diagnostics is not None and not model.diagnostics.scale_only
    assert model.gamma == 1.0
    assert model.gamma_pinned is True
    assert model.diagnostics.gamma_identifiable is False
    assert model_to_dict(model)["pinned"][GAMMA_NAME] is True


def test_gamma_is_searched_from_min_configs_for_exponent_on() -> None:
    # All at p = 2, so θ4 is pinned and six configurations leave room for θ0..θ3, γ and a spare.
    model = fit(_contention_at(bench.SINGLE_PS[:6]))
    assert model.pinned == (False, False, False, False, True)
    assert model.gamma_pinned is False
    assert model.diagnostics is not None and model.diagnostics.gamma_identifiable is True
    assert model_to_dict(model)["diagnostics"]["identifiable"][GAMMA_NAME] is True


def test_unsearched_gamma_is_the_priors() -> None:
    # A prior fitted with γ = 1.4: its θ2 means the superlinear term, so a pinned γ is its γ.
    prior = dataclasses.replace(PRIOR, gamma=1.4)
    few = fit(_contention_at(bench.SINGLE_PS[:5]), prior=prior)
    assert (few.gamma, few.gamma_pinned) == (1.4, True)
    scale = fit(_contention_at(bench.SINGLE_PS[:2]), prior=prior)
    assert scale.diagnostics is not None and scale.diagnostics.scale_only
    assert (scale.gamma, scale.gamma_pinned) == (1.4, True)


# --- identifiability -----------------------------------------------------------------------


def test_single_ps_count_pins_the_fan_out_term_and_still_predicts_observed_configs() -> None:
    assert {c.ps for c in bench.SINGLE_PS} == {2}
    model, mape_at_observed = bench.single_ps()
    assert model.diagnostics is not None
    assert model.diagnostics.n_configs == len(bench.SINGLE_PS) == 8
    assert model.diagnostics.identifiable[4] is False
    assert model.pinned[4] is True
    assert model.theta[4] == PRIOR.theta[4]
    assert model.pinned[:4] == (False,) * 4
    assert mape_at_observed < 6.0


def test_pinned_coefficient_takes_the_given_prior_not_the_builtin_one() -> None:
    prior = PerfModel(theta=(1e-3, 2e-5, 5e-6, 2e-4, 3.3e-4))
    observations = _from_model(TRUE, [(w, 3, lw, lp) for w, _, lw, lp in SPREAD])
    model = fit(observations, prior=prior)
    assert model.pinned[4] is True
    assert model.theta[4] == 3.3e-4


def test_constant_worker_cpu_attributes_the_constant_to_compute_by_priority() -> None:
    # With λw and B fixed, B/λw is a constant column: θ1 (earlier in FIT_PRIORITY) is fitted
    # and θ0 is pinned.
    observations = _from_model(TRUE, [(w, p, 8.0, lp) for w, p, _, lp in SPREAD])
    model = fit(observations)
    assert model.pinned[0] is True
    assert model.pinned[1] is False
    assert model.theta[0] == PRIOR.theta[0]


def test_weakly_varying_column_is_pinned_or_fitted_by_the_tolerance() -> None:
    # p alternates between 4 and 5: θ4·p is only weakly independent of the other columns.
    observations = _from_model(
        TRUE, [(w, 4 + i % 2, lw, lp) for i, (w, _, lw, lp) in enumerate(SPREAD)]
    )
    assert fit(observations).pinned[4] is False
    strict = fit(observations, settings=FitSettings(identifiability_tolerance=0.5))
    assert strict.pinned[4] is True
    assert strict.theta[4] == PRIOR.theta[4]


@pytest.mark.parametrize("n_configs", [1, 2])
def test_one_or_two_configs_fit_only_a_scale_on_the_prior(n_configs: int) -> None:
    configs = SPREAD[:n_configs]
    observations = [
        _obs(*c, 3.0 * PRIOR.throughput(Config(*c), 512) * f)
        for c in configs
        for f in (0.98, 1.0, 1.02)
    ]
    model = fit(observations)
    assert model.diagnostics is not None
    assert model.diagnostics.scale_only is True
    assert model.diagnostics.n_configs == n_configs
    assert model.pinned == (True,) * 5
    # Three times the prior's throughput is a third of its iteration time, every coefficient.
    ratios = [t / p for t, p in zip(model.theta, PRIOR.theta, strict=True)]
    assert ratios == pytest.approx([ratios[0]] * 5, rel=1e-12)
    assert ratios[0] == pytest.approx(1 / 3, rel=1e-3)
    for c in configs:
        assert model.throughput(Config(*c), 512) == pytest.approx(
            3.0 * PRIOR.throughput(Config(*c), 512), rel=1e-3
        )


def test_a_prior_whose_pinned_part_overshoots_falls_back_to_the_scale_fit() -> None:
    # All samples at p = 4, so θ4 is pinned; this prior's θ4·p alone is 40 ms, several times
    # the observed iteration times. Pinned at that value no free coefficient could help.
    heavy = PerfModel(theta=(1e-3, 2.5e-5, 7e-6, 8e-4, 1e-2))
    configs = [(w, 4, lw, lp) for w, _, lw, lp in SPREAD]
    model = fit(_from_model(TRUE, configs), prior=heavy)
    assert model.diagnostics is not None
    assert model.diagnostics.scale_only is True
    assert model.pinned == (True,) * 5
    assert model.theta[4] < heavy.theta[4] / 2  # the scale shrank the prior


def test_three_configs_keep_a_spare_and_fit_at_most_two_coefficients() -> None:
    model = fit(_from_model(TRUE, SPREAD[:3]))
    assert model.diagnostics is not None
    assert not model.diagnostics.scale_only
    assert sum(not p for p in model.pinned) == 2


def test_fit_settings_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="min_configs_for_full_fit"):
        FitSettings(min_configs_for_full_fit=0)
    with pytest.raises(ValueError, match="identifiability_tolerance"):
        FitSettings(identifiability_tolerance=1.5)
    with pytest.raises(ValueError, match="spare_configs"):
        FitSettings(spare_configs=-1)
    with pytest.raises(ValueError, match="min_configs_for_exponent"):
        FitSettings(min_configs_for_exponent=0)
    with pytest.raises(ValueError, match="max_exponent"):
        FitSettings(max_exponent=0.5)
    with pytest.raises(ValueError, match="exponent_step"):
        FitSettings(exponent_step=0.0)
    with pytest.raises(ValueError, match="exponent_margin"):
        FitSettings(exponent_margin=1.0)
    with pytest.raises(ValueError, match="overlap_margin"):
        FitSettings(overlap_margin=-0.1)
    with pytest.raises(ValueError, match="overlap: must be true or false"):
        FitSettings(overlap=1)  # type: ignore[arg-type]
    for name in ("min_configs_per_branch", "overlap_starts", "overlap_rounds"):
        with pytest.raises(ValueError, match=name):
            FitSettings(**{name: 0})


def test_exponent_grid() -> None:
    grid = FitSettings().exponent_grid()
    assert len(grid) == 21
    assert grid[0] == 1.0 and grid[-1] == pytest.approx(2.0)
    assert list(FitSettings(max_exponent=1.0).exponent_grid()) == [1.0]
    assert list(FitSettings(max_exponent=1.5, exponent_step=0.2).exponent_grid()) == (
        pytest.approx([1.0, 1.2, 1.4])
    )


# --- acceptance: accuracy against truths not of the model's form ---------------------------


def test_contention_truth_mape_on_unseen_configs_is_at_most_ten_percent() -> None:
    result = bench.contention_accuracy(seed=0)
    assert result.n_train == 12 and result.n_test >= 30
    assert result.test_mape <= 10.0
    # With γ every one of the 30 experiments of docs/model.md is within the bound at twelve
    # measurements (worst 9.8%, mean 4.5%); with γ = 1 four were above it (mean 7.3%).
    mapes = [bench.contention_accuracy(seed=s).test_mape for s in range(30)]
    assert max(mapes) <= 10.0
    assert float(np.mean(mapes)) <= 5.0
    linear = [bench.contention_accuracy(s, settings=GAMMA_ONE).test_mape for s in range(30)]
    assert float(np.mean(mapes)) < float(np.mean(linear)) - 2.0


def test_contention_truth_with_eight_measurements() -> None:
    # Eight measurements are not enough for every experiment: 4 of 30 stay above 10%
    # (docs/model.md), so only the mean and the worst case are bounded here. The overlap form
    # wins 3 of these 30 fits on noise and costs the worst seed 12.2% -> 14.4% (experiment 5).
    mapes = [bench.contention_accuracy(seed=s, n_train=8).test_mape for s in range(30)]
    assert float(np.mean(mapes)) <= 7.0
    assert max(mapes) <= 15.0


def test_truths_are_not_of_the_model_form() -> None:
    # If a truth were of the model's form, a noiseless fit on many configs would be exact.
    configs = bench._random_configs(np.random.default_rng(99), 200)
    for truth in (bench.contention_truth, bench.paper_truth):
        model = fit([Observation(c, 512, truth(c, 512)) for c in configs])
        assert model.diagnostics is not None
        assert model.diagnostics.mape > 0.01


def test_paper_curves_are_matched_within_five_percent_each() -> None:
    mapes = [bench.paper_curves(seed).mape_by_curve for seed in range(5)]
    for curve in ("workers", "ps", "worker_cpu", "ps_cpu"):
        assert float(np.mean([m[curve] for m in mapes])) < 5.0, curve


def _gains(values: list[float]) -> np.ndarray:
    return np.diff(np.asarray(values)) / values[0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fitted_model_has_the_paper_curve_shapes(seed: int) -> None:
    model = bench.paper_curves(seed).model

    def along(curve: str) -> list[float]:
        return [model.throughput(c, 512) for c in bench.CURVES[curve]]

    # Workers: near linear at first (2 workers give ~2x), saturating as w/p grows.
    workers = along("workers")
    assert workers[1] / workers[0] > 1.6
    assert np.all(_gains(workers) > 0)
    assert np.all(np.diff(_gains(workers)) < 0)  # concave: each worker adds less
    assert workers[-1] / workers[-2] < 1.03

    # Worker CPU and PS CPU: rising, each core adding less, flat by the end of the range.
    for curve in ("worker_cpu", "ps_cpu"):
        values = along(curve)
        gains = _gains(values)
        assert values[1] > values[0] * 1.05, curve
        assert np.all(gains > 0), curve
        assert np.all(np.diff(gains) < 0), curve
        assert gains[-1] < 0.25 * gains[0], curve

    # PS: rising and saturating too, but the fan-out term θ4·p gives the model an optimum in p
    # (Optimus's point), so past its peak it may dip. Over 30 seeds the dip within 1..8 was at
    # most 3.9% (docs/model.md); a falling curve would be a different shape, not a dip.
    ps = along("ps")
    gains = _gains(ps)
    assert ps[1] > ps[0] * 1.3
    assert np.all(np.diff(gains) < 0)
    peak = int(np.argmax(ps))
    assert peak >= 4
    assert np.all(np.diff(ps[: peak + 1]) > 0)
    assert min(ps[peak:]) >= 0.95 * ps[peak]


# --- the overlap form ----------------------------------------------------------------------

#: Shapes where PIPELINED's worker branch binds (many cores per PS, few per worker) and shapes
#: where its PS branch does (many workers per thin PS): four of each, and some near the tie.
OVERLAP_GRID = [
    (1, 1, 0.5, 1.0),
    (1, 1, 1.0, 1.0),
    (2, 2, 0.75, 0.5),
    (2, 1, 0.5, 2.0),
    (4, 1, 1.0, 0.5),
    (4, 1, 2.0, 0.25),
    (3, 1, 1.5, 1.0),
    (8, 2, 1.0, 0.5),
    (6, 3, 1.0, 1.0),
    (2, 1, 1.0, 1.0),
]


def _branches(model: PerfModel, configs: list[tuple[int, int, float, float]]) -> tuple[int, int]:
    """(worker-bound, PS-bound) counts of ``configs`` under ``model``, from the equation."""
    _, t1, t2, t3, _ = model.theta
    ps_bound = 0
    for w, p, lw, lp in configs:
        worker = t1 * 512 / lw
        ps = t2 * (w / p) ** model.gamma * 512 / lp + t3 * w / p
        ps_bound += ps > worker
    return len(configs) - ps_bound, ps_bound


def test_overlap_iteration_time_is_the_documented_equation() -> None:
    t0, t1, t2, t3, t4 = PIPELINED.theta
    worker_bound = Config(workers=1, ps=1, worker_cpu=0.5, ps_cpu=1.0)
    ps_bound = Config(workers=4, ps=1, worker_cpu=2.0, ps_cpu=0.25)
    # T = θ0 + max(θ1·B/λw, θ2·(w/p)^γ·B/λp + θ3·(w/p)) + θ4·p
    assert PIPELINED.iteration_time(worker_bound, 512) == pytest.approx(
        t0 + t1 * 512 / 0.5 + t4, rel=1e-12
    )
    assert PIPELINED.iteration_time(ps_bound, 512) == pytest.approx(
        t0 + t2 * 4 * 512 / 0.25 + t3 * 4 + t4, rel=1e-12
    )
    additive = dataclasses.replace(PIPELINED, overlap=False)
    for config in (worker_bound, ps_bound):
        assert additive.iteration_time(config, 512) > PIPELINED.iteration_time(config, 512)


def test_fit_recovers_an_overlap_truth() -> None:
    assert min(_branches(PIPELINED, OVERLAP_GRID)) >= 4
    model = fit(_from_model(PIPELINED, OVERLAP_GRID))
    assert model.overlap is True
    assert model.theta == pytest.approx(PIPELINED.theta, rel=1e-6)
    assert model.gamma == 1.0
    assert model.diagnostics is not None and model.diagnostics.overlap_searched
    assert model.diagnostics.max_abs_relative_residual < 1e-9


def test_fit_recovers_an_overlap_truth_with_contention() -> None:
    truth = dataclasses.replace(PIPELINED, theta=(5e-4, 1.8e-5, 2.5e-6, 8e-4, 5e-5), gamma=1.3)
    configs = [*OVERLAP_GRID, (8, 4, 1.0, 0.5), (12, 3, 2.0, 1.0), (5, 5, 0.5, 0.5)]
    assert min(_branches(truth, configs)) >= 4
    model = fit(_from_model(truth, configs))
    assert model.overlap is True
    assert model.gamma == pytest.approx(1.3)
    assert model.theta == pytest.approx(truth.theta, rel=1e-6)


def test_additive_truths_stay_additive() -> None:
    # TRUE and CONTENDED are of the additive form; noiseless, nothing about them is a max.
    for truth in (TRUE, CONTENDED):
        model = fit(_from_model(truth, SPREAD))
        assert model.overlap is False
        assert model.diagnostics is not None and model.diagnostics.overlap_searched


def _noisy(
    model: PerfModel, configs: list[tuple[int, int, float, float]], seed: int
) -> list[Observation]:
    rng = np.random.default_rng(seed)
    return [
        _obs(*c, model.throughput(Config(*c), 512) * math.exp(rng.normal(0, 0.05))) for c in configs
    ]


def test_the_form_is_chosen_right_under_noise_on_most_seeds() -> None:
    # 5% log-normal noise, 300 seeds each. The margin keeps noise from buying the overlap form
    # on additive data; the overlap form still wins on data of its own.
    seeds = range(300)
    # Measured: 0 of 300 for each additive truth, 299 of 300 for the overlap truth.
    for truth in (TRUE, CONTENDED):
        assert sum(fit(_noisy(truth, SPREAD, s)).overlap for s in seeds) <= 3
    assert sum(fit(_noisy(PIPELINED, OVERLAP_GRID, s)).overlap for s in seeds) >= 291


def test_the_alternating_fit_finds_the_best_assignment() -> None:
    # Against brute force: every assignment of 8 configurations to the two branches (256), one
    # NNLS each, judged on the true max. The alternating fit must reach the best objective.
    configs = OVERLAP_GRID[:8]
    settings = FitSettings(max_exponent=1.0, overlap_margin=0.0)
    misses = 0
    for seed in range(60):
        observations = _noisy(PIPELINED, configs, seed)
        model = fit(observations, settings=settings)
        t_obs = np.array([o.config.workers * 512 / o.throughput for o in observations])
        rows = np.array([(1.0, 512 / lw, w / p * 512 / lp, w / p, p) for w, p, lw, lp in configs])
        weighted = rows / t_obs[:, None]
        best = math.inf
        for mask in range(1, 2**8 - 1):
            ps_bound = np.array([(mask >> i) & 1 == 1 for i in range(8)])
            a = weighted.copy()
            a[ps_bound, 1] = 0.0
            a[~ps_bound, 2:4] = 0.0
            theta, _ = nnls(a, np.ones(8))
            candidate = PerfModel(theta=tuple(theta), overlap=True)  # type: ignore[arg-type]
            times = np.array([candidate.iteration_time(Config(*c), 512) for c in configs])
            binds = sum(
                1 for b in _branches(candidate, configs) if b >= settings.min_configs_per_branch
            )
            if binds == 2:
                best = min(best, float(np.sum((times / t_obs - 1) ** 2)))
        # The objective is in time, as the fit's: Σ ((T_pred − T_obs) / T_obs)².
        times = np.array([model.iteration_time(Config(*c), 512) for c in configs])
        achieved = float(np.sum((times / t_obs - 1) ** 2))
        misses += achieved > best * (1 + 1e-6)
    assert misses == 0


def test_overlap_needs_a_configuration_on_each_branch() -> None:
    # Data of the overlap form where the PS branch never binds: nothing says what θ2 and θ3
    # are, so the max has nothing to add and the additive form (with θ2 = θ3 = 0) is kept.
    configs = [(1, 1, 0.25, 1.0), (1, 1, 0.5, 2.0), (2, 2, 0.5, 1.0), (1, 2, 0.25, 1.0)]
    configs += [(2, 1, 0.25, 4.0), (1, 1, 0.75, 4.0), (3, 3, 0.5, 2.0), (1, 1, 1.0, 2.0)]
    assert _branches(PIPELINED, configs) == (8, 0)
    assert fit(_from_model(PIPELINED, configs)).overlap is False
    # One PS-bound configuration more, and the overlap form is identified and exact.
    configs.append((8, 1, 4.0, 0.25))
    assert _branches(PIPELINED, configs) == (8, 1)
    model = fit(_from_model(PIPELINED, configs))
    assert model.overlap is True
    assert model.diagnostics is not None and model.diagnostics.max_abs_relative_residual < 1e-6
    # With two required, one is not enough.
    strict = fit(_from_model(PIPELINED, configs), settings=FitSettings(min_configs_per_branch=2))
    assert strict.overlap is False


def test_overlap_is_not_tried_when_switched_off_or_too_few_configurations() -> None:
    data = _from_model(PIPELINED, OVERLAP_GRID)
    off = fit(data, settings=FitSettings(overlap=False))
    assert off.overlap is False
    assert off.diagnostics is not None and not off.diagnostics.overlap_searched
    few = fit(data[:5])
    assert few.overlap is False
    assert few.diagnostics is not None and not few.diagnostics.overlap_searched


def test_a_scale_only_fit_keeps_the_priors_form() -> None:
    data = _from_model(PIPELINED, OVERLAP_GRID[:2])
    model = fit([dataclasses.replace(o, throughput=o.throughput / 2) for o in data], PIPELINED)
    assert model.overlap is True
    assert model.diagnostics is not None and model.diagnostics.scale_only
    assert model.theta == pytest.approx(tuple(2 * t for t in PIPELINED.theta), rel=1e-9)


# --- files ---------------------------------------------------------------------------------


def test_model_round_trips_through_json() -> None:
    fitted = fit(_from_model(TRUE, SPREAD))
    contended = fit(_from_model(CONTENDED, SPREAD))
    assert contended.gamma == pytest.approx(1.4)
    pipelined = fit(_from_model(PIPELINED, OVERLAP_GRID))
    assert pipelined.overlap
    for model in (fitted, contended, pipelined, PRIOR, fit(_from_model(TRUE, SPREAD[:2]))):
        data = json.loads(json.dumps(model_to_dict(model)))
        assert data["form"] == FORM == "dlrover-kfp/ps-async-v3"
        assert list(data["theta"]) == list(THETA_NAMES)
        assert data[GAMMA_NAME] == model.gamma
        assert data[OVERLAP_NAME] is model.overlap
        assert list(data["pinned"]) == [*THETA_NAMES, GAMMA_NAME]
        assert model_from_dict(data, "m.json") == model


def _assert_rejected(data: dict[str, Any], mutate: Any, source: str, message: str) -> None:
    """``mutate(data)`` makes a file that ``model_from_dict`` rejects with ``message``."""
    mutate(data)
    with pytest.raises(UserInputError) as info:
        model_from_dict(data, source)
    assert str(info.value).startswith(message)


def _v2_dict() -> dict[str, Any]:
    """A file written before the overlap form: no ``overlap`` key nor ``overlap_searched``."""
    data = _valid_dict()
    data["form"] = FORM_V2
    del data[OVERLAP_NAME]
    del data["diagnostics"]["overlap_searched"]
    return data


def _v1_dict() -> dict[str, Any]:
    """A file written before γ: no ``gamma`` key, flags for θ only."""
    data = _v2_dict()
    data["form"] = FORM_V1
    del data[GAMMA_NAME]
    del data["pinned"][GAMMA_NAME]
    del data["diagnostics"]["identifiable"][GAMMA_NAME]
    return data


def test_v1_model_files_are_read_with_gamma_one() -> None:
    data = _v1_dict()
    model = model_from_dict(data, "old.json")
    fitted = fit(_from_model(TRUE, SPREAD))
    assert model.theta == fitted.theta and model.pinned == fitted.pinned
    assert (model.gamma, model.gamma_pinned) == (1.0, True)
    assert model.diagnostics is not None
    assert model.diagnostics.gamma_identifiable is False
    assert model.diagnostics.residuals == fitted.diagnostics.residuals  # type: ignore[union-attr]
    config = Config(12, 3, 8.0, 4.0)
    assert model.throughput(config, 512) == fitted.throughput(config, 512)
    # Written back, it is a v3 file.
    assert model_to_dict(model)["form"] == FORM


def test_v2_model_files_are_read_as_the_additive_form() -> None:
    fitted = fit(_from_model(CONTENDED, SPREAD))
    data = json.loads(json.dumps(model_to_dict(fitted)))
    data["form"] = FORM_V2
    del data[OVERLAP_NAME], data["diagnostics"]["overlap_searched"]
    model = model_from_dict(data, "v2.json")
    assert model.overlap is False
    assert model.diagnostics is not None and model.diagnostics.overlap_searched is False
    assert (model.theta, model.gamma) == (fitted.theta, fitted.gamma)
    config = Config(12, 3, 8.0, 4.0)
    assert model.throughput(config, 512) == fitted.throughput(config, 512)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(overlap=True), "v2.json: key overlap: unknown key"),
        (
            lambda d: d["diagnostics"].update(overlap_searched=True),
            "v2.json: key diagnostics.overlap_searched: unknown key",
        ),
    ],
)
def test_v2_model_files_cannot_carry_v3_keys(mutate: Any, message: str) -> None:
    _assert_rejected(_v2_dict(), mutate, "v2.json", message)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(gamma=1.3), "old.json: key gamma: unknown key"),
        (
            lambda d: d["pinned"].update(gamma=True),
            "old.json: key pinned.gamma: unknown key",
        ),
        (lambda d: d.pop("pinned"), "old.json: key pinned: required key is missing"),
    ],
)
def test_malformed_v1_model_files_name_source_and_key(mutate: Any, message: str) -> None:
    _assert_rejected(_v1_dict(), mutate, "old.json", message)


def _valid_dict() -> dict[str, Any]:
    return json.loads(json.dumps(model_to_dict(fit(_from_model(TRUE, SPREAD)))))  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("theta"), "m.json: key theta: required key is missing"),
        (lambda d: d.pop("form"), "m.json: key form: required key is missing"),
        (lambda d: d.update(form="other/v9"), "m.json: key form: expected"),
        (lambda d: d.pop("gamma"), "m.json: key gamma: required key is missing"),
        (lambda d: d.update(gamma=0.0), "m.json: key gamma: must be > 0"),
        (lambda d: d.update(gamma="1.3"), "m.json: key gamma: expected a finite number"),
        (lambda d: d.pop("overlap"), "m.json: key overlap: required key is missing"),
        (lambda d: d.update(overlap="yes"), "m.json: key overlap: expected true or false"),
        (
            lambda d: d["diagnostics"].pop("overlap_searched"),
            "m.json: key diagnostics.overlap_searched: required key is missing",
        ),
        (
            lambda d: d["pinned"].pop("gamma"),
            "m.json: key pinned.gamma: required key is missing",
        ),
        (
            lambda d: d["diagnostics"]["identifiable"].update(gamma=1),
            "m.json: key diagnostics.identifiable.gamma: expected true or false",
        ),
        (lambda d: d.update(extra=1), "m.json: key extra: unknown key"),
        (
            lambda d: d["theta"].update(theta2_ps_s_per_sample_core=-1.0),
            "m.json: key theta.theta2_ps_s_per_sample_core: must be >= 0",
        ),
        (
            lambda d: d["theta"].update(theta0_overhead_s="1e-3"),
            "m.json: key theta.theta0_overhead_s: expected a finite number",
        ),
        (
            lambda d: d["theta"].pop("theta4_ps_fanout_s"),
            "m.json: key theta.theta4_ps_fanout_s: required key is missing",
        ),
        (
            lambda d: d["pinned"].update(theta3_ps_request_s="yes"),
            "m.json: key pinned.theta3_ps_request_s: expected true or false",
        ),
        (
            lambda d: d["diagnostics"].update(residuals="none"),
            "m.json: key diagnostics.residuals: expected a list",
        ),
        (
            lambda d: d["diagnostics"].update(n_configs=-2),
            "m.json: key diagnostics.n_configs: expected an integer",
        ),
        (
            lambda d: d["diagnostics"]["identifiable"].pop("theta1_worker_s_per_sample_core"),
            "m.json: key diagnostics.identifiable.theta1_worker_s_per_sample_core: required",
        ),
        (
            lambda d: d.update(theta=dict.fromkeys(THETA_NAMES, 0.0)),
            "m.json: key theta: at least one coefficient must be positive",
        ),
    ],
)
def test_malformed_model_files_name_source_and_key(mutate: Any, message: str) -> None:
    _assert_rejected(_valid_dict(), mutate, "m.json", message)


def test_model_file_that_is_not_an_object_is_rejected() -> None:
    with pytest.raises(UserInputError, match=r"^m\.json: key \(top level\): expected an object"):
        model_from_dict([1, 2], "m.json")


HEADER = "workers,ps,worker_cpu,ps_cpu,batch_size,throughput"


def test_csv_parses_rows_in_any_column_order_with_kubernetes_cpu() -> None:
    text = (
        "ps,workers,throughput,batch_size,ps_cpu,worker_cpu\n"
        "2,8,123456.5,512,500m,4\n"
        "\n"
        "1,2,9e4,256,1,2.5\n"
    )
    observations = observations_from_csv(text, "s.csv")
    assert observations == [
        Observation(Config(8, 2, 4.0, 0.5), 512, 123456.5),
        Observation(Config(2, 1, 2.5, 1.0), 256, 90000.0),
    ]


def test_csv_with_only_a_header_has_no_observations() -> None:
    assert observations_from_csv(HEADER + "\n", "s.csv") == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "s.csv: empty, expected a header workers,ps,"),
        ("workers,ps,worker_cpu,ps_cpu,throughput\n", "s.csv:1: missing column(s) batch_size"),
        (HEADER + ",node\n", "s.csv:1: unknown column(s) node"),
        (HEADER + ",ps\n", "s.csv:1: repeated column(s) ps"),
        (HEADER + "\n4,2,4,2,512,1000\n4,x,4,2,512,1000\n", "s.csv:3: column ps: expected a whole"),
        (HEADER + "\n4,2,4,2,512,0\n", "s.csv:2: column throughput: must be finite and > 0"),
        (HEADER + "\n4,2,4,2,512,nan\n", "s.csv:2: column throughput: must be finite and > 0"),
        (HEADER + "\n0,2,4,2,512,10\n", "s.csv:2: column workers: must be > 0"),
        (HEADER + "\n4,2,-4,2,512,10\n", "s.csv:2: column worker_cpu:"),
        (HEADER + "\n4,2,4,2,51.2,10\n", "s.csv:2: column batch_size: expected a whole number"),
        (HEADER + "\n4,2,4,2,512\n", "s.csv:2: expected 6 cells, got 5"),
    ],
)
def test_csv_errors_name_file_line_and_column(text: str, message: str) -> None:
    with pytest.raises(UserInputError) as info:
        observations_from_csv(text, "s.csv")
    assert str(info.value).startswith(message)


def test_nnls_that_stops_early_falls_back_to_bounded_least_squares() -> None:
    """scipy's NNLS raises after its iteration limit (seen on real samples in warm starts);
    the fit then gets the same answer from the bounded solver instead of a crash."""
    from scipy.optimize import nnls  # noqa: PLC0415

    from dlrover_kfp.core.perf_model import solve_nnls  # noqa: PLC0415

    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(300):
        a, b = rng.normal(size=(12, 5)), rng.normal(size=12)
        try:
            nnls(a, b, maxiter=1)
            continue
        except RuntimeError:
            pass
        x, rnorm = solve_nnls(a, b, maxiter=1)
        expected, expected_rnorm = nnls(a, b)
        assert np.all(x >= 0)
        assert x == pytest.approx(expected, abs=1e-6)
        assert rnorm == pytest.approx(expected_rnorm, rel=1e-6)
        checked += 1
    assert checked > 50


# ---------------------------------------------------------------- the CPU terms held to use


def _amdahl_observation(w: int, lw: float, serial: float, work: float = 0.5) -> Observation:
    """One worker-bound measurement of a job whose workers follow Amdahl's law: a step's
    ``work`` core-seconds take ``work · (σ + (1 − σ) / λw)`` seconds and use the cores as a
    worker does, ``work / step`` on average. The PS are fast and nearly idle."""
    step = work * (serial + (1 - serial) / lw)
    batch = 512
    return Observation(
        Config(w, 2, lw, 4.0),
        batch,
        w * batch / step,
        worker_cpu_used=work / step,
        ps_cpu_used=0.1,
    )


def test_cpu_terms_that_claim_more_than_was_used_are_held_to_the_use() -> None:
    """Measured at one shape (8 workers of 16 cores that keep ~4 busy, PS nearly idle), the
    scale fit of the prior spends most of each step on PS work and credits every worker core
    with speed. Held to the measured use, the model sees what the Amdahl truth says: 16
    workers of 8 cores are much faster at the same CPU."""
    serial = 0.2
    here = _amdahl_observation(8, 16.0, serial)
    seen = [here] * 3
    bounded = fit(seen)
    unbounded = fit(seen, settings=FitSettings(usage_bound=False))
    worker_use = 8 * here.worker_cpu_used / here.throughput  # type: ignore[operator]
    ps_use = 2 * here.ps_cpu_used / here.throughput  # type: ignore[operator]
    assert unbounded.theta[2] > 10 * ps_use  # the prior's split: what the bound is for
    assert bounded.theta[1] <= worker_use * 1.1 * (1 + 1e-9)
    assert bounded.theta[2] <= ps_use * 1.1 * (1 + 1e-9)
    # the measured shape is still predicted (θ0 took the rest of the step)
    assert bounded.throughput(here.config, 512) == pytest.approx(here.throughput, rel=0.02)
    there = _amdahl_observation(16, 8.0, serial)
    truth_gain = there.throughput / here.throughput  # 1.67

    def gain(model: PerfModel) -> float:
        return model.throughput(there.config, 512) / model.throughput(here.config, 512)

    assert gain(unbounded) < 1.15
    assert 1.3 < gain(bounded) <= truth_gain * 1.05


@pytest.mark.parametrize("seed", range(20))
def test_the_bound_never_leaves_a_cpu_term_above_the_measured_use(seed: int) -> None:
    """Random measurements of one job's Amdahl workers at 1-4 shapes: θ1 within the largest measured
    worker core-seconds per sample (with the tolerance), θ2 within the PS', and every
    observation still predicted within a factor of two."""
    rng = np.random.default_rng(seed)
    serial = float(rng.uniform(0.0, 0.5))
    seen = []
    for _ in range(int(rng.integers(1, 5))):
        w, lw = int(rng.integers(1, 17)), float(rng.choice([1.0, 2.0, 4.0, 8.0, 16.0]))
        seen.append(_amdahl_observation(w, lw, serial))
    model = fit(seen)
    worker_use = max(o.config.workers * o.worker_cpu_used / o.throughput for o in seen)  # type: ignore[operator]
    ps_use = max(o.config.ps * o.ps_cpu_used / o.throughput for o in seen)  # type: ignore[operator]
    assert model.theta[1] <= worker_use * 1.1 * (1 + 1e-9)
    if model.gamma == 1.0:
        assert model.theta[2] <= ps_use * 1.1 * (1 + 1e-9)
    for o in seen:
        ratio = model.throughput(o.config, o.batch_size) / o.throughput
        assert 0.5 < ratio < 2.0, (o, ratio)


def test_observations_without_cpu_use_fit_as_before() -> None:
    seen = [
        dataclasses.replace(
            _amdahl_observation(8, 16.0, 0.2), worker_cpu_used=None, ps_cpu_used=None
        )
    ]
    assert fit(seen).theta == fit(seen, settings=FitSettings(usage_bound=False)).theta
