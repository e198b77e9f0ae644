"""Parquet, CSV and TSV tables give exactly the rows of today's Criteo reader, bad rows included;
shards follow Parquet row groups; a worker reads its shards' bytes; bad tables are clear errors."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlrover_kfp.core.spec import CriteoData, DataColumns, ModelSpec, TableData
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.training.data import Batch, RowRange, split_ranges, token_value
from dlrover_kfp.training.datasets import check_fingerprint, data_fingerprint, open_dataset
from dlrover_kfp.training.tables import token_values
from tests.criteo_text import criteo_table, write_parquet, write_text

DATA = Path(__file__).resolve().parents[1] / "data"
SIZES = [1000, 7, 1, 2, *([50_000] * 22)]  # a table of 1 row and of 2 rows: the edge cases
MODEL = ModelSpec(
    embedding_dim=4, table_sizes=SIZES, dense_features=13, bottom_mlp=[8, 4], top_mlp=[8, 1]
)


def same(a: Batch, b: Batch) -> bool:
    return (
        np.array_equal(a.dense, b.dense)
        and np.array_equal(a.sparse, b.sparse)
        and np.array_equal(a.labels, b.labels)
        and a.bad_rows == b.bad_rows
    )


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tables")
    return {
        "criteo": write_text(d / "rows.csv", 5000, SIZES, seed=4),
        "tsv": write_text(d / "rows.tsv", 5000, SIZES, seed=4, sep="\t", header=False),
        "parquet": write_parquet(d / "rows.parquet", 5000, SIZES, seed=4, row_group_rows=1024),
    }


def test_every_format_gives_the_criteo_readers_rows(files: dict[str, Path]) -> None:
    reference = open_dataset(CriteoData(path=str(files["criteo"])), MODEL)
    specs = {
        "csv": TableData(format="csv", path=str(files["criteo"])),
        "tsv": TableData(format="tsv", path=str(files["tsv"]), header=False),
        "parquet": TableData(format="parquet", path=str(files["parquet"])),
    }
    rng = np.random.default_rng(0)
    ranges = [RowRange(0, 0, 5000), RowRange(0, 4999, 5000), RowRange(0, 1023, 1025)]
    for _ in range(6):
        a, b = sorted(rng.integers(0, 5001, size=2))
        ranges.append(RowRange(0, int(a), int(b)))
    for name, spec in specs.items():
        dataset = open_dataset(spec, MODEL)
        # a worker reads with the span the master located (no index of its own)
        worker = open_dataset(spec, MODEL, eager=False)
        assert dataset.source_rows == (5000,), name
        for rows in ranges:
            expected = reference.read(rows)
            assert same(dataset.read(rows), expected), (name, rows)
            assert same(worker.read(rows, span=dataset.locate(rows)), expected), (name, rows)


def test_real_criteo_rows_and_bad_rows_count_as_in_the_criteo_reader(tmp_path: Path) -> None:
    real = (DATA / "criteo_sample.csv").read_text().splitlines()
    header, rows = real[0], real[1:41]
    bad = [
        "",  # an empty line among the data
        "2" + rows[0][1:],  # a label other than 0/1
        rows[1].replace(",", ",abc,", 1).replace(",abc,", ",", 0),  # one column too many
        ",".join(["1", "x", *rows[2].split(",")[2:]]),  # a dense cell that is not a number
        ",".join(["0", "nan", *rows[3].split(",")[2:]]),  # not a finite number
        ",".join(rows[4].split(",")[:-1]),  # one column short
    ]
    lines = [header, *rows[:20], *bad, *rows[20:]]
    path = tmp_path / "mixed.csv"
    path.write_text("\r\n".join(lines) + "\r\n")  # CRLF, as the Kaggle copies
    model = ModelSpec(
        embedding_dim=4, table_sizes=[1000] * 26, dense_features=13, bottom_mlp=[4], top_mlp=[1]
    )
    expected = open_dataset(CriteoData(path=str(path)), model).read(RowRange(0, 0, len(lines) - 1))
    got = open_dataset(TableData(format="csv", path=str(path)), model)
    assert got.source_rows == (len(lines) - 1,)
    batch = got.read(RowRange(0, 0, len(lines) - 1))
    assert batch.bad_rows == expected.bad_rows == 6
    assert same(batch, expected)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(alphabet="0123456789abcdefABCDEF", min_size=1, max_size=20),
            st.text(min_size=0, max_size=12),
            st.none(),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_vectorised_token_values_equal_the_per_token_rule(tokens: list[str | None]) -> None:
    values, missing = token_values(pa.array(tokens, pa.string()))
    for i, token in enumerate(tokens):
        raw = (token or "").encode()
        assert missing[i] == (not raw)
        assert int(values[i]) == (token_value(raw) if raw else 0), token


def test_integer_id_columns_are_taken_as_given_when_in_range(tmp_path: Path) -> None:
    table = criteo_table(8, [50] * 26).drop_columns(["C1", "C2"])
    ids = pa.array([0, 1, 49, 50, -1, 2**40, None, 7], pa.int64())
    table = table.append_column("C1", ids).append_column("C2", pa.array(["zz"] * 8))
    pq.write_table(table, tmp_path / "ids.parquet")
    model = ModelSpec(
        embedding_dim=4, table_sizes=[50] * 26, dense_features=13, bottom_mlp=[4], top_mlp=[1]
    )
    batch = open_dataset(TableData(format="parquet", path=str(tmp_path)), model).read(
        RowRange(0, 0, 8)
    )
    # in range: the id itself; outside: 1 + (v mod 2^64) mod 49; missing: 0
    assert batch.sparse[:, 0].tolist() == [
        0,
        1,
        49,
        1 + 50 % 49,
        1 + (2**64 - 1) % 49,
        1 + 2**40 % 49,
        0,
        7,
    ]
    a = 1 + int.from_bytes(hashlib.blake2b(b"zz", digest_size=8).digest(), "big") % 49
    assert set(batch.sparse[:, 1].tolist()) == {a}


def test_named_columns_of_another_shape(tmp_path: Path) -> None:
    table = pa.table(
        {
            "clicked": pa.array([True, False, True, None]),
            "price": pa.array([1.5, None, -3.0, 2.0]),
            "user": pa.array(["u1", "u2", "", "u1"]),
            "extra": pa.array([1, 2, 3, 4]),
        }
    )
    pq.write_table(table, tmp_path / "part-0.parquet")
    (tmp_path / "_SUCCESS").write_text("")
    model = ModelSpec(
        embedding_dim=4, table_sizes=[100], dense_features=1, bottom_mlp=[4], top_mlp=[1]
    )
    columns = DataColumns(label="clicked", dense=("price",), sparse=("user",))
    dataset = open_dataset(TableData(format="parquet", path=str(tmp_path), columns=columns), model)
    batch = dataset.read(RowRange(0, 0, 4))
    assert batch.labels.tolist() == [1.0, 0.0, 1.0]  # the row without a label is bad
    assert batch.bad_rows == 1
    assert np.allclose(batch.dense[:, 0], np.log1p([1.5, 0.0, 0.0]))

    def blake(token: bytes) -> int:
        return 1 + int.from_bytes(hashlib.blake2b(token, digest_size=8).digest(), "big") % 99

    assert batch.sparse[:, 0].tolist() == [blake(b"u1"), blake(b"u2"), 0]  # "" is missing


def test_a_column_the_files_lack_is_named(tmp_path: Path, files: dict[str, Path]) -> None:
    columns = DataColumns(dense=(*[f"I{i}" for i in range(1, 13)], "I99"))
    for fmt, path in (("parquet", files["parquet"]), ("csv", files["criteo"])):
        with pytest.raises(UserInputError, match="'I99'"):
            open_dataset(TableData(format=fmt, path=str(path), columns=columns), MODEL).read(
                RowRange(0, 0, 1)
            )
    (tmp_path / "x.parquet").write_bytes(files["parquet"].read_bytes()[:3000])
    with pytest.raises(UserInputError, match=r"x\.parquet: not a readable Parquet file"):
        open_dataset(TableData(format="parquet", path=str(tmp_path / "x.parquet")), MODEL)


@settings(max_examples=200, deadline=None)
@given(
    groups=st.lists(st.integers(1, 50), min_size=1, max_size=12),
    shard_rows=st.integers(1, 80),
    eval_fraction=st.sampled_from([0.0, 0.1, 0.25, 0.5]),
)
def test_shards_are_runs_of_whole_row_groups(
    groups: list[int], shard_rows: int, eval_fraction: float
) -> None:
    bounds = [0, *np.cumsum(groups).tolist()]
    n = bounds[-1]
    train, held = split_ranges([n], shard_rows, eval_fraction, units=[bounds])
    _, plain_held = split_ranges([n], shard_rows, eval_fraction)
    assert held == plain_held  # the same rows held out
    cut = plain_held[0].start if plain_held else n
    # the shards cover [0, cut) in order, exactly once
    assert [r.start for r in train] == [0, *[r.end for r in train[:-1]]]
    assert (train[-1].end if train else 0) == cut
    for r in train:
        assert r.start in bounds  # starts on a group boundary
        assert r.end in bounds or r.end == cut
        inside = [b for b in bounds if r.start < b < r.end]
        # at most shard_rows rows, unless it is one group (or the start of one, at the cut)
        assert r.rows <= shard_rows or not inside


def test_a_worker_reads_its_row_groups_bytes(files: dict[str, Path]) -> None:
    data = TableData(format="parquet", path=str(files["parquet"]))
    master = open_dataset(data, MODEL)
    train, _ = split_ranges(master.source_rows, 2048, 0.1, units=[master.units(0)])
    worker = open_dataset(data, MODEL, eager=False)
    meta = pq.ParquetFile(files["parquet"]).metadata
    shards = train[1:3]
    groups: set[int] = set()
    for rows in shards:
        worker.read(rows)
        groups |= {g for g in range(meta.num_row_groups) if _overlaps(meta, g, rows)}
    chunks = sum(
        meta.row_group(g).column(c).total_compressed_size
        for g in groups
        for c in range(meta.num_columns)
    )
    footer = files["parquet"].stat().st_size - max(
        meta.row_group(g).column(c).file_offset
        for g in range(meta.num_row_groups)
        for c in range(meta.num_columns)
    )
    counter = worker.counter  # type: ignore[attr-defined]
    assert chunks <= counter.bytes <= 1.1 * chunks + footer + 64 * 1024, (counter.bytes, chunks)


def _overlaps(meta: pq.FileMetaData, g: int, rows: RowRange) -> bool:
    start = sum(meta.row_group(i).num_rows for i in range(g))
    return start < rows.end and start + meta.row_group(g).num_rows > rows.start


def test_a_worker_that_lists_other_files_refuses(tmp_path: Path, files: dict[str, Path]) -> None:
    (tmp_path / "a.parquet").write_bytes(files["parquet"].read_bytes())
    data = TableData(format="parquet", path=str(tmp_path))
    listed = data_fingerprint(open_dataset(data, MODEL))
    (tmp_path / "b.parquet").write_bytes(files["parquet"].read_bytes())
    with pytest.raises(UserInputError, match="changed since the job listed them"):
        check_fingerprint(open_dataset(data, MODEL, eager=False), listed)


def test_a_reader_keeps_the_footers_of_its_last_files_and_reads_others_again(
    tmp_path: Path,
) -> None:
    """A worker that moves through many Parquet files keeps the parsed footers of the last
    FOOTERS_KEPT only (each holds every column chunk's metadata: kept for every file, a worker's
    memory grew with the files read), and a file read again after its footer went reads it
    again: the same rows, one footer's bytes more."""
    from dlrover_kfp.training.tables import FOOTERS_KEPT, ParquetFiles  # noqa: PLC0415

    for day in range(5):
        write_parquet(tmp_path / f"part-{day}.parquet", 600, SIZES, seed=day, row_group_rows=200)
    data = TableData(format="parquet", path=str(tmp_path))
    worker = open_dataset(data, MODEL, eager=False)
    assert isinstance(worker, ParquetFiles)
    first = worker.read(RowRange(0, 0, 200))
    for source in range(1, 5):
        worker.read(RowRange(source, 200, 400))
        assert len(worker._footers) <= FOOTERS_KEPT
    assert 0 not in worker._footers
    before = worker.counter.bytes
    again = worker.read(RowRange(0, 0, 200))
    assert same(first, again)
    footer = pq.ParquetFile(tmp_path / "part-0.parquet").metadata.serialized_size
    group = pq.ParquetFile(tmp_path / "part-0.parquet").metadata.row_group(0)
    chunks = sum(group.column(c).total_compressed_size for c in range(group.num_columns))
    assert worker.counter.bytes - before >= chunks + footer


