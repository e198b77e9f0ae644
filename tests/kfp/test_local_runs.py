"""The components and the pipeline run by KFP itself, offline (``kfp.local``, a subprocess per
task in this interpreter: ``SubprocessRunner(use_venv=False)``).

The pipeline is composed from the committed component YAML (what users load), trains a small
synthetic job on the local backend twice into one history store: the second run must start from
a warm-start plan drawn from the first run's profile.

A history URL with a password reaches the tasks the way the pipeline's Kubernetes Secret gives
it, ``$DLROVER_KFP_HISTORY_URL`` in the task's environment: ``kfp.local`` ignores the platform
config (``use_secret_as_env``), so the test sets the variable itself, which the subprocess
tasks inherit. The password must be in no line the run prints: the tasks' output, KFP's own
log (its executor prints every input parameter) and this process's logging.
"""

# No `from __future__ import annotations`: KFP reads the pipeline's annotations as types.
import json
import logging
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from kfp import compiler, dsl, local
from kfp.components import load_component_from_file

from components.build import HERE
from dlrover_kfp.history import open_history

pytestmark = pytest.mark.slow

#: A job that trains in a few seconds: the small example's model on 20,000 synthetic rows, its
#: pods at one core each (a pod imports torch, ~2.2 s of CPU, before it trains: twice that at
#: the example's half a core, in every run of these tests).
JOB = (
    (Path(__file__).resolve().parents[2] / "examples" / "jobs" / "small.yaml")
    .read_text(encoding="utf-8")
    .replace("rows: 200000", "rows: 20000")
    .replace("name: dlrm-small", "name: kfp-local")
    .replace("scenario: dlrm-daily-small", "scenario: kfp-local-test")
    .replace("{count: 1, cpu: 0.5, memory: 2Gi}", "{count: 1, cpu: 1, memory: 2Gi}")
)
assert "rows: 20000" in JOB and "name: kfp-local" in JOB and "cpu: 0.5" not in JOB

plan_resources = load_component_from_file(str(HERE / "plan_resources.yaml"))
elastic_train = load_component_from_file(str(HERE / "elastic_train.yaml"))
record_profile = load_component_from_file(str(HERE / "record_profile.yaml"))


@dsl.pipeline(name="retrain-from-committed-components")
def retrain(job_spec: str, history_url: str) -> dsl.Metrics:
    """A user's own pipeline from the committed YAML: plan -> train (local pods) -> record,
    with KFP's default caching (on): the run-unique ``kfp_run_id`` keeps every task uncached."""
    run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
    planned = plan_resources(
        job_spec=job_spec, history_url=history_url, backend="local", kfp_run_id=run_id
    )
    trained = elastic_train(
        job_spec=job_spec,
        plan=planned.outputs["plan"],
        history_url=history_url,
        backend="local",
        kfp_run_id=run_id,
        kfp_task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
    )
    record_profile(profile=trained.outputs["profile"], history_url=history_url, kfp_run_id=run_id)
    return trained.outputs["metrics"]


@pytest.fixture
def kfp_local(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "pipeline-root"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root))
    yield root


def _profiles(url: str) -> list[str]:
    store = open_history(url)
    try:
        return [s.run_id for s in store.list(limit=10)]
    finally:
        store.close()


def _artifact(root: Path, task: str, name: str) -> Path:
    """The newest output ``name`` of ``task`` under the local pipeline root."""
    found = sorted(root.glob(f"*/{task}/{name}"), key=lambda p: p.stat().st_mtime)
    assert found, f"no {task}/{name} under {root}"
    return found[-1]


def test_the_committed_pipeline_trains_and_records_and_a_composed_one_warm_starts_from_it(
    kfp_local: Path, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'history.db'}"

    # Run 1: the whole committed pipeline, components/elastic_dlrm_pipeline.yaml.
    whole = load_component_from_file(str(HERE / "elastic_dlrm_pipeline.yaml"))
    whole(job_spec=JOB, history_url=url, backend="local", claim="")
    runs = _profiles(url)
    assert len(runs) == 1
    # the run id derives from the KFP run and task (the same for a retry), dated for people
    assert re.fullmatch(r"kfp-local-\d{8}-[0-9a-f]{12}", runs[0]), runs
    plan_1 = json.loads(_artifact(kfp_local, "plan-resources", "plan").read_text("utf-8"))
    assert plan_1["stage"] == "cold_start"
    profile = json.loads(_artifact(kfp_local, "elastic-train", "profile").read_text("utf-8"))
    assert profile["run_id"] == runs[0]
    assert profile["outcome"]["samples_processed"] == 18_000  # 20,000 rows less 10% held out
    assert any(_artifact(kfp_local, "elastic-train", "model").iterdir())
    html = _artifact(kfp_local, "elastic-train", "report").read_text("utf-8")
    assert html.lstrip().lower().startswith("<!doctype html")
    assert "recorded" in _artifact(kfp_local, "record-profile", "summary").read_text("utf-8")

    # Run 2: a user's pipeline composed from the committed component YAML; it compiles, runs,
    # and starts from the plan Stage 1 draws from run 1's profile.
    compiler.Compiler().compile(retrain, str(tmp_path / "retrain.yaml"))
    assert load_component_from_file(str(tmp_path / "retrain.yaml")).name == (
        "retrain-from-committed-components"
    )
    metrics = retrain(job_spec=JOB, history_url=url).output
    assert set(metrics.metadata) >= {"loss", "auc", "jct_seconds", "samples_processed"}
    assert 0.5 < metrics.metadata["auc"] <= 1.0
    assert metrics.metadata["samples_processed"] == 18_000
    plan_2 = json.loads(_artifact(kfp_local, "plan-resources", "plan").read_text("utf-8"))
    assert plan_2["stage"] == "warm_start", plan_2
    assert plan_2["similar_jobs"] == runs, plan_2
    assert len(_profiles(url)) == 2  # another KFP run: another run id


