"""The example DAG on a real Airflow 3 (SQLite metadata database after ``airflow db migrate``),
run by ``dag.test()`` for consecutive logical dates in a process of its own
(``tests/airflow/dag_runs.py``): Airflow must be configured before it is first imported.

``dag.test()`` runs a deferred task's trigger inline: it rebuilds the trigger from the
classpath and kwargs of its ``serialize()``, runs it to its event and resumes the task, so a
passing run also proves the round trip. The job is a tiny one (8,000 rows, 4 tables) so that
two real elastic runs fit the suite's budget; ``examples/jobs/small.yaml``, the DAG's default,
was checked by hand (docs/airflow.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

pytest.importorskip("airflow.sdk", reason="the airflow extra is not installed")

from dlrover_kfp.history import open_history
from tests.airflow.dag_env import migrated_airflow_env
from tests.airflow.jobs import tiny_job

ROOT = Path(__file__).resolve().parents[2]

TINY_JOB = tiny_job("dlrm-tiny", "dlrm-airflow-test")
BAD_JOB = TINY_JOB.replace(
    "scenario: dlrm-airflow-test\n", "scenario: dlrm-airflow-test\nbogus: 3\n"
)


def _history_ids(url: str) -> set[str]:
    store = open_history(url)
    try:
        return {summary.run_id for summary in store.list()}
    finally:
        store.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    "rerun",
    [
        pytest.param(False, id="three-days"),
        # +9 s (a fourth DAG run, a third training): opt-in to hold the default suite under 10
        # minutes; the run id that names the logical run, not the clock, is asserted by default.
        pytest.param(True, marks=pytest.mark.long, id="rerun"),
    ],
)
def test_the_example_dag_retrains_daily_from_its_own_history(tmp_path: Path, rerun: bool) -> None:
    (tmp_path / "tiny.yaml").write_text(TINY_JOB)
    (tmp_path / "bad.yaml").write_text(BAD_JOB)
    history = tmp_path / "history.db"
    runs = tmp_path / "runs"
    env = migrated_airflow_env(tmp_path)

    # Run 1 finds the store through $DLROVER_KFP_HISTORY_URL; from run 2 on the connection
    # dlrover_kfp_history names it while the variable names an empty decoy.
    again_run = ["--run", f"2026-11-20={tmp_path / 'tiny.yaml'}"] if rerun else []
    child = subprocess.run(
        [
            sys.executable, str(ROOT / "tests" / "airflow" / "dag_runs.py"),
            "--run", f"2026-11-20={tmp_path / 'tiny.yaml'}",
            "--run", f"2026-11-21={tmp_path / 'tiny.yaml'}",
            "--run", f"2026-11-22={tmp_path / 'bad.yaml'}",
            *again_run,
            "--connection-from-run", "2",
        ],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    log = child.stdout + child.stderr
    assert child.returncode == 0, log[-6000:]
    first, second, bad, *rest = json.loads(child.stdout.strip().splitlines()[-1])
    ok = {
        "plan": "success",
        "train": "success",
        "evaluate": "success",
        "record": "success",
        "publish": "success",
    }
    # a later day's model is published unless its AUC is worse (tests/airflow/test_publish_dag.py)
    later = {**ok, "publish": mock.ANY}

    # Day 1: a cold start, trained, recorded, reported.
    assert (first["state"], first["tasks"]) == ("success", ok), log[-6000:]
    xcom: dict[str, Any] = first["xcom"]
    run_1 = xcom["train.run_id"]
    assert xcom["plan.return_value"]["stage"] == "cold_start"
    assert xcom["record.return_value"] == run_1
    train_dir = runs / "dlrm_daily_retraining" / "2026-11-20" / "train"
    assert xcom["train.profile_path"] == str(train_dir / "profile.json")
    # the document itself (the record task may run on another worker than train)
    assert xcom["train.profile"]["run_id"] == run_1
    assert xcom["train.profile"]["outcome"]["status"] == "succeeded"
    # the run id names the logical run (DAG, DAG run, task), not the clock
    assert run_1.startswith("dlrm-tiny-20261120-")
    assert (train_dir / "report.html").read_text().lstrip().lower().startswith("<!doctype html")
    assert xcom["train._link_RunReportLink"] == (train_dir / "report.html").as_uri()
    assert "[DAG TEST] running trigger in line" in log

    # evaluate: model.onnx under onnxruntime on the held-out rows (generated again: the tiny
    # job's data is synthetic) gives the train step's AUC
    evaluated = xcom["evaluate.return_value"]
    assert evaluated["rows"] == xcom["train.profile"]["metrics"]["eval_rows"] > 0
    assert evaluated["auc_difference"] <= 1e-4, evaluated
    assert xcom["evaluate.metrics"] == str(train_dir / "evaluation" / "metrics.json")

    # the first model is published: its evaluated AUC, into the runs directory's published/
    assert xcom["publish.decision"]["published"] is True
    assert xcom["publish.decision"]["auc"] == evaluated["auc"]
    assert xcom["publish.decision"]["measured_by"] == "evaluate"
    published = runs / "published" / "dlrm_daily_retraining"
    assert (published / "CURRENT").read_text().strip() == xcom["publish.return_value"]

    # Day 2: planned from day 1's profile, through the connection.
    assert (second["state"], second["tasks"]) == ("success", later), log[-6000:]
    assert second["tasks"]["publish"] in {"success", "skipped"}
    plan_2 = second["xcom"]["plan.return_value"]
    assert plan_2["stage"] == "warm_start"
    assert run_1 in plan_2["similar_jobs"]
    run_2 = second["xcom"]["train.run_id"]
    assert run_2 != run_1
    assert json.loads((runs / "dlrm_daily_retraining/2026-11-21/train/plan.json").read_text()) == (
        plan_2
    )
    assert _history_ids(f"sqlite:///{history}") == {run_1, run_2}
    assert not Path(f"{history}.decoy").exists()

    # Day 3: a bad job spec fails the plan task with the validation message; nothing written.
    assert bad["state"] == "failed"
    assert bad["tasks"] == {
        "plan": "failed",
        "train": "upstream_failed",
        "evaluate": "upstream_failed",
        "record": "upstream_failed",
        "publish": "upstream_failed",
    }
    assert "job_spec: bogus: unknown key" in log
    assert _history_ids(f"sqlite:///{history}") == {run_1, run_2}
    assert not (runs / "dlrm_daily_retraining" / "2026-11-22").exists()

    if not rerun:
        return
    # Day 1 again (a re-run of a logical date that succeeded): trained again under the same
    # run id, and the history still holds one run for that date: the new attempt.
    (again,) = rest
    assert (again["state"], again["tasks"]) == ("success", later), log[-6000:]
    assert again["xcom"]["train.run_id"] == run_1
    assert _history_ids(f"sqlite:///{history}") == {run_1, run_2}
    with open_history(f"sqlite:///{history}") as store:
        stored = store.get(run_1)
    assert stored.started_at == again["xcom"]["train.profile"]["started_at"]
    assert stored.started_at != xcom["train.profile"]["started_at"]
    assert json.loads((train_dir / "profile.json").read_text())["started_at"] == stored.started_at
