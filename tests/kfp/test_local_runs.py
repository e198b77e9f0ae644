"""The components and the pipeline run by KFP itself, offline (``kfp.local``, a subprocess per
task in this interpreter: ``SubprocessRunner(use_venv=False)``).

The pipeline is composed from the committed component YAML (what users load), trains a small
synthetic job on the local backend twice into one history store: the second run must start from
a warm-start plan drawn from the first run's profile.
"""

# No `from __future__ import annotations`: KFP reads the pipeline's annotations as types.
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kfp import compiler, dsl, local
from kfp.components import load_component_from_file

from components.build import HERE
from dlrover_kfp.history import open_history

pytestmark = pytest.mark.slow

#: A job that trains in a few seconds: the small example's model on 20,000 synthetic rows.
JOB = (
    (Path(__file__).resolve().parents[2] / "examples" / "jobs" / "small.yaml")
    .read_text(encoding="utf-8")
    .replace("rows: 200000", "rows: 20000")
    .replace("name: dlrm-small", "name: kfp-local")
    .replace("scenario: dlrm-daily-small", "scenario: kfp-local-test")
)
assert "rows: 20000" in JOB and "name: kfp-local" in JOB

plan_resources = load_component_from_file(str(HERE / "plan_resources.yaml"))
elastic_train = load_component_from_file(str(HERE / "elastic_train.yaml"))
record_profile = load_component_from_file(str(HERE / "record_profile.yaml"))


@dsl.pipeline(name="retrain-from-committed-components")
def retrain(job_spec: str, history_url: str) -> dsl.Metrics:
    """A user's own pipeline from the committed YAML: plan -> train (local pods) -> record."""
    planned = plan_resources(job_spec=job_spec, history_url=history_url, backend="local")
    trained = elastic_train(
        job_spec=job_spec, plan=planned.outputs["plan"], history_url=history_url, backend="local"
    )
    record_profile(profile=trained.outputs["profile"], history_url=history_url)
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
    assert len(_profiles(url)) == 2


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
