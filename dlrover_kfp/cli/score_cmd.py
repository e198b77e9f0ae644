"""``dlrover-kfp score``: a trained model's click probabilities for rows of data, as Parquet.

Thin over :func:`dlrover_kfp.steps.score.score_step` (onnxruntime and ``model.onnx``, no torch).
Progress goes to stderr; the summary (rows, bad rows, AUC and log-loss against the rows' labels,
where the file went) is the only thing on stdout, as JSON.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from dlrover_kfp.cli.common import HELP_FORMAT, emit_json, positive_int

_DESCRIPTION = """\
Score rows with a model that `dlrover-kfp run` trained (its model/ directory: model.json and
model.onnx), using onnxruntime, and write one Parquet row per scored input row: source (the
input file's index, files sorted), row (its index in that file), label, probability. Rows are
read and hashed as training read them (the columns model.json records); bad rows are skipped
and counted. See docs/serving.md."""

_EPILOG = """\
Examples:
  dlrover-kfp score --model runs/ctr-daily/model --data "days/day_23.tsv" --output scores.parquet
  dlrover-kfp score --model runs/ctr/model --data s3://clicks/2026-11-27/ --format parquet \\
      --output predictions/2026-11-27.parquet
  dlrover-kfp score --model out/model --data data/ --held-out --output held_out.parquet"""


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "score",
        help="score rows with a trained model (onnxruntime) and write predictions as Parquet",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=HELP_FORMAT,
    )
    parser.add_argument("--model", required=True, metavar="DIR", help="the model directory")
    parser.add_argument(
        "--data",
        required=True,
        metavar="URL",
        help="a file, directory, glob or fsspec URL (s3://, gs://, file://) of the rows",
    )
    parser.add_argument(
        "--format",
        choices=("criteo", "parquet", "csv", "tsv"),
        help="how to read --data (default: parquet for a .parquet path, else criteo for a "
        "model trained on Criteo's columns, else csv or tsv by the suffix)",
    )
    parser.add_argument(
        "--output", required=True, metavar="PATH", help="the Parquet file to write (atomically)"
    )
    parser.add_argument(
        "--held-out",
        action="store_true",
        help="score only the rows the train step held out (model.json's held_out: the last "
        "eval_fraction of each file); --data must be the files the model was trained on",
    )
    parser.add_argument(
        "--chunk-rows",
        type=positive_int,
        default=None,
        metavar="N",
        help="rows per read and per onnxruntime call (default 65536)",
    )
    parser.set_defaults(func=_run)


#: Seconds between progress lines on stderr.
PROGRESS_INTERVAL_S = 2.0


def throttled(interval_s: float) -> Callable[[str], None]:
    """A progress printer that shows a line at most every ``interval_s`` (and the last one)."""
    last = [-interval_s]

    def show(line: str) -> None:
        now = time.monotonic()
        if now - last[0] >= interval_s or line.startswith("[100.0%]"):
            last[0] = now
            print(line, file=sys.stderr, flush=True)

    return show


def _run(args: argparse.Namespace) -> int:
    from dlrover_kfp.steps.score import CHUNK_ROWS, score_step  # noqa: PLC0415

    result = score_step(
        args.model,
        args.data,
        args.output,
        data_format=args.format,
        progress=throttled(PROGRESS_INTERVAL_S),
        chunk_rows=args.chunk_rows or CHUNK_ROWS,
        held_out=args.held_out,
    )
    emit_json(result.to_dict())
    return 0
