"""Training throughput: the parameter-server job as processes against plain in-process PyTorch.

Two questions, answered side by side in one run (ratios, because the machine is noisy):

(a) How fast is one worker + one PS, as two OS processes, compared with training the same
    model in one process? The in-process baselines are
      * ``reference``: :class:`ReferenceTrainer`, stock ``nn.EmbeddingBag(sparse=True)`` +
        ``torch.optim.Adagrad``: "plain PyTorch";
      * ``inproc-ps``: :class:`WorkerModel` over :class:`InProcessPs`: the job's own arithmetic
        (``torch.unique``, ``index_select``, ``index_add_`` Adagrad) without processes or wire.
    Target: process job / best in-process >= 0.60.
(b) How does the job scale from 1 to 2 workers with 1 PS (and with 2 PS)?

How the comparison is kept fair:

* Same data and order. Every loop and job reads the same synthetic Criteo stream (same seed,
  same rows); the shards are the job's own (``split_ranges`` with the job's shard size and
  held-out fraction), consumed in the ledger's order, cut into the same mini-batches (the job's
  batch size). Same model shape, learning rate and initial values (seed 0).
* Data generation is inside the timed region for both. The job's worker reads each shard of 8192
  rows in a prefetch thread of its own process, so the in-process loops call
  ``dataset.read(shard)`` once per shard inside their timed region too. The loops also time the
  reads alone, and the table shows each loop without them ("train only") as well; the ratio is
  given against both, the stricter one being "vs train only".
* Threads. Every job process runs torch with 1 thread (the job's setting). The in-process loops
  run at 1 and at 2 threads (``torch.set_num_threads``) and the denominator of the ratio is the
  best of the four in-process figures of the same round: the strongest baseline.
* Warm-up excluded on both sides. An in-process loop trains shard 0 untimed, then times the
  next ``--baseline-shards`` shards. A job's steady-state figure comes from its profile's
  runtime samples (every ``0.5 s``): samples processed between the first sample that saw any
  trained rows and the last sample before the end of training, over the time between the two.
  This leaves out process start-up, PS initialisation, the first shard and the end (the last
  shard, the final checkpoint, evaluation and export). The whole-run figure,
  samples / job completion time, is printed as well.
* Interleaving. Each round measures, in turn: the 1-worker job, the four in-process loops, the
  2-worker job(s). Ratios are taken within a round and the median and range over rounds are
  printed, so that slow phases of the (shared) machine hit both sides of a ratio alike.

Per-process CPU use during the steady window (mean ``cpu_used`` of the profile samples, per
role, and the master's, i.e. this process's) explains the scaling: on 2 cores, 2 workers + 1 PS
are 3 busy processes.

    python benchmarks/ps_throughput.py                   # small model, 3 rounds, < 5 min
    python benchmarks/ps_throughput.py --model medium --repeats 1
    python benchmarks/ps_throughput.py --profile         # + cProfile of the worker and the PS

``--profile`` adds, after the table, a cProfile of the in-process ``inproc-ps`` loop and of one
1-worker job whose worker and PS processes run under ``python -m cProfile`` (through a wrapper
given as ``RunSettings.python``). cProfile sees main threads only (the worker's prefetch thread
is missing; the PS serves on its main thread) and slows Python-heavy code, so time blocked in
``sendmsg``/``recv_into`` is inflated: read it for proportions. For an unperturbed picture of
all threads, sample a running job with ``py-spy record --idle --threads --nonblocking``.

The medium model's default run takes ~7 minutes a round: its PS spent ~40 s starting
(26 M rows to initialise, a 6.6 GB snapshot buffer; ~10.5 s since, see
``benchmarks/ps_startup.py``) and ~55 s after training (final checkpoint, evaluation,
export), which is why its whole-run figure is low.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import gc
import io
import os
import platform
import pstats
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrover_kfp.backends import LocalBackend
from dlrover_kfp.core.documents import parse
from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.runtime.job import static_run
from dlrover_kfp.runtime.options import RunOptions, RunSettings
from dlrover_kfp.training.data import Batch, Dataset, RowRange, split_ranges
from dlrover_kfp.training.datasets import open_dataset
from dlrover_kfp.training.ps_state import PsConfig, PsState
from dlrover_kfp.training.reference import ReferenceTrainer
from dlrover_kfp.training.step import InProcessPs, WorkerModel

DATA_SEED = 1
LEARNING_RATE = 0.05
SAMPLE_INTERVAL_S = 0.5


@dataclass(frozen=True)
class ModelSize:
    tables: int
    rows_per_table: int
    dim: int
    bottom: tuple[int, ...]
    top: tuple[int, ...]
    batch: int
    #: default synthetic rows of a job: ~15-30 s of training with 1 worker on 2 cores
    job_rows: int
    #: default shards each in-process loop times (after one warm-up shard)
    baseline_shards: int
    memory: str  # per pod, generous: the local backend kills a pod above it


MODELS = {
    "small": ModelSize(26, 100_000, 16, (64, 32, 16), (64, 32, 1), 512, 1_000_000, 20, "8Gi"),
    "medium": ModelSize(
        26, 1_000_000, 32, (128, 64, 32), (128, 64, 1), 1024, 1_000_000, 12, "22Gi"
    ),
    # The small model's tables under MLPs ~15x its multiply-adds per sample: compute on the
    # worker dominates, as in cluster DLRMs, and 512-wide matrices split across threads
    # (benchmarks/resource_curves.py measures workers above one core with it).
    "wide": ModelSize(26, 100_000, 16, (512, 256, 16), (512, 256, 1), 1024, 300_000, 6, "8Gi"),
    # ~3x the wide model's multiply-adds per sample (1.8x its measured step time a sample)
    "xwide": ModelSize(26, 100_000, 16, (1024, 512, 16), (1024, 512, 1), 1024, 150_000, 4, "8Gi"),
}


def job_spec(
    size: ModelSize, rows: int, workers: int, ps: int, cpus: tuple[float, float] = (1.0, 1.0)
) -> JobSpec:
    """The benchmark's job; ``cpus`` are the cores of each worker and each PS."""
    doc = {
        "name": f"bench-{workers}w{ps}p",
        "model": {
            "kind": "dlrm",
            "embedding_dim": size.dim,
            "table_sizes": [size.rows_per_table] * size.tables,
            "dense_features": 13,
            "bottom_mlp": list(size.bottom),
            "top_mlp": list(size.top),
        },
        "data": {"format": "synthetic", "rows": rows, "seed": DATA_SEED},
        "training": {"batch_size": size.batch, "epochs": 1, "learning_rate": LEARNING_RATE},
        "resources": {
            "workers": {"count": workers, "cpu": cpus[0], "memory": size.memory},
            "ps": {"count": ps, "cpu": cpus[1], "memory": size.memory},
        },
    }
    return parse(JobSpec, doc, "ps_throughput benchmark")


