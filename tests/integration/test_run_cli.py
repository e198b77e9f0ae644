"""``dlrover-kfp run`` as a user meets it: progress, outputs, history, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlrover_kfp.cli.main import main
from dlrover_kfp.steps.spec import load_job_spec

JOB = """\
name: cli-run
scenario: ads-ctr
model: {embedding_dim: 8, table_sizes: [1000, 50, 7, 3000], bottom_mlp: [16, 8], top_mlp: [16, 1]}
data: {format: synthetic, rows: 20000, seed: 4}
training: {batch_size: 256}
resources:
  workers: {count: 1, cpu: 1, memory: 2Gi}
  ps: {count: 1, cpu: 1, memory: 2Gi}
"""


@pytest.mark.parametrize(
    "mode",
    [
        # 13 s; the static run itself is tested in test_static_run.py, its flags here below
        pytest.param(["--static"], marks=pytest.mark.long, id="static"),
        pytest.param([], id="elastic"),
    ],
)
def test_run_writes_profile_model_and_history_with_progress(
    tmp_path: Path, mode: list[str]
) -> None:
    (tmp_path / "job.yaml").write_text(JOB)
    history = tmp_path / "history.db"
    argv = [sys.executable, "-m", "dlrover_kfp.cli.main"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    flags = [*mode, "--backend", "local", "--output-dir", "out", "--history", str(history)]
    done = subprocess.run(
        [*argv, "run", "--job", "job.yaml", *flags, "--sample-interval", "0.3"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "samples/s" in done.stderr  # progress while it runs
    summary = json.loads(done.stdout)
    assert summary["outcome"]["status"] == "succeeded"
    assert summary["outcome"]["samples_processed"] == 18000
    assert 0.5 < summary["metrics"]["auc"] <= 1.0
    assert (tmp_path / "out" / "profile.json").is_file()
    assert (tmp_path / "out" / "model" / "model.pt").is_file()
    model = json.loads((tmp_path / "out" / "model" / "model.json").read_text())
    assert model["metrics"]["auc"] == summary["metrics"]["auc"]
    # No shared-memory snapshot outlives the run (the pods' own directories included).
    left = [n for _, _, names in os.walk("/dev/shm") for n in names if summary["run_id"] in n]
    assert not left, left
    profile = json.loads((tmp_path / "out" / "profile.json").read_text())
    # Elastic by default: Stage 1 planned the start (no similar jobs yet: the spec's own
    # resources, a cold start); --static keeps them as the user's.
    assert profile["plans"][0]["stage"] == ("manual" if mode else "cold_start")

    listed = subprocess.run(
        [*argv, "history", "list", "--history", str(history)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    assert summary["run_id"] in listed.stdout


@pytest.mark.parametrize(
    ("edit", "flags", "message"),
    [
        (("  ps: {count: 1, cpu: 1, memory: 2Gi}\n", ""), ["--static"], "resources.ps"),
        (
            ("{format: synthetic, rows: 20000, seed: 4}", '{format: criteo, path: "no/*.tsv"}'),
            ["--static"],
            "data.path",
        ),
        (
            ("{format: synthetic, rows: 20000, seed: 4}", '{format: criteo, path: "*.yaml"}'),
            ["--static"],
            "model.table_sizes",
        ),
        (None, ["--static", "--sample-interval", "0"], "--sample-interval"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_starts_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    edit: tuple[str, str] | None,
    flags: list[str],
    message: str,
) -> None:
    text = JOB if edit is None else JOB.replace(*edit)
    job = tmp_path / "job.yaml"
    job.write_text(text)
    out_dir = tmp_path / "out"
    code = main(["run", "--job", str(job), "--output-dir", str(out_dir), *flags])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert message in err
    assert len(err.strip().splitlines()) == 1, err
    assert not (out_dir / "logs").exists() or not any((out_dir / "logs").iterdir())


@pytest.mark.parametrize(
    ("plan", "flags", "message"),
    [
        ("missing.json", [], "missing.json: no such file"),
        ("job.yaml", [], "job.yaml: "),  # a job spec is not a plan
        ("plan.json", ["--static"], "--plan: not with --static"),
    ],
)
def test_a_bad_plan_is_one_line_exit_2_and_starts_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    plan: str,
    flags: list[str],
    message: str,
) -> None:
    (tmp_path / "job.yaml").write_text(JOB)
    (tmp_path / "plan.json").write_text(
        '{"workers": {"count": 1, "cpu": 1, "memory_mb": 1024}, '
        '"ps": {"count": 1, "cpu": 1, "memory_mb": 1024}, "stage": "cold_start", "reason": "x"}'
    )
    out_dir = tmp_path / "out"
    code = main(
        ["run", "--job", str(tmp_path / "job.yaml"), "--output-dir", str(out_dir),
         "--plan", str(tmp_path / plan), *flags]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert message in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not out_dir.exists()


def test_a_spec_file_s_relative_data_path_is_relative_to_the_file_not_the_working_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The CLI and the steps load a spec file by one rule (steps.spec.load_spec_file): started
    # from another directory, with the spec named by a relative path, both look for the data
    # beside the spec. No file matches, so the run stops at once, naming where it looked.
    specs = tmp_path / "specs"
    specs.mkdir()
    criteo = '{format: criteo, path: "days/*.tsv"}'
    (specs / "job.yaml").write_text(
        JOB.replace("{format: synthetic, rows: 20000, seed: 4}", criteo)
    )
    monkeypatch.chdir(tmp_path)

    code = main(["run", "--job", "specs/job.yaml", "--output-dir", "out", "--static"])

    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert f"(looked for {str(specs / 'days' / '*.tsv')!r})" in err, err
    loaded = load_job_spec("specs/job.yaml")  # the train step's and the Airflow operator's
    assert loaded.base_dir == specs
