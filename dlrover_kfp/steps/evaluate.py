"""The evaluate step: the exported model, run by onnxruntime, must reproduce the train step's
own evaluation before anything may publish it.

The train step measures the held-out AUC with torch, in the master, on the model it assembled
from the last checkpoint; what is served is another artefact, ``model.onnx``, built by hand
from the same weights, and fed by a scorer that re-implements the preprocessing. A fault in
either (a graph wired wrongly, a table exported out of order, the ``model.onnx`` of another run
copied beside this run's ``model.json``) leaves the train step's AUC as good as ever. So this
step scores the held-out rows again, with what will be served
(:func:`~dlrover_kfp.steps.score.score_step` with ``held_out=True``: onnxruntime, no torch),
and fails when the two AUCs differ by more than :data:`AUC_TOLERANCE`, or when the rows it
scored are not as many as the train step evaluated. The publish gate then judges the AUC
measured here (:func:`~dlrover_kfp.steps.publish.publish_step` with ``evaluation``); the
document records the digest of the model directory it evaluated, so the gate cannot be handed
the evaluation of another model.

torch's and onnxruntime's probabilities differ by ~1e-7 (float32 sums in another order), which
can swap a near-tie in the AUC's ranking: 1e-4 is far above that and far below what any real
fault moves (a little-endian hash in a scorer moved it by 0.0065, docs/serving.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from dlrover_kfp.files import write_atomic
from dlrover_kfp.steps.publish import read_model_metrics, version_name
from dlrover_kfp.steps.score import CHUNK_ROWS, score_step
from dlrover_kfp.steps.spec import EvaluationMismatchError

#: How far the exported model's held-out AUC may be from the train step's.
AUC_TOLERANCE: Final = 1e-4


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The evaluate step's metrics document (``metrics.json``; the publish gate reads it)."""

    #: the held-out AUC and log-loss of model.onnx under onnxruntime
    auc: float | None
    loss: float | None
    #: the held-out rows scored (bad rows skipped, as in training)
    rows: int
    bad_rows: int
    #: what the train step measured (model.json's metrics)
    train_auc: float | None
    train_loss: float | None
    auc_difference: float | None
    tolerance: float
    #: the digest of the model directory evaluated (publish.version_name)
    model: str
    predictions: str
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"seconds": round(self.seconds, 3)}


def evaluate_step(
    model_dir: str | os.PathLike[str],
    data: str,
    predictions: str,
    metrics_path: str | os.PathLike[str],
    *,
    data_format: str | None = None,
    base_dir: str | os.PathLike[str] = ".",
    tolerance: float = AUC_TOLERANCE,
    progress: Callable[[str], None] | None = None,
    chunk_rows: int = CHUNK_ROWS,
) -> Evaluation:
    """Score the held-out rows of ``data`` (the files the model was trained on) with the
    model's ``model.onnx``, write the predictions to ``predictions`` (Parquet) and the metrics
    to ``metrics_path`` (JSON); raise :class:`EvaluationMismatchError` (nothing written to
    ``metrics_path``) when they do not reproduce the train step's."""
    trained = read_model_metrics(model_dir)
    digest = version_name(Path(model_dir))
    scored = score_step(
        model_dir,
        data,
        predictions,
        data_format=data_format,
        base_dir=base_dir,
        progress=progress,
        chunk_rows=chunk_rows,
        held_out=True,
    )
    difference = (
        None
        if scored.auc is None or trained.auc is None
        else round(abs(scored.auc - trained.auc), 6)
    )
    evaluation = Evaluation(
        auc=scored.auc,
        loss=scored.loss,
        rows=scored.rows,
        bad_rows=scored.bad_rows,
        train_auc=trained.auc,
        train_loss=trained.loss,
        auc_difference=difference,
        tolerance=tolerance,
        model=digest,
        predictions=scored.output,
        seconds=scored.seconds,
    )
    _check(evaluation, trained.eval_rows, Path(model_dir))
    write_atomic(metrics_path, json.dumps(evaluation.to_dict(), indent=2) + "\n")
    return evaluation


def _check(evaluation: Evaluation, train_rows: int, model_dir: Path) -> None:
    """Refuse an export that does not reproduce the train step's evaluation."""
    where = f"{model_dir}: model.onnx"
    if evaluation.rows != train_rows:
        raise EvaluationMismatchError(
            f"{where} scored {evaluation.rows} held-out rows, the train step evaluated "
            f"{train_rows}: not the rows it held out; not publishable"
        )
    if evaluation.auc is None or evaluation.train_auc is None:
        raise EvaluationMismatchError(
            f"{where}: no held-out AUC to compare (held-out rows of one class, or none; train "
            f"step's AUC {evaluation.train_auc}): not publishable"
        )
    if evaluation.auc_difference is None or evaluation.auc_difference > evaluation.tolerance:
        raise EvaluationMismatchError(
            f"{where} gives held-out AUC {evaluation.auc:.6f}, the train step measured "
            f"{evaluation.train_auc:.6f} (difference {evaluation.auc_difference}, more than "
            f"{evaluation.tolerance:g}): the exported model is not the trained one; not publishable"
        )


__all__ = ["AUC_TOLERANCE", "Evaluation", "EvaluationMismatchError", "evaluate_step"]
