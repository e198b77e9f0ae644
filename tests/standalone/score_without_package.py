"""Score raw rows with an exported model.onnx, following model.json alone, without dlrover_kfp.

A platform that serves the model has onnxruntime and the files, not this package. This script is
that platform's scorer: it blocks ``dlrover_kfp`` before anything else (so an import of it fails
here, as it would there), reads ``model.json``, turns raw rows into the graph's inputs by the
rules written in it (its own hashing and log transform: numpy and hashlib only), runs
onnxruntime and computes the metrics itself (ROC AUC by ranks, ties averaged; log-loss with the
probabilities clipped to [1e-7, 1 - 1e-7]).

    python score_without_package.py MODEL_DIR FILE [FILE ...] [--range START:END ...]

A FILE ending in ``.parquet`` is read with pyarrow, by column name; any other file is Criteo
text (label, dense, sparse columns in that order; tab or comma separated, by the first line;
an optional header; LF, CRLF or CR line ends). ``--range`` (once per file, in order) takes data
rows ``[START, END)`` of that file (the header not counted). Rows the trainer counts as bad
(wrong column count, a label other than 0/1, a dense value that is not a finite number) are
skipped. Prints ``{"rows": n, "auc": a, "loss": l}`` on stdout.
"""

from __future__ import annotations

import sys

sys.modules["dlrover_kfp"] = None  # type: ignore[assignment]  # any import of it fails from here

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

HEX = frozenset(b"0123456789abcdefABCDEF")
EPS = 1e-7


def token_value(token: bytes) -> int:
    """model.json's string rule: hex tokens of up to 16 digits as numbers, else blake2b."""
    if 0 < len(token) <= 16 and HEX.issuperset(token):
        return int(token, 16)
    return int.from_bytes(hashlib.blake2b(token, digest_size=8).digest(), "big")


def string_id(token: bytes | None, size: int) -> int:
    if not token or size == 1:
        return 0
    return 1 + token_value(token) % (size - 1)


def integer_id(value: int | None, size: int) -> int:
    """model.json's integer rule."""
    if value is None:
        return 0
    if 0 <= value < size:
        return value
    if size == 1:
        return 0
    return 1 + (value % (1 << 64)) % (size - 1)


def dense_value(cell: bytes) -> float:
    """A raw dense cell as a number (empty: 0); ValueError when not a finite number."""
    x = float(cell) if cell else 0.0
    if not math.isfinite(x):
        raise ValueError(cell)
    return x


def criteo_text(path: Path, rows: tuple[int, int] | None, sizes: list[int], n_dense: int) -> Any:
    """(dense raw float64 [n, D], ids int64 [n, T], labels [n]) of a Criteo text file's rows."""
    data = path.read_bytes()
    newline = b"\r" if b"\r" in data[:65536] and b"\n" not in data[:65536] else b"\n"
    lines = data.split(newline)
    while lines and not lines[-1].strip(b"\r\n"):  # trailing empty lines are not rows
        lines.pop()
    first = lines[0].rstrip(b"\r")
    sep = b"\t" if b"\t" in first else b","
    try:
        float(first.split(sep, 1)[0].strip())
    except ValueError:
        lines = lines[1:]  # a header
    if rows is not None:
        lines = lines[rows[0] : rows[1]]
    dense, ids, labels = [], [], []
    for line in lines:
        fields = line.rstrip(b"\r").split(sep)
        if len(fields) != 1 + n_dense + len(sizes) or fields[0].strip() not in (b"0", b"1"):
            continue
        try:
            values = [dense_value(c) for c in fields[1 : 1 + n_dense]]
        except ValueError:
            continue
        labels.append(float(fields[0].strip()))
        dense.append(values)
        ids.append([string_id(t, s) for t, s in zip(fields[1 + n_dense :], sizes, strict=True)])
    return np.array(dense, dtype=np.float64).reshape(-1, n_dense), np.array(ids), labels


def parquet(path: Path, rows: tuple[int, int] | None, pre: dict[str, Any]) -> Any:
    """The same from a Parquet file, by the column names of model.json."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    cols = pre["columns"]
    table = pq.read_table(path, columns=[cols["label"], *cols["dense"], *cols["sparse"]])
    if rows is not None:
        table = table.slice(rows[0], rows[1] - rows[0])
    dense = np.stack(
        [
            np.nan_to_num(table[c].cast(pa.float64()).to_numpy(zero_copy_only=False), nan=0.0)
            for c in cols["dense"]
        ],
        axis=1,
    )
    ids = []
    for spec in pre["sparse"]["tables"]:
        column, size = table[spec["column"]], spec["size"]
        values = column.to_pylist()
        if pa.types.is_integer(column.type):
            ids.append([integer_id(v, size) for v in values])
        else:
            raw = [
                None if v is None else (v if isinstance(v, bytes) else v.encode()) for v in values
            ]
            ids.append([string_id(v, size) for v in raw])
    labels = table[cols["label"]].cast(pa.float64()).to_pylist()
    return dense, np.array(ids).T, labels


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float | None:
    """Mann-Whitney AUC with average ranks for tied scores."""
    pos = labels.astype(bool)
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(len(scores), dtype=np.float64)
    start = 0
    while start < len(scores):  # a run of equal scores shares the mean of its ranks
        end = start
        while end + 1 < len(scores) and sorted_scores[end + 1] == sorted_scores[start]:
            end += 1
        ranks[order[start : end + 1]] = (start + end) / 2.0 + 1.0
        start = end + 1
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def log_loss(labels: np.ndarray, probs: np.ndarray) -> float:
    p = np.clip(probs.astype(np.float64), EPS, 1.0 - EPS)
    return float(-np.mean(labels * np.log(p) + (1.0 - labels) * np.log1p(-p)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--range", action="append", default=[], metavar="START:END")
    args = parser.parse_args()
    description = json.loads((args.model_dir / "model.json").read_text())
    spec = description["onnx"]
    pre = spec["preprocessing"]
    sizes = [t["size"] for t in pre["sparse"]["tables"]]
    n_dense = len(pre["columns"]["dense"])
    ranges = [tuple(int(x) for x in r.split(":")) for r in args.range]
    if ranges and len(ranges) != len(args.files):
        parser.error("give --range once per file, or not at all")
    dense_parts, id_parts, labels = [], [], []
    for k, path in enumerate(args.files):
        rows = ranges[k] if ranges else None
        if path.suffix == ".parquet":
            dense, ids, y = parquet(path, rows, pre)
        else:
            dense, ids, y = criteo_text(path, rows, sizes, n_dense)
        dense_parts.append(dense)
        id_parts.append(ids.reshape(-1, len(sizes)))
        labels += y
    # The dense rule: log(1 + max(x, 0)), then float32.
    dense_in = np.log1p(np.maximum(np.concatenate(dense_parts), 0.0)).astype(np.float32)
    sparse_in = np.concatenate(id_parts).astype(np.int64)
    session = ort.InferenceSession(
        str(args.model_dir / spec["file"]), providers=["CPUExecutionProvider"]
    )
    (probs,) = session.run(["probability"], {"dense": dense_in, "sparse": sparse_in})
    y = np.array(labels, dtype=np.float64)
    print(json.dumps({"rows": len(y), "auc": roc_auc(y, probs), "loss": log_loss(y, probs)}))


if __name__ == "__main__":
    main()
