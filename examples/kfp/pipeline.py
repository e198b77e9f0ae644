"""Daily DLRM retraining on Kubeflow Pipelines, from dlrover-kfp's components.

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
"""

import argparse
from pathlib import Path

from kfp import compiler, dsl
from kfp.components import load_component_from_file

from components.elastic_dlrm import DEFAULT_HISTORY_SECRET, as_deployed

COMPONENTS = Path(__file__).resolve().parents[2] / "components"

plan_resources = load_component_from_file(str(COMPONENTS / "plan_resources.yaml"))
elastic_train = load_component_from_file(str(COMPONENTS / "elastic_train.yaml"))
record_profile = load_component_from_file(str(COMPONENTS / "record_profile.yaml"))


@dsl.pipeline(
    name="dlrm-daily-retraining",
    description="Plan from the history, train elastic on Kubernetes, record the profile.",
)
def dlrm_daily_retraining(
    job_spec: str,
    claim: str = "dlrover-kfp-runs",
    history_secret: str = DEFAULT_HISTORY_SECRET,
) -> None:
    run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
    planned = plan_resources(job_spec=job_spec, backend="kubernetes", kfp_run_id=run_id)
    trained = elastic_train(
        job_spec=job_spec,
        plan=planned.outputs["plan"],
        backend="kubernetes",
        claim=claim,
        kfp_run_id=run_id,
        kfp_task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
    )
    recorded = record_profile(profile=trained.outputs["profile"], kfp_run_id=run_id)
    # the Secret, caching off, resources, train's retry, and train as the job master: its pod
    # IP, name and uid, the claim its pods share, its image for them (kfp-kubernetes)
    as_deployed(planned, trained, recorded, claim=claim, history_secret=history_secret)


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
