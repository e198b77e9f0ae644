"""A resume checks what it trusts: the column mapping and the header of a table, and the
spec's quota as it is now.

Each run is stopped right after its last checkpoint is committed (SIGKILL of the master:
``tests/integration/stop_at.py``), so the run file says "unfinished" and the same command
resumes. Before, ``data.columns`` and ``data.header`` were not in the inputs a resume is bound
to (a resume with the label mapped to another column trained the rest on that target and
reported success), and a resumed elastic run kept its checkpoint's shape above a quota lowered
since (4 GiB against 3 GiB; a fresh run of that shape is refused).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.criteo_text import write_text

ROOT = Path(__file__).resolve().parents[2]
SIZES = [200, 50, 7, *([100] * 23)]
ROWS = 3_000

TABLE = """\
name: table-resume
model: {{embedding_dim: 8, table_sizes: [{tables}], bottom_mlp: [16, 8], top_mlp: [16, 1]}}
data: {{format: csv, path: clicks.csv{extra}}}
training: {{batch_size: 256}}
resources:
  workers: {{count: 1, cpu: 1, memory: 2Gi}}
  ps: {{count: 1, cpu: 1, memory: 2Gi}}
"""

ELASTIC = """\
name: quota-resume
model: {{embedding_dim: 8, table_sizes: [1000, 50, 7, 3000], bottom_mlp: [16, 8], top_mlp: [16, 1]}}
data: {{format: synthetic, rows: 6000, seed: 4}}
training: {{batch_size: 256}}
resources:
  limits: {{cpu: {cpu}, memory: {memory}}}
  workers: {{count: {workers}, cpu: 0.5, memory: {worker_memory}}}
  ps: {{count: 1, cpu: 0.5, memory: {ps_memory}}}
"""


def _cli(cwd: Path, *args: str, stop: str | None = None) -> subprocess.CompletedProcess[str]:
    prefix = (
        ["-m", "tests.integration.stop_at", stop, "SIGKILL"]
        if stop
        else ["-m", "dlrover_kfp.cli.main"]
    )
    return subprocess.run(
        [sys.executable, *prefix, "run", "--job", "job.yaml", "--output-dir", "out", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=240,
        check=False,
    )


def _table_spec(extra: str = "") -> str:
    return TABLE.format(tables=", ".join(map(str, SIZES)), extra=extra)


@pytest.mark.slow
def test_a_resume_with_another_column_mapping_or_header_is_refused_naming_the_field(
    tmp_path: Path,
) -> None:
    write_text(tmp_path / "clicks.csv", ROWS, SIZES, seed=3)
    (tmp_path / "job.yaml").write_text(_table_spec())
    stopped = _cli(tmp_path, "--static", stop="checkpoint")
    assert stopped.returncode == -9, stopped.stderr[-2000:]

    dense = ", ".join(["label", *(f"I{i}" for i in range(2, 14))])
    edits = (
        (f", columns: {{label: I1, dense: [{dense}]}}", "data.columns.label: label -> I1"),
        (", header: false", "data.header: null -> false"),
    )
    for extra, field in edits:
        (tmp_path / "job.yaml").write_text(_table_spec(extra))
        refused = _cli(tmp_path, "--static")
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert field in refused.stderr, refused.stderr[-2000:]
        assert "Traceback" not in refused.stderr
        assert (tmp_path / "out" / "run.json").exists()  # the original spec still resumes


def _elastic(**fields: object) -> str:
    values = {"cpu": 2, "memory": "4Gi", "workers": 2, "worker_memory": "1Gi", "ps_memory": "1Gi"}
    return ELASTIC.format(**(values | fields))


@pytest.mark.slow
def test_a_resume_under_a_lowered_quota_runs_within_it_or_is_refused(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(_elastic())
    stopped = _cli(tmp_path, "--checkpoint-interval", "0", stop="checkpoint")
    assert stopped.returncode == -9, stopped.stderr[-2000:]
    run_file = json.loads((tmp_path / "out" / "run.json").read_text())

    # Below what the checkpoint's one PS needs beside a worker: refused, naming the key.
    (tmp_path / "job.yaml").write_text(
        _elastic(cpu=1, memory="1536Mi", workers=1, worker_memory="768Mi", ps_memory="768Mi")
    )
    refused = _cli(tmp_path, "--checkpoint-interval", "0")
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "resources.limits: the run resumes at its checkpoint's shape" in refused.stderr
    assert "Traceback" not in refused.stderr

    # Room for one worker beside the PS: the run goes on within the quota and says so.
    (tmp_path / "job.yaml").write_text(_elastic(cpu=1, memory="2Gi", workers=1))
    resumed = _cli(tmp_path, "--checkpoint-interval", "0")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed within the spec as it is now" in resumed.stderr
    profile = json.loads((tmp_path / "out" / "profile.json").read_text())
    assert profile["run_id"] == run_file["run_id"]
    assert profile["outcome"]["samples_processed"] == 6000 - 600
    scale = [e for e in profile["events"] if "resumed within the spec" in e["detail"]]
    assert len(scale) == 1 and "2x0.5cpu/1024Mi workers" in scale[0]["detail"], profile["events"]
    resumed_plans = [p for p in profile["plans"] if p["time"] >= scale[0]["time"]]
    assert resumed_plans
    for plan in resumed_plans:
        w, p = plan["workers"], plan["ps"]
        assert w["count"] * w["cpu"] + p["count"] * p["cpu"] <= 1 + 1e-9, plan
        assert w["count"] * w["memory_mb"] + p["count"] * p["memory_mb"] <= 2048, plan
