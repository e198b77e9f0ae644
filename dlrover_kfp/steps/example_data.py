"""Example click data as Parquet files: what a user's data-preparation step hands the train
step, for the example pipeline and its tests.

The rows are the synthetic Criteo-shaped rows of the job's model (its dense features and
table sizes; :class:`~dlrover_kfp.training.data.SyntheticCriteo`, so the labels carry a
learnable signal), written back as a user's table would hold them, with Criteo's column names:
``label``, the dense counts ``I1``.. (the raw counts: the reader applies ``log(1 + x)`` itself)
and the categorical ids ``C1``.. as integers, which the reader takes as given (they are within
each table's size). A ``format: parquet`` spec with the default ``columns`` reads them back as
the very rows ``format: synthetic`` would give.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Final

import numpy as np

from dlrover_kfp.errors import UserInputError
from dlrover_kfp.steps.spec import load_job_spec
from dlrover_kfp.training.data import RowRange, SyntheticCriteo

#: Rows per Parquet row group: small, so that a few thousand rows still make several shards.
ROW_GROUP_ROWS: Final = 1000


def write_example_parquet(
    job_spec: str,
    directory: str | os.PathLike[str],
    *,
    rows: int,
    seed: int = 0,
    files: int = 2,
) -> list[Path]:
    """Write ``rows`` example rows for ``job_spec``'s model into ``files`` Parquet files
    (``part-00000.parquet``...) in ``directory``; returns their paths."""
    import pyarrow as pa  # noqa: PLC0415 - only this step and the reader need it
    import pyarrow.parquet as pq  # noqa: PLC0415

    if rows < 1 or files < 1 or files > rows:
        raise UserInputError(f"rows: {rows}, files: {files}; need 1 <= files <= rows")
    model = load_job_spec(job_spec).spec.model
    source = SyntheticCriteo(rows, model.table_sizes, model.dense_features, seed=seed)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, rows, files + 1).astype(int)
    written = []
    for i, (start, end) in enumerate(itertools.pairwise(bounds)):
        batch = source.read(RowRange(0, int(start), int(end)))
        columns: dict[str, object] = {"label": pa.array(batch.labels.astype(np.int64))}
        counts = np.rint(np.expm1(batch.dense.astype(np.float64))).astype(np.int64)
        for j in range(counts.shape[1]):
            columns[f"I{j + 1}"] = pa.array(counts[:, j])
        for t in range(batch.sparse.shape[1]):
            columns[f"C{t + 1}"] = pa.array(batch.sparse[:, t].astype(np.int64))
        path = out / f"part-{i:05d}.parquet"
        pq.write_table(pa.table(columns), path, row_group_size=ROW_GROUP_ROWS)
        written.append(path)
    return written


__all__ = ["ROW_GROUP_ROWS", "write_example_parquet"]
