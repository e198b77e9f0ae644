"""Resource curves: the real PS job measured over a grid of shapes, and the model fitted to it.

The resource-performance model (dlrover_kfp/core/perf_model.py, docs/model.md) predicts the
throughput of a job with ``w`` workers and ``p`` PS of ``λw`` and ``λp`` cores each. This
benchmark checks it against the trainer itself, as the paper's figure 6 does:

1. **Measure.** Every configuration of a grid that fits this machine is trained for real:
   ``static_run`` on ``LocalBackend``, each pod limited to its ``cpu`` (a CFS quota where the
   backend can set one). The default grid (small model) is every ``w`` in 1-3, ``p`` in 1-2,
   ``λw`` in {0.25, 0.5, 0.75, 1, 1.5} and ``λp`` in {0.25, 0.5, 1} whose total
   ``w·λw + p·λp`` is within ``--budget`` (1.75 of the machine's 2 cores: the rest is the
   master, i.e. this process): 34 configurations. ``--model medium`` runs five points instead
   (:data:`MEDIUM_POINTS`). The run order is shuffled (``--seed``) so that slow phases of the
   shared machine do not line up with one axis; ``--repeats`` measures each configuration
   again, at other times.
2. **Keep other load out.** Before each job the benchmark measures, over 1 s, the CPU that
   everything but this process tree uses (``psutil.cpu_times`` of the machine minus its own)
   and waits (at most ``--max-wait-s``) until that is below ``--max-other-cpu``; if it never
   is, the job runs anyway and the sidecar says so (``quiet_before`` 0). During the job it
   records the same figure over the steady window (machine busy time minus the pods' and the
   master's) and the hypervisor's steal time, so that a disturbed point can be seen and
   dropped. The 1-minute load average is recorded but not used to gate: it still counts the
   previous job's pods for a minute.
3. **Steady-state throughput** from the profile's runtime samples (every 0.25 s), as
   benchmarks/ps_throughput.py measures it, with both ends trimmed further: the window starts
   ``--skip-s`` after the first sample that saw trained rows (process start-up, PS
   initialisation and the first shard are before it) and ends before the last ``w`` shards
   (the epoch's tail, where workers run out of shards one by one; the final checkpoint,
   evaluation and export come after it). Workers report rows once per shard, so the throughput
   is the least-squares slope of the count against time over the samples at which a report
   arrived (see :func:`steady_window`). The mean ``cpu_used`` per pod of each role over the
   window, the whole-run figure (samples / JCT), whether the backend enforced the limits and
   every runtime sample are kept.
4. **Fit and validate.** The configurations (repeats stay together) are split at random
   (``--split-seed``): each form of ``--forms`` is fitted on 60% and its MAPE reported on the
   other 40% and on the training part. ``v3`` is the library's fit as shipped
   (``perf_model.fit``: the additive or the overlap form, whichever fits better by its
   margin), ``v2`` the additive form alone, ``v1`` the additive form with γ = 1 (the starting
   Optimus form, docs/model.md) and ``capped`` v3 on ``min(λ, cap)`` (``--caps``).
5. **Plot** the fitted curves against the measured points, one PNG per form: throughput against
   w/p, against worker CPU and against PS CPU (each with the other variables held at the
   values that have the most measured points), and predicted against measured.

Files (``--data-dir``, default benchmarks/data/; ``STEM`` = resource_curves_<model>):

* ``STEM.csv``: one row per successful job in ``dlrover-kfp model fit --samples`` format
  (``workers,ps,worker_cpu,ps_cpu,batch_size,throughput``; that parser takes no comments, so the
  machine and date are in ``STEM.meta.json`` and in the sidecar).
* ``STEM.runs.csv``: the sidecar, one row per job (failed ones too): rows trained, window,
  whole-run throughput, CPU used per role, other load before and during, steal, time.
* ``STEM.samples.jsonl``: every runtime sample of every job (time, samples/s, cores per pod).
* ``STEM.meta.json``: machine, date, command line, commit, settings.
* ``STEM.fit.json``: per form, the fitted model (model-file form), the split and the MAPEs.
* figures: ``--fig-dir`` (default docs/img/), ``STEM_<form>.png``.

    python benchmarks/resource_curves.py --list                      # the grid, nothing run
    python benchmarks/resource_curves.py --repeats 2                 # small: 68 jobs, ~40 min
    python benchmarks/resource_curves.py --repeats 3 --resume        # a third pass, appended
    python benchmarks/resource_curves.py --model medium              # 5 points, ~20-30 min
    python benchmarks/resource_curves.py --fit-only benchmarks/data/resource_curves_small.csv
    python benchmarks/resource_curves.py --rows 100000 --max-configs 3 --data-dir /tmp/rc

Plots need matplotlib (``pip install -c constraints.txt -e '.[bench]'``); ``--no-plot`` runs
without it.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import math
import os
import platform
import random
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ps_throughput import MODELS, ModelSize, machine
from ps_throughput import job_spec as throughput_job_spec

from dlrover_kfp.backends import LocalBackend
from dlrover_kfp.core.model_io import (
    CSV_COLUMNS,
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
from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.files import read_text, write_atomic
from dlrover_kfp.runtime.job import static_run
from dlrover_kfp.runtime.options import RunOptions, RunSettings

REPO = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------------ the grid

WORKERS = (1, 2, 3)
PS = (1, 2)
WORKER_CPU = (0.25, 0.5, 0.75, 1.0, 1.5)
PS_CPU = (0.25, 0.5, 1.0)
#: cores the job's pods may take together; the rest of the machine's 2 is the master's
DEFAULT_BUDGET = 1.75

#: The medium model's points. Its PS hold 26 M rows x 32 dims between them, with Adagrad state
#: and a snapshot buffer of the same size: ~13 GB whatever p is, over half this machine, so one
#: PS and few points: λw 0.5/1/1.25 at λp 0.5 (the worker-CPU curve; 1.25 rather than 1.5 to
#: stay within 1.75 cores), one more λp and one more worker. No λp below 0.5: a medium PS's
#: start-up (~10 s on a whole core: docs/training-benchmarks.md, "PS start-up") runs at its CPU
#: limit, and its final checkpoint too.
MEDIUM_POINTS = (
    Config(1, 1, 0.5, 0.5),
    Config(1, 1, 1.0, 0.5),
    Config(1, 1, 1.25, 0.5),
    Config(1, 1, 1.0, 0.75),
    Config(2, 1, 0.5, 0.75),
)

#: Rough speed of each model relative to the prior (which describes the small one: docs/model.md,
#: "The prior"):
#: only used to give every job about the same training time (``--target-s``).
SPEED_FACTOR = {"small": 1.0, "medium": 0.6, "wide": 0.45, "xwide": 0.12}

SAMPLE_INTERVAL_S = 0.25

#: Longest a job may take, start-up and evaluation included: a small job at the slowest point
#: takes ~40 s; a medium PS spends a minute or more starting and checkpointing at its CPU limit.
JOB_TIMEOUT_S = {"small": 300.0, "medium": 1500.0, "wide": 600.0, "xwide": 900.0}


def grid(budget: float) -> list[Config]:
    """Every grid configuration whose total CPU is within ``budget``, in a fixed order."""
    return [
        Config(w, p, lw, lp)
        for w in WORKERS
        for p in PS
        for lw in WORKER_CPU
        for lp in PS_CPU
        if w * lw + p * lp <= budget + 1e-9
    ]


def label(c: Config) -> str:
    return f"{c.workers}w{c.ps}p@{c.worker_cpu:g}/{c.ps_cpu:g}"


_LABEL = re.compile(r"^(\d+)w(\d+)p@([0-9.]+)/([0-9.]+)$")


def parse_label(text: str) -> Config:
    """``2w1p@0.5/0.25``: 2 workers of 0.5 core, 1 PS of 0.25 core."""
    m = _LABEL.match(text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(
            f"expected WwPp@WORKER_CPU/PS_CPU such as 2w1p@0.5/0.25, got {text!r}"
        )
    config = Config(int(m[1]), int(m[2]), float(m[3]), float(m[4]))
    if min(config.workers, config.ps) < 1 or min(config.worker_cpu, config.ps_cpu) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: every count and CPU must be positive")
    return config


def estimated_throughput(config: Config, size_name: str, batch: int) -> float:
    """The prior's samples/s, scaled to the model: sizes each job's rows, nothing else."""
    return PRIOR.throughput(config, batch) * SPEED_FACTOR[size_name]


def rows_for(
    config: Config,
    args: argparse.Namespace,
    size: ModelSize,
    shard_rows: int,
    correction: float = 1.0,
) -> int:
    """``--rows``, or enough for ``--target-s`` of training at the expected speed, clamped.

    The expected speed is the prior's times ``correction``: the median ratio of measured to
    prior speed over the jobs already run, so that a trainer faster or slower than the prior
    still gets about ``--target-s`` of steady window per job.
    """
    if args.rows:
        return int(args.rows)
    wanted = args.target_s * estimated_throughput(config, args.model, size.batch) * correction
    rows = min(max(wanted, args.min_rows), args.max_rows)
    shards = math.ceil(rows / shard_rows)
    if shards * shard_rows > args.max_rows:
        shards = max(1, math.floor(args.max_rows / shard_rows))
    return shards * shard_rows


# ------------------------------------------------------------------------ other load


def _busy_and_steal(t: Any) -> tuple[float, float]:
    """CPU seconds the machine spent busy (any process, any mode) and stolen by the host."""
    busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
    return float(busy), float(getattr(t, "steal", 0.0))


def _own_tree_cpu() -> float:
    """CPU seconds of this process and its live descendants."""
    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def other_cpu(interval_s: float = 1.0) -> tuple[float, float]:
    """(cores used by everything but this process tree, cores stolen by the host) over 1 s."""
    busy0, steal0 = _busy_and_steal(psutil.cpu_times())
    own0, t0 = _own_tree_cpu(), time.monotonic()
    time.sleep(interval_s)
    busy1, steal1 = _busy_and_steal(psutil.cpu_times())
    own1, t1 = _own_tree_cpu(), time.monotonic()
    wall = t1 - t0
    return max(0.0, (busy1 - busy0 - (own1 - own0)) / wall), max(0.0, (steal1 - steal0) / wall)


@dataclass
class Quiet:
    other_cpu: float
    steal: float
    load1: float
    waited_s: float
    quiet: bool


def wait_for_quiet(max_other: float, max_wait_s: float, say: Callable[[str], None]) -> Quiet:
    """Wait until other processes use at most ``max_other`` cores, for ``max_wait_s`` at most."""
    began = time.monotonic()
    while True:
        other, steal = other_cpu()
        waited = time.monotonic() - began
        if other <= max_other:
            return Quiet(other, steal, os.getloadavg()[0], waited, True)
        if waited >= max_wait_s:
            say(
                f"    WARNING: other processes still use {other:.2f} cores after {waited:.0f}s; "
                "running anyway (recorded in the sidecar as quiet_before=0)"
            )
            return Quiet(other, steal, os.getloadavg()[0], waited, False)
        say(f"    other processes use {other:.2f} cores (> {max_other:g}); waiting")
        time.sleep(4.0)


# ------------------------------------------------------------------------ one job


def job_spec(size: ModelSize, rows: int, config: Config) -> JobSpec:
    """ps_throughput's job (same model, data and learning rate) at ``config``'s shape."""
    return throughput_job_spec(
        size, rows, config.workers, config.ps, (config.worker_cpu, config.ps_cpu)
    )


@dataclass
class Window:
    first: int
    last: int
    throughput: float
    seconds: float
    shards: float  # shards' worth of rows counted inside the window
    drift: float  # second half's samples/s over the first half's, minus 1


def steady_window(profile: JobProfile, workers: int, shard_rows: int, skip_s: float) -> Window:
    """The steady part of a run (see the module docstring, step 3).

    A sample's ``throughput`` is (samples now - samples at the previous sample) / (time
    between), so the cumulative count is the sum of throughput x interval. Workers report their
    rows once per shard, so the count moves in steps of a shard: a window between two arbitrary
    samples would be off by up to a shard at each end. Both ends are therefore samples at which
    the count has just moved (a shard was reported in the interval before them). The throughput
    is the slope of the count against time over every such sample in the window.
    """
    samples = profile.samples
    cumulative, total, t_prev = [], 0.0, 0.0
    for s in samples:
        total += s.throughput * (s.time - t_prev)
        t_prev = s.time
        cumulative.append(total)
    # Never the very last sample, which the run takes once the workers have exited.
    events = [i for i in range(1, len(samples) - 1) if cumulative[i] - cumulative[i - 1] > 0.5]
    if not events:
        raise RuntimeError("no runtime sample saw trained rows")
    start = samples[events[0]].time + skip_s
    # Before the last `workers` shards: from there on workers run out of work one by one.
    tail = cumulative[-1] - workers * shard_rows
    inside = [i for i in events if samples[i].time >= start and cumulative[i] <= tail + 0.5]
    if len(inside) < 4:
        raise RuntimeError(
            f"the steady window holds {max(0, len(inside) - 1)} shard reports (< 3): "
            "give the job more rows (--rows/--min-rows)"
        )
    first, mid, last = inside[0], inside[len(inside) // 2], inside[-1]

    def rate(a: int, b: int) -> float:
        return (cumulative[b] - cumulative[a]) / (samples[b].time - samples[a].time)

    # The slope of a least-squares line through every report in the window: each report's time
    # is late by a fraction of an interval, independently, so the slope averages that out
    # where the end points alone would keep it (±0.3 s on a 5 s window is ±6%).
    slope = np.polyfit([samples[i].time for i in inside], [cumulative[i] for i in inside], deg=1)[0]
    return Window(
        first=first,
        last=last,
        throughput=float(slope),
        seconds=samples[last].time - samples[first].time,
        shards=(cumulative[last] - cumulative[first]) / shard_rows,
        drift=rate(mid, last) / rate(first, mid) - 1,
    )


@dataclass
class Mark:
    """Taken right after each runtime sample (the progress line that follows it)."""

    wall: float
    own_cpu: float  # this process (the master): CPU seconds
    busy: float  # the machine: busy CPU seconds
    steal: float


def take_mark() -> Mark:
    busy, steal = _busy_and_steal(psutil.cpu_times())
    return Mark(time.monotonic(), time.process_time(), busy, steal)


def run_job(
    size: ModelSize,
    config: Config,
    rows: int,
    settings: RunSettings,
    skip_s: float,
    timeout_s: float,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Train one configuration; (sidecar fields, per-sample trace). Raises on a failed job.

    A job still running after ``timeout_s`` has its pods deleted (``backend.close()``), which
    the run reports as failed: one stuck job must not hold the whole grid.
    """
    spec = job_spec(size, rows, config)
    marks: list[Mark] = []
    timed_out = threading.Event()

    def progress(line: str) -> None:
        if line.startswith("["):  # the line that follows every runtime sample but the last
            marks.append(take_mark())

    with tempfile.TemporaryDirectory(prefix="resource_curves-") as tmp:
        out = Path(tmp)
        with LocalBackend(out / "logs") as backend:

            def stop() -> None:
                timed_out.set()
                backend.close()

            timer = threading.Timer(timeout_s, stop)
            timer.daemon = True
            timer.start()
            try:
                options = RunOptions(output_dir=out, base_dir=out, settings=settings)
                run = static_run(spec, backend, options, progress=progress)
                result = run.run()
            finally:
                timer.cancel()
        if timed_out.is_set():
            raise RuntimeError(f"timed out after {timeout_s:.0f}s (--job-timeout-s)")
        if not result.succeeded:
            logs = "\n".join(p.read_text()[-1500:] for p in sorted((out / "logs").glob("*.log")))
            raise RuntimeError(f"job failed: {result.profile.outcome.reason}\n{logs}")
    profile = result.profile
    samples = profile.samples
    trace = {
        "t": [s.time for s in samples],
        "throughput": [s.throughput for s in samples],
        "cpu": [
            {n.name.removeprefix(f"{spec.name}-"): n.cpu_used for n in s.nodes} for s in samples
        ],
    }
    outcome = profile.outcome
    limits = profile.limits
    fields: dict[str, Any] = {
        "whole_throughput": outcome.samples_processed / outcome.jct_seconds,
        "jct_s": outcome.jct_seconds,
        "samples_trained": outcome.samples_processed,
        # 1/0 as the backend reports it; blank where it does not say
        "cpu_enforced": "" if limits is None else int(limits.cpu),
        "enforcement": "" if limits is None else limits.detail,
    }
    window = steady_window(profile, config.workers, settings.shard_rows, skip_s)
    trace["window"] = [window.first, window.last]
    per_pod: dict[str, dict[str, list[float]]] = {
        "worker": defaultdict(list),
        "ps": defaultdict(list),
    }
    pods_total: list[float] = []
    for s in samples[window.first + 1 : window.last + 1]:  # each measured over the interval before
        pods_total.append(sum(n.cpu_used for n in s.nodes))
        for n in s.nodes:
            per_pod[n.role][n.name].append(n.cpu_used)
    means = {role: [statistics.fmean(v) for v in pods.values()] for role, pods in per_pod.items()}
    fields |= {
        "throughput": window.throughput,
        "window_s": window.seconds,
        "window_start_s": samples[window.first].time,
        "window_samples": window.last - window.first,
        "window_shards": window.shards,
        "drift": window.drift,
        "training_started_s": next((s.time for s in samples if s.throughput > 0), math.nan),
        "worker_cpu_used": statistics.fmean(means["worker"]) if means["worker"] else math.nan,
        "worker_cpu_used_max": max(means["worker"], default=math.nan),
        "ps_cpu_used": statistics.fmean(means["ps"]) if means["ps"] else math.nan,
        "ps_cpu_used_max": max(means["ps"], default=math.nan),
    }
    # Master and machine over the same window: marks[i] follows sample i.
    master = other = steal = math.nan
    if len(marks) > window.last:
        m0, m1 = marks[window.first], marks[window.last]
        wall = m1.wall - m0.wall
        if wall > 0:
            master = (m1.own_cpu - m0.own_cpu) / wall
            busy = (m1.busy - m0.busy) / wall
            other = max(0.0, busy - statistics.fmean(pods_total) - master)
            steal = (m1.steal - m0.steal) / wall
    fields |= {"master_cpu_used": master, "other_cpu_during": other, "steal_during": steal}
    return fields, trace