# ------------------------------------------------------------------------ in-process loops


class Trainer(Protocol):
    """What both in-process trainers offer."""

    def train_step(self, batch: Batch) -> float: ...


def build_trainer(kind: str, spec: JobSpec) -> Trainer:
    if kind == "reference":
        return ReferenceTrainer(spec.model, LEARNING_RATE, seed=0)
    state = PsState(PsConfig(spec.model, num_ps=1, ps_index=0, learning_rate=LEARNING_RATE))
    return WorkerModel(spec.model, InProcessPs([state]), seed=0)


def train_shard(trainer: Trainer, batch: Batch, batch_size: int) -> None:
    """The worker's own loop over one shard (dlrover_kfp.training.node.run_worker)."""
    for start in range(0, len(batch), batch_size):
        trainer.train_step(batch.slice(start, min(start + batch_size, len(batch))))


@dataclass
class LoopResult:
    rows: int
    seconds: float  # training and reading
    read_seconds: float

    @property
    def with_read(self) -> float:
        return self.rows / self.seconds

    @property
    def train_only(self) -> float:
        return self.rows / (self.seconds - self.read_seconds)


def in_process_loop(
    kind: str, threads: int, spec: JobSpec, shards: Sequence[RowRange]
) -> LoopResult:
    """Train shard 0 untimed, then time ``shards[1:]`` read and trained one after the other."""
    dataset: Dataset = open_dataset(spec.data, spec.model)
    trainer = build_trainer(kind, spec)
    batch_size = spec.training.batch_size
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        train_shard(trainer, dataset.read(shards[0]), batch_size)
        read_s = 0.0
        began = time.perf_counter()
        for rows in shards[1:]:
            t = time.perf_counter()
            batch = dataset.read(rows)
            read_s += time.perf_counter() - t
            train_shard(trainer, batch, batch_size)
        elapsed = time.perf_counter() - began
    finally:
        torch.set_num_threads(previous)
        del trainer
        gc.collect()
    return LoopResult(sum(r.rows for r in shards[1:]), elapsed, read_s)


