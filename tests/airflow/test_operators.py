"""The operators without a scheduler: what they validate, write, submit, push and raise."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

pytest.importorskip("airflow.sdk", reason="the airflow extra is not installed")

from airflow.sdk.exceptions import (
    AirflowException,
    AirflowFailException,
    TaskDeferred,
)
from sqlalchemy.engine import make_url

from airflow_plugin import master
from airflow_plugin.links import RunReportLink
from airflow_plugin.operators import (
    ElasticTrainOperator,
    PlanResourcesOperator,
    RecordProfileOperator,
    task_errors,
)
from airflow_plugin.triggers import ElasticTrainTrigger
from dlrover_kfp.core.documents import to_json
from dlrover_kfp.errors import HistoryUnavailableError
from dlrover_kfp.history import open_history
from dlrover_kfp.steps.spec import load_job_spec
from tests.factories import make_profile

JOB = """\
name: dlrm-unit
scenario: dlrm-airflow-unit
model: {embedding_dim: 8, table_sizes: [100, 50], dense_features: 4,
        bottom_mlp: [16, 8], top_mlp: [16, 1]}
data: {format: criteo, path: data/day_0.csv}
training: {batch_size: 256}
resources:
  limits: {cpu: 2, memory: 4Gi}
  workers: {count: 1, cpu: 0.5, memory: 1Gi}
  ps: {count: 1, cpu: 0.5, memory: 1Gi}
