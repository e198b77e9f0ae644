"""The Kubeflow Pipelines components and the pipeline: plan -> train -> record; beside them
``prepare_example_data`` (example rows as a Parquet Dataset, for elastic_train's ``data``),
``evaluate_model`` (the exported model must reproduce the held-out AUC), ``publish_model`` (the
publish gate), which examples/kfp/pipeline.py wires around them, and ``score_model``.

The components' bodies are :mod:`components.bodies`; :func:`build` makes them components of
one image (``base_image``; :mod:`dlrover_kfp.steps.image` says which and why it must be fully
qualified) and composes the pipeline from them. The module's own ``plan_resources``,
``elastic_train``, ``record_profile`` and ``elastic_dlrm_pipeline`` are those of the default
image: the committed YAML. ``install_kfp_package=False``: the image has dlrover-kfp and kfp
installed, and KFP installs nothing at run time (air-gapped clusters; ``kfp.local`` offline).

What a platform team needs of each task is applied by :func:`as_deployed` (the shipped
pipeline and examples/kfp/pipeline.py call it; a pipeline of your own calls it too):

* the history URL from a Kubernetes Secret (:func:`use_history_secret`), never a parameter;
* caching off (the components are also uncacheable by themselves: their run-unique
  ``kfp_run_id`` input, see :mod:`components.bodies`);
* CPU and memory requests and limits (:class:`TaskResources`; set other values after it with
  the task's own ``set_cpu_limit`` and friends, or give the pipeline's ``train_cpu`` and
  ``train_memory``);
* a retry policy on train (:data:`TRAIN_RETRY`): its run directory is named by the KFP run and
  task, so a retry resumes from the last checkpoint;
* :func:`as_job_master` on train: in a cluster its pod is the job master. It starts the job's
  worker and PS pods through the Kubernetes API, so the run's service account needs
  deploy/rbac.yaml's Role (give it when the run is submitted:
  ``kfp.Client().create_run_from_pipeline_package(..., service_account="dlrover-kfp")``;
  kfp-kubernetes 2.17 has no per-task setting for it).
"""

# No `from __future__ import annotations`: KFP reads the pipeline's annotations as types.
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeAlias

from kfp import dsl, kubernetes
from kfp.dsl.pipeline_channel import PipelineParameterChannel

from components import bodies
from dlrover_kfp.history import ENV_VAR as HISTORY_ENV
from dlrover_kfp.steps.image import DEFAULT_IMAGE, IMAGE_ENV, check_image
from dlrover_kfp.steps.train import DEFAULT_MOUNT_PATH

#: The image of the committed YAML (``dlrover-kfp compile --image`` builds others).
IMAGE = DEFAULT_IMAGE

#: The claim the pipeline mounts by default (deploy/master-pod.yaml creates one of this name).
DEFAULT_CLAIM = "dlrover-kfp-runs"

#: The Secret the pipeline reads the history URL from by default, and its key (create it with
#: ``kubectl create secret generic dlrover-kfp-history --from-literal=url=...``).
DEFAULT_HISTORY_SECRET = "dlrover-kfp-history"
HISTORY_SECRET_KEY = "url"

#: A pipeline parameter or a constant: what kfp-kubernetes and the resource setters accept.
Setting: TypeAlias = str | PipelineParameterChannel


@dataclass(frozen=True)
class TaskResources:
    """A task's CPU and memory, requests and limits, in Kubernetes quantities."""

    cpu_request: Setting
    cpu_limit: Setting
    memory_request: Setting
    memory_limit: Setting


#: plan and record: a Python process that reads the history and writes a document (measured on
#: the small example: under 1 CPU-second and 67 MB peak RSS each, docs/kfp.md); the limits leave
#: room for KFP's executor and a large history.
STEP_RESOURCES = TaskResources("250m", "1", "512Mi", "1Gi")

#: evaluate and score: onnxruntime holds the whole model.onnx (its tables) in memory beside
#: pyarrow's reads; the limit fits the small example's 27 MB model many times over; a larger
#: model needs ``set_memory_limit`` of its tables' size plus a GiB.
SCORE_RESOURCES = TaskResources("500m", "1", "1Gi", "2Gi")

#: train's defaults (the job master on Kubernetes: the planner, the shard ledger and the
#: master's RPCs; the pods do the training). With backend="local" every pod is a process of
#: this task: give it the job's total (the pipeline's train_cpu and train_memory).
TRAIN_CPU = "2"
TRAIN_MEMORY = "4Gi"


class Retry(NamedTuple):
    """The arguments of ``PipelineTask.set_retry``."""

    num_retries: int
    backoff_duration: str
    backoff_factor: float
    backoff_max_duration: str


#: train is retried for what a retry can mend (its pod evicted or its node lost, the history
#: briefly unreachable): twice, one and then two minutes later. Each retry resumes the run
#: from its last committed checkpoint (its run directory is the same).
TRAIN_RETRY = Retry(2, "60s", 2.0, "3600s")


def use_history_secret(task: dsl.PipelineTask, secret_name: Setting) -> dsl.PipelineTask:
    """The history URL into ``task`` as ``$DLROVER_KFP_HISTORY_URL``, from key ``url`` of the
    Secret ``secret_name``. Not optional: a missing Secret stops the pod from starting (it
    names the Secret), where an optional one would run on the pod's own SQLite file and lose
    the run's profile with the pod."""
    return kubernetes.use_secret_as_env(
        task, secret_name=secret_name, secret_key_to_env={HISTORY_SECRET_KEY: HISTORY_ENV}
    )


