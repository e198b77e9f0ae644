"""The end of a run: assemble the trained model from the final checkpoint and evaluate it.

The final checkpoint is restored onto a single PS (the checkpoint re-partitions the rows), which
lays every table's rows out in id order; with the dense vector of PS 0 that is the whole
:class:`~dlrover_kfp.training.model.FullDLRM`. The model is saved as a ``state_dict``
(``model.pt``) beside ``model.json`` (its shape, step and metrics) and an ONNX graph of the
same model (``model.onnx``) that ``model.json`` describes for a scorer without this package,
all written atomically.

torch, the model and the metrics (scipy) are imported by the functions that use them: the master
imports this module at start but evaluates only at the end of a run, and every ``dlrover-kfp``
command imports the master's modules.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dlrover_kfp.core.documents import to_dict
from dlrover_kfp.core.profile import Metrics
from dlrover_kfp.core.spec import DataSpec, JobSpec, SyntheticData
from dlrover_kfp.files import readable_temp, write_atomic
from dlrover_kfp.training import checkpoint as ckpt
from dlrover_kfp.training.data import Dataset, RowRange
from dlrover_kfp.training.datasets import data_fingerprint, open_dataset

if TYPE_CHECKING:
    from dlrover_kfp.training.model import FullDLRM

#: Rows per evaluation batch.
EVAL_BATCH = 8192

#: How the held-out rows follow from ``held_out`` in model.json (training/data.py split_ranges).
HELD_OUT_RULE = (
    "per file of n rows (files sorted): the last floor(n * eval_fraction) rows, at least 1 when "
    "eval_fraction > 0 and n >= 2"
)


def held_out_record(dataset: Dataset, eval_fraction: float, data: DataSpec) -> dict[str, Any]:
    """``model.json``'s ``held_out``: which rows the run held out and of which files, so that
    a later step (``dlrover-kfp evaluate``) scores exactly those rows with the exported model
    and can tell when it is given other files. ``files`` (name and size) identify them when
    the same bytes are read from another place (a KFP artifact downloaded into each task's
    pod); ``fingerprint`` (:func:`~dlrover_kfp.training.datasets.data_fingerprint`) where
    they are read from the same place; ``format`` how they were read (``data.format``);
    ``synthetic`` the generator's rows and seed for generated rows (no files), which a later
    step generates again."""
    files = getattr(dataset, "files", None) or ()
    generated = (
        {"synthetic": {"rows": data.rows, "seed": data.seed}}
        if isinstance(data, SyntheticData)
        else {}
    )
    return {
        "format": data.format,
        **generated,
        "eval_fraction": eval_fraction,
        "rule": HELD_OUT_RULE,
        "source_rows": [int(n) for n in dataset.source_rows],
        "files": [{"name": f.url.rstrip("/").rsplit("/", 1)[-1], "size": f.size} for f in files],
        "fingerprint": data_fingerprint(dataset),
    }


def preload_in_background() -> None:
    """Import what the end of the run needs (torch, the model, the metrics: 1.5-2 s of CPU)
    in a daemon thread, while the pods start: it is then off the run's critical path, on a
    core the starting pods leave free, instead of adding to every run's end."""

    def load() -> None:
        import torch  # noqa: F401, PLC0415

        import dlrover_kfp.training.metrics  # noqa: PLC0415
        import dlrover_kfp.training.model  # noqa: F401, PLC0415

    threading.Thread(target=load, name="preload-export", daemon=True).start()


