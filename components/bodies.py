"""The bodies of the KFP components: what KFP ships, as source, into the compiled YAML.

KFP copies a Python component's function (only the function) into the YAML and runs it in the
image, so each body is self-contained: it imports one function of :mod:`components.glue` and
hands it its parameters and its artifacts' paths. They are plain functions here, made
components by :func:`components.elastic_dlrm.build` for a given image, so that one setting (the
image) decides both the components' ``base_image`` and the job's worker and PS pods.

Plan, train and record take ``kfp_run_id``, which a pipeline sets to
``dsl.PIPELINE_JOB_ID_PLACEHOLDER``.
KFP caches a task on its inputs, and a pipeline composed from these components caches by
default: on day 2 the plan's inputs (the same job spec and history URL) would hit day 1's
cache, and the train and record tasks, fed the cached plan, would hit theirs: nothing would
train. A run-unique input is a cache key no run shares, whatever the pipeline's caching
options. It is required, not defaulted to the placeholder, because KFP resolves a placeholder
only where a task passes it, never in an input's default (the default would reach the
component as the literal text, the same every day). It also names the KFP run for the train
step's run id and run directory. ``publish_model`` and ``prepare_example_data`` take none:
a pipeline turns caching off on its publish task (examples/kfp/pipeline.py does), and
``prepare_example_data`` makes the same rows from the same inputs, so a cache hit is right.

``history_url`` is for a URL without a password: KFP prints every parameter in the task's log
and keeps it in the run's record, so a URL with a password is refused (exit 2) and must come
from a Kubernetes Secret as ``$DLROVER_KFP_HISTORY_URL`` (docs/kfp.md).
"""

# No `from __future__ import annotations`: KFP reads the parameters' annotations as types.
from kfp import dsl


def plan_resources(
    job_spec: str,
    kfp_run_id: str,
    plan: dsl.Output[dsl.Artifact],
    report: dsl.Output[dsl.Markdown],
    history_url: str = "",
    backend: str = "kubernetes",
    data: dsl.Input[dsl.Dataset] = None,
) -> None:
    """Plan a job's workers and PS before it starts: warm start from the similar jobs in the
    history store, else a cold start. ``job_spec``: a path in the image, or the YAML itself.
    ``data`` (optional): the Dataset the job will train on, as for elastic_train (the plan
    reads its size: a Parquet file's footer states its rows).
    ``kfp_run_id``: pass dsl.PIPELINE_JOB_ID_PLACEHOLDER (a run-unique input: no cache hit).
    The history: ``history_url`` if set (a URL with a password is refused: use a Secret),
    else $DLROVER_KFP_HISTORY_URL (from the Secret), else the default SQLite file.

    Outputs: ``plan`` (the plan JSON), ``report`` (Markdown).
    """
    from components.glue import data_location  # noqa: PLC0415
    from components.glue import plan_resources as run  # noqa: PLC0415

    out = run(
        job_spec,
        history_url,
        backend,
        kfp_run_id,
        plan.path,
        report.path,
        data_path=data_location(data.path, data.uri, backend) if data is not None else "",
    )
    plan.metadata["stage"] = out.stage
    plan.metadata["total_cpu"] = out.total_cpu
    plan.metadata["similar_jobs"] = list(out.similar_jobs)


def elastic_train(
    job_spec: str,
    plan: dsl.Input[dsl.Artifact],
    kfp_run_id: str,
    model: dsl.Output[dsl.Model],
    metrics: dsl.Output[dsl.Metrics],
    profile: dsl.Output[dsl.Artifact],
    report: dsl.Output[dsl.HTML],
    history_url: str = "",
    backend: str = "kubernetes",
    claim: str = "dlrover-kfp-runs",
    kfp_task_name: str = "elastic-train",
    data: dsl.Input[dsl.Dataset] = None,
) -> None:
    """Train the job from ``plan``, elastic: Stage 2 resizes it while it trains, Stage 3 acts
    on OOMs, stragglers and hot PS, failed pods are relaunched, a lost PS rolls back to the
    last flash checkpoint. ``backend``: "kubernetes" (this pod is the job master; the worker and
    PS pods mount the PersistentVolumeClaim ``claim``) or "local" (processes in this pod).
    ``kfp_run_id`` (dsl.PIPELINE_JOB_ID_PLACEHOLDER) and ``kfp_task_name``
    (dsl.PIPELINE_TASK_NAME_PLACEHOLDER) name the run: its run id in the history and, on
    Kubernetes, its directory on the claim, the same for every retry of the task, which resumes
    from the last checkpoint. The history as for plan_resources. ``data`` (optional): a
    Dataset (a file, or a directory of files) that replaces the spec's ``data.path``, for data
    format parquet, csv, tsv or criteo; the local backend reads its local copy, the Kubernetes
    backend its URI (``minio://`` as ``s3://``), which the worker pods read themselves.

    Outputs: ``model`` (the trained model's directory), ``metrics`` (held-out loss and AUC),
    ``profile`` (the run's profile JSON, for record_profile), ``report`` (HTML). A failed run is
    recorded in the history before the task fails.
    """
    from components.glue import KfpRun, data_location  # noqa: PLC0415
    from components.glue import elastic_train as run  # noqa: PLC0415

    out = run(
        job_spec,
        plan.path,
        history_url,
        backend,
        claim,
        KfpRun(kfp_run_id, kfp_task_name),
        model.path,
        profile.path,
        report.path,
        data_path=data_location(data.path, data.uri, backend) if data is not None else "",
    )
    if out.loss is not None:
        metrics.log_metric("loss", out.loss)
    if out.auc is not None:
        metrics.log_metric("auc", out.auc)
    metrics.log_metric("jct_seconds", out.jct_seconds)
    metrics.log_metric("samples_processed", out.samples_processed)
    profile.metadata["run_id"] = out.run_id
    model.metadata["run_id"] = out.run_id


