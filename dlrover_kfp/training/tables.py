"""Tables of click logs in Parquet, CSV and TSV files, from any fsspec location, read by pyarrow.

A job names its columns (``data.columns``: the label, the dense and the categorical features;
Criteo's ``label, I1..I13, C1..C26`` by default) and the rows come out as a :class:`Batch`, in
exactly the model form of Criteo files (:mod:`dlrover_kfp.training.data`): the same row through
a Criteo file, a CSV table or a Parquet table gives the same arrays.

*Conversion* (:func:`table_batch`), per row:

* label: 0 or 1 (an integer, a boolean, a float 0.0/1.0, or the text ``0``/``1``); anything
  else, or a missing label, makes the row bad (skipped and counted).
* dense ``x`` (any integer or float column; text in CSV): ``log(1 + max(x, 0))``, missing -> 0;
  a value that is not a finite number makes the row bad.
* categorical, a text column: the token's value ``v`` as Criteo's (1-16 hex digits are read as a
  number, any other token through BLAKE2b), ``id = 1 + v mod (S - 1)``, empty or missing -> 0.
  The hex digits are parsed vectorised (numpy over the column's bytes), so a real Criteo column
  costs no Python call per value; only non-hex tokens are hashed one by one.
* categorical, an integer column (ids another step already made): ``id = v`` when
  ``0 <= v < S``, else ``1 + (v mod 2^64) mod (S - 1)``; missing -> 0.

*Shards and bytes.* A Parquet file is one source whose *units* are its row groups: the job's
shards are cut at row-group boundaries (:func:`~dlrover_kfp.training.data.split_ranges`), so a
worker reads exactly the column chunks of its shards' row groups (plus a file's footer when it
moves to the file) and no row group is read by two workers. A text file is read through a
sparse line index, as Criteo files are: the master indexes each file once; it hands every
shard's byte span to the worker with the lease (:meth:`TextTableFiles.locate`), so a worker
reads only its shards' bytes and never indexes a file itself.
"""

from __future__ import annotations

import hashlib
import io
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dlrover_kfp.core.spec import DataColumns, TableData
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.training import storage
from dlrover_kfp.training.data import (
    LINE_END_PROBE,
    Batch,
    IntArray,
    LineIndex,
    RowRange,
    build_index,
    check_tables,
    empty_batch,
    hash_ids,
    line_end,
    read_lines,
)

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

#: File name endings of each format, for a ``data.path`` that names a directory.
SUFFIXES = {"parquet": (".parquet", ".parq", ".pq"), "csv": (".csv",), "tsv": (".tsv", ".txt")}
_DELIMITERS = {"csv": ",", "tsv": "\t"}

_HEX = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX[_c] = 10 + _i


def _pyarrow() -> Any:
    try:
        import pyarrow  # noqa: PLC0415
    except ImportError as exc:  # pragma: no cover - the train extra brings it
        from dlrover_kfp.errors import MissingExtraError  # noqa: PLC0415

        raise MissingExtraError(
            "reading Parquet/CSV tables needs pyarrow: pip install 'dlrover-kfp[train]'"
        ) from exc
    return pyarrow


# ------------------------------------------------------------------------------------------------
# Column conversion
# ------------------------------------------------------------------------------------------------


