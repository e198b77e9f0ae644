"""How good is each run's model, by worker count: the asynchronous stall, counted.

    python benchmarks/async_quality.py [--rows 300000] [--workers 1 2 4 7] [--runs 10 40 20 10]
                                       [--seed 0] [--busy 0] [--out results.jsonl]

Static runs of the ctr-local job (examples/ctr-local.yaml's model, synthetic data seed 1,
model seed ``--seed``) at ``--rows`` rows, ``--runs[i]`` runs with ``--workers[i]`` workers and
one PS; the quota is the machine's (every worker gets ``1.5 / W`` cores, at least 0.25, the PS
0.5). The one-worker runs are the reference: a one-worker run is deterministic (its one
stream of pushes applies in one order), so its AUC is the model's, not luck's. A run *stalls*
when its held-out AUC is below the one-worker median less 0.02.

Printed per worker count: the runs, stalls, AUC median/min/max, and the median count of *dead
units* at the bottom MLP's output (units that are 0 for every held-out row: that layer is the
only path of the 13 dense features into the model). ``--busy N`` runs N busy loops beside
every run (a loaded machine). ``--out`` appends one JSON line per run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from dlrover_kfp.backends import LocalBackend
from dlrover_kfp.core.documents import load_text, parse
from dlrover_kfp.core.spec import JobSpec, SyntheticData
from dlrover_kfp.runtime.job import static_run
from dlrover_kfp.runtime.options import RunOptions, RunSettings
from dlrover_kfp.training.data import RowRange
from dlrover_kfp.training.datasets import open_dataset
from dlrover_kfp.training.model import FullDLRM

STALL_MARGIN = 0.02
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ctr-local.yaml"


def job(rows: int, workers: int) -> JobSpec:
    """examples/ctr-local.yaml (its model, data seed, batch and learning rate) at ``rows``
    rows with ``workers`` workers of ``1.5 / W`` cores (at least 0.25) and one PS of 0.5."""
    doc = load_text(EXAMPLE.read_text(), str(EXAMPLE))
    doc["name"] = "async-quality"
    doc["data"]["rows"] = rows
    doc["resources"] = {
        "limits": {"cpu": 64, "memory": "64Gi"},
        "workers": {"count": workers, "cpu": max(0.25, round(1.5 / workers, 2)), "memory": "2Gi"},
        "ps": {"count": 1, "cpu": 0.5, "memory": "2Gi"},
    }
    return parse(JobSpec, doc, str(EXAMPLE))


def dead_units(spec: JobSpec, model_dir: Path, rows: int = 4096) -> int:
    """Units of the bottom MLP's output that are 0 on every one of ``rows`` held-out rows."""
    model = FullDLRM(spec.model)
    model.load_state_dict(torch.load(model_dir / "model.pt", weights_only=True))
    data = spec.data
    assert isinstance(data, SyntheticData)
    dataset = open_dataset(data, spec.model)
    cut = data.rows - data.rows // 10  # the held-out tail (split_ranges' rule)
    batch = dataset.read(RowRange(0, cut, min(cut + rows, data.rows)))
    with torch.no_grad():
        z0 = model.dense.bottom(torch.from_numpy(batch.dense))
    return int((z0.abs().amax(dim=0) == 0).sum())


def one_run(spec: JobSpec, seed: int, base: Path) -> dict[str, object]:
    out = Path(tempfile.mkdtemp(dir=base))
    settings = RunSettings(checkpoint_interval_s=0.0, seed=seed)
    options = RunOptions(output_dir=out, base_dir=base, settings=settings)
    t0 = time.monotonic()
    with LocalBackend(out / "logs") as backend:
        result = static_run(spec, backend, options, progress=lambda line: None).run()
    wall = time.monotonic() - t0
    profile = result.profile
    row: dict[str, object] = {
        "workers": spec.resources.workers.count,  # type: ignore[union-attr]
        "ok": result.succeeded,
        "auc": profile.metrics.auc,
        "loss": profile.metrics.loss,
        "samples": profile.outcome.samples_processed,
        "wall_s": round(wall, 1),
    }
    if result.succeeded:
        row["dead_units"] = dead_units(spec, out / "model")
    shutil.rmtree(out, ignore_errors=True)
    return row


def _spin() -> None:
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 7])
    parser.add_argument("--runs", type=int, nargs="+", default=[10, 40, 20, 10])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--busy", type=int, default=0, help="busy loops beside every run")
    parser.add_argument("--out", help="append one JSON line per run here")
    args = parser.parse_args()
    if len(args.runs) != len(args.workers):
        parser.error("--runs needs one count per --workers value")
    print(
        f"machine: {platform.machine()} {multiprocessing.cpu_count()} CPUs, "
        f"{platform.python_version()}, torch {torch.__version__}; rows {args.rows}, "
        f"busy loops {args.busy}",
        flush=True,
    )
    hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy)]
    for hog in hogs:
        hog.start()
    results: dict[int, list[dict[str, object]]] = {}
    base = Path(tempfile.mkdtemp(prefix="async-quality-"))
    try:
        for workers, runs in zip(args.workers, args.runs, strict=True):
            spec = job(args.rows, workers)
            for i in range(runs):
                row = one_run(spec, args.seed, base)
                results.setdefault(workers, []).append(row)
                print(f"  {workers}w run {i + 1}/{runs}: {json.dumps(row)}", flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")
    finally:
        for hog in hogs:
            hog.terminate()
        shutil.rmtree(base, ignore_errors=True)
    summarise(results)


def summarise(results: dict[int, list[dict[str, object]]]) -> None:
    ref = [r["auc"] for r in results.get(1, []) if r["ok"]]
    ref_median = statistics.median(ref) if ref else None  # type: ignore[type-var]
    print(f"\none-worker median AUC: {ref_median}")
    print("workers  runs  failed  stalls  median AUC  min AUC   max AUC   dead units (median)")
    for workers, rows in sorted(results.items()):
        aucs = sorted(float(r["auc"]) for r in rows if r["ok"])  # type: ignore[arg-type]
        dead = [int(r["dead_units"]) for r in rows if r["ok"]]  # type: ignore[call-overload]
        stalls = sum(a < ref_median - STALL_MARGIN for a in aucs) if ref_median is not None else "-"
        print(
            f"{workers:>7}  {len(rows):>4}  {len(rows) - len(aucs):>6}  {stalls!s:>6}  "
            f"{statistics.median(aucs):10.4f}  {aucs[0]:.4f}  {aucs[-1]:8.4f}  "
            f"{statistics.median(dead):>5}"
        )


if __name__ == "__main__":
    sys.exit(main())
