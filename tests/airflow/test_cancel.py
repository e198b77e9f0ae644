"""A user's "mark failed" on a deferred train task, on the local backend, for real: the trigger's
``on_kill`` stops the job master and every pod process it started, and the master records the
run as cancelled (not lost, not "failed"); running the task again resumes it."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

pytest.importorskip("airflow.sdk", reason="the airflow extra is not installed")

import psutil
from airflow.sdk.exceptions import TaskDeferred

from airflow_plugin.operators import ElasticTrainOperator
from airflow_plugin.triggers import STOP_BOUND_S, ElasticTrainTrigger, master_alive
from dlrover_kfp.history import open_history
from tests.airflow.jobs import tiny_job

JOB = tiny_job("dlrm-cancel", "dlrm-airflow-cancel", rows=2_000_000)


#: A progress line of the master's log once a step was trained (step > 0).
TRAINING = re.compile(r"\]\s+[\d,]+/[\d,]+ samples .* step [1-9]")


def _job_processes(run_dir: Path) -> list[psutil.Process]:
    """Every live process of the run: its command line or working directory is in run_dir."""
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd", "status"]):
        info = proc.info
        if info["status"] == psutil.STATUS_ZOMBIE:
            continue
        text = " ".join(info["cmdline"] or []) + " " + str(info["cwd"] or "")
        if str(run_dir) in text:
            found.append(proc)
    return found


def test_marking_the_deferred_task_failed_stops_the_job_and_records_a_cancel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = f"sqlite:///{tmp_path}/history.db"
    run_dir = tmp_path / "run"
    operator = ElasticTrainOperator(
        task_id="train",
        job_spec=JOB,
        output_dir=str(run_dir),
        history_conn_id=None,
        history_url=history,
        deferrable=True,
        sample_interval=0.5,
    )
    ti = mock.MagicMock(dag_id="dlrm", task_id="train", map_index=-1)
    context: dict[str, Any] = {"ti": ti, "run_id": "manual__1", "ds_nodash": "20261120"}
    with pytest.raises(TaskDeferred) as deferred:
        operator.execute(context)  # type: ignore[arg-type]
    trigger = deferred.value.trigger
    assert isinstance(trigger, ElasticTrainTrigger)
    trigger.task_instance = SimpleNamespace(
        dag_id="dlrm", task_id="train", run_id="manual__1", map_index=-1
    )
    monkeypatch.setattr(
        "airflow.sdk.execution_time.task_runner.RuntimeTaskInstance.get_task_states",
        lambda **query: {"manual__1": {"train": "failed"}},
    )
    try:
        deadline = time.monotonic() + 120
        log = run_dir / "master.log"
        while not TRAINING.search(log.read_text() if log.exists() else ""):
            assert master_alive(trigger.pid, trigger.create_time), log.read_text()[-3000:]
            assert time.monotonic() < deadline, "training never started"
            time.sleep(0.5)
        assert len(_job_processes(run_dir)) >= 3  # the master, a PS, a worker

        started = time.monotonic()
        asyncio.run(trigger.on_kill())
        stopped_in = time.monotonic() - started
        time.sleep(1.0)
        assert not master_alive(trigger.pid, trigger.create_time)
        assert _job_processes(run_dir) == [], [p.info for p in _job_processes(run_dir)]
        assert stopped_in < STOP_BOUND_S
    finally:
        for proc in _job_processes(run_dir):
            proc.kill()

    with open_history(history) as store:
        (summary,) = store.list()
        profile = store.get(summary.run_id)
    assert profile.outcome.status == "cancelled"
    assert profile.outcome.reason.endswith("was marked failed by a user")
    assert 0 < profile.outcome.samples_processed < 1_800_000
    # the run stays resumable: running the task again goes on from its checkpoint
    assert (run_dir / "run.json").exists()
    print(f"\nmark failed: the job stopped and recorded in {stopped_in:.1f}s")
