"""The score step: a trained model's click probabilities for rows of data, as a Parquet file.

``dlrover-kfp score``, the KFP scoring component and the Airflow scoring operator all call
:func:`score_step`. It scores with onnxruntime and the exported ``model.onnx`` (never torch), so
it runs where the model will be served and checks the file that will be served; the rows come
through the data layer (:func:`~dlrover_kfp.training.data.open_dataset`), so a row is turned into
model inputs exactly as in training (the column mapping and hashing ``model.json`` records).

The output has one row per scored input row: ``source`` (the input file's index, in the sorted
order the data layer lists them), ``row`` (the row's index within that file, its header not
counted), ``label`` and ``probability``. Rows the reader counts as bad (a wrong column count, a
label other than 0/1, a dense value that is not a number) are skipped and counted, as in
training: a chunk whose batch reports bad rows is split in halves until every good row's index is
known (a chunk that is all bad is dropped whole), so the indices stay exact at the cost of a few
extra reads around each bad row.

The file is written whole to a temporary name beside the target and then renamed, so a reader
sees no file or the complete one.

``held_out=True`` scores only the rows the train step held out (``model.json``'s ``held_out``:
its ``eval_fraction``, and the files it trained on): the evaluate step
(:mod:`dlrover_kfp.steps.evaluate`) checks with them that the exported model reproduces the
train step's own evaluation.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from dlrover_kfp.core.documents import parse
from dlrover_kfp.core.spec import CriteoData, DataColumns, ModelSpec, SyntheticData, TableData
from dlrover_kfp.errors import SpecError, UserInputError
from dlrover_kfp.files import readable_temp
from dlrover_kfp.training import storage
from dlrover_kfp.training.data import Batch, Dataset, RowRange, split_ranges
from dlrover_kfp.training.datasets import data_fingerprint, open_dataset
from dlrover_kfp.training.installed import SERVE_EXTRA, require_modules

FloatArray = npt.NDArray[np.float32]

#: Input rows per onnxruntime call (and per data read): ~10 MB of inputs for Criteo's shape.
CHUNK_ROWS = 65536
FORMATS = ("criteo", "parquet", "csv", "tsv")
_PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")


@dataclass(frozen=True, slots=True)
class HeldOut:
    """``model.json``'s ``held_out`` (written by runtime/export.py ``held_out_record``): the
    fraction of each file the train step held out, and the files it read (name, size, rows)."""

    #: how the train step read the files (data.format), the default for reading them here
    data_format: str
    eval_fraction: float
    source_rows: tuple[int, ...]
    files: tuple[tuple[str, int], ...]
    fingerprint: str
    #: generated rows (data format synthetic): the generator's rows and seed
    synthetic: SyntheticData | None = None


@dataclass(frozen=True, slots=True)
class ScoredModel:
    """What ``model.json`` says the scorer needs: the graph's path, the model's shape and the
    columns of the data it was trained on; ``held_out`` None for a model exported before
    model.json recorded it."""

    onnx_path: Path
    model: ModelSpec
    columns: DataColumns
    held_out: HeldOut | None = None


@dataclass(frozen=True, slots=True)
class ScoreResult:
    """The step's summary (the CLI prints it as JSON). ``auc`` and ``loss`` are those of the
    scored rows against their labels (``auc`` None with a single class)."""

    output: str
    rows: int
    bad_rows: int
    sources: int
    auc: float | None
    loss: float | None
    seconds: float
    #: only the rows the train step held out were scored
    held_out: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "output": self.output,
            "rows": self.rows,
            "bad_rows": self.bad_rows,
            "sources": self.sources,
            "held_out": self.held_out,
            "auc": self.auc,
            "loss": self.loss,
            "seconds": round(self.seconds, 3),
        }


def load_scored_model(model_dir: str | os.PathLike[str]) -> ScoredModel:
    """Read ``model_dir/model.json``; one-line errors naming the file for what is missing."""
    directory = Path(model_dir)
    described_path = directory / "model.json"
    try:
        described = json.loads(described_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserInputError(f"--model: {described_path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise UserInputError(f"--model: cannot read {described_path}: {exc}") from None
    entry = described.get("onnx") if isinstance(described, dict) else None
    if not isinstance(entry, dict):
        raise UserInputError(
            f"--model: {described_path} has no 'onnx' entry (a model exported before "
            "dlrover-kfp wrote ONNX models): train it again"
        )
    try:
        model = parse(ModelSpec, described.get("model"), f"{described_path}: model")
        columns = parse(DataColumns, entry["preprocessing"]["columns"], f"{described_path}")
        onnx_path = directory / str(entry["file"])
        data_file = entry.get("external_data")
    except (KeyError, TypeError) as exc:
        raise UserInputError(f"--model: {described_path}: 'onnx' entry lacks {exc}") from None
    for name in (onnx_path.name, data_file):
        if name and not (directory / name).is_file():
            raise UserInputError(f"--model: {directory / name} (named by model.json) is missing")
    held_out = _held_out(described.get("held_out"), described_path)
    return ScoredModel(onnx_path=onnx_path, model=model, columns=columns, held_out=held_out)


def _held_out(entry: object, path: Path) -> HeldOut | None:
    if entry is None:
        return None
    bad = UserInputError(f"--model: {path}: a malformed 'held_out' entry")
    if not isinstance(entry, dict):
        raise bad
    try:
        return HeldOut(
            data_format=str(entry["format"]),
            eval_fraction=float(entry["eval_fraction"]),
            source_rows=tuple(int(n) for n in entry["source_rows"]),
            files=tuple((str(f["name"]), int(f["size"])) for f in entry["files"]),
            fingerprint=str(entry.get("fingerprint") or ""),
            synthetic=(
                SyntheticData(rows=int(generated["rows"]), seed=int(generated["seed"]))
                if (generated := entry.get("synthetic")) is not None
                else None
            ),
        )
    except (KeyError, TypeError, ValueError):
        raise bad from None


def held_out_ranges(dataset: Dataset, held_out: HeldOut, data: str) -> list[RowRange]:
    """The rows the train step held out, in ``dataset``: the last ``eval_fraction`` of each
    file, by the train step's own rule (``split_ranges``). Refused (one line naming the first
    difference) unless ``dataset`` lists the files the model was trained on: the same listing
    (fingerprint), or the same names, sizes and row counts read from another place."""
    where = f"--data {storage.display(data)}"
    same = bool(held_out.fingerprint) and data_fingerprint(dataset) == held_out.fingerprint
    if not same:
        difference = _first_difference(dataset, held_out)
        if difference:
            raise UserInputError(
                f"{where}: not the files the model was trained on ({difference}); its held-out "
                "rows are those of its training files"
            )
    rows = dataset.source_rows
    return split_ranges(rows, max([1, *rows]), held_out.eval_fraction)[1]


def held_out_rows(
    scored: ScoredModel, data: str, data_format: str | None, base_dir: str | os.PathLike[str]
) -> tuple[Dataset, list[RowRange]]:
    """The dataset the model was trained on and its held-out rows: ``data`` read as the train
    step read it (its ``data.format`` unless ``data_format`` says otherwise), or, for a model
    trained on generated rows, the same rows generated again (``data`` must then be empty)."""
    held_out = scored.held_out
    if held_out is None:
        raise UserInputError(
            "--held-out: the model's model.json does not record its held-out rows (a model "
            "exported before it did): train it again"
        )
    if held_out.synthetic is not None:
        if data.strip():
            raise UserInputError(
                f"--data {storage.display(data)}: the model was trained on generated rows (data "
                f"format synthetic, {held_out.synthetic.rows} rows, seed "
                f"{held_out.synthetic.seed}), which are generated again here; give no data"
            )
        dataset = open_dataset(held_out.synthetic, scored.model)
        return dataset, held_out_ranges(dataset, held_out, data)
    if not data.strip():
        raise UserInputError("--data: empty; give the files the model was trained on")
    if data_format is None and held_out.data_format in FORMATS:
        data_format = held_out.data_format
    dataset = open_dataset(data_spec(data, data_format, scored.columns), scored.model, base_dir)
    return dataset, held_out_ranges(dataset, held_out, data)


def _first_difference(dataset: Dataset, held_out: HeldOut) -> str:
    """How ``dataset``'s files differ from the trained ones ("" when only where they are read
    from differs)."""
    files = getattr(dataset, "files", None) or ()
    listed = [
        (f.url.rstrip("/").rsplit("/", 1)[-1], f.size, n)
        for f, n in zip(files, dataset.source_rows, strict=False)
    ]
    trained = [(*f, n) for f, n in zip(held_out.files, held_out.source_rows, strict=False)]
    if len(listed) != len(trained):
        return f"{len(listed)} file(s), training read {len(trained)}"
    for i, (got, want) in enumerate(zip(listed, trained, strict=True)):
        if got != want:
            return (
                f"file {i} is {got[0]} of {got[1]} bytes and {got[2]} rows; training read "
                f"{want[0]} of {want[1]} bytes and {want[2]} rows"
            )
    return ""


def _guess(path: str, trained_on: str | None) -> str | None:
    """The format of the rows to score when ``--format`` is not given and the path names no
    file by its suffix (a directory, a prefix): the one the model was trained on (model.json's
    held_out); else none, and :func:`data_spec` decides from the suffix and the columns.
    Without this, a directory of Parquet files for a model trained on Parquet read as text."""
    name = path.rstrip("/").lower().rsplit("/", 1)[-1]
    if "." in name.lstrip(".") or "*" in name:
        return None  # a suffix or a glob: data_spec reads it
    return trained_on if trained_on in FORMATS else None


def data_spec(path: str, data_format: str | None, columns: DataColumns) -> CriteoData | TableData:
    """The data to score, read as training read it. Without ``data_format``: Parquet for a path
    ending in .parquet/.parq/.pq, else Criteo text when the model was trained on Criteo's
    columns, else CSV (.csv) or TSV."""
    if data_format is None:
        lower = path.rstrip("/").lower()
        if lower.endswith(_PARQUET_SUFFIXES):
            data_format = "parquet"
        elif columns == DataColumns():
            data_format = "criteo"
        else:
            data_format = "csv" if lower.endswith(".csv") else "tsv"
    if data_format not in FORMATS:
        raise UserInputError(f"--format: expected one of {', '.join(FORMATS)}, got {data_format!r}")
    try:
        if data_format == "criteo":
            if columns != DataColumns():
                raise UserInputError(
                    "--format criteo: the model was trained on other columns than Criteo's "
                    f"(label {columns.label!r}); give --format parquet, csv or tsv"
                )
            return CriteoData(path=path)
        return TableData(format=data_format, path=path, columns=columns)  # type: ignore[arg-type]
    except SpecError:
        raise
    except ValueError as exc:  # pydantic's, for a path it refuses
        raise UserInputError(f"--data: {str(exc).splitlines()[0]}") from None


def good_rows(dataset: Dataset, rows: RowRange) -> Iterator[tuple[int, Batch]]:
    """``(first row, batch)`` pieces of ``rows`` that hold no bad row, so that the i-th row of a
    piece is input row ``first + i``; bad rows are left out (see the module docstring)."""
    batch = dataset.read(rows)
    if batch.bad_rows == 0:
        yield rows.start, batch
        return
    if batch.bad_rows >= rows.rows or rows.rows == 1:
        return
    middle = rows.start + rows.rows // 2
    yield from good_rows(dataset, RowRange(rows.source, rows.start, middle))
    yield from good_rows(dataset, RowRange(rows.source, middle, rows.end))


def _session(path: Path) -> Any:
    import onnxruntime as ort  # noqa: PLC0415

    options = ort.SessionOptions()
    options.log_severity_level = 3  # warnings about unused initializers are not the user's
    try:
        return ort.InferenceSession(os.fspath(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own untyped errors for a bad file
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserInputError(f"--model: {path}: onnxruntime cannot load it: {first}") from None


class ParquetOutput:
    """The predictions file, written a chunk at a time to a temporary name beside the target
    and renamed onto it by :meth:`commit` (an object store: written locally, then uploaded in
    one PUT, which replaces the object whole); :meth:`discard` (or an error) leaves nothing."""

    SCHEMA_FIELDS = (("source", "int32"), ("row", "int64"), ("label", "float32"),
                     ("probability", "float32"))  # fmt: skip

    def __init__(self, output: str) -> None:
        import pyarrow as pa  # noqa: PLC0415
        import pyarrow.parquet as pq  # noqa: PLC0415

        self.url = None if storage.is_local(output) else output
        self.target = Path(output.removeprefix("file://")).expanduser()
        self._schema = pa.schema([(name, dtype) for name, dtype in self.SCHEMA_FIELDS])
        try:
            where = Path(tempfile.gettempdir()) if self.url else self.target.parent
            where.mkdir(parents=True, exist_ok=True)
            # 0644 like every published file: the scores are read by other processes
            self._tmp = readable_temp(where, self.target.name)
        except OSError as exc:
            raise UserInputError(f"--output: cannot write {self.target}: {exc.strerror}") from None
        self._writer = pq.ParquetWriter(str(self._tmp), self._schema)

    def write(self, source: int, first: int, labels: FloatArray, probs: FloatArray) -> None:
        import pyarrow as pa  # noqa: PLC0415

        n = len(labels)
        columns = (
            np.full(n, source, dtype=np.int32),
            np.arange(first, first + n, dtype=np.int64),
            labels,
            probs,
        )
        self._writer.write_table(pa.Table.from_arrays(list(columns), schema=self._schema))

    def commit(self) -> str:
        if self.url is not None:
            try:
                self._writer.close()
                storage.upload(self._tmp, self.url)
            finally:
                self._tmp.unlink(missing_ok=True)
            return storage.display(self.url)
        try:
            self._writer.close()
            os.replace(self._tmp, self.target)
        except OSError as exc:
            self.discard()
            raise UserInputError(f"--output: cannot write {self.target}: {exc.strerror}") from None
        return os.fspath(self.target)

    def discard(self) -> None:
        self._writer.close()
        self._tmp.unlink(missing_ok=True)


def score_step(
    model_dir: str | os.PathLike[str],
    data: str,
    output: str,
    *,
    data_format: str | None = None,
    base_dir: str | os.PathLike[str] = ".",
    progress: Callable[[str], None] | None = None,
    chunk_rows: int = CHUNK_ROWS,
    held_out: bool = False,
) -> ScoreResult:
    """Score every row of ``data`` with the model in ``model_dir`` (``held_out``: only the
    rows the train step held out, see :func:`held_out_ranges`); write the predictions to
    ``output`` (Parquet). ``progress`` gets a line per chunk."""
    require_modules(("onnxruntime", "pyarrow"), SERVE_EXTRA, "scoring")
    from dlrover_kfp.training.metrics import log_loss, roc_auc  # noqa: PLC0415 (scipy)

    started = time.monotonic()
    storage.check_url(output, "--output")
    scored = load_scored_model(model_dir)
    if held_out:
        dataset, ranges = held_out_rows(scored, data, data_format, base_dir)
    else:
        trained_on = scored.held_out.data_format if scored.held_out is not None else None
        spec = data_spec(data, data_format or _guess(data, trained_on), scored.columns)
        dataset = open_dataset(spec, scored.model, base_dir)
        ranges = [RowRange(s, 0, n) for s, n in enumerate(dataset.source_rows) if n]
    session = _session(scored.onnx_path)
    total = sum(r.rows for r in ranges)
    out = ParquetOutput(output)
    labels: list[FloatArray] = []
    probs: list[FloatArray] = []
    done = 0
    try:
        for rows in ranges:
            for start in range(rows.start, rows.end, chunk_rows):
                chunk = RowRange(rows.source, start, min(rows.end, start + chunk_rows))
                for first, batch in good_rows(dataset, chunk):
                    feed = {"dense": batch.dense, "sparse": batch.sparse}
                    prob = np.asarray(session.run(["probability"], feed)[0], dtype=np.float32)
                    out.write(rows.source, first, batch.labels, prob)
                    labels.append(batch.labels)
                    probs.append(prob)
                done += chunk.rows
                if progress is not None:
                    progress(f"[{100.0 * done / max(total, 1):5.1f}%] {done:,}/{total:,} rows read")
    except BaseException:
        out.discard()
        raise
    written = out.commit()
    y = np.concatenate(labels) if labels else np.zeros(0, dtype=np.float32)
    p = np.concatenate(probs) if probs else np.zeros(0, dtype=np.float32)
    auc = roc_auc(y, p) if len(y) else None
    return ScoreResult(
        output=written,
        rows=len(y),
        bad_rows=total - len(y),
        sources=len(dataset.source_rows),
        auc=None if auc is None else round(auc, 6),
        loss=round(log_loss(y, p), 6) if len(y) else None,
        seconds=time.monotonic() - started,
        held_out=held_out,
    )