def token_values(tokens: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(values uint64, missing bool) of a text column, as :func:`~data.token_value` per token.

    Each distinct token is worked out once (a column of click logs repeats its tokens): a token
    of 1-16 hex digits is its number, parsed for all distinct tokens at once (their bytes
    gathered right-aligned into a ``[k, 16]`` matrix, looked up in a digit table, summed as
    ``sum(d_j * 16^(15-j))``); any other token goes through BLAKE2b.
    """
    pa_ = _pyarrow()
    import pyarrow.compute as pc  # noqa: PLC0415

    arr = tokens.combine_chunks() if isinstance(tokens, pa_.ChunkedArray) else tokens
    if not pa_.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr)
    distinct, missing = _distinct_values(arr.dictionary)
    codes = arr.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    absent = codes < 0
    codes[absent] = 0
    if len(distinct) == 0:
        return np.zeros(len(codes), dtype=np.uint64), np.ones(len(codes), dtype=np.bool_)
    values = distinct[codes]
    values[absent] = 0
    return values, missing[codes] | absent


def _distinct_values(dictionary: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(values, missing) of each distinct token (see :func:`token_values`)."""
    pa_ = _pyarrow()
    import pyarrow.compute as pc  # noqa: PLC0415

    arr = dictionary
    if not (pa_.types.is_binary(arr.type)):
        arr = arr.cast(pa_.binary())
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.bool_)
    lengths = pc.binary_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    missing = lengths == 0
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset : arr.offset + n + 1]
    data = arr.buffers()[2]
    raw = np.frombuffer(data, dtype=np.uint8) if data is not None and data.size else None
    if raw is None:
        return np.zeros(n, dtype=np.uint64), missing
    # right-align each token in 16 columns: column j holds byte (len - 16 + j) when >= 0
    pos = offsets[:-1, None].astype(np.int64) + lengths[:, None] - 16 + np.arange(16)
    inside = pos >= offsets[:-1, None]
    digits = np.where(inside, _HEX[raw[np.clip(pos, 0, raw.size - 1)]], 0)
    is_hex = (lengths <= 16) & ~missing & ((digits != 255) | ~inside).all(axis=1)
    weights = np.left_shift(np.uint64(1), np.arange(60, -1, -4, dtype=np.uint64))
    values = (digits.astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
    for i in np.flatnonzero(~is_hex & ~missing):
        token = raw[offsets[i] : offsets[i + 1]].tobytes()
        values[i] = int.from_bytes(hashlib.blake2b(token, digest_size=8).digest(), "big")
    values[missing] = 0
    return values, missing


def _integer_ids(column: np.ndarray, missing: np.ndarray, size: int) -> IntArray:
    """``id = v`` when ``0 <= v < S``, else ``1 + (v mod 2^64) mod (S - 1)``; missing -> 0."""
    v = column.astype(np.int64)
    ids = v.copy()
    outside = (v < 0) | (v >= size)
    if outside.any():
        hashed = hash_ids(
            v[outside].astype(np.uint64)[:, None], np.zeros((int(outside.sum()), 1), bool), [size]
        )[:, 0]
        ids[outside] = hashed
    ids[missing] = 0
    return ids


def _as_numpy(column: Any) -> tuple[np.ndarray, np.ndarray]:
    """(values, null mask) of a numeric column, nulls filled with 0."""
    mask = column.is_null().to_numpy(zero_copy_only=False)
    values = column.fill_null(0).to_numpy(zero_copy_only=False)
    return values, mask


def _float_column(column: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(float64 values with missing as 0, bad mask) of a dense or label column."""
    pa_ = _pyarrow()
    import pyarrow.compute as pc  # noqa: PLC0415

    if isinstance(column, pa_.ChunkedArray):
        column = column.combine_chunks()
    t = column.type
    if pa_.types.is_boolean(t) or pa_.types.is_integer(t) or pa_.types.is_floating(t):
        values, null = _as_numpy(column.cast(pa_.float64()))
        return values.astype(np.float64), null
    if pa_.types.is_string(t) or pa_.types.is_large_string(t):
        stripped = pc.utf8_trim_whitespace(column)
        empty_mask = pc.equal(stripped, "").fill_null(True)
        empty = empty_mask.to_numpy(zero_copy_only=False)
        try:
            filled = pc.if_else(empty_mask, pa_.scalar("0"), stripped)
            values = pc.cast(filled, pa_.float64()).to_numpy(zero_copy_only=False)
            return values.astype(np.float64), empty
        except (pa_.ArrowInvalid, pa_.ArrowNotImplementedError):
            out = np.zeros(len(column), dtype=np.float64)
            bad = np.zeros(len(column), dtype=np.bool_)
            for i, cell in enumerate(stripped.to_pylist()):
                if not cell:
                    continue
                try:
                    out[i] = float(cell)
                except ValueError:
                    bad[i] = True
            # a bad cell is reported as non-finite so that the caller drops its row
            out[bad] = np.nan
            return out, empty
    raise UserInputError(f"data.columns: column {name!r} is {t}; need a number")


def table_batch(
    table: pa.Table, columns: DataColumns, table_sizes: Sequence[int], *, lost_rows: int = 0
) -> Batch:
    """A pyarrow table (the named columns) in model form; bad rows skipped and counted.

    ``lost_rows``: rows the parser already dropped (a CSV line of the wrong width, an empty
    line), counted as bad too.
    """
    pa_ = _pyarrow()
    n = table.num_rows
    dense_n, tables = len(columns.dense), len(columns.sparse)
    if n == 0:
        return empty_batch(dense_n, tables, lost_rows)
    label, label_missing = _float_column(table.column(columns.label), columns.label)
    good = ~label_missing & ((label == 0.0) | (label == 1.0))
    dense = np.zeros((n, dense_n), dtype=np.float64)
    for j, name in enumerate(columns.dense):
        values, _ = _float_column(table.column(name), name)
        dense[:, j] = values
    good &= np.isfinite(dense).all(axis=1)
    sparse = np.zeros((n, tables), dtype=np.int64)
    sizes = check_tables(table_sizes)
    for t, name in enumerate(columns.sparse):
        column = table.column(name).combine_chunks()
        kind = column.type
        if pa_.types.is_dictionary(kind):
            kind = kind.value_type
        if pa_.types.is_integer(kind):
            values, missing = _as_numpy(column.cast(pa_.int64()))
            sparse[:, t] = _integer_ids(values, missing, sizes[t])
        elif (
            pa_.types.is_string(kind)
            or pa_.types.is_large_string(kind)
            or pa_.types.is_binary(kind)
            or pa_.types.is_large_binary(kind)
        ):
            values_u, missing = token_values(column)
            sparse[:, t] = hash_ids(values_u[:, None], missing[:, None], [sizes[t]])[:, 0]
        else:
            raise UserInputError(
                f"data.columns.sparse: column {name!r} is {column.type}; a categorical column "
                "must hold text or integer ids"
            )
    out_dense = np.log1p(np.maximum(dense[good], 0.0)).astype(np.float32)
    return Batch(
        dense=np.ascontiguousarray(out_dense),
        sparse=np.ascontiguousarray(sparse[good]),
        labels=label[good].astype(np.float32),
        bad_rows=lost_rows + int(n - good.sum()),
    )


def _needed(columns: DataColumns) -> list[str]:
    return [columns.label, *columns.dense, *columns.sparse]


# ------------------------------------------------------------------------------------------------
# Parquet
# ------------------------------------------------------------------------------------------------


#: Parsed footers a reader keeps (the most recently used files'). A parsed footer holds every
#: column chunk's metadata, about 1 KiB each in memory (measured: 80 MiB for one file of 2,000
#: row groups x 40 columns). Kept for every file a worker touched, they grew its memory with
#: the files read (217 -> 288 MiB over 16 files of 125 row groups, benchmarks/worker_memory.py),
#: where Stage 2 sizes workers by their memory as flat once measured. Shards are leased in
#: file order, so two footers cover the file a worker reads and the one it moves to; a file
#: read again after falling out costs one footer read more.
FOOTERS_KEPT = 2


class ParquetFiles:
    """Parquet files, each one source whose units are its row groups; implements ``Dataset``.

    The master reads every file's footer when it opens the data (the row counts plan the job
    and cut the shards); a worker reads the footer of a file when it first reads a shard of it.
    Only the row-group boundaries stay for every file; parsed footers for the last
    :data:`FOOTERS_KEPT` files read.
    """

    def __init__(
        self,
        files: Sequence[storage.StoredFile],
        columns: DataColumns,
        table_sizes: Sequence[int],
        *,
        eager: bool = True,
    ) -> None:
        if not files:
            raise UserInputError("data.path: no Parquet file given")
        self._files = tuple(files)
        self._columns = columns
        self._sizes = check_tables(table_sizes)
        #: per file, its row-group boundaries (0, r0, r0 + r1, ..., rows) once its footer was read
        self._bounds: list[tuple[int, ...] | None] = [None] * len(self._files)
        self._footers: OrderedDict[int, pq.FileMetaData] = OrderedDict()
        self._lock = threading.Lock()
        self.counter = storage.ReadCounter()
        if eager:
            for s in range(len(self._files)):
                self.units(s)

    @property
    def files(self) -> tuple[storage.StoredFile, ...]:
        return self._files

    def _keep(self, s: int, footer: pq.FileMetaData) -> None:
        """Keep file ``s``'s parsed footer as the most recently used, dropping the oldest."""
        with self._lock:
            self._footers[s] = footer
            self._footers.move_to_end(s)
            while len(self._footers) > FOOTERS_KEPT:
                self._footers.popitem(last=False)

    def _footer(self, s: int) -> pq.FileMetaData | None:
        with self._lock:
            footer = self._footers.get(s)
            if footer is not None:
                self._footers.move_to_end(s)
            return footer

    def units(self, source: int) -> tuple[int, ...]:
        """Row-group boundaries of file ``source`` (where its shards may be cut), reading (and
        checking) its footer the first time."""
        bounds = self._bounds[source]
        if bounds is None:
            pa_ = _pyarrow()
            import pyarrow.parquet as pq_  # noqa: PLC0415

            f = self._files[source]
            with storage.storage_errors(f.url), storage.open_file(f, self.counter) as fh:
                try:
                    metadata = pq_.ParquetFile(fh).metadata
                except (pa_.ArrowInvalid, OSError) as exc:
                    reason = _first_line(exc)
                    raise UserInputError(
                        f"{storage.display(f.url)}: not a readable Parquet file ({reason}); a "
                        "truncated or partly written object reads like this"
                    ) from None
            self._check_schema(f, metadata.schema.to_arrow_schema())
            counts = [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
            bounds = tuple(int(b) for b in np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]))
            self._bounds[source] = bounds
            self._keep(source, metadata)
        return bounds

    def _check_schema(self, f: storage.StoredFile, schema: pa.Schema) -> None:
        missing = [c for c in _needed(self._columns) if schema.get_field_index(c) < 0]
        if missing:
            raise UserInputError(
                f"{storage.display(f.url)}: no column {missing[0]!r} (data.columns names "
                f"{len(missing)} column(s) the file lacks; it has {schema.names[:8]}"
                f"{'...' if len(schema.names) > 8 else ''})"
            )

    @property
    def source_rows(self) -> tuple[int, ...]:
        return tuple(self.units(s)[-1] for s in range(len(self._files)))

    @property
    def description(self) -> str:
        first = storage.display(self._files[0].url)
        more = f" and {len(self._files) - 1} more" if len(self._files) > 1 else ""
        return f"parquet files {first}{more}"

    def locate(self, rows: RowRange) -> None:
        return None

    def read(self, rows: RowRange, span: Sequence[int] | None = None) -> Batch:
        if rows.source >= len(self._files):
            raise ValueError(f"{rows} names no file: there are {len(self._files)} sources")
        source_bounds = self.units(rows.source)
        total = source_bounds[-1]
        if rows.end > total:
            raise ValueError(f"{rows} is past the end of {self._files[rows.source].url}")
        if rows.rows == 0:
            return empty_batch(len(self._columns.dense), len(self._sizes))
        bounds = np.asarray(source_bounds)
        first = int(np.searchsorted(bounds, rows.start, side="right")) - 1
        last = int(np.searchsorted(bounds, rows.end, side="left"))  # exclusive group index
        groups = list(range(first, last))
        pa_ = _pyarrow()
        import pyarrow.parquet as pq_  # noqa: PLC0415

        f = self._files[rows.source]
        with storage.storage_errors(f.url), storage.open_file(f, self.counter) as fh:
            try:
                # pre_buffer: one coalesced ranged read per row group instead of one per
                # column chunk (on S3, 40 round trips become ~1); with no footer kept,
                # ParquetFile reads it again (one ranged read more) and it is kept from now
                footer = self._footer(rows.source)
                parquet = pq_.ParquetFile(fh, metadata=footer, pre_buffer=True)
                table = parquet.read_row_groups(
                    groups, columns=_needed(self._columns), use_threads=False
                )
                if footer is None:
                    self._keep(rows.source, parquet.metadata)
            except (pa_.ArrowInvalid, OSError) as exc:
                raise UserInputError(
                    f"{storage.display(f.url)}: cannot read rows {rows.start}-{rows.end} "
                    f"({_first_line(exc)})"
                ) from None
        table = table.slice(rows.start - int(bounds[first]), rows.rows)
        return table_batch(table, self._columns, self._sizes)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


