"""What the KFP components do, on plain file paths: testable without KFP.

A component's body (components/elastic_dlrm.py) only imports one of these functions and hands
it its parameters and its artifacts' paths; everything else is the library
(:mod:`dlrover_kfp.steps`). A user error (a bad job spec, a plan that is not a plan) prints one
line naming the key and the value on the task's log and exits 2, with nothing written to the
history store; a temporary failure (a locked or unreachable history) exits 75.
"""

from __future__ import annotations

import dataclasses
import html
import json
import shutil
import sys
import tempfile
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dlrover_kfp.errors import (
    EXIT_FAILED_RUN,
    EXIT_TRANSIENT,
    EXIT_USER_ERROR,
    PermanentError,
    TransientError,
    UserInputError,
)
from dlrover_kfp.files import write_atomic
from dlrover_kfp.steps.documents import JobProfile, standalone_spec_yaml, to_json
from dlrover_kfp.steps.plan import plan_step
from dlrover_kfp.steps.publish import PublishDecision, publish_step
from dlrover_kfp.steps.record import read_profile, record_step
from dlrover_kfp.steps.spec import (
    EvaluationMismatchError,
    TrainingFailedError,
    load_job_spec,
    refuse_password_parameter,
    with_data_path,
)

if TYPE_CHECKING:
    from dlrover_kfp.steps.evaluate import Evaluation
    from dlrover_kfp.steps.score import ScoreResult
    from dlrover_kfp.steps.train import KubeOptions, OrchestratedRun


