"""The job master killed with SIGKILL and started again with the same command: it resumes.

Real processes end to end: ``dlrover-kfp run`` as a user runs it, its PS and workers on the
local backend, the master killed mid-run by SIGKILL (no chance to clean up), then the very same
command again in the same output directory.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dlrover_kfp.core.documents import load_text, parse
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.runtime.options import RunSettings
from dlrover_kfp.training.data import split_ranges
from dlrover_kfp.training.datasets import open_dataset
from tests.chaos.harness import trainer_pids

JOB = """\
name: restart
model:
  embedding_dim: 8
  table_sizes: [1000, 50, 7, 3000, 20000, 500]
  bottom_mlp: [32, 16, 8]
  top_mlp: [32, 1]
data: {format: synthetic, rows: 1500000, seed: 5}
training: {batch_size: 512, learning_rate: 0.05}
resources:
  limits: {cpu: 2, memory: 12Gi}
  workers: {count: 2, cpu: 0.5, memory: 2Gi}
  ps: {count: 1, cpu: 0.5, memory: 2Gi}
"""


def _expected_samples() -> int:
    spec = parse(JobSpec, load_text(JOB, "test"), "test")
    settings = RunSettings()
    dataset = open_dataset(spec.data, spec.model)
    train, _ = split_ranges(dataset.source_rows, settings.shard_rows, settings.eval_fraction)
    return sum(r.end - r.start for r in train) * spec.training.epochs


def kill_after_two_checkpoints(
    argv: list[str], cwd: Path, env: dict[str, str], out: Path
) -> dict[str, object]:
    """Start ``argv`` (a ``dlrover-kfp run``), SIGKILL it a second after its second committed
    checkpoint (so that some shards are done after it), and return its ``run.json``."""
    first = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        committed: list[Path] = []
        while time.monotonic() < deadline and first.poll() is None:
            committed = [p for p in (out / "checkpoints").glob("step-*") if p.suffix != ".tmp"]
            if len(committed) >= 2:
                break
            time.sleep(0.1)
        assert first.poll() is None, first.communicate()[1].decode()[-3000:]
        assert committed, "no checkpoint was committed in time"
        time.sleep(1.0)  # shards done after the last checkpoint: to be taken back
        run_file: dict[str, object] = json.loads((out / "run.json").read_text())
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    return run_file


def resume_after_the_pods_stop(
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    port: int,
    run_file: dict[str, object],
    expected_samples: int,
) -> dict[str, Any]:
    """Wait for the killed master's pods to stop (the workers lose it at their next request,
    the PS notice its connection close), run the same command again, and check that it
    resumed the same run and counted every sample once over both masters (the shards done
    after the checkpoint were taken back with it and trained again). Returns the profile."""
    deadline = time.monotonic() + 30
    while trainer_pids(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not trainer_pids(port), "the killed master's pods kept running"
    again = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from the checkpoint of step" in again.stderr
    summary = json.loads(again.stdout)
    assert summary["run_id"] == run_file["run_id"]
    assert summary["outcome"]["status"] == "succeeded"
    assert summary["outcome"]["samples_processed"] == expected_samples
    assert 0.6 < summary["metrics"]["auc"] <= 1.0
    profile: dict[str, Any] = json.loads((cwd / "out" / "profile.json").read_text())
    restarts = [e for e in profile["events"] if e["detail"].startswith("master restarted")]
    assert len(restarts) == 1, profile["events"]
    # One timeline across both masters: the resumed master's clock goes on from the run's
    # start, so its samples come after its restart and the events stay in time order.
    times = [s["time"] for s in profile["samples"]]
    assert times and times[0] > restarts[0]["time"], (restarts[0], times[:3])
    assert times == sorted(times)
    assert [e["time"] for e in profile["events"]] == sorted(e["time"] for e in profile["events"])
    # Rates are over what the resumed master trained, not the samples it restored: none
    # exceeds what the whole run averaged by a wide margin (a restored count over the first
    # second would, by the samples done before the kill).
    mean_rate = expected_samples / profile["outcome"]["jct_seconds"]
    assert max(s["throughput"] for s in profile["samples"]) < 20 * mean_rate
    return profile


@pytest.mark.long  # 47 s; the Kubernetes test runs the same scenario with the same checks
def test_a_master_killed_and_started_again_resumes_and_counts_every_sample_once(
    tmp_path: Path,
) -> None:
    if not Path("/proc/self/cmdline").exists():
        pytest.skip("finds the pods' processes in /proc (Linux)")
    (tmp_path / "job.yaml").write_text(JOB)
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "dlrover_kfp.cli.main", "run", "--job", "job.yaml"]
    argv += ["--output-dir", "out", "--checkpoint-interval", "2", "--sample-interval", "1"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    run_file = kill_after_two_checkpoints(argv, tmp_path, env, out)
    # The master's address, from the pods' launch lines in their logs.
    launch = (out / "logs" / "restart-ps-0.log").read_text()
    port = int(re.search(r"127\.0\.0\.1:(\d+)", launch).group(1))  # type: ignore[union-attr]
    profile = resume_after_the_pods_stop(argv, tmp_path, env, port, run_file, _expected_samples())
    # The timeline before the crash came back with the checkpoint.
    restart = next(e for e in profile["events"] if e["detail"].startswith("master restarted"))
    assert profile["plans"][0]["time"] == 0.0
    assert profile["outcome"]["jct_seconds"] > restart["time"]
    assert not (out / "run.json").exists()
