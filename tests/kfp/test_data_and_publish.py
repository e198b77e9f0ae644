"""elastic_train's Dataset input, the data-preparation component and the publish gate, on the
glue (no KFP run): fast. tests/kfp/test_example_pipeline.py runs the example pipeline with them
through ``kfp.local`` (``pytest -m long``)."""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow.parquet as pq
import pytest
import yaml
from kfp import compiler
from kfp.components import load_component_from_file

from components import glue
from components.build import HERE
from components.glue import KfpRun, data_location

ROOT = Path(__file__).resolve().parents[2]
SMALL_JOB = ROOT / "examples" / "jobs" / "small.yaml"
PARQUET_JOB = SMALL_JOB.read_text(encoding="utf-8").replace(
    "data: {format: synthetic, rows: 200000, seed: 1}",
    "data: {format: parquet, path: /nonexistent/clicks/, rows: 200000}",
)
KFP_RUN = KfpRun("3f2c9a1e-0b6d-4d57-9a0e-5c1b7e8d2f10", "elastic-train")


def test_the_new_components_load_with_the_interface_users_wire() -> None:
    for name in ("plan_resources", "elastic_train"):
        spec = load_component_from_file(str(HERE / f"{name}.yaml")).component_spec
        assert spec.inputs["data"].optional  # a pipeline without a Dataset still trains
        assert spec.inputs["data"].type == "system.Dataset@0.0.1"
    prepare = load_component_from_file(str(HERE / "prepare_example_data.yaml")).component_spec
    assert set(prepare.inputs) == {"job_spec", "rows", "seed"}
    assert set(prepare.outputs) == {"data"}
    publish = load_component_from_file(str(HERE / "publish_model.yaml")).component_spec
    assert set(publish.inputs) == {"model", "published", "max_auc_drop", "evaluation"}
    assert publish.inputs["max_auc_drop"].default == 0.005
    assert publish.inputs["evaluation"].optional  # without it, the train step's AUC
    assert set(publish.outputs) == {"decision", "Output"}
    score = load_component_from_file(str(HERE / "score_model.yaml")).component_spec
    assert set(score.inputs) == {"model", "data", "data_format"}
    assert set(score.outputs) == {"predictions"}
    evaluate = load_component_from_file(str(HERE / "evaluate_model.yaml")).component_spec
    assert set(evaluate.inputs) == {"model", "data"}
    assert set(evaluate.outputs) == {"predictions", "metrics", "evaluation"}


def test_the_example_pipeline_prepares_trains_on_the_dataset_records_and_publishes(
    tmp_path: Path,
) -> None:
    module = runpy.run_path(str(ROOT / "examples" / "kfp" / "pipeline.py"))
    compiler.Compiler().compile(module["dlrm_daily_retraining"], str(tmp_path / "ex.yaml"))
    pipeline, platform = yaml.safe_load_all((tmp_path / "ex.yaml").read_text(encoding="utf-8"))
    tasks = pipeline["root"]["dag"]["tasks"]
    assert set(tasks) == {
        "prepare-example-data", "plan-resources", "elastic-train", "evaluate-model",
        "record-profile", "publish-model",
    }  # fmt: skip
    for task in ("plan-resources", "elastic-train"):  # the plan sizes the data train reads
        data = tasks[task]["inputs"]["artifacts"]["data"]["taskOutputArtifact"]
        assert data == {"outputArtifactKey": "data", "producerTask": "prepare-example-data"}
    model = tasks["publish-model"]["inputs"]["artifacts"]["model"]["taskOutputArtifact"]
    assert model == {"outputArtifactKey": "model", "producerTask": "elastic-train"}
    # evaluate reads the model and the Dataset it was trained on; the gate judges its AUC
    evaluate = tasks["evaluate-model"]["inputs"]["artifacts"]
    assert evaluate["data"]["taskOutputArtifact"]["producerTask"] == "prepare-example-data"
    assert evaluate["model"]["taskOutputArtifact"]["producerTask"] == "elastic-train"
    judged = tasks["publish-model"]["inputs"]["artifacts"]["evaluation"]["taskOutputArtifact"]
    assert judged == {"outputArtifactKey": "evaluation", "producerTask": "evaluate-model"}
    assert set(tasks["record-profile"]["dependentTasks"]) == {"elastic-train", "evaluate-model"}
    assert set(tasks["publish-model"]["dependentTasks"]) == {
        "elastic-train", "evaluate-model", "record-profile",
    }  # fmt: skip
    assert tasks["publish-model"]["cachingOptions"] == {}  # off
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert executors["exec-publish-model"]["pvcMount"][0]["mountPath"] == "/var/lib/dlrover-kfp"


@pytest.mark.parametrize(
    ("backend", "uri", "expected"),
    [
        ("local", "minio://mlpipeline/v2/artifacts/r/prepare/data", "/local/copy"),
        ("kubernetes", "minio://mlpipeline/v2/artifacts/r/data", "s3://mlpipeline/v2/artifacts/r/data"),
        ("kubernetes", "gs://bucket/root/data", "gs://bucket/root/data"),
        ("kubernetes", "s3://bucket/root/data", "s3://bucket/root/data"),
    ],
)  # fmt: skip
def test_a_dataset_is_read_where_the_jobs_processes_can_reach_it(
    backend: str, uri: str, expected: str
) -> None:
    assert data_location("/local/copy", uri, backend) == expected


