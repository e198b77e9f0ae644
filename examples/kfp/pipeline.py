"""Daily DLRM retraining on Kubeflow Pipelines, from dlrover-kfp's components:
prepare data -> plan -> train (on that data) -> evaluate -> record -> publish (the gate).

Compile it (no cluster needed), then upload the YAML in the KFP UI, or submit it:

    python examples/kfp/pipeline.py --output daily_retraining.yaml
    kubectl -n ml create secret generic dlrover-kfp-history \
        --from-literal=url='postgresql+psycopg://dlrover:PASSWORD@db:5432/history'
    python examples/kfp/pipeline.py --host https://kfp.example.com --namespace ml \
        --job-spec "$(cat examples/jobs/production.yaml)"

The pipeline loads the committed component YAML (components/*.yaml), so what runs is exactly
what `dlrover-kfp compile` wrote, and gives its tasks what a cluster needs
(``components.elastic_dlrm.as_deployed``): the history URL from the Secret ``history_secret``
(default ``dlrover-kfp-history``, key ``url``), caching off, CPU and memory, a retry policy on
train. Every task gets the KFP run's id (``dsl.PIPELINE_JOB_ID_PLACEHOLDER``), which the
components require: it makes each task's cache key unique to the run. Its train step is the job
master: it starts the worker and PS pods through the Kubernetes API, so the run uses the service
account of deploy/rbac.yaml (``--service-account``, default ``dlrover-kfp``) and mounts the
ReadWriteMany claim the job's pods share (``claim``, default ``dlrover-kfp-runs``). Schedule it
daily with a recurring run in the KFP UI, or with ``kfp.Client().create_recurring_run(...,
cron_expression="0 0 2 * * *")``: each run warm-starts from the profiles of the runs before it.

The data: ``prepare_example_data`` stands in for your own preparation step (replace it with any
component that has a ``Dataset`` output: a file or a directory of Parquet/CSV files); its
Dataset replaces the job spec's ``data.path``, so the spec's data format must be parquet (csv,
tsv or criteo for such files). The model: ``evaluate_model`` scores the rows the train step held
out of that Dataset with the exported model.onnx (onnxruntime) and fails the run when their AUC
is not the train step's within 1e-4 (a broken export is never published); ``publish_model``
copies the model to ``published`` (default: a directory on the claim) only when that evaluated
AUC is at least the published model's less ``max_auc_drop``; the task's output is ``published``
or ``refused``. ``backend=local`` runs the job's pods as processes of the train
task (``kfp.local``: tests/kfp/test_example_pipeline.py).
"""

import argparse
from pathlib import Path

from kfp import compiler, dsl, kubernetes
from kfp.components import load_component_from_file

from components.elastic_dlrm import (
    DEFAULT_HISTORY_SECRET,
    SCORE_RESOURCES,
    STEP_RESOURCES,
    as_deployed,
    with_resources,
)
from dlrover_kfp.steps.train import DEFAULT_MOUNT_PATH

COMPONENTS = Path(__file__).resolve().parents[2] / "components"

plan_resources = load_component_from_file(str(COMPONENTS / "plan_resources.yaml"))
elastic_train = load_component_from_file(str(COMPONENTS / "elastic_train.yaml"))
record_profile = load_component_from_file(str(COMPONENTS / "record_profile.yaml"))
prepare_example_data = load_component_from_file(str(COMPONENTS / "prepare_example_data.yaml"))
publish_model = load_component_from_file(str(COMPONENTS / "publish_model.yaml"))
evaluate_model = load_component_from_file(str(COMPONENTS / "evaluate_model.yaml"))

#: Where models are published by default: a directory on the claim the run's pods share.
DEFAULT_PUBLISHED = f"{DEFAULT_MOUNT_PATH}/published/dlrm"


@dsl.pipeline(
    name="dlrm-daily-retraining",
    description="Prepare the day's data, plan from the history, train elastic on it, record "
    "the profile, and publish the model unless its held-out AUC is worse than the published one.",
)
def dlrm_daily_retraining(
    job_spec: str,
    claim: str = "dlrover-kfp-runs",
    history_secret: str = DEFAULT_HISTORY_SECRET,
    backend: str = "kubernetes",
    example_rows: int = 20000,
    published: str = DEFAULT_PUBLISHED,
    max_auc_drop: float = 0.005,
) -> None:
    run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
    # a stand-in for the user's own data preparation: any component with a Dataset output
    prepared = prepare_example_data(job_spec=job_spec, rows=example_rows)
    with_resources(prepared, STEP_RESOURCES)
    planned = plan_resources(
        job_spec=job_spec, data=prepared.outputs["data"], backend=backend, kfp_run_id=run_id
    )
    trained = elastic_train(
        job_spec=job_spec,
        plan=planned.outputs["plan"],
        data=prepared.outputs["data"],  # replaces the spec's data.path
        backend=backend,
        claim=claim,
        kfp_run_id=run_id,
        kfp_task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
    )
    # the exported model scored on the held-out rows: the run fails here if it is not the model
    # the train step evaluated
    evaluated = evaluate_model(model=trained.outputs["model"], data=prepared.outputs["data"])
    evaluated.set_caching_options(enable_caching=False)
    with_resources(evaluated, SCORE_RESOURCES)
    recorded = record_profile(profile=trained.outputs["profile"], kfp_run_id=run_id)
    recorded.after(evaluated)
    # the Secret, caching off, resources, train's retry, and train as the job master: its pod
    # IP, name and uid, the claim its pods share, its image for them (kfp-kubernetes)
    as_deployed(planned, trained, recorded, claim=claim, history_secret=history_secret)
    # the gate: the held-out AUC evaluate measured, against the published model's
    gate = publish_model(
        model=trained.outputs["model"],
        evaluation=evaluated.outputs["evaluation"],
        published=published,
        max_auc_drop=max_auc_drop,
    )
    gate.after(recorded)  # a run is recorded whether or not its model is published
    gate.set_caching_options(enable_caching=False)
    with_resources(gate, STEP_RESOURCES)
    kubernetes.mount_pvc(gate, pvc_name=claim, mount_path=DEFAULT_MOUNT_PATH)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default="dlrm_daily_retraining.yaml", help="compiled YAML")
    parser.add_argument("--host", help="the KFP API endpoint: submit a run there")
    parser.add_argument("--namespace", help="the KFP (profile) namespace of the run")
    parser.add_argument("--service-account", default="dlrover-kfp")
    parser.add_argument("--job-spec", help="the job spec: a path in the image or the YAML itself")
    parser.add_argument(
        "--history-secret", default=DEFAULT_HISTORY_SECRET, help="the Secret with the history URL"
    )
    args = parser.parse_args()
    compiler.Compiler().compile(dlrm_daily_retraining, args.output)
    print(f"wrote {args.output}")
    if args.host:
        if not args.job_spec:
            parser.error("--job-spec: required to submit a run")
        from kfp import Client  # noqa: PLC0415

        run = Client(host=args.host, namespace=args.namespace).create_run_from_pipeline_package(
            args.output,
            arguments={"job_spec": args.job_spec, "history_secret": args.history_secret},
            service_account=args.service_account,
        )
        print(f"submitted run {run.run_id}")


if __name__ == "__main__":
    main()