@contextmanager
def _task_errors() -> Iterator[None]:
    """An error of ours is one line on the task's log and the CLI's exit status (1 a failed
    run, 2 bad input, 75 temporary), not a traceback."""
    try:
        yield
    except TrainingFailedError as exc:
        print(f"dlrover-kfp: training failed: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_FAILED_RUN) from None
    except EvaluationMismatchError as exc:
        print(f"dlrover-kfp: evaluation failed: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_FAILED_RUN) from None
    except PermanentError as exc:
        print(f"dlrover-kfp: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_USER_ERROR) from None
    except TransientError as exc:
        print(f"dlrover-kfp: temporary failure, retry: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_TRANSIENT) from None


@dataclass(frozen=True, slots=True)
class KfpRun:
    """What names a task's run to KFP: the pipeline run's id and the task's name (what the
    pipeline passes as dsl.PIPELINE_JOB_ID_PLACEHOLDER and PIPELINE_TASK_NAME_PLACEHOLDER)."""

    run_id: str
    task_name: str

    def keys(self) -> tuple[str, ...]:
        check_kfp_value(self.run_id, "kfp_run_id", "PIPELINE_JOB_ID_PLACEHOLDER")
        check_kfp_value(self.task_name, "kfp_task_name", "PIPELINE_TASK_NAME_PLACEHOLDER")
        return (self.run_id, self.task_name)


def check_kfp_value(value: str, source: str, placeholder: str) -> None:
    """A KFP placeholder that arrived resolved: not empty, and not the placeholder's own text
    (which is what a component gets when the placeholder was an input's default: KFP resolves
    one only where a task passes it)."""
    if not value.strip() or "{{$" in value:
        raise UserInputError(
            f"{source}: {value!r}; pass dsl.{placeholder} as the task's {source} argument "
            "(KFP resolves it only there)"
        )


def _check_parameters(history_url: str, kfp_run_id: str) -> None:
    """What every component checks first: its run-unique input, and a history URL parameter
    without a password (:func:`~dlrover_kfp.steps.spec.refuse_password_parameter`)."""
    refuse_password_parameter(history_url)
    check_kfp_value(kfp_run_id, "kfp_run_id", "PIPELINE_JOB_ID_PLACEHOLDER")


# ---- plan_resources --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlanOutput:
    stage: str
    total_cpu: float
    similar_jobs: tuple[str, ...]


def plan_resources(
    job_spec: str,
    history_url: str,
    backend: str,
    kfp_run_id: str,
    plan_path: str,
    report_path: str,
    *,
    data_path: str = "",
) -> PlanOutput:
    """Stage 1's plan as a JSON document at ``plan_path``, Markdown at ``report_path``;
    ``data_path`` as for :func:`elastic_train`."""
    with _task_errors():
        _check_parameters(history_url, kfp_run_id)
        result = plan_step(job_spec, history_url, backend, data_path=data_path)
        write_atomic(plan_path, to_json(result.plan) + "\n")
        write_atomic(report_path, result.markdown)
    print(f"{result.spec.name}: {result.plan.stage.value} plan: {result.plan.reason}")
    return PlanOutput(
        result.plan.stage.value, result.plan.total_cpu, tuple(result.plan.similar_jobs)
    )


# ---- elastic_train ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TrainOutput:
    run_id: str
    loss: float | None
    auc: float | None
    jct_seconds: float
    samples_processed: int


def elastic_train(
    job_spec: str,
    plan_path: str,
    history_url: str,
    backend: str,
    claim: str,
    kfp: KfpRun,
    model_path: str,
    profile_path: str,
    report_path: str,
    *,
    data_path: str = "",
) -> TrainOutput:
    """Train from the plan at ``plan_path``; the model directory to ``model_path``, the
    profile JSON to ``profile_path``, the HTML report to ``report_path``. ``data_path``
    (:func:`data_location` of a Dataset input), when given, replaces the spec's data path.

    The run's id derives from the KFP run and task (:func:`~dlrover_kfp.steps.train.
    orchestrated_run`): a retry, or the record step, lands on the same run of the history.
    Locally the run's working directory (checkpoints, pod logs) is a temporary one. On
    Kubernetes this process is the job master: the worker and PS pods it starts mount the claim
    ``claim`` at the default mount path, and the run lives there, in a directory named by the
    KFP run and task, so that a retry of the task resumes from its last checkpoint.
    """

    # The trainer (torch) is imported by this step only: plan and record start fast.
    from dlrover_kfp.steps.train import RunOptions, read_plan, train_step  # noqa: PLC0415

    with _task_errors():
        refuse_password_parameter(history_url)
        keys = kfp.keys()  # resolved placeholders, or exit 2
        loaded = load_job_spec(job_spec)  # validate before anything runs
        if data_path:
            loaded = with_data_path(loaded, data_path)
            job_spec = standalone_spec_yaml(loaded)
            print(f"{loaded.spec.name}: data from the Dataset input {data_path}", flush=True)
        plan = read_plan(plan_path)
        with _run_dir(loaded.spec.name, keys, backend, claim) as (run, kube):
            result = train_step(
                job_spec,
                lambda base_dir: RunOptions(
                    output_dir=run.output_dir,
                    base_dir=base_dir,
                    history_url=history_url,
                    plan=plan,
                    run_id=run.run_id,
                    resume=True,
                ),
                backend=backend,
                kube=kube,
                progress=_log,
            )
            return _publish(result.profile, result.model_dir, model_path, profile_path, report_path)


#: Artifact URI schemes the pods of a Kubernetes run read themselves (KFP's own MinIO is S3).
_POD_SCHEMES = {"s3": "s3", "gs": "gs", "minio": "s3"}


def data_location(path: str, uri: str, backend: str) -> str:
    """Where the job reads a Dataset input. The local backend's processes share this pod's
    disk: the artifact's local copy (``path``, a file or a directory). A Kubernetes run's
    worker pods do not: they read the artifact where KFP stored it (``uri``), through the
    object-storage layer, with credentials from their environment; KFP's default store,
    ``minio://bucket/key``, is an S3 API, read as ``s3://bucket/key``."""
    if backend != "kubernetes":
        return path
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme not in _POD_SCHEMES:
        raise UserInputError(
            f"data: the Dataset's URI {uri!r} is not object storage the job's pods can read "
            f"({', '.join(s + '://' for s in _POD_SCHEMES)}); set the pipeline root to one"
        )
    return f"{_POD_SCHEMES[scheme]}://{rest}"


@contextmanager
def _run_dir(
    name: str, keys: tuple[str, ...], backend: str, claim: str
) -> Iterator[tuple[OrchestratedRun, KubeOptions | None]]:
    """Where the run lives: a temporary directory for local pods (this pod's: a retry is
    another pod); on Kubernetes ``runs/<job>-<digest of the KFP run and task>`` on the claim
    every pod mounts (kept: the run's checkpoints and pod logs, which a retry resumes from)."""
    from dlrover_kfp.steps.train import orchestrated_run  # noqa: PLC0415

    if backend != "kubernetes":
        with tempfile.TemporaryDirectory(prefix=f"dlrover-kfp-{name}-") as tmp:
            yield orchestrated_run(Path(tmp), name, keys), None
        return
    if not claim:
        raise UserInputError(
            "claim: empty; backend kubernetes needs a PersistentVolumeClaim (ReadWriteMany) "
            "that the job's pods share: the PS write their checkpoints there"
        )
    from dlrover_kfp.steps.train import in_cluster_options  # noqa: PLC0415

    kube = in_cluster_options(claim=claim)
    yield orchestrated_run(Path(kube.mount_path) / "runs", name, keys), kube


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _report_page(profile: JobProfile) -> str:
    """The run's HTML report. The report is an extra: a run that trained must reach the record
    step even when its report cannot be drawn, so a drawing error is logged with its traceback
    and the artifact says what went wrong (the Airflow operator does the same)."""
    from dlrover_kfp.steps.report import run_report_html  # noqa: PLC0415  (matplotlib: slow)

    try:
        return run_report_html(profile)
    except Exception as exc:  # deliberately broad, and logged: see the docstring
        traceback.print_exc()
        return (
            "<!doctype html><title>run report</title><p>The report of run "
            f"{html.escape(profile.run_id)} could not be drawn: {html.escape(repr(exc))}</p>\n"
        )


def _publish(
    profile: JobProfile,
    model_dir: Path | None,
    model_path: str,
    profile_path: str,
    report_path: str,
) -> TrainOutput:
    if model_dir is not None:
        target = Path(model_path)
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(model_dir, target)
    write_atomic(profile_path, to_json(profile) + "\n")
    write_atomic(report_path, _report_page(profile))
    return TrainOutput(
        run_id=profile.run_id,
        loss=profile.metrics.loss,
        auc=profile.metrics.auc,
        jct_seconds=profile.outcome.jct_seconds,
        samples_processed=profile.outcome.samples_processed,
    )


# ---- prepare_example_data, publish_model ----------------------------------------------------


def prepare_example_data(job_spec: str, data_path: str, rows: int, seed: int) -> list[str]:
    """Example rows for the job's model as Parquet files in the directory ``data_path``."""
    from dlrover_kfp.steps.example_data import write_example_parquet  # noqa: PLC0415 (pyarrow)

    with _task_errors():
        written = write_example_parquet(job_spec, data_path, rows=rows, seed=seed)
    print(f"wrote {rows} example rows into {len(written)} Parquet files in {data_path}")
    return [Path(p).name for p in written]


def publish_model(
    model_path: str,
    published: str,
    max_auc_drop: float,
    decision_path: str,
    evaluation_path: str = "",
) -> PublishDecision:
    """The publish gate on the model directory ``model_path`` (judging the AUC of the evaluate
    step's document ``evaluation_path`` when given); the decision as JSON to
    ``decision_path``. A refusal is logged, and the task succeeds."""
    with _task_errors():
        decision = publish_step(
            model_path,
            published,
            max_auc_drop=max_auc_drop,
            evaluation=evaluation_path or None,
        )
        write_atomic(decision_path, json.dumps(dataclasses.asdict(decision), indent=2) + "\n")
    print(f"publish gate: {decision.reason}", flush=True)
    return decision


# ---- score_model, evaluate_model ------------------------------------------------------------


def score_model(
    model_path: str, data_path: str, predictions_path: str, data_format: str
) -> ScoreResult:
    """Every row of ``data_path`` scored by the model directory ``model_path`` into the
    Parquet file ``predictions_path`` (onnxruntime: steps/score.py)."""
    from dlrover_kfp.steps.score import score_step  # noqa: PLC0415 (pyarrow, onnxruntime)

    with _task_errors():
        result = score_step(
            model_path, data_path, predictions_path, data_format=data_format or None
        )
    print(json.dumps(result.to_dict()), flush=True)
    return result


def evaluate_model(
    model_path: str, data_path: str, predictions_path: str, evaluation_path: str
) -> Evaluation:
    """The held-out rows of ``data_path`` scored by ``model_path``'s model.onnx; exit 1 when
    they do not reproduce the train step's AUC (steps/evaluate.py), so nothing downstream
    publishes it."""
    from dlrover_kfp.steps.evaluate import evaluate_step  # noqa: PLC0415 (as above)

    with _task_errors():
        result = evaluate_step(model_path, data_path, predictions_path, evaluation_path)
    print(json.dumps(result.to_dict()), flush=True)
    return result


# ---- record_profile --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordOutput:
    run_id: str
    new: bool


def record_profile(
    profile_path: str, history_url: str, kfp_run_id: str, summary_path: str
) -> RecordOutput:
    """Record the profile at ``profile_path``; a Markdown summary to ``summary_path``."""
    with _task_errors():
        _check_parameters(history_url, kfp_run_id)
        result = record_step(read_profile(profile_path), history_url)
        write_atomic(summary_path, result.markdown)
    print(json.dumps({"run_id": result.run_id, "recorded": result.new}))
    return RecordOutput(result.run_id, result.new)


__all__ = ["KfpRun", "PlanOutput", "RecordOutput", "TrainOutput", "check_kfp_value",
           "data_location", "elastic_train", "evaluate_model", "plan_resources",
           "prepare_example_data", "publish_model", "record_profile", "score_model"]  # fmt: skip
