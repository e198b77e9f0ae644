"""The example DAG reading each day's Parquet partition from a real S3 API (the moto server)
through an Airflow ``aws`` connection named in the URL, and its publish gate refusing a
deliberately worse model, run by ``dag.test()`` in a process of its own
(``tests/airflow/dag_runs.py``, as tests/airflow/test_example_dag.py does).

The child's environment has no AWS credentials at all (and no shared config files): the only
way to read the bucket is the connection, so a run that trains proves that its login, password
and endpoint reached the job's processes. Day 1 trains on ``dt=2026-11-20/`` and publishes the
first model; day 2 trains a worse model (a learning rate that leaves it near its random start)
on ``dt=2026-11-21/``: the publish task is skipped with the reason, day 1's model stays.

Two real runs, an ``airflow db migrate`` and the DAG's imports: 34 s on 2 cores unloaded,
so ``pytest -m long``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("airflow.sdk", reason="the airflow extra is not installed")

from dlrover_kfp.steps.example_data import write_example_parquet
from tests.airflow.dag_env import migrated_airflow_env
from tests.airflow.jobs import tiny_job
from tests.storage_server import ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY, MotoServer, new_bucket

pytestmark = pytest.mark.long

ROOT = Path(__file__).resolve().parents[2]
ROWS = 8000
COLUMNS = "columns: {dense: [I1, I2, I3, I4], sparse: [C1, C2, C3, C4]}"
JOB = tiny_job("dlrm-s3", "dlrm-airflow-s3-test").replace(
    f"data: {{format: synthetic, rows: {ROWS}, seed: 1}}",
    f"data: {{format: parquet, path: /nonexistent/, {COLUMNS}}}",
)
WORSE_JOB = JOB.replace("learning_rate: 0.05", "learning_rate: 0.0001")
assert "format: parquet" in JOB and WORSE_JOB != JOB


def test_the_dag_reads_each_days_partition_from_s3_and_its_gate_refuses_a_worse_model(
    tmp_path: Path, moto_server: MotoServer
) -> None:
    bucket = new_bucket(moto_server)
    (tmp_path / "job.yaml").write_text(JOB)
    (tmp_path / "worse.yaml").write_text(WORSE_JOB)
    for seed, day in enumerate(("2026-11-20", "2026-11-21"), start=1):
        local = tmp_path / "data" / day
        for path in write_example_parquet(JOB, local, rows=ROWS, seed=seed):
            bucket.put_file(f"clicks/dt={day}/{path.name}", path)
    runs = tmp_path / "runs"
    published = tmp_path / "published"
    env = migrated_airflow_env(
        tmp_path,
        drop=("AIRFLOW", "DLROVER_KFP", "AWS_", "GOOGLE_"),
        AIRFLOW_CONN_MINIO=json.dumps(
            {
                "conn_type": "aws",
                "login": ACCESS_KEY_ID,
                "password": SECRET_ACCESS_KEY,
                "extra": {"endpoint_url": moto_server.endpoint, "region_name": REGION},
            }
        ),
        # nothing but the connection may provide a credential
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        AWS_CONFIG_FILE=os.devnull,
        AWS_EC2_METADATA_DISABLED="true",
    )
    child = subprocess.run(
        [
            sys.executable, str(ROOT / "tests" / "airflow" / "dag_runs.py"),
            "--run", f"2026-11-20={tmp_path / 'job.yaml'}",
            "--run", f"2026-11-21={tmp_path / 'worse.yaml'}",
            "--conf", f"data_root=s3://minio@{bucket.name}/clicks",
            "--conf", f"published={published}",
        ],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    log = child.stdout + child.stderr
    assert child.returncode == 0, log[-6000:]
    first, worse = json.loads(child.stdout.strip().splitlines()[-1])

    # Day 1: the day's partition on S3 replaced the spec's path; the first model is published.
    ok = {
        "plan": "success",
        "train": "success",
        "evaluate": "success",
        "record": "success",
        "publish": "success",
    }
    assert (first["state"], first["tasks"]) == ("success", ok), log[-6000:]
    day_1 = runs / "dlrm_daily_retraining" / "2026-11-20" / "train"
    spec = yaml.safe_load((day_1 / "job.yaml").read_text())
    assert spec["data"]["path"] == f"s3://{bucket.name}/clicks/dt=2026-11-20/"
    profile = first["xcom"]["train.profile"]
    assert profile["job"]["data"]["rows"] == ROWS  # counted from the partition's footers
    assert profile["outcome"]["samples_processed"] == ROWS * 9 // 10
    # evaluate read the held-out rows from the bucket through the connection, with model.onnx
    evaluated = first["xcom"]["evaluate.return_value"]
    assert evaluated["rows"] == ROWS - ROWS * 9 // 10
    assert evaluated["auc_difference"] <= 1e-4, evaluated
    decision = first["xcom"]["publish.decision"]
    assert decision["published"] is True and decision["last_auc"] is None
    assert decision["measured_by"] == "evaluate" and decision["auc"] == evaluated["auc"]
    version = (published / "CURRENT").read_text().strip()
    assert version == first["xcom"]["publish.return_value"] == decision["version"]

    # Day 2: a worse model on the next partition: refused, the task skipped, day 1's stays.
    assert worse["state"] == "success", log[-6000:]
    assert worse["tasks"] == {**ok, "publish": "skipped"}, log[-6000:]
    refused = worse["xcom"]["publish.decision"]
    day_2 = runs / "dlrm_daily_retraining" / "2026-11-21" / "train"
    assert yaml.safe_load((day_2 / "job.yaml").read_text())["data"]["path"].endswith("21/")
    assert refused["published"] is False and refused["last_auc"] == decision["auc"]
    assert refused["auc"] < decision["auc"] - 0.005
    assert f"refused: AUC {refused['auc']:.6f} < " in log
    assert (published / "CURRENT").read_text().strip() == version

    # The connection's secret is in no log: the DAG runs' nor the job master's.
    masters = "".join(p.read_text(errors="replace") for p in runs.rglob("master.log"))
    assert SECRET_ACCESS_KEY not in log + masters