def test_a_dataset_uri_the_pods_cannot_read_is_refused_naming_it() -> None:
    with pytest.raises(glue.UserInputError, match=r"data: the Dataset's URI '/tmp/x' is not"):
        data_location("/tmp/x", "/tmp/x", "kubernetes")


def _train_spec(tmp_path: Path, job_spec: str, data_path: str) -> Any:
    """The job spec the train glue hands the train step (the step itself not run)."""
    from dlrover_kfp.steps.plan import plan_step  # noqa: PLC0415

    plan_path = tmp_path / "plan.json"
    plan = plan_step(str(SMALL_JOB), f"sqlite:///{tmp_path / 'h.db'}", "local").plan
    plan_path.write_text(glue.to_json(plan), encoding="utf-8")
    seen = []

    def fake_train_step(job_spec: str, options_for: Any, **kwargs: Any) -> Any:
        seen.append(job_spec)
        raise RuntimeError("stop here")

    with (
        mock.patch("dlrover_kfp.steps.train.train_step", fake_train_step),
        pytest.raises(RuntimeError, match="stop here"),
    ):
        glue.elastic_train(
            job_spec, str(plan_path), "", "local", "", KFP_RUN, "m", "p", "r", data_path=data_path
        )
    return yaml.safe_load(seen[0])


def test_the_dataset_replaces_the_specs_data_path_and_its_row_count(tmp_path: Path) -> None:
    spec = _train_spec(tmp_path, PARQUET_JOB, "/pipeline-root/prepare/data")
    assert spec["data"]["path"] == "/pipeline-root/prepare/data"
    assert spec["data"]["format"] == "parquet"
    assert spec["data"].get("rows") is None  # the spec's count was of other data
    assert spec["name"] == "dlrm-small"


def test_a_dataset_for_synthetic_data_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        glue.elastic_train(
            str(SMALL_JOB), "plan.json", "", "local", "", KFP_RUN, "m", "p", "r", data_path="/d"
        )
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "dlrover-kfp: error: data: '/d' given, but the job spec's data is synthetic" in err


def test_prepare_example_data_writes_parquet_with_criteo_columns(tmp_path: Path) -> None:
    names = glue.prepare_example_data(PARQUET_JOB, str(tmp_path / "data"), 3000, 1)
    assert names == ["part-00000.parquet", "part-00001.parquet"]
    table = pq.read_table(tmp_path / "data")
    assert table.num_rows == 3000
    assert table.column_names == ["label"] + [f"I{i}" for i in range(1, 14)] + [
        f"C{i}" for i in range(1, 27)
    ]
    first = pq.ParquetFile(tmp_path / "data" / names[0])
    assert first.metadata.num_row_groups == 2  # 1,500 rows in groups of 1,000: shards


def test_publish_model_writes_its_decision_and_a_refusal_is_not_a_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def model(name: str, auc: float) -> str:
        path = tmp_path / name
        path.mkdir()
        (path / "model.json").write_text(json.dumps({"metrics": {"auc": auc, "eval_rows": 9}}))
        (path / "model.pt").write_bytes(name.encode())
        return str(path)

    published = str(tmp_path / "published")
    first = glue.publish_model(model("good", 0.75), published, 0.005, str(tmp_path / "d1.json"))
    worse = glue.publish_model(model("worse", 0.70), published, 0.005, str(tmp_path / "d2.json"))
    assert (first.published, worse.published) == (True, False)
    written = json.loads((tmp_path / "d2.json").read_text())
    assert written["published"] is False and written["last_auc"] == 0.75
    assert "publish gate: refused: AUC 0.700000 < 0.745000" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        glue.publish_model(str(tmp_path / "none"), published, 0.005, str(tmp_path / "d3.json"))
    assert exc.value.code == 2
    assert "model.json: no such file" in capsys.readouterr().err


def test_the_plan_sizes_the_dataset_not_the_specs_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without rows in the spec the plan reads the Parquet footers: of the Dataset when given
    (the spec's own path names nothing here, and planning from it fails naming it)."""
    job = PARQUET_JOB.replace(", rows: 200000}", "}")
    glue.prepare_example_data(job, str(tmp_path / "data"), 3000, 1)
    url = f"sqlite:///{tmp_path / 'h.db'}"
    paths = (str(tmp_path / "plan.json"), str(tmp_path / "plan.md"))
    with pytest.raises(SystemExit) as exc:
        glue.plan_resources(job, url, "local", KFP_RUN.run_id, *paths)
    assert exc.value.code == 2
    assert "/nonexistent/clicks/" in capsys.readouterr().err
    out = glue.plan_resources(
        job, url, "local", KFP_RUN.run_id, *paths, data_path=str(tmp_path / "data")
    )
    assert out.stage == "cold_start"
