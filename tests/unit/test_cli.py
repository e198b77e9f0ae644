"""The command line end to end: plan, schema, quickstart, and how bad input is reported."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dlrover_kfp.cli import quickstart_cmd
from dlrover_kfp.cli.main import build_parser, main
from dlrover_kfp.core.documents import to_json
from dlrover_kfp.core.plan import NodeGroup, Stage
from dlrover_kfp.core.profile import AppliedPlan
from dlrover_kfp.quickstart import RoundResult
from dlrover_kfp.runtime.job import RunResult
from tests.factories import OVER_PROVISIONED_PODS, make_profile

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
            # `plan` reads the real clock (warm start looks back 30 days): a day before it
            started_at=time.time() - 86_400.0,
            **OVER_PROVISIONED_PODS,
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
    # 53 characters is the most that leaves room for NAME-worker-31 (elastic.max_workers 32)
    "longname.yaml": (
        GOOD.replace("name: ctr-daily", "name: " + "n" * 54),
        "name: 54 characters leave no room for the pods' names ('" + "n" * 54 + "-worker-31' is "
        "64 characters, a pod name at most 63); at most 53",
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


def _round(k: int, stage: Stage, status: str = "succeeded") -> RoundResult:
    profile = make_profile(
        run_id=f"ctr-quickstart-r{k}",
        stage=stage,
        workers=1,
        worker_cpu=0.25,
        ps=1,
        ps_cpu=0.25,
        status=status,
        jct_seconds=60.0 / k,
    )
    grown = AppliedPlan(
        time=20.0,
        stage=Stage.AUTO_SCALE,
        reason="auto-scale: model predicts +369% throughput",
        workers=NodeGroup(count=3, cpu=0.5, memory_mb=2048),
        ps=NodeGroup(count=2, cpu=0.25, memory_mb=2048),
    )
    profile = dataclasses.replace(profile, plans=(*profile.plans, grown))
    result = RunResult(profile=profile, output_dir=Path(f"round-{k}"), model_dir=None)
    return RoundResult(
        round=k,
        run_dir=Path(f"round-{k}"),
        result=result,
        expected_samples=profile.outcome.samples_processed,
    )


@pytest.mark.parametrize("failed", [False, True], ids=["succeeded", "a-round-failed"])
def test_quickstart_reports_each_round_then_a_table(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    failed: bool,
) -> None:
    """The command's wiring, with the rounds faked (tests/integration/test_quickstart.py runs
    real ones): the default history beside the runs, each round's report as it ends, the
    table last, progress on stderr, exit 1 when a round failed."""
    seen: dict[str, object] = {}

    def fake(
        output_dir: Path,
        history_url: str,
        rounds: int,
        progress: Callable[[str], None],
        *,
        on_round: Callable[[RoundResult], None],
    ) -> list[RoundResult]:
        seen.update(output_dir=output_dir, history_url=history_url, rounds=rounds)
        results = []
        for k in range(1, rounds + 1):
            progress(f"[round {k}/{rounds}] training")
            stage = Stage.COLD_START if k == 1 else Stage.WARM_START
            results.append(_round(k, stage, "failed" if failed and k == 2 else "succeeded"))
            on_round(results[-1])
        return results

    monkeypatch.setattr(quickstart_cmd, "run_quickstart", fake)
    code, out, err = run(capsys, "quickstart", "--output-dir", str(tmp_path))
    assert code == (1 if failed else 0)
    assert seen["rounds"] == 3  # the default
    assert seen["output_dir"] == tmp_path
    assert str(seen["history_url"]).endswith(str(tmp_path / "history.db"))
    assert "[round 3/3] training" in err and "training" not in out
    assert out.startswith("round 1/3: succeeded in 60.0 s")
    reports, table = out.rsplit("\n\n", 1)
    assert reports.count("started with") == 3
    assert "[auto_scale] auto-scale: model predicts +369% throughput" in reports
    assert "ended with   3w x 0.5 + 2ps x 0.25 = 2 CPU" in reports
    rows = [line.split() for line in table.splitlines()[2:]]
    assert [r[1] for r in rows] == ["succeeded", "failed" if failed else "succeeded", "succeeded"]
    assert [r[2] for r in rows] == ["cold_start", "warm_start", "warm_start"]
    assert [r[3] for r in rows] == ["1x0.25+1x0.25"] * 3
    assert [r[5] for r in rows] == ["3x0.5+2x0.25"] * 3


def test_quickstart_refuses_no_rounds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "quickstart", "--rounds", "0", "--output-dir", str(tmp_path))
    assert code == 2 and out == ""
    assert "--rounds" in err
    assert not (tmp_path / "history.db").exists()
