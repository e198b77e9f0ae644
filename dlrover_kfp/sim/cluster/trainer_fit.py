"""The ``trainer`` truth family's shape, fitted to this package's trainer as measured.

``benchmarks/resource_curves.py`` ran the real trainer (processes, the wire, pod CPU limits
enforced by cgroups) on a 2-core VM and recorded, per job, its steady samples/s and the cores
each role used (``*.runs.csv`` under benchmarks/data/, :data:`RUNS`): the small DLRM's grid
(34 shapes of 0.25-1.5-core pods) and its pods of 1.25-1.75 cores (workers) and 1.5 cores
(PS), with the trainer's own thread rule (one torch thread below two cores:
training/node.py). :func:`fit_trainer` fits :class:`~.truth.TrainerTruth`'s equations to the
three measurements at once (least squares on their logs), over every undisturbed run:

* ``compute`` and ``alpha``: a worker's speed below one core (alpha > 1: a fractional quota is
  throttled in CFS periods and loses more than its share);
* ``worker_threads``: the cores a worker keeps busy above one (its compute thread, and the
  prefetch thread reading the next shard beside it);
* ``ps_work``: the PS cores per sample, from the PS's measured use;
* ``critical``: the share of that work the worker waits for, from the throughput;
* ``base``: the per-step time no core shortens.

What more threads buy is measured apart (:data:`THREAD_RUNS`, :func:`read_thread_scaling`): the
worker's step of three models (the small one and two with wider MLPs, ~3x and ~5x its
compute per sample) in one process with one torch thread and with two, on two cores with no
quota; Amdahl's serial fraction read from the speed-up. The trace gives a cluster job's trainer
truth the serial fraction measured at its compute per sample (:func:`serial_at`, interpolated
in log compute) and extrapolates it with Amdahl's law to the drawn thread caps: the machine has
two cores, so three or more threads were not measured.

What the data cannot tell, and :func:`trainer_truth` assumes (documented in docs/simulator.md):
the thread caps (drawn as for the other families) and the per-sample compute of a cluster job's
model (the trace's draw). The measured *ratios* (PS work to worker compute, the critical share,
base to compute) carry over; one factor then scales every time so that the job's throughput at
the user's request is the trace's.

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
from pathlib import Path

import numpy as np

from dlrover_kfp.errors import UserInputError
from dlrover_kfp.sim.cluster.truth import TrainerTruth

_COLUMNS = ("workers", "ps", "worker_cpu", "ps_cpu", "batch_size", "throughput")
_USAGE = ("worker_cpu_used", "ps_cpu_used")
FIT_FILE = "trainer_fit.json"
#: Cores other processes may have used during a run for it to count (the benchmark's own gate
#: before each run: resource_curves.py --max-other-cpu).
DISTURBED_CPU = 0.25


@dataclass(frozen=True, slots=True)
class TrainerFit:
    """The fitted coefficients and how well they fit (relative errors, root mean square)."""

    base: float
    compute: float
    alpha: float
    ps_work: float
    critical: float
    #: cores a worker's compute keeps busy above one (the trainer runs one compute thread
    #: below two cores: training/node.py torch_threads)
    worker_threads: float
    runs: int
    #: runs whose workers had more than one core, and the fit's error on their samples/s
    runs_above_one_core: int
    throughput_rmse: float
    worker_cpu_rmse: float
    ps_cpu_rmse: float
    throughput_rmse_above_one_core: float | None
    source: str
    #: (worker core-seconds per sample, Amdahl serial fraction) of each model measured with one
    #: torch thread and with two (:func:`read_thread_scaling`), by compute
    serial_points: tuple[tuple[float, float], ...] = ()

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"


@dataclass(frozen=True, slots=True)
class Run:
    """One measured job of a runs file: its shape, samples/s and cores used per pod."""

    workers: int
    ps: int
    worker_cpu: float
    ps_cpu: float
    batch: int
    throughput: float
    worker_used: float
    ps_used: float


def read_runs(text: str, source: str) -> list[Run]:
    """The successful, undisturbed runs of a ``*.runs.csv`` file: a run during which other
    processes used more than :data:`DISTURBED_CPU` cores (its ``other_cpu_during``, where the
    file has it) measured the machine's load as much as the trainer, and is left out."""
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in (*_COLUMNS, *_USAGE, "status") if c not in (reader.fieldnames or ())]
    if missing:
        raise UserInputError(f"{source}: missing columns {', '.join(missing)}")
    runs = []
    for number, row in enumerate(reader, start=2):
        try:
            if row["status"] != "ok" or float(row.get("other_cpu_during") or 0) > DISTURBED_CPU:
                continue
            runs.append(
                Run(
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
    base, compute, alpha, ps_work, critical, worker_threads = params
    return TrainerTruth(
        base=float(base),
        compute=float(compute),
        alpha=float(alpha),
        serial=0.0,
        worker_threads=float(worker_threads),
        ps_work=float(ps_work),
        critical=float(critical),
        ps_threads=64.0,
    )


def fit_trainer(
    runs: Sequence[Run], source: str, scaling: Sequence[ThreadScaling] = ()
) -> TrainerFit:
    """Least squares on log throughput, log worker cores and log PS cores together, over every
    run; ``worker_threads`` (the cores a worker's compute keeps busy above one) only where some
    run's workers had more than one core, else 1."""
    # Imported here: scipy.optimize takes 0.4 s, and the simulator usually reads the packaged
    # fit (packaged_fit) rather than fitting.
    from scipy.optimize import least_squares  # noqa: PLC0415

    if len(runs) < 5:
        raise UserInputError(f"{source}: {len(runs)} usable runs, need at least 5")
    above_one = any(r.worker_cpu > 1.0 + 1e-9 for r in runs)

    def unpack(z: np.ndarray) -> list[float]:
        base, compute, alpha, ps_work, logit = z[:5]
        # threads = 1 + e^z: a worker keeps at least its one compute thread busy
        threads = 1.0 + math.exp(z[5]) if above_one else 1.0
        return [
            math.exp(base),
            math.exp(compute),
            float(alpha),
            math.exp(ps_work),
            1.0 / (1.0 + math.exp(-logit)),
            threads,
        ]

    def residuals(z: np.ndarray) -> np.ndarray:
        truth = _truth(unpack(z))
        out = []
        for r in runs:
            x, wu, pu = truth.evaluate(r.workers, r.ps, r.worker_cpu, r.ps_cpu, r.batch)
            out.append(math.log(x / r.throughput))
            out.append(math.log(wu / r.worker_used))
            out.append(math.log(pu / r.ps_used))
        return np.array(out)

    start = [math.log(1e-4), math.log(1.5e-5), 1.0, math.log(5e-6), 0.0]
    if above_one:
        start.append(math.log(0.2))
    # Bounds keep every exp() finite on the way (log seconds, log core-seconds, an exponent, a
    # logit, log extra threads): far wider than any trainer's values.
    low = [-40.0, -25.0, 0.5, -25.0, -20.0, -10.0][: len(start)]
    high = [0.0, 0.0, 2.0, 0.0, 20.0, 3.0][: len(start)]
    result = least_squares(
        residuals, np.array(start), bounds=(low, high), method="trf", max_nfev=5000
    )
    params = unpack(result.x)
    res = np.expm1(residuals(result.x)).reshape(-1, 3)

    def rmse(k: int, rows: np.ndarray = res) -> float:
        return round(float(np.sqrt(np.mean(rows[:, k] ** 2))), 4)

    big = res[[r.worker_cpu > 1.0 + 1e-9 for r in runs]]
    return TrainerFit(
        # Seconds to the microsecond, not to 4 digits: the trainer has no fixed per-step time the
        # fit can see (it ends near 1e-13 s), and the digits of that are where the optimiser
        # stopped, which differs between machines (6.057e-14 here, 6.777e-14 on another Xeon).
        base=round(params[0], 6),
        compute=float(f"{params[1]:.4g}"),
        alpha=round(params[2], 4),
        ps_work=float(f"{params[3]:.4g}"),
        critical=round(params[4], 4),
        worker_threads=round(params[5], 4),
        runs=len(runs),
        runs_above_one_core=len(big),
        throughput_rmse=rmse(0),
        worker_cpu_rmse=rmse(1),
        ps_cpu_rmse=rmse(2),
        throughput_rmse_above_one_core=rmse(0, big) if len(big) else None,
        source=source,
        serial_points=tuple(sorted((t.compute, t.serial) for t in scaling)),
    )


@dataclass(frozen=True, slots=True)
class ThreadScaling:
    """One model's step with one torch thread and with two (benchmarks/thread_scaling.py: the
    worker's arithmetic in one process, no CPU quota): what a second thread buys.

    Amdahl's law with n threads, ``speedup(n) = 1 / (σ + (1 − σ) / n)``, read at n = 2::

        σ = 2 / speedup − 1       (kept within [0, 1]: a second thread that slows the step
                                   down reads as σ = 1, no gain)
    """

    model: str
    compute: float  # core-seconds per sample with one thread: 1 / its samples/s
    speedup: float  # median over rounds of samples/s with two threads / with one
    serial: float
    rounds: int


def read_thread_scaling(text: str, source: str) -> list[ThreadScaling]:
    """Per model of a ``thread_scaling.csv``, in the order first seen."""
    reader = csv.DictReader(io.StringIO(text))
    need = ("model", "round", "threads", "train_only")
    missing = [c for c in need if c not in (reader.fieldnames or ())]
    if missing:
        raise UserInputError(f"{source}: missing columns {', '.join(missing)}")
    rates: dict[str, dict[int, dict[int, float]]] = {}
    for number, row in enumerate(reader, start=2):
        try:
            by_round = rates.setdefault(row["model"], {}).setdefault(int(row["round"]), {})
            by_round[int(row["threads"])] = float(row["train_only"])
        except ValueError as exc:
            raise UserInputError(f"{source}:{number}: {exc}") from None
    out = []
    for model, rounds in rates.items():
        paired = [r for r in rounds.values() if 1 in r and 2 in r and r[1] > 0]
        if not paired:
            raise UserInputError(f"{source}: {model} has no round with both thread counts")
        speedup = float(np.median([r[2] / r[1] for r in paired]))
        compute = float(np.median([1.0 / r[1] for r in paired]))
        out.append(
            ThreadScaling(
                model=model,
                compute=float(f"{compute:.4g}"),
                speedup=round(speedup, 4),
                serial=round(min(1.0, max(0.0, 2.0 / speedup - 1.0)), 4),
                rounds=len(paired),
            )
        )
    return out


def serial_at(fit: TrainerFit, compute: float) -> float | None:
    """The serial fraction the measured models give a step of ``compute`` core-seconds per
    sample: the least-squares line of σ against log(compute) through the measured models,
    within the range they measured (no extrapolation past the largest or smallest σ seen; one
    model: its σ). None when the fit has no thread measurements.

    A line rather than joining the points: each point is a median of a few noisy rounds, and a
    job's σ should not jump with the noise of the model measured nearest to it."""
    if not fit.serial_points:
        return None
    xs = np.log([c for c, _ in fit.serial_points])
    ys = np.array([sigma for _, sigma in fit.serial_points])
    if len(xs) == 1 or float(np.ptp(xs)) == 0.0:
        return float(np.mean(ys))
    slope, intercept = np.polyfit(xs, ys, 1)
    value = float(intercept + slope * math.log(compute))
    return min(float(ys.max()), max(float(ys.min()), value))


def parse_fit(text: str, source: str) -> TrainerFit:
    try:
        data = json.loads(text)
        data["serial_points"] = tuple(
            (float(c), float(sigma)) for c, sigma in data.get("serial_points", ())
        )
        return TrainerFit(**data)
    except (ValueError, TypeError) as exc:
        raise UserInputError(f"{source}: not a trainer fit: {exc}") from None


#: The measurements the packaged fit comes from (benchmarks/data/, one machine): the small
#: model's grid and its pods of 1.25-1.75 cores, with the trainer's own thread rule ...
RUNS = (
    "benchmarks/data/resource_curves_small_xeon.runs.csv",
    "benchmarks/data/resource_curves_small_2core.runs.csv",
)
#: ... and what a second torch thread buys at three model sizes (benchmarks/thread_scaling.py).
THREAD_RUNS = "benchmarks/data/thread_scaling.csv"


def fit_files(root: Path) -> TrainerFit:
    """The fit of :data:`RUNS` and :data:`THREAD_RUNS` under ``root`` (the repository)."""
    runs = [r for name in RUNS for r in read_runs((root / name).read_text(encoding="utf-8"), name)]
    scaling = read_thread_scaling((root / THREAD_RUNS).read_text(encoding="utf-8"), THREAD_RUNS)
    return fit_trainer(runs, " + ".join((*RUNS, THREAD_RUNS)), scaling)


def measured_truth(fit: TrainerFit) -> TrainerTruth:
    """The measured trainer itself as the fit describes it (the small model on the measuring
    machine), to compare with the runs."""
    return _truth([fit.base, fit.compute, fit.alpha, fit.ps_work, fit.critical, fit.worker_threads])


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
