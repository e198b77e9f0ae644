"""The publish step: copy a trained model to where another system serves it, only when it is
not worse than the model served now (the rule: :mod:`dlrover_kfp.core.gate`).

A published location is a directory (a local path, a mounted volume, or a ``file://`` URL)::

    published/
      CURRENT                 the name of the served version, one line
      versions/<name>/        model.json, model.pt, model.onnx: what the model directory held
      .lock                   held while a publisher decides and copies

A reader reads ``CURRENT`` and then ``versions/<name>/``. A version is copied into a
temporary directory beside the others and renamed into place whole, and ``CURRENT`` is
replaced by a rename after that: a reader sees the old model or the new one, never half a copy,
and a publisher killed mid-copy leaves ``CURRENT`` as it was. Two publishers of one location
take turns (an ``flock`` on ``.lock``), so the second compares with the first's model. A
version's name is a digest of its files: publishing the same model again (a retried task) adds
nothing. Earlier versions stay: rolling back is writing an older name into ``CURRENT``.

The AUC judged is the evaluate step's when its document is given (``evaluation``: the
held-out rows scored by the exported ``model.onnx``, which it checked against the train
step's; :mod:`dlrover_kfp.steps.evaluate`), else the train step's own (``model.json``'s
``metrics``, measured with torch in the master). A model published with its evaluation keeps
it as ``versions/<name>/evaluation.json``, and is compared by that AUC later (like with like:
the two differ by up to the evaluate step's 1e-4); one published without, by its
``model.json``'s.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import unquote, urlsplit

from dlrover_kfp.core.gate import DEFAULT_MAX_AUC_DROP, check_max_auc_drop, judge
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.files import read_text, write_atomic

#: The file that names the served version, and the directory of the versions.
CURRENT: Final = "CURRENT"
VERSIONS: Final = "versions"
LOCK: Final = ".lock"
#: The model directory's description (written by the train step): its metrics are the gate's.
MODEL_JSON: Final = "model.json"
#: The evaluate step's document, kept in a version published with it.
EVALUATION_JSON: Final = "evaluation.json"


@dataclass(frozen=True, slots=True)
class ModelMetrics:
    """A trained model's held-out metrics, as the train step measured them."""

    auc: float | None
    loss: float | None
    eval_rows: int


@dataclass(frozen=True, slots=True)
class PublishDecision:
    """What the publish step did, and why (``reason``: one line for the task's log)."""

    published: bool
    reason: str
    auc: float | None
    #: the served model's AUC before this step (None: nothing served, or no AUC)
    last_auc: float | None
    #: the served version after this step (the new one when published)
    version: str | None
    location: str
    #: who measured ``auc``: "evaluate" (model.onnx, the evaluate step) or "train" (model.json)
    measured_by: str = "train"


def read_model_metrics(model_dir: str | os.PathLike[str]) -> ModelMetrics:
    """The held-out metrics in ``model_dir``'s ``model.json``. A missing or malformed file is
    a :class:`~dlrover_kfp.errors.UserInputError` that names it."""
    path = Path(model_dir) / MODEL_JSON
    text = read_text(path)
    try:
        document = json.loads(text)
    except ValueError:
        raise UserInputError(f"{path}: not a JSON document") from None
    metrics = document.get("metrics") if isinstance(document, dict) else None
    if not isinstance(metrics, dict):
        raise UserInputError(f"{path}: no metrics object; is this a trained model's directory?")
    return ModelMetrics(
        auc=_number(metrics.get("auc"), path, "metrics.auc"),
        loss=_number(metrics.get("loss"), path, "metrics.loss"),
        eval_rows=int(_number(metrics.get("eval_rows"), path, "metrics.eval_rows") or 0),
    )


def read_evaluation(path: str | os.PathLike[str], model: Path | str) -> float | None:
    """The held-out AUC of the evaluate step's document at ``path``, refused unless it is the
    evaluation of ``model``: a model directory (its digest, :func:`version_name`), or the
    digest itself (a published version's name)."""
    where = Path(path)
    try:
        document = json.loads(read_text(where))
    except ValueError:
        raise UserInputError(f"{where}: not a JSON document") from None
    if not isinstance(document, dict) or "model" not in document:
        raise UserInputError(f"{where}: not an evaluate step's metrics (no 'model' digest)")
    digest = model if isinstance(model, str) else version_name(model)
    if document["model"] != digest:
        raise UserInputError(
            f"{where}: the evaluation of model {document['model']!r}, not of the model in "
            f"{model} ({digest!r}); evaluate this model"
        )
    return _number(document.get("auc"), where, "auc")


def served_auc(served: Path) -> float | None:
    """The AUC a published version is judged by: its evaluation's when published with one."""
    if (served / EVALUATION_JSON).is_file():
        return read_evaluation(served / EVALUATION_JSON, served.name)
    return read_model_metrics(served).auc


