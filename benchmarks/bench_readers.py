"""Reader throughput on one core: Parquet and CSV, local and on S3, against today's Criteo reader
and against the trainer's own rate, in one run.

What it measures: the same Criteo-shaped rows (tests/criteo_text.py: SyntheticCriteo's rows
written back as counts and hex tokens) as a Criteo CSV file and as a Parquet file (row groups of
``--shard-rows`` rows), read the way a job's worker reads them: the master opens the dataset and
cuts shards of ``--shard-rows`` rows (``split_ranges``, the job's default 8192), a worker opens
the dataset with ``eager=False`` and reads every shard with ``dataset.read(shard, span)``, the
span being what the master's ``locate`` hands out with a lease. Readers, in order:

* ``criteo local``: today's reader (``format: criteo``), the baseline;
* ``csv local``, ``parquet local``: ``format: csv`` / ``parquet`` through training/tables.py;
* ``csv s3``, ``parquet s3``: the same files in a bucket of a moto server (a real S3 API, a
  process on loopback), through s3fs with ranged reads (training/storage.py).

Rows/s is rows read / wall time of the worker's reads (the master's opening excluded: it is done
once per job), median of ``--repeats``; rows per CPU-second divides by this process's CPU time
instead (s3fs's I/O thread included), which leaves out the time spent waiting for moto. For S3,
the bytes the worker fetched (its ReadCounter) are compared with the bytes of the shards it read
(Parquet: the column chunks of its row groups; CSV: the whole file).

The trainer's rate: the job's own arithmetic in one process (``inproc-ps`` of
benchmarks/ps_throughput.py: WorkerModel over InProcessPs, the small model, batch 512) with one
torch thread, over synthetic batches read before the timed region: samples/s of training alone.

One core: this process is pinned to one CPU (``sched_setaffinity``) with pyarrow's CPU and I/O
pools at one thread; the moto server is pinned to another CPU when there is one, so that the
S3 figures are the reader's cost plus loopback HTTP, not moto's own CPU. moto is a Python server
(Flask): its replies are slower than a real store's on a LAN, so the S3 figures are a lower
bound of what the reader does against S3 itself.

    python benchmarks/bench_readers.py [--rows 200000] [--shard-rows 8192] [--repeats 3]
        [--out docs/results/readers.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa
import pyarrow.parquet as pq

from dlrover_kfp.core.spec import CriteoData, ModelSpec, TableData
from dlrover_kfp.training.data import Dataset, RowRange, split_ranges
from dlrover_kfp.training.datasets import open_dataset
from tests.criteo_text import write_parquet, write_text
from tests.storage_server import MotoServer, new_bucket, start_moto, stop_moto

SMALL = ModelSpec(
    embedding_dim=16,
    table_sizes=(100_000,) * 26,
    dense_features=13,
    bottom_mlp=(64, 32, 16),
    top_mlp=(64, 32, 1),
)


@dataclass
class ReaderResult:
    reader: str
    rows: int
    rows_per_s: list[float]
    rows_per_cpu_s: list[float]
    bytes_fetched: int | None = None
    shard_bytes: int | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.rows_per_s)

    @property
    def median_cpu(self) -> float:
        return statistics.median(self.rows_per_cpu_s)


def pin_to_one_core() -> tuple[int, int | None]:
    """(this process's CPU, a CPU for the moto server or None)."""
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[0]})
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    return cpus[0], (cpus[1] if len(cpus) > 1 else None)


def worker_reads(
    data: CriteoData | TableData, shard_rows: int
) -> tuple[Callable[[], tuple[int, Dataset]], list[RowRange]]:
    """A function that opens the data as a worker and reads every shard, and the shards."""
    master = open_dataset(data, SMALL)
    units = [master.units(s) for s in range(len(master.source_rows))]
    shards, _ = split_ranges(master.source_rows, shard_rows, 0.0, units=units)
    spans = [master.locate(r) for r in shards]

    def read_all() -> tuple[int, Dataset]:
        worker = open_dataset(data, SMALL, eager=False)
        rows = 0
        for shard, span in zip(shards, spans, strict=True):
            rows += len(worker.read(shard, span))
        return rows, worker

    return read_all, shards


def measure(name: str, data: CriteoData | TableData, shard_rows: int, repeats: int) -> ReaderResult:
    read_all, _ = worker_reads(data, shard_rows)
    read_all()  # warm: imports, the page cache, the S3 client's connections
    speeds, cpu_speeds = [], []
    fetched = None
    for _ in range(repeats):
        began, cpu = time.perf_counter(), time.process_time()
        rows, worker = read_all()
        speeds.append(rows / (time.perf_counter() - began))
        cpu_speeds.append(rows / (time.process_time() - cpu))
        counter = getattr(worker, "counter", None)
        fetched = counter.bytes if counter is not None else None
    return ReaderResult(name, rows, speeds, cpu_speeds, bytes_fetched=fetched)


def parquet_shard_bytes(path: Path) -> int:
    """Bytes of every column chunk the reader needs: all of the file's row groups."""
    meta = pq.ParquetFile(path).metadata
    return sum(
        meta.row_group(g).column(c).total_compressed_size
        for g in range(meta.num_row_groups)
        for c in range(meta.num_columns)
    )


