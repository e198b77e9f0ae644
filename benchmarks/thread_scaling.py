"""What a second torch thread buys the trainer's step, at three model sizes, with no CPU quota.

    python benchmarks/thread_scaling.py [--rounds 5] [--models small,wide,xwide]

The worker's step (:class:`~dlrover_kfp.training.step.WorkerModel` over an in-process PS, the
job's own arithmetic: ps_throughput.py's ``inproc-ps`` loop) trains the same shards with one
torch thread and with two, in turn, ``--rounds`` times per model, on this machine's two cores
and no quota: a pod's quota would cut a two-thread step short of its second core
(resource_curves.py's runs at 1.5 cores show it) and mix the quota's throttling into the
answer. Per model the median over rounds of the ratio

    speed-up = samples/s with 2 threads / samples/s with 1 thread      (reading excluded)

gives Amdahl's serial fraction, ``speed-up = 1 / (σ + (1 − σ) / 2)``, so ``σ = 2 / speed-up −
1`` (within [0, 1]). The x-axis is the step's core-seconds per sample with one thread. The
models differ only in their MLPs (ps_throughput.MODELS: small, wide ~3x and xwide ~5x the
small model's worker compute per sample, measured).

Writes ``benchmarks/data/thread_scaling.csv`` (one row per loop) and
``thread_scaling.meta.json``; ``benchmarks/fit_trainer_truth.py`` reads them for the trainer
truth family's serial fraction (dlrover_kfp/sim/cluster/trainer_fit.py).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import time
import warnings
from pathlib import Path

import torch
from ps_throughput import MODELS, in_process_loop, job_spec, loadavg, machine

from dlrover_kfp.files import write_atomic
from dlrover_kfp.runtime.options import RunSettings
from dlrover_kfp.training.data import split_ranges
from dlrover_kfp.training.datasets import open_dataset

DATA = Path(__file__).resolve().parent / "data"
FIELDS = ("model", "round", "threads", "rows", "seconds", "read_seconds", "train_only")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", default="small,wide,xwide")
    parser.add_argument("--data-dir", default=str(DATA))
    args = parser.parse_args()
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if unknown or not names or args.rounds < 1:
        parser.error(
            f"--models: each of {', '.join(sorted(MODELS))}, got {args.models!r}"
            if unknown or not names
            else f"--rounds: at least 1, got {args.rounds}"
        )
    warnings.filterwarnings("ignore", message="Sparse invariant checks")
    out = Path(args.data_dir)
    rows_out = []
    print(f"machine: {machine()}")
    began = time.monotonic()
    for name in names:
        size = MODELS[name]
        spec = job_spec(size, size.job_rows, 1, 1)
        dataset = open_dataset(spec.data, spec.model)
        settings = RunSettings()
        train, _ = split_ranges(dataset.source_rows, settings.shard_rows, settings.eval_fraction)
        shards = train[: size.baseline_shards + 1]
        ratios = []
        for r in range(args.rounds):
            # alternate which thread count goes first, so that a slow phase hits both
            order = (1, 2) if r % 2 == 0 else (2, 1)
            result = {t: in_process_loop("inproc-ps", t, spec, shards) for t in order}
            for t in (1, 2):
                loop = result[t]
                rows_out.append(
                    {
                        "model": name,
                        "round": r,
                        "threads": t,
                        "rows": loop.rows,
                        "seconds": round(loop.seconds, 4),
                        "read_seconds": round(loop.read_seconds, 4),
                        "train_only": round(loop.train_only, 1),
                    }
                )
            ratios.append(result[2].train_only / result[1].train_only)
            print(
                f"[{time.monotonic() - began:5.0f}s] {name} round {r}: 1 thread "
                f"{result[1].train_only:8,.0f}/s, 2 threads {result[2].train_only:8,.0f}/s "
                f"({ratios[-1]:.3f}x)  load {loadavg()}"
            )
        ratios.sort()
        median = ratios[len(ratios) // 2]
        serial = min(1.0, max(0.0, 2.0 / median - 1.0))
        print(f"  {name}: median speed-up {median:.3f}, serial fraction {serial:.3f}")
    # whole files or none: an interrupted run leaves the committed data as it was
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=FIELDS)
    writer.writeheader()
    writer.writerows(rows_out)
    write_atomic(out / "thread_scaling.csv", text.getvalue())
    meta = {
        "machine": machine(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "python benchmarks/thread_scaling.py "
        f"--rounds {args.rounds} --models {args.models}",
        "torch_threads_of_this_process_before": torch.get_num_threads(),
    }
    write_atomic(out / "thread_scaling.meta.json", json.dumps(meta, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