def _number(value: object, path: Path, key: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UserInputError(f"{path}: {key}: {value!r}; expected a number or null")
    return float(value)


def local_location(published: str | os.PathLike[str], source: str = "published") -> Path:
    """The directory a published location names: a path, or a ``file://`` URL. Object storage
    is not a publish location yet (its copy-then-point needs the storage layer's writes)."""
    text = os.fspath(published).strip()
    if not text:
        raise UserInputError(f"{source}: empty; give the directory models are published to")
    if "://" not in text:
        return Path(text).expanduser()
    parts = urlsplit(text)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
        raise UserInputError(
            f"{source}: {text!r}; publish to a directory (a path, a mounted volume or a file:// "
            "URL); object storage is not supported as a publish location"
        )
    return Path(unquote(parts.path))


def current_version(published: str | os.PathLike[str]) -> Path | None:
    """The directory of the served model, or None before the first publish. What a reader of
    a published location does: ``CURRENT``, then that version."""
    root = local_location(published)
    pointer = root / CURRENT
    if not pointer.exists():
        return None
    name = read_text(pointer).strip()
    version = root / VERSIONS / name
    if not name or "/" in name or not version.is_dir():
        raise UserInputError(f"{pointer}: names {name!r}, which is not a version in {root}")
    return version


def publish_step(
    model_dir: str | os.PathLike[str],
    published: str | os.PathLike[str],
    *,
    max_auc_drop: float = DEFAULT_MAX_AUC_DROP,
    evaluation: str | os.PathLike[str] | None = None,
) -> PublishDecision:
    """Publish the model in ``model_dir`` to ``published`` when its held-out AUC (the
    ``evaluation`` document's when given, see the module docstring) is at least the served
    model's less ``max_auc_drop`` (:func:`~dlrover_kfp.core.gate.judge`); else leave the
    served model. Returns the decision either way: a refusal is an outcome, not an error. Bad
    input (no model.json, a location that is not a directory, the evaluation of another model)
    raises :class:`~dlrover_kfp.errors.UserInputError`."""
    try:
        check_max_auc_drop(max_auc_drop)
    except ValueError as exc:
        raise UserInputError(str(exc)) from None
    source = Path(model_dir)
    auc = read_model_metrics(source).auc
    if evaluation is not None:
        auc = read_evaluation(evaluation, source)
    root = local_location(published)
    with _locked(root):
        served = current_version(root)
        last_auc = served_auc(served) if served is not None else None
        verdict = judge(auc, last_auc, max_auc_drop)
        version = served.name if served is not None else None
        if verdict.publish:
            version = _install(source, root, Path(evaluation) if evaluation else None)
            write_atomic(root / CURRENT, version + "\n")
    return PublishDecision(
        published=verdict.publish,
        reason=verdict.reason,
        auc=auc,
        last_auc=last_auc,
        version=version,
        location=str(root),
        measured_by="train" if evaluation is None else "evaluate",
    )


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    try:
        (root / VERSIONS).mkdir(parents=True, exist_ok=True)
        fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise UserInputError(f"{root}: cannot publish there: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _files(model_dir: Path) -> list[Path]:
    if not model_dir.is_dir():
        raise UserInputError(f"{model_dir}: not a directory; give the trained model's directory")
    return sorted(p for p in model_dir.rglob("*") if p.is_file())


def version_name(model_dir: Path) -> str:
    """A digest of the model's files (their paths and bytes): the same model, the same name."""
    digest = hashlib.sha256()
    for path in _files(model_dir):
        digest.update(path.relative_to(model_dir).as_posix().encode() + b"\0")
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _install(model_dir: Path, root: Path, evaluation: Path | None) -> str:
    """Copy ``model_dir`` (and its ``evaluation``, as evaluation.json) to ``versions/<name>``
    whole: into a temporary directory beside it, each file flushed to disk, then one rename. A
    version already there is complete (only a rename makes one), so a repeated publish copies
    nothing."""
    name = version_name(model_dir)
    target = root / VERSIONS / name
    if target.is_dir():
        return name
    incoming = Path(tempfile.mkdtemp(prefix=".incoming-", dir=root / VERSIONS))
    try:
        shutil.copytree(model_dir, incoming, dirs_exist_ok=True)
        if evaluation is not None:
            shutil.copyfile(evaluation, incoming / EVALUATION_JSON)
        for path in _files(incoming):
            with path.open("rb") as f:
                os.fsync(f.fileno())
        incoming.chmod(0o755)
        incoming.replace(target)
    except OSError as exc:
        why = exc.strerror or exc
        raise UserInputError(f"{target}: cannot copy the model there: {why}") from None
    finally:
        shutil.rmtree(incoming, ignore_errors=True)
    return name


__all__ = [
    "CURRENT",
    "DEFAULT_MAX_AUC_DROP",
    "EVALUATION_JSON",
    "MODEL_JSON",
    "VERSIONS",
    "ModelMetrics",
    "PublishDecision",
    "current_version",
    "local_location",
    "publish_step",
    "read_evaluation",
    "read_model_metrics",
    "served_auc",
    "version_name",
]
