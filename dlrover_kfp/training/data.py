"""Training data for the DLRM trainer: Criteo click logs and a Criteo-shaped synthetic stream.

Everything the trainer sees is a :class:`Batch` of three arrays, already in model form:

* ``dense``  float32 ``[n, dense_features]``: the integer features ``x`` as ``log(1 + max(x, 0))``
  (missing ``x`` counts as 0). Criteo's counts span seven orders of magnitude; the log keeps
  the bottom MLP's inputs in ``[0, ~20]`` so that one learning rate suits every feature.
* ``sparse`` int64 ``[n, num_tables]``: one embedding row id per categorical feature, already in
  ``[0, table_sizes[t])``, so the trainer indexes its tables without another modulo.
* ``labels`` float32 ``[n]``: 1 for a click, 0 otherwise.

A *source* is one file (or the one synthetic stream) and a :class:`RowRange` is a shard of it:
rows ``[start, end)`` of source ``source``. ``read`` is deterministic, so a shard that a failed
worker had read can be handed to another worker and gives the same rows again; and reading two
adjacent ranges gives exactly the rows of their union, so shards can be cut anywhere.

**Criteo files.** The released files (1 TB and Kaggle) are tab separated without a header; the
copies that circulate in examples are comma separated, some with a ``label,I1,..,C26`` header,
some with CRLF line ends, a few (saved by old Mac tools) with CR alone. :class:`CriteoFiles`
reads a file's line end from its first block (CR when it holds a CR and no LF, else LF) and
looks at its first line: the
separator is a tab if that line holds one, else a comma; the line is a header if its first
field is not a number (so a header-less file whose first row has a non-numeric label loses that
row silently rather than counting it as bad). Each file is indexed once, in one pass of numpy
over its bytes (~1.5 GB/s from the page cache): the byte offset of every 256th line
(:class:`LineIndex`), trailing empty lines dropped. A ``read`` then seeks straight to its rows
and parses only those, at 100-150k rows/s on one core (the per-line split is CPython; the
conversions are bulk). Only plain text: gzip'ed days must
be unpacked first.

*Categorical hashing.* A token becomes an integer value ``v`` that is the same in every process
and run (never Python's salted ``hash``):

    v = int(token, 16)                          token of 1-16 hex digits (all real Criteo tokens)
    v = blake2b(token, 8 bytes) as big-endian   anything else

and the id in a table of ``S`` rows is

    id = 0                                      token missing (empty), or S = 1
    id = 1 + v mod (S - 1)                      otherwise

Row 0 of every table is reserved for "missing", so that a missing value, which is frequent and
carries meaning of its own in Criteo, never shares its embedding with a real token.

*Bad rows* (wrong column count, an empty line among the data included; a label other than 0/1;
an integer feature that is not a finite number) are skipped and counted in
:attr:`Batch.bad_rows`; the reader never fails on them, because one corrupt line in a 45 GB day
file must not stop a training job.

**Synthetic data.** :class:`SyntheticCriteo` generates Criteo-shaped rows with a *planted* click
signal, for tests, benchmarks and the simulator, where a real data set is not at hand. Rows come
in blocks of ``block_rows``; block ``b`` is drawn from ``np.random.default_rng([seed, b])``, so
any range is generated on its own, in any process, and equals the same rows of any other read.
Measured speed: 1,000,000 rows, 26 tables, 13 dense features in 0.74 s on one core (median of
5; 1.3 s for the first read in a fresh process, which pays the page faults; numpy 2.4, x86-64).
The stream is the same for the same numpy version (PCG64 and its ``random``/``standard_normal``
are stable in practice, but numpy does not promise it across versions); see
:class:`SyntheticCriteo` for the shape of the data.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from dlrover_kfp.errors import DataUnavailableError, UserInputError
from dlrover_kfp.training import storage

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]
U64Array = npt.NDArray[np.uint64]
F64Array = npt.NDArray[np.float64]

#: Criteo's fixed layout: label, 13 integer features, 26 categorical features.
CRITEO_DENSE_FEATURES = 13
CRITEO_TABLES = 26

_NEWLINE = ord("\n")
_CR = ord("\r")
_INDEX_CHUNK = 1 << 24  # bytes per read while indexing: bounds memory on 45 GB files
_HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")
_LABELS = {b"0": 0.0, b"1": 1.0}
#: File name endings of Criteo logs, for a ``data.path`` that names a directory.
CRITEO_SUFFIXES = (".csv", ".tsv", ".txt")

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------
# Shards and batches
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RowRange:
    """A data shard: rows ``[start, end)`` of source ``source`` (a file or the synthetic stream)."""

    source: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if self.source < 0 or self.start < 0 or self.end < self.start:
            raise ValueError(f"row range needs source >= 0 and 0 <= start <= end, got {self}")

    @property
    def rows(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True, eq=False)
class Batch:
    """Rows in model form (see the module docstring); ``bad_rows`` were skipped to produce them.

    ``eq=False``: arrays have no single truth value, so equality would be a trap; compare the
    arrays with ``np.array_equal`` instead.
    """

    dense: FloatArray
    sparse: IntArray
    labels: FloatArray
    bad_rows: int = 0

    def __post_init__(self) -> None:
        n = self.labels.shape[0]
        if (
            self.labels.ndim != 1
            or self.dense.ndim != 2
            or self.sparse.ndim != 2
            or self.dense.shape[0] != n
            or self.sparse.shape[0] != n
        ):
            raise ValueError(
                f"batch arrays disagree: dense {self.dense.shape}, sparse {self.sparse.shape}, "
                f"labels {self.labels.shape}"
            )

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def slice(self, start: int, stop: int) -> Batch:
        """Rows ``[start, stop)`` as views (no copy).

        ``bad_rows`` goes with the slice that starts at row 0 and is 0 on every other one, so that
        cutting a batch into consecutive mini-batches counts each skipped row exactly once.
        """
        return Batch(
            dense=self.dense[start:stop],
            sparse=self.sparse[start:stop],
            labels=self.labels[start:stop],
            bad_rows=self.bad_rows if start == 0 else 0,
        )


@runtime_checkable
class Dataset(Protocol):
    """Rows that can be read by range, the same every time."""

    @property
    def source_rows(self) -> tuple[int, ...]:
        """Row count of each source (file or synthetic stream), bad rows included."""
        ...

    @property
    def description(self) -> str:
        """One line for logs and metrics: what the data is."""
        ...

    def read(self, rows: RowRange, span: Sequence[int] | None = None) -> Batch:
        """Rows ``[rows.start, rows.end)`` of source ``rows.source``; deterministic.

        ``span``: what :meth:`locate` gave for these rows in the master, so that a worker reads
        them without indexing the file itself."""
        ...

    def locate(self, rows: RowRange) -> Sequence[int] | None:
        """Where ``rows`` lie in their file (the master hands it to a worker with the lease);
        ``None`` when the worker finds them on its own (Parquet footers, generated rows)."""
        ...

    def units(self, source: int) -> Sequence[int] | None:
        """Row boundaries a shard of ``source`` should not cross (Parquet row groups: a shard
        that cut one would make two workers read it), or ``None``: cut anywhere."""
        ...


def _check_range(rows: RowRange, source_rows: tuple[int, ...]) -> None:
    if rows.source >= len(source_rows) or rows.end > source_rows[rows.source]:
        raise ValueError(f"{rows} is outside the data (rows per source: {list(source_rows)})")


def check_tables(table_sizes: Sequence[int]) -> tuple[int, ...]:
    sizes = tuple(int(s) for s in table_sizes)
    if len(sizes) < 1 or min(sizes) < 1:
        raise UserInputError(
            f"model.table_sizes: need at least one table and every size >= 1, got {list(sizes)}"
        )
    return sizes


def empty_batch(dense_features: int, tables: int, bad_rows: int = 0) -> Batch:
    return Batch(
        dense=np.zeros((0, dense_features), dtype=np.float32),
        sparse=np.zeros((0, tables), dtype=np.int64),
        labels=np.zeros(0, dtype=np.float32),
        bad_rows=bad_rows,
    )


# ------------------------------------------------------------------------------------------------
# Criteo files
# ------------------------------------------------------------------------------------------------


def token_value(token: bytes) -> int:
    """The stable integer of one non-empty categorical token (see the module docstring).

    Criteo's tokens are 8 hex digits, themselves hashes of the raw values, so reading them as
    numbers keeps them spread uniformly; other tokens (hand-made files) go through blake2b.
    """
    if 0 < len(token) <= 16 and _HEX_DIGITS.issuperset(token):
        return int(token, 16)
    return int.from_bytes(hashlib.blake2b(token, digest_size=8).digest(), "big")


def hash_ids(
    values: U64Array, missing: npt.NDArray[np.bool_], table_sizes: Sequence[int]
) -> IntArray:
    """Map token values ``[n, T]`` to per-table ids: 0 when missing or ``S = 1``, else
    ``1 + v mod (S - 1)``."""
    sizes = np.asarray(table_sizes, dtype=np.uint64)
    buckets = np.maximum(sizes, np.uint64(2)) - np.uint64(1)  # S - 1, at least 1
    ids = (values % buckets + np.uint64(1)).astype(np.int64)
    ids[missing | (sizes == 1)] = 0
    return ids


def _detect_layout(line: bytes) -> tuple[bytes, bool]:
    """(separator, has_header) from a file's first line."""
    sep = b"\t" if b"\t" in line else b","
    first = line.split(sep, 1)[0].strip()
    try:
        float(first)
    except ValueError:
        return sep, True
    return sep, False


