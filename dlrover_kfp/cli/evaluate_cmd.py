"""``dlrover-kfp evaluate``: the exported model must reproduce the train step's evaluation.

Thin over :func:`dlrover_kfp.steps.evaluate.evaluate_step`: the held-out rows scored with
``model.onnx`` by onnxruntime, their predictions and metrics written; exit 1 when its AUC is
not the train step's (within 1e-4), so that a pipeline stops before publishing the model.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dlrover_kfp.cli.common import HELP_FORMAT, emit_json, positive_int
from dlrover_kfp.cli.score_cmd import PROGRESS_INTERVAL_S, throttled
from dlrover_kfp.errors import EXIT_FAILED_RUN

_DESCRIPTION = """\
Score the rows a run held out (model.json's held_out: the last eval_fraction of each file it
trained on) with the exported model.onnx under onnxruntime, write their predictions (Parquet)
and a metrics document (auc, loss, rows, the train step's auc), and fail (exit 1) when the AUC
differs from the one the train step measured by more than 1e-4: the exported model is then not
the trained one and must not be published. --data must be the files the model was trained on
(the same names, sizes and rows). See docs/serving.md."""

_EPILOG = """\
Example:
  dlrover-kfp evaluate --model out/model --data s3://clicks/2026-11-27/ \\
      --predictions held_out.parquet --metrics evaluation.json"""


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "evaluate",
        help="check that the exported model reproduces the run's held-out AUC (onnxruntime)",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=HELP_FORMAT,
    )
    parser.add_argument("--model", required=True, metavar="DIR", help="the model directory")
    parser.add_argument(
        "--data",
        default="",
        metavar="URL",
        help="the files the model was trained on (none for a model trained on generated rows: "
        "data format synthetic, generated again)",
    )
    parser.add_argument(
        "--format",
        choices=("criteo", "parquet", "csv", "tsv"),
        help="how to read --data (default as for `dlrover-kfp score`)",
    )
    parser.add_argument(
        "--predictions", required=True, metavar="PATH", help="the Parquet file of predictions"
    )
    parser.add_argument(
        "--metrics", required=True, metavar="PATH", help="the metrics JSON (the gate reads it)"
    )
    parser.add_argument(
        "--chunk-rows", type=positive_int, default=None, metavar="N", help=argparse.SUPPRESS
    )
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from dlrover_kfp.steps.evaluate import evaluate_step  # noqa: PLC0415
    from dlrover_kfp.steps.score import CHUNK_ROWS  # noqa: PLC0415
    from dlrover_kfp.steps.spec import EvaluationMismatchError  # noqa: PLC0415

    try:
        result = evaluate_step(
            args.model,
            args.data,
            args.predictions,
            args.metrics,
            data_format=args.format,
            progress=throttled(PROGRESS_INTERVAL_S),
            chunk_rows=args.chunk_rows or CHUNK_ROWS,
        )
    except EvaluationMismatchError as exc:
        print(f"dlrover-kfp: evaluation failed: {exc}", file=sys.stderr, flush=True)
        return EXIT_FAILED_RUN
    emit_json(result.to_dict())
    return 0
