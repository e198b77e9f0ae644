"""The example pipeline (examples/kfp/pipeline.py) run by KFP itself, offline (``kfp.local``,
a subprocess per task): prepare -> plan -> train on the prepared Parquet Dataset -> evaluate
(model.onnx on the held-out rows) -> record -> publish gate, on the local backend.

Day 1 trains on the Dataset (not on the spec's own data.path, which names nothing) and
publishes the first model. Day 2 trains a deliberately worse model on the same data (a learning
rate so small that the model stays near its random start) and the gate refuses it: the task
succeeds with "refused", and the published model is still day 1's.
"""

# No `from __future__ import annotations`: KFP reads the pipeline's annotations as types.
import json
import runpy
from collections.abc import Iterator
from pathlib import Path

import pytest
from kfp import local

from dlrover_kfp.history import open_history

#: Two runs of the whole pipeline, each training 20,000 rows: 24 s unloaded, 74 s loaded (the
#: suite's budget has no room for it); tests/kfp/test_data_and_publish.py covers its parts fast.
pytestmark = pytest.mark.long

ROOT = Path(__file__).resolve().parents[2]

#: The small example job, reading Parquet from a path that does not exist: only the Dataset
#: input can make it train.
JOB = (
    (ROOT / "examples" / "jobs" / "small.yaml")
    .read_text(encoding="utf-8")
    .replace(
        "data: {format: synthetic, rows: 200000, seed: 1}",
        "data: {format: parquet, path: /nonexistent/clicks/}",
    )
    .replace("name: dlrm-small", "name: kfp-example")
    .replace("scenario: dlrm-daily-small", "scenario: kfp-example-test")
)
assert "format: parquet" in JOB and "name: kfp-example" in JOB
#: The same job with a learning rate that leaves the model near its random initialisation.
WORSE_JOB = JOB.replace("learning_rate: 0.05", "learning_rate: 0.0001")
assert WORSE_JOB != JOB

ROWS = 20_000


@pytest.fixture
def kfp_local(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "pipeline-root"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root))
    yield root


def _artifact(root: Path, task: str, name: str) -> Path:
    """The newest output ``name`` of ``task`` under the local pipeline root."""
    found = sorted(root.glob(f"*/{task}/{name}"), key=lambda p: p.stat().st_mtime)
    assert found, f"no {task}/{name} under {root}"
    return found[-1]


def test_the_example_pipeline_trains_on_its_dataset_publishes_and_refuses_a_worse_model(
    kfp_local: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLROVER_KFP_HISTORY_URL", f"sqlite:///{tmp_path / 'history.db'}")
    published = tmp_path / "published"
    pipeline = runpy.run_path(str(ROOT / "examples" / "kfp" / "pipeline.py"))
    run = pipeline["dlrm_daily_retraining"]
    arguments = {"backend": "local", "claim": "", "published": str(published)}

    # Day 1: the Dataset (two Parquet files) replaces the spec's data.path.
    run(job_spec=JOB, example_rows=ROWS, **arguments)
    data = _artifact(kfp_local, "prepare-example-data", "data")
    assert sorted(p.name for p in data.iterdir()) == ["part-00000.parquet", "part-00001.parquet"]
    profile = json.loads(_artifact(kfp_local, "elastic-train", "profile").read_text("utf-8"))
    assert profile["outcome"]["status"] == "succeeded"
    assert profile["outcome"]["samples_processed"] == ROWS * 9 // 10  # 10% held out
    # evaluate: model.onnx (onnxruntime) on the rows train held out of the same Dataset
    evaluation = json.loads(_artifact(kfp_local, "evaluate-model", "evaluation").read_text())
    assert evaluation["rows"] == ROWS // 10
    assert evaluation["auc_difference"] <= 1e-4, evaluation
    decision = json.loads(_artifact(kfp_local, "publish-model", "decision").read_text("utf-8"))
    assert decision["published"] is True, decision
    assert decision["last_auc"] is None
    assert decision["measured_by"] == "evaluate" and decision["auc"] == evaluation["auc"]
    first_auc = decision["auc"]
    assert 0.6 < first_auc <= 1.0, decision
    current = (published / "CURRENT").read_text("utf-8").strip()
    assert current == decision["version"]
    served = published / "versions" / current
    assert {"model.json", "model.pt"} <= {p.name for p in served.iterdir()}
    trained_auc = json.loads((served / "model.json").read_text("utf-8"))["metrics"]["auc"]
    assert abs(trained_auc - first_auc) <= 1e-4
    # published with its evaluation: the next run is judged against the evaluated AUC
    assert json.loads((served / "evaluation.json").read_text("utf-8"))["auc"] == first_auc
    with open_history(f"sqlite:///{tmp_path / 'history.db'}") as store:
        assert [s.run_id for s in store.list()] == [profile["run_id"]]  # recorded

    # Day 2: a worse model; the gate refuses it, and day 1's model stays published.
    run(job_spec=WORSE_JOB, example_rows=ROWS, **arguments)
    refused = json.loads(_artifact(kfp_local, "publish-model", "decision").read_text("utf-8"))
    assert refused["published"] is False, refused
    assert refused["last_auc"] == first_auc
    assert refused["auc"] < first_auc - 0.005, refused
    assert refused["reason"].startswith(f"refused: AUC {refused['auc']:.6f} < "), refused
    assert (published / "CURRENT").read_text("utf-8").strip() == current
    assert [p.name for p in (published / "versions").iterdir()] == [current]
    with open_history(f"sqlite:///{tmp_path / 'history.db'}") as store:
        assert len(store.list()) == 2  # the worse run is recorded all the same