@dataclass(frozen=True, slots=True)
class LineIndex:
    """Where a file's data lines are: ``marks[j]`` is the byte offset of data line ``j·stride``
    (for ``j·stride < rows``), and ``marks[-1]`` the byte just past the last data line.

    Only every ``stride``-th line is kept: a full index costs 8 bytes a row, 1.6 GB for one
    day of the 1 TB release (195 M rows) and 35 GB for all of it, per process; at stride 256
    it is 6 MB a day. A read pays for it by reading at most ``2·stride`` extra lines (~125 kB).
    """

    rows: int
    stride: int
    marks: IntArray

    def span(self, start: int, end: int) -> tuple[int, int, int]:
        """(first byte, end byte, lines to skip) of a read that covers rows ``[start, end)``."""
        first, last = start // self.stride, -(-end // self.stride)  # floor, ceil
        return int(self.marks[first]), int(self.marks[last]), start - first * self.stride


def _content_end(
    f: BinaryIO | storage.CountingFile, size: int, newline: int = _NEWLINE
) -> tuple[int, int, int]:
    """Scan back from the end for the last byte that is not ``\\r``/``\\n``.

    Returns (its position or -1, newlines after it, the end of its line: just past the first
    newline after it, or the file size). ``newline`` is the file's line end byte.
    """
    newlines, line_end, pos = 0, size, size
    while pos > 0:
        low = max(0, pos - (1 << 16))
        f.seek(low)
        block = np.frombuffer(f.read(pos - low), dtype=np.uint8)
        content = np.flatnonzero((block != _NEWLINE) & (block != _CR))
        tail = block[content[-1] + 1 :] if len(content) else block
        breaks = np.flatnonzero(tail == newline)
        newlines += len(breaks)
        if len(breaks):
            line_end = low + (int(content[-1]) + 1 if len(content) else 0) + int(breaks[0]) + 1
        if len(content):
            return low + int(content[-1]), newlines, line_end
        pos = low
    return -1, newlines, line_end


