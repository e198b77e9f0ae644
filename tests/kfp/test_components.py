"""The KFP components: committed YAML, interfaces, and what each does (without KFP running it).

A component's body only hands its parameters and artifact paths to components/glue.py, so the
behaviour is tested here on the glue; tests/kfp/test_local_runs.py runs the components and the
pipeline through ``kfp.local``.
"""

from __future__ import annotations

import re
import runpy
from pathlib import Path
from typing import Any
from unittest import mock

import kfp
import pytest
import yaml
from kfp import compiler
from kfp.components import load_component_from_file

from components.build import HERE, TARGETS, compile_all
from components.elastic_dlrm import IMAGE, STEP_RESOURCES, TRAIN_RETRY
from components.glue import KfpRun, plan_resources, record_profile
from dlrover_kfp.cli.main import main
from dlrover_kfp.core.documents import to_json
from dlrover_kfp.history import open_history
from tests.factories import make_profile

#: What a pipeline passes as dsl.PIPELINE_JOB_ID_PLACEHOLDER, resolved.
KFP_RUN = "3f2c9a1e-0b6d-4d57-9a0e-5c1b7e8d2f10"
PASSWORD = "S3cretPassw0rd"

SMALL_JOB = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "small.yaml"


def test_the_committed_yaml_is_what_compile_writes(tmp_path: Path) -> None:
    # The committed YAML is compiled by constraints.txt's kfp; other kfp versions (.ci/bounds)
    # compile it differently (the sdkVersion stamp, kfp-kubernetes's optional fields).
    first = HERE / next(iter(TARGETS))
    stamp = re.search(r"^sdkVersion: kfp-(\S+)$", first.read_text(encoding="utf-8"), re.M)
    if stamp is None or stamp.group(1) != kfp.__version__:
        pytest.skip(f"components/*.yaml are compiled by another kfp than {kfp.__version__}")
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
        (
            "plan_resources",
            {"job_spec", "history_url", "backend", "kfp_run_id", "data"},
            {"plan", "report"},
        ),
        (
            "elastic_train",
            {
                "job_spec",
                "plan",
                "history_url",
                "backend",
                "claim",
                "kfp_run_id",
                "kfp_task_name",
                "data",
            },
            {"model", "metrics", "profile", "report"},
        ),
        ("record_profile", {"profile", "history_url", "kfp_run_id"}, {"summary"}),
    ],
)
def test_each_component_loads_with_the_interface_users_wire(
    name: str, inputs: set[str], outputs: set[str]
) -> None:
    component = load_component_from_file(str(HERE / f"{name}.yaml"))
    spec = component.component_spec
    assert set(spec.inputs or {}) == inputs
    assert set(spec.outputs or {}) == outputs
    assert spec.implementation.container.image == IMAGE
    assert IMAGE == "registry.invalid/dlrover-kfp:0.1.0"  # fully qualified, documented default
    # Uncacheable by itself: a run-unique input without a default (a default placeholder
    # would reach the component unresolved, the same every day).
    assert spec.inputs["kfp_run_id"].default is None
    assert not spec.inputs["kfp_run_id"].optional
    assert spec.inputs["history_url"].default == ""  # the URL comes from the Secret


def _pipeline() -> tuple[dict, dict]:
    doc = yaml.safe_load_all((HERE / "elastic_dlrm_pipeline.yaml").read_text(encoding="utf-8"))
    pipeline, platform = list(doc)
    return pipeline, platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def test_the_pipeline_takes_job_spec_and_history_url_and_mounts_the_claim() -> None:
    pipeline, executors = _pipeline()
    params = pipeline["root"]["inputDefinitions"]["parameters"]
    assert {"job_spec", "history_url", "history_secret", "train_cpu", "train_memory"} <= set(params)
    assert "defaultValue" not in params["job_spec"]  # required
    assert params["history_secret"]["defaultValue"] == "dlrover-kfp-history"
    tasks = pipeline["root"]["dag"]["tasks"]
    assert set(tasks) == {"plan-resources", "elastic-train", "record-profile"}
    train = executors["exec-elastic-train"]
    assert train["pvcMount"][0]["mountPath"] == "/var/lib/dlrover-kfp"
    assert {e["name"] for e in train["fieldPathAsEnv"]} == {"POD_IP", "POD_NAME", "POD_UID"}