def trainer_rate(shard_rows: int, shards: int) -> float:
    """Samples/s of the job's own training arithmetic at one torch thread (reads excluded)."""
    import torch  # noqa: PLC0415

    from benchmarks.ps_throughput import (  # noqa: PLC0415
        MODELS,
        build_trainer,
        job_spec,
        train_shard,
    )

    spec = job_spec(MODELS["small"], rows=shard_rows * (shards + 1), workers=1, ps=1)
    dataset = open_dataset(spec.data, spec.model)
    batches = [
        dataset.read(RowRange(0, i * shard_rows, (i + 1) * shard_rows)) for i in range(shards + 1)
    ]
    torch.set_num_threads(1)
    trainer = build_trainer("inproc-ps", spec)
    train_shard(trainer, batches[0], spec.training.batch_size)  # warm-up
    began = time.perf_counter()
    for batch in batches[1:]:
        train_shard(trainer, batch, spec.training.batch_size)
    return shard_rows * shards / (time.perf_counter() - began)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--shard-rows", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train-shards", type=int, default=12)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    own_cpu, server_cpu = pin_to_one_core()
    results: list[ReaderResult] = []
    with tempfile.TemporaryDirectory(prefix="bench-readers-") as tmp:
        d = Path(tmp)
        csv = write_text(d / "rows.csv", args.rows, SMALL.table_sizes, seed=1)
        parquet = write_parquet(
            d / "rows.parquet", args.rows, SMALL.table_sizes, seed=1, row_group_rows=args.shard_rows
        )
        sizes = {"csv": csv.stat().st_size, "parquet": parquet.stat().st_size}
        print(
            f"{args.rows} rows: csv {sizes['csv']:,} B, parquet {sizes['parquet']:,} B", flush=True
        )
        local: list[tuple[str, CriteoData | TableData]] = [
            ("criteo local", CriteoData(path=str(csv))),
            ("csv local", TableData(format="csv", path=str(csv))),
            ("parquet local", TableData(format="parquet", path=str(parquet))),
        ]
        for name, data in local:
            results.append(measure(name, data, args.shard_rows, args.repeats))
            print(f"  {name:14s} {results[-1].median:>10,.0f} rows/s", flush=True)

        server = start_moto(d / "moto.log")
        try:
            if server_cpu is not None:
                os.sched_setaffinity(server.process.pid, {server_cpu})
            results += measure_s3(server, csv, parquet, args)
        finally:
            stop_moto(server)
        shard_bytes = {"csv s3": sizes["csv"], "parquet s3": parquet_shard_bytes(parquet)}
        for r in results:
            r.shard_bytes = shard_bytes.get(r.reader)

    train = trainer_rate(args.shard_rows, args.train_shards)
    report(results, train, args, own_cpu, server_cpu)


def measure_s3(server: MotoServer, csv: Path, parquet: Path, args: Any) -> list[ReaderResult]:
    for name, value in server.environment().items():
        os.environ[name] = value
    bucket = new_bucket(server)
    bucket.put_file("rows/rows.csv", csv)
    bucket.put_file("rows/rows.parquet", parquet)
    out = []
    for name, data in [
        ("csv s3", TableData(format="csv", path=bucket.url("rows/*.csv"))),
        ("parquet s3", TableData(format="parquet", path=bucket.url("rows/"))),
    ]:
        out.append(measure(name, data, args.shard_rows, args.repeats))
        print(f"  {name:14s} {out[-1].median:>10,.0f} rows/s", flush=True)
    return out


def report(
    results: list[ReaderResult], train: float, args: Any, own_cpu: int, server_cpu: int | None
) -> None:
    baseline = next(r.median for r in results if r.reader == "criteo local")
    print()
    print(f"trainer (inproc-ps, small model, 1 torch thread): {train:,.0f} samples/s")
    print()
    print(
        "| reader | rows/s (median) | [min - max] | rows per CPU-s | vs criteo local "
        "| vs trainer | bytes fetched / shard bytes |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in results:
        ratio = (
            f"{r.bytes_fetched / r.shard_bytes:.3f}"
            if r.bytes_fetched is not None and r.shard_bytes
            else "-"
        )
        print(
            f"| {r.reader} | {r.median:,.0f} | {min(r.rows_per_s):,.0f} - {max(r.rows_per_s):,.0f} "
            f"| {r.median_cpu:,.0f} | {r.median / baseline:.2f} | {r.median / train:.2f} "
            f"| {ratio} |"
        )
    print()
    print(
        f"{platform.python_version()} pyarrow {pa.__version__}, {os.cpu_count()} CPUs, "
        f"reader on CPU {own_cpu}, moto on CPU {server_cpu}, load {os.getloadavg()[0]:.2f}"
    )
    if args.out:
        document = {
            "rows": args.rows,
            "shard_rows": args.shard_rows,
            "trainer_samples_per_s": train,
            "readers": [
                asdict(r) | {"median": r.median, "median_cpu": r.median_cpu} for r in results
            ],
        }
        args.out.write_text(json.dumps(document, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
