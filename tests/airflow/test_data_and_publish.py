"""The train operator's data location (a templated URL, an Airflow ``aws`` connection's
credentials in the master's environment only) and the publish operator, without a scheduler.
tests/airflow/test_publish_dag.py runs them in the example DAG on a real S3 API."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

pytest.importorskip("airflow.sdk", reason="the airflow extra is not installed")

from airflow.sdk import Connection
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException, TaskDeferred

from airflow_plugin.data import aws_environment, split_connection
from airflow_plugin.operators import (
    ElasticTrainOperator,
    EvaluateModelOperator,
    PlanResourcesOperator,
    PublishModelOperator,
    ScoreModelOperator,
)
from dlrover_kfp.steps.spec import load_job_spec

JOB = """\
name: dlrm-unit
scenario: dlrm-airflow-unit
model: {embedding_dim: 8, table_sizes: [100, 50], dense_features: 2,
        bottom_mlp: [16, 8], top_mlp: [16, 1]}
data: {format: parquet, path: data/, columns: {dense: [I1, I2], sparse: [C1, C2]}, rows: 500}
training: {batch_size: 256}
resources:
  limits: {cpu: 2, memory: 4Gi}
  workers: {count: 1, cpu: 0.5, memory: 1Gi}
  ps: {count: 1, cpu: 0.5, memory: 1Gi}