def test_every_task_reads_the_history_url_from_the_secret() -> None:
    _, executors = _pipeline()
    for name in ("exec-plan-resources", "exec-elastic-train", "exec-record-profile"):
        assert executors[name]["secretAsEnv"] == [
            {
                "keyToEnv": [{"envVar": "DLROVER_KFP_HISTORY_URL", "secretKey": "url"}],
                "optional": False,
                "secretNameParameter": {"componentInputParameter": "history_secret"},
            }
        ], name


def test_no_task_can_be_a_cache_hit() -> None:
    pipeline, _ = _pipeline()
    for name, task in pipeline["root"]["dag"]["tasks"].items():
        assert task["cachingOptions"] == {}, name  # off in the pipeline
        # and a run-unique input, which KFP's driver resolves into the cache key
        run_id = task["inputs"]["parameters"]["kfp_run_id"]
        assert run_id == {"runtimeValue": {"constant": "{{$.pipeline_job_uuid}}"}}, name
    train = pipeline["root"]["dag"]["tasks"]["elastic-train"]["inputs"]["parameters"]
    assert train["kfp_task_name"] == {"runtimeValue": {"constant": "{{$.pipeline_task_name}}"}}


def test_each_task_has_cpu_and_memory_requests_and_limits_and_the_image() -> None:
    pipeline, _ = _pipeline()
    containers = {
        name: spec["container"] for name, spec in pipeline["deploymentSpec"]["executors"].items()
    }
    assert set(containers) == {"exec-plan-resources", "exec-elastic-train", "exec-record-profile"}
    for name in ("exec-plan-resources", "exec-record-profile"):
        assert {
            k: v for k, v in containers[name]["resources"].items() if k.startswith("resource")
        } == {
            "resourceCpuRequest": STEP_RESOURCES.cpu_request,
            "resourceCpuLimit": STEP_RESOURCES.cpu_limit,
            "resourceMemoryRequest": STEP_RESOURCES.memory_request,
            "resourceMemoryLimit": STEP_RESOURCES.memory_limit,
        }, name
    train = containers["exec-elastic-train"]
    cpu = "{{$.inputs.parameters['pipelinechannel--train_cpu']}}"
    memory = "{{$.inputs.parameters['pipelinechannel--train_memory']}}"
    assert train["resources"] == {
        "resourceCpuRequest": cpu,
        "resourceCpuLimit": cpu,
        "resourceMemoryRequest": memory,
        "resourceMemoryLimit": memory,
    }
    params = pipeline["root"]["inputDefinitions"]["parameters"]
    assert (params["train_cpu"]["defaultValue"], params["train_memory"]["defaultValue"]) == (
        "2",
        "4Gi",
    )
    for name, container in containers.items():
        assert container["image"] == IMAGE, name
    # the worker and PS pods get the image the master runs
    assert train["env"] == [{"name": "DLROVER_KFP_IMAGE", "value": IMAGE}]


def test_train_is_retried_and_plan_and_record_are_not() -> None:
    pipeline, _ = _pipeline()
    tasks = pipeline["root"]["dag"]["tasks"]
    assert tasks["elastic-train"]["retryPolicy"] == {
        "maxRetryCount": TRAIN_RETRY.num_retries,
        "backoffDuration": TRAIN_RETRY.backoff_duration,
        "backoffFactor": TRAIN_RETRY.backoff_factor,
        "backoffMaxDuration": TRAIN_RETRY.backoff_max_duration,
    }
    assert TRAIN_RETRY.num_retries == 2
    assert "retryPolicy" not in tasks["plan-resources"]
    assert "retryPolicy" not in tasks["record-profile"]