# ------------------------------------------------------------------------------------------------
# CSV and TSV
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _TextLayout:
    names: tuple[str, ...]  # the file's column names, in order
    newline: bytes


class TextTableFiles:
    """CSV or TSV files, each one source, parsed by pyarrow; implements ``Dataset``.

    Rows are lines (an empty line among the data is a row, and a bad one, as in Criteo files).
    A field holding a line break inside quotes is not supported: the line index would cut it.
    """

    def __init__(
        self,
        files: Sequence[storage.StoredFile],
        data: TableData,
        table_sizes: Sequence[int],
        *,
        index_stride: int = 256,
    ) -> None:
        if not files:
            raise UserInputError(f"data.path: no {data.format.upper()} file given")
        self._files = tuple(files)
        self._data = data
        self._delimiter = _DELIMITERS[data.format]
        self._sizes = check_tables(table_sizes)
        self._stride = index_stride
        self._layouts: list[_TextLayout | None] = [None] * len(self._files)
        self._indexes: list[LineIndex | None] = [None] * len(self._files)
        self.counter = storage.ReadCounter()

    @property
    def files(self) -> tuple[storage.StoredFile, ...]:
        return self._files

    def _layout(self, s: int) -> _TextLayout:
        layout = self._layouts[s]
        if layout is None and self._files[s].size == 0:
            # An empty file (a writer's empty part file) holds no rows and no header: no rows
            # to read, as a Parquet file of no rows. Not a header missing its columns.
            layout = self._layouts[s] = _TextLayout(tuple(_needed(self._data.columns)), b"\n")
        if layout is None:
            f = self._files[s]
            with storage.storage_errors(f.url), storage.open_file(f, self.counter) as fh:
                head = fh.read(min(LINE_END_PROBE, f.size))
            newline = line_end(head)
            first = head.split(newline, 1)[0].rstrip(b"\r").decode("utf-8", "replace")
            columns = self._data.columns
            if self._data.has_header:
                names = tuple(n.strip().strip('"') for n in first.split(self._delimiter))
                missing = [c for c in _needed(columns) if c not in names]
                if missing:
                    raise UserInputError(
                        f"{storage.display(f.url)}: its header has no column {missing[0]!r} "
                        f"(data.columns; the header names {list(names)[:8]}); a file without a "
                        "header needs data.header: false"
                    )
            else:
                names = tuple(_needed(columns))
                width = len(first.split(self._delimiter))
                if width != len(names):
                    raise UserInputError(
                        f"{storage.display(f.url)}: {width} columns, but data.header: false "
                        f"takes them as label, dense and sparse columns ({len(names)})"
                    )
            layout = self._layouts[s] = _TextLayout(names, newline)
        return layout

    def line_index(self, s: int) -> LineIndex:
        index = self._indexes[s]
        if index is None:
            newline = self._layout(s).newline
            index = build_index(
                self._files[s], self.counter, self._data.has_header, self._stride, newline
            )
            self._indexes[s] = index
        return index

    @property
    def source_rows(self) -> tuple[int, ...]:
        return tuple(self.line_index(s).rows for s in range(len(self._files)))

    def units(self, source: int) -> None:
        return None

    @property
    def description(self) -> str:
        first = storage.display(self._files[0].url)
        more = f" and {len(self._files) - 1} more" if len(self._files) > 1 else ""
        return f"{self._data.format} files {first}{more}"

    def locate(self, rows: RowRange) -> tuple[int, int, int]:
        """(first byte, end byte, lines to skip) of ``rows``: what a worker reads for them."""
        return self.line_index(rows.source).span(rows.start, rows.end)

    def read(self, rows: RowRange, span: Sequence[int] | None = None) -> Batch:
        if rows.source >= len(self._files):
            raise ValueError(f"{rows} names no file: there are {len(self._files)} sources")
        if rows.rows == 0:
            return empty_batch(len(self._data.columns.dense), len(self._sizes))
        if span is None:
            index = self.line_index(rows.source)
            if rows.end > index.rows:
                raise ValueError(f"{rows} is past the end of {self._files[rows.source].url}")
            span = index.span(rows.start, rows.end)
        layout = self._layout(rows.source)
        lines = read_lines(self._files[rows.source], self.counter, span, rows.rows, layout.newline)
        return self._parse(lines, layout)

    def _parse(self, lines: list[bytes], layout: _TextLayout) -> Batch:
        """Parse lines with pyarrow: dense columns typed as numbers (pyarrow converts them in C++);
        should a cell not be a number, the block is parsed again with every column as text and
        converted cell by cell, to find and count the bad rows (the Criteo reader's rule)."""
        body = b"\n".join(lines) + b"\n"
        try:
            table = self._read_csv(body, layout, typed=True)
        except _pyarrow().ArrowInvalid:
            table = self._read_csv(body, layout, typed=False)
        # a line of the wrong width is skipped by the parser, an empty one ignored: both bad
        lost = len(lines) - table.num_rows
        return table_batch(table, self._data.columns, self._sizes, lost_rows=lost)

    def _read_csv(self, body: bytes, layout: _TextLayout, *, typed: bool) -> pa.Table:
        pa_ = _pyarrow()
        import pyarrow.csv as pcsv  # noqa: PLC0415

        columns = self._data.columns
        types = {c: pa_.string() for c in (columns.label, *columns.sparse)}
        types |= {c: pa_.float64() if typed else pa_.string() for c in columns.dense}
        return pcsv.read_csv(
            io.BytesIO(body),
            read_options=pcsv.ReadOptions(column_names=list(layout.names), use_threads=False),
            parse_options=pcsv.ParseOptions(
                delimiter=self._delimiter,
                invalid_row_handler=lambda _: "skip",
                ignore_empty_lines=True,
            ),
            convert_options=pcsv.ConvertOptions(
                include_columns=_needed(columns),
                column_types=types,
                # Only an empty cell is missing (0), as in Criteo files and a Parquet null:
                # pyarrow's default also reads "nan", "NULL", "N/A" as null, which trained a
                # CSV's "nan" as 0 where the same value in Parquet is a bad row.
                null_values=[""],
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )


def open_table(
    data: TableData,
    table_sizes: Sequence[int],
    base_dir: str,
    *,
    eager: bool = True,
) -> ParquetFiles | TextTableFiles:
    """The files ``data.path`` names, as a dataset of their format."""
    files = storage.resolve(data.path, base_dir, key="data.path", suffixes=SUFFIXES[data.format])
    if data.format == "parquet":
        return ParquetFiles(files, data.columns, table_sizes, eager=eager)
    return TextTableFiles(files, data, table_sizes)
