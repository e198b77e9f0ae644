"""How flat a worker's memory is over a run: the measurement behind Stage 2's worker memory.

    python benchmarks/worker_memory.py [--rows 400000] [--batches 128,512,2048]
                                       [--formats synthetic,parquet] [--workers 2]

Auto-scaling sizes workers at the peak memory their samples showed times
``1 + worker_memory_headroom`` as soon as a plan has ``min_samples`` samples
(core/planner/auto_scale.py ``memory_needs``). That is safe only if a worker's memory after
those samples stays within the headroom of what they showed. This runs the real trainer on this
machine (static plans, local backend, CPU and memory limits enforced by cgroups where the
machine has them) for each batch size and data format, samples every pod's memory as the job
master does (``sample_interval_s`` 2 s), and prints for each run:

* ``early``: the workers' peak over the samples up to the ``min_samples``-th with progress,
  what the first decision at the plan sees;
* ``peak``: the workers' peak over every sample of the run measured the same way (the pods'
  cgroups, or their processes without one);
* ``peak / early``: the headroom the rule needed on that run (1.00: none).

The run's last sample is left out of both and printed apart (``last``; ``-`` when it holds no
worker): it is read as the pods exit. Before the job master stopped filling in a pod the
backend no longer measured with the pod's own report, it read 296-420 MiB there (the
processes' RSS, which counts the shared libraries' pages that a cgroup's anon + shmem leaves
out: about 100 MiB of torch).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

from dlrover_kfp.backends import LocalBackend
from dlrover_kfp.core.documents import load_text, parse
from dlrover_kfp.core.planner.settings import AutoScaleSettings
from dlrover_kfp.core.profile import RuntimeSample
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.runtime.job import static_run
from dlrover_kfp.runtime.options import RunOptions, RunSettings
from dlrover_kfp.steps.example_data import write_example_parquet

MODEL = (
    "{embedding_dim: 16, table_sizes: [1000, 500, 10000, 20000, 50, 300, 100000, 7, 4000, "
    "100, 3000, 60000, 200, 9000, 30, 1500, 80000, 12, 600, 70000, 2500, 400, 5000, 40000, "
    "900, 15000], bottom_mlp: [64, 32, 16], top_mlp: [64, 32, 1]}"
)


def job_text(data: str, batch: int, workers: int) -> str:
    return f"""
name: worker-memory
model: {MODEL}
data: {data}
training: {{batch_size: {batch}, epochs: 1, learning_rate: 0.05}}
resources:
  limits: {{cpu: 2, memory: 12Gi}}
  workers: {{count: {workers}, cpu: 0.5, memory: 2Gi}}
  ps: {{count: 1, cpu: 0.5, memory: 2Gi}}
"""


def run_one(
    job: JobSpec, out: Path, show: bool = False
) -> tuple[float, float, int, float | None, float]:
    """(early peak, whole-run peak, samples, the last sample's worker peak or None, JCT)."""
    settings = RunSettings(sample_interval_s=2.0, checkpoint_interval_s=0.0)
    with LocalBackend(out / "logs") as backend:
        options = RunOptions(output_dir=out, base_dir=Path.cwd(), settings=settings)
        profile = static_run(job, backend, options).run().profile
    min_samples = AutoScaleSettings().min_samples

    def worker_peak(sample: RuntimeSample) -> float | None:
        used = [n.memory_used_mb for n in sample.nodes if n.role == "worker"]
        return max(used) if used else None

    # The last sample is read as the pods exit: apart (see the module docstring).
    *during, final = profile.samples
    series = [(peak, x.throughput > 0) for x in during if (peak := worker_peak(x)) is not None]
    if show:
        print("  worker peak per sample (MiB):", [peak for peak, _ in series])
    seen = 0
    early: list[float] = []
    for peak, moving in series:
        seen += moving
        if seen <= min_samples:
            early.append(peak)
    whole = max(peak for peak, _ in series)
    return max(early), whole, len(series), worker_peak(final), profile.outcome.jct_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--batches", default="128,512,2048")
    parser.add_argument("--formats", default="synthetic,parquet")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--files", type=int, default=4, help="Parquet files the rows are split into"
    )
    parser.add_argument("--series", action="store_true", help="print each run's worker peaks")
    args = parser.parse_args()
    print(f"machine: {platform.platform()}, {platform.processor() or platform.machine()}")
    print("format     batch  samples  early MiB  peak MiB  peak/early  last MiB  JCT s")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in args.formats.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                out = Path(tmp) / f"{fmt}-{batch}"
                data = f"{{format: synthetic, rows: {args.rows}, seed: 1}}"
                if fmt == "parquet":
                    spec_file = out / "spec.yaml"
                    spec_file.parent.mkdir(parents=True)
                    spec_file.write_text(job_text(data, batch, args.workers))
                    write_example_parquet(
                        str(spec_file), out / "data", rows=args.rows, files=args.files
                    )
                    data = f"{{format: parquet, path: {out / 'data'}}}"
                text = job_text(data, batch, args.workers)
                job = parse(JobSpec, load_text(text, "benchmark"), "benchmark")
                began = time.monotonic()
                early, peak, n, last, jct = run_one(job, out / "run", args.series)
                ratios.append(peak / early)
                shown = "-" if last is None else f"{last:.0f}"
                print(
                    f"{fmt:9s} {batch:6d}  {n:7d}  {early:9.0f}  {peak:8.0f}  "
                    f"{peak / early:10.3f}  {shown:>8s}  {jct:5.1f}"
                    f"  ({time.monotonic() - began:.0f}s)",
                    flush=True,
                )
    print(f"peak / early: max {max(ratios):.3f}, median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
