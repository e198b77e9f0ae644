"""The command line end to end: plan, schema, quickstart, and how bad input is reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlrover_kfp.cli.main import build_parser, main
from dlrover_kfp.core.documents import to_json
from dlrover_kfp.core.plan import Stage
from tests.factories import make_profile

GOOD = """\
name: ctr-daily
scenario: ads-ctr
model: {table_sizes: [1000, 2000, 3000]}
data: {format: synthetic, rows: 200000}
training: {batch_size: 512}
resources:
  limits: {cpu: 128, memory: 512Gi}
  workers: {count: 8, cpu: 8, memory: 16Gi}
  ps: {count: 4, cpu: 8, memory: 32Gi}
"""


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_cold_then_warm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = write(tmp_path, "job.yaml", GOOD)
    history = str(tmp_path / "h.db")
    code, out, _ = run(capsys, "plan", "--job", job, "--history", history)
    assert code == 0
    assert json.loads(out)["stage"] == Stage.COLD_START

    for k in range(5):
        profile = make_profile(
            run_id=f"ctr-{k}",
            table_sizes=(1000, 2000, 3000),
            started_at="2026-11-01T00:00:00Z",
            workers=8,
            worker_cpu=8.0,
            worker_memory_mb=16384,
            ps=4,
            ps_cpu=8.0,
            ps_memory_mb=32768,
            used_fraction=0.3,
        )
        path = write(tmp_path, f"p{k}.json", to_json(profile))
        code, out, _ = run(capsys, "record", "--profile", path, "--history", history)
        assert code == 0, out

    output = tmp_path / "plan.json"
    code, out, _ = run(capsys, "plan", "--job", job, "--history", history, "--output", str(output))
    assert code == 0 and out == ""
    plan = json.loads(output.read_text())
    assert plan["stage"] == Stage.WARM_START
    assert sorted(plan["similar_jobs"]) == [f"ctr-{k}" for k in range(5)]
    used = (
        plan["workers"]["count"] * plan["workers"]["cpu"] + plan["ps"]["count"] * plan["ps"]["cpu"]
    )
    assert used < 0.5 * (8 * 8 + 4 * 8)


BAD_INPUTS = {
    "malformed.yaml": ("name: x\nmodel: [1,\n", "malformed.yaml:3:1: malformed YAML"),
    "unknown.yaml": (GOOD + "colour: red\n", "unknown.yaml: colour: unknown key"),
    "type.yaml": (
        GOOD.replace("batch_size: 512", "batch_size: lots"),
        "training.batch_size: input should be a valid integer (got 'lots')",
    ),
    "negative.yaml": (
        GOOD.replace("count: 8", "count: -2"),
        "resources.workers.count: input should be greater than or equal to 1 (got -2)",
    ),
    "gigs.yaml": (
        GOOD.replace("memory: 16Gi", "memory: 8 gigs"),
        "resources.workers.memory: '8 gigs' is not a memory quantity",
    ),
    "quota.yaml": (
        GOOD.replace("limits: {cpu: 128, memory: 512Gi}", "limits: {cpu: 0.5, memory: 256Gi}"),
        "resources.limits: quota (cpu 0.5, memory 262144Mi) is too small for one worker and one PS",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_job_files_exit_2_with_one_line(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text, expected = BAD_INPUTS[name]
    job = write(tmp_path, name, text)
    code, out, err = run(capsys, "plan", "--job", job, "--history", str(tmp_path / "h.db"))
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert expected in lines[0]
    assert "Traceback" not in err


def test_corrupt_history_file_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = write(tmp_path, "job.yaml", GOOD)
    corrupt = tmp_path / "history.db"
    corrupt.write_bytes(os.urandom(4096))
    code, out, err = run(capsys, "plan", "--job", job, "--history", str(corrupt))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and str(corrupt) in err
    assert "Traceback" not in err


def test_missing_job_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "plan", "--job", str(tmp_path / "nope.yaml"))
    assert code == 2 and "nope.yaml: no such file" in err


def test_console_script_reports_without_traceback(tmp_path: Path) -> None:
    """Through a real process, as a pipeline step would run it."""
    job = write(tmp_path, "job.yaml", GOOD.replace("memory: 16Gi", "memory: 8 gigs"))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "dlrover_kfp.cli.main",
            "plan",
            "--job",
            job,
            "--history",
            str(tmp_path / "h.db"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "8 gigs" in result.stderr


@pytest.mark.parametrize("document", ["job", "plan", "profile"])
def test_schema_prints_json_schema(document: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "schema", document)
    assert code == 0
    schema = json.loads(out)
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert schema["type"] == "object"


def test_every_command_has_help_with_an_example() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, command in sub.choices.items():  # type: ignore[union-attr]
        text = command.format_help()
        assert "Example" in text, name


def test_quickstart_runs_rounds_and_warm_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "quickstart", "--rounds", "3", "--output-dir", str(tmp_path))
    assert code == 0
    rows = [line.split() for line in out.splitlines()[2:]]
    assert [r[1] for r in rows] == ["cold_start", "warm_start", "warm_start"]
    jct = [float(r[-2]) for r in rows]
    assert jct[-1] < jct[0], jct  # retraining gets faster as history accumulates
    assert "round 3/3" in err
    assert (tmp_path / "history.db").exists()