def assemble_model(spec: JobSpec, checkpoint_dir: Path) -> tuple[FullDLRM, int]:
    """The trained model from the newest good checkpoint, and its step."""
    import torch  # noqa: PLC0415

    from dlrover_kfp.training.model import FullDLRM, load_flat  # noqa: PLC0415

    restored = ckpt.load_checkpoint(checkpoint_dir, num_ps=1, ps_index=0)
    if restored is None:
        raise ckpt.CheckpointError(f"{checkpoint_dir}: no checkpoint to export a model from")
    if restored.dense is None:
        raise ckpt.CheckpointError(f"{restored.location}: no dense parameters")
    model = FullDLRM(spec.model, initialise=False)
    offsets = model.offsets
    with torch.no_grad():
        weights = torch.from_numpy(np.asarray(restored.weights))
        for t, table in enumerate(model.embedding_bags()):
            n = spec.model.table_sizes[t]
            table.weight.copy_(weights[offsets[t] : offsets[t] + n])
        load_flat(model.dense, torch.from_numpy(np.asarray(restored.dense)))
    return model, restored.step


def evaluate(model: FullDLRM, spec: JobSpec, base_dir: Path, ranges: Sequence[RowRange]) -> Metrics:
    """Log-loss and AUC of ``model`` on the held-out ``ranges``."""
    import torch  # noqa: PLC0415

    from dlrover_kfp.training.metrics import log_loss, roc_auc  # noqa: PLC0415

    if not ranges:
        return Metrics(eval_rows=0)
    dataset = open_dataset(spec.data, spec.model, base_dir)
    labels: list[np.ndarray] = []
    probs: list[np.ndarray] = []
    with torch.no_grad():
        for rows in ranges:
            for start in range(rows.start, rows.end, EVAL_BATCH):
                end = min(rows.end, start + EVAL_BATCH)
                batch = dataset.read(RowRange(rows.source, start, end))
                if not len(batch):
                    continue
                logits = model(torch.from_numpy(batch.dense), torch.from_numpy(batch.sparse))
                probs.append(torch.sigmoid(logits).numpy())
                labels.append(batch.labels)
    if not labels:
        return Metrics(eval_rows=0)
    y = np.concatenate(labels)
    p = np.concatenate(probs)
    auc = roc_auc(y, p)
    return Metrics(
        loss=round(log_loss(y, p), 6),
        auc=None if auc is None else round(auc, 6),
        eval_rows=len(y),
    )


def save_model(
    model: FullDLRM,
    spec: JobSpec,
    step: int,
    metrics: Metrics,
    out: Path,
    held_out: Mapping[str, Any] | None = None,
) -> None:
    """``model.pt`` (the state dict), ``model.onnx`` (the same model for onnxruntime, see
    :mod:`~dlrover_kfp.training.onnx_model`) and, last, ``model.json``, which names both: a
    reader that finds ``model.json`` finds the files it describes. ``held_out``
    (:func:`held_out_record`): the rows ``metrics`` were measured on."""
    import torch  # noqa: PLC0415

    from dlrover_kfp.training import onnx_model  # noqa: PLC0415

    out.mkdir(parents=True, exist_ok=True)
    tmp = readable_temp(out, "model.pt")
    try:
        torch.save(model.state_dict(), tmp)
        os.replace(tmp, out / "model.pt")
    finally:
        tmp.unlink(missing_ok=True)
    onnx_files = onnx_model.save_onnx(onnx_model.dlrm_weights(model), out)
    description = {
        "format": "dlrover-kfp-dlrm/1",
        "model": to_dict(spec.model),
        "step": step,
        "metrics": to_dict(metrics),
        **({"held_out": dict(held_out)} if held_out is not None else {}),
        "state_dict": "model.pt (torch.load; keys dense.* and tables.N.weight)",
        "onnx": onnx_model.describe(spec, onnx_files),
    }
    write_atomic(out / "model.json", json.dumps(description, indent=2) + "\n")


def evaluate_and_export(
    spec: JobSpec,
    checkpoint_dir: Path,
    model_dir: Path,
    base_dir: Path,
    eval_ranges: Sequence[RowRange],
    held_out: Mapping[str, Any] | None = None,
) -> tuple[Path, Metrics]:
    model, step = assemble_model(spec, checkpoint_dir)
    metrics = evaluate(model, spec, base_dir, eval_ranges)
    save_model(model, spec, step, metrics, model_dir, held_out)
    return model_dir, metrics
