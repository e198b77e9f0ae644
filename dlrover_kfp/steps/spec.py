"""What every step reads first: the job spec (a path or the document), the history URL and
the backend's planner settings."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from dlrover_kfp.core.documents import load_text, parse
from dlrover_kfp.core.planner import PlannerSettings
from dlrover_kfp.core.spec import JobSpec, SyntheticData
from dlrover_kfp.errors import PermanentError, UserInputError
from dlrover_kfp.files import read_document
from dlrover_kfp.history import ENV_VAR, mask_url_text, resolve_history_url
from dlrover_kfp.history.engine import parse_url
from dlrover_kfp.planning import local_planner_settings

BACKENDS: Final = ("local", "kubernetes")


class TrainingFailedError(PermanentError):
    """The run ended failed (its pods failed beyond the relaunch budget, or a PS was lost
    without a checkpoint); its profile is in the history and in the output directory. Here,
    not in the train step's module, so that callers can catch it without importing torch."""


class EvaluationMismatchError(PermanentError):
    """The exported model does not reproduce the train step's evaluation
    (:mod:`~dlrover_kfp.steps.evaluate`): it must not be published. A failed step (exit 1),
    not bad input: retrying gives the same answer. Here for the reason above (numpy, pyarrow)."""


@dataclass(frozen=True, slots=True)
class LoadedSpec:
    spec: JobSpec
    #: what relative data paths in the spec are relative to
    base_dir: Path
    #: the file, or "job_spec" for an inline document: error messages name it
    source: str


def load_job_spec(job_spec: str, *, source: str = "job_spec") -> LoadedSpec:
    """A job spec from a path or from the document itself.

    A string of one line that does not start with ``{`` is a path (relative to the working
    directory); anything else is the YAML (or JSON) document. Relative data paths in a file
    are relative to the file, in an inline document to the working directory.
    """
    text = job_spec.strip()
    if not text:
        raise UserInputError(f"{source}: empty; give a path to a job spec or the YAML itself")
    if "\n" not in text and not text.startswith("{"):
        return load_spec_file(Path(text).expanduser())
    spec = parse(JobSpec, load_text(job_spec, source), source)
    return LoadedSpec(spec, Path.cwd(), source)


def load_spec_file(path: Path) -> LoadedSpec:
    """A job spec file, its relative data paths relative to the file's directory.

    The one rule for ``dlrover-kfp run --job`` and the steps: a spec and its data travel
    together (a checkout, a pipeline's volume), while the directory a shell, a scheduler or a
    pod starts in does not, so the working directory must not change what a spec names.
    """
    spec = read_document(JobSpec, path)
    return LoadedSpec(spec, path.resolve().parent, str(path))


def with_data_path(loaded: LoadedSpec, path: str, source: str = "data") -> LoadedSpec:
    """The job spec reading its data from ``path`` (a pipeline's data artifact, a templated
    location such as ``s3://clicks/{{ ds }}/``) instead of its own ``data.path``; an empty
    ``path`` changes nothing.

    The spec's ``data.rows`` described the data at its own path, so it is dropped: the rows
    are counted from the new files (their metadata). A relative local path is relative to the
    working directory of the task that gives it. Synthetic data has no path to replace, so
    a location given for it is refused rather than silently not read.
    """
    text = path.strip()
    if not text:
        return loaded
    spec = loaded.spec
    if isinstance(spec.data, SyntheticData):
        raise UserInputError(
            f"{source}: {text!r} given, but the job spec's data is synthetic (data.format "
            "synthetic reads no files); use data.format parquet, csv, tsv or criteo"
        )
    if "://" not in text:
        text = os.path.abspath(os.path.expanduser(text))  # the task's, not the spec file's
    data = dataclasses.replace(spec.data, path=text, rows=None)
    return dataclasses.replace(loaded, spec=dataclasses.replace(spec, data=data))


def history_url_or_default(url: str | None, environ: Mapping[str, str] = os.environ) -> str:
    """``url``, else ``$DLROVER_KFP_HISTORY_URL``, else the default SQLite file. An empty
    string counts as not given: that is how a pipeline parameter says "the default"."""
    given = url.strip() if url else ""
    return resolve_history_url(given or None, environ)


def refuse_password_parameter(url: str, source: str = "history_url") -> None:
    """Refuse a history URL with a password given as a pipeline parameter.

    An orchestrator prints a task's parameters in its log and keeps them in the run's record
    (KFP's executor logs its whole input; the UI shows it), so a password there is already
    out; refusing makes the mistake fail on day 1 instead of leaking every day. The password
    belongs in a Secret, read as ``$DLROVER_KFP_HISTORY_URL``. The message names the URL
    without its password."""
    text = url.strip()
    if "://" not in text:
        return  # a file path, or empty: nothing secret in it
    try:
        parsed = parse_url(text)
    except UserInputError:
        carries = mask_url_text(text) != text  # what cannot be parsed is masked by pattern
    else:
        carries = bool(parsed.password) or any(k.lower() == "password" for k in parsed.query)
    if carries:
        shown = mask_url_text(text)
        raise UserInputError(
            f"{source}: {shown!r} has a password, and a parameter is printed in the task's log "
            f"and kept in the run's record; put the URL in a Kubernetes Secret read as "
            f"${ENV_VAR} (docs/kfp.md) and leave {source} empty"
        )


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise UserInputError(f"backend: {backend!r}; expected one of {', '.join(BACKENDS)}")


def planner_for(backend: str) -> PlannerSettings:
    """The planner's settings for ``backend``: quarter cores and decisions every few seconds
    for local processes, a cluster's half cores and 5-minute decisions on Kubernetes."""
    check_backend(backend)
    return local_planner_settings() if backend == "local" else PlannerSettings()


__all__ = [
    "BACKENDS",
    "LoadedSpec",
    "TrainingFailedError",
    "check_backend",
    "history_url_or_default",
    "load_job_spec",
    "load_spec_file",
    "planner_for",
    "refuse_password_parameter",
    "with_data_path",
]
