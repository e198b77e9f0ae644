"""A frozen PS (SIGSTOP: a hung process, a node that stops scheduling it) on the local backend.

Such a PS neither fails nor exits: its pod reads running and every worker waits on it. The
master finds it by its silence (no usage report for liveness.SILENT_S) and a probe it does not
answer (liveness.PROBE_TIMEOUT_S), within liveness.DETECT_S of its freezing, and then:

* an elastic run kills it and rolls the job back to its last checkpoint, as for a dead PS;
* a PS change whose new PS freezes is abandoned (the old PS keep serving) within
  liveness.FIRST_REPORT_S of the new pod's start or ps_change.SILENT_S of its freezing;
* a static run fails, and its cleanup waits on no PS longer than one request may take
  (checkpoints.RPC_TIMEOUT_S), the frozen PS having been killed.

Each measures the stall it bounds and prints it (``-s`` shows the figures).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dlrover_kfp.backends import LocalBackend
from dlrover_kfp.core.node_id import NodeId
from dlrover_kfp.core.planner import PlannerSettings
from dlrover_kfp.core.planner.settings import NodeLimits
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.runtime import checkpoints, liveness, ps_change
from dlrover_kfp.runtime.elastic import ElasticPolicy
from dlrover_kfp.runtime.job import JobRun, static_run
from dlrover_kfp.runtime.options import RunOptions, RunSettings
from tests.integration.test_elastic_run import _run, _trained_rows
from tests.integration.test_elastic_run import _spec as elastic_spec

MODEL = (
    "{embedding_dim: 8, table_sizes: [1000, 50, 7, 3000], dense_features: 13, "
    "bottom_mlp: [16, 8], top_mlp: [16, 1]}"
)
#: Stage 2 never resizes (more samples than any of these jobs has): only the fault acts.
QUIET = PlannerSettings(
    node=NodeLimits(min_cpu=0.25, cpu_step=0.25, min_memory_mb=512),
    # leave_start_z inf: nor does the start plan's early exit (issue 30) resize anything
    auto_scale=dataclasses.replace(
        PlannerSettings().auto_scale, min_samples=10_000, leave_start_z=math.inf
    ),
)
#: Seconds the replacement of a frozen PS may take once it is found: the PS and the workers
#: stopped and started again, each a Python process loading torch (~2 s of CPU; 5-8 s on a
#: busy 2-core machine for a 2-PS, 1-worker job); the bound stated in docs/reliability.md.
RESTART_S = 20.0
#: Checkpoint interval of these jobs: what a rollback takes back is at most this much training.
CHECKPOINT_S = 2.0


def _spec(rows: int, workers: str, ps: str) -> JobSpec:
    return elastic_spec(rows, workers, ps, name="frozen", model=MODEL)


def _freeze(backend: LocalBackend, pod: str) -> float:
    """SIGSTOP the pod's processes (a PS pod's supervisor and its PS: the pod's process
    group); when (monotonic, the runs' clock)."""
    pid = backend.pid_of(pod)
    assert pid is not None, pod
    os.killpg(pid, signal.SIGSTOP)
    return time.monotonic()


def _until(check: Callable[[], object], timeout_s: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False


def _committed(out: Path) -> bool:
    return any(not p.name.endswith(".tmp") for p in (out / "checkpoints").glob("step-*"))


# 30-36 s on a 2-core machine (two starts of 3 processes, 10 s of freeze): -m long.
@pytest.mark.long
@pytest.mark.timeout(liveness.DETECT_S + RESTART_S + CHECKPOINT_S + 60)
def test_a_frozen_ps_is_killed_and_the_job_rolls_back_to_its_checkpoint(tmp_path: Path) -> None:
    spec = _spec(400_000, "{count: 1, cpu: 0.5, memory: 2Gi}", "{count: 2, cpu: 0.5, memory: 2Gi}")
    settings = RunSettings(sample_interval_s=1.0, checkpoint_interval_s=CHECKPOINT_S)
    seen: dict[str, float] = {}

    def freeze_a_ps(run: JobRun[ElasticPolicy], backend: LocalBackend) -> None:
        out = tmp_path / "out"
        assert _until(lambda: _committed(out) and run.samples and run.samples[-1].throughput > 0)
        time.sleep(1.0)  # some shards done after the checkpoint, to be taken back
        seen["samples"] = run.state.totals()[0]
        seen["frozen"] = _freeze(backend, "frozen-ps-1")
        assert _until(
            lambda: any(e.kind == "relaunch" and e.node == "frozen-ps-1" for e in run.events)
        )
        seen["replaced"] = time.monotonic()
        # Training goes on: the first shard reported after the rollback, and the count back
        # where it was at the freeze (the shards taken back trained again).
        assert _until(lambda: (run.state.last_report_at or 0) > seen["replaced"])
        seen["resumed"] = time.monotonic()
        assert _until(lambda: run.state.totals()[0] >= seen["samples"])
        seen["caught_up"] = time.monotonic()

    result = _run(spec, tmp_path, settings, during=freeze_a_ps, planner=QUIET)
    profile = result.profile
    assert "frozen" in seen, "the PS was never frozen"
    assert result.succeeded, profile.outcome.reason
    assert profile.outcome.samples_processed == _trained_rows(spec, settings)
    failures = [e for e in profile.events if e.kind == "failure"]
    assert [e.node for e in failures] == ["frozen-ps-1"], profile.events
    assert "frozen: no usage report for" in failures[0].detail
    restores = [e for e in profile.events if e.kind == "relaunch"]
    assert [e.node for e in restores] == ["frozen-ps-1"], profile.events
    assert "froze" in restores[0].detail
    assert "every PS restored from the checkpoint of step" in restores[0].detail
    resumed = seen["resumed"] - seen["frozen"]
    caught_up = seen["caught_up"] - seen["frozen"]
    print(
        f"\nfrozen PS: replaced after {seen['replaced'] - seen['frozen']:.1f}s, training "
        f"resumed after {resumed:.1f}s, back at the freeze's count after {caught_up:.1f}s"
    )
    assert resumed <= liveness.DETECT_S + RESTART_S, seen
    assert caught_up <= liveness.DETECT_S + RESTART_S + CHECKPOINT_S + 2.0, seen


#: QUIET, with Stage 3 finding every PS hot (threshold 0): it moves PS 0 to a new pod of its
#: size. No peer condition (issue 30: every PS, a lone one too).
HOT = dataclasses.replace(
    QUIET,
    post_scale=dataclasses.replace(
        QUIET.post_scale, hot_ps_utilization=0.0, hot_ps_cpu_growth=1.0, hot_ps_peer_ratio=0.0
    ),
)


def _hold_loading(
    run: JobRun[ElasticPolicy],
    backend: LocalBackend,
    hold_s: float,
    seen: dict[str, float],
    meanwhile: Callable[[], None] = lambda: None,
) -> None:
    """Once the hot-PS move's new PS (generation 1) said it is loading, give it no CPU for
    ``hold_s`` (SIGSTOP, then SIGCONT: a process its busy node does not schedule), calling
    ``meanwhile`` at the start of the hold; ``seen`` gets when it was held and released."""
    new, node = "frozen-ps-0-g1", NodeId("ps", 0, 1)
    assert _until(lambda: run.state.loading_since(node) is not None)
    pid = backend.pid_of(new)
    assert pid is not None
    seen["held"] = _freeze(backend, new)
    meanwhile()
    time.sleep(hold_s)
    with contextlib.suppress(ProcessLookupError):  # killed meanwhile: the change gave up
        os.killpg(pid, signal.SIGCONT)
    seen["released"] = time.monotonic()


# ~30 s on a 2-core machine (a PS change abandoned, then one done): -m long.
@pytest.mark.long
@pytest.mark.timeout(liveness.FIRST_REPORT_S + 120)
def test_a_new_ps_frozen_during_a_ps_change_aborts_the_change(tmp_path: Path) -> None:
    """Stage 3 finds the PS hot (threshold 0) and moves it to a new pod; that pod freezes
    after its first usage report. The change is abandoned, the old PS serves on, and a later
    move (to a pod that does not freeze) goes through."""
    spec = _spec(
        1_500_000, "{count: 1, cpu: 0.5, memory: 2Gi}", "{count: 1, cpu: 0.25, memory: 2Gi}"
    )
    settings = RunSettings(sample_interval_s=1.0, checkpoint_interval_s=0.0)
    seen: dict[str, float] = {}

    def freeze_the_new_ps(run: JobRun[ElasticPolicy], backend: LocalBackend) -> None:
        new, node = "frozen-ps-0-g1", NodeId("ps", 0, 1)
        assert _until(lambda: backend.pid_of(new) is not None)
        # Past its loading (its supervisor's first word): a PS that runs, then freezes.
        assert _until(
            lambda: run.state.last_heard(node) is not None and run.state.loading_since(node) is None
        )
        seen["frozen"] = _freeze(backend, new)
        assert _until(
            lambda: any(
                e.kind == "failure" and "PS change abandoned" in e.detail for e in run.events
            )
        )
        seen["abandoned"] = time.monotonic()

    result = _run(spec, tmp_path, settings, during=freeze_the_new_ps, planner=HOT)
    profile = result.profile
    assert "frozen" in seen, "the new PS was never frozen"
    assert result.succeeded, profile.outcome.reason
    assert profile.outcome.samples_processed == _trained_rows(spec, settings)
    abandoned = [e for e in profile.events if "PS change abandoned" in e.detail]
    assert len(abandoned) == 1, profile.events
    assert "new PS frozen-ps-0-g1 frozen: no usage report for" in abandoned[0].detail
    took = seen["abandoned"] - seen["frozen"]
    print(f"\nnew PS frozen during a PS change: the change abandoned after {took:.1f}s")
    assert took <= ps_change.SILENT_S + 2.0, seen
    assert took <= liveness.FIRST_REPORT_S


#: How long the new PS is held while it loads its code: beyond the 10 s (FIRST_REPORT_S) of
#: silence that abandoned such a change before its supervisor said it was loading.
SLOW_LOAD_S = liveness.FIRST_REPORT_S + 4.0


# ~40 s on a 2-core machine (a PS change held 14 s while its PS loads): -m long.
@pytest.mark.long
@pytest.mark.timeout(SLOW_LOAD_S + 120)
def test_a_new_ps_slow_to_load_is_waited_for_and_the_change_completes(tmp_path: Path) -> None:
    """A busy node: the new PS pod's supervisor said it is loading, then gets no CPU for
    SLOW_LOAD_S (SIGSTOP, then SIGCONT: a process its node does not schedule). The change
    waits within the loading budget and switches; nothing is abandoned, every row trains once.
    Before the supervisor's word, such a pod was frozen after FIRST_REPORT_S of silence."""
    spec = _spec(
        1_500_000, "{count: 1, cpu: 0.5, memory: 2Gi}", "{count: 1, cpu: 0.25, memory: 2Gi}"
    )
    settings = RunSettings(sample_interval_s=1.0, checkpoint_interval_s=0.0)
    seen: dict[str, float] = {}

    def hold_the_loading_ps(run: JobRun[ElasticPolicy], backend: LocalBackend) -> None:
        _hold_loading(run, backend, SLOW_LOAD_S, seen)

    result = _run(spec, tmp_path, settings, during=hold_the_loading_ps, planner=HOT)
    profile = result.profile
    assert "released" in seen, "the new PS was never held while loading"
    assert result.succeeded, profile.outcome.reason
    assert profile.outcome.samples_processed == _trained_rows(spec, settings)
    abandoned = [e for e in profile.events if "PS change abandoned" in e.detail]
    assert not abandoned, abandoned
    moves = [e for e in profile.events if e.kind == "migration" and "moved" in e.detail]
    assert moves, profile.events
    assert not [e for e in profile.events if e.kind == "failure"], profile.events
    print(f"\nnew PS held {seen['released'] - seen['held']:.1f}s while loading: waited for")


# ~35 s on a 2-core machine: -m long.
@pytest.mark.long
@pytest.mark.timeout(180)
def test_a_worker_killed_during_a_live_ps_change_is_a_counted_failure_and_relaunched(
    tmp_path: Path,
) -> None:
    """A worker SIGKILLed while a live PS change waits on its new PS (held 6 s while it loads,
    so that the kill lands inside the change): a failure event with its exit code, counted
    against the relaunch budget, a relaunch, the change switched, every row trained once.
    Before, the master's loop was held by the change and the next resize replaced the dead
    pod ("in-place resize refused (not running)"): no failure, no relaunch, nothing counted."""
    # Workers of a quarter core: on a quiet machine two half-core workers had trained their
    # rows by the time the new PS loaded, and the kill found worker 0 gone.
    spec = _spec(
        1_500_000, "{count: 2, cpu: 0.25, memory: 2Gi}", "{count: 1, cpu: 0.25, memory: 2Gi}"
    )
    settings = RunSettings(sample_interval_s=1.0, checkpoint_interval_s=0.0)
    seen: dict[str, float] = {}

    def kill_a_worker_in_the_change(run: JobRun[ElasticPolicy], backend: LocalBackend) -> None:
        def kill_worker_0() -> None:
            seen["start"] = run.start
            worker = backend.pid_of("frozen-worker-0")
            assert worker is not None
            os.kill(worker, signal.SIGKILL)

        _hold_loading(run, backend, 6.0, seen, meanwhile=kill_worker_0)

    result = _run(spec, tmp_path, settings, during=kill_a_worker_in_the_change, planner=HOT)
    profile = result.profile
    assert "released" in seen, "the change never started"
    assert result.succeeded, profile.outcome.reason
    assert profile.outcome.samples_processed == _trained_rows(spec, settings)
    failures = [e for e in profile.events if e.kind == "failure"]
    assert [e.node for e in failures] == ["frozen-worker-0"], profile.events
    assert "137" in failures[0].detail or "SIGKILL" in failures[0].detail, failures[0].detail
    relaunches = [e for e in profile.events if e.kind == "relaunch"]
    assert [e.node for e in relaunches] == ["frozen-worker-0"], profile.events
    # Seen while the change still waited on its held PS, not after it.
    assert seen["start"] + relaunches[0].time < seen["released"], (relaunches, seen)
    assert [e for e in profile.events if e.kind == "migration" and "moved" in e.detail]
    assert not [e for e in profile.events if "abandoned" in e.detail], profile.events
    print(f"\nworker killed in a PS change: {failures[0].detail}; {relaunches[0].detail}")


# ~60 s on a 2-core machine (a PS frozen for its whole loading budget, 30 s): -m long.
@pytest.mark.long
@pytest.mark.timeout(liveness.LOAD_MIN_S + 150)
def test_a_ps_frozen_before_it_serves_is_relaunched_and_the_job_trains_every_row(
    tmp_path: Path,
) -> None:
    """PS 1 of the job's start freezes while it loads its code (SIGSTOP after its supervisor
    said it is loading): past its loading budget it is killed and relaunched, a failure
    counted against the budget, and the job trains every row once. Before, nothing judged a
    PS that had not registered: the job waited out startup_timeout_s (180 s) and failed ("the
    PS did not start within 180s", 0 samples)."""
    spec = _spec(400_000, "{count: 1, cpu: 0.5, memory: 2Gi}", "{count: 2, cpu: 0.5, memory: 2Gi}")
    settings = RunSettings(sample_interval_s=1.0, checkpoint_interval_s=CHECKPOINT_S)
    seen: dict[str, float] = {}

    def freeze_a_loading_ps(run: JobRun[ElasticPolicy], backend: LocalBackend) -> None:
        assert _until(lambda: run.state.loading_since(NodeId("ps", 1, 0)) is not None)
        seen["frozen"] = _freeze(backend, "frozen-ps-1")

    result = _run(spec, tmp_path, settings, during=freeze_a_loading_ps, planner=QUIET)
    profile = result.profile
    assert "frozen" in seen, "the PS was never frozen"
    assert result.succeeded, profile.outcome.reason
    assert profile.outcome.samples_processed == _trained_rows(spec, settings)
    failures = [e for e in profile.events if e.kind == "failure"]
    assert [e.node for e in failures] == ["frozen-ps-1"], profile.events
    assert "frozen before it served: still loading its code" in failures[0].detail
    relaunches = [e for e in profile.events if e.kind == "relaunch"]
    assert [e.node for e in relaunches] == ["frozen-ps-1"], profile.events
    print(f"\nPS frozen while loading: {failures[0].detail}")


# 15-22 s on a 2-core machine: in the default suite.
@pytest.mark.timeout(liveness.DETECT_S + checkpoints.RPC_TIMEOUT_S + 60)
def test_a_static_run_whose_ps_freezes_fails_and_its_cleanup_is_bounded(tmp_path: Path) -> None:
    spec = _spec(
        2_000_000, "{count: 1, cpu: 0.5, memory: 2Gi}", "{count: 1, cpu: 0.5, memory: 2Gi}"
    )
    # A checkpoint every half second: one is in flight to the frozen PS when the run fails.
    settings = RunSettings(sample_interval_s=0.5, checkpoint_interval_s=0.5)
    out = tmp_path / "out"
    seen: dict[str, float] = {}
    with LocalBackend(out / "logs") as backend:
        options = RunOptions(output_dir=out, base_dir=tmp_path, settings=settings)
        run = static_run(spec, backend, options, progress=lambda line: None)

        def freeze_the_ps() -> None:
            assert _until(lambda: _committed(out) and run.samples and run.samples[-1].throughput)
            seen["frozen"] = _freeze(backend, "frozen-ps-0")

        threading.Thread(target=freeze_the_ps, daemon=True).start()
        result = run.run()
        seen["returned"] = time.monotonic()
    profile = result.profile
    assert "frozen" in seen, "the PS was never frozen"
    assert not result.succeeded
    assert "frozen-ps-0 frozen: no usage report for" in profile.outcome.reason, profile.outcome
    failure = next(e for e in profile.events if e.kind == "failure")
    assert failure.node == "frozen-ps-0"
    failed_at = run.start + failure.time
    cleanup = seen["returned"] - failed_at
    took = seen["returned"] - seen["frozen"]
    print(
        f"\nstatic run, PS frozen: failed after {failed_at - seen['frozen']:.1f}s, cleanup "
        f"{cleanup:.1f}s, run() returned {took:.1f}s after the freeze"
    )
    assert failed_at - seen["frozen"] <= liveness.DETECT_S + 2.0, seen
    assert cleanup <= checkpoints.RPC_TIMEOUT_S, seen