def test_a_bad_job_spec_fails_the_pipeline_with_the_message_and_writes_no_history(
    kfp_local: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'history.db'}"
    bad = JOB.replace("batch_size: 512", "batch_size: -512")
    with pytest.raises(RuntimeError, match="plan-resources"):
        retrain(job_spec=bad, history_url=url)
    out, err = capfd.readouterr()
    assert "dlrover-kfp: error: job_spec: training.batch_size" in out + err
    assert not (tmp_path / "history.db").exists() or _profiles(url) == []


#: The password of a history URL; a test fails if it is in any line a run prints.
PASSWORD = "S3cretPassw0rd"


def _refusing_port() -> int:
    """A loopback port where nothing listens: the connection is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _printed(capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> str:
    out, err = capfd.readouterr()
    return "\n".join((out, err, caplog.text))


# 12 s: opt-in to hold the default suite under 10 minutes. By default: a password given as the
# history_url parameter is refused without being printed (below), and a local run writes its
# job secret nowhere (tests/security/test_secrets.py).
@pytest.mark.long
def test_a_password_in_the_history_secret_is_in_no_log(
    kfp_local: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With $DLROVER_KFP_TEST_POSTGRES_URL (CI: .ci/postgres.sh) the committed pipeline runs
    and records on that server; without it, on a server that refuses the connection, the plan
    task fails with a clear message. Either way its password is printed nowhere."""
    pytest.importorskip("psycopg", reason="a PostgreSQL URL needs the postgres extra")
    caplog.set_level(logging.DEBUG)
    server = os.environ.get("DLROVER_KFP_TEST_POSTGRES_URL", "").strip()
    whole = load_component_from_file(str(HERE / "elastic_dlrm_pipeline.yaml"))
    if server:
        from sqlalchemy import make_url  # noqa: PLC0415

        password = make_url(server).password
        assert password, "the test server's URL has a password"
        monkeypatch.setenv("DLROVER_KFP_HISTORY_URL", server)
        whole(job_spec=JOB, backend="local", claim="")
        profile = json.loads(_artifact(kfp_local, "elastic-train", "profile").read_text("utf-8"))
        store = open_history(server)
        try:
            assert store.get(profile["run_id"]).run_id == profile["run_id"]  # recorded there
        finally:
            store.close()
    else:
        password = PASSWORD
        url = f"postgresql+psycopg://dlrover:{PASSWORD}@127.0.0.1:{_refusing_port()}/history"
        monkeypatch.setenv("DLROVER_KFP_HISTORY_URL", url)
        with pytest.raises(RuntimeError, match="plan-resources"):
            whole(job_spec=JOB, backend="local", claim="")
    printed = _printed(capfd, caplog)
    assert password not in printed
    if not server:
        assert "dlrover-kfp: temporary failure, retry: " in printed, printed
        assert "postgresql+psycopg://dlrover:***@127.0.0.1:" in printed, printed


def test_a_history_url_parameter_with_a_password_is_refused(
    kfp_local: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Refused by the component, in a message without the password. KFP's executor has
    printed the parameter by then (it logs every input before the component runs): that is
    why a password must not be a parameter, and every line that shows it is KFP's."""
    caplog.set_level(logging.DEBUG)
    url = f"postgresql+psycopg://dlrover:{PASSWORD}@db.example:5432/history"
    with pytest.raises(RuntimeError, match="plan-resources"):
        plan_resources(
            job_spec=JOB, history_url=url, backend="local", kfp_run_id="run-with-a-password"
        )
    printed = _printed(capfd, caplog)
    assert (
        "dlrover-kfp: error: history_url: 'postgresql+psycopg://dlrover:***@db.example:5432/"
        "history' has a password" in printed
    ), printed
    leaks = [line for line in printed.splitlines() if PASSWORD in line]
    assert all(re.fullmatch(r'\s*"history_url": "[^"]*",?', line) for line in leaks), leaks