def with_resources(task: dsl.PipelineTask, resources: TaskResources) -> dsl.PipelineTask:
    return (
        task.set_cpu_request(resources.cpu_request)
        .set_cpu_limit(resources.cpu_limit)
        .set_memory_request(resources.memory_request)
        .set_memory_limit(resources.memory_limit)
    )


def as_job_master(task: dsl.PipelineTask, claim: Setting) -> dsl.PipelineTask:
    """Make an ``elastic_train`` task a job master in the cluster: its own pod IP, name and
    uid from the downward API (its pods reach it at that IP and are owned by its pod), the
    run's claim mounted where the worker and PS pods mount it, and its own image given to them
    (``$DLROVER_KFP_IMAGE``), so that they run what it runs."""
    for env, field in (
        ("POD_IP", "status.podIP"),
        ("POD_NAME", "metadata.name"),
        ("POD_UID", "metadata.uid"),
    ):
        kubernetes.use_field_path_as_env(task, env_name=env, field_path=field)
    kubernetes.mount_pvc(task, pvc_name=claim, mount_path=DEFAULT_MOUNT_PATH)
    task.set_env_variable(IMAGE_ENV, task.component_spec.implementation.container.image)
    return task


def as_deployed(
    planned: dsl.PipelineTask,
    trained: dsl.PipelineTask,
    recorded: dsl.PipelineTask,
    *,
    claim: Setting = DEFAULT_CLAIM,
    history_secret: Setting = DEFAULT_HISTORY_SECRET,
    train_cpu: Setting = TRAIN_CPU,
    train_memory: Setting = TRAIN_MEMORY,
) -> None:
    """Everything the module docstring lists, on the three tasks of a plan -> train -> record
    pipeline. Later settings on a task (``set_cpu_limit``, ``set_retry``...) replace these."""
    for task in (planned, trained, recorded):
        use_history_secret(task, history_secret)
        task.set_caching_options(enable_caching=False)
    with_resources(planned, STEP_RESOURCES)
    with_resources(recorded, STEP_RESOURCES)
    with_resources(trained, TaskResources(train_cpu, train_cpu, train_memory, train_memory))
    trained.set_retry(*TRAIN_RETRY)
    as_job_master(trained, claim)


class Components(NamedTuple):
    """The components and the pipeline, of one image."""

    plan_resources: Any
    elastic_train: Any
    record_profile: Any
    elastic_dlrm_pipeline: Any
    prepare_example_data: Any
    publish_model: Any
    score_model: Any
    evaluate_model: Any


def build(image: str = IMAGE) -> Components:
    """The components of :mod:`components.bodies` in ``image`` (refused unless fully
    qualified), and the pipeline plan -> train -> record composed from them."""
    make = dsl.component(base_image=check_image(image, "image"), install_kfp_package=False)
    plan_resources = make(bodies.plan_resources)
    elastic_train = make(bodies.elastic_train)
    record_profile = make(bodies.record_profile)
    prepare_example_data = make(bodies.prepare_example_data)
    publish_model = make(bodies.publish_model)
    score_model = make(bodies.score_model)
    evaluate_model = make(bodies.evaluate_model)

    @dsl.pipeline(
        name="elastic-dlrm",
        description="Plan a DLRM job's resources from the history of similar runs, train it "
        "elastic on parameter servers, and record its profile for the next run.",
    )
    def elastic_dlrm_pipeline(
        job_spec: str,
        history_url: str = "",
        history_secret: str = DEFAULT_HISTORY_SECRET,
        backend: str = "kubernetes",
        claim: str = DEFAULT_CLAIM,
        train_cpu: str = TRAIN_CPU,
        train_memory: str = TRAIN_MEMORY,
    ) -> None:
        planned = plan_resources(
            job_spec=job_spec,
            history_url=history_url,
            backend=backend,
            kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        )
        trained = elastic_train(
            job_spec=job_spec,
            plan=planned.outputs["plan"],
            history_url=history_url,
            backend=backend,
            claim=claim,
            kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            kfp_task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
        )
        recorded = record_profile(
            profile=trained.outputs["profile"],
            history_url=history_url,
            kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        )
        as_deployed(
            planned,
            trained,
            recorded,
            claim=claim,
            history_secret=history_secret,
            train_cpu=train_cpu,
            train_memory=train_memory,
        )

    return Components(
        plan_resources,
        elastic_train,
        record_profile,
        elastic_dlrm_pipeline,
        prepare_example_data,
        publish_model,
        score_model,
        evaluate_model,
    )


(
    plan_resources,
    elastic_train,
    record_profile,
    elastic_dlrm_pipeline,
    prepare_example_data,
    publish_model,
    score_model,
    evaluate_model,
) = build()


__all__ = [
    "DEFAULT_CLAIM",
    "DEFAULT_HISTORY_SECRET",
    "HISTORY_SECRET_KEY",
    "IMAGE",
    "SCORE_RESOURCES",
    "STEP_RESOURCES",
    "TRAIN_CPU",
    "TRAIN_MEMORY",
    "TRAIN_RETRY",
    "Components",
    "Retry",
    "TaskResources",
    "as_deployed",
    "as_job_master",
    "build",
    "elastic_dlrm_pipeline",
    "elastic_train",
    "evaluate_model",
    "plan_resources",
    "prepare_example_data",
    "publish_model",
    "record_profile",
    "score_model",
    "use_history_secret",
    "with_resources",
]