# ------------------------------------------------------------------------ process jobs


@dataclass
class JobResult:
    steady: float  # samples/s in the steady window
    whole: float  # samples / JCT
    jct: float
    window: tuple[float, float]
    cpu: dict[str, float]  # mean cores per process of each role in the window; "master" too
    workers: int
    ps: int
    per_worker: list[float] = field(default_factory=list)

    @property
    def cpu_us_per_sample(self) -> float:
        """CPU time of all the job's processes (master included) per trained sample."""
        cores = self.workers * self.cpu["worker"] + self.ps * self.cpu["ps"] + self.cpu["master"]
        return cores / self.steady * 1e6


def steady_window(profile: JobProfile) -> tuple[int, int, list[float]]:
    """(first, last) sample indexes of the steady window and the cumulative samples per sample.

    A sample's ``throughput`` is (samples now - samples at the previous sample) / (time between),
    so the cumulative count is the sum of throughput x interval.
    """
    cumulative, total, t_prev = [], 0.0, 0.0
    for s in profile.samples:
        total += s.throughput * (s.time - t_prev)
        t_prev = s.time
        cumulative.append(total)
    first = next(i for i, c in enumerate(cumulative) if c > 0)
    # The last sample before every row was counted; never the very last sample, which the run
    # takes once the workers have exited.
    done = cumulative[-1] - 0.5
    last = max((i for i, c in enumerate(cumulative[:-1]) if c < done), default=-1)
    if last <= first:
        raise RuntimeError("the job was too short for a steady window: give it more --rows")
    return first, last, cumulative


def run_job(
    size: ModelSize,
    rows: int,
    workers: int,
    ps: int,
    *,
    python: str | None = None,
    cpus: tuple[float, float] = (1.0, 1.0),
) -> JobResult:
    spec = job_spec(size, rows, workers, ps, cpus)
    marks: list[tuple[float, float]] = []  # (monotonic, this process's CPU s) at each sample

    def progress(line: str) -> None:
        if line.startswith("["):  # the line that follows every runtime sample but the last
            marks.append((time.monotonic(), time.process_time()))

    settings = RunSettings(checkpoint_interval_s=0, sample_interval_s=SAMPLE_INTERVAL_S)
    if python is not None:
        settings = dataclasses.replace(settings, python=python)
    with tempfile.TemporaryDirectory(prefix="ps_throughput-") as tmp:
        out = Path(tmp)
        with LocalBackend(out / "logs") as backend:
            options = RunOptions(output_dir=out, base_dir=out, settings=settings)
            run = static_run(spec, backend, options, progress=progress)
            result = run.run()
        if not result.succeeded:
            logs = "\n".join(p.read_text()[-2000:] for p in sorted((out / "logs").glob("*.log")))
            raise RuntimeError(f"job failed: {result.profile.outcome.reason}\n{logs}")
    profile = result.profile
    first, last, cumulative = steady_window(profile)
    samples = profile.samples
    t0, t1 = samples[first].time, samples[last].time
    steady = (cumulative[last] - cumulative[first]) / (t1 - t0)
    outcome = profile.outcome
    cpu: dict[str, list[float]] = {"worker": [], "ps": []}
    per_worker: dict[str, list[float]] = {}
    for s in samples[first + 1 : last + 1]:  # each measured over the interval before it
        for node in s.nodes:
            cpu[node.role].append(node.cpu_used)
            if node.throughput is not None:
                per_worker.setdefault(node.name, []).append(node.throughput)
    # The master's marks come right after each sample (first progress line: the first sample).
    master = 0.0
    if len(marks) > last:
        (w0, c0), (w1, c1) = marks[first], marks[last]
        master = (c1 - c0) / (w1 - w0) if w1 > w0 else 0.0
    return JobResult(
        steady=steady,
        whole=outcome.samples_processed / outcome.jct_seconds,
        jct=outcome.jct_seconds,
        window=(t0, t1),
        cpu={
            "worker": statistics.fmean(cpu["worker"]),
            "ps": statistics.fmean(cpu["ps"]),
            "master": master,
        },
        workers=workers,
        ps=ps,
        per_worker=[statistics.fmean(v) for _, v in sorted(per_worker.items())],
    )


