"""Criteo reader, synthetic Criteo and shard splitting (dlrover_kfp.training.data)."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from dlrover_kfp.core.spec import CriteoData, ModelSpec, SyntheticData
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.training.data import (
    Batch,
    CriteoFiles,
    Dataset,
    RowRange,
    SyntheticCriteo,
    index_lines,
    parse_criteo_lines,
    split_ranges,
    token_value,
)
from dlrover_kfp.training.datasets import open_dataset

DATA = Path(__file__).resolve().parent.parent / "data"
SAMPLE = DATA / "criteo_sample.csv"  # comma separated, header, LF
KAGGLE_TRAIN = DATA / "criteo_kaggle_train.csv"  # comma separated, no header, CRLF, no final LF
KAGGLE_TEST = DATA / "criteo_kaggle_test.csv"  # comma separated, no header, LF, no final LF

# Criteo Kaggle table cardinalities, capped at 10^6: small, medium and big tables side by side.
TABLES = tuple(
    min(s, 1_000_000)
    for s in (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
              27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)
)  # fmt: skip


def auc(scores: npt.ArrayLike, labels: npt.ArrayLike) -> float:
    """Area under the ROC curve by Mann-Whitney: (rank sum of positives - n+(n+ + 1)/2) / (n+ n-),
    with tied scores given their average rank."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels) > 0.5
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s))
    sorted_s = s[order]
    # Runs of equal scores share the mean of their 1-based positions.
    starts = np.flatnonzero(np.r_[True, sorted_s[1:] != sorted_s[:-1]])
    ends = np.r_[starts[1:], len(s)]
    mean_rank = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(mean_rank, ends - starts)
    pos, neg = int(y.sum()), int((~y).sum())
    return float((ranks[y].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def same(a: Batch, b: Batch) -> bool:
    return (
        np.array_equal(a.dense, b.dense)
        and np.array_equal(a.sparse, b.sparse)
        and np.array_equal(a.labels, b.labels)
    )


def sample_lines() -> list[str]:
    """The sample's data lines (header dropped), without line ends."""
    return SAMPLE.read_text().splitlines()[1:]


def test_auc_helper() -> None:
    assert auc([0.1, 0.2, 0.3, 0.4], [0, 0, 1, 1]) == 1.0
    assert auc([0.4, 0.3, 0.2, 0.1], [0, 0, 1, 1]) == 0.0
    assert auc([1, 1, 1, 1], [0, 1, 0, 1]) == 0.5  # ties count half
    assert auc([0.1, 0.3, 0.2, 0.4], [0, 0, 1, 1]) == 0.75


# ------------------------------------------------------------------------------------------------
# Criteo files
# ------------------------------------------------------------------------------------------------


def test_layouts_read_the_same_values(tmp_path: Path) -> None:
    lines = sample_lines()[:12]
    comma = tmp_path / "comma.csv"
    comma.write_text("\n".join(lines) + "\n")
    tab = tmp_path / "day_0"
    tab.write_text("\n".join(line.replace(",", "\t") for line in lines))  # no final newline
    crlf = tmp_path / "crlf.csv"
    crlf.write_bytes(("\r\n".join(lines) + "\r\n").encode())
    tab_header = tmp_path / "header.tsv"
    header = SAMPLE.read_text().splitlines()[0]
    tab_header.write_text("\n".join(x.replace(",", "\t") for x in [header, *lines]) + "\n")

    with_header = CriteoFiles([SAMPLE], TABLES).read(RowRange(0, 0, 12))
    assert len(with_header) == 12
    for path in (comma, tab, crlf, tab_header):
        files = CriteoFiles([path], TABLES)
        assert files.source_rows == (12,)
        assert same(files.read(RowRange(0, 0, 12)), with_header), path.name


@pytest.mark.parametrize("final", ["\r", "", "\r\r"], ids=["final-cr", "none", "blank-end"])
def test_a_file_with_cr_only_line_ends_reads_as_its_rows(tmp_path: Path, final: str) -> None:
    """Old Mac tools end lines with CR alone: the file is its rows, not one line that reads
    as "no data rows"; any range reads as the same rows with LF line ends."""
    header, *lines = SAMPLE.read_text().splitlines()
    mac = tmp_path / "mac.csv"
    mac.write_bytes(("\r".join([header, *lines]) + final).encode())
    files = CriteoFiles([mac], TABLES, index_stride=16)  # several index marks
    assert files.source_rows == (len(lines),) == (200,)
    unix = CriteoFiles([SAMPLE], TABLES)
    for start, end in ((0, 200), (37, 121), (199, 200)):
        assert same(files.read(RowRange(0, start, end)), unix.read(RowRange(0, start, end)))


def test_kaggle_files_without_header_crlf_and_final_newline() -> None:
    files = CriteoFiles([KAGGLE_TRAIN, KAGGLE_TEST], TABLES)
    assert files.source_rows == (200, 200)
    for source in (0, 1):
        batch = files.read(RowRange(source, 0, 200))
        assert len(batch) == 200 and batch.bad_rows == 0
    # The last row (no newline after it) is read whole: its final categorical is present.
    last = (KAGGLE_TEST.read_text().split("\n")[-1]).split(",")
    tail = files.read(RowRange(1, 199, 200))
    assert tail.labels[0] == float(last[0])
    expect_i1 = math.log1p(max(float(last[1] or 0), 0.0))
    assert tail.dense[0, 0] == pytest.approx(expect_i1, rel=1e-6)


def test_log_transform_missing_and_negative() -> None:
    # Row 1 of the sample: 0,,-1,19.0,35.0,30251.0,247.0,1.0,35.0,160.0,,1.0,,35.0,...
    row = sample_lines()[1].split(",")
    assert row[1] == "" and row[2] == "-1" and row[3] == "19.0"
    batch = CriteoFiles([SAMPLE], TABLES).read(RowRange(0, 1, 2))
    assert batch.dense.dtype == np.float32 and batch.dense.shape == (1, 13)
    expected = [math.log1p(max(float(x), 0.0)) if x else 0.0 for x in row[1:14]]
    np.testing.assert_allclose(batch.dense[0], expected, rtol=1e-6)
    assert batch.dense[0, 0] == 0.0  # I1 missing
    assert batch.dense[0, 1] == 0.0  # I2 = -1 clamped before the log
    assert batch.dense[0, 2] == pytest.approx(math.log(20.0))


def test_hashing_is_stable_and_within_table_sizes() -> None:
    # Hex tokens are their own value; others go through blake2b (pinned: it must never change).
    assert token_value(b"68fd1e64") == 0x68FD1E64
    assert token_value(b"68FD1E64") == 0x68FD1E64
    assert token_value(b"not-hex") == token_value(b"not-hex")
    assert token_value(b"not-hex") == 0xE5DC76FECE1FF941
    assert token_value(b"0123456789abcdef0") != int("0123456789abcdef0", 16)  # > 64 bits

    sizes = [1, 2, 7, 1_000_000] * 6 + [3, 10]
    batch = CriteoFiles([SAMPLE], sizes).read(RowRange(0, 0, 200))
    assert batch.sparse.dtype == np.int64 and batch.sparse.shape == (200, 26)
    limits = np.array(sizes)
    assert ((batch.sparse >= 0) & (batch.sparse < limits)).all()
    assert (batch.sparse[:, 0] == 0).all()  # a table of one row

    # First sample row: C4 = f56b7dd5, C19 and C20 empty (missing -> row 0 of every table).
    row = sample_lines()[0].split(",")
    c4, c19 = row[14 + 3], row[14 + 18]
    assert c4 == "f56b7dd5" and c19 == ""
    assert batch.sparse[0, 3] == 1 + 0xF56B7DD5 % (1_000_000 - 1)
    assert batch.sparse[0, 18] == 0
    # Long hex (up to 64 bits) and non-hex tokens, straight through the line parser.
    fields = [*row[:14], "ffffffffffffffff", "a b", *row[16:]]
    one = parse_criteo_lines([",".join(fields).encode()], b",", [10**6] * 26)
    assert one.sparse[0, 0] == 1 + 0xFFFFFFFFFFFFFFFF % (10**6 - 1)
    assert one.sparse[0, 1] == 1 + token_value(b"a b") % (10**6 - 1)
    # The same file read by another instance gives the same ids.
    again = CriteoFiles([SAMPLE], sizes).read(RowRange(0, 0, 200))
    assert np.array_equal(again.sparse, batch.sparse)


@pytest.mark.parametrize(
    ("content", "header"),
    [
        (b"h\na\nbb\n\nc\r\nd", True),  # header, an empty line inside, CRLF, no final newline
        (b"a\nb\nc\n\n\r\n\n", False),  # trailing empty lines are not rows
        (b"a\r\nb\r\n", False),
        (b"only-header\n\n", True),
        (b"x", False),
        (b"", False),
    ],
)
def test_line_index_matches_a_naive_split(tmp_path: Path, content: bytes, header: bool) -> None:
    path = tmp_path / "f"
    path.write_bytes(content)
    lines = content.split(b"\n")[1 if header else 0 :]
    while lines and not lines[-1].strip(b"\r"):
        lines.pop()
    for stride in (1, 2, 3, 256):
        index = index_lines(str(path), header, stride)
        assert index.rows == len(lines), stride
        for start in range(len(lines) + 1):
            for end in range(start, len(lines) + 1):
                begin, stop, skip = index.span(start, end)
                got = content[begin:stop].split(b"\n")[skip : skip + end - start]
                assert got == lines[start:end], (stride, start, end)


def test_index_stride_does_not_change_what_is_read() -> None:
    dense = CriteoFiles([KAGGLE_TRAIN], TABLES, index_stride=1)
    whole = dense.read(RowRange(0, 0, 200))
    for stride in (7, 64):
        files = CriteoFiles([KAGGLE_TRAIN], TABLES, index_stride=stride)
        for start, end in ((0, 200), (6, 8), (7, 14), (13, 150), (199, 200), (63, 129)):
            assert same(files.read(RowRange(0, start, end)), whole.slice(start, end))


def test_adjacent_ranges_equal_their_union() -> None:
    files = CriteoFiles([SAMPLE], TABLES)
    whole = files.read(RowRange(0, 0, 120))
    a, b = files.read(RowRange(0, 0, 50)), files.read(RowRange(0, 50, 120))
    joined = Batch(
        dense=np.concatenate([a.dense, b.dense]),
        sparse=np.concatenate([a.sparse, b.sparse]),
        labels=np.concatenate([a.labels, b.labels]),
    )
    assert len(a) == 50 and len(b) == 70
    assert same(joined, whole)
    assert len(files.read(RowRange(0, 7, 7))) == 0
    with pytest.raises(ValueError, match="past the end"):
        files.read(RowRange(0, 150, 201))
    with pytest.raises(ValueError, match="names no file"):
        files.read(RowRange(1, 0, 1))


def test_bad_rows_are_counted_and_skipped(tmp_path: Path) -> None:
    good = sample_lines()[:4]
    short = ",".join(good[0].split(",")[:-1])  # 39 columns
    letters = good[0].split(",")
    letters[3] = "abc"  # a non-numeric integer feature
    seven = "7" + good[0][1:]  # label 7
    nan = good[0].split(",")
    nan[5] = "nan"  # parses as a float but is no count
    lines = [good[0], short, good[1], ",".join(letters), seven, good[2], ",".join(nan), "", good[3]]
    path = tmp_path / "bad.csv"
    path.write_text("\n".join(lines) + "\n\n")  # a trailing empty line is not a row

    files = CriteoFiles([path], TABLES)
    assert files.source_rows == (9,)
    batch = files.read(RowRange(0, 0, 9))
    assert batch.bad_rows == 5  # short, abc, label 7, nan, the empty line in the middle
    clean = tmp_path / "clean.csv"
    clean.write_text("\n".join(good) + "\n")
    assert same(batch, CriteoFiles([clean], TABLES).read(RowRange(0, 0, 4)))
    # bad_rows travels with the first slice only: the sum over consecutive slices is the total.
    parts = [batch.slice(0, 2), batch.slice(2, 3), batch.slice(3, 4)]
    assert [p.bad_rows for p in parts] == [5, 0, 0]
    assert same(parts[1], Batch(batch.dense[2:3], batch.sparse[2:3], batch.labels[2:3]))


def test_a_missing_file_is_named_and_empty_ones_add_no_rows(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_bytes(b"")
    header_only = tmp_path / "header.csv"
    header_only.write_text(SAMPLE.read_text().splitlines()[0] + "\n\n")
    missing = tmp_path / "missing.csv"
    with pytest.raises(UserInputError, match=str(missing)):
        CriteoFiles([missing], TABLES)
    # Files without a data row add none (a dataset of nothing but those is refused where its
    # rows are split: "data: no training rows"), as a Parquet file of no rows does.
    assert CriteoFiles([empty, header_only, SAMPLE], TABLES).source_rows[:2] == (0, 0)


def test_criteo_shape_is_checked() -> None:
    with pytest.raises(UserInputError, match=r"model\.dense_features.*12"):
        CriteoFiles([SAMPLE], TABLES, dense_features=12)
    with pytest.raises(UserInputError, match=r"model\.table_sizes.*25"):
        CriteoFiles([SAMPLE], TABLES[:25])


def test_open_dataset(tmp_path: Path) -> None:
    model = ModelSpec(table_sizes=TABLES)
    for name in ("part-b.csv", "part-a.csv"):
        (tmp_path / name).write_text("\n".join(sample_lines()[:5]) + "\n")
    (tmp_path / "other.txt").write_text("x")
    data = open_dataset(CriteoData(path="part-*.csv"), model, base_dir=tmp_path)
    assert isinstance(data, CriteoFiles) and isinstance(data, Dataset)
    assert [Path(p).name for p in data.paths] == ["part-a.csv", "part-b.csv"]
    assert data.source_rows == (5, 5)
    # An absolute pattern ignores base_dir.
    absolute = open_dataset(CriteoData(path=str(SAMPLE)), model, base_dir="/nonexistent")
    assert absolute.source_rows == (200,)
    with pytest.raises(UserInputError, match=r"data\.path.*nothing-\*\.csv"):
        open_dataset(CriteoData(path="nothing-*.csv"), model, base_dir=tmp_path)

    synthetic = open_dataset(SyntheticData(rows=1000, seed=3), model)
    assert isinstance(synthetic, SyntheticCriteo)
    assert synthetic.source_rows == (1000,)
    batch = synthetic.read(RowRange(0, 0, 1000))
    assert batch.dense.shape == (1000, 13) and batch.sparse.shape == (1000, 26)


# ------------------------------------------------------------------------------------------------
# Synthetic Criteo
# ------------------------------------------------------------------------------------------------


def test_synthetic_is_deterministic_across_blocks_and_instances() -> None:
    data = SyntheticCriteo(5000, TABLES, seed=7, block_rows=512)
    whole = data.read(RowRange(0, 0, 5000))
    assert same(data.read(RowRange(0, 0, 1000)), whole.slice(0, 1000))
    # Ranges that start and end inside blocks, and span several.
    for start, end in ((100, 1500), (511, 513), (4999, 5000), (1024, 2048)):
        assert same(data.read(RowRange(0, start, end)), whole.slice(start, end)), (start, end)
    # Another instance (as in another process), another row count: the same stream.
    other = SyntheticCriteo(20000, TABLES, seed=7, block_rows=512)
    assert same(other.read(RowRange(0, 300, 3000)), whole.slice(300, 3000))
    different = SyntheticCriteo(5000, TABLES, seed=8, block_rows=512).read(RowRange(0, 0, 5000))
    assert not np.array_equal(different.sparse, whole.sparse)
    assert not np.array_equal(different.dense, whole.dense)
    assert whole.bad_rows == 0


def test_synthetic_shape_like_criteo() -> None:
    sizes = (10, 1_000_000, 1, 2, 1000)
    data = SyntheticCriteo(100_000, sizes, dense_features=13, seed=1)
    batch = data.read(RowRange(0, 0, 100_000))
    assert batch.dense.dtype == np.float32 and batch.sparse.dtype == np.int64
    assert batch.labels.dtype == np.float32 and set(np.unique(batch.labels)) == {0.0, 1.0}
    assert (batch.dense >= 0).all()
    assert ((batch.dense == 0).mean(axis=0) > 0.05).all()  # zeros and missing counts
    assert batch.dense.max() > 8.0  # heavy tail: counts above e^8 - 1 ~ 3000 occur
    assert ((batch.sparse >= 0) & (batch.sparse < np.array(sizes))).all()
    assert (batch.sparse[:, 2] == 0).all()
    assert len(np.unique(batch.sparse[:, 0])) == 10  # a small table uses all its rows

    # Zipf-like big table: the top 1 % of its ids carry most occurrences, and a long tail exists.
    counts = np.sort(np.bincount(batch.sparse[:, 1], minlength=1_000_000))[::-1]
    assert counts[:10_000].sum() / counts.sum() > 0.5
    assert (counts > 0).sum() > 10_000


def test_synthetic_signal_is_strong_and_learnable() -> None:
    n_train, n_eval = 50_000, 20_000
    data = SyntheticCriteo(n_train + n_eval, TABLES, seed=11)
    batch = data.read(RowRange(0, 0, n_train + n_eval))
    logits = data.true_logits(RowRange(0, 0, n_train + n_eval))
    assert np.array_equal(logits[:100], data.true_logits(RowRange(0, 0, 100)))
    y = batch.labels.astype(np.float64)
    assert 0.2 <= y.mean() <= 0.3  # Criteo-like click rate
    assert auc(logits[:n_train], y[:n_train]) >= 0.80

    # Logistic regression on standardised dense features + one-hot of the 32 most frequent ids
    # of every table (others share one bucket), fitted by block coordinate Newton steps: within
    # one table the one-hot columns are disjoint, so the Hessian of that block is diagonal.
    heads = 32
    dense = batch.dense.astype(np.float64)
    dense = (dense - dense[:n_train].mean(0)) / dense[:n_train].std(0)
    dense = np.c_[np.ones(len(dense)), dense]
    buckets = np.minimum(batch.sparse, heads)  # Zipf: low ids are the frequent ones
    w = np.zeros(dense.shape[1])
    emb = np.zeros((len(TABLES), heads + 1))
    tr = slice(0, n_train)
    score = np.zeros(n_train)
    for _ in range(6):
        for t in range(len(TABLES)):
            p = 1.0 / (1.0 + np.exp(-score))
            g = np.bincount(buckets[tr, t], weights=p - y[tr], minlength=heads + 1)
            h = np.bincount(buckets[tr, t], weights=p * (1 - p), minlength=heads + 1) + 1.0
            step = g / h
            emb[t] -= step
            score -= step[buckets[tr, t]]
        p = 1.0 / (1.0 + np.exp(-score))
        x = dense[tr]
        hess = x.T @ (x * (p * (1 - p))[:, None]) + np.eye(x.shape[1])
        step_w = np.linalg.solve(hess, x.T @ (p - y[tr]))
        w -= step_w
        score -= x @ step_w
    ev = slice(n_train, n_train + n_eval)
    eval_score = dense[ev] @ w + emb[np.arange(len(TABLES)), buckets[ev]].sum(axis=1)
    assert auc(eval_score, y[ev]) >= 0.70


def test_synthetic_rejects_bad_input() -> None:
    with pytest.raises(UserInputError, match=r"data\.rows"):
        SyntheticCriteo(0, TABLES)
    with pytest.raises(UserInputError, match=r"model\.table_sizes"):
        SyntheticCriteo(10, [])
    with pytest.raises(UserInputError, match=r"model\.table_sizes"):
        SyntheticCriteo(10, [5, 0])
    with pytest.raises(ValueError, match="outside"):
        SyntheticCriteo(10, TABLES).read(RowRange(0, 5, 11))


def test_synthetic_200k_rows_are_fast() -> None:
    data = SyntheticCriteo(200_000, TABLES, seed=2)
    began = time.perf_counter()
    batch = data.read(RowRange(0, 0, 200_000))
    assert time.perf_counter() - began < 5.0
    assert len(batch) == 200_000


# ------------------------------------------------------------------------------------------------
# Splitting
# ------------------------------------------------------------------------------------------------


def test_split_ranges_cover_every_row_once_with_the_tail_held_out() -> None:
    source_rows = (1000, 1, 2, 37, 0)
    train, evaluation = split_ranges(source_rows, shard_rows=64, eval_fraction=0.1)
    assert all(0 < r.rows <= 64 for r in train)
    for source, n in enumerate(source_rows):
        seen = np.zeros(n, dtype=np.int64)
        for r in (*train, *evaluation):
            if r.source == source:
                seen[r.start : r.end] += 1
        assert (seen == 1).all(), source
    assert evaluation == [
        RowRange(0, 900, 1000),
        RowRange(2, 1, 2),  # at least one row from a source of two
        RowRange(3, 34, 37),
    ]
    # Training shards are in order: by source, then by row.
    assert train == sorted(train, key=lambda r: (r.source, r.start))
    assert train[0] == RowRange(0, 0, 64) and RowRange(0, 896, 900) in train
    assert RowRange(1, 0, 1) in train  # a one-row source has nothing to hold out

    no_eval = split_ranges((10,), shard_rows=4, eval_fraction=0.0)
    assert no_eval == ([RowRange(0, 0, 4), RowRange(0, 4, 8), RowRange(0, 8, 10)], [])
    assert split_ranges((10,), 4, 0.3) == split_ranges((10,), 4, 0.3)
    with pytest.raises(UserInputError, match="eval_fraction"):
        split_ranges((10,), 4, 0.6)
    with pytest.raises(UserInputError, match="shard_rows"):
        split_ranges((10,), 0, 0.1)
