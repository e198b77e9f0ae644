"""The ``trainer`` truth family's shape, fitted to this package's trainer as measured.

``benchmarks/resource_curves.py`` ran the real trainer (processes, the wire, pod CPU limits
enforced by cgroups) at 34 configurations of a small DLRM on a 2-core VM and recorded, per job,
its steady samples/s and the cores each role used (``benchmarks/data/resource_curves_small
.runs.csv``). :func:`fit_trainer` fits :class:`~.truth.TrainerTruth`'s equations to those three
measurements at once (least squares on their logs), over the runs whose workers had at most one
core (the measured workers ran one compute thread, so more cores tell nothing about threads):

* ``compute`` and ``alpha``: a worker's speed below one core (alpha > 1: a fractional quota is
  throttled in CFS periods and loses more than its share);
* ``ps_work``: the PS cores per sample, from the PS's measured use;
* ``critical``: the share of that work the worker waits for, from the throughput;
* ``base``: the per-step time no core shortens.

What the data cannot tell, and :func:`trainer_truth` assumes (documented in docs/simulator.md):
thread caps and the serial fraction above one core (drawn as for the other families), and the
per-sample compute of a cluster job's bigger model (the trace's draw). The measured *ratios* (PS
work to worker compute, the critical share, base to compute) carry over; one factor then scales
every time so that the job's throughput at the user's request is the trace's.

The fitted numbers live in ``dlrover_kfp/sim/data/trainer_fit.json``, written by
``python benchmarks/fit_trainer_truth.py``; a test refits the committed data and compares.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import resources

import numpy as np

from dlrover_kfp.errors import UserInputError
from dlrover_kfp.sim.cluster.truth import TrainerTruth

#: Runs with more worker cores than this are left out of the fit (see the module docstring).
MAX_FIT_WORKER_CPU = 1.0
_COLUMNS = ("workers", "ps", "worker_cpu", "ps_cpu", "batch_size", "throughput")
_USAGE = ("worker_cpu_used", "ps_cpu_used")
FIT_FILE = "trainer_fit.json"


@dataclass(frozen=True, slots=True)
class TrainerFit:
    """The fitted coefficients and how well they fit (relative errors, root mean square)."""

    base: float
    compute: float
    alpha: float
    ps_work: float
    critical: float
    runs: int
    throughput_rmse: float
    worker_cpu_rmse: float
    ps_cpu_rmse: float
    source: str

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"


@dataclass(frozen=True, slots=True)
class _Run:
    workers: int
    ps: int
    worker_cpu: float
    ps_cpu: float
    batch: int
    throughput: float
    worker_used: float
    ps_used: float


def read_runs(text: str, source: str) -> list[_Run]:
    """The successful runs of a ``*.runs.csv`` file."""
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in (*_COLUMNS, *_USAGE, "status") if c not in (reader.fieldnames or ())]
    if missing:
        raise UserInputError(f"{source}: missing columns {', '.join(missing)}")
    runs = []
    for number, row in enumerate(reader, start=2):
        if row["status"] != "ok":
            continue
        try:
            runs.append(
                _Run(
                    int(row["workers"]),
                    int(row["ps"]),
                    float(row["worker_cpu"]),
                    float(row["ps_cpu"]),
                    int(row["batch_size"]),
                    float(row["throughput"]),
                    float(row["worker_cpu_used"]),
                    float(row["ps_cpu_used"]),
                )
            )
        except ValueError as exc:
            raise UserInputError(f"{source}:{number}: {exc}") from None
    return runs


def _truth(params: Sequence[float]) -> TrainerTruth:
    base, compute, alpha, ps_work, critical = params
    return TrainerTruth(
        base=float(base),
        compute=float(compute),
        alpha=float(alpha),
        serial=0.0,
        worker_threads=1.0,
        ps_work=float(ps_work),
        critical=float(critical),
        ps_threads=64.0,
    )


def fit_trainer(runs: Sequence[_Run], source: str) -> TrainerFit:
    """Least squares on log throughput, log worker cores and log PS cores together."""
    # Imported here: scipy.optimize takes 0.4 s, and the simulator usually reads the packaged
    # fit (packaged_fit) rather than fitting.
    from scipy.optimize import least_squares  # noqa: PLC0415

    used = [r for r in runs if r.worker_cpu <= MAX_FIT_WORKER_CPU + 1e-9]
    if len(used) < 5:
        raise UserInputError(f"{source}: {len(used)} usable runs, need at least 5")

    def unpack(z: np.ndarray) -> list[float]:
        base, compute, alpha, ps_work, logit = z
        return [
            math.exp(base),
            math.exp(compute),
            float(alpha),
            math.exp(ps_work),
            1.0 / (1.0 + math.exp(-logit)),
        ]

    def residuals(z: np.ndarray) -> np.ndarray:
        truth = _truth(unpack(z))
        out = []
        for r in used:
            x, wu, pu = truth.evaluate(r.workers, r.ps, r.worker_cpu, r.ps_cpu, r.batch)
            out.append(math.log(x / r.throughput))
            out.append(math.log(wu / r.worker_used))
            out.append(math.log(pu / r.ps_used))
        return np.array(out)

    start = np.array([math.log(1e-4), math.log(1.5e-5), 1.0, math.log(5e-6), 0.0])
    result = least_squares(residuals, start, method="lm", max_nfev=5000)
    params = unpack(result.x)
    res = np.expm1(residuals(result.x)).reshape(-1, 3)

    def rmse(k: int) -> float:
        return round(float(np.sqrt(np.mean(res[:, k] ** 2))), 4)

    return TrainerFit(
        base=float(f"{params[0]:.4g}"),
        compute=float(f"{params[1]:.4g}"),
        alpha=round(params[2], 4),
        ps_work=float(f"{params[3]:.4g}"),
        critical=round(params[4], 4),
        runs=len(used),
        throughput_rmse=rmse(0),
        worker_cpu_rmse=rmse(1),
        ps_cpu_rmse=rmse(2),
        source=source,
    )


def parse_fit(text: str, source: str) -> TrainerFit:
    try:
        data = json.loads(text)
        return TrainerFit(**data)
    except (ValueError, TypeError) as exc:
        raise UserInputError(f"{source}: not a trainer fit: {exc}") from None


@functools.cache
def packaged_fit() -> TrainerFit:
    """The fit shipped with the package (loaded once)."""
    text = resources.files("dlrover_kfp.sim").joinpath("data", FIT_FILE).read_text("utf-8")
    return parse_fit(text, FIT_FILE)


def trainer_truth(
    fit: TrainerFit,
    *,
    compute: float,
    worker_threads: float,
    ps_threads: float,
    serial: float,
) -> TrainerTruth:
    """A cluster job's trainer truth: the measured ratios at ``compute`` core-seconds per
    sample (before the caller's scaling to the request's throughput)."""
    scale = compute / fit.compute
    return TrainerTruth(
        base=fit.base * scale,
        compute=compute,
        alpha=fit.alpha,
        serial=serial,
        worker_threads=worker_threads,
        ps_work=fit.ps_work * scale,
        critical=fit.critical,
        ps_threads=ps_threads,
    )
