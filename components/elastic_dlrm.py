"""The Kubeflow Pipelines components and the pipeline: plan -> train -> record.

KFP ships a Python component's *source* in the compiled YAML and runs it in the image, so each
body is self-contained: it imports one function of :mod:`components.glue` and hands it its
parameters and its artifacts' paths. The image is the project's (deploy/Dockerfile), tagged
with the package version (deploy/build.sh), where dlrover-kfp and its extras are installed:
``install_kfp_package=False`` keeps KFP from installing anything at run time (air-gapped
clusters, and ``kfp.local`` runs offline).

Caching is off for all three: a plan depends on the history, which every run changes, and a
training run must run.

In a cluster, ``elastic_train``'s pod is the job master. It starts the job's worker and PS pods
through the Kubernetes API, so the run's service account needs deploy/rbac.yaml's Role (give it
when the run is submitted: ``kfp.Client().create_run_from_pipeline_package(...,
service_account="dlrover-kfp")``; kfp-kubernetes 2.17 has no per-task setting for it). With
kfp-kubernetes the pipeline gives the master its own pod IP, name and uid (the pods reach it
there and are owned by it) and mounts the run's PersistentVolumeClaim, which the worker and PS
pods mount too.
"""

# No `from __future__ import annotations`: KFP reads the parameters' annotations as types.
from kfp import dsl, kubernetes
from kfp.dsl.pipeline_channel import PipelineParameterChannel

from dlrover_kfp import __version__
from dlrover_kfp.steps.train import DEFAULT_MOUNT_PATH

#: The project's image at this version (deploy/build.sh builds and tags it).
IMAGE = f"dlrover-kfp:{__version__}"

#: The claim the pipeline mounts by default (deploy/master-pod.yaml creates one of this name).
DEFAULT_CLAIM = "dlrover-kfp-runs"


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def plan_resources(
    job_spec: str,
    history_url: str,
    plan: dsl.Output[dsl.Artifact],
    report: dsl.Output[dsl.Markdown],
    backend: str = "kubernetes",
) -> None:
    """Plan a job's workers and PS before it starts: warm start from the similar jobs in the
    history store (``history_url``; empty: $DLROVER_KFP_HISTORY_URL, else the default SQLite
    file), else a cold start. ``job_spec``: a path in the image, or the YAML itself.

    Outputs: ``plan`` (the plan JSON), ``report`` (Markdown).
    """
    from components.glue import plan_resources as run  # noqa: PLC0415

    out = run(job_spec, history_url, backend, plan.path, report.path)
    plan.metadata["stage"] = out.stage
    plan.metadata["total_cpu"] = out.total_cpu
    plan.metadata["similar_jobs"] = list(out.similar_jobs)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def elastic_train(
    job_spec: str,
    plan: dsl.Input[dsl.Artifact],
    history_url: str,
    model: dsl.Output[dsl.Model],
    metrics: dsl.Output[dsl.Metrics],
    profile: dsl.Output[dsl.Artifact],
    report: dsl.Output[dsl.HTML],
    backend: str = "kubernetes",
    claim: str = "dlrover-kfp-runs",
) -> None:
    """Train the job from ``plan``, elastic: Stage 2 resizes it while it trains, Stage 3 acts
    on OOMs, stragglers and hot PS, failed pods are relaunched, a lost PS rolls back to the
    last flash checkpoint. ``backend``: "kubernetes" (this pod is the job master; the worker and
    PS pods mount the PersistentVolumeClaim ``claim``) or "local" (processes in this pod).

    Outputs: ``model`` (the trained model's directory), ``metrics`` (held-out loss and AUC),
    ``profile`` (the run's profile JSON, for record_profile), ``report`` (HTML). A failed run is
    recorded in the history before the task fails.
    """
    from components.glue import elastic_train as run  # noqa: PLC0415

    out = run(
        job_spec, plan.path, history_url, backend, claim, model.path, profile.path, report.path
    )
    if out.loss is not None:
        metrics.log_metric("loss", out.loss)
    if out.auc is not None:
        metrics.log_metric("auc", out.auc)
    metrics.log_metric("jct_seconds", out.jct_seconds)
    metrics.log_metric("samples_processed", out.samples_processed)
    profile.metadata["run_id"] = out.run_id
    model.metadata["run_id"] = out.run_id


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def record_profile(
    profile: dsl.Input[dsl.Artifact],
    history_url: str,
    summary: dsl.Output[dsl.Markdown],
) -> None:
    """Record a run's profile in the history store, so that the job's next run warm-starts
    from it. Recording a run the store already has changes nothing.

    Output: ``summary`` (Markdown).
    """
    from components.glue import record_profile as run  # noqa: PLC0415

    out = run(profile.path, history_url, summary.path)
    summary.metadata["run_id"] = out.run_id
    summary.metadata["recorded"] = out.new


def as_job_master(
    task: dsl.PipelineTask, claim: str | PipelineParameterChannel
) -> dsl.PipelineTask:
    """Make an ``elastic_train`` task a job master in the cluster: its own pod IP, name and
    uid from the downward API (its pods reach it at that IP and are owned by its pod), and the
    run's claim mounted where the worker and PS pods mount it."""
    for env, field in (
        ("POD_IP", "status.podIP"),
        ("POD_NAME", "metadata.name"),
        ("POD_UID", "metadata.uid"),
    ):
        kubernetes.use_field_path_as_env(task, env_name=env, field_path=field)
    kubernetes.mount_pvc(task, pvc_name=claim, mount_path=DEFAULT_MOUNT_PATH)
    return task


@dsl.pipeline(
    name="elastic-dlrm",
    description="Plan a DLRM job's resources from the history of similar runs, train it "
    "elastic on parameter servers, and record its profile for the next run.",
)
def elastic_dlrm_pipeline(
    job_spec: str,
    history_url: str = "",
    backend: str = "kubernetes",
    claim: str = DEFAULT_CLAIM,
) -> None:
    planned = plan_resources(job_spec=job_spec, history_url=history_url, backend=backend)
    trained = elastic_train(
        job_spec=job_spec,
        plan=planned.outputs["plan"],
        history_url=history_url,
        backend=backend,
        claim=claim,
    )
    recorded = record_profile(profile=trained.outputs["profile"], history_url=history_url)
    for task in (planned, trained, recorded):
        task.set_caching_options(enable_caching=False)
    as_job_master(trained, claim)


__all__ = [
    "DEFAULT_CLAIM",
    "IMAGE",
    "as_job_master",
    "elastic_dlrm_pipeline",
    "elastic_train",
    "plan_resources",
    "record_profile",
]
