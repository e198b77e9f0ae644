"""The dataset a job spec names, whatever its format: the one place that picks the reader.

Criteo files and generated rows are read by :mod:`dlrover_kfp.training.data`, tables (Parquet,
CSV, TSV) by :mod:`dlrover_kfp.training.tables` (pyarrow, imported only for them). The files a
master lists are fingerprinted, so that a worker that lists others refuses to train.
"""

from __future__ import annotations

import hashlib
import os

from dlrover_kfp.core.spec import CriteoData, ModelSpec, SyntheticData, TableData
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.training import storage
from dlrover_kfp.training.data import CRITEO_SUFFIXES, CriteoFiles, Dataset, SyntheticCriteo


def open_dataset(
    data: CriteoData | TableData | SyntheticData,
    model: ModelSpec,
    base_dir: str | os.PathLike[str] = ".",
    *,
    eager: bool = True,
) -> Dataset:
    """The dataset a job spec names. ``data.path`` is a glob or URL; relative to ``base_dir``.

    ``eager=False`` (a worker) defers reading each file's layout until a shard of it is read:
    the master has read them all already, and a worker reads only the files of its shards.
    """
    if isinstance(data, SyntheticData):
        return SyntheticCriteo(
            rows=data.rows,
            table_sizes=model.table_sizes,
            dense_features=model.dense_features,
            seed=data.seed,
        )
    if isinstance(data, TableData):
        from dlrover_kfp.training.tables import open_table  # noqa: PLC0415 (pyarrow: lazily)

        return open_table(data, model.table_sizes, os.fspath(base_dir), eager=eager)
    files = storage.resolve(data.path, base_dir, key="data.path", suffixes=CRITEO_SUFFIXES)
    return CriteoFiles(files, model.table_sizes, model.dense_features, eager=eager)


def data_fingerprint(dataset: Dataset) -> str:
    """What identifies a file dataset's files as listed now: a digest of every file's URL,
    size and version (``""`` for generated rows). The master puts it in the job's config; a
    worker that lists other files (one added, rewritten or removed since) refuses to train
    rather than read rows that are not the ones the shards were cut from."""
    files = getattr(dataset, "files", None)
    if not files:
        return ""
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f.url}\0{f.size}\0{f.version}\n".encode())
    return digest.hexdigest()[:32]


def check_fingerprint(dataset: Dataset, expected: object) -> None:
    """Refuse a dataset whose files are not the ones the master listed (see
    :func:`data_fingerprint`); ``expected`` absent: a master of an older version, no check."""
    if not isinstance(expected, str) or not expected:
        return
    if data_fingerprint(dataset) != expected:
        raise UserInputError(
            f"data.path: the files of {dataset.description} changed since the job listed them "
            "(a file added, removed or rewritten); the job trains the rows it started with: run "
            "it again to train on the new files"
        )