"""
BAD_JOB = JOB.replace("training: {batch_size: 256}", "training: {batch_size: 256, warp: 9}")
PLAN = {
    "workers": {"count": 1, "cpu": 0.5, "memory_mb": 1024},
    "ps": {"count": 1, "cpu": 0.5, "memory_mb": 1024},
    "stage": "warm_start",
    "reason": "test",
    "similar_jobs": ["run-1"],
}
SECRET = "s3cret-Pw"


def _context(ds: str | None = "2026-11-20") -> dict[str, Any]:
    ti = mock.MagicMock(dag_id="dlrm_daily_retraining", task_id="train", map_index=-1)
    context: dict[str, Any] = {"ti": ti, "run_id": "manual__2026-11-20T00:00:00+00:00"}
    if ds:
        context["ds"] = ds
        context["ds_nodash"] = ds.replace("-", "")
    return context


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DLROVER_KFP_RUNS_DIR", str(tmp_path / "runs"))
    return tmp_path / "runs"


@pytest.fixture
def popen() -> Any:
    """subprocess.Popen, strict; the "master" it returns is this test process."""
    with mock.patch("subprocess.Popen", autospec=True) as fake:
        fake.return_value.pid = os.getpid()
        yield fake


def _train(tmp_path: Path, **kw: Any) -> ElasticTrainOperator:
    kw.setdefault("job_spec", JOB)
    kw.setdefault("history_url", f"sqlite:///{tmp_path}/history.db")
    kw.setdefault("deferrable", True)
    return ElasticTrainOperator(task_id="train", history_conn_id=None, **kw)


# ---- validation first: nothing written -----------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"job_spec": BAD_JOB}, "job_spec: training.warp: unknown key"),
        ({"plan": {**PLAN, "stage": "guess"}}, "plan: stage"),
        ({"plan": "{not json"}, "plan: not a JSON document"),
        ({"backend": "mainframe"}, "backend: 'mainframe'"),
        ({"backend": "kubernetes"}, "kubernetes['namespace'] is required"),
    ],
)
def test_a_bad_spec_or_plan_fails_the_train_task_before_anything_is_written(
    tmp_path: Path, runs: Path, popen: Any, kw: dict[str, Any], message: str
) -> None:
    operator = _train(tmp_path, **kw)
    with pytest.raises(AirflowFailException, match=re.escape(message)):
        operator.execute(_context())  # type: ignore[arg-type]
    popen.assert_not_called()
    assert not runs.exists()
    assert not (tmp_path / "history.db").exists()


def test_plan_fails_on_a_bad_spec_with_the_message_and_writes_nothing(tmp_path: Path) -> None:
    operator = PlanResourcesOperator(
        task_id="plan", job_spec=BAD_JOB, history_conn_id=None, history_url=str(tmp_path / "h.db")
    )
    with pytest.raises(AirflowFailException, match=r"job_spec: training\.warp: unknown key"):
        operator.execute({})  # type: ignore[arg-type]
    assert not (tmp_path / "h.db").exists()


# ---- submission ----------------------------------------------------------------------------


def test_train_writes_its_inputs_submits_the_master_and_defers(
    tmp_path: Path, runs: Path, popen: Any
) -> None:
    url = f"postgresql+psycopg://dlrover:{SECRET}@db/history"
    run_dir = runs / "dlrm_daily_retraining" / "2026-11-20" / "train"
    run_dir.mkdir(parents=True)
    (run_dir / "profile.json").write_text("{}")  # an earlier attempt's: must not mislead
    (run_dir / "master-exit.json").write_text('{"exit_code": 75}')
    operator = _train(tmp_path, history_url=url, plan=json.dumps(PLAN), timeout=3600)
    with pytest.raises(TaskDeferred) as deferred:
        operator.execute(_context())  # type: ignore[arg-type]

    popen.assert_called_once()
    (command,), options = popen.call_args
    assert command == [
        sys.executable, "-m", "airflow_plugin.master", str(run_dir / "master-exit.json"), "--",
        "run", "--job", str(run_dir / "job.yaml"), "--output-dir", str(run_dir), "--no-record",
        "--backend", "local", "--checkpoint-interval", "60", "--sample-interval", "2",
        "--plan", str(run_dir / "plan.json"), "--run-id", command[-1],
    ]  # fmt: skip
    # the logical run's id: the DAG, the logical date (here: the DAG run), the task
    assert re.fullmatch(r"dlrm-unit-20261120-[0-9a-f]{12}", command[-1])
    assert SECRET not in " ".join(command)
    assert options["env"]["DLROVER_KFP_HISTORY_URL"] == url
    assert options["start_new_session"] is True
    assert options["cwd"] == run_dir
    assert not (run_dir / "profile.json").exists()
    assert not (run_dir / "master-exit.json").exists()
    # the spec as it will run: relative data paths made absolute (the master runs in run_dir)
    written = load_job_spec(str(run_dir / "job.yaml")).spec
    expected = load_job_spec(JOB).spec
    assert written.data.path == str(Path.cwd() / "data/day_0.csv")  # type: ignore[union-attr]
    assert written.model == expected.model and written.resources == expected.resources
    assert json.loads((run_dir / "plan.json").read_text())["similar_jobs"] == ["run-1"]

    trigger = deferred.value.trigger
    assert isinstance(trigger, ElasticTrainTrigger)
    assert deferred.value.method_name == "execute_complete"
    assert (trigger.pid, trigger.output_dir, trigger.poll_interval) == (
        os.getpid(), str(run_dir), 5.0,
    )  # fmt: skip
    assert trigger.deadline is not None
    assert json.loads((run_dir / "master.json").read_text())["pid"] == os.getpid()

    # cleared or retried while that master still runs: wait for it, start no second one
    popen.reset_mock()
    with pytest.raises(TaskDeferred) as again:
        _train(tmp_path, history_url=url).execute(_context())  # type: ignore[arg-type]
    popen.assert_not_called()
    assert again.value.trigger.serialize()[1]["pid"] == os.getpid()


def test_unknown_kubernetes_options_are_refused_when_the_dag_is_parsed(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown option.*master_host"):
        _train(tmp_path, kubernetes={"namespace": "ml", "master_host": "10.0.0.7"})
    with pytest.raises(ValueError, match="unknown option"):
        _train(tmp_path, kubernetes={"namespaces": "ml"})


def test_the_master_wrapper_takes_the_history_from_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"postgresql+psycopg://u:{SECRET}@db/h"
    monkeypatch.setenv("DLROVER_KFP_HISTORY_URL", url)
    status = tmp_path / "master-exit.json"
    with mock.patch.object(master, "run_cli", autospec=True, return_value=1) as cli:
        assert master.main([str(status), "--", "run", "--job", "j.yaml"]) == 1
    cli.assert_called_once_with(["run", "--job", "j.yaml", "--history", url])
    assert "DLROVER_KFP_HISTORY_URL" not in os.environ  # the PS and workers do not inherit it
    assert json.loads(status.read_text()) == {"exit_code": 1}
    with mock.patch.object(master, "run_cli", autospec=True, side_effect=SystemExit(2)):
        assert master.main([str(status), "--", "run", "--bogus"]) == 2
    assert json.loads(status.read_text()) == {"exit_code": 2}
    assert master.main(["only-one"]) == 2


# ---- after the run ------------------------------------------------------------------------


def _resume(
    operator: ElasticTrainOperator, event: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    ti = mock.NonCallableMagicMock(spec=["xcom_push"])
    result = operator.execute_complete({"ti": ti}, event)  # type: ignore[arg-type]
    pushed = {call.kwargs["key"]: call.kwargs["value"] for call in ti.xcom_push.call_args_list}
    return result, pushed


def _event(path: Path) -> dict[str, Any]:
    return {"status": "success", "run_id": "x", "profile": str(path), "outcome": "succeeded"}


def test_a_finished_run_pushes_its_xcoms_and_report(tmp_path: Path) -> None:
    profile = make_profile("dlrm-unit-20261120T000000", jct_seconds=42.0)
    path = tmp_path / "profile.json"
    path.write_text(to_json(profile))
    operator = _train(tmp_path)
    with mock.patch(
        "dlrover_kfp.report.render_run_report", autospec=True, return_value="<html>r</html>"
    ) as render:
        result, pushed = _resume(operator, _event(path))
    render.assert_called_once_with(profile)
    assert (tmp_path / "report.html").read_text() == "<html>r</html>"
    assert pushed == {
        "run_id": "dlrm-unit-20261120T000000",
        "profile": json.loads(path.read_text()),  # the document: any worker can record it
        "profile_path": str(path),
        "report": str(tmp_path / "report.html"),
    }
    assert result["run_id"] == "dlrm-unit-20261120T000000"
    assert result["outcome"]["jct_seconds"] == 42.0
    assert operator.report_path == str(tmp_path / "report.html")


def test_a_report_that_cannot_be_drawn_does_not_fail_the_run(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_text(to_json(make_profile("r-1")))
    with mock.patch(
        "dlrover_kfp.report.render_run_report", autospec=True, side_effect=ValueError("no")
    ):
        result, pushed = _resume(_train(tmp_path), _event(path))
    assert result["report"] is None and "report" not in pushed


def test_a_failed_run_fails_the_task_without_retries(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_text(to_json(make_profile("r-2", status="failed", reason="worker-0 OOM x3")))
    with (
        mock.patch("dlrover_kfp.report.render_run_report", autospec=True, return_value=""),
        pytest.raises(AirflowFailException, match="run r-2 failed: worker-0 OOM x3"),
    ):
        _resume(_train(tmp_path), _event(path))


@pytest.mark.parametrize(
    ("exit_code", "error"),
    [(2, AirflowFailException), (75, AirflowException), (None, AirflowException)],
)
def test_a_master_that_left_no_profile_fails_the_task_by_its_exit_status(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    exit_code: int | None,
    error: type,
) -> None:
    event = {
        "status": "error",
        "message": "the job master (pid 7) ended",
        "exit_code": exit_code,
        "log_tail": "dlrover-kfp: error: the last words",
    }
    with pytest.raises(error, match="the job master") as caught:
        _resume(_train(tmp_path), event)
    retried = not isinstance(caught.value, AirflowFailException)
    assert retried == (exit_code != 2)
    # the task log: Airflow's structlog writes to stdout once configured, else logging
    assert "the last words" in capsys.readouterr().out + caplog.text


def test_errors_keep_their_retry_meaning() -> None:
    with pytest.raises(AirflowException) as caught, task_errors():
        raise HistoryUnavailableError("history.db: database is locked")
    assert not isinstance(caught.value, AirflowFailException)
    assert "temporary failure" in str(caught.value)


# ---- plan and record against a real history ------------------------------------------------


def test_plan_then_record_against_a_sqlite_history(tmp_path: Path) -> None:
    url = str(tmp_path / "history.db")
    plan = PlanResourcesOperator(
        task_id="plan", job_spec=JOB, history_conn_id=None, history_url=url
    ).execute({})  # type: ignore[arg-type]
    assert plan["stage"] == "cold_start"
    json.dumps(plan)  # an XCom: plain JSON

    profile = make_profile("dlrm-unit-1", scenario="dlrm-airflow-unit")
    path = tmp_path / "profile.json"
    path.write_text(to_json(profile))
    record = RecordProfileOperator(
        task_id="record", profile=str(path), history_conn_id=None, history_url=url
    )
    assert record.execute({}) == "dlrm-unit-1"  # type: ignore[arg-type]
    assert record.execute({}) == "dlrm-unit-1"  # type: ignore[arg-type]  # a retry: no-op
    store = open_history(url)
    try:
        assert store.count() == 1
    finally:
        store.close()
    with pytest.raises(AirflowFailException, match="profile: empty"):
        RecordProfileOperator(task_id="r", profile=" ", history_conn_id=None).execute({})  # type: ignore[arg-type]


# ---- the link ------------------------------------------------------------------------------


def test_the_report_link(tmp_path: Path, runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    link = RunReportLink()
    operator = _train(tmp_path)
    key = SimpleNamespace(dag_id="d", task_id="train", run_id="r", try_number=1, map_index=-1)
    assert link.get_link(operator, ti_key=key) == ""  # type: ignore[arg-type]  # no report yet
    report = runs / "dlrm_daily_retraining" / "2026-11-20" / "train" / "report.html"
    operator.report_path = str(report)
    assert link.get_link(operator, ti_key=key) == report.as_uri()  # type: ignore[arg-type]
    monkeypatch.setenv("AIRFLOW__DLROVER_KFP__REPORT_BASE_URL", "https://reports.example/dk/")
    assert (
        link.get_link(operator, ti_key=key)  # type: ignore[arg-type]
        == "https://reports.example/dk/dlrm_daily_retraining/2026-11-20/train/report.html"
    )
    assert make_url(f"sqlite:///{report}").database == str(report)
