"""A run's identity as users meet it: two runs into one directory, a resume after editing the
spec, a data file that changes under a run. Every case used to end "succeeded" with a wrong
model, count or hold-out; each must now be refused before doing harm, or fail with the reason.

The expected counts come from the data alone: a source of ``n`` rows holds out
``floor(n / 10)`` (the run's 10% tail), and every other row is trained once per epoch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlrover_kfp.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "criteo_sample.csv"

SYNTHETIC = """\
name: {name}
scenario: ads-ctr
model: {{embedding_dim: 8, table_sizes: [1000, 50, 7, 3000], bottom_mlp: [16, 8], top_mlp: [16, 1]}}
data: {{format: synthetic, rows: {rows}, seed: 4}}
training: {{batch_size: 256, epochs: {epochs}}}
resources:
  workers: {{count: 1, cpu: 1, memory: 2Gi}}
  ps: {{count: 1, cpu: 1, memory: 2Gi}}
"""

CRITEO = """\
name: files
model: {{embedding_dim: 8, table_sizes: [{tables}], bottom_mlp: [16, 8], top_mlp: [16, 1]}}
data: {{format: criteo, path: "data/*.csv"}}
training: {{batch_size: 256, epochs: {epochs}}}
resources:
  workers: {{count: 1, cpu: 1, memory: 2Gi}}
  ps: {{count: 1, cpu: 1, memory: 2Gi}}
"""


def trained(rows: int, epochs: int = 1) -> int:
    return (rows - rows // 10) * epochs


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _cli(cwd: Path, *args: str) -> list[str]:
    del cwd
    return [sys.executable, "-m", "dlrover_kfp.cli.main", *args]


def _start(cwd: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        _cli(cwd, *args),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )


def _run(cwd: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _cli(cwd, *args),
        cwd=cwd,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=timeout,
        check=False,
    )


def _wait_for(predicate, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _committed(out: Path) -> bool:
    root = out / "checkpoints"
    return root.is_dir() and any(
        p.name.startswith("step-") and not p.name.endswith(".tmp") for p in root.iterdir()
    )


def _refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The command, in this process (the refusals come before any pod starts: no need to pay
    a new interpreter's imports each time), and its one error line."""
    capsys.readouterr()
    code = main(list(args))
    _, err = capsys.readouterr()
    return _one_line_error(subprocess.CompletedProcess(list(args), code, "", err))


def _one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("dlrover-kfp: error")]
    assert len(errors) == 1, done.stderr
    return errors[0]


def test_a_second_run_into_a_live_runs_directory_is_refused_and_the_first_is_untouched(
    tmp_path: Path,
) -> None:
    (tmp_path / "a.yaml").write_text(SYNTHETIC.format(name="job-a", rows=20_000, epochs=1))
    (tmp_path / "b.yaml").write_text(SYNTHETIC.format(name="job-b", rows=20_000, epochs=1))
    common = ["--backend", "local", "--output-dir", "out", "--sample-interval", "0.3"]
    first = _start(tmp_path, "run", "--job", "a.yaml", *common)
    try:
        _wait_for((tmp_path / "out" / "run.json").exists, 60, "the first run to start")
        # The first master is live but held still (SIGSTOP) while the others start, so that it
        # cannot finish first however slow the machine is; it goes on once they are done.
        first.send_signal(signal.SIGSTOP)
        # The same job (it used to "resume" the live run) and another job (it used to export
        # the first's newer checkpoint as its own model); and, at the same moment, a command
        # with the same start-up cost that trains nothing (the control).
        started = time.monotonic()
        same = _start(tmp_path, "run", "--job", "a.yaml", *common)
        other = _start(tmp_path, "run", "--job", "b.yaml", *common)
        control = _start(tmp_path, "schema", "job")
        procs = {"same": same, "other": other, "control": control}
        ended: dict[str, float] = {}
        while len(ended) < len(procs):  # each one's own wall time, from one start
            for name, proc in procs.items():
                if name not in ended and proc.poll() is not None:
                    ended[name] = time.monotonic() - started
            assert time.monotonic() - started < 120, "the refused runs did not end"
            time.sleep(0.05)
        outs = {}
        for name, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=10)
            outs[name] = (proc.returncode, stdout, stderr, ended[name])
    finally:
        first.send_signal(signal.SIGCONT)
        stdout, stderr = first.communicate(timeout=240)
    control_s = outs["control"][3]
    for name in ("same", "other"):
        code, out, err, took = outs[name]
        print(f"{name}: refused in {took:.1f}s (control start-up {control_s:.1f}s)")
        done = subprocess.CompletedProcess([], code, out, err)
        line = _one_line_error(done)
        assert f"pid {first.pid} on " in line and "in use by another run" in line
        # Refused at once: no more than start-up costs, whatever the machine's load.
        assert took < control_s + 2.0
    assert first.returncode == 0, stderr
    assert "discarding the duplicate" not in stderr
    summary = json.loads(stdout)
    assert summary["outcome"]["samples_processed"] == trained(20_000)
    profile = json.loads((tmp_path / "out" / "profile.json").read_text())
    assert profile["run_id"] == summary["run_id"]
    assert profile["job"]["name"] == "job-a"
    model = json.loads((tmp_path / "out" / "model" / "model.json").read_text())
    assert model["metrics"]["auc"] == summary["metrics"]["auc"]


