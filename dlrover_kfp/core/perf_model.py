"""The resource-performance model: throughput of an asynchronous PS job as a function of its shape.

The planner needs to compare thousands of candidate shapes (workers ``w``, PS ``p``, cores per
worker ``λw``, cores per PS ``λp``) without running them, from a handful of measured ones. It
uses the Optimus asynchronous-PS speed model extended with per-node CPU (docs/model.md) and a
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

The overlap form. The sum above charges a step for the worker's compute *and* for the PS's
service of it, which is right for a worker that waits for its rows before computing. This
project's worker does not: it sends step n+1's lookups before step n's forward pass
(training/step.py, "Pipelining"), so the PS serve one step while the worker computes another,
and a step costs the slower of the two:

    T = θ0 + max(θ1·B/λw, θ2·(w/p)^γ·B/λp + θ3·(w/p)) + θ4·p

Measured on the real trainer (docs/resource-model-fit.md), the sum misses PS-bound shapes by up
to 49%, the max by at most 15%. The max is piecewise linear: once each observation is assigned
to the branch that binds (worker-bound or PS-bound), ``T`` is linear in θ again. The fit
alternates NNLS on an assignment with re-assigning each observation to the branch its fitted
model says is larger, from several starting assignments, and keeps the overlap model only when
it beats the additive one by a margin (see :class:`FitSettings`). A model says which form it is
(``PerfModel.overlap``); model files record it (form v3).

Coefficients the data cannot tell apart (every sample at the same ``p``, say, makes ``θ4·p``
indistinguishable from ``θ0``) are pinned to a prior instead of being fitted to noise, as Pollux
does; with too few distinct configurations only a scale factor on the prior is fitted. γ is
searched only when the data can identify it, and otherwise kept at the prior's (1 for
:data:`PRIOR`).

This module is pure: no I/O; it imports only numpy/scipy, the core package and the error types.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dlrover_kfp.core.observation import Config, Observation
from dlrover_kfp.core.usage import cores_per_sample

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
BoolArray = npt.NDArray[np.bool_]
#: An overlap fit found by :func:`_fit_overlap`: (objective, θ, which rows are PS-bound).
_Candidate = tuple[float, FloatArray, BoolArray]


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
    margin. ``overlap_searched`` says whether the overlap form was fitted and compared with the
    additive one (see :class:`FitSettings`); the model's ``overlap`` says which one won.
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
    overlap_searched: bool = False


@dataclass(frozen=True)
class PerfModel:
    """Coefficients θ0..θ4 and exponent γ of the iteration-time equation, and how they came.

    ``pinned[j]`` is true when θj was not fitted on its own but taken from the prior (possibly
    scaled, when ``diagnostics.scale_only``); ``gamma_pinned`` likewise for γ (taken from the
    prior, not searched). ``diagnostics`` is ``None`` for a model that was never fitted (the
    prior). The default γ = 1 is the original, linear-contention form. ``overlap`` selects the
    equation: false is the additive form (worker and PS time add up), true the overlap form
    (a step costs the larger of the two; see the module's docstring).
    """

    theta: Theta
    pinned: tuple[bool, ...] = (False,) * N_THETA
    diagnostics: FitDiagnostics | None = None
    gamma: float = 1.0
    gamma_pinned: bool = False
    overlap: bool = False

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
        if not isinstance(self.overlap, bool):
            raise ValueError(f"overlap: must be true or false, got {self.overlap!r}")

    def iteration_time(self, config: Config, batch_size: int) -> float:
        """Seconds one worker spends on one batch of ``batch_size`` samples at ``config``."""
        _check_config(config, batch_size, "config")
        # Plain floats: the planner calls this in loops, where numpy's per-call cost dominates.
        t0, t1, t2, t3, t4 = self.theta
        w, p, b = float(config.workers), float(config.ps), float(batch_size)
        load = w / p
        contention = load if self.gamma == 1.0 else load**self.gamma
        worker = t1 * b / config.worker_cpu
        ps = t2 * contention * b / config.ps_cpu + t3 * load
        if self.overlap:
            # T = θ0 + max(θ1·B/λw, θ2·(w/p)^γ·B/λp + θ3·(w/p)) + θ4·p
            return t0 + max(worker, ps) + t4 * p
        # T = θ0 + θ1·B/λw + θ2·(w/p)^γ·B/λp + θ3·(w/p) + θ4·p
        return t0 + worker + ps + t4 * p

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
        worker = t1 * b / lw
        ps = t2 * contention * b / lp + t3 * load
        # Additive: T = θ0 + θ1·B/λw + θ2·(w/p)^γ·B/λp + θ3·(w/p) + θ4·p
        # Overlap:  T = θ0 + max(θ1·B/λw, θ2·(w/p)^γ·B/λp + θ3·(w/p)) + θ4·p
        # (without building an (n, 5) matrix)
        iteration = t0 + (np.maximum(worker, ps) if self.overlap else worker + ps) + t4 * p
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

    ``overlap``: also fit the overlap form (the module's docstring) and keep it when it wins.
    ``overlap_margin``: it wins only if its relative RMSE is below ``1 − overlap_margin`` times
    the additive fit's. Both forms have the same coefficients, but the overlap form also chooses
    which observations are PS-bound, a discrete freedom that buys a little on noise alone.
    ``min_configs_per_branch``: each branch of the max must bind at that many distinct
    configurations or more; a branch that never binds leaves its coefficients free to be
    anything below the other branch, which the planner would then extrapolate. The defaults
    were chosen on held-out error (docs/model.md, experiment 5; docs/resource-model-fit.md):
    on additive truths with 5% noise the additive form is kept in nearly every fit
    (tests/unit/test_perf_model.py); requiring two PS-bound configurations instead of one, or a
    margin of 20%, kept the additive form on the real trainer's 60/40 split, where the training
    part has one PS-bound shape, and doubled its held-out error (5.0% -> 10.7%). The form is
    tried only on full fits (not scale-only) with at least ``min_configs_for_exponent``
    configurations, the same bar as γ's. ``overlap_starts``: how many starting assignments the
    alternating fit tries; ``overlap_rounds``: how many re-assignments each may take. A fit of
    12 configurations takes about 1 ms more than the additive fit alone, 50 about 2 ms.

    ``usage_bound``: where observations carry the workers' CPU use, θ1 may not exceed the
    worker core-seconds per sample measured (the largest ``w · u / X``) times ``1 +
    usage_tolerance``, and θ0 is refitted to the time left (:func:`_bound_by_usage`).
    """

    min_configs_for_full_fit: int = 3
    spare_configs: int = 1
    identifiability_tolerance: float = 0.05
    min_configs_for_exponent: int = 6
    max_exponent: float = 2.0
    exponent_step: float = 0.05
    exponent_margin: float = 0.05
    overlap: bool = True
    overlap_margin: float = 0.1
    min_configs_per_branch: int = 1
    overlap_starts: int = 5
    overlap_rounds: int = 8
    usage_bound: bool = True
    usage_tolerance: float = 0.1

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
        if not isinstance(self.overlap, bool):
            raise ValueError(f"overlap: must be true or false, got {self.overlap!r}")
        if not 0 <= self.overlap_margin < 1:
            raise ValueError(f"overlap_margin: must be in [0, 1), got {self.overlap_margin}")
        if not isinstance(self.usage_bound, bool):
            raise ValueError(f"usage_bound: must be true or false, got {self.usage_bound!r}")
        if not (math.isfinite(self.usage_tolerance) and self.usage_tolerance >= 0):
            raise ValueError(
                f"usage_tolerance: must be finite and >= 0, got {self.usage_tolerance!r}"
            )
        for name in ("min_configs_per_branch", "overlap_starts", "overlap_rounds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")

    def exponent_grid(self) -> FloatArray:
        """The candidate γ: 1, 1 + step, ... up to ``max_exponent`` (1 alone when that is 1)."""
        # The tolerance keeps max_exponent in the grid when rounding puts the quotient a hair
        # below the whole number of steps it is.
        steps = math.floor((self.max_exponent - 1.0) / self.exponent_step + 1e-9)
        grid: FloatArray = 1.0 + self.exponent_step * np.arange(steps + 1, dtype=np.float64)
        return grid


# The prior: what a small DLRM (26 tables × 100k rows × 16 dims) costs on the 2-vCPU machines
# this project was first measured on (docs/model.md, "The prior"). It is only used for
# coefficients the data cannot identify and as the shape of the scale-only fit, so being right
# to within a factor of two is enough.
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


def _predicted_times(model: PerfModel, data: _Design) -> FloatArray:
    """``T_pred`` of every observation under ``model``, whichever its form."""
    w, p, lw, lp, b = data.rows.T
    times: FloatArray = w * b / model.throughput_many(w, p, lw, lp, b)
    return times


def _with_diagnostics(
    model: PerfModel,
    data: _Design,
    *,
    identifiable: tuple[bool, ...],
    scale_only: bool,
    gamma_identifiable: bool,
    overlap_searched: bool,
) -> PerfModel:
    # (X_pred − X_obs) / X_obs = T_obs / T_pred − 1, since X = w·B/T.
    residuals = data.t_obs / _predicted_times(model, data) - 1.0
    diagnostics = FitDiagnostics(
        n_observations=len(residuals),
        n_configs=data.n_configs,
        rmse_relative=float(np.sqrt(np.mean(residuals**2))),
        mape=float(np.mean(np.abs(residuals))),
        max_abs_relative_residual=float(np.max(np.abs(residuals))),
        residuals=tuple(float(r) for r in residuals),
        identifiable=identifiable,
        scale_only=scale_only,
        gamma_identifiable=gamma_identifiable,
        overlap_searched=overlap_searched,
    )
    return dataclasses.replace(model, diagnostics=diagnostics)


def fit(
    observations: Sequence[Observation],
    prior: PerfModel = PRIOR,
    *,
    settings: FitSettings = FitSettings(),  # frozen: a shared default is safe
) -> PerfModel:
    """Fit θ (and γ, when the data identify it) to measured throughputs by weighted NNLS,
    then hold the worker compute term to the CPU the workers were measured to use
    (:func:`_bound_by_usage`, ``settings.usage_bound``). See :func:`_fit_times`."""
    model = _fit_times(observations, prior, settings=settings)
    if not observations or not settings.usage_bound:
        return model
    return _bound_by_usage(model, observations, settings.usage_tolerance)


def _bound_by_usage(
    model: PerfModel, observations: Sequence[Observation], tolerance: float
) -> PerfModel:
    """``model`` with its CPU terms no larger than the CPU measured per sample, θ0 refitted.

    θ1·B/λw is the time a worker's λw cores spend computing a step, so the worker compute term
    claims θ1 core-seconds per sample; a PS's λp cores serve the w/p workers' requests for
    θ2·(w/p)^γ·B/λp of every round of w·B/p samples' worth, so the PS term claims θ2·(w/p)^(γ−1)
    core-seconds per sample. The pods' measured use says what they really spend:

        c_w = max_i (w_i · u_i / X_i)       θ1 <= c_w · (1 + tolerance)
        c_p = max_i (p_i · v_i / X_i / (w_i/p_i)^(γ−1))     θ2 <= c_p · (1 + tolerance)

    (u_i, v_i: mean cores used per worker, per PS). Times alone cannot tell a step's per-sample
    work from its per-step overhead when the pods were measured at one size (θ0 and θ1·B/λw are
    both constants there), and the prior's split (a small θ0) then credits every core with
    speed: a 16-core worker that uses 4 would be modelled as 4x faster per core than it is, and
    the planner would keep few big workers where more, smaller ones are faster at the same CPU
    (PS likewise). With the CPU terms held to the measured use, the rest of each step is θ0,
    the part more cores do not shorten (Amdahl's serial part, a thread cap, waiting), refitted
    by least squares on the same relative residuals as the fit:

        θ0 = max(0, Σ_i (T_i − r_i) / T_i² / Σ_i 1 / T_i²)     r_i: T_pred_i with θ0 = 0

    A model that claims no more than the use is returned as it is.
    """
    theta = np.asarray(model.theta, dtype=np.float64)
    changed = False
    for j, ceiling in (
        (1, cores_per_sample(observations, "worker")),
        (2, cores_per_sample(observations, "ps", model.gamma)),
    ):
        # (no reading, or only idle ones: nothing to hold the term to)
        if ceiling and theta[j] > ceiling * (1.0 + tolerance):
            theta[j] = ceiling * (1.0 + tolerance)
            changed = True
    if not changed:
        return model
    theta[0] = 0.0
    data = _design(observations)
    rest = _predicted_times(dataclasses.replace(model, theta=_as_theta(theta)), data)
    inv = 1.0 / data.t_obs
    theta[0] = max(0.0, float(np.sum((data.t_obs - rest) * inv**2) / np.sum(inv**2)))
    if not any(value > 0 for value in theta):
        return model
    pinned = tuple(
        flag and not (j == 0 or theta[j] != model.theta[j]) for j, flag in enumerate(model.pinned)
    )
    bounded = dataclasses.replace(model, theta=_as_theta(theta), pinned=pinned)
    previous = model.diagnostics
    if previous is None:
        return bounded
    return _with_diagnostics(
        bounded,
        data,
        identifiable=previous.identifiable,
        scale_only=previous.scale_only,
        gamma_identifiable=previous.gamma_identifiable,
        overlap_searched=previous.overlap_searched,
    )


def _fit_times(
    observations: Sequence[Observation],
    prior: PerfModel,
    *,
    settings: FitSettings,
) -> PerfModel:
    """Fit θ (and γ, when the data identify it) to measured throughputs by weighted NNLS.

    Minimises ``Σ ((T_pred_i − T_obs_i) / T_obs_i)²`` over θ ≥ 0: relative residuals, so every
    observation counts the same whatever its speed. Repeated observations of one configuration
    simply average their noise. Zero observations return ``prior`` unchanged; fewer distinct
    configurations than ``settings.min_configs_for_full_fit`` (or no identifiable column) fit
    only ``T = s·T_prior`` (in the prior's form); so does a fit whose pinned part alone
    overshoots some observations when the scale fit matches the data better.

    γ starts at the prior's. When the data can identify it (see :class:`FitSettings`), every
    candidate of ``settings.exponent_grid()`` is tried with the same free coefficients, one NNLS
    each, and the best replaces the prior's γ if it lowers the relative RMSE by more than
    ``settings.exponent_margin``.

    The additive form is fitted first. When ``settings.overlap`` and the data allow it, the
    overlap form is fitted too (same free coefficients, same γ rule; see :func:`_fit_overlap`)
    and replaces the additive model if its relative RMSE is lower by more than
    ``settings.overlap_margin``.

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
    # Scaling every θ scales both branches of the overlap form alike, so this holds for both.
    u = _predicted_times(dataclasses.replace(prior, diagnostics=None), data) / t_obs
    scale = float((u @ ones) / (u @ u))

    def scale_model() -> PerfModel:
        return _with_diagnostics(
            PerfModel(
                theta=_as_theta(prior_theta * scale),
                pinned=(True,) * N_THETA,
                gamma=prior.gamma,
                gamma_pinned=True,
                overlap=prior.overlap,
            ),
            data,
            identifiable=identifiable,
            scale_only=True,
            gamma_identifiable=False,
            overlap_searched=False,
        )

    if n_configs < settings.min_configs_for_full_fit or not any(identifiable):
        return scale_model()

    free = np.array(identifiable)
    # Pinned coefficients keep the prior's value; their contribution leaves the target. θ2's
    # column is never among them when γ is searched, so the target does not depend on γ.
    target = ones - weighted[:, ~free] @ prior_theta[~free]
    free_columns = weighted[:, free]
    solution, rnorm = solve_nnls(free_columns, target)
    gamma = prior.gamma
    gamma_identifiable = _exponent_identifiable(data, identifiable, settings)
    if gamma_identifiable:
        # θ2's position among the free columns.
        k = int(np.count_nonzero(free[:_CONTENTION]))
        best = _search_exponent(free_columns, k, data.load, target, prior.gamma, rnorm, settings)
        if best is not None:
            gamma, solution, rnorm = best
    theta = prior_theta.copy()
    theta[free] = solution
    additive = PerfModel(
        theta=_as_theta(theta),
        pinned=tuple(not f for f in identifiable),
        gamma=gamma,
        gamma_pinned=not gamma_identifiable,
    )
    overlap_searched = (
        settings.overlap
        and n_configs >= settings.min_configs_for_exponent
        and n_configs >= 2 * settings.min_configs_per_branch
    )
    # rnorm² is the additive fit's objective, Σ ((T_pred − T_obs) / T_obs)², at its γ.
    chosen, objective = additive, rnorm**2
    if overlap_searched:
        overlap = _fit_overlap(data, free, prior_theta, prior.gamma, gamma_identifiable, settings)
        # Compared on the same objective, as RMSEs: the margin is a fraction of the RMSE.
        if overlap is not None and math.sqrt(overlap[1]) < (
            1.0 - settings.overlap_margin
        ) * math.sqrt(objective):
            chosen = dataclasses.replace(overlap[0], pinned=additive.pinned)
            objective = overlap[1]
    # When the pinned part of the prior alone overshoots observations (a prior from a heavier
    # job, say), the free coefficients cannot pull the fit back below it, since θ ≥ 0; the
    # scale fit can shrink the prior, so it wins if it then matches the data better.
    overshoot = bool(np.any(target < 0))
    if overshoot and objective > float(np.sum((scale * u - 1.0) ** 2)):
        return scale_model()
    return _with_diagnostics(
        chosen,
        data,
        identifiable=identifiable,
        scale_only=False,
        gamma_identifiable=gamma_identifiable,
        overlap_searched=overlap_searched,
    )


def _fit_overlap(
    data: _Design,
    free: BoolArray,
    prior_theta: FloatArray,
    prior_gamma: float,
    search_gamma: bool,
    settings: FitSettings,
) -> tuple[PerfModel, float] | None:
    """The overlap form fitted by alternating assignment and NNLS, with its objective
    ``Σ ((T_pred − T_obs) / T_obs)²``; ``None`` if no fit qualifies.

    For a fixed assignment of observations to the branch that binds, the overlap equation is
    linear: a PS-bound row keeps the columns of θ0, θ2, θ3, θ4, a worker-bound row those of θ0,
    θ1, θ4. So: solve that NNLS, re-assign each row to the branch the solution makes larger,
    repeat until the assignment is stable (k-planes; each step is evaluated on the true max).
    The starts: every row whose ratio of PS column to worker column is above a threshold is
    PS-bound, for thresholds spread over the observed ratios (the PS branch outgrows the worker
    branch as that ratio grows, whatever θ2/θ1 is), plus all rows worker-bound. γ, when
    searched, is walked over the grid from the best assignment at the prior's γ (a continuation:
    each γ starts from its neighbour's assignment) and moves by the same margin rule as in the
    additive fit. Only models whose branches each bind at ``settings.min_configs_per_branch``
    distinct configurations or more qualify.
    """
    # One row per distinct configuration: its observations share the columns, and for column
    # vector a and observed times t_i,
    #   Σ_i (a·θ/t_i − 1)² = (h·a·θ − g)² + n − g²,  h = sqrt(Σ 1/t_i²),  g = Σ (1/t_i) / h,
    # so the collapsed row h·a with target g has the same objective up to a constant. It also
    # makes "binds at k configurations" a count of rows.
    configs, inverse = np.unique(data.rows, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    inv_t = 1.0 / data.t_obs
    h = np.sqrt(np.bincount(inverse, weights=inv_t**2))
    g = np.bincount(inverse, weights=inv_t) / h
    constant = float(len(inv_t) - np.sum(g**2))
    w, p, lw, lp, b = configs.T
    pinned_theta = prior_theta[~free]

    base = _columns(w, p, lw, lp, b, prior_gamma) * h[:, None]
    log_load = np.log(w / p)

    def design(gamma: float) -> FloatArray:
        # Only θ2's column depends on γ: (w/p)^γ = (w/p)^γ0 · exp((γ − γ0)·log(w/p)).
        if gamma == prior_gamma:
            return base
        rows = base.copy()
        rows[:, _CONTENTION] *= np.exp((gamma - prior_gamma) * log_load)
        return rows

    def qualifies(ps_bound: BoolArray) -> bool:
        n_ps = int(np.count_nonzero(ps_bound))
        return min(n_ps, len(ps_bound) - n_ps) >= settings.min_configs_per_branch

    def solve(rows: FloatArray, ps_bound: BoolArray) -> FloatArray:
        # A worker-bound row drops the PS branch's columns, a PS-bound one the worker's.
        assigned = rows.copy()
        assigned[ps_bound, 1] = 0.0
        assigned[~ps_bound, 2:4] = 0.0
        solution, _ = solve_nnls(assigned[:, free], g - assigned[:, ~free] @ pinned_theta)
        theta = prior_theta.copy()
        theta[free] = solution
        return theta

    def evaluate(rows: FloatArray, theta: FloatArray) -> tuple[float, BoolArray]:
        # The true max, whatever the assignment the θ came from.
        worker = rows[:, 1] * theta[1]
        ps = rows[:, 2] * theta[2] + rows[:, 3] * theta[3]
        predicted = rows[:, 0] * theta[0] + np.maximum(worker, ps) + rows[:, 4] * theta[4]
        return float(np.sum((predicted - g) ** 2)) + constant, ps > worker

    def descend(rows: FloatArray, start: BoolArray, seen: set[bytes]) -> _Candidate | None:
        best: _Candidate | None = None
        assignment = start
        for _ in range(settings.overlap_rounds):
            key = assignment.tobytes()
            if key in seen:
                break
            seen.add(key)
            theta = solve(rows, assignment)
            sse, binds = evaluate(rows, theta)
            if qualifies(binds) and (best is None or sse < best[0]):
                best = (sse, theta, binds)
            if np.array_equal(binds, assignment):
                break
            assignment = binds
        return best

    rows = design(prior_gamma)
    ratio = rows[:, 2] / rows[:, 1]
    levels = np.unique(ratio)
    picks = np.unique(np.linspace(0, len(levels) - 1, settings.overlap_starts).round().astype(int))
    starts = [ratio >= levels[i] for i in picks] + [np.zeros(len(ratio), dtype=bool)]
    seen: set[bytes] = set()
    found_at_prior = [c for c in (descend(rows, start, seen) for start in starts) if c is not None]
    if not found_at_prior:
        return None
    at_prior = min(found_at_prior, key=lambda c: c[0])
    best, gamma = at_prior, prior_gamma
    if search_gamma:
        grid = [float(g) for g in settings.exponent_grid()]

        def at(index: int, start: BoolArray) -> _Candidate | None:
            if abs(grid[index] - prior_gamma) < 1e-12:
                return at_prior
            return descend(design(grid[index]), start, set())

        # Coarse to fine, to keep a decision within the planner's budget: every fourth γ of
        # the grid, each starting from its neighbour's assignment, then the grid points two
        # and one step beside the best so far (10 solves instead of 21 for the default grid).
        stride = 4
        coarse = sorted({*range(0, len(grid), stride), len(grid) - 1})
        found: dict[int, _Candidate] = {}
        previous = at_prior
        for index in coarse:
            candidate = at(index, previous[2])
            if candidate is not None:
                found[index] = previous = candidate
        if found:
            while stride > 1:
                stride //= 2
                centre = min(found, key=lambda i: found[i][0])
                for index in (centre - stride, centre + stride):
                    if 0 <= index < len(grid) and index not in found:
                        candidate = at(index, found[centre][2])
                        if candidate is not None:
                            found[index] = candidate
            chosen = min(found, key=lambda i: found[i][0])
            if math.sqrt(found[chosen][0]) < (1.0 - settings.exponent_margin) * math.sqrt(
                at_prior[0]
            ):
                best, gamma = found[chosen], grid[chosen]
    model = PerfModel(
        theta=_as_theta(best[1]), gamma=gamma, gamma_pinned=not search_gamma, overlap=True
    )
    return model, best[0]


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
        solution, rnorm = solve_nnls(trial, target)
        if rnorm < best_rnorm:
            best, best_rnorm = (float(g), solution, float(rnorm)), float(rnorm)
    if best is None or best_rnorm >= (1.0 - settings.exponent_margin) * reference_rnorm:
        return None
    return best


def solve_nnls(
    a: FloatArray, b: FloatArray, maxiter: int | None = None
) -> tuple[FloatArray, float]:
    """``argmin ||a·x − b||, x >= 0`` and the residual norm.

    scipy's active-set NNLS stops with a RuntimeError after ``maxiter`` iterations (3 x the
    columns by default) on ill-conditioned rows, which real samples produce now and then (seen
    in the cluster simulator's warm starts). Then the same problem goes to the bounded
    least-squares solver, which converges where the active set cycles.
    """
    # Imported here, where the fit runs: scipy.optimize takes 0.4 s, and every `dlrover-kfp`
    # command imports this module (the planner's settings, the model files).
    from scipy.optimize import lsq_linear, nnls  # noqa: PLC0415

    try:
        solution, rnorm = nnls(a, b, maxiter=maxiter)
    except RuntimeError:
        result = lsq_linear(a, b, bounds=(0.0, np.inf), method="bvls")
        solution = np.maximum(result.x, 0.0)
        rnorm = float(np.linalg.norm(a @ solution - b))
    return solution, float(rnorm)


def _as_theta(values: FloatArray) -> Theta:
    t0, t1, t2, t3, t4 = (float(v) for v in values)
    return (t0, t1, t2, t3, t4)
