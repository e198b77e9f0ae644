"""Resources the model cannot run in, as a user meets them: refused before any pod starts when
the plan is below the model's own footprint, and, when the footprint itself was too low for
this machine, a PS OOM-killed at start is relaunched bigger instead of failing the job; a failed
pod's message says why it failed (its last error line), not only its exit code."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dlrover_kfp.backends import LocalBackend, PodPhase, PodSpec
from dlrover_kfp.core.documents import load_text, parse
from dlrover_kfp.core.footprint import min_ps_memory_mb
from dlrover_kfp.core.plan import NodeGroup, ResourcePlan, Stage
from dlrover_kfp.core.planner.quota import BelowMinimumError
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.runtime.job import static_run
from dlrover_kfp.runtime.launch import run_local
from dlrover_kfp.runtime.options import RunOptions, RunSettings
from dlrover_kfp.training.data import split_ranges
from dlrover_kfp.training.datasets import open_dataset
from dlrover_kfp.training.wire import secret_to_env

ROOT = Path(__file__).resolve().parents[2]
#: 1M rows x 16 dims: 244 MiB of PS state, so a PS surely needs 256 (the measured low end of
#: the runtime, less 10%) + 245 = 501 MiB.
MODEL = "{embedding_dim: 16, table_sizes: [1000000], bottom_mlp: [16], top_mlp: [8, 1]}"


def _job(ps: str, model: str = MODEL, rows: int = 20_000, worker_cpu: float = 0.5) -> str:
    return f"""\
name: low
model: {model}
data: {{format: synthetic, rows: {rows}, seed: 2}}
training: {{batch_size: 256}}
resources:
  workers: {{count: 1, cpu: {worker_cpu:g}, memory: 1Gi}}
  ps: {ps}