def index_lines(
    path: str, skip_header: bool, stride: int = 256, newline: bytes = b"\n"
) -> LineIndex:
    """Index a file's data lines (see :class:`LineIndex`) in one pass of numpy over its bytes.

    File line ``i`` starts at 0 (i = 0) or just past newline ``i - 1``; data line ``j`` is file
    line ``j + h`` (``h = 1`` with a header). Newline ``m`` therefore starts data line
    ``m + 1 - h``, kept when that is a multiple of ``stride``. Trailing lines of only ``\\r`` and
    ``\\n`` are not rows; a last line without its newline is. ``newline`` is the file's line
    end (:func:`line_end`).
    """
    with open(path, "rb") as f:
        return index_lines_in(f, skip_header, stride, newline)


def index_lines_in(
    f: BinaryIO | storage.CountingFile, skip_header: bool, stride: int = 256, newline: bytes = b"\n"
) -> LineIndex:
    """:func:`index_lines` of an open seekable file (local or from an object store): one pass
    from its start to its end."""
    f.seek(0)
    h = 1 if skip_header else 0
    end = ord(newline)
    parts: list[IntArray] = [np.zeros(1, dtype=np.int64)] if h == 0 else []
    seen = 0  # newlines before this chunk
    size = 0
    while chunk := f.read(_INDEX_CHUNK):
        breaks = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == end)
        first = -(seen + 1 - h) % stride  # first break here that starts a kept line
        parts.append(breaks[first::stride].astype(np.int64) + (size + 1))
        seen += len(breaks)
        size += len(chunk)
    last, tail_newlines, data_end = _content_end(f, size, end)
    # Lines up to the last content byte: the newlines before it, plus its own line.
    rows = max(seen - tail_newlines + 1 - h, 0) if last >= 0 else 0
    kept = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    marks = np.append(kept[: -(-rows // stride)], np.int64(data_end))
    return LineIndex(rows=rows, stride=stride, marks=marks)


#: Bytes of a file's start that decide its line end: many lines of any Criteo layout.
LINE_END_PROBE = 1 << 16


def line_end(head: bytes) -> bytes:
    """A file's line end from its first bytes: CR alone when they hold a CR and no LF (old Mac
    line ends, which would otherwise read as one line and "no data rows"), else LF (CRLF lines
    keep their CR, which the parser strips)."""
    return b"\r" if b"\r" in head and b"\n" not in head else b"\n"


def build_index(
    f: storage.StoredFile,
    counter: storage.ReadCounter,
    skip_header: bool,
    stride: int,
    newline: bytes,
) -> LineIndex:
    """The line index of a stored file (one pass over its bytes). A file without a data row (0
    bytes, a header alone: a writer's empty part file) adds no rows, as a Parquet file of no
    rows does, and is named in a warning; a dataset with no row at all is refused where its
    rows are split (``data: no training rows``)."""
    path = storage.display(f.url)
    try:
        with storage.storage_errors(f.url), storage.open_file(f, counter) as fh:
            index = index_lines_in(fh, skip_header, stride, newline)
    except OSError as exc:
        raise UserInputError(f"{path}: cannot read ({exc.strerror})") from exc
    if index.rows == 0:
        log.warning("%s: no data rows; it adds none to the job", path)
    return index


def read_lines(
    f: storage.StoredFile,
    counter: storage.ReadCounter,
    span: Sequence[int],
    rows: int,
    newline: bytes,
) -> list[bytes]:
    """The ``rows`` lines a :meth:`LineIndex.span` covers, without their line ends, in one
    ranged read. Lines that are not where the index put them (the file rewritten since it was
    indexed) -> :class:`DataUnavailableError`: a new attempt lists and indexes it again."""
    begin, end, skip = (int(x) for x in span)
    try:
        with storage.storage_errors(f.url), storage.open_file(f, counter) as fh:
            fh.seek(begin)
            chunk = fh.read(end - begin)
    except OSError as exc:
        raise UserInputError(f"{storage.display(f.url)}: cannot read ({exc.strerror})") from exc
    lines = chunk.split(newline)[skip : skip + rows]
    if len(lines) != rows:
        raise DataUnavailableError(
            f"{storage.display(f.url)}: changed since the job listed it (its lines moved)"
        )
    return lines


def _lines(f: BinaryIO | storage.CountingFile, newline: bytes) -> Iterator[bytes]:
    """The lines of ``f`` from where it is, without their ``newline``, a block at a time."""
    rest = b""
    while block := f.read(LINE_END_PROBE):
        *done, rest = (rest + block).split(newline)
        yield from done
    if rest:
        yield rest


def _numbers(cells: Sequence[bytes]) -> F64Array:
    """Integer-feature cells as float64, empty = 0; raises ValueError on a non-number."""
    return np.fromiter((float(x) if x else 0.0 for x in cells), np.float64, count=len(cells))


def parse_criteo_lines(
    lines: Sequence[bytes],
    sep: bytes,
    table_sizes: Sequence[int],
    dense_features: int = CRITEO_DENSE_FEATURES,
) -> Batch:
    """Parse Criteo lines (without their ``\\n``) into a batch, skipping and counting bad ones.

    The per-line loop only splits and checks the column count and label; the cells are then
    converted in bulk, which keeps this at 100-150k rows/s in CPython. A non-numeric
    integer feature makes the bulk conversion fail, and only then are rows converted one by one
    to find the bad ones.
    """
    columns = 1 + dense_features + len(table_sizes)
    labels: list[float] = []
    cells: list[bytes] = []
    tokens: list[bytes] = []
    bad = 0
    for line in lines:
        fields = line.rstrip(b"\r").split(sep)
        label = _LABELS.get(fields[0].strip()) if len(fields) == columns else None
        if label is None:
            bad += 1
            continue
        labels.append(label)
        cells.extend(fields[1 : 1 + dense_features])
        tokens.extend(fields[1 + dense_features :])
    n = len(labels)
    if n == 0:
        return empty_batch(dense_features, len(table_sizes), bad)

    try:
        raw = _numbers(cells).reshape(n, dense_features)
        good = np.ones(n, dtype=np.bool_)
    except ValueError:
        raw = np.zeros((n, dense_features))
        good = np.zeros(n, dtype=np.bool_)
        for i in range(n):
            try:
                raw[i] = _numbers(cells[i * dense_features : (i + 1) * dense_features])
                good[i] = True
            except ValueError:
                pass
    good &= np.isfinite(raw).all(axis=1)  # "nan" and "inf" parse as floats but are not counts
    # dense = log(1 + max(x, 0)); I2 holds negative counts in the real data.
    dense = np.log1p(np.maximum(raw, 0.0)).astype(np.float32)

    # Each distinct token is hashed once: codes index the distinct tokens (dict keeps order).
    distinct = dict.fromkeys(tokens, 0)
    for i, token in enumerate(distinct):
        distinct[token] = i
    codes = np.fromiter(map(distinct.__getitem__, tokens), dtype=np.int64, count=len(tokens))
    values = np.array([token_value(t) if t else 0 for t in distinct], dtype=np.uint64)
    absent = np.array([not t for t in distinct], dtype=np.bool_)
    shape = (n, len(table_sizes))
    sparse = hash_ids(values[codes].reshape(shape), absent[codes].reshape(shape), table_sizes)

    return Batch(
        dense=np.ascontiguousarray(dense[good]),
        sparse=np.ascontiguousarray(sparse[good]),
        labels=np.array(labels, dtype=np.float32)[good],
        bad_rows=bad + int(n - good.sum()),
    )


class CriteoFiles:
    """Criteo click-log files, each one source; implements :class:`Dataset`.

    Files are checked when the object is built (exists, readable, has a data row); the line
    index of a file (:class:`LineIndex`, every ``index_stride``-th line) is built on first use
    and kept, so a worker pays for it once per file: one pass at disk speed.
    """

    def __init__(
        self,
        paths: Sequence[str | os.PathLike[str] | storage.StoredFile],
        table_sizes: Sequence[int],
        dense_features: int = CRITEO_DENSE_FEATURES,
        *,
        index_stride: int = 256,
        eager: bool = True,
    ) -> None:
        if index_stride < 1:
            raise ValueError(f"index_stride must be >= 1, got {index_stride}")
        if dense_features != CRITEO_DENSE_FEATURES:
            raise UserInputError(
                f"model.dense_features: Criteo has {CRITEO_DENSE_FEATURES} integer features, "
                f"got {dense_features}"
            )
        if len(table_sizes) != CRITEO_TABLES:
            raise UserInputError(
                f"model.table_sizes: Criteo has {CRITEO_TABLES} categorical features, got "
                f"{len(table_sizes)} tables"
            )
        if not paths:
            raise UserInputError("data.path: no Criteo file given")
        self._table_sizes = check_tables(table_sizes)
        self._dense_features = dense_features
        self._files = tuple(
            p if isinstance(p, storage.StoredFile) else _local_file(p) for p in paths
        )
        self._paths = tuple(storage.display(f.url) for f in self._files)
        #: the data bytes read (a worker logs it; tests check that it reads its shards' bytes)
        self.counter = storage.ReadCounter()
        #: per file: (separator, has a header, line end), read on first use
        self._layouts: list[tuple[bytes, bool, bytes] | None] = [None] * len(self._files)
        self._stride = index_stride
        self._indexes: list[LineIndex | None] = [None] * len(self._paths)
        if eager:
            for s in range(len(self._files)):
                self._layout(s)

    def _layout(self, source: int) -> tuple[bytes, bool, bytes]:
        layout = self._layouts[source]
        if layout is None:
            layout = self._layouts[source] = self._open(self._files[source], self.counter)
        return layout

    @staticmethod
    def _open(f: storage.StoredFile, counter: storage.ReadCounter) -> tuple[bytes, bool, bytes]:
        """The file's layout from its first line; raises if it is missing or unreadable. A file
        without a data row adds none (:func:`build_index` says so): its layout is moot."""
        path = storage.display(f.url)
        try:
            with storage.storage_errors(f.url), storage.open_file(f, counter) as fh:
                newline = line_end(fh.read(LINE_END_PROBE))
                fh.seek(0)
                first = next(_lines(fh, newline), b"")
                sep, header = _detect_layout(first)
        except OSError as exc:
            raise UserInputError(f"{path}: cannot read Criteo file ({exc.strerror})") from exc
        return sep, header, newline

    def line_index(self, source: int) -> LineIndex:
        """The file's line index, built on first use. Two threads that race here both build it
        and one result is kept: wasted work, never a wrong index, and no lock to stop pickling."""
        index = self._indexes[source]
        if index is None:
            _, header, newline = self._layout(source)
            index = build_index(self._files[source], self.counter, header, self._stride, newline)
            self._indexes[source] = index
        return index

    @property
    def paths(self) -> tuple[str, ...]:
        return self._paths

    @property
    def files(self) -> tuple[storage.StoredFile, ...]:
        return self._files

    @property
    def source_rows(self) -> tuple[int, ...]:
        return tuple(self.line_index(s).rows for s in range(len(self._paths)))

    @property
    def description(self) -> str:
        first = self._paths[0]
        more = f" and {len(self._paths) - 1} more" if len(self._paths) > 1 else ""
        return f"criteo files {first}{more}"

    def locate(self, rows: RowRange) -> tuple[int, int, int]:
        """(first byte, end byte, lines to skip) of ``rows``."""
        return self.line_index(rows.source).span(rows.start, rows.end)

    def units(self, source: int) -> None:
        return None

    def read(self, rows: RowRange, span: Sequence[int] | None = None) -> Batch:
        if rows.source >= len(self._paths):
            raise ValueError(f"{rows} names no file: there are {len(self._paths)} sources")
        path = self._paths[rows.source]
        if rows.rows == 0:
            return empty_batch(self._dense_features, len(self._table_sizes))
        if span is None:
            index = self.line_index(rows.source)
            if rows.end > index.rows:
                raise ValueError(f"{rows} is past the end of {path} ({index.rows} rows)")
            span = index.span(rows.start, rows.end)
        sep, _, newline = self._layout(rows.source)
        lines = read_lines(self._files[rows.source], self.counter, span, rows.rows, newline)
        return parse_criteo_lines(lines, sep, self._table_sizes, self._dense_features)


# ------------------------------------------------------------------------------------------------
# Synthetic Criteo
# ------------------------------------------------------------------------------------------------

#: Planted signal (see :class:`SyntheticCriteo`): mean click rate, the scale of an id's effect,
#: and the calibration sample that fixes the intercept.
_CLICK_RATE = 0.25
_ID_EFFECT = 0.7
_CALIBRATION_ROWS = 16384
_CALIBRATION_STREAM = 1 << 62  # a block index no data set reaches

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_MASK64 = (1 << 64) - 1


def splitmix64(x: U64Array) -> U64Array:
    """SplitMix64's finaliser, vectorised: a bijection of uint64 with good avalanche.

        z = x + 0x9E37...; z = (z ^ z>>30)·0xBF58...; z = (z ^ z>>27)·0x94D0...; z ^ z>>31

    (uint64 arithmetic wraps modulo 2^64, as the algorithm wants.)
    """
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def _key(*parts: int) -> np.uint64:
    """A uint64 key from small integers, for salting the hash per (seed, table, purpose)."""
    acc = np.array([0x243F6A8885A308D3], dtype=np.uint64)
    for p in parts:
        acc = splitmix64(acc ^ np.uint64(p & _MASK64))
    return np.uint64(acc[0])


def hash_normal(keys: U64Array) -> F64Array:
    """An N(0, 1)-ish value per uint64 key, the same in every process.

    The four 16-bit quarters of ``splitmix64(key)`` are uniforms ``u_i``; their sum is
    Irwin-Hall(4), mean 2 and variance 4/12, so ``(Σu_i - 2) / sqrt(1/3)`` has mean 0, variance 1
    and a bell shape bounded by ±3.46.
    """
    h = splitmix64(keys)
    mask = np.uint64(0xFFFF)
    total = np.zeros(h.shape, dtype=np.float64)
    for shift in (0, 16, 32, 48):
        total += ((h >> np.uint64(shift)) & mask).astype(np.float64)
    return (total / 65536.0 - 2.0) * np.sqrt(3.0)  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class _Block:
    dense: FloatArray
    sparse: IntArray
    labels: FloatArray
    logits: F64Array


class SyntheticCriteo:
    """Criteo-shaped rows with a planted click signal; one source of ``rows`` rows.

    Shape of a row (``D`` dense features, ``T`` tables of sizes ``S_t``):

    * dense: counts ``x_j = floor(exp(mu_j + s_j·z_j))`` with ``z_j`` standard normals that share
      a per-row "activity" factor (``z_j = 0.6·a + 0.8·e_j``), heavy tailed like Criteo's; a
      fraction ``p_j`` (0 to 40 %) is missing, hence 0. Output is ``log1p(x)``, as the reader's.
    * categorical: Zipf-like ids, ``P(id = k) ∝ (k + 1)^(-alpha_t)`` (continuous approximation,
      ``alpha_t`` in [1.05, 1.3] by table): low ids are the frequent head, e.g. the top 1 % of a
      1,000,000-row table carries 70-90 % of its occurrences, and the tail is long.
    * label: ``click ~ Bernoulli(sigmoid(logit))`` with

          logit = b + (d_0 - 0.9) - 0.6·(d_1 - 1.2) + ([d_2 > 2] - 0.5)     (dense, d = log1p(x))
                + Σ_{t in E} 0.7·N(seed, t, id_t)                          (per-id effects)
                + 0.7·N(seed, a, c, id_a, id_c)                            (a cross)

      ``N(...)`` is :func:`hash_normal` of a key hashed from its arguments, so an id's effect is
      the same in every block and process; ``E`` is up to four tables spread over the table
      list (``floor(i·T/k)``, ``i < k = min(4, T)``) and ``(a, c)`` its first two. The
      intercept ``b`` is solved at construction so that the click rate is 25 % (Criteo's is
      ~26 %); without that the seeded effects of a small table's head ids would move it by ±10
      points.

    Strength, measured on Criteo's 26 table sizes (capped at 10^6) and 4 seeds: true-logit AUC
    0.85-0.87; a logistic regression on dense features + one-hot of the 32 head ids of every
    table reaches 0.79-0.81 held out; a DLRM (dim 16, Adam, batch 256) trained one epoch on
    200k rows reaches 0.81. The dense part alone gives ~0.73, so the signal stays learnable
    when every table is huge (26 x 10^6 rows: DLRM 0.79).

    ``true_logits(rows)`` returns the planted logit of each row, for checking a learner.
    """

    def __init__(
        self,
        rows: int,
        table_sizes: Sequence[int],
        dense_features: int = CRITEO_DENSE_FEATURES,
        seed: int = 0,
        block_rows: int = 8192,
    ) -> None:
        if rows < 1:
            raise UserInputError(f"data.rows: synthetic data needs at least 1 row, got {rows}")
        if dense_features < 1:
            raise UserInputError(f"model.dense_features: need at least 1, got {dense_features}")
        if seed < 0:
            raise UserInputError(f"data.seed: must be >= 0, got {seed}")
        if block_rows < 1:
            raise ValueError(f"block_rows must be >= 1, got {block_rows}")
        self._rows = rows
        self._sizes = check_tables(table_sizes)
        self._dense_features = dense_features
        self._seed = seed
        self._block_rows = block_rows
        self._last: tuple[int, _Block] | None = None  # one-block cache for small adjacent reads

        tables = len(self._sizes)
        feats = np.arange(dense_features)
        # Per-feature count shape, fixed (not seeded): mean log-count, spread, missing rate.
        self._mu = 0.5 + 1.5 * ((feats * 7) % 5) / 4.0  # 0.5 .. 2.0
        self._sigma = 1.2 + 0.6 * ((feats * 3) % 4) / 3.0  # 1.2 .. 1.8
        self._p_missing = 0.4 * ((feats * 5) % 9) / 8.0  # 0 .. 0.4
        t = np.arange(tables)
        self._alpha = 1.05 + 0.25 * ((t * 7) % 11) / 10.0  # Zipf exponents 1.05 .. 1.3
        spread = min(4, tables)  # tables with per-id effects: floor(i·T/k), i < k = min(4, T)
        self._effect_tables = tuple((i * tables) // spread for i in range(spread))
        self._effect_keys = tuple(_key(seed, 1, t_) for t_ in self._effect_tables)
        self._cross = self._effect_tables[:2] if len(self._effect_tables) >= 2 else None
        self._cross_key = _key(seed, 2, *(self._cross or ()))
        self._intercept = self._calibrate()

    @property
    def source_rows(self) -> tuple[int, ...]:
        return (self._rows,)

    @property
    def description(self) -> str:
        return (
            f"synthetic criteo rows={self._rows} seed={self._seed} tables={len(self._sizes)} "
            f"dense={self._dense_features}"
        )

    def locate(self, rows: RowRange) -> None:
        return None

    def units(self, source: int) -> None:
        return None

    def read(self, rows: RowRange, span: Sequence[int] | None = None) -> Batch:
        dense, sparse, labels, _ = self._gather(rows)
        return Batch(dense=dense, sparse=sparse, labels=labels, bad_rows=0)

    def true_logits(self, rows: RowRange) -> F64Array:
        """The planted logit of each row of ``rows``: ``P(click) = sigmoid(logit)``."""
        return self._gather(rows)[3]

    def _gather(self, rows: RowRange) -> tuple[FloatArray, IntArray, FloatArray, F64Array]:
        _check_range(rows, self.source_rows)
        first, last = rows.start // self._block_rows, (rows.end - 1) // self._block_rows
        pieces: list[_Block] = []
        for b in range(first, last + 1) if rows.rows else ():
            block = self._block(b)
            lo = max(rows.start - b * self._block_rows, 0)
            hi = min(rows.end - b * self._block_rows, self._block_rows)
            pieces.append(
                _Block(
                    block.dense[lo:hi],
                    block.sparse[lo:hi],
                    block.labels[lo:hi],
                    block.logits[lo:hi],
                )
            )
        if not pieces:
            empty = empty_batch(self._dense_features, len(self._sizes))
            return empty.dense, empty.sparse, empty.labels, np.zeros(0)
        if len(pieces) == 1:
            p = pieces[0]
            return p.dense.copy(), p.sparse.copy(), p.labels.copy(), p.logits.copy()
        return (
            np.concatenate([p.dense for p in pieces]),
            np.concatenate([p.sparse for p in pieces]),
            np.concatenate([p.labels for p in pieces]),
            np.concatenate([p.logits for p in pieces]),
        )

    def _block(self, b: int) -> _Block:
        last = self._last
        if last is not None and last[0] == b:
            return last[1]
        block = self._generate(b)
        self._last = (b, block)
        return block

    def _generate(self, b: int) -> _Block:
        """Block ``b``: always ``block_rows`` rows (past the end too), so that a block's content
        does not depend on ``rows`` and every range is a slice of the same stream."""
        rng = np.random.default_rng([self._seed, b])
        dense, sparse = self._features(rng, self._block_rows)
        logits = self._intercept + self._signal(dense, sparse)
        labels = (rng.random(len(logits)) < 1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
        return _Block(dense, sparse, labels, logits)

    def _features(self, rng: np.random.Generator, n: int) -> tuple[FloatArray, IntArray]:
        d = self._dense_features
        # Dense: log-normal counts with a shared activity factor, some missing.
        z = rng.standard_normal((n, d + 1), dtype=np.float32)
        z = 0.6 * z[:, :1] + 0.8 * z[:, 1:]
        counts = np.floor(np.exp(self._mu.astype(np.float32) + self._sigma.astype(np.float32) * z))
        counts[rng.random((n, d), dtype=np.float32) < self._p_missing.astype(np.float32)] = 0.0
        dense = np.log1p(counts, dtype=np.float32)

        # Categorical: inverse CDF of a power law on [1, S+1), k = floor(r) - 1:
        #   r = (1 + u·((S+1)^(1-alpha) - 1))^(1/(1-alpha))
        sizes = np.asarray(self._sizes, dtype=np.float64)
        one_minus = 1.0 - self._alpha
        span = np.power(sizes + 1.0, one_minus) - 1.0
        u = rng.random((n, len(self._sizes)))
        r = np.exp(np.log1p(u * span) / one_minus)
        sparse = np.minimum(r.astype(np.int64) - 1, np.asarray(self._sizes, dtype=np.int64) - 1)
        np.maximum(sparse, 0, out=sparse)
        return dense, sparse

    def _signal(self, dense: FloatArray, sparse: IntArray) -> F64Array:
        """The planted logit without its intercept."""
        d = dense.astype(np.float64)
        logit = 1.0 * (d[:, 0] - 0.9)
        if d.shape[1] > 1:
            logit -= 0.6 * (d[:, 1] - 1.2)
        if d.shape[1] > 2:
            logit += 1.0 * ((d[:, 2] > 2.0) - 0.5)
        ids = sparse.astype(np.uint64)
        for t, key in zip(self._effect_tables, self._effect_keys, strict=True):
            logit += _ID_EFFECT * hash_normal(ids[:, t] ^ key)
        if self._cross is not None:
            a, c = self._cross
            pair = splitmix64(ids[:, a] ^ self._cross_key) ^ ids[:, c]
            logit += _ID_EFFECT * hash_normal(pair)
        return logit

    def _calibrate(self) -> float:
        """The intercept ``b`` with ``mean(sigmoid(b + signal)) = 25 %`` on a calibration sample.

        The head ids of small tables carry much of the mass, so their (seeded) effects move the
        click rate by ±10 points from seed to seed; solving for ``b`` keeps it Criteo-like. The
        sample is its own stream (not a block), and ``b`` is rounded to 1e-3 so that a last-bit
        difference in ``exp`` between CPUs cannot change it.
        """
        rng = np.random.default_rng([self._seed, _CALIBRATION_STREAM])
        signal = self._signal(*self._features(rng, _CALIBRATION_ROWS))
        low, high = -12.0, 12.0
        for _ in range(40):  # bisection: the mean click rate rises with b
            mid = 0.5 * (low + high)
            if np.mean(1.0 / (1.0 + np.exp(-(mid + signal)))) < _CLICK_RATE:
                low = mid
            else:
                high = mid
        return round(0.5 * (low + high), 3)


# ------------------------------------------------------------------------------------------------
# Opening and splitting
# ------------------------------------------------------------------------------------------------


def split_ranges(
    source_rows: Sequence[int],
    shard_rows: int,
    eval_fraction: float,
    units: Sequence[Sequence[int] | None] | None = None,
) -> tuple[list[RowRange], list[RowRange]]:
    """(training shards, evaluation ranges): the last ``eval_fraction`` of every source is held out.

    Per source of ``n`` rows, ``n_eval = floor(n·f)``, raised to 1 when ``f > 0`` and ``n >= 2``
    (every source is represented in evaluation); the first ``n - n_eval`` rows are cut, in order,
    into shards of ``shard_rows`` rows (the last one shorter). Holding out the *tail* rather than
    a random sample keeps evaluation honest on click logs, which are in time order.

    ``units[s]`` (a source's row-group boundaries, ``0 = b_0 < b_1 < ... = n``): its shards are
    then runs of whole groups, as many as fit in ``shard_rows`` rows and at least one (a group
    larger than ``shard_rows`` is one shard), the last one ending at the held-out cut. The
    held-out rows are the same either way.
    """
    if shard_rows < 1:
        raise UserInputError(f"shard_rows: must be >= 1, got {shard_rows}")
    if not 0.0 <= eval_fraction <= 0.5:
        raise UserInputError(f"eval_fraction: must be in [0, 0.5], got {eval_fraction}")
    train: list[RowRange] = []
    evaluation: list[RowRange] = []
    for source, n in enumerate(source_rows):
        if n < 0:
            raise ValueError(f"source {source} has a negative row count {n}")
        n_eval = math.floor(n * eval_fraction + 1e-9)  # 1e-9: 0.29 * 100 is 28.999...
        if eval_fraction > 0 and n >= 2:
            n_eval = max(n_eval, 1)
        cut = n - n_eval
        bounds = units[source] if units is not None else None
        if bounds is None:
            train.extend(
                RowRange(source, s, min(s + shard_rows, cut)) for s in range(0, cut, shard_rows)
            )
        else:
            train.extend(RowRange(source, a, b) for a, b in _unit_shards(bounds, cut, shard_rows))
        if n_eval:
            evaluation.append(RowRange(source, cut, n))
    return train, evaluation


def _unit_shards(bounds: Sequence[int], cut: int, shard_rows: int) -> list[tuple[int, int]]:
    """Rows ``[0, cut)`` cut at the group boundaries ``bounds`` into runs of whole groups of at
    most ``shard_rows`` rows (a larger group alone); the last run ends at ``cut``."""
    points = [int(b) for b in bounds if 0 < b < cut] + ([cut] if cut > 0 else [])
    shards: list[tuple[int, int]] = []
    start, end = 0, 0
    for p in points:
        if end > start and p - start > shard_rows:
            shards.append((start, end))
            start = end
        end = p
    if end > start:
        shards.append((start, end))
    return shards


def _local_file(path: str | os.PathLike[str]) -> storage.StoredFile:
    """A local file given by path (tests, a caller that globbed itself) as a StoredFile."""
    name = os.path.abspath(os.fspath(path))
    try:
        st = os.stat(name)
    except OSError as exc:
        raise UserInputError(
            f"{os.fspath(path)}: cannot read Criteo file ({exc.strerror})"
        ) from exc
    return storage.StoredFile(url=name, size=st.st_size, version=str(st.st_mtime_ns))
