"""The example DAG on a real Airflow deployment: scheduler, dag-processor, triggerer and
api-server as processes (``tests/airflow/deployment.py``), LocalExecutor, SQLite, runs started
and tasks marked through the REST API, as a platform team and its users do.

What only a deployment shows: the train task really defers to the triggerer (another process)
and resumes in a new worker process; a user marking the deferred task failed stops the job and
records the run as cancelled; a triggerer restarted mid-run neither stops the job nor loses the
wait. The DAG file is *copied* into the DAGs folder, as a user deploys it.

Opt-in (``pytest -m long tests/airflow/test_deployment.py``): it starts Airflow's four
components and trains four times; docs/airflow.md states its time.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest

pytest.importorskip("airflow.sdk", reason="the airflow extra is not installed")

from dlrover_kfp.history import open_history
from tests.airflow.deployment import AirflowDeployment, processes_under, tail, wait_until

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_DAG = ROOT / "examples" / "airflow" / "dlrm_daily_retraining.py"
DAG_ID = "dlrm_daily_retraining"
OK = {"plan": "success", "train": "success", "record": "success"}
#: How long after a user marks the deferred train task failed no process of its job may live.
CANCEL_BOUND_S = 10.0
#: A progress line of the master's log: the job is training (step > 0).
PROGRESS = re.compile(r"\]\s+[\d,]+/[\d,]+ samples .* step [1-9]")


def job_spec(epochs: int) -> str:
    """A small DLRM: about 3.5 s of training per epoch on one core of the 2-core machine."""
    return f"""\
name: dlrm-deployed
scenario: dlrm-airflow-deployment-test
model: {{embedding_dim: 8, table_sizes: [100, 50, 200, 30], dense_features: 4,
        bottom_mlp: [16, 8], top_mlp: [16, 1]}}
data: {{format: synthetic, rows: 200000, seed: 1}}
training: {{batch_size: 256, epochs: {epochs}, learning_rate: 0.05}}
resources:
  limits: {{cpu: 2, memory: 4Gi}}
  workers: {{count: 1, cpu: 0.5, memory: 1Gi}}
  ps: {{count: 1, cpu: 0.5, memory: 1Gi}}
elastic: {{min_workers: 1, max_workers: 1, max_ps: 1}}
"""


#: Days 1 and 2: about 10 s of training. Day 4: about 35 s, so that it is still training when
#: the triggerer has stopped. Day 3 (cancelled): minutes, were it not stopped, so that a job
#: gone 10 s after the cancel cannot be a job that just ended.
SHORT_JOB = job_spec(epochs=3)
MEDIUM_JOB = job_spec(epochs=10)
LONG_JOB = job_spec(epochs=40)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[AirflowDeployment]:
    env = {
        "DLROVER_KFP_HISTORY_URL": f"sqlite:///{tmp_path / 'history.db'}",
        "DLROVER_KFP_RUNS_DIR": str(tmp_path / "runs"),
    }
    with AirflowDeployment(tmp_path, [EXAMPLE_DAG], env) as airflow:
        airflow.wait_for_dag(DAG_ID)
        yield airflow


def _history(url: str) -> dict[str, str]:
    """Run id -> outcome status of every run in the history."""
    store = open_history(url)
    try:
        return {summary.run_id: summary.status for summary in store.list(limit=1000)}
    finally:
        store.close()


def _run_dir(tmp_path: Path, day: str) -> Path:
    return tmp_path / "runs" / DAG_ID / day / "train"


def _master(run_dir: Path) -> tuple[int, float]:
    data = json.loads((run_dir / "master.json").read_text())
    return int(data["pid"]), float(data["create_time"])


def _same_process_alive(pid: int, create_time: float) -> bool:
    try:
        proc = psutil.Process(pid)
        same = abs(float(proc.create_time()) - create_time) < 0.05
        return same and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_training(airflow: AirflowDeployment, run_id: str, run_dir: Path) -> tuple[int, float]:
    """Wait until train is deferred and its master is training; the master's pid and time."""
    airflow.wait_task(DAG_ID, run_id, "train", ["deferred"], timeout=300)

    def training() -> bool | None:
        log = run_dir / "master.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        return True if PROGRESS.search(text) else None

    wait_until(f"the master of {run_id} to train", training, timeout=180, every=0.5)
    pid, create_time = _master(run_dir)
    assert _same_process_alive(pid, create_time), airflow.task_log(DAG_ID, run_id, "train")
    return pid, create_time


def _run_to_success(airflow: AirflowDeployment, day: str, spec: str) -> tuple[str, str]:
    """Trigger ``day``'s run and wait for it to succeed; its DAG run id and training run id."""
    dag_run = airflow.api.trigger(DAG_ID, f"{day}T00:00:00+00:00", {"job_spec": spec})
    airflow.wait_run(DAG_ID, dag_run, ["success"], timeout=400)
    states = {task: airflow.api.task_state(DAG_ID, dag_run, task) for task in OK}
    assert states == OK
    return dag_run, str(airflow.api.xcom(DAG_ID, dag_run, "train", "run_id"))


