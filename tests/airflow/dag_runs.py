"""Run the example DAG with ``dag.test()`` for the integration test, in a process of its own.

Airflow reads its configuration when it is first imported, so the test starts this script
with the environment set up (AIRFLOW_HOME, the DAGs folder, the metadata database, the history
URL, the runs directory) after ``airflow db migrate``. It runs the DAG once per
``--run DATE=SPEC_FILE`` in order, each with ``{"job_spec": <the file's text>}`` (and every
``--conf KEY=VALUE``) as the run's configuration, and prints, as the last line of stdout, one
JSON object per run: the DAG run's state, each task's state and the XComs the test checks.

With ``--connection-from-run N`` the history connection ``dlrover_kfp_history`` is configured
(as an ``AIRFLOW_CONN_*`` variable pointing at ``$DLROVER_KFP_HISTORY_URL``'s file) from the
N-th run on, and ``$DLROVER_KFP_HISTORY_URL`` is pointed at a decoy file: a warm start then
proves that the connection, not the variable, named the store.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from airflow.models.xcom import XComModel
from airflow.utils.session import create_session

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "airflow" / "dlrm_daily_retraining.py"
TASKS = ("plan", "train", "record", "publish")
XCOMS = (
    ("plan", "return_value"),
    ("train", "run_id"),
    ("train", "profile"),
    ("train", "profile_path"),
    ("train", "report"),
    ("train", "_link_RunReportLink"),
    ("record", "return_value"),
    ("train", "model"),
    ("evaluate", "return_value"),
    ("evaluate", "metrics"),
    ("publish", "decision"),
    ("publish", "return_value"),
)


def _load_dag() -> Any:
    spec = importlib.util.spec_from_file_location("dlrm_daily_retraining", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def _xcoms(run_id: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    with create_session() as session:
        for task_id, key in XCOMS:
            row = session.scalars(
                XComModel.get_many(
                    run_id=run_id, key=key, task_ids=task_id, dag_ids="dlrm_daily_retraining"
                )
            ).first()
            if row is not None:
                found[f"{task_id}.{key}"] = XComModel.deserialize_value(row)
    return found


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", action="append", required=True, metavar="DATE=SPEC_FILE")
    parser.add_argument("--connection-from-run", type=int, default=0)
    parser.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="a param of every run"
    )
    args = parser.parse_args()
    dag = _load_dag()
    history_url = os.environ["DLROVER_KFP_HISTORY_URL"]
    results = []
    for index, item in enumerate(args.run, start=1):
        if args.connection_from_run and index >= args.connection_from_run:
            os.environ["AIRFLOW_CONN_DLROVER_KFP_HISTORY"] = json.dumps(
                {"conn_type": "dlrover_kfp_history", "extra": {"url": history_url}}
            )
            os.environ["DLROVER_KFP_HISTORY_URL"] = history_url + ".decoy"
        date, spec_file = item.split("=", 1)
        logical = datetime.fromisoformat(date).replace(tzinfo=UTC)
        job_spec = Path(spec_file).read_text(encoding="utf-8")
        print(f"=== dag.test {date}", file=sys.stderr, flush=True)
        conf = dict(item.split("=", 1) for item in args.conf)
        run = dag.test(logical_date=logical, run_conf={"job_spec": job_spec, **conf})
        states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
        results.append(
            {"date": date, "state": str(run.state), "tasks": states, "xcom": _xcoms(run.run_id)}
        )
    sys.stdout.flush()
    print("\n" + json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