def test_compile_image_builds_every_file_for_that_image(tmp_path: Path) -> None:
    image = "registry.example.com/ml/dlrover-kfp:0.1.0"
    assert main(["compile", "--output-dir", str(tmp_path), "--image", image]) == 0
    text = (tmp_path / "elastic_dlrm_pipeline.yaml").read_text(encoding="utf-8")
    assert IMAGE not in text
    pipeline, _ = yaml.safe_load_all(text)
    train = pipeline["deploymentSpec"]["executors"]["exec-elastic-train"]["container"]
    assert train["image"] == image
    assert train["env"] == [{"name": "DLROVER_KFP_IMAGE", "value": image}]
    component = load_component_from_file(str(tmp_path / "plan_resources.yaml"))
    assert component.component_spec.implementation.container.image == image


@pytest.mark.parametrize(
    ("image", "says"),
    [
        ("dlrover-kfp:0.1.0", "names no registry"),
        ("ml/dlrover-kfp:0.1.0", "names no registry"),
        ("registry.example.com/ml/dlrover-kfp", "has no tag"),
        ("registry.example.com/ML/Dlrover:0.1", "is not an image reference"),
    ],
)
def test_compile_refuses_an_image_that_is_not_fully_qualified(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], image: str, says: str
) -> None:
    assert main(["compile", "--output-dir", str(tmp_path), "--image", image]) == 2
    err = capsys.readouterr().err
    assert f"--image: {image!r} {says}" in err, err
    assert not list(tmp_path.iterdir())  # nothing written


def test_compile_takes_the_image_from_the_environment_and_checks_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DLROVER_KFP_IMAGE", "dlrover-kfp:0.1.0")
    assert main(["compile", "--output-dir", str(tmp_path)]) == 2
    assert "DLROVER_KFP_IMAGE: 'dlrover-kfp:0.1.0' names no registry" in capsys.readouterr().err
    monkeypatch.setenv("DLROVER_KFP_IMAGE", "localhost:5000/dlrover-kfp:dev")
    assert main(["compile", "--output-dir", str(tmp_path)]) == 0
    text = (tmp_path / "elastic_train.yaml").read_text(encoding="utf-8")
    assert "image: localhost:5000/dlrover-kfp:dev" in text


def _count(url: str) -> int:
    store = open_history(url)
    try:
        return store.count()
    finally:
        store.close()