@pytest.mark.long
@pytest.mark.timeout(1500)
def test_the_example_dag_on_a_deployment(deployment: AirflowDeployment, tmp_path: Path) -> None:
    airflow = deployment
    history = f"sqlite:///{tmp_path / 'history.db'}"

    # Days 1 and 2: trained through the triggerer; day 2 warm-starts from day 1.
    dag_run_1, run_1 = _run_to_success(airflow, "2026-11-20", SHORT_JOB)
    dag_run_2, run_2 = _run_to_success(airflow, "2026-11-21", SHORT_JOB)
    plan_2 = airflow.api.xcom(DAG_ID, dag_run_2, "plan")
    assert plan_2["stage"] == "warm_start"
    assert run_1 in plan_2["similar_jobs"]
    assert set(_history(history)) == {run_1, run_2}

    # Day 3: the user marks the deferred train task failed while its job trains.
    run_dir_3 = _run_dir(tmp_path, "2026-11-22")
    dag_run_3 = airflow.api.trigger(DAG_ID, "2026-11-22T00:00:00+00:00", {"job_spec": LONG_JOB})
    master = psutil.Process(_wait_training(airflow, dag_run_3, run_dir_3)[0])
    job = {(p.pid, p.create_time()) for p in [master, *master.children(recursive=True)]}
    job |= {(p.pid, p.create_time()) for p in processes_under(run_dir_3)}
    assert len(job) >= 3, f"the master, a PS and a worker: {job}"  # a real job was looked at
    airflow.api.mark_task(DAG_ID, dag_run_3, "train", "failed")
    marked = time.monotonic()

    def job_gone() -> bool | None:
        alive = [p for p in job if _same_process_alive(*p)] + processes_under(run_dir_3)
        return True if not alive else None

    try:
        wait_until("the job to stop", job_gone, timeout=CANCEL_BOUND_S, every=0.25)
    except TimeoutError:
        alive = [p for p in job if _same_process_alive(*p)]
        left = [(p.pid, p.info["cmdline"]) for p in processes_under(run_dir_3)]
        pytest.fail(
            f"{CANCEL_BOUND_S:.0f} s after train was marked failed its job still runs: "
            f"{alive} {left}\n{airflow.task_log(DAG_ID, dag_run_3, 'train')}\n{airflow.logs()}"
        )
    stopped_after = time.monotonic() - marked
    time.sleep(max(0.0, CANCEL_BOUND_S - stopped_after))
    assert not processes_under(run_dir_3)
    cancelled = {
        run: status for run, status in _history(history).items() if run not in (run_1, run_2)
    }
    assert list(cancelled.values()) == ["cancelled"], (cancelled, airflow.logs())
    airflow.wait_run(DAG_ID, dag_run_3, ["failed"], timeout=120)
    assert airflow.api.task_state(DAG_ID, dag_run_3, "train") == "failed"
    print(f"day 3: the job stopped {stopped_after:.1f} s after train was marked failed")

    # Day 4: the triggerer restarts while train is deferred; the job runs on, the new
    # triggerer takes the wait over and the run succeeds with the same master.
    run_dir_4 = _run_dir(tmp_path, "2026-11-23")
    dag_run_4 = airflow.api.trigger(DAG_ID, "2026-11-23T00:00:00+00:00", {"job_spec": MEDIUM_JOB})
    master_4 = _wait_training(airflow, dag_run_4, run_dir_4)
    stopping = time.monotonic()
    assert airflow.stop_component("triggerer") == 0, airflow.logs()
    stop_s = time.monotonic() - stopping
    assert _same_process_alive(*master_4), (
        f"the job ended while the triggerer stopped ({stop_s:.1f} s)\n"
        + tail(run_dir_4 / "master.log")
        + airflow.task_log(DAG_ID, dag_run_4, "train")
    )
    assert airflow.api.task_state(DAG_ID, dag_run_4, "train") == "deferred"
    airflow.start_component("triggerer")
    airflow.wait_run(DAG_ID, dag_run_4, ["success"], timeout=400)
    print(f"day 4: the triggerer took {stop_s:.1f} s to stop; the run succeeded after its restart")
    assert _master(run_dir_4) == master_4  # the same master: not restarted
    # the old triggerer ran the trigger, the new one took it over and fired its event
    old, new = airflow.trigger_logs(DAG_ID, dag_run_4, "train")
    assert "Trigger fired event" not in old.read_text()
    assert "Trigger fired event" in new.read_text()
    assert json.loads((run_dir_4 / "master-exit.json").read_text()) == {"exit_code": 0}
    run_4 = str(airflow.api.xcom(DAG_ID, dag_run_4, "train", "run_id"))
    runs = _history(history)
    assert set(runs) == {run_1, run_2, *cancelled, run_4}
    assert len(runs) == 4
    assert runs[run_4] == "succeeded"

    # Day 1 again: the user clears train and record of the day that succeeded. It trains again
    # under the same run id, and the history still holds one run for that day: the new one.
    with open_history(history) as store:
        first_start = store.get(run_1).started_at
    airflow.api.clear(DAG_ID, dag_run_1, ["train", "record"])
    airflow.wait_run(DAG_ID, dag_run_1, ["success"], timeout=400)
    assert str(airflow.api.xcom(DAG_ID, dag_run_1, "train", "run_id")) == run_1
    assert _history(history) == runs  # the same four runs
    with open_history(history) as store:
        assert store.get(run_1).started_at != first_start  # the re-run's profile
    print("day 1 cleared and run again: one run for it in the history, the new attempt")