# ------------------------------------------------------------------------ files

RUN_COLUMNS = (
    "order",
    "repeat",
    "label",
    "model",
    *CSV_COLUMNS,
    "status",
    "cpu_enforced",
    "rows",
    "samples_trained",
    "whole_throughput",
    "jct_s",
    "window_start_s",
    "window_s",
    "window_samples",
    "window_shards",
    "drift",
    "training_started_s",
    "worker_cpu_used",
    "worker_cpu_used_max",
    "ps_cpu_used",
    "ps_cpu_used_max",
    "master_cpu_used",
    "other_cpu_before",
    "steal_before",
    "load1_before",
    "waited_s",
    "quiet_before",
    "other_cpu_during",
    "steal_during",
    "started_at",
    "enforcement",
    "note",
)


def _cell(value: object) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:.1f}"
    return str(value)


def write_csv(path: Path, columns: Sequence[str], rows: Iterable[dict[str, Any]]) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(row.get(c, "")) for c in columns])
    write_atomic(path, buf.getvalue())


def read_runs(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def observation_rows(runs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of ``STEM.csv``: the successful runs, in ``model fit``'s columns."""
    return [{c: r[c] for c in CSV_COLUMNS} for r in runs if r["status"] == "ok"]


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


# ------------------------------------------------------------------------ fitting

FloatArray = np.ndarray


@dataclass(frozen=True)
class Form:
    """A form of the model and how it is fitted.

    Every form fits ``perf_model.fit`` with ``settings``; ``caps`` (worker, PS) first turns λ
    into ``min(λ, cap)``, the cores a pod of that role can use at most whatever it is given.
    """

    name: str
    description: str
    settings: FitSettings = field(default_factory=FitSettings)
    caps: tuple[float, float] | None = None

    def effective(self, c: Config) -> Config:
        if self.caps is None:
            return c
        return Config(c.workers, c.ps, min(c.worker_cpu, self.caps[0]), min(c.ps_cpu, self.caps[1]))

    def predict(
        self,
        model: PerfModel,
        w: FloatArray,
        p: FloatArray,
        lw: FloatArray,
        lp: FloatArray,
        b: FloatArray | float,
    ) -> FloatArray:
        if self.caps is not None:
            lw, lp = np.minimum(lw, self.caps[0]), np.minimum(lp, self.caps[1])
        return np.asarray(model.throughput_many(w, p, lw, lp, b), dtype=float)


#: Forms ``--forms`` can name; ``capped`` needs ``--caps``.
FORMS = ("v1", "v2", "v3", "capped")


def make_forms(names: Sequence[str], caps: tuple[float, float] | None) -> list[Form]:
    known = {
        "v1": Form(
            "v1",
            "the starting Optimus form: T = θ0 + θ1·B/λw + θ2·(w/p)·B/λp + θ3·(w/p) + θ4·p (γ = 1)",
            settings=FitSettings(max_exponent=1.0, overlap=False),
        ),
        "v2": Form(
            "v2",
            "additive (dlrover-kfp/ps-async-v2): θ2's term times (w/p)^γ, γ in [1, 2]",
            settings=FitSettings(overlap=False),
        ),
        "v3": Form(
            "v3",
            "the library as shipped (dlrover-kfp/ps-async-v3): v2, or the overlap form "
            "T = θ0 + max(θ1·B/λw, θ2·(w/p)^γ·B/λp + θ3·(w/p)) + θ4·p if it fits better",
        ),
    }
    forms = []
    for name in names:
        if name != "capped":
            forms.append(known[name])
        elif caps is None:
            print("form capped: skipped (--caps W,P sets the cores a pod can use at most)")
        else:
            forms.append(
                Form(
                    "capped",
                    f"v3 on usable cores: λw -> min(λw, {caps[0]:g}), λp -> min(λp, {caps[1]:g})",
                    caps=caps,
                )
            )
    return forms


def split_configs(
    observations: Sequence[Observation], fraction: float, seed: int
) -> tuple[set[tuple[Any, ...]], set[tuple[Any, ...]]]:
    """Distinct configurations (with batch size) split at random: (train, test)."""
    keys = sorted({key(o) for o in observations})
    random.Random(seed).shuffle(keys)
    n = len(keys)
    # At least one on each side, unless there is one configuration or everything is asked for.
    n_train = n if n < 2 or fraction >= 1 else min(n - 1, max(1, round(fraction * n)))
    return set(keys[:n_train]), set(keys[n_train:])


def key(o: Observation) -> tuple[Any, ...]:
    c = o.config
    return (c.workers, c.ps, c.worker_cpu, c.ps_cpu, o.batch_size)


@dataclass
class FitResult:
    form: Form
    model: PerfModel
    train: list[Observation]
    test: list[Observation]

    def predicted(self, observations: Sequence[Observation]) -> list[float]:
        if not observations:
            return []
        w, p, lw, lp, b = np.array([key(o) for o in observations], dtype=float).T
        return [float(v) for v in self.form.predict(self.model, w, p, lw, lp, b)]

    def errors(self, observations: Sequence[Observation]) -> list[float]:
        """Relative throughput errors (predicted - measured) / measured."""
        predicted = self.predicted(observations)
        return [x / o.throughput - 1 for x, o in zip(predicted, observations, strict=True)]

    def mape(self, observations: Sequence[Observation]) -> float:
        errors = self.errors(observations)
        return statistics.fmean(abs(e) for e in errors) if errors else math.nan


def fit_form(form: Form, train: list[Observation], test: list[Observation]) -> FitResult:
    effective = [dataclasses.replace(o, config=form.effective(o.config)) for o in train]
    return FitResult(form, fit(effective, settings=form.settings), train, test)


def describe(result: FitResult) -> str:
    m = result.model
    lines = [f"form {result.form.name}: {result.form.description}"]
    for name, value, pinned in zip(THETA_NAMES, m.theta, m.pinned, strict=True):
        note = "   (pinned to the prior)" if pinned else ""
        lines.append(f"    {name:<34} {value:.4g}{note}")
    gamma_note = "pinned: not identifiable from these data" if m.gamma_pinned else "searched"
    lines.append(f"    {'gamma':<34} {m.gamma:.2f}   ({gamma_note})")
    searched = m.diagnostics is not None and m.diagnostics.overlap_searched
    form = "overlap" if m.overlap else "additive" + ("" if searched else " (overlap not tried)")
    lines.append(f"    {'form':<34} {form}")
    if m.diagnostics is not None and m.diagnostics.scale_only:
        lines.append("    (too few configurations: only a scale factor on the prior was fitted)")
    for part, obs in (("train", result.train), ("test", result.test)):
        errors = result.errors(obs)
        if errors:
            worst = max(errors, key=abs)
            lines.append(
                f"    MAPE {part:<5} {100 * result.mape(obs):5.1f}%  over {len(obs)} observations"
                f" of {len({key(o) for o in obs})} configurations (worst {100 * worst:+.1f}%)"
            )
        else:
            lines.append(f"    MAPE {part:<5}   -    (no observations)")
    return "\n".join(lines)


def _percent(value: float) -> str:
    return f"{100 * value:.1f}%" if math.isfinite(value) else "-"


def _finite(value: float) -> float | None:
    """JSON has no NaN: an empty part's MAPE is null."""
    return value if math.isfinite(value) else None


def fit_summary(result: FitResult) -> dict[str, Any]:
    def config_list(obs: Sequence[Observation]) -> list[str]:
        return sorted({label(o.config) for o in obs})

    model = model_to_dict(result.model)
    return {
        "form": result.form.name,
        "description": result.form.description,
        "caps": list(result.form.caps) if result.form.caps else None,
        "model": model,
        "train_configs": config_list(result.train),
        "test_configs": config_list(result.test),
        "mape_train": _finite(result.mape(result.train)),
        "mape_test": _finite(result.mape(result.test)),
        "errors_test": [
            {"config": label(o.config), "measured": o.throughput, "error": e}
            for o, e in zip(result.test, result.errors(result.test), strict=True)
        ],
    }


# ------------------------------------------------------------------------ plotting


def _slices(
    observations: Sequence[Observation],
    x: Callable[[Observation], float],
    rest: Callable[[Observation], tuple[Any, ...]],
    count: int = 3,
) -> list[tuple[tuple[Any, ...], list[Observation]]]:
    """Up to ``count`` groups of observations equal in everything but the plotted variable.

    The groups with the most distinct values of the variable come first, and among those a
    group whose first held variable (p, or w) differs from the ones already chosen, so that a
    panel shows more than one shape when the data have it.
    """
    groups: dict[tuple[Any, ...], list[Observation]] = defaultdict(list)
    for o in observations:
        groups[rest(o)].append(o)
    ranked = sorted(
        groups.items(), key=lambda kv: (-len({x(o) for o in kv[1]}), -len(kv[1]), kv[0])
    )
    chosen: list[tuple[tuple[Any, ...], list[Observation]]] = []
    while ranked and len(chosen) < count:
        seen = {k[0] for k, _ in chosen}
        pick = next((g for g in ranked if g[0][0] not in seen), ranked[0])
        ranked.remove(pick)
        chosen.append(pick)
    return chosen


def plot(result: FitResult, path: Path, title: str, budget: float) -> None:
    import matplotlib  # noqa: PLC0415 (optional: the bench extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    form, model = result.form, result.model
    everything = [*result.train, *result.test]
    train_keys = {key(o) for o in result.train}
    batch = statistics.mode(o.batch_size for o in everything)
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    colours = plt.get_cmap("tab10").colors

    def draw(
        ax: Any,
        xs: np.ndarray,
        ys: np.ndarray,
        totals: np.ndarray,
        colour: Any,
        name: str,
    ) -> None:
        inside = totals <= budget + 1e-9
        ax.plot(xs, np.where(inside, ys, np.nan), "-", color=colour, label=name)
        # Beyond the CPU budget the grid has no point: the model extrapolates there.
        ax.plot(xs, np.where(inside, np.nan, ys), ":", color=colour)

    def points(
        ax: Any, obs: Sequence[Observation], xf: Callable[[Observation], float], colour: Any
    ) -> None:
        for o in obs:
            trained = key(o) in train_keys
            ax.scatter(
                xf(o),
                o.throughput,
                marker="o" if trained else "^",
                s=40,
                facecolors=colour if trained else "none",
                edgecolors=colour,
                zorder=3,
            )

    # (a) against w/p: curves over w at fixed p, λw, λp
    ax = axes[0][0]
    slices = _slices(
        everything,
        lambda o: o.config.workers / o.config.ps,
        lambda o: (o.config.ps, o.config.worker_cpu, o.config.ps_cpu),
    )
    for i, ((p, lw, lp), obs) in enumerate(slices):
        w = np.linspace(1, max(WORKERS), 60)
        ys = form.predict(
            model, w, np.full_like(w, p), np.full_like(w, lw), np.full_like(w, lp), batch
        )
        draw(ax, w / p, ys, w * lw + p * lp, colours[i], f"p={p}, λw={lw:g}, λp={lp:g}")
        points(ax, obs, lambda o: o.config.workers / o.config.ps, colours[i])
    ax.set_xlabel("workers per PS, w/p")
    ax.set_title("throughput against w/p")

    # (b) against λw at fixed w, p, λp
    ax = axes[0][1]
    slices = _slices(
        everything,
        lambda o: o.config.worker_cpu,
        lambda o: (o.config.workers, o.config.ps, o.config.ps_cpu),
    )
    top = max([*WORKER_CPU, *(o.config.worker_cpu for o in everything)])
    for i, ((w, p, lp), obs) in enumerate(slices):
        lw = np.linspace(min(WORKER_CPU), top, 60)
        ys = form.predict(
            model, np.full_like(lw, w), np.full_like(lw, p), lw, np.full_like(lw, lp), batch
        )
        draw(ax, lw, ys, w * lw + p * lp, colours[i], f"{w}w{p}p, λp={lp:g}")
        points(ax, obs, lambda o: o.config.worker_cpu, colours[i])
    ax.set_xlabel("cores per worker, λw")
    ax.set_title("throughput against worker CPU")

    # (c) against λp at fixed w, p, λw
    ax = axes[1][0]
    slices = _slices(
        everything,
        lambda o: o.config.ps_cpu,
        lambda o: (o.config.workers, o.config.ps, o.config.worker_cpu),
    )
    top = max([*PS_CPU, *(o.config.ps_cpu for o in everything)])
    for i, ((w, p, lw), obs) in enumerate(slices):
        lp = np.linspace(min(PS_CPU), top, 60)
        ys = form.predict(
            model, np.full_like(lp, w), np.full_like(lp, p), np.full_like(lp, lw), lp, batch
        )
        draw(ax, lp, ys, w * lw + p * lp, colours[i], f"{w}w{p}p, λw={lw:g}")
        points(ax, obs, lambda o: o.config.ps_cpu, colours[i])
    ax.set_xlabel("cores per PS, λp")
    ax.set_title("throughput against PS CPU")

    for ax in (axes[0][0], axes[0][1], axes[1][0]):
        ax.set_ylabel("samples/s (all workers)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")

    # (d) predicted against measured, every observation
    ax = axes[1][1]
    for part, obs, marker in (("train", result.train, "o"), ("test", result.test, "^")):
        if not obs:
            continue
        predicted = result.predicted(obs)
        ax.scatter(
            [o.throughput for o in obs],
            predicted,
            marker=marker,
            facecolors="black" if part == "train" else "none",
            edgecolors="black",
            label=f"{part}: MAPE {100 * result.mape(obs):.1f}% ({len(obs)})",
        )
    hi = max([o.throughput for o in everything] + result.predicted(everything)) * 1.1
    line = np.array([0.0, hi])
    ax.plot(line, line, "k-", lw=0.8)
    ax.fill_between(line, 0.9 * line, 1.1 * line, color="grey", alpha=0.15, label="±10%")
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_xlabel("measured samples/s")
    ax.set_ylabel("predicted samples/s")
    ax.set_title("predicted against measured")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")

    fig.suptitle(
        f"{title}\nfilled circles: fitted on (train), open triangles: held out (test); "
        f"solid: the fit, dotted: beyond {budget:g} cores in total",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------ the steps


def paths(args: argparse.Namespace) -> dict[str, Path]:
    data = Path(args.data_dir)
    stem = args.stem or f"resource_curves_{args.model}"
    return {
        "csv": data / f"{stem}.csv",
        "runs": data / f"{stem}.runs.csv",
        "samples": data / f"{stem}.samples.jsonl",
        "meta": data / f"{stem}.meta.json",
        "fit": data / f"{stem}.fit.json",
        "stem": Path(stem),
    }


def choose_configs(args: argparse.Namespace) -> list[Config]:
    if args.only:
        configs = [parse_label(t) for t in args.only.split(",") if t.strip()]
    elif args.model == "medium":
        configs = list(MEDIUM_POINTS)
    else:
        configs = grid(args.budget)
    over = [label(c) for c in configs if c.total_cpu > args.budget + 1e-9]
    if over:
        raise SystemExit(f"over the --budget of {args.budget:g} cores: {', '.join(over)}")
    if args.max_configs and len(configs) > args.max_configs:
        configs = random.Random(args.seed).sample(configs, args.max_configs)
    return configs


def measure(args: argparse.Namespace, files: dict[str, Path]) -> None:
    size = MODELS[args.model]
    settings = RunSettings(
        checkpoint_interval_s=0,  # only the final checkpoint, after the window
        sample_interval_s=SAMPLE_INTERVAL_S,
        eval_fraction=0.02,  # evaluation is after the window; keep it short
        startup_timeout_s=900.0,  # a medium PS initialises 26 M rows at its CPU limit
    )
    if args.torch_threads:
        settings = dataclasses.replace(settings, torch_threads=args.torch_threads)
    configs = choose_configs(args)
    runs: list[dict[str, Any]] = []
    if files["runs"].exists():
        if not (args.resume or args.force):
            raise SystemExit(
                f"{files['runs']} exists: --resume to add to it, --force to start over"
            )
        if args.resume:
            runs = [dict(r) for r in read_runs(files["runs"])]
    done = {(r["label"], int(r["repeat"])) for r in runs if r["status"] == "ok"}
    todo = [(c, k) for k in range(args.repeats) for c in configs if (label(c), k) not in done]
    random.Random(args.seed + 1000 * len(runs)).shuffle(todo)
    if not args.resume and files["samples"].exists():
        files["samples"].unlink()

    torch.set_num_threads(1)  # this process is the job's master while a job runs
    print(f"machine: {machine()}")
    print(
        f"model {args.model}: {size.tables} tables x {size.rows_per_table:,} rows x {size.dim}, "
        f"bottom {list(size.bottom)}, top {list(size.top)}, batch {size.batch}; "
        f"{len(configs)} configurations x {args.repeats} repeat(s): {len(todo)} jobs to run "
        f"({len(done)} done before), budget {args.budget:g} cores"
    )
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    this_pass = {
        "started_at": now,
        "command": shlex.join([sys.executable, *sys.argv]),
        "commit": git_commit(),
        "jobs": len(todo),
    }
    meta: dict[str, Any] = {}
    if args.resume and files["meta"].exists():
        meta = json.loads(files["meta"].read_text())
    meta = {
        "machine": machine(),
        "cpus": os.cpu_count(),
        "started_at": now,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "model": args.model,
        "model_shape": dataclasses.asdict(size),
        "budget_cores": args.budget,
        "settings": {k: v for k, v in dataclasses.asdict(settings).items() if k not in ("python",)},
        "skip_s": args.skip_s,
        "target_s": args.target_s,
        "max_other_cpu": args.max_other_cpu,
        "configs": [label(c) for c in configs],
        "repeats": args.repeats,
        "seed": args.seed,
        **meta,  # a resumed file keeps what its first pass wrote
    }
    meta["passes"] = [*meta.get("passes", []), this_pass]
    write_atomic(files["meta"], json.dumps(meta, indent=2) + "\n")

    timeout = args.job_timeout_s or JOB_TIMEOUT_S[args.model]
    began = time.monotonic()
    over_limit = 0
    for i, (config, repeat) in enumerate(todo):
        ratios = [
            float(r["throughput"])
            / estimated_throughput(parse_label(r["label"]), args.model, size.batch)
            for r in runs
            if r["status"] == "ok"
        ]
        correction = statistics.median(ratios) if ratios else 1.0
        rows = rows_for(config, args, size, settings.shard_rows, correction)
        elapsed = time.monotonic() - began
        eta = f", eta {elapsed / i * (len(todo) - i) / 60:.0f} min" if i else ""
        print(
            f"[{elapsed:5.0f}s] job {i + 1}/{len(todo)}: {label(config)} (repeat {repeat}), "
            f"{rows:,} rows{eta}",
            flush=True,
        )
        quiet = wait_for_quiet(args.max_other_cpu, args.max_wait_s, print)
        row: dict[str, Any] = {
            "order": len(runs),
            "repeat": repeat,
            "label": label(config),
            "model": args.model,
            "workers": config.workers,
            "ps": config.ps,
            "worker_cpu": config.worker_cpu,
            "ps_cpu": config.ps_cpu,
            "batch_size": size.batch,
            "rows": rows,
            "other_cpu_before": quiet.other_cpu,
            "steal_before": quiet.steal,
            "load1_before": quiet.load1,
            "waited_s": quiet.waited_s,
            "quiet_before": int(quiet.quiet),
            "started_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "note": "",
        }
        try:
            fields, trace = run_job(size, config, rows, settings, args.skip_s, timeout)
        except Exception as exc:  # one bad point must not lose the others
            row |= {"status": "failed", "note": str(exc).splitlines()[0][:200]}
            print(f"    FAILED: {exc}", flush=True)
        else:
            row |= fields | {"status": "ok"}
            notes = []
            for role, lam in (("worker", config.worker_cpu), ("ps", config.ps_cpu)):
                if fields[f"{role}_cpu_used_max"] > 1.15 * lam:
                    notes.append(f"{role} used {fields[f'{role}_cpu_used_max']:.2f} > {lam:g}")
            if notes:
                over_limit += 1
                row["note"] = "limit not enforced? " + "; ".join(notes)
            with files["samples"].open("a") as f:
                f.write(
                    json.dumps(
                        {"order": row["order"], "label": row["label"], "repeat": repeat, **trace}
                    )
                    + "\n"
                )
            print(
                f"    steady {fields['throughput']:>8,.0f}/s over {fields['window_s']:.1f}s "
                f"(drift {fields['drift']:+.0%})  whole {fields['whole_throughput']:>8,.0f}/s "
                f"jct {fields['jct_s']:.1f}s  cores/pod worker {fields['worker_cpu_used']:.2f} "
                f"ps {fields['ps_cpu_used']:.2f} master {fields['master_cpu_used']:.2f}  "
                f"other {quiet.other_cpu:.2f}->{fields['other_cpu_during']:.2f} "
                f"steal {fields['steal_during']:.2f}" + (f"  [{row['note']}]" if notes else ""),
                flush=True,
            )
        runs.append(row)
        write_csv(files["runs"], RUN_COLUMNS, runs)
        write_csv(files["csv"], CSV_COLUMNS, observation_rows(runs))
    total = time.monotonic() - began
    print(f"\n{len(todo)} jobs in {total / 60:.1f} min ({total / max(1, len(todo)):.0f} s a job)")
    if over_limit:
        print(
            f"WARNING: in {over_limit} job(s) a pod used > 1.15x its CPU: the backend did not "
            "enforce the limits, so these are not resource curves (see the sidecar's note)."
        )
    this_pass["finished_at"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    this_pass["minutes"] = round(total / 60, 1)
    this_pass["jobs_over_limit"] = over_limit
    not_enforced = sum(1 for r in runs if r.get("cpu_enforced") in (0, "0"))
    this_pass["jobs_cpu_not_enforced"] = not_enforced
    if not_enforced:
        print(
            f"WARNING: the backend did not enforce CPU limits in {not_enforced} job(s) (the "
            "sidecar's cpu_enforced and enforcement columns): their points are not resource curves."
        )
    write_atomic(files["meta"], json.dumps(meta, indent=2) + "\n")


def analyse(args: argparse.Namespace, csv_path: Path, files: dict[str, Path]) -> None:
    observations = observations_from_csv(read_text(csv_path), str(csv_path))
    if not observations:
        raise SystemExit(f"{csv_path}: no observations")
    caps = (args.caps[0], args.caps[1]) if args.caps else None
    train_keys, _ = split_configs(observations, args.train_fraction, args.split_seed)
    train = [o for o in observations if key(o) in train_keys]
    test = [o for o in observations if key(o) not in train_keys]
    runs_path = csv_path.with_name(csv_path.name.removesuffix(".csv") + ".runs.csv")
    unenforced = [r for r in read_runs(runs_path) if r.get("cpu_enforced") == "0"]
    if unenforced:
        print(
            f"WARNING: {runs_path} says {len(unenforced)} job(s) ran without enforced CPU "
            f"limits ({unenforced[0].get('enforcement', '')}): a fit on them says little about "
            "what CPU buys"
        )
    meta_path = csv_path.with_name(csv_path.name.removesuffix(".csv") + ".meta.json")
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    # "Linux-..., 2 CPUs (AMD EPYC), 23.5 GiB RAM, ...": the CPUs and the date are what matter.
    parts = str(meta.get("machine", "machine unknown")).split(", ")
    where = f"{parts[1] if len(parts) > 1 else parts[0]}, {str(meta.get('started_at', ''))[:10]}"
    model_name = meta.get("model", args.model)
    print(
        f"\nfit: {len(observations)} observations of {len({key(o) for o in observations})} "
        f"configurations; {len({key(o) for o in train})} configurations to fit on, "
        f"{len({key(o) for o in test})} held out (split seed {args.split_seed})"
    )
    summary: dict[str, Any] = {"samples": str(csv_path), "split_seed": args.split_seed, "forms": []}
    for form in make_forms(args.forms, caps):
        result = fit_form(form, train, test)
        print(describe(result))
        summary["forms"].append(fit_summary(result))
        if not args.no_plot:
            figure = Path(args.fig_dir) / f"{files['stem']}_{form.name}.png"
            pinned = result.model.gamma_pinned
            gamma = f"γ={result.model.gamma:.2f}" + (" pinned" if pinned else "")
            title = (
                f"{model_name} model, form {form.name} ({gamma}): MAPE "
                f"train {_percent(result.mape(train))} / test {_percent(result.mape(test))}"
                f" — {where}"
            )
            plot(result, figure, title, args.budget)
            print(f"    figure: {figure}")
    write_atomic(files["fit"], json.dumps(summary, indent=2) + "\n")
    print(f"fit summary: {files['fit']}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="See the module docstring and docs/resource-model-fit.md.",
    )
    parser.add_argument("--model", choices=sorted(MODELS), default="small")
    parser.add_argument("--list", action="store_true", help="print the configurations and exit")
    parser.add_argument(
        "--budget",
        type=float,
        default=DEFAULT_BUDGET,
        help=f"most cores of all pods together (default {DEFAULT_BUDGET:g} of the machine's 2)",
    )
    parser.add_argument("--only", help="comma-separated configurations, e.g. 1w1p@0.5/0.25")
    parser.add_argument("--max-configs", type=int, help="a random subset of this many")
    parser.add_argument("--repeats", type=int, default=1, help="measurements per config")
    parser.add_argument("--seed", type=int, default=0, help="run order and --max-configs subset")
    parser.add_argument("--rows", type=int, help="synthetic rows of every job (default: scaled)")
    parser.add_argument(
        "--target-s",
        type=float,
        default=12.0,
        help="seconds of training per job at the expected speed, sets the rows (default 12)",
    )
    parser.add_argument("--min-rows", type=int, default=150_000)
    parser.add_argument("--max-rows", type=int, default=600_000)
    parser.add_argument(
        "--skip-s", type=float, default=1.0, help="seconds left out after training starts"
    )
    parser.add_argument(
        "--max-other-cpu",
        type=float,
        default=0.25,
        help="cores other processes may use before a job starts (default 0.25)",
    )
    parser.add_argument(
        "--max-wait-s", type=float, default=300.0, help="longest wait for that, per job"
    )
    parser.add_argument(
        "--job-timeout-s",
        type=float,
        help="stop a job after this long (default: small 300, medium 1500)",
    )
    parser.add_argument("--torch-threads", type=int, help="override RunSettings.torch_threads")
    parser.add_argument("--resume", action="store_true", help="add to existing output files")
    parser.add_argument("--force", action="store_true", help="overwrite existing output files")
    parser.add_argument(
        "--data-dir", default=str(REPO / "benchmarks" / "data"), help="CSV/JSON output folder"
    )
    parser.add_argument("--fig-dir", default=str(REPO / "docs" / "img"), help="PNG folder")
    parser.add_argument("--stem", help="file name stem (default resource_curves_<model>)")
    parser.add_argument("--fit-only", metavar="CSV", help="fit and plot an existing CSV only")
    parser.add_argument("--no-fit", action="store_true", help="measure only")
    parser.add_argument("--no-plot", action="store_true", help="fit without figures")
    parser.add_argument("--train-fraction", type=float, default=0.6)
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument(
        "--forms",
        type=lambda s: [f.strip() for f in s.split(",") if f.strip()],
        default=["v1", "v2", "v3"],
        help="model forms to fit, of v1, v2, v3, capped (default v1,v2,v3; capped needs --caps)",
    )
    parser.add_argument(
        "--caps",
        type=lambda s: [float(x) for x in s.split(",")],
        help="W,P usable cores per worker/PS for the capped form, inf for none "
        "(default: from the sidecar's CPU use)",
    )
    args = parser.parse_args(argv)
    bad = [f for f in args.forms if f not in FORMS]
    if bad:
        parser.error(f"--forms: unknown {', '.join(bad)} (known: {', '.join(FORMS)})")
    if args.caps is not None and len(args.caps) != 2:
        parser.error("--caps: expected W,P")

    if args.fit_only:
        csv_path = Path(args.fit_only)
        if args.stem is None:
            args.stem = csv_path.name.removesuffix(".csv")
        files = paths(args)
        files["fit"] = csv_path.with_name(f"{args.stem}.fit.json")
        analyse(args, csv_path, files)
        return

    files = paths(args)
    if args.list:
        size = MODELS[args.model]
        configs = choose_configs(args)
        print(f"{len(configs)} configurations (budget {args.budget:g} cores):")
        for c in configs:
            rows = rows_for(c, args, size, RunSettings().shard_rows)
            est = estimated_throughput(c, args.model, size.batch)
            print(
                f"  {label(c):<16} total {c.total_cpu:4.2f} cores  "
                f"prior {est:>7,.0f}/s  {rows:,} rows"
            )
        return
    measure(args, files)
    if not args.no_fit:
        analyse(args, files["csv"], files)


if __name__ == "__main__":
    main()