"""
SYNTHETIC_JOB = JOB.replace(
    "data: {format: parquet, path: data/, columns: {dense: [I1, I2], sparse: [C1, C2]}, rows: 500}",
    "data: {format: synthetic, rows: 500}",
)
KEY_ID = "AKIAEXAMPLEKEYID0001"
SECRET = "wJalrXUtnFEMI-example-secret"
TOKEN = "session-token-example-123"
ENDPOINT = "http://127.0.0.1:9000"
CONNECTION = {
    "conn_type": "aws",
    "login": KEY_ID,
    "password": SECRET,
    "extra": {"endpoint_url": ENDPOINT, "region_name": "eu-west-1", "aws_session_token": TOKEN},
}


def _context(ds: str = "2026-11-20") -> dict[str, Any]:
    ti = mock.MagicMock(dag_id="dlrm_daily_retraining", task_id="train", map_index=-1)
    return {
        "ti": ti,
        "run_id": f"scheduled__{ds}T00:00:00+00:00",
        "ds": ds,
        "ds_nodash": ds.replace("-", ""),
    }


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DLROVER_KFP_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("AIRFLOW_CONN_MINIO", json.dumps(CONNECTION))
    monkeypatch.setenv("AIRFLOW_CONN_SQLITE_ONE", json.dumps({"conn_type": "sqlite"}))
    return tmp_path / "runs"


@pytest.fixture
def popen() -> Any:
    with mock.patch("subprocess.Popen", autospec=True) as fake:
        fake.return_value.pid = os.getpid()
        yield fake


def _train(tmp_path: Path, **kw: Any) -> ElasticTrainOperator:
    kw.setdefault("job_spec", JOB)
    return ElasticTrainOperator(
        task_id="train",
        history_conn_id=None,
        history_url=f"sqlite:///{tmp_path}/history.db",
        deferrable=True,
        **kw,
    )


def test_the_data_path_is_templated_and_its_connection_reaches_the_master_environment_only(
    tmp_path: Path,
    runs: Path,
    popen: Any,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    operator = _train(tmp_path, data_path="s3://minio@clicks/dt={{ ds }}/")
    assert "data_path" in operator.template_fields and "data_conn_id" in operator.template_fields
    context = _context()
    operator.render_template_fields(context)  # type: ignore[arg-type]
    assert operator.data_path == "s3://minio@clicks/dt=2026-11-20/"
    with pytest.raises(TaskDeferred):
        operator.execute(context)  # type: ignore[arg-type]
    (command,), options = popen.call_args
    env = options["env"]
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == (KEY_ID, SECRET)
    assert (env["AWS_SESSION_TOKEN"], env["AWS_ENDPOINT_URL"]) == (TOKEN, ENDPOINT)
    assert env["AWS_DEFAULT_REGION"] == "eu-west-1"
    assert "AWS_SECRET_ACCESS_KEY" not in os.environ  # this process's own is untouched
    run_dir = runs / "dlrm_daily_retraining" / "2026-11-20" / "train"
    job_yaml = (run_dir / "job.yaml").read_text()
    spec = load_job_spec(str(run_dir / "job.yaml")).spec
    assert spec.data.path == "s3://clicks/dt=2026-11-20/"  # type: ignore[union-attr]
    assert spec.data.rows is None  # type: ignore[union-attr]  (the spec's count: other data)
    logged = "\n".join([caplog.text, *capfd.readouterr()])
    shown = "\n".join([job_yaml, " ".join(command), logged])
    for secret in (SECRET, TOKEN, KEY_ID):
        assert secret not in shown
    assert "data: s3://clicks/dt=2026-11-20/ (credentials from connection minio)" in logged


def test_data_conn_id_gives_the_credentials_for_the_specs_own_path_too(
    tmp_path: Path, runs: Path, popen: Any
) -> None:
    job = JOB.replace("path: data/", "path: 's3://clicks/all/'")
    with pytest.raises(TaskDeferred):
        _train(tmp_path, job_spec=job, data_conn_id="minio").execute(_context())  # type: ignore[arg-type]
    assert popen.call_args.kwargs["env"]["AWS_SECRET_ACCESS_KEY"] == SECRET
    run_dir = runs / "dlrm_daily_retraining" / "2026-11-20" / "train"
    assert load_job_spec(str(run_dir / "job.yaml")).spec.data.path == "s3://clicks/all/"  # type: ignore[union-attr]


def test_a_local_data_path_replaces_the_specs_and_needs_no_connection(
    tmp_path: Path, runs: Path, popen: Any
) -> None:
    with pytest.raises(TaskDeferred):
        _train(tmp_path, data_path=str(tmp_path / "day")).execute(_context())  # type: ignore[arg-type]
    assert "AWS_SECRET_ACCESS_KEY" not in popen.call_args.kwargs["env"]
    run_dir = runs / "dlrm_daily_retraining" / "2026-11-20" / "train"
    assert load_job_spec(str(run_dir / "job.yaml")).spec.data.path == str(tmp_path / "day")  # type: ignore[union-attr]


KUBE = {"namespace": "ml", "image": "registry.example.com/d:1", "claim": "c"}
BAD_LOCATIONS = [
    ({"data_path": "s3://nobody@clicks/x/"}, "connection 'nobody' is not configured"),
    (
        {"data_path": "s3://clicks/x/", "data_conn_id": "sqlite_one"},
        "is of type 'sqlite'; expected an 'aws' connection",
    ),
    (
        {"data_path": "s3://minio@clicks/x/", "data_conn_id": "other"},
        "data_path names connection 'minio' and data_conn_id 'other'",
    ),
    (
        {"data_path": f"s3://{KEY_ID}:{SECRET}@clicks/x/"},
        "data_path: s3://***@clicks/x/: a password in the URL",
    ),
    ({"data_path": "gs://minio@clicks/x/"}, "an aws connection reads s3:// URLs"),
    (
        {"data_path": "/data/x", "job_spec": SYNTHETIC_JOB},
        "data_path: '/data/x' given, but the job spec's data is synthetic",
    ),
    (
        {"data_conn_id": "minio", "job_spec": SYNTHETIC_JOB},
        "data_conn_id: 'minio' given, but the job spec's data is synthetic",
    ),
    (
        {"data_path": "s3://minio@clicks/x/", "backend": "kubernetes", "kubernetes": KUBE},
        "reach the job master's processes only with backend local",
    ),
]


@pytest.mark.parametrize(("kw", "message"), BAD_LOCATIONS)
def test_a_bad_data_location_fails_the_task_naming_it_and_nothing_starts(
    tmp_path: Path, runs: Path, popen: Any, kw: dict[str, Any], message: str
) -> None:
    with pytest.raises(AirflowFailException, match=re.escape(message)) as failed:
        _train(tmp_path, **kw).execute(_context())  # type: ignore[arg-type]
    assert SECRET not in str(failed.value)
    popen.assert_not_called()
    assert not runs.exists()


def test_the_plan_reads_the_same_location_with_the_credentials_only_while_it_plans(
    tmp_path: Path, runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    seen: list[tuple[str, str | None]] = []

    def plan_step(job_spec: str, url: str, backend: str, *, data_path: str) -> Any:
        seen.append((data_path, os.environ.get("AWS_SECRET_ACCESS_KEY")))
        raise RuntimeError("planned")

    operator = PlanResourcesOperator(
        task_id="plan", job_spec=JOB, history_conn_id=None, data_path="s3://minio@clicks/d/"
    )
    assert "data_path" in operator.template_fields
    with (
        mock.patch("dlrover_kfp.steps.plan.plan_step", plan_step),
        pytest.raises(RuntimeError, match="planned"),
    ):
        operator.execute(_context())  # type: ignore[arg-type]
    assert seen == [("s3://clicks/d/", SECRET)]
    assert "AWS_SECRET_ACCESS_KEY" not in os.environ  # as it was


def test_a_generic_connection_is_read_as_airflow_stores_an_aws_one_without_the_provider() -> None:
    conn = Connection(
        conn_id="cli", conn_type="generic", login=KEY_ID, password=SECRET, extra='{"host": "h"}'
    )
    assert aws_environment(conn) == {
        "AWS_ACCESS_KEY_ID": KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_ENDPOINT_URL": "h",  # an older connection's key for the endpoint
    }
    assert aws_environment(Connection(conn_id="empty", conn_type="aws")) == {}  # the worker's


def test_a_url_without_a_user_part_keeps_its_at_signs_in_the_path() -> None:
    assert split_connection("s3://bucket/a@b/") == ("s3://bucket/a@b/", None)
    assert split_connection("/data/a@b") == ("/data/a@b", None)
    assert split_connection("s3://c@bucket/k") == ("s3://bucket/k", "c")


def _model(path: Path, auc: float | None) -> str:
    path.mkdir(parents=True)
    (path / "model.json").write_text(json.dumps({"metrics": {"auc": auc, "eval_rows": 10}}))
    (path / "model.pt").write_bytes(b"weights of " + path.name.encode())
    return str(path)


def test_publish_publishes_the_first_model_and_skips_a_worse_one_with_the_reason(
    tmp_path: Path, runs: Path
) -> None:
    context = _context()
    first = PublishModelOperator(task_id="publish", model=_model(tmp_path / "a", 0.74))
    version = first.execute(context)  # type: ignore[arg-type]
    published = runs / "published" / first.dag_id  # the default location
    assert (published / "CURRENT").read_text().strip() == version
    worse = PublishModelOperator(
        task_id="publish", model=_model(tmp_path / "b", 0.72), max_auc_drop="0.01"
    )
    with pytest.raises(AirflowSkipException, match=r"refused: AUC 0\.720000 < 0\.730000"):
        worse.execute(context)  # type: ignore[arg-type]
    pushed = context["ti"].xcom_push.call_args_list[-1].kwargs
    assert pushed["key"] == "decision"
    assert (pushed["value"]["published"], pushed["value"]["last_auc"]) == (False, 0.74)
    assert (published / "CURRENT").read_text().strip() == version  # still the first


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"model": None}, "model: None; give the trained model's directory"),
        ({"max_auc_drop": "a lot"}, "max_auc_drop: 'a lot'; expected a number"),
        ({"max_auc_drop": 2}, "max_auc_drop: 2.0; expected an AUC difference"),
    ],
)
def test_publish_fails_on_bad_input(
    tmp_path: Path, runs: Path, kw: dict[str, Any], message: str
) -> None:
    kw.setdefault("model", _model(tmp_path / "m", 0.7))
    with pytest.raises(AirflowFailException, match=re.escape(message)):
        PublishModelOperator(task_id="publish", **kw).execute(_context())  # type: ignore[arg-type]


def _exported(tmp_path: Path) -> tuple[Path, Path]:
    """(model directory, data directory): JOB's model, untrained, exported as a run exports it
    (model.onnx, and model.json with the held-out AUC torch measures on 500 Parquet rows)."""
    from dlrover_kfp.core.documents import load_text, parse  # noqa: PLC0415
    from dlrover_kfp.core.spec import JobSpec  # noqa: PLC0415
    from dlrover_kfp.runtime.export import evaluate, held_out_record, save_model  # noqa: PLC0415
    from dlrover_kfp.steps.example_data import write_example_parquet  # noqa: PLC0415
    from dlrover_kfp.training.data import split_ranges  # noqa: PLC0415
    from dlrover_kfp.training.datasets import open_dataset  # noqa: PLC0415
    from dlrover_kfp.training.model import FullDLRM  # noqa: PLC0415

    data = tmp_path / "data"
    write_example_parquet(JOB, data, rows=500, seed=3)
    spec = parse(JobSpec, load_text(JOB.replace("path: data/", f"path: {data}/"), "job"), "job")
    dataset = open_dataset(spec.data, spec.model, tmp_path)
    _, held_out = split_ranges(dataset.source_rows, 8192, 0.1)
    model = FullDLRM(spec.model, seed=5)
    metrics = evaluate(model, spec, tmp_path, held_out)
    save_model(
        model, spec, 0, metrics, tmp_path / "model", held_out_record(dataset, 0.1, spec.data)
    )
    return tmp_path / "model", data


def test_score_and_evaluate_operators_run_the_exported_model_and_evaluate_fails_a_mismatch(
    tmp_path: Path, runs: Path
) -> None:
    model, data = _exported(tmp_path)
    context = _context()
    score = ScoreModelOperator(
        task_id="score",
        model=str(model),
        data_path=str(data),
        predictions=str(tmp_path / "p.pq"),
        # no data_format: a directory has no suffix; the model was trained on Parquet
    )
    summary = score.execute(context)  # type: ignore[arg-type]
    assert (summary["rows"], summary["held_out"]) == (500, False)
    evaluate = EvaluateModelOperator(task_id="evaluate", model=str(model), data_path=str(data))
    metrics = evaluate.execute(context)  # type: ignore[arg-type]
    assert metrics["rows"] == 50 and metrics["auc_difference"] <= 1e-4, metrics
    pushed = context["ti"].xcom_push.call_args_list[-1].kwargs
    assert pushed == {"key": "metrics", "value": str(tmp_path / "evaluation" / "metrics.json")}
    # model.json's AUC is not what model.onnx gives: the task fails, without retries
    described = json.loads((model / "model.json").read_text())
    described["metrics"]["auc"] = round(metrics["auc"] + 0.01, 6)
    (model / "model.json").write_text(json.dumps(described))
    with pytest.raises(AirflowFailException, match="the exported model is not the trained one"):
        evaluate.execute(context)  # type: ignore[arg-type]