# ------------------------------------------------------------------------ report


def machine() -> str:
    model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{platform.platform()}, {os.cpu_count()} CPUs ({model}), {ram:.1f} GiB RAM, "
        f"Python {platform.python_version()}, torch {torch.__version__}, numpy {np.__version__}"
    )


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def fmt(values: Sequence[float], unit: str = "") -> str:
    med = statistics.median(values)
    if abs(med) >= 100:
        return f"{med:>8,.0f}{unit}  [{min(values):,.0f} - {max(values):,.0f}]"
    return f"{med:>8.2f}{unit}  [{min(values):.2f} - {max(values):.2f}]"


LOOPS = [("reference", 1), ("reference", 2), ("inproc-ps", 1), ("inproc-ps", 2)]


@dataclass
class Round:
    loops: dict[tuple[str, int], LoopResult]
    jobs: dict[str, JobResult]

    def best(self, *, with_read: bool = True) -> float:
        """The strongest in-process figure of this round."""
        return max(r.with_read if with_read else r.train_only for r in self.loops.values())

    def best_loop(self) -> tuple[str, int]:
        return max(self.loops.items(), key=lambda item: item[1].with_read)[0]


def report(rounds: list[Round], configs: Sequence[str]) -> None:
    n = len(rounds)
    print(f"\nsamples/s, median [min - max] over {n} round(s)\n")
    print(f"{'in-process loop (1 process)':<44} {'with data reads':>28}   {'train only':>28}")
    for kind, threads in LOOPS:
        w = [r.loops[kind, threads].with_read for r in rounds]
        t = [r.loops[kind, threads].train_only for r in rounds]
        print(f"{f'{kind}, {threads} thread(s)':<44} {fmt(w):>28}   {fmt(t):>28}")
    print(f"\n{'process job (1 thread per process)':<44} {'steady state':>28}   {'whole run':>28}")
    for cfg in configs:
        s = [r.jobs[cfg].steady for r in rounds]
        w = [r.jobs[cfg].whole for r in rounds]
        print(f"{cfg:<44} {fmt(s):>28}   {fmt(w):>28}")

    print("\n(a) ratios, per round then median [min - max]:")
    one = "1 worker + 1 PS"
    ratios = {
        "job steady / best in-process (with reads)": [
            r.jobs[one].steady / r.best() for r in rounds
        ],
        "job steady / best in-process (train only)": [
            r.jobs[one].steady / r.best(with_read=False) for r in rounds
        ],
        "job whole run / best in-process (with reads)": [
            r.jobs[one].whole / r.best() for r in rounds
        ],
    }
    for label, values in ratios.items():
        print(f"  {label:<58} {fmt(values)}   (target >= 0.60)")
    ref = [
        r.jobs[one].steady / max(r.loops["reference", t].with_read for t in (1, 2)) for r in rounds
    ]
    print(f"  {'job steady / best stock PyTorch reference (with reads)':<58} {fmt(ref)}")
    winners = [r.best_loop() for r in rounds]
    print("  best in-process loop per round: " + ", ".join(f"{k}/{t}t" for k, t in winners))

    print("\n(b) scaling (steady state):")
    for cfg in configs[1:]:
        ratio = [r.jobs[cfg].steady / r.jobs[one].steady for r in rounds]
        print(f"  {cfg + ' / ' + one:<58} {fmt(ratio)}")

    print("\nmean CPU cores used per process in the steady window (profile samples), and CPU")
    print("time per trained sample of all the job's processes together (an in-process loop at")
    print("1 thread spends 1e6 / its samples/s):")
    head = ("per worker", "per PS", "master", "CPU us/sample")
    print(f"  {'job':<18}" + "".join(f"{h:>24}" for h in head))
    for cfg in configs:
        jobs = [r.jobs[cfg] for r in rounds]
        cols = [fmt([j.cpu[role] for j in jobs]) for role in ("worker", "ps", "master")]
        cols.append(fmt([j.cpu_us_per_sample for j in jobs]))
        print(f"  {cfg:<18}" + "".join(f"{c:>24}" for c in cols))
    for kind in ("reference", "inproc-ps"):
        us = fmt([1e6 / r.loops[kind, 1].with_read for r in rounds])
        print(f"  {kind + ', 1 thread':<18}" + " " * 72 + f"{us:>24}")
    for cfg in configs[1:]:
        per = [", ".join(f"{x:,.0f}" for x in r.jobs[cfg].per_worker) for r in rounds]
        print(f"  per-worker samples/s, {cfg}: " + " | ".join(per))


