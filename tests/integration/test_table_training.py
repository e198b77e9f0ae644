"""Training from a Parquet table on S3 (a real S3 API: the moto server) and from a CSV table on a
local path gives the same model as the same rows through the Criteo reader: the same held-out
AUC and loss, the exact sample count; and each worker reads its shards' bytes, not the files."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from dlrover_kfp.backends import LocalBackend
from dlrover_kfp.core.documents import load_text, parse
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.runtime.job import RunResult, static_run
from dlrover_kfp.runtime.options import RunOptions, RunSettings
from dlrover_kfp.training.data import split_ranges
from tests.criteo_text import write_parquet, write_text
from tests.storage_server import Bucket

ROWS = 20_000
SHARD_ROWS = 4096
SIZES = [2000, 500, 50, 7, *([1000] * 22)]


def spec_for(data: str, workers: int = 1) -> JobSpec:
    tables = ", ".join(str(s) for s in SIZES)
    return parse(
        JobSpec,
        load_text(
            f"""
name: tables
model: {{embedding_dim: 8, table_sizes: [{tables}], bottom_mlp: [16, 8], top_mlp: [16, 1]}}
data: {data}
training: {{batch_size: 256}}
resources:
  workers: {{count: {workers}, cpu: 1, memory: 2Gi}}
  ps: {{count: 1, cpu: 1, memory: 2Gi}}
""",
            "test",
        ),
        "test",
    )


def run(spec: JobSpec, tmp_path: Path, name: str, **settings: Any) -> RunResult:
    out = tmp_path / name
    with LocalBackend(out / "logs") as backend:
        return static_run(
            spec,
            backend,
            RunOptions(
                output_dir=out,
                base_dir=tmp_path,
                settings=RunSettings(
                    checkpoint_interval_s=0.0,
                    sample_interval_s=0.5,
                    shard_rows=SHARD_ROWS,
                    **settings,
                ),
            ),
            progress=lambda line: None,
        ).run()


def bytes_read(result: RunResult) -> dict[str, tuple[int, int]]:
    """Per worker pod: (bytes read, rows), from the line each worker logs at its end."""
    found = {}
    for log in sorted((result.output_dir / "logs").glob("*worker*.log")):
        for m in re.finditer(
            r"data read: (\d+) bytes in \d+ reads for (\d+) rows", log.read_text()
        ):
            found[log.stem] = (int(m.group(1)), int(m.group(2)))
    return found


@pytest.mark.timeout(240)
def test_parquet_on_s3_and_csv_train_as_the_criteo_reader(
    tmp_path: Path, s3_bucket: Bucket
) -> None:
    write_text(tmp_path / "clicks.csv", ROWS, SIZES, seed=11)
    parquet = write_parquet(
        tmp_path / "clicks.parquet", ROWS, SIZES, seed=11, row_group_rows=SHARD_ROWS
    )
    s3_bucket.put_file("day=1/part-0.parquet", parquet)
    s3_bucket.put("day=1/_SUCCESS", b"")

    results = {
        "criteo": run(
            spec_for('{format: criteo, path: "clicks.csv"}'), tmp_path, "criteo", synchronous=True
        ),
        "csv": run(
            spec_for('{format: csv, path: "clicks.csv"}'), tmp_path, "csv", synchronous=True
        ),
        "parquet-s3": run(
            spec_for(f'{{format: parquet, path: "{s3_bucket.url("day=1/")}"}}'),
            tmp_path,
            "s3",
            synchronous=True,
        ),
    }
    train, held = split_ranges([ROWS], SHARD_ROWS, 0.1)
    expected_samples = sum(r.rows for r in train)
    reference = results["criteo"].profile
    for name, result in results.items():
        profile = result.profile
        assert result.succeeded, (name, profile.outcome.reason)
        assert profile.outcome.samples_processed == expected_samples, name
        assert profile.metrics.eval_rows == sum(r.rows for r in held), name
        assert profile.metrics.bad_rows == 0, name
        assert profile.job.data.rows == ROWS, name
        assert profile.job.data.path is not None  # the history says which data it trained on
        assert profile.job.data.format == name.removesuffix("-s3")
        print(
            f"{name}: samples {profile.outcome.samples_processed}, held-out "
            f"{profile.metrics.eval_rows} rows, AUC {profile.metrics.auc}, loss "
            f"{profile.metrics.loss}"
        )
        assert profile.metrics.auc == reference.metrics.auc, name
        assert profile.metrics.loss == reference.metrics.loss, name
    assert reference.metrics.auc is not None and reference.metrics.auc > 0.6  # it learned

    # The worker read its shards' row groups (every column chunk the job names) and the footer.
    meta = pq.ParquetFile(parquet).metadata
    trained_groups = {g for g in range(meta.num_row_groups) if g * SHARD_ROWS < train[-1].end}
    shard_bytes = sum(
        meta.row_group(g).column(c).total_compressed_size
        for g in trained_groups
        for c in range(meta.num_columns)
    )
    ((worker_bytes, worker_rows),) = bytes_read(results["parquet-s3"]).values()
    print(
        f"worker read {worker_bytes} bytes for {worker_rows} rows; its shards' row groups "
        f"hold {shard_bytes} bytes ({worker_bytes / shard_bytes:.3f}x)"
    )
    assert worker_rows == expected_samples
    assert shard_bytes <= worker_bytes <= 1.1 * shard_bytes


@pytest.mark.long
@pytest.mark.timeout(240)
def test_two_workers_each_read_their_shards_bytes_from_s3(
    tmp_path: Path, s3_bucket: Bucket
) -> None:
    """Two asynchronous workers share the shards of 3 Parquet files on S3: each fetches its own
    shards' row groups and each file's footer once, within 10%.

    Each file is 6 row groups of SHARD_ROWS rows and the last one is held out, so that every
    training shard is one whole row group; the groups hold the same rows from one generator,
    so a worker's share is its rows x the groups' bytes per row."""
    per_file, files = 6 * SHARD_ROWS, 3
    chunk_bytes = 0
    for day in range(files):
        path = write_parquet(
            tmp_path / f"part-{day}.parquet", per_file, SIZES, seed=day, row_group_rows=SHARD_ROWS
        )
        s3_bucket.put_file(f"clicks/part-{day}.parquet", path)
        meta = pq.ParquetFile(path).metadata
        for g in range(meta.num_row_groups - 1):  # the last group is held out
            group = meta.row_group(g)
            chunk_bytes += sum(
                group.column(c).total_compressed_size for c in range(group.num_columns)
            )
    result = run(
        spec_for(f'{{format: parquet, path: "{s3_bucket.url("clicks/")}"}}', workers=2),
        tmp_path,
        "two",
        eval_fraction=1 / 6,
    )
    assert result.succeeded, result.profile.outcome.reason
    train, held = split_ranges([per_file] * files, SHARD_ROWS, 1 / 6)
    assert all(r.rows == SHARD_ROWS for r in train) and len(held) == files
    trained = sum(r.rows for r in train)
    assert result.profile.outcome.samples_processed == trained
    per_row = chunk_bytes / trained
    read = bytes_read(result)
    assert len(read) == 2 and sum(rows for _, rows in read.values()) == trained
    footer_read = 64 * 1024  # pyarrow's first read of a file: its last 64 KiB, footer included
    for pod, (nbytes, rows) in read.items():
        expected = rows * per_row + files * footer_read
        print(
            f"{pod}: {nbytes} bytes for {rows} rows; its row groups + footers ~{expected:.0f} "
            f"bytes ({nbytes / expected:.3f}x)"
        )
        assert 0.9 * expected <= nbytes <= 1.1 * expected, pod