def test_plan_resources_writes_the_plan_and_a_markdown_report(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    out = plan_resources(
        str(SMALL_JOB),
        url,
        "local",
        KFP_RUN,
        str(tmp_path / "plan.json"),
        str(tmp_path / "plan.md"),
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
        plan_resources(
            bad, url, "local", KFP_RUN, str(tmp_path / "plan.json"), str(tmp_path / "r.md")
        )
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
    first = record_profile(str(tmp_path / "profile.json"), url, KFP_RUN, str(tmp_path / "s.md"))
    again = record_profile(str(tmp_path / "profile.json"), url, KFP_RUN, str(tmp_path / "s.md"))
    assert (first.run_id, first.new, again.new) == ("run-1", True, False)
    assert _count(url) == 1
    assert "was already recorded" in (tmp_path / "s.md").read_text(encoding="utf-8")


def test_a_profile_that_is_not_one_fails_record_profile_and_records_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    (tmp_path / "profile.json").write_text('{"run_id": "x"}', encoding="utf-8")
    with pytest.raises(SystemExit) as exc:
        record_profile(str(tmp_path / "profile.json"), url, KFP_RUN, str(tmp_path / "s.md"))
    assert exc.value.code == 2
    assert "profile.json" in capsys.readouterr().err
    assert not (tmp_path / "h.db").exists() or _count(url) == 0


def test_the_example_pipeline_compiles_with_the_master_wiring(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "kfp" / "pipeline.py"
    module = runpy.run_path(str(example))
    compiler.Compiler().compile(module["dlrm_daily_retraining"], str(tmp_path / "ex.yaml"))
    pipeline, platform = yaml.safe_load_all((tmp_path / "ex.yaml").read_text(encoding="utf-8"))
    assert set(pipeline["root"]["dag"]["tasks"]) == {
        "prepare-example-data", "plan-resources", "elastic-train", "evaluate-model",
        "record-profile", "publish-model",
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


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql+psycopg://dlrover:{PASSWORD}@db.example:5432/history",
        f"postgresql://dlrover@db.example/history?password={PASSWORD}&sslmode=require",
        f"postgresql://dlrover:{PASSWORD}@db.example:no-port/history",  # unparseable
    ],
)
def test_a_history_url_parameter_with_a_password_is_refused_without_showing_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        plan_resources(
            str(SMALL_JOB), url, "local", KFP_RUN, str(tmp_path / "p.json"), str(tmp_path / "r")
        )
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert "dlrover-kfp: error: history_url: 'postgresql" in err, err
    assert "has a password" in err and "Kubernetes Secret" in err, err
    assert PASSWORD not in out + err
    assert not (tmp_path / "p.json").exists()
    with pytest.raises(SystemExit) as exc:
        record_profile(str(tmp_path / "profile.json"), url, KFP_RUN, str(tmp_path / "s.md"))
    assert exc.value.code == 2
    assert PASSWORD not in "".join(capsys.readouterr())


@pytest.mark.parametrize("kfp_run_id", ["", "  ", "{{$.pipeline_job_uuid}}"])
def test_an_unresolved_kfp_run_id_is_refused_naming_the_placeholder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kfp_run_id: str
) -> None:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    with pytest.raises(SystemExit) as exc:
        plan_resources(
            str(SMALL_JOB), url, "local", kfp_run_id, str(tmp_path / "p.json"), str(tmp_path / "r")
        )
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"kfp_run_id: {kfp_run_id!r}; pass dsl.PIPELINE_JOB_ID_PLACEHOLDER" in err, err


def _train_options(tmp_path: Path, kfp: KfpRun, backend: str = "local") -> Any:
    """The RunOptions the train glue hands the train step (the step itself not run)."""
    from components import glue  # noqa: PLC0415
    from dlrover_kfp.steps.documents import to_json as doc_json  # noqa: PLC0415
    from dlrover_kfp.steps.plan import plan_step  # noqa: PLC0415

    plan_path = tmp_path / "plan.json"
    if not plan_path.exists():
        plan = plan_step(str(SMALL_JOB), f"sqlite:///{tmp_path / 'h.db'}", "local").plan
        plan_path.write_text(doc_json(plan), encoding="utf-8")
    seen = []

    def fake_train_step(job_spec: str, options_for: Any, **kwargs: Any) -> Any:
        seen.append(options_for(tmp_path))
        raise RuntimeError("stop here")

    with (
        mock.patch("dlrover_kfp.steps.train.train_step", fake_train_step),
        pytest.raises(RuntimeError, match="stop here"),
    ):
        glue.elastic_train(str(SMALL_JOB), str(plan_path), "", backend, "", kfp, "m", "p", "r")
    return seen[0]


def test_a_retried_train_task_resumes_under_the_same_run_id(tmp_path: Path) -> None:
    first = _train_options(tmp_path, KfpRun(KFP_RUN, "elastic-train"))
    retry = _train_options(tmp_path, KfpRun(KFP_RUN, "elastic-train"))
    other_task = _train_options(tmp_path, KfpRun(KFP_RUN, "elastic-train-2"))
    other_run = _train_options(tmp_path, KfpRun("another-run", "elastic-train"))
    assert first.resume and retry.resume  # a retry goes on from the last checkpoint
    assert first.run_id == retry.run_id
    assert first.run_id.startswith("dlrm-small-")
    assert len({first.run_id, other_task.run_id, other_run.run_id}) == 3


def test_a_run_directory_is_named_by_the_kfp_run_and_keeps_the_first_attempts_id(
    tmp_path: Path,
) -> None:
    from dlrover_kfp.steps.train import orchestrated_run  # noqa: PLC0415

    keys = (KFP_RUN, "elastic-train")
    day_1 = orchestrated_run(tmp_path, "dlrm-small", keys, now=1_795_000_000.0)
    assert day_1.output_dir.parent == tmp_path
    assert "2026" in day_1.run_id and "2026" not in day_1.output_dir.name
    # a retry after midnight: the same directory, and (once the first attempt left its
    # profile there) the first attempt's id, not one with the new date
    day_2 = orchestrated_run(tmp_path, "dlrm-small", keys, now=1_795_000_000.0 + 86_400)
    assert day_2.output_dir == day_1.output_dir
    assert day_2.run_id != day_1.run_id
    day_1.output_dir.mkdir()
    (day_1.output_dir / "profile.json").write_text(
        to_json(make_profile(run_id=day_1.run_id)), encoding="utf-8"
    )
    again = orchestrated_run(tmp_path, "dlrm-small", keys, now=1_795_000_000.0 + 86_400)
    assert again == day_1
    other = orchestrated_run(tmp_path, "dlrm-small", (KFP_RUN, "elastic-train-2"))
    assert other.output_dir != day_1.output_dir


@pytest.mark.parametrize(
    "template",
    [
        "postgresql+psycopg://dlrover:{pw}@127.0.0.1:{port}/history",
        "postgresql+psycopg://dlrover@127.0.0.1:{port}/history?password={pw}&sslmode=disable",
    ],
)
def test_a_history_url_from_the_secret_with_an_unreachable_server_fails_without_its_password(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    template: str,
) -> None:
    pytest.importorskip("psycopg", reason="a PostgreSQL URL needs the postgres extra")
    import socket  # noqa: PLC0415

    with socket.socket() as probe:  # a loopback port where nothing listens: refused at once
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    caplog.set_level("DEBUG")
    monkeypatch.setenv("DLROVER_KFP_HISTORY_URL", template.format(pw=PASSWORD, port=port))
    with pytest.raises(SystemExit) as exc:
        plan_resources(
            str(SMALL_JOB), "", "local", KFP_RUN, str(tmp_path / "p.json"), str(tmp_path / "r")
        )
    assert exc.value.code == 75  # temporary: the task may be retried
    out, err = capsys.readouterr()
    assert f"127.0.0.1:{port}" in err and "Connection refused" in err, err
    assert PASSWORD not in out + err + caplog.text


def test_the_job_master_gives_its_pods_the_pipelines_image_and_refuses_a_bare_name() -> None:
    from dlrover_kfp.errors import UserInputError  # noqa: PLC0415
    from dlrover_kfp.steps.train import in_cluster_options  # noqa: PLC0415

    pod = {"POD_IP": "10.0.0.7"}
    default = in_cluster_options(claim="c", namespace="ml", environ=pod)
    assert default.image == IMAGE
    mine = "registry.example.com/ml/dlrover-kfp@sha256:" + "0" * 64
    given = in_cluster_options(
        claim="c", namespace="ml", environ={**pod, "DLROVER_KFP_IMAGE": mine}
    )
    assert given.image == mine
    with pytest.raises(UserInputError, match=r"DLROVER_KFP_IMAGE: 'dlrover-kfp:0.1.0' names no"):
        in_cluster_options(
            claim="c", namespace="ml", environ={**pod, "DLROVER_KFP_IMAGE": "dlrover-kfp:0.1.0"}
        )