# ------------------------------------------------------------------------ profiling


def print_stats(title: str, stats: pstats.Stats, limit: int = 18) -> None:
    buf = io.StringIO()
    stats.stream = buf  # type: ignore[attr-defined]
    stats.sort_stats("tottime").print_stats(limit)
    body = buf.getvalue()
    start = body.find("   ncalls")
    print(f"\n--- {title} ---")
    print(body[start:] if start >= 0 else body)


def profile_all(size: ModelSize, spec: JobSpec, shards: Sequence[RowRange], rows: int) -> None:
    prof = cProfile.Profile()
    dataset = open_dataset(spec.data, spec.model)
    trainer = build_trainer("inproc-ps", spec)
    train_shard(trainer, dataset.read(shards[0]), spec.training.batch_size)
    prof.enable()
    for r in shards[1:]:
        train_shard(trainer, dataset.read(r), spec.training.batch_size)
    prof.disable()
    del trainer
    gc.collect()
    print_stats(
        f"in-process WorkerModel over InProcessPs, {len(shards) - 1} shards", pstats.Stats(prof)
    )

    with tempfile.TemporaryDirectory(prefix="ps_throughput-prof-") as tmp:
        wrapper = Path(tmp) / "python"
        # The backend runs PYTHON -m dlrover_kfp.training.node ROLE INDEX --master HOST:PORT.
        wrapper.write_text(
            f'#!/bin/sh\nexec "{sys.executable}" -m cProfile -o "{tmp}/$3-$4.prof" "$@"\n'
        )
        wrapper.chmod(0o755)
        job = run_job(size, rows, 1, 1, python=str(wrapper))
        print(
            f"\nprofiled job (1 worker + 1 PS under cProfile): steady {job.steady:,.0f} "
            f"samples/s, worker {job.cpu['worker']:.2f} cores, PS {job.cpu['ps']:.2f} cores"
        )
        for name in ("worker-0", "ps-0"):
            path = Path(tmp) / f"{name}.prof"
            if path.exists():
                print_stats(f"{name} process (main thread)", pstats.Stats(str(path)))


