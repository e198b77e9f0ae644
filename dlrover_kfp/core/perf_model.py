"""The resource-performance model: throughput of an asynchronous PS job as a function of its shape.

The planner needs to compare thousands of candidate shapes (workers ``w``, PS ``p``, cores per
worker ``λw``, cores per PS ``λp``) without running them, from a handful of measured ones. It
uses the Optimus asynchronous-PS speed model extended with per-node CPU (DESIGN.md §4) and a
PS contention exponent γ: one iteration of one worker costs

    T = θ0 + θ1·B/λw + θ2·(w/p)^γ·B/λp + θ3·(w/p) + θ4·p        [seconds]

and the job's throughput is ``X = w·B / T`` samples/s (``B`` is the per-worker batch). γ = 1 is
the original Optimus form; γ > 1 says that a PS's work per sample grows with the number of
workers it serves (lock waits, queueing behind other workers' updates). For a given γ, ``T`` is
linear in ``θ ≥ 0``, so measured throughputs turn into a non-negative least-squares problem on
``T_obs = w·B/X_obs``. Each row is divided by ``T_obs`` so that the residuals are relative
(≈ the relative throughput error): otherwise the slowest configurations, which have the largest
``T``, would decide the fit and the fast ones, which the planner cares about, would not count.
γ is chosen by a grid search around that NNLS, one solve per candidate.

Coefficients the data cannot tell apart (every sample at the same ``p``, say, makes ``θ4·p``
indistinguishable from ``θ0``) are pinned to a prior instead of being fitted to noise, as Pollux
does; with too few distinct configurations only a scale factor on the prior is fitted. γ is
searched only when the data can identify it, and otherwise kept at the prior's (1 for
:data:`PRIOR`).

This module is pure: no I/O; it imports only numpy/scipy, the core package and the error types.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.optimize import nnls

from dlrover_kfp.core.observation import Config, Observation

#: Names of θ0..θ4 in model files, so that a file says what each number means.
THETA_NAMES: tuple[str, str, str, str, str] = (
    "theta0_overhead_s",
    "theta1_worker_s_per_sample_core",
    "theta2_ps_s_per_sample_core",
    "theta3_ps_request_s",
    "theta4_ps_fanout_s",
)
N_THETA = 5

#: Order in which columns are admitted to the fit. The worker compute term comes first because
#: it dominates a DLRM step and its λw-scaling is what the planner trades CPU on; then the PS
#: load term; then the constant overhead, which absorbs whatever the data cannot attribute; the
#: per-request and fan-out terms come last because they are small and the first to be collinear
#: with the others (constant ``p`` makes ``θ4·p`` a constant, constant ``λp`` and ``B`` make
#: ``θ3·w/p`` proportional to ``θ2``'s column).
FIT_PRIORITY: tuple[int, ...] = (1, 2, 0, 3, 4)

Theta = tuple[float, float, float, float, float]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class FitDiagnostics:
    """How well a fitted model reproduces the observations it was fitted on.

    Residuals are relative throughput errors ``(X_pred - X_obs) / X_obs``, one per observation,
    in the order given; ``rmse_relative``, ``mape`` and ``max_abs_relative_residual`` summarise
    them as fractions (0.05 is 5%). ``identifiable[j]`` says whether the data could tell θj's
    column apart from the columns admitted before it (see :data:`FIT_PRIORITY`) with a
    configuration to spare (see :class:`FitSettings`). ``scale_only`` is true when the data were
    too few for a per-coefficient fit and only a factor on the prior was fitted.
    ``gamma_identifiable`` says whether γ was searched (see :class:`FitSettings`); when false it
    is the prior's. It can be true with γ = 1: the search ran and nothing beat γ = 1 by the
    margin.
    """

    n_observations: int
    n_configs: int
    rmse_relative: float
    mape: float
    max_abs_relative_residual: float
    residuals: tuple[float, ...]
    identifiable: tuple[bool, ...]
    scale_only: bool
    gamma_identifiable: bool


@dataclass(frozen=True)
class PerfModel:
    """Coefficients θ0..θ4 and exponent γ of the iteration-time equation, and how they came.

    ``pinned[j]`` is true when θj was not fitted on its own but taken from the prior (possibly
    scaled, when ``diagnostics.scale_only``); ``gamma_pinned`` likewise for γ (taken from the
    prior, not searched). ``diagnostics`` is ``None`` for a model that was never fitted (the
    prior). The default γ = 1 is the original, linear-contention form.
    """

    theta: Theta
    pinned: tuple[bool, ...] = (False,) * N_THETA
    diagnostics: FitDiagnostics | None = None
    gamma: float = 1.0
    gamma_pinned: bool = False

    def __post_init__(self) -> None:
        if len(self.theta) != N_THETA:
            raise ValueError(f"theta: expected {N_THETA} coefficients, got {len(self.theta)}")
        for name, value in zip(THETA_NAMES, self.theta, strict=True):
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"theta.{name}: must be finite and >= 0, got {value!r}")
        # Every column is positive for a valid configuration, so one positive θ keeps T > 0 and
        # the throughput finite.
        if not any(value > 0 for value in self.theta):
            raise ValueError("theta: at least one coefficient must be positive")
        if len(self.pinned) != N_THETA:
            raise ValueError(f"pinned: expected {N_THETA} flags, got {len(self.pinned)}")
        # Any positive exponent keeps every column positive, so T > 0; the fit searches [1, 2].
        if isinstance(self.gamma, bool) or not isinstance(self.gamma, int | float):
            raise ValueError(f"gamma: must be a number, got {self.gamma!r}")
        if not math.isfinite(self.gamma) or self.gamma <= 0:
            raise ValueError(f"gamma: must be finite and > 0, got {self.gamma!r}")

    def iteration_time(self, config: Config, batch_size: int) -> float:
        """Seconds one worker spends on one batch of ``batch_size`` samples at ``config``."""
        _check_config(config, batch_size, "config")
        # Plain floats: the planner calls this in loops, where numpy's per-call cost dominates.
        t0, t1, t2, t3, t4 = self.theta
        w, p, b = float(config.workers), float(config.ps), float(batch_size)
        load = w / p
        contention = load if self.gamma == 1.0 else load**self.gamma
        # T = θ0 + θ1·B/λw + θ2·(w/p)^γ·B/λp + θ3·(w/p) + θ4·p
        return (
            t0
            + t1 * b / config.worker_cpu
            + t2 * contention * b / config.ps_cpu
            + t3 * load
            + t4 * p
        )

    def throughput(self, config: Config, batch_size: int) -> float:
        """Samples/s of the whole job: ``X = w·B / T``."""
        # X = w·B / T
        return config.workers * batch_size / self.iteration_time(config, batch_size)

    def throughput_many(
        self,
        workers: npt.ArrayLike,
        ps: npt.ArrayLike,
        worker_cpu: npt.ArrayLike,
        ps_cpu: npt.ArrayLike,
        batch_size: npt.ArrayLike,
    ) -> FloatArray:
        """:meth:`throughput` over broadcast numpy arrays, for the planner's candidate sweeps.

        One matrix-vector product for the lot: ten thousand candidates take well under a
        millisecond, against the planner's 5 ms decision budget.
        """
        arrays = np.broadcast_arrays(
            *(
                np.asarray(a, dtype=np.float64)
                for a in (workers, ps, worker_cpu, ps_cpu, batch_size)
            )
        )
        for name, array in zip(
            ("workers", "ps", "worker_cpu", "ps_cpu", "batch_size"), arrays, strict=True
        ):
            if not np.all(np.isfinite(array)) or np.any(array <= 0):
                raise ValueError(f"{name}: every value must be finite and > 0")
        w, p, lw, lp, b = arrays
        t0, t1, t2, t3, t4 = self.theta
        load = w / p
        # A power costs several multiplications per element: skip it for the linear form.
        contention = load if self.gamma == 1.0 else load**self.gamma
        # T = θ0 + θ1·B/λw + θ2·(w/p)^γ·B/λp + θ3·(w/p) + θ4·p, without building an (n, 5) matrix
        iteration = t0 + t1 * b / lw + t2 * contention * b / lp + t3 * load + t4 * p
        # X = w·B / T
        result: FloatArray = w * b / iteration
        return result


@dataclass(frozen=True)
class FitSettings:
    """Knobs of :func:`fit`, read once at the edge.

    ``min_configs_for_full_fit``: below this many distinct configurations only a scale factor on
    the prior is fitted. One or two configurations cannot separate worker compute from PS load
    from overhead, and a per-coefficient fit would spend the noise on whichever it likes.

    ``spare_configs``: at most ``n_configs - spare_configs`` coefficients are fitted; the rest
    are pinned to the prior. A fit with as many free coefficients as configurations passes
    exactly through every one and its residuals say nothing, while the coefficients absorb the
    noise. One spare configuration keeps a residual to judge the fit by.

    ``identifiability_tolerance``: a column is admitted to the fit when the part of it that is
    independent of the columns admitted before it (Gram-Schmidt residual, in the weighted
    problem) has at least this fraction of its norm. At 0.05 a coefficient's noise is amplified
    at most ~20x relative to a column orthogonal to the others; below that the fitted value is
    mostly noise and the prior is the better guess.

    ``min_configs_for_exponent``: γ is searched only with at least this many distinct
    configurations, at least two distinct ratios w/p among them (with one ratio ``(w/p)^γ`` is a
    constant factor that θ2 absorbs), θ2's column fitted (γ would otherwise rescale a pinned
    coefficient) and, γ being one more fitted parameter, ``spare_configs`` configurations still
    spare after the free θ and γ. Otherwise γ is the prior's. Six is what the original form's
    own five-coefficient fit needs with its spare: γ is never searched on data too few for that
    (and when all five θ are free, the spare rule asks for a seventh).

    ``max_exponent``, ``exponent_step``: the candidates are 1, 1 + step, ... up to
    ``max_exponent``. Each is one NNLS solve (~10 µs), so the default 21 keep a fit of 50
    observations near half a millisecond, against the planner's 5 ms for a whole decision. The
    range stops at 2: contention quadratic in the load is already a PS that is far past
    saturation, and the planner extrapolates with γ, so a wide range lets noise buy large
    errors far from the data. Below 1 (each extra worker costing a PS less than the previous
    one) is not searched.

    ``exponent_margin``: a candidate replaces the prior's γ only if it lowers the relative RMSE
    of the fit (the objective, ``sqrt(mean(((T_pred − T_obs)/T_obs)²))``) by more than this
    fraction of it. An extra free parameter always lowers the residual a little, and the margin
    keeps noise alone from moving γ in most fits: on data of the γ = 1 form with 5% noise, γ
    moved in 17 of 100 fits of twelve configurations and 30 of 100 of eight (docs/model.md,
    experiment 4). Margins of 10-20% did no better there and lost some of the gain where the
    contention is real.
    """

    min_configs_for_full_fit: int = 3
    spare_configs: int = 1
    identifiability_tolerance: float = 0.05
    min_configs_for_exponent: int = 6
    max_exponent: float = 2.0
    exponent_step: float = 0.05
    exponent_margin: float = 0.05

    def __post_init__(self) -> None:
        if self.min_configs_for_full_fit < 1:
            raise ValueError(
                f"min_configs_for_full_fit: must be >= 1, got {self.min_configs_for_full_fit}"
            )
        if self.spare_configs < 0:
            raise ValueError(f"spare_configs: must be >= 0, got {self.spare_configs}")
        if not 0 < self.identifiability_tolerance < 1:
            raise ValueError(
                "identifiability_tolerance: must be in (0, 1), "
                f"got {self.identifiability_tolerance}"
            )
        if self.min_configs_for_exponent < 1:
            raise ValueError(
                f"min_configs_for_exponent: must be >= 1, got {self.min_configs_for_exponent}"
            )
        if not (math.isfinite(self.max_exponent) and self.max_exponent >= 1):
            raise ValueError(f"max_exponent: must be finite and >= 1, got {self.max_exponent}")
        if not (math.isfinite(self.exponent_step) and self.exponent_step > 0):
            raise ValueError(f"exponent_step: must be finite and > 0, got {self.exponent_step}")
        if not 0 <= self.exponent_margin < 1:
            raise ValueError(f"exponent_margin: must be in [0, 1), got {self.exponent_margin}")

    def exponent_grid(self) -> FloatArray:
        """The candidate γ: 1, 1 + step, ... up to ``max_exponent`` (1 alone when that is 1)."""
        # The tolerance keeps max_exponent in the grid when rounding puts the quotient a hair
        # below the whole number of steps it is.
        steps = math.floor((self.max_exponent - 1.0) / self.exponent_step + 1e-9)
        grid: FloatArray = 1.0 + self.exponent_step * np.arange(steps + 1, dtype=np.float64)
        return grid


# The prior: what a small DLRM (DESIGN.md §3 example: 26 tables × 100k rows × 16 dims) costs on
# the machines measured in DESIGN.md §7. It is only used for coefficients the data cannot
# identify and as the shape of the scale-only fit, so being right to within a factor of two is
# enough.
#
#   θ0 = 0.5 ms   fixed per-iteration cost on the worker, independent of batch and PS: the
#                 framework's step overhead, handing the batch over from the reader, the dense
#                 optimiser step. An estimate, not a measurement: it is small next to the
#                 per-sample terms at B = 512 (≈ 10 ms).
#   θ1 = 20 µs    worker compute per sample on one core (core·s/sample): a one-thread PyTorch
#                 step of the small DLRM ran at ~49-61k samples/s (§7), i.e. ≈ 1/50k s.
#   θ2 = 3 µs     PS work per sample on one core (core·s/sample): embedding lookups and sparse
#                 updates served by a PS. §7: the PS-style step ran at 79-122k samples/s and the
#                 dense part alone at 102-164k, so the embedding part is 1/79k − 1/102k ≈ 2.9 µs
#                 to 1/122k − 1/164k ≈ 2.1 µs; moving the rows to a PS process added ~0.3 ms
#                 per 512-batch (≈ 0.6 µs/sample). It is multiplied by w/p because each PS
#                 serves the rows of w/p workers.
#   θ3 = 0.2 ms   per-request cost at a PS, paid once per worker it serves per iteration (so
#                 multiplied by w/p): a TCP loopback round trip of a batch's rows took
#                 171-184 µs (§7).
#   θ4 = 50 µs    per-PS fan-out cost on the worker: each iteration contacts every PS, and each
#                 extra PS adds a wake-up and a straggler chance; waking a process on another
#                 core took ~44 µs (§7).
#   γ  = 1        no contention beyond the linear load: §7 measured one worker per PS, which
#                 says nothing about how a PS slows down with more; the data decide.
PRIOR = PerfModel(
    theta=(5e-4, 2e-5, 3e-6, 2e-4, 5e-5), pinned=(True,) * N_THETA, gamma=1.0, gamma_pinned=True
)

#: Column of θ2, the one that γ changes.
_CONTENTION = 2


def _columns(
    w: FloatArray, p: FloatArray, lw: FloatArray, lp: FloatArray, b: FloatArray, gamma: float
) -> FloatArray:
    """The design matrix: column j multiplies θj in ``T``.

    T = θ0·1 + θ1·B/λw + θ2·(w/p)^γ·B/λp + θ3·(w/p) + θ4·p

    Only θ2's column takes γ. θ3·(w/p) is the per-request cost, and a PS receives exactly w/p
    requests per iteration however busy it is: the count is arithmetic, not contention. What
    grows faster than the load under contention is the time each request's rows take (lock
    waits, queueing behind other workers' updates), which is the per-sample PS work of θ2.
    Keeping θ3 linear also lets the fit mix a linear and a superlinear part of the PS cost, so
    that γ only has to describe the excess over linear, and keeps the search one column wide.
    """
    load = w / p
    contention = load if gamma == 1.0 else load**gamma
    return np.column_stack([np.ones_like(w), b / lw, contention * b / lp, load, p])


def _check_config(config: Config, batch_size: int, where: str) -> None:
    """Reject values that would make the equation meaningless, naming the field."""
    checks: tuple[tuple[str, float], ...] = (
        ("workers", config.workers),
        ("ps", config.ps),
        ("worker_cpu", config.worker_cpu),
        ("ps_cpu", config.ps_cpu),
        ("batch_size", batch_size),
    )
    for name, value in checks:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{where}.{name}: must be a number, got {value!r}")
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{where}.{name}: must be finite and > 0, got {value!r}")


@dataclass(frozen=True)
class _Design:
    """The observations as arrays: ``rows`` is (n, 5) of w, p, λw, λp, B."""

    rows: FloatArray
    t_obs: FloatArray
    n_configs: int

    def columns(self, gamma: float) -> FloatArray:
        w, p, lw, lp, b = self.rows.T
        return _columns(w, p, lw, lp, b, gamma)

    @property
    def load(self) -> FloatArray:
        """w/p per observation."""
        load: FloatArray = self.rows[:, 0] / self.rows[:, 1]
        return load


def _design(observations: Sequence[Observation]) -> _Design:
    """Observed iteration times ``T_obs = w·B/X`` and the number of distinct configs."""
    for i, obs in enumerate(observations):
        _check_config(obs.config, obs.batch_size, f"observations[{i}]")
        x = obs.throughput
        if isinstance(x, bool) or not isinstance(x, int | float):
            raise ValueError(f"observations[{i}].throughput: must be a number, got {x!r}")
        if not math.isfinite(x) or x <= 0:
            raise ValueError(f"observations[{i}].throughput: must be finite and > 0, got {x!r}")
    rows = np.array(
        [
            (o.config.workers, o.config.ps, o.config.worker_cpu, o.config.ps_cpu, o.batch_size)
            for o in observations
        ],
        dtype=np.float64,
    )
    throughput = np.array([o.throughput for o in observations], dtype=np.float64)
    # A different batch size is a different point of the equation, so it counts as a config.
    n_configs = len({tuple(row) for row in rows.tolist()})
    return _Design(rows=rows, t_obs=rows[:, 0] * rows[:, 4] / throughput, n_configs=n_configs)


def _identifiable(weighted: FloatArray, tolerance: float, max_free: int) -> tuple[bool, ...]:
    """Which weighted columns carry information the higher-priority columns do not.

    Modified Gram-Schmidt in :data:`FIT_PRIORITY` order: a column is admitted when its component
    orthogonal to the admitted ones keeps at least ``tolerance`` of its norm, until ``max_free``
    columns are admitted. Exact collinearity (all samples at one ``p``) leaves ~1e-16; real but
    weak variation leaves more than 0.05.
    """
    basis: list[FloatArray] = []
    admitted = [False] * N_THETA
    for j in FIT_PRIORITY:
        if len(basis) >= max_free:
            break
        column = weighted[:, j]
        norm = float(np.linalg.norm(column))
        if norm == 0.0:
            continue
        rest = column.copy()
        for _ in range(2):  # twice: one pass loses orthogonality when columns nearly coincide
            for q in basis:
                rest -= (q @ rest) * q
        independent = float(np.linalg.norm(rest))
        if independent / norm >= tolerance:
            admitted[j] = True
            basis.append(rest / independent)
    return tuple(admitted)


def _relative_residuals(theta: FloatArray, columns: FloatArray, t_obs: FloatArray) -> FloatArray:
    """``(X_pred - X_obs) / X_obs``, which equals ``T_obs / T_pred - 1`` since X = w·B/T."""
    t_pred = columns @ theta
    residuals: FloatArray = t_obs / t_pred - 1.0
    return residuals


def _diagnostics(
    theta: FloatArray,
    columns: FloatArray,
    t_obs: FloatArray,
    *,
    n_configs: int,
    identifiable: tuple[bool, ...],
    scale_only: bool,
    gamma_identifiable: bool,
) -> FitDiagnostics:
    residuals = _relative_residuals(theta, columns, t_obs)
    return FitDiagnostics(
        n_observations=len(t_obs),
        n_configs=n_configs,
        rmse_relative=float(np.sqrt(np.mean(residuals**2))),
        mape=float(np.mean(np.abs(residuals))),
        max_abs_relative_residual=float(np.max(np.abs(residuals))),
        residuals=tuple(float(r) for r in residuals),
        identifiable=identifiable,
        scale_only=scale_only,
        gamma_identifiable=gamma_identifiable,
    )


def fit(
    observations: Sequence[Observation],
    prior: PerfModel = PRIOR,
    *,
    settings: FitSettings = FitSettings(),  # frozen: a shared default is safe
) -> PerfModel:
    """Fit θ (and γ, when the data identify it) to measured throughputs by weighted NNLS.

    Minimises ``Σ ((T_pred_i − T_obs_i) / T_obs_i)²`` over θ ≥ 0: relative residuals, so every
    observation counts the same whatever its speed. Repeated observations of one configuration
    simply average their noise. Zero observations return ``prior`` unchanged; fewer distinct
    configurations than ``settings.min_configs_for_full_fit`` (or no identifiable column) fit
    only ``T = s·T_prior``; so does a fit whose pinned part alone overshoots some observations
    when the scale fit matches the data better.

    γ starts at the prior's. When the data can identify it (see :class:`FitSettings`), every
    candidate of ``settings.exponent_grid()`` is tried with the same free coefficients, one NNLS
    each, and the best replaces the prior's γ if it lowers the relative RMSE by more than
    ``settings.exponent_margin``.

    Raises ``ValueError`` naming the field when an observation is non-positive or non-finite.
    """
    if not observations:
        return prior
    data = _design(observations)
    t_obs, n_configs = data.t_obs, data.n_configs
    columns = data.columns(prior.gamma)
    # Row weights 1/T_obs: the weighted target is all ones and residuals are relative.
    weighted = columns / t_obs[:, None]
    ones = np.ones(len(t_obs), dtype=np.float64)
    prior_theta = np.asarray(prior.theta, dtype=np.float64)
    # Which coefficients are free is decided once, at the prior's γ, and holds for every
    # candidate γ: a γ ≠ 1 makes θ2's column differ from θ3's even when λp and B are constant,
    # and the search must not buy a free coefficient that way.
    identifiable = _identifiable(
        weighted, settings.identifiability_tolerance, n_configs - settings.spare_configs
    )

    # Scale-only: T = s·T_prior, s minimising Σ (s·u_i − 1)² with u_i = T_prior_i / T_obs_i.
    u = weighted @ prior_theta
    scaled = prior_theta * float((u @ ones) / (u @ u))
    scale_model = PerfModel(
        theta=_as_theta(scaled),
        pinned=(True,) * N_THETA,
        diagnostics=_diagnostics(
            scaled,
            columns,
            t_obs,
            n_configs=n_configs,
            identifiable=identifiable,
            scale_only=True,
            gamma_identifiable=False,
        ),
        gamma=prior.gamma,
        gamma_pinned=True,
    )
    if n_configs < settings.min_configs_for_full_fit or not any(identifiable):
        return scale_model

    free = np.array(identifiable)
    # Pinned coefficients keep the prior's value; their contribution leaves the target. θ2's
    # column is never among them when γ is searched, so the target does not depend on γ.
    target = ones - weighted[:, ~free] @ prior_theta[~free]
    free_columns = weighted[:, free]
    solution, rnorm = nnls(free_columns, target)
    gamma = prior.gamma
    gamma_identifiable = _exponent_identifiable(data, identifiable, settings)
    if gamma_identifiable:
        # θ2's position among the free columns.
        k = int(np.count_nonzero(free[:_CONTENTION]))
        best = _search_exponent(free_columns, k, data.load, target, prior.gamma, rnorm, settings)
        if best is not None:
            gamma, solution, rnorm = best
            columns = data.columns(gamma)
    theta = prior_theta.copy()
    theta[free] = solution
    # When the pinned part of the prior alone overshoots observations (a prior from a heavier
    # job, say), the free coefficients cannot pull the fit back below it, since θ ≥ 0; the
    # scale fit can shrink the prior, so it wins if it then matches the data better. rnorm² is
    # the fit's objective, Σ ((T_pred − T_obs) / T_obs)², at the chosen γ.
    overshoot = bool(np.any(target < 0))
    if not np.any(theta > 0) or (overshoot and rnorm**2 > _sse(scaled, weighted)):
        return scale_model
    return PerfModel(
        theta=_as_theta(theta),
        pinned=tuple(not f for f in identifiable),
        diagnostics=_diagnostics(
            theta,
            columns,
            t_obs,
            n_configs=n_configs,
            identifiable=identifiable,
            scale_only=False,
            gamma_identifiable=gamma_identifiable,
        ),
        gamma=gamma,
        gamma_pinned=not gamma_identifiable,
    )


def _exponent_identifiable(
    data: _Design, identifiable: tuple[bool, ...], settings: FitSettings
) -> bool:
    """Whether the data can tell γ apart from θ2 and the noise (see :class:`FitSettings`)."""
    if len(settings.exponent_grid()) < 2:
        return False
    return (
        data.n_configs >= settings.min_configs_for_exponent
        and identifiable[_CONTENTION]
        # γ is one more fitted parameter: it must leave spare_configs configurations spare.
        and sum(identifiable) + 1 <= data.n_configs - settings.spare_configs
        and len(np.unique(data.load)) >= 2
    )


def _search_exponent(
    free_columns: FloatArray,
    k: int,
    load: FloatArray,
    target: FloatArray,
    reference: float,
    reference_rnorm: float,
    settings: FitSettings,
) -> tuple[float, FloatArray, float] | None:
    """The grid γ with the smallest residual, if it beats ``reference`` by the margin.

    ``free_columns`` are the weighted free columns at γ = ``reference``, θ2's at index ``k``;
    a candidate γ multiplies that column by ``(w/p)^(γ − reference)`` and solves one NNLS.
    Returns ``(γ, free coefficients, residual norm)``, or ``None`` to keep ``reference``.
    """
    grid = settings.exponent_grid()
    grid = grid[np.abs(grid - reference) > 1e-12]
    # One exp for the whole grid: factors[i, g] = load_i ** (grid_g − reference).
    factors = np.exp(np.outer(np.log(load), grid - reference))
    at_reference = free_columns[:, k].copy()
    trial = free_columns.copy()
    best: tuple[float, FloatArray, float] | None = None
    best_rnorm = reference_rnorm
    for g, factor in zip(grid, factors.T, strict=True):
        trial[:, k] = at_reference * factor
        solution, rnorm = nnls(trial, target)
        if rnorm < best_rnorm:
            best, best_rnorm = (float(g), solution, float(rnorm)), float(rnorm)
    if best is None or best_rnorm >= (1.0 - settings.exponent_margin) * reference_rnorm:
        return None
    return best


def _sse(theta: FloatArray, weighted: FloatArray) -> float:
    """The fit's objective: Σ ((T_pred − T_obs) / T_obs)²."""
    return float(np.sum((weighted @ theta - 1.0) ** 2))


def _as_theta(values: FloatArray) -> Theta:
    t0, t1, t2, t3, t4 = (float(v) for v in values)
    return (t0, t1, t2, t3, t4)
