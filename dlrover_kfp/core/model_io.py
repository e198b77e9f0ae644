"""Text forms of the resource-performance model: model files (JSON) and measured samples (CSV).

Kept apart from :mod:`dlrover_kfp.core.perf_model` so that the equation and its fit stay free of
file-format concerns. Pure: parses and renders already-read text or parsed JSON, no I/O. Every
error is a :class:`~dlrover_kfp.errors.UserInputError` that names the source and the key, line
or column.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from typing import Any

from dlrover_kfp.core.observation import Config, Observation
from dlrover_kfp.core.perf_model import N_THETA, THETA_NAMES, FitDiagnostics, PerfModel
from dlrover_kfp.core.quantity import parse_cpu
from dlrover_kfp.errors import UserInputError

#: The model file's ``form``: bumps when the equation (not just the coefficients) changes.
#: v2 added the contention exponent γ (the ``gamma`` key); v3 the overlap form (the ``overlap``
#: key, and ``diagnostics.overlap_searched``).
FORM = "dlrover-kfp/ps-async-v3"

#: The previous forms, still read: v2 (with γ) and v1 (without, so γ = 1, which is what it
#: meant). Both describe the additive equation, so they are read with ``overlap`` false.
FORM_V2 = "dlrover-kfp/ps-async-v2"
FORM_V1 = "dlrover-kfp/ps-async-v1"

#: Key of the equation's form in a v3 file: true for the overlap form.
OVERLAP_NAME = "overlap"

#: Key of γ in model files: the value at the top level, its flags in ``pinned`` and in
#: ``diagnostics.identifiable`` next to the θ names.
GAMMA_NAME = "gamma"

#: Header of the samples CSV, in the order ``model fit`` documents it.
CSV_COLUMNS: tuple[str, ...] = ("workers", "ps", "worker_cpu", "ps_cpu", "batch_size", "throughput")

# ---------------------------------------------------------------------------------------------
# Model files: {"form": FORM, "theta": {name: value}, "gamma": γ, "overlap": bool,
# "pinned": {name: bool}, "diagnostics": ...}; the flags of γ sit next to the θ's under the
# name "gamma".

#: The flags' keys in a v2 or v3 file (in ``pinned`` and ``diagnostics.identifiable``).
_FLAG_NAMES: tuple[str, ...] = (*THETA_NAMES, GAMMA_NAME)


def model_to_dict(model: PerfModel) -> dict[str, Any]:
    """The JSON form of a model (:data:`FORM`); θ and flags are keyed by name so that a file
    explains itself."""
    diagnostics: dict[str, Any] | None = None
    if model.diagnostics is not None:
        d = model.diagnostics
        diagnostics = {
            "n_observations": d.n_observations,
            "n_configs": d.n_configs,
            "rmse_relative": d.rmse_relative,
            "mape": d.mape,
            "max_abs_relative_residual": d.max_abs_relative_residual,
            "residuals": list(d.residuals),
            "identifiable": dict(
                zip(_FLAG_NAMES, (*d.identifiable, d.gamma_identifiable), strict=True)
            ),
            "scale_only": d.scale_only,
            "overlap_searched": d.overlap_searched,
        }
    return {
        "form": FORM,
        "theta": dict(zip(THETA_NAMES, model.theta, strict=True)),
        GAMMA_NAME: model.gamma,
        OVERLAP_NAME: model.overlap,
        "pinned": dict(zip(_FLAG_NAMES, (*model.pinned, model.gamma_pinned), strict=True)),
        "diagnostics": diagnostics,
    }


def _mapping(value: object, source: str, key: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise UserInputError(f"{source}: key {key}: expected an object, got {value!r}")
    return value


def _exact_keys(data: Mapping[str, Any], expected: Sequence[str], source: str, key: str) -> None:
    prefix = f"{key}." if key else ""
    for name in expected:
        if name not in data:
            raise UserInputError(f"{source}: key {prefix}{name}: required key is missing")
    for name in data:
        if name not in expected:
            raise UserInputError(f"{source}: key {prefix}{name}: unknown key")


#: Bounds on what a model file may say. The fit searches γ in [1, 2] by default; up to 8 leaves
#: room for a wider search while (w/p)**γ stays finite for any cluster. A coefficient is seconds
#: (per sample, per core...): beyond 10**6 s, or with none above 10**-12, the predictions are
#: no longer finite (an overflow, a throughput of infinity), and a file saying so is corrupt.
MAX_GAMMA = 8.0
MAX_THETA = 1e6
MIN_LARGEST_THETA = 1e-12


def _number(value: object, source: str, key: str, *, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UserInputError(f"{source}: key {key}: expected a finite number, got {value!r}")
    try:
        number = float(value)  # an int of any size is valid JSON
    except OverflowError:
        raise UserInputError(f"{source}: key {key}: expected a finite number, too large") from None
    if not math.isfinite(number):
        raise UserInputError(f"{source}: key {key}: expected a finite number, got {value!r}")
    if minimum is not None and number < minimum:
        raise UserInputError(f"{source}: key {key}: must be >= {minimum:g}, got {value!r}")
    return number


def _count(value: object, source: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UserInputError(f"{source}: key {key}: expected an integer >= 0, got {value!r}")
    return value


def _flag(value: object, source: str, key: str) -> bool:
    if not isinstance(value, bool):
        raise UserInputError(f"{source}: key {key}: expected true or false, got {value!r}")
    return value


def _named_flags(value: object, source: str, key: str, names: Sequence[str]) -> tuple[bool, ...]:
    flags = _mapping(value, source, key)
    _exact_keys(flags, names, source, key)
    return tuple(_flag(flags[name], source, f"{key}.{name}") for name in names)


def _diagnostics_from_dict(
    value: object, source: str, names: Sequence[str], *, with_overlap: bool
) -> FitDiagnostics:
    """``names``: the keys of ``identifiable``; a v1 file has no γ, which was then not fitted.
    ``with_overlap``: a v3 file, which says whether the overlap form was searched."""
    fields: tuple[str, ...] = (
        "n_observations",
        "n_configs",
        "rmse_relative",
        "mape",
        "max_abs_relative_residual",
        "residuals",
        "identifiable",
        "scale_only",
    )
    if with_overlap:
        fields = (*fields, "overlap_searched")
    data = _mapping(value, source, "diagnostics")
    _exact_keys(data, fields, source, "diagnostics")
    identifiable = _named_flags(data["identifiable"], source, "diagnostics.identifiable", names)
    residuals = data["residuals"]
    if not isinstance(residuals, list):
        raise UserInputError(
            f"{source}: key diagnostics.residuals: expected a list, got {residuals!r}"
        )
    return FitDiagnostics(
        n_observations=_count(data["n_observations"], source, "diagnostics.n_observations"),
        n_configs=_count(data["n_configs"], source, "diagnostics.n_configs"),
        rmse_relative=_number(
            data["rmse_relative"], source, "diagnostics.rmse_relative", minimum=0
        ),
        mape=_number(data["mape"], source, "diagnostics.mape", minimum=0),
        max_abs_relative_residual=_number(
            data["max_abs_relative_residual"],
            source,
            "diagnostics.max_abs_relative_residual",
            minimum=0,
        ),
        residuals=tuple(
            _number(r, source, f"diagnostics.residuals[{i}]") for i, r in enumerate(residuals)
        ),
        identifiable=identifiable[:N_THETA],
        scale_only=_flag(data["scale_only"], source, "diagnostics.scale_only"),
        gamma_identifiable=len(identifiable) > N_THETA and identifiable[N_THETA],
        overlap_searched=with_overlap
        and _flag(data["overlap_searched"], source, "diagnostics.overlap_searched"),
    )


def model_from_dict(data: object, source: str) -> PerfModel:
    """Validate a parsed model file; errors name ``source`` and the offending key.

    Reads :data:`FORM` and the older :data:`FORM_V2` and :data:`FORM_V1`, both of the additive
    equation (``overlap`` false). A v1 file has no ``gamma``: its equation is the one with
    γ = 1, so it is read as such, with γ marked pinned (it was not fitted).
    """
    root = _mapping(data, source, "(top level)")
    if "form" not in root:
        raise UserInputError(f"{source}: key form: required key is missing")
    form = root["form"]
    if form == FORM:
        names: tuple[str, ...] = _FLAG_NAMES
        keys: tuple[str, ...] = ("form", "theta", GAMMA_NAME, OVERLAP_NAME, "pinned")
    elif form == FORM_V2:
        names = _FLAG_NAMES
        keys = ("form", "theta", GAMMA_NAME, "pinned")
    elif form == FORM_V1:
        names = THETA_NAMES
        keys = ("form", "theta", "pinned")
    else:
        raise UserInputError(
            f"{source}: key form: expected {FORM!r} (or the older {FORM_V2!r} or "
            f"{FORM_V1!r}), got {form!r}"
        )
    _exact_keys(root, (*keys, "diagnostics"), source, "")
    theta_map = _mapping(root["theta"], source, "theta")
    _exact_keys(theta_map, THETA_NAMES, source, "theta")
    values = [_number(theta_map[n], source, f"theta.{n}", minimum=0) for n in THETA_NAMES]
    if not any(v > 0 for v in values):
        raise UserInputError(f"{source}: key theta: at least one coefficient must be positive")
    for name, value in zip(THETA_NAMES, values, strict=True):
        if value > MAX_THETA:
            raise UserInputError(
                f"{source}: key theta.{name}: must be <= {MAX_THETA:g} s, got {value!r}"
            )
    if max(values) < MIN_LARGEST_THETA:
        raise UserInputError(
            f"{source}: key theta: every coefficient is below {MIN_LARGEST_THETA:g} s "
            "(the model would predict an infinite throughput)"
        )
    gamma = 1.0
    if GAMMA_NAME in keys:
        gamma = _number(root[GAMMA_NAME], source, GAMMA_NAME)
        if not 0 < gamma <= MAX_GAMMA:
            raise UserInputError(
                f"{source}: key {GAMMA_NAME}: must be > 0 and <= {MAX_GAMMA:g}, got {gamma!r}"
            )
    overlap = OVERLAP_NAME in keys and _flag(root[OVERLAP_NAME], source, OVERLAP_NAME)
    pinned = _named_flags(root["pinned"], source, "pinned", names)
    diagnostics = None
    if root["diagnostics"] is not None:
        diagnostics = _diagnostics_from_dict(
            root["diagnostics"], source, names, with_overlap=form == FORM
        )
    return PerfModel(
        theta=(values[0], values[1], values[2], values[3], values[4]),
        pinned=pinned[:N_THETA],
        diagnostics=diagnostics,
        gamma=gamma,
        gamma_pinned=len(pinned) == N_THETA or pinned[N_THETA],
        overlap=overlap,
    )


# ---------------------------------------------------------------------------------------------
# Samples CSV


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise ValueError(f"must be > 0, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"must be finite and > 0, got {text!r}")
    return value


def observations_from_csv(text: str, source: str) -> list[Observation]:
    """Parse measured samples; the header must name exactly the :data:`CSV_COLUMNS`.

    Columns may come in any order, but every one must be present and no other allowed, so that
    a misspelt column is reported rather than ignored. CPU cells accept Kubernetes notation
    (``500m``). Blank lines are skipped. Errors read ``<source>:<line>: column <name>: <problem>``.
    """
    reader = csv.reader(text.splitlines())
    header: list[str] | None = None
    for header_row in reader:
        if any(cell.strip() for cell in header_row):
            header = [cell.strip() for cell in header_row]
            break
    if header is None:
        raise UserInputError(f"{source}: empty, expected a header {','.join(CSV_COLUMNS)}")
    line = reader.line_num
    missing = [c for c in CSV_COLUMNS if c not in header]
    unknown = [c for c in header if c not in CSV_COLUMNS]
    duplicated = sorted({c for c in header if header.count(c) > 1})
    if missing or unknown or duplicated:
        problems = []
        if missing:
            problems.append(f"missing column(s) {', '.join(missing)}")
        if unknown:
            problems.append(f"unknown column(s) {', '.join(unknown)}")
        if duplicated:
            problems.append(f"repeated column(s) {', '.join(duplicated)}")
        raise UserInputError(
            f"{source}:{line}: {'; '.join(problems)} (expected {','.join(CSV_COLUMNS)})"
        )
    index = {name: header.index(name) for name in CSV_COLUMNS}
    observations: list[Observation] = []
    for row in reader:
        line = reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise UserInputError(f"{source}:{line}: expected {len(header)} cells, got {len(row)}")
        cells = {name: row[i].strip() for name, i in index.items()}
        parsed: dict[str, float] = {}
        for name in CSV_COLUMNS:
            try:
                if name in ("workers", "ps", "batch_size"):
                    parsed[name] = _positive_int(cells[name])
                elif name in ("worker_cpu", "ps_cpu"):
                    parsed[name] = parse_cpu(cells[name])
                else:
                    parsed[name] = _positive_float(cells[name])
            except ValueError as exc:
                raise UserInputError(f"{source}:{line}: column {name}: {exc}") from None
        observations.append(
            Observation(
                config=Config(
                    workers=int(parsed["workers"]),
                    ps=int(parsed["ps"]),
                    worker_cpu=parsed["worker_cpu"],
                    ps_cpu=parsed["ps_cpu"],
                ),
                batch_size=int(parsed["batch_size"]),
                throughput=parsed["throughput"],
            )
        )
    return observations