def test_a_resume_after_editing_the_spec_is_refused_and_fresh_trains_exactly_the_new_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "job.yaml").write_text(SYNTHETIC.format(name="edited", rows=40_000, epochs=1))
    flags = ["--backend", "local", "--output-dir", "out", "--sample-interval", "0.3"]
    master = _start(tmp_path, "run", "--job", "job.yaml", *flags, "--checkpoint-interval", "0.5")
    try:
        _wait_for(lambda: _committed(tmp_path / "out"), 90, "a committed checkpoint")
    finally:
        master.send_signal(signal.SIGKILL)  # the master dies; its run.json stays
        master.communicate(timeout=30)
    run_file = tmp_path / "out" / "run.json"
    before = run_file.read_bytes()
    # Fewer rows (the ledger's ranges are outside the data), more rows (half would go
    # untrained), a few fewer (held-out rows would be trained on).
    for rows in (20_000, 80_000, 38_000):
        (tmp_path / "edit.yaml").write_text(SYNTHETIC.format(name="edited", rows=rows, epochs=1))
        monkeypatch.chdir(tmp_path)
        line = _refused(capsys, "run", "--job", "edit.yaml", *flags)
        assert f"data.rows: 40000 -> {rows}" in line and "--fresh" in line
        assert run_file.read_bytes() == before  # still resumable with the original spec
    done = _run(tmp_path, "run", "--job", "edit.yaml", *flags, "--fresh")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["outcome"]["samples_processed"] == trained(38_000)
    archived = list((tmp_path / "out" / "archive").iterdir())
    assert len(archived) == 1 and (archived[0] / "run.json").read_bytes() == before


def _criteo_rows(path: Path, copies: int) -> int:
    header, *rows = DATA.read_text().splitlines()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([header, *rows * copies]) + "\n")
    return len(rows) * copies


def test_a_data_file_changed_under_a_run_fails_it_with_the_reason(tmp_path: Path) -> None:
    data = tmp_path / "data" / "part-0.csv"
    rows = _criteo_rows(data, 100)
    tables = ", ".join(["1000"] * 26)
    (tmp_path / "job.yaml").write_text(CRITEO.format(tables=tables, epochs=20))
    flags = ["--backend", "local", "--output-dir", "out", "--sample-interval", "0.3"]
    master = _start(tmp_path, "run", "--job", "job.yaml", *flags, "--checkpoint-interval", "0.5")
    _wait_for(lambda: _committed(tmp_path / "out"), 90, "a committed checkpoint")
    old_size = data.stat().st_size
    _criteo_rows(data, 101)  # rewritten in place with more rows, while it trains
    new_size = data.stat().st_size
    stdout, stderr = master.communicate(timeout=120)
    assert master.returncode == 1, stderr
    outcome = json.loads(stdout)["outcome"]
    assert outcome["status"] == "failed"
    assert f"{data} (" in outcome["reason"] and "changed during the run" in outcome["reason"]
    assert outcome["samples_processed"] < trained(rows, 20)
    # A failed run is not resumed: the same command again trains the new file afresh.
    assert not (tmp_path / "out" / "run.json").exists()
    del old_size, new_size


def test_an_output_dir_that_is_a_file_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "job.yaml").write_text(SYNTHETIC.format(name="f", rows=20_000, epochs=1))
    (tmp_path / "out").write_text("not a directory")
    monkeypatch.chdir(tmp_path)
    line = _refused(capsys, "run", "--job", "job.yaml", "--output-dir", "out")
    assert line.endswith("--output-dir out: is a file, not a directory")


@pytest.mark.parametrize("static", [True, False], ids=["static", "elastic"])
def test_a_history_that_cannot_be_opened_fails_the_run_before_it_trains(
    tmp_path: Path,
    static: bool,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "job.yaml").write_text(SYNTHETIC.format(name="h", rows=20_000, epochs=1))
    (tmp_path / "history.db").write_bytes(b"this is not a database" * 100)
    flags = ["--static"] if static else []
    args = ["run", "--job", "job.yaml", *flags, "--output-dir", "out", "--history", "history.db"]
    monkeypatch.chdir(tmp_path)
    line = _refused(capsys, *args)
    assert "history.db" in line
    assert not (tmp_path / "out" / "logs").exists() or not any(
        (tmp_path / "out" / "logs").iterdir()
    )