"""


def _spec(text: str) -> JobSpec:
    return parse(JobSpec, load_text(text, "test"), "test")


def _cli(tmp_path: Path, *flags: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "dlrover_kfp.cli.main", "run", "--job", "job.yaml"]
    started = time.monotonic()
    done = subprocess.run(
        [*argv, "--output-dir", "out", *flags],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    return done, time.monotonic() - started


def _no_pod_started(tmp_path: Path) -> None:
    logs = tmp_path / "out" / "logs"
    assert not (logs.is_dir() and list(logs.glob("*.log"))), "a pod was started"


def test_a_ps_below_the_models_minimum_is_refused_before_any_pod_starts(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(_job("{count: 1, cpu: 0.5, memory: 320Mi}"))
    done, elapsed = _cli(tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert error == (
        "dlrover-kfp: error: the starting plan (cold_start): resources.ps.memory: 320Mi each, "
        "but with 1 PS each needs at least 501Mi (runtime and its share of the 245Mi of "
        "embedding rows, optimizer slots and snapshot); with 2 PS each needs 379Mi; no pod was "
        "started"
    )
    _no_pod_started(tmp_path)
    # An interpreter's start and imports, then the check: no pod's start or OOM is waited for.
    assert elapsed < 30, elapsed


def _refused(tmp_path: Path, spec: JobSpec, **how: Any) -> tuple[str, float]:
    """``run_local``'s refusal of ``spec`` (its message), and how long it took; ``how`` are
    the run options besides the directories."""
    options = RunOptions(output_dir=tmp_path / "out", base_dir=tmp_path, **how)
    started = time.monotonic()
    with pytest.raises(BelowMinimumError) as err:
        run_local(spec, options, progress=lambda line: None)
    elapsed = time.monotonic() - started
    _no_pod_started(tmp_path)
    return str(err.value), elapsed


def test_a_static_run_and_a_plan_from_another_job_are_held_to_the_same_minimum(
    tmp_path: Path,
) -> None:
    low = _spec(_job("{count: 1, cpu: 0.5, memory: 320Mi}"))
    message, elapsed = _refused(tmp_path, low, static=True)
    assert message.startswith("resources (a --static run): resources.ps.memory: 320Mi each")
    assert elapsed < 5, elapsed  # no pod was waited for (a PS alone takes seconds to start)
    plan = ResourcePlan(
        workers=NodeGroup(count=1, cpu=0.5, memory_mb=1024),
        ps=NodeGroup(count=1, cpu=0.5, memory_mb=320),
        stage=Stage.WARM_START,
        reason="planned for a smaller model",
    )
    roomy = _spec(_job("{count: 1, cpu: 0.5, memory: 2Gi}"))
    message, _ = _refused(tmp_path, roomy, plan=plan)
    assert message.startswith(
        "the given plan (--plan): ps: 320Mi each, but with 1 PS each needs at least 501Mi"
    )


def test_a_model_too_big_for_any_pod_is_refused_with_the_memory_it_needs(tmp_path: Path) -> None:
    """It used to start, and fail with only "Error (exit code 1)"."""
    model = "{embedding_dim: 16, table_sizes: [2000000000], bottom_mlp: [16], top_mlp: [8, 1]}"
    spec = _spec(_job("{count: 1, cpu: 0.5, memory: 2Gi}", model))
    message, _ = _refused(tmp_path, spec, static=True)
    assert "resources.ps.memory: 2048Mi each, but with 1 PS each needs at least 488538Mi" in (
        message
    )


def _heavy_ps_settings(tmp_path: Path) -> RunSettings:
    """Run settings whose pods start through an interpreter that loads 800 MiB more in a PS
    pod. A worker pod runs `PYTHON -m dlrover_kfp.training.node worker ...`, a PS pod
    `PYTHON -m dlrover_kfp.training.supervisor --fork dlrover_kfp.training.node ...`, which
    loads the PS's modules and forks the PS: the PS pod's first process gets the ballast."""
    heavy = tmp_path / "python"
    code = (
        "import runpy, sys; "
        "ballast = b'x' * (800 << 20) if sys.argv[2].endswith('supervisor') else b''; "
        "sys.argv = sys.argv[2:]; runpy.run_module(sys.argv[0], run_name='__main__')"
    )
    heavy.write_text(f'#!/bin/sh\nexec "{sys.executable}" -c "{code}" "$@"\n')
    heavy.chmod(0o755)
    return RunSettings(sample_interval_s=0.5, checkpoint_interval_s=0.0, python=str(heavy))


def test_a_ps_oom_killed_at_start_is_relaunched_bigger_and_the_job_trains_every_row(
    tmp_path: Path,
) -> None:
    """The footprint's runtime is the CPU wheel's (RUNTIME_MB); an image whose interpreter
    loads more at start (here 800 MiB of it, through the interpreter the pods run) needs more
    than the estimate: the PS, given its minimum and a little, is OOM-killed while it starts.
    That is an ``oom`` event and a relaunch with twice the memory, and the job goes on.

    (Issue 30, step 4: a cold start gives a PS at least its footprint x 1.5, here 1024Mi for
    the 768Mi asked, so the ballast was 450 MiB and the OOM at 768Mi before.)"""
    spec = _spec(_job("{count: 1, cpu: 1, memory: 768Mi}", rows=5_000, worker_cpu=1))
    assert min_ps_memory_mb(spec.model, 1) == 629  # 768 clears the check; planned 629 x 1.5
    settings = _heavy_ps_settings(tmp_path)
    options = RunOptions(output_dir=tmp_path / "out", base_dir=tmp_path, settings=settings)
    result = run_local(spec, options, progress=lambda line: None)
    profile = result.profile
    assert result.succeeded, profile.outcome.reason
    dataset = open_dataset(spec.data, spec.model)
    train, _ = split_ranges(dataset.source_rows, settings.shard_rows, settings.eval_fraction)
    assert profile.outcome.samples_processed == sum(r.end - r.start for r in train) == 4_500
    ooms = [e for e in profile.events if e.kind == "oom"]
    assert [e.node for e in ooms] == ["low-ps-0"], profile.events
    assert 0 < ooms[0].time < profile.outcome.jct_seconds  # on the run's timeline
    (relaunch,) = [e for e in profile.events if e.kind == "relaunch"]
    assert "OOM-killed at 1024Mi: relaunched with 2048Mi" in relaunch.detail
    ps_memory = {n.memory_requested_mb for s in profile.samples for n in s.nodes if n.role == "ps"}
    assert ps_memory == {2048}


def test_a_ps_oom_killed_with_no_room_in_the_quota_is_not_grown_past_it_and_the_job_says_so(
    tmp_path: Path,
) -> None:
    """The same heavy PS, in a job whose memory quota is its request (1Gi worker + 768Mi PS):
    the cold start keeps the PS at 768Mi (no room for x1.5), and after each OOM kill it is
    relaunched as it was, never above the quota; at the third kill the job fails, naming the
    pod, its memory and the quota. (Before, it was relaunched with 2x its memory, 768Mi over
    the job's quota, and the run went on outside it.)"""
    text = _job("{count: 1, cpu: 1, memory: 768Mi}", rows=5_000, worker_cpu=1)
    spec = _spec(text + "  limits: {cpu: 2, memory: 1792Mi}\n")
    settings = _heavy_ps_settings(tmp_path)
    options = RunOptions(output_dir=tmp_path / "out", base_dir=tmp_path, settings=settings)
    result = run_local(spec, options, progress=lambda line: None)
    profile = result.profile
    assert not result.succeeded, profile.outcome.reason
    assert profile.outcome.reason is not None
    assert "low-ps-0 failed 3 times" in profile.outcome.reason
    assert "was OOM-killed (exit code 137) at 768Mi" in profile.outcome.reason
    assert profile.outcome.reason.endswith(
        "the job's memory quota leaves no room for more (0Mi free): raise resources.limits.memory"
    )
    relaunches = [e.detail for e in profile.events if e.kind == "relaunch"]
    assert len(relaunches) == 2, profile.events
    assert all(
        "OOM-killed at 768Mi: the job's memory quota leaves no room" in r for r in relaunches
    )


def test_a_failed_pods_message_carries_the_last_error_line_of_its_log(tmp_path: Path) -> None:
    with LocalBackend(tmp_path / "logs") as backend:
        backend.launch(
            PodSpec(
                name="w-0",
                role="worker",
                index=0,
                command=(
                    sys.executable,
                    "-c",
                    "import logging, os; logging.basicConfig(); "
                    "logging.getLogger('w').warning('reading shard 3'); "
                    "raise OSError(28, 'No space left on device', '/dev/shm/x')",
                ),
                env={"JOB_SECRET": "s3cr3t-value"},
                cpu=0.5,
                memory_mb=512,
            )
        )
        deadline = time.monotonic() + 30
        while not (status := backend.statuses()[0]).phase.terminal:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert status.phase is PodPhase.FAILED
    assert status.message == "OSError: [Errno 28] No space left on device: '/dev/shm/x'"


def test_a_static_runs_failure_names_what_the_pod_said(tmp_path: Path) -> None:
    """A pod that stops on an exception: the run's reason is the exception's line, not only
    "Error (exit code 1)"; the job secret (in the pods' env) is in no part of it."""
    spec = _spec(_job("{count: 1, cpu: 0.5, memory: 1Gi}", rows=5_000))
    broken = tmp_path / "python"
    # A worker whose environment is broken (a read-only data mount, say) exits on its error.
    code = (
        "import sys; sys.argv[3] == 'worker' and "
        "sys.exit('PermissionError: [Errno 13] Permission denied: /data/day_0'); "
        "import runpy; sys.argv = sys.argv[2:]; runpy.run_module(sys.argv[0], run_name='__main__')"
    )
    broken.write_text(f'#!/bin/sh\nexec "{sys.executable}" -c "{code}" "$@"\n')
    broken.chmod(0o755)
    settings = RunSettings(sample_interval_s=0.5, checkpoint_interval_s=0.0, python=str(broken))
    with LocalBackend(tmp_path / "out" / "logs") as backend:
        options = RunOptions(output_dir=tmp_path / "out", base_dir=tmp_path, settings=settings)
        run = static_run(spec, backend, options, progress=lambda line: None)
        result = run.run()
    reason = result.profile.outcome.reason
    assert reason == (
        "pod low-worker-0 Error (exit code 1): PermissionError: [Errno 13] Permission denied: "
        "/data/day_0"
    )
    (event,) = [e for e in result.profile.events if e.kind == "failure"]
    assert event.detail == reason
    assert secret_to_env(run.secret) not in (tmp_path / "out" / "profile.json").read_text()