# ------------------------------------------------------------------------ main


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--model", choices=sorted(MODELS), default="small")
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="interleaved rounds (default 3; 0 with --profile: profile only)",
    )
    parser.add_argument("--rows", type=int, help="synthetic rows of each job (default per model)")
    parser.add_argument(
        "--baseline-shards", type=int, help="shards each in-process loop times (default per model)"
    )
    parser.add_argument(
        "--no-two-ps", action="store_true", help="skip the 2 workers + 2 PS job (saves ~1/4)"
    )
    parser.add_argument("--profile", action="store_true", help="cProfile worker and PS after")
    parser.add_argument(
        "--worker-cpu", type=float, default=1.0, help="cores per worker pod (a CFS quota)"
    )
    parser.add_argument("--ps-cpu", type=float, default=1.0, help="cores per PS pod")
    args = parser.parse_args(argv)
    size = MODELS[args.model]
    rows = args.rows or size.job_rows
    n_shards = args.baseline_shards or size.baseline_shards
    torch.set_num_threads(1)  # this process is the job's master while a job runs
    # torch.optim.Adagrad's sparse step warns once that invariant checks are off; not news.
    warnings.filterwarnings("ignore", message="Sparse invariant checks")

    spec = job_spec(size, rows, 1, 1)
    settings = RunSettings()
    dataset = open_dataset(spec.data, spec.model)
    train, _ = split_ranges(dataset.source_rows, settings.shard_rows, settings.eval_fraction)
    shards = train[: n_shards + 1]
    if len(shards) < 2:
        raise SystemExit("--rows too small for the in-process loops")

    configs = ["1 worker + 1 PS", "2 workers + 1 PS"]
    if not args.no_two_ps:
        configs.append("2 workers + 2 PS")
    shape = {"1 worker + 1 PS": (1, 1), "2 workers + 1 PS": (2, 1), "2 workers + 2 PS": (2, 2)}
    print(f"machine: {machine()}")
    print(f"pods: {args.worker_cpu:g} cores per worker, {args.ps_cpu:g} per PS (enforced quotas)")
    print(
        f"model {args.model}: {size.tables} tables x {size.rows_per_table:,} rows x {size.dim}, "
        f"bottom {list(size.bottom)}, top {list(size.top)}, batch {size.batch}, "
        f"Adagrad lr {LEARNING_RATE}; jobs: {rows:,} synthetic rows (seed {DATA_SEED}, "
        f"{len(train)} training shards of {settings.shard_rows}); in-process loops: "
        f"{len(shards) - 1} shards timed after 1 warm-up"
    )
    began = time.monotonic()

    def note(i: int, label: str, figure: str) -> None:
        elapsed = time.monotonic() - began
        print(f"  [{elapsed:5.0f}s] round {i + 1} {label:<18} {figure}  (load {loadavg()})")

    rounds: list[Round] = []
    for i in range(args.repeats):
        jobs: dict[str, JobResult] = {}
        loops: dict[tuple[str, int], LoopResult] = {}
        # The order of a round: 1-worker job, the in-process loops, the other jobs.
        order: list[str | tuple[str, int]] = [configs[0], *LOOPS, *configs[1:]]
        for item in order:
            if isinstance(item, str):
                res = run_job(size, rows, *shape[item], cpus=(args.worker_cpu, args.ps_cpu))
                jobs[item] = res
                note(
                    i,
                    item,
                    f"steady {res.steady:>8,.0f}/s  whole {res.whole:>8,.0f}/s  "
                    f"window {res.window[0]:.1f}-{res.window[1]:.1f}s of {res.jct:.1f}s",
                )
            else:
                loop = in_process_loop(item[0], item[1], spec, shards)
                loops[item] = loop
                note(
                    i,
                    f"{item[0]} {item[1]}t",
                    f"with reads {loop.with_read:>8,.0f}/s  train only {loop.train_only:>8,.0f}/s",
                )
        rounds.append(Round(loops, jobs))
    if rounds:
        print(f"\ntotal {time.monotonic() - began:.0f}s")
        report(rounds, configs)
    if args.profile:
        profile_all(size, spec, shards, rows)


if __name__ == "__main__":
    main()
