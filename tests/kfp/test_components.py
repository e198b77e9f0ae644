"""The KFP components: committed YAML, interfaces, and what each does (without KFP running it).

A component's body only hands its parameters and artifact paths to components/glue.py, so the
behaviour is tested here on the glue; tests/kfp/test_local_runs.py runs the components and the
pipeline through ``kfp.local``.
"""

from __future__ import annotations

import runpy
from pathlib import Path
from unittest import mock

import pytest
import yaml
from kfp import compiler
from kfp.components import load_component_from_file

from components.build import HERE, TARGETS, compile_all
from components.glue import plan_resources, record_profile
from dlrover_kfp.cli.main import main
from dlrover_kfp.core.documents import to_json
from dlrover_kfp.history import open_history
from tests.factories import make_profile

SMALL_JOB = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "small.yaml"


def test_the_committed_yaml_is_what_compile_writes(tmp_path: Path) -> None:
    compile_all(tmp_path)
    for name in TARGETS:
        fresh = (tmp_path / name).read_text(encoding="utf-8")
        committed = (HERE / name).read_text(encoding="utf-8")
        assert fresh == committed, f"components/{name} is stale: run `dlrover-kfp compile`"


def test_dlrover_kfp_compile_writes_every_file(tmp_path: Path) -> None:
    assert main(["compile", "--output-dir", str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(TARGETS)


@pytest.mark.parametrize(
    ("name", "inputs", "outputs"),
    [
        ("plan_resources", {"job_spec", "history_url", "backend"}, {"plan", "report"}),
        (
            "elastic_train",
            {"job_spec", "plan", "history_url", "backend", "claim"},
            {"model", "metrics", "profile", "report"},
        ),
        ("record_profile", {"profile", "history_url"}, {"summary"}),
    ],
)
def test_each_component_loads_with_the_interface_users_wire(
    name: str, inputs: set[str], outputs: set[str]
) -> None:
    component = load_component_from_file(str(HERE / f"{name}.yaml"))
    spec = component.component_spec
    assert set(spec.inputs or {}) == inputs
    assert set(spec.outputs or {}) == outputs
    assert spec.implementation.container.image.startswith("dlrover-kfp:")


def test_the_pipeline_takes_job_spec_and_history_url_and_mounts_the_claim() -> None:
    doc = yaml.safe_load_all((HERE / "elastic_dlrm_pipeline.yaml").read_text(encoding="utf-8"))
    pipeline, platform = list(doc)
    params = pipeline["root"]["inputDefinitions"]["parameters"]
    assert {"job_spec", "history_url"} <= set(params)
    assert "defaultValue" not in params["job_spec"]  # required
    tasks = pipeline["root"]["dag"]["tasks"]
    assert set(tasks) == {"plan-resources", "elastic-train", "record-profile"}
    assert all(t["cachingOptions"] == {} for t in tasks.values())  # caching off
    train = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-elastic-train"]
    assert train["pvcMount"][0]["mountPath"] == "/var/lib/dlrover-kfp"
    assert {e["name"] for e in train["fieldPathAsEnv"]} == {"POD_IP", "POD_NAME", "POD_UID"}


def _count(url: str) -> int:
    store = open_history(url)
    try:
        return store.count()
    finally:
        store.close()


def test_plan_resources_writes_the_plan_and_a_markdown_report(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    out = plan_resources(
        str(SMALL_JOB), url, "local", str(tmp_path / "plan.json"), str(tmp_path / "plan.md")
    )
    assert out.stage == "cold_start"
    assert out.similar_jobs == ()
    assert '"stage": "cold_start"' in (tmp_path / "plan.json").read_text(encoding="utf-8")
    report = (tmp_path / "plan.md").read_text(encoding="utf-8")
    assert "# Resource plan for `dlrm-small`" in report
    assert "| worker | 1 | 0.5 |" in report


def test_a_bad_job_spec_fails_plan_resources_with_the_key_named_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    bad = SMALL_JOB.read_text(encoding="utf-8").replace("epochs: 1", "epochs: 1, epoch: 3")
    with pytest.raises(SystemExit) as exc:
        plan_resources(bad, url, "local", str(tmp_path / "plan.json"), str(tmp_path / "r.md"))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "dlrover-kfp: error: job_spec: training.epoch" in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "plan.json").exists()
    assert not (tmp_path / "h.db").exists()


def test_record_profile_records_a_run_once_and_summarises_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    profile = make_profile(run_id="run-1")
    (tmp_path / "profile.json").write_text(to_json(profile), encoding="utf-8")
    first = record_profile(str(tmp_path / "profile.json"), url, str(tmp_path / "s.md"))
    again = record_profile(str(tmp_path / "profile.json"), url, str(tmp_path / "s.md"))
    assert (first.run_id, first.new, again.new) == ("run-1", True, False)
    assert _count(url) == 1
    assert "was already recorded" in (tmp_path / "s.md").read_text(encoding="utf-8")


def test_a_profile_that_is_not_one_fails_record_profile_and_records_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    (tmp_path / "profile.json").write_text('{"run_id": "x"}', encoding="utf-8")
    with pytest.raises(SystemExit) as exc:
        record_profile(str(tmp_path / "profile.json"), url, str(tmp_path / "s.md"))
    assert exc.value.code == 2
    assert "profile.json" in capsys.readouterr().err
    assert not (tmp_path / "h.db").exists() or _count(url) == 0


def test_the_example_pipeline_compiles_with_the_master_wiring(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "kfp" / "pipeline.py"
    module = runpy.run_path(str(example))
    compiler.Compiler().compile(module["dlrm_daily_retraining"], str(tmp_path / "ex.yaml"))
    pipeline, platform = yaml.safe_load_all((tmp_path / "ex.yaml").read_text(encoding="utf-8"))
    assert set(pipeline["root"]["dag"]["tasks"]) == {
        "plan-resources", "elastic-train", "record-profile"
    }  # fmt: skip
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert executors["exec-elastic-train"]["pvcMount"][0]["mountPath"] == "/var/lib/dlrover-kfp"


def test_a_report_that_cannot_be_drawn_is_logged_and_the_train_step_goes_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from components import glue  # noqa: PLC0415

    with mock.patch(
        "dlrover_kfp.report.render_run_report", autospec=True, side_effect=ValueError("no <b>")
    ):
        page = glue._report_page(make_profile(run_id="run-1"))
    assert "run-1 could not be drawn: ValueError(&#x27;no &lt;b&gt;&#x27;)" in page
    assert "Traceback" in capsys.readouterr().err  # logged, not swallowed
