"""Raw Criteo-format rows with a learnable signal, as text, Parquet or a pyarrow table, for tests
and benchmarks of the data readers.

The rows are :class:`~dlrover_kfp.training.data.SyntheticCriteo`'s, written back to what a click
log holds: integer counts (``round(expm1(dense))``; 0 written as an empty cell on the features the
generator leaves missing) and categorical tokens of 8 hex digits. A token is ``id - 1`` in hex
and an id of 0 an empty cell, so that reading it back (``1 + v mod (S - 1)``) gives the generator's
ids again: a reader that gets these files right trains on the generator's signal.

Every format here is built from the same Python rows, independently of the readers under test.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dlrover_kfp.core.spec import CRITEO_DENSE, CRITEO_LABEL, CRITEO_SPARSE
from dlrover_kfp.training.data import RowRange, SyntheticCriteo

NAMES = (CRITEO_LABEL, *CRITEO_DENSE, *CRITEO_SPARSE)


def criteo_columns(
    rows: int, table_sizes: Sequence[int], seed: int = 0
) -> tuple[list[int], list[list[int | None]], list[list[str]]]:
    """(labels, dense counts per column (None = empty), tokens per column ("" = empty))."""
    synthetic = SyntheticCriteo(rows, table_sizes, seed=seed)
    batch = synthetic.read(RowRange(0, 0, rows))
    counts = np.rint(np.expm1(batch.dense.astype(np.float64))).astype(np.int64)
    labels = [int(x) for x in batch.labels]
    dense: list[list[int | None]] = []
    for j in range(counts.shape[1]):
        column = counts[:, j]
        # a zero count is written empty on odd features, as "0" on even ones: both read as 0
        dense.append([None if (c == 0 and j % 2) else int(c) for c in column])
    tokens = [
        ["" if i == 0 else format(int(i) - 1, "08x") for i in batch.sparse[:, t]]
        for t in range(batch.sparse.shape[1])
    ]
    return labels, dense, tokens


def criteo_table(rows: int, table_sizes: Sequence[int], seed: int = 0) -> pa.Table:
    """The rows as a pyarrow table with Criteo's column names: label int64, I* int64 (nullable),
    C* string ("" for empty, as a CSV reader gives it)."""
    labels, dense, tokens = criteo_columns(rows, table_sizes, seed)
    arrays = [pa.array(labels, pa.int64())]
    arrays += [pa.array(c, pa.int64()) for c in dense]
    arrays += [pa.array(c, pa.string()) for c in tokens]
    return pa.table(arrays, names=list(NAMES))


def write_text(
    path: Path,
    rows: int,
    table_sizes: Sequence[int],
    *,
    seed: int = 0,
    sep: str = ",",
    header: bool = True,
) -> Path:
    """The rows as Criteo text (LF line ends, a final LF)."""
    labels, dense, tokens = criteo_columns(rows, table_sizes, seed)
    lines = [sep.join(NAMES)] if header else []
    for i, label in enumerate(labels):
        cells = [str(label)]
        cells += ["" if c[i] is None else str(c[i]) for c in dense]
        cells += [c[i] for c in tokens]
        lines.append(sep.join(cells))
    path.write_text("\n".join(lines) + "\n")
    return path


def write_parquet(
    path: Path, rows: int, table_sizes: Sequence[int], *, seed: int = 0, row_group_rows: int = 8192
) -> Path:
    """The rows as one Parquet file with row groups of ``row_group_rows`` rows."""
    pq.write_table(criteo_table(rows, table_sizes, seed), path, row_group_size=row_group_rows)
    return path
