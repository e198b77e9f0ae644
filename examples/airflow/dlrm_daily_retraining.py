"""Daily retraining of a DLRM with dlrover-kfp: plan -> train -> evaluate -> record -> publish.

Every day the job is planned from the history of its earlier runs (Stage 1: the first run
starts from the spec's own resources, later ones warm-start from what earlier runs used),
trained elastically from that plan (Stages 2 and 3 resize it while it trains) and its profile
recorded, so that tomorrow's run starts nearer its optimum.

Parameters (trigger the DAG with a configuration to change them):

- ``job_spec``: a path to a job spec, or the YAML document itself; default: the small job
  below (the same as ``examples/jobs/small.yaml``; under a minute on 2 cores), written into
  this file so that the DAG works wherever it is copied.
- ``backend``: ``local`` (the job's PS and workers are processes of the worker's machine).
- ``data_root``: the root of the daily partitions (empty: the job spec's own ``data.path``).
  Each run reads ``<data_root>/dt=<its logical date>/`` (the train task's templated
  ``data_path``), every Parquet (or CSV) file in it; ``s3://aws_default@clicks`` reads the
  bucket ``clicks`` with the credentials of the Airflow connection ``aws_default`` (an ``aws``
  connection: ``docs/airflow.md``). The job spec's data format must then read files (parquet,
  csv, tsv or criteo).
- ``published``: the directory the model is published to (empty: ``published/<dag id>`` in
  the runs directory), and ``max_auc_drop``: the publish gate's tolerance.

The evaluate task scores the rows the train task held out with the exported ``model.onnx``
(onnxruntime) and fails, without retries, when their AUC is not the train task's within 1e-4:
a broken export stops the run before it is recorded or published. The publish task copies the
model there only when that evaluated AUC is at least the published model's less
``max_auc_drop``; a worse model is refused and the task is *skipped* (the published model
stays). Each evaluated run is recorded either way.

The history store: the Airflow connection ``dlrover_kfp_history`` when one is configured
(``docs/airflow.md``), else ``$DLROVER_KFP_HISTORY_URL``, else a SQLite file in the user data
directory. Each day's run writes ``$DLROVER_KFP_RUNS_DIR/dlrm_daily_retraining/<date>/train/``
(default: ``runs/`` in the user data directory): profile, model, logs and ``report.html``,
linked from the train task as "Run report".

Try it: ``airflow dags test dlrm_daily_retraining 2026-11-20``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_plugin.operators import (
    ElasticTrainOperator,
    EvaluateModelOperator,
    PlanResourcesOperator,
    PublishModelOperator,
    RecordProfileOperator,
)

#: The default job (examples/jobs/small.yaml), inline: a DAG file is copied into a DAGs folder
#: on its own, and a path relative to this repository would not be there. 200,000 synthetic
#: Criteo-shaped rows (the last 10% held out), 26 tables of 7 to 100,000 rows.
DEFAULT_JOB_SPEC = """\
name: dlrm-small
scenario: dlrm-daily-small
model:
  embedding_dim: 16
  table_sizes: [1000, 500, 10000, 20000, 50, 300, 100000, 7, 4000, 100, 3000, 60000, 200,
                9000, 30, 1500, 80000, 12, 600, 70000, 2500, 400, 5000, 40000, 900, 15000]
  bottom_mlp: [64, 32, 16]
  top_mlp: [64, 32, 1]
data: {format: synthetic, rows: 200000, seed: 1}
training: {batch_size: 512, epochs: 1, learning_rate: 0.05}
resources:
  limits: {cpu: 2, memory: 8Gi}
  workers: {count: 1, cpu: 0.5, memory: 2Gi}
  ps: {count: 1, cpu: 0.5, memory: 2Gi}
elastic: {min_workers: 1, max_workers: 2, max_ps: 2}
"""

#: Each run's data: its day's partition, e.g. s3://aws_default@clicks/dt=2026-11-20/ (empty
#: without a data_root: the job spec's own data.path).
DATA_PATH = "{{ params.data_root ~ '/dt=' ~ ds ~ '/' if params.data_root else '' }}"

#: The history store's connection, used when it is configured.
HISTORY_CONN_ID = "dlrover_kfp_history"

with DAG(
    dag_id="dlrm_daily_retraining",
    description="Plan, train and record a DLRM every day; each run warm-starts from the last",
    schedule="@daily",
    start_date=datetime(2026, 11, 1, tzinfo=UTC),
    catchup=False,
    # one day at a time: each run's plan comes from the runs recorded before it
    max_active_runs=1,
    params={
        "job_spec": Param(
            DEFAULT_JOB_SPEC,
            type="string",
            minLength=1,
            description="a path to a job spec (YAML or JSON), or the YAML document itself",
        ),
        "backend": Param("local", type="string", enum=["local"], description="where pods run"),
        "data_root": Param(
            "",
            type="string",
            description="the root of the daily partitions <data_root>/dt=<date>/ (a directory "
            "or s3://CONN_ID@bucket/prefix); empty: the job spec's data.path",
        ),
        "published": Param(
            "", type="string", description="where models are published; empty: the default"
        ),
        "max_auc_drop": Param(
            0.005, type="number", minimum=0, maximum=1, description="the gate's AUC tolerance"
        ),
    },
    default_args={"retries": 2, "retry_delay": timedelta(minutes=2)},
    tags=["dlrover-kfp", "dlrm"],
    doc_md=__doc__,
) as dag:
    plan = PlanResourcesOperator(
        task_id="plan",
        job_spec="{{ params.job_spec }}",
        backend="{{ params.backend }}",
        data_path=DATA_PATH,  # the plan sizes the data the run trains on
        history_conn_id=HISTORY_CONN_ID,
    )
    train = ElasticTrainOperator(
        task_id="train",
        job_spec="{{ params.job_spec }}",
        plan=plan.output,
        backend="{{ params.backend }}",
        data_path=DATA_PATH,
        history_conn_id=HISTORY_CONN_ID,
        poll_interval=2.0,
        timeout=6 * 3600,
        # wait in the triggerer, not a worker slot, whatever [operators] default_deferrable says
        deferrable=True,
    )
    evaluate = EvaluateModelOperator(
        task_id="evaluate",
        model=train.output["model"],
        data_path=DATA_PATH,  # the data the run trained on (none: generated rows, again)
        retries=0,  # the same model scores the same rows the same way
    )
    record = RecordProfileOperator(
        task_id="record",
        # the profile document (an XCom), not a path: the record task may run on another worker
        profile=train.output["profile"],
        history_conn_id=HISTORY_CONN_ID,
    )
    publish = PublishModelOperator(
        task_id="publish",
        model=train.output["model"],
        published="{{ params.published }}",
        max_auc_drop="{{ params.max_auc_drop }}",
        evaluation=evaluate.output["metrics"],  # the AUC model.onnx gave, not the trainer's
    )
    train >> evaluate >> record >> publish