def _one_dense_value(tmp_path: Path, csv_cell: str, parquet_value: float | None) -> tuple[int, int]:
    """Bad rows of one row whose first dense value is ``csv_cell`` in a CSV file and
    ``parquet_value`` in a Parquet file, every other value the same."""
    table = criteo_table(1, SIZES, seed=2)
    dense = pa.array([parquet_value], pa.float64())
    pq.write_table(table.set_column(1, "I1", dense), tmp_path / "one.parquet")
    lines = write_text(tmp_path / "one.csv", 1, SIZES, seed=2).read_text().splitlines()
    cells = lines[1].split(",")
    cells[1] = csv_cell
    (tmp_path / "one.csv").write_text(f"{lines[0]}\n{','.join(cells)}\n")
    bad = []
    for fmt in ("csv", "parquet"):
        data = open_dataset(TableData(format=fmt, path=str(tmp_path / f"one.{fmt}")), MODEL)
        bad.append(data.read(RowRange(0, 0, 1)).bad_rows)
    return bad[0], bad[1]


@pytest.mark.parametrize(
    ("csv_cell", "parquet_value", "bad"),
    [("nan", float("nan"), 1), ("inf", float("inf"), 1), ("", None, 0), ("3", 3.0, 0)],
)
def test_a_dense_value_is_the_same_row_in_csv_and_parquet(
    tmp_path: Path, csv_cell: str, parquet_value: float | None, bad: int
) -> None:
    """NaN is a bad row in both (a CSV's ``nan`` was read as null by pyarrow's default and
    trained as 0, where Parquet's NaN was a bad row); only an empty cell or a null is missing."""
    assert _one_dense_value(tmp_path, csv_cell, parquet_value) == (bad, bad)


def test_an_empty_file_among_others_adds_no_rows_in_every_format(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A writer's empty part file: 0 bytes or a header alone (CSV), no rows (Parquet). Each
    adds nothing, with a warning naming it (an empty CSV refused the job with the advice
    "needs data.header: false", while an empty Parquet file was accepted)."""
    for fmt in ("csv", "parquet"):
        root = tmp_path / fmt
        root.mkdir()
        if fmt == "csv":
            write_text(root / "a.csv", 300, SIZES, seed=1)
            (root / "b.csv").write_text("")
            header = (root / "a.csv").read_text().splitlines()[0]
            (root / "c.csv").write_text(header + "\n")
        else:
            write_parquet(root / "a.parquet", 300, SIZES, seed=1)
            pq.write_table(criteo_table(1, SIZES).slice(0, 0), root / "b.parquet")
        data = open_dataset(TableData(format=fmt, path=str(root / f"*.{fmt}")), MODEL)
        assert sum(data.source_rows) == 300, fmt
    assert "b.csv: no data rows; it adds none" in caplog.text
    assert "c.csv: no data rows; it adds none" in caplog.text