def record_profile(
    profile: dsl.Input[dsl.Artifact],
    kfp_run_id: str,
    summary: dsl.Output[dsl.Markdown],
    history_url: str = "",
) -> None:
    """Record a run's profile in the history store, so that the job's next run warm-starts
    from it; a run the store already has is replaced by this attempt (one run per logical
    run). ``kfp_run_id``: dsl.PIPELINE_JOB_ID_PLACEHOLDER. The history as for plan_resources.

    Output: ``summary`` (Markdown).
    """
    from components.glue import record_profile as run  # noqa: PLC0415

    out = run(profile.path, history_url, kfp_run_id, summary.path)
    summary.metadata["run_id"] = out.run_id
    summary.metadata["recorded"] = out.new


def prepare_example_data(
    job_spec: str,
    data: dsl.Output[dsl.Dataset],
    rows: int = 4000,
    seed: int = 0,
) -> None:
    """Make ``rows`` example click rows for the job's model and write them as Parquet files
    (Criteo's column names) into the Dataset ``data``, a directory: a stand-in for a user's
    data-preparation step, to feed elastic_train's ``data``.
    """
    from components.glue import prepare_example_data as run  # noqa: PLC0415

    written = run(job_spec, data.path, rows, seed)
    data.metadata["rows"] = rows
    data.metadata["files"] = written
    data.metadata["format"] = "parquet"


def score_model(
    model: dsl.Input[dsl.Model],
    data: dsl.Input[dsl.Dataset],
    predictions: dsl.Output[dsl.Dataset],
    data_format: str = "",
) -> None:
    """Score every row of ``data`` (a file or a directory of files) with ``model`` (its
    model.onnx, by onnxruntime: no torch) into ``predictions``, one Parquet file: source, row,
    label, probability per scored row. ``data_format``: parquet, csv, tsv or criteo; "" for the
    default of `dlrover-kfp score` (by the suffix and the model's columns).
    """
    from components.glue import score_model as run  # noqa: PLC0415

    out = run(model.path, data.path, predictions.path, data_format)
    predictions.metadata["rows"] = out.rows
    predictions.metadata["bad_rows"] = out.bad_rows
    predictions.metadata["format"] = "parquet"


def evaluate_model(
    model: dsl.Input[dsl.Model],
    data: dsl.Input[dsl.Dataset],
    predictions: dsl.Output[dsl.Dataset],
    metrics: dsl.Output[dsl.Metrics],
    evaluation: dsl.Output[dsl.Artifact],
) -> None:
    """Score the rows the train step held out of ``data`` (the Dataset it trained on) with the
    exported model.onnx (onnxruntime) and fail the task when their AUC is not the train step's
    within 1e-4: the model that would be served is then not the one trained. Outputs: the
    held-out ``predictions`` (Parquet), ``metrics`` (auc, loss, rows) and ``evaluation`` (the
    document publish_model judges).
    """
    from components.glue import evaluate_model as run  # noqa: PLC0415

    out = run(model.path, data.path, predictions.path, evaluation.path)
    if out.auc is not None:
        metrics.log_metric("auc", out.auc)
    if out.loss is not None:
        metrics.log_metric("loss", out.loss)
    metrics.log_metric("rows", out.rows)
    evaluation.metadata["auc"] = out.auc
    evaluation.metadata["train_auc"] = out.train_auc
    predictions.metadata["rows"] = out.rows


def publish_model(
    model: dsl.Input[dsl.Model],
    published: str,
    decision: dsl.Output[dsl.Artifact],
    max_auc_drop: float = 0.005,
    evaluation: dsl.Input[dsl.Artifact] = None,
) -> str:
    """The publish gate: copy ``model`` (its directory: model.json, model.pt, model.onnx) to the
    directory ``published`` (``versions/<name>/``, then ``CURRENT`` names it) only when its
    held-out AUC is at least the published model's less ``max_auc_drop``; the first model with
    an AUC is published, one without is not. A refusal is not a failure: the task succeeds.
    ``evaluation`` (optional, evaluate_model's): judge the AUC the exported model gave there
    (refused unless it is this model's evaluation); without it, the train step's own.

    Returns "published" or "refused" (for ``dsl.If``); ``decision``: the decision as JSON, its
    reason and both AUCs in the metadata.
    """
    from components.glue import publish_model as run  # noqa: PLC0415

    judged = evaluation.path if evaluation is not None else ""
    out = run(model.path, published, max_auc_drop, decision.path, judged)
    decision.metadata["published"] = out.published
    decision.metadata["reason"] = out.reason
    decision.metadata["auc"] = out.auc
    decision.metadata["last_auc"] = out.last_auc
    decision.metadata["version"] = out.version
    return "published" if out.published else "refused"


__all__ = [
    "elastic_train",
    "evaluate_model",
    "plan_resources",
    "prepare_example_data",
    "publish_model",
    "record_profile",
    "score_model",
]
