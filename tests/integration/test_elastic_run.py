"""Elastic runs end to end: the job master applies Stage 2 and the relaunch policy to real
processes on the local backend (CPU limits enforced where the machine allows cgroups)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

import pytest

from dlrover_kfp.backends import LocalBackend
from dlrover_kfp.core.documents import load_text, parse
from dlrover_kfp.core.partition import Partition
from dlrover_kfp.core.plan import ResourcePlan, Stage
from dlrover_kfp.core.planner import PlannerSettings
from dlrover_kfp.core.planner.settings import NodeLimits
from dlrover_kfp.core.spec import JobSpec, SyntheticData
from dlrover_kfp.runtime.elastic import ElasticPolicy, elastic_run
from dlrover_kfp.runtime.job import JobRun, RunResult
from dlrover_kfp.runtime.options import RunOptions, RunSettings
from dlrover_kfp.training.checkpoint import select_checkpoint

MODEL = (
    "{embedding_dim: 8, table_sizes: [1000, 50, 7, 3000, 20000, 500], dense_features: 13, "
    "bottom_mlp: [32, 16, 8], top_mlp: [32, 1]}"
)
#: Local pods are small: quarter cores, and a planning interval of seconds, not minutes.
PLANNER = PlannerSettings(
    node=NodeLimits(min_cpu=0.25, cpu_step=0.25, min_memory_mb=512),
    auto_scale=dataclasses.replace(PlannerSettings().auto_scale, min_interval_s=8.0, min_samples=3),
)


#: The same, with Stage 2 waiting for more samples than any of these jobs has: for the tests
#: about relaunches, where a resize would only get in the way.
QUIET = dataclasses.replace(
    PLANNER,
    # leave_start_z inf: nor does the start plan's early exit (issue 30) resize them
    auto_scale=dataclasses.replace(PLANNER.auto_scale, min_samples=10_000, leave_start_z=math.inf),
)


def _spec(
    rows: int, workers: str, ps: str, *, name: str = "elastic", model: str = MODEL
) -> JobSpec:
    text = f"""
name: {name}
model: {model}
data: {{format: synthetic, rows: {rows}, seed: 3}}
training: {{batch_size: 512, learning_rate: 0.05}}
resources:
  limits: {{cpu: 2, memory: 12Gi}}
  workers: {workers}
  ps: {ps}
"""
    return parse(JobSpec, load_text(text, "test"), "test")


def _trained_rows(spec: JobSpec, settings: RunSettings) -> int:
    """rows x epochs minus the held-out rows, from the spec and the documented rule (not from
    the code that splits the data): a source of n rows holds out its last floor(n·f) rows, at
    least one."""
    assert isinstance(spec.data, SyntheticData), "one source of a known row count"
    rows = spec.data.rows
    held_out = max(1, math.floor(rows * settings.eval_fraction + 1e-9))
    return (rows - held_out) * spec.training.epochs


def _run(
    spec: JobSpec,
    tmp_path: Path,
    settings: RunSettings,
    during: object = None,
    planner: PlannerSettings = PLANNER,
) -> RunResult:
    plan = ResourcePlan(
        workers=spec.resources.workers.to_group(),  # type: ignore[union-attr]
        ps=spec.resources.ps.to_group(),  # type: ignore[union-attr]
        stage=Stage.MANUAL,
        reason="the user's guess",
    )
    out = tmp_path / "out"
    with LocalBackend(out / "logs") as backend:
        options = RunOptions(output_dir=out, base_dir=tmp_path, settings=settings, planner=planner)
        run = elastic_run(spec, backend, options, plan=plan, progress=lambda line: None)
        if callable(during):
            threading.Thread(target=during, args=(run, backend), daemon=True).start()
        return run.run()


def test_an_under_provisioned_job_is_scaled_up_and_trains_every_row_once(tmp_path: Path) -> None:
    # The PS asks for the memory Stage 2 gives it (its rows and a runtime): the first step only
    # resizes the worker, where a PS move to a smaller pod would cost this test 8 s.
    spec = _spec(
        1_200_000, "{count: 1, cpu: 0.25, memory: 2Gi}", "{count: 1, cpu: 0.25, memory: 512Mi}"
    )
    settings = RunSettings(sample_interval_s=1.0, checkpoint_interval_s=0.0)
    result = _run(spec, tmp_path, settings)
    profile = result.profile
    assert result.succeeded, profile.outcome.reason
    # Exactly once: every training row of the one epoch, none twice, none lost in the resize.
    assert profile.outcome.samples_processed == _trained_rows(spec, settings)
    steps = [p for p in profile.plans if p.stage is Stage.AUTO_SCALE]
    # A step at least (0.5 cores are 4x short of the quota); every step stays within the trust
    # region (the job's CPU at most doubles per step). A second step comes only while it can
    # repay its price in the rows left to lease (core/planner/steadiness.py): in a run here the
    # second step Stage 2 proposed (a PS repartition, at 65%, with 4.6 s of rows left against
    # the 9 s the job's start-up took) was not taken.
    assert len(steps) >= 1, profile.plans
    assert steps[0].reason.startswith("auto-scale 1w x 0.25cpu + 1ps x 0.25cpu ->")
    cpu = [p.workers.total_cpu + p.ps.total_cpu for p in profile.plans]
    for i in range(1, len(cpu)):
        assert cpu[i] <= 2 * max(cpu[:i]) + 1e-9, profile.plans
        assert cpu[i] <= 2.0 + 1e-9
    assert any(e.kind == "scale" for e in profile.events)

    # Faster: the steady samples/s of a scaled shape against the first shape's. A shape's
    # steady samples leave out its start-up (the samples up to and including its first with
    # progress) and its last (it ends mid-interval, at the next step or the run's end). The
    # fastest shape with two steady samples is compared: a step can come too close to the end
    # to have any (with in-place resizes the steps come sooner, and the second one came 3 s
    # before the end in a run where the first had already doubled the speed).
    def steady(samples: list[float]) -> list[float]:
        first = next((i for i, x in enumerate(samples) if x > 0), len(samples))
        return samples[first + 1 : -1]

    bounds = [p.time for p in profile.plans] + [math.inf]
    shapes = [
        steady([s.throughput for s in profile.samples if a < s.time <= b])
        for a, b in itertools.pairwise(bounds)
    ]
    scaled = [shape for shape in shapes[1:] if len(shape) >= 2]
    assert shapes[0] and scaled, (shapes, [(p.time, p.reason) for p in profile.plans])
    # The first step alone doubles the worker's CPU (0.25 -> 0.5, the PS kept at 0.25): 2x
    # at best, measured 1.98-2.4x on a quiet machine, 1.70x in a CI run on a busy one (the
    # first shape's two samples 32.5k and 48.8k: a 0.25-core quota makes one-second samples
    # noisy); later steps, when the run lasts long enough to measure them, more. A resize that
    # did not reach the pod's CPU limit measures ~1.0x: 1.5x separates the two with room for
    # the noise of two-sample medians.
    best = max(statistics.median(shape) for shape in scaled)
    assert best >= 1.5 * statistics.median(shapes[0]), shapes
    assert profile.metrics.auc is not None and profile.metrics.auc > 0.6


# 12 s: the relaunch of a deleted pod is decided by the policy tested in test_relaunch.py; the
# SIGKILL test below runs the same relaunch and shard hand-back end to end.
@pytest.mark.long
def test_a_worker_deleted_by_someone_else_is_relaunched_and_nothing_is_lost(
    tmp_path: Path,
) -> None:
    spec = _spec(600_000, "{count: 2, cpu: 0.5, memory: 2Gi}", "{count: 1, cpu: 0.5, memory: 2Gi}")
    settings = RunSettings(sample_interval_s=1.0, checkpoint_interval_s=0.0)
    killed: dict[str, float] = {}

    def delete_a_worker(run: JobRun[ElasticPolicy], backend: LocalBackend) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if run.samples and run.samples[-1].throughput > 0:
                killed["at"] = time.monotonic()
                backend.delete("elastic-worker-1", grace_s=0.0)
                return
            time.sleep(0.1)

    result = _run(spec, tmp_path, settings, during=delete_a_worker, planner=QUIET)
    profile = result.profile
    assert killed, "the worker was never deleted"
    assert result.succeeded, profile.outcome.reason
    assert profile.outcome.samples_processed == _trained_rows(spec, settings)
    relaunches = [e for e in profile.events if e.kind == "relaunch"]
    assert [e.node for e in relaunches] == ["elastic-worker-1"], profile.events
    assert "not counted against the job" in relaunches[0].detail


def _pid_of(worker_index: int, master_port: int) -> int | None:
    """The pid of this job's worker process, from /proc (the backend does not hand pids out)."""
    wanted = ["worker", str(worker_index), "--master", f"127.0.0.1:{master_port}"]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = [a.decode(errors="replace") for a in args if a]
        if "dlrover_kfp.training.node" in text and text[-len(wanted) :] == wanted:
            return int(entry.name)
    return None


# 16-36 s: the chaos suite (tests/chaos) runs these faults on this backend with the same checks;
# kept opt-in to hold the default suite under 10 minutes.
@pytest.mark.long
def test_a_worker_killed_with_sigkill_gives_its_shards_back_at_once_and_is_relaunched(
    tmp_path: Path,
) -> None:
    if not Path("/proc/self/cmdline").exists():
        pytest.skip("finds the worker's pid in /proc (Linux)")
    spec = _spec(600_000, "{count: 2, cpu: 0.5, memory: 2Gi}", "{count: 1, cpu: 0.5, memory: 2Gi}")
    settings = RunSettings(sample_interval_s=1.0, checkpoint_interval_s=0.0)
    measured: dict[str, float] = {}

    def kill_a_worker(run: JobRun[ElasticPolicy], backend: LocalBackend) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if run.samples and run.samples[-1].throughput > 0:
                break
            time.sleep(0.05)
        pid = _pid_of(1, run.address[1])
        assert pid is not None

        def leased_by_worker_1() -> list[int]:
            with run.state.lock:
                doing = run.state.ledger.doing.items()
                return [i for i, lease in doing if lease.worker.startswith("worker-1#")]

        while not leased_by_worker_1() and time.monotonic() < deadline:
            time.sleep(0.01)
        measured["leased"] = len(leased_by_worker_1())
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        while leased_by_worker_1() and time.monotonic() < deadline:
            time.sleep(0.005)
        measured["requeued_after_s"] = time.monotonic() - killed

    result = _run(spec, tmp_path, settings, during=kill_a_worker, planner=QUIET)
    profile = result.profile
    assert measured.get("leased", 0) >= 1, measured
    # Its leases are back in the queue as soon as the kernel closes its connection to the master.
    assert measured["requeued_after_s"] < 2.0, measured
    print(
        f"\nSIGKILLed worker's {measured['leased']} lease(s) back in the queue after "
        f"{measured['requeued_after_s'] * 1000:.0f} ms"
    )
    assert result.succeeded, profile.outcome.reason
    assert profile.outcome.samples_processed == _trained_rows(spec, settings)
    failures = [e for e in profile.events if e.kind == "failure"]
    assert [e.node for e in failures] == ["elastic-worker-1"]
    assert "exit code 137" in failures[0].detail
    relaunches = [e for e in profile.events if e.kind == "relaunch"]
    assert [e.node for e in relaunches] == ["elastic-worker-1"]
    assert "failure 1 of 3" in relaunches[0].detail
    # The batches it had trained of its shard were applied, and the shard was trained again
    # whole: counted (core/applied.py), put down to the relaunch, at most its leased shards.
    twice = profile.metrics.applied_twice
    print(f"samples applied twice: {twice}")
    assert twice is not None and set(twice) == {"relaunch"}, twice
    assert 0 < twice["relaunch"] <= measured["leased"] * settings.shard_rows, twice


# 18 s: the chaos suite (tests/chaos) runs a worker over its memory among its faults; the
# relaunch with x2 memory is the policy's (tests/unit/test_relaunch.py).
@pytest.mark.long
def test_a_worker_over_its_memory_limit_is_oom_killed_and_relaunched_bigger(
    tmp_path: Path,
) -> None:
    # 128 MiB cannot hold a worker process with torch loaded (well over 128 MiB): the
    # backend kills it as OOMKilled, the policy relaunches it with x2 memory, and the job ends.
    spec = _spec(
        200_000, "{count: 1, cpu: 0.5, memory: 128Mi}", "{count: 1, cpu: 0.5, memory: 2Gi}"
    )
    settings = RunSettings(sample_interval_s=1.0, checkpoint_interval_s=0.0)
    result = _run(spec, tmp_path, settings, planner=QUIET)
    profile = result.profile
    assert result.succeeded, profile.outcome.reason
    assert profile.outcome.samples_processed == _trained_rows(spec, settings)
    ooms = [e for e in profile.events if e.kind == "oom"]
    assert ooms and ooms[0].node == "elastic-worker-0", profile.events
    relaunches = [e for e in profile.events if e.kind == "relaunch"]
    assert relaunches and "OOM-killed at 128Mi: relaunched with 512Mi" in relaunches[0].detail
    assert any(
        n.memory_requested_mb == 512 for s in profile.samples for n in s.nodes if n.role == "worker"
    )


# 32 s: a live PS move runs in the default suite in the chaos suite (test_local_chaos.py, seed 4:
# a PS throttled to a tenth moves to a new pod while training goes on); the hot-PS rule itself
# is tested in tests/unit/test_post_scale.py.
@pytest.mark.long
def test_a_hot_ps_moves_to_a_new_pod_while_training_goes_on(tmp_path: Path) -> None:
    """Stage 3 finds every PS hot (threshold 0) and moves it to a new pod of its own size:
    a live switch, with training paused only for the switch and no sample lost or repeated."""
    spec = _spec(
        3_000_000, "{count: 2, cpu: 0.5, memory: 2Gi}", "{count: 2, cpu: 0.25, memory: 2Gi}"
    )
    settings = RunSettings(sample_interval_s=1.0, checkpoint_interval_s=0.0)
    hot = dataclasses.replace(
        QUIET,
        post_scale=dataclasses.replace(
            QUIET.post_scale,
            hot_ps_utilization=0.0,
            hot_ps_cpu_growth=1.0,
            hot_ps_peer_ratio=0.0,  # issue 30: no peer condition (every PS, a lone one too)
        ),
    )
    runs: list[JobRun[ElasticPolicy]] = []
    result = _run(spec, tmp_path, settings, during=lambda run, _: runs.append(run), planner=hot)
    profile = result.profile
    assert result.succeeded, profile.outcome.reason
    assert profile.outcome.samples_processed == _trained_rows(spec, settings)
    moves = [e for e in profile.events if e.kind == "migration" and "moved" in e.detail]
    assert moves, profile.events
    run = runs[0]
    assert len(run.policy.ps_pauses) == len(moves)
    assert max(run.policy.ps_pauses) < 3.0, run.policy.ps_pauses
    # Samples/s never stays at zero for 3 s: the longest gap between two shard reports.
    assert 0 < run.state.longest_report_gap_s < 3.0
    # The moved PS's pods have new names; the old ones ended, none failed.
    logs = sorted(p.name for p in (tmp_path / "out" / "logs").iterdir())
    assert any("-ps-" in name and "-g" in name for name in logs), logs
    assert not [e for e in profile.events if e.kind == "failure"], profile.events
    # The workers paused at shard boundaries and PS 0's tally moved with it: nothing was
    # applied twice, and the new PS 0 counted on from the old one's (core/applied.py).
    assert profile.metrics.applied_twice == {}, profile.metrics.applied_twice
    final = select_checkpoint(tmp_path / "out" / "checkpoints")
    assert final is not None
    shards = math.ceil(_trained_rows(spec, settings) / settings.shard_rows)
    assert len(final.extra["applied"]["whole"]) == shards  # those before the move kept
    # Each move went over the network: every row of the moved PS copied while training, the
    # rows updated meanwhile fetched in the pause (pods share no memory: tests/backends).
    stripes = Partition(sum(spec.model.table_sizes), 2)
    for move in moves:
        assert "over the network" in move.detail, move.detail
        indices = move.detail.removeprefix("PS ").split(" moved")[0].split(", ")
        copied = int(move.detail.split(": ")[1].split(" rows")[0].replace(",", ""))
        assert copied == sum(stripes.rows_on(int(k)) for k in indices), move.detail
        assert "updated since" in move.detail, move.detail
    assert profile.metrics.auc is not None and profile.metrics.auc > 0.6


# 25-40 s: the chaos suite (tests/chaos) kills a PS with SIGKILL on both backends and checks
# the same (every row once, the rollback event, the held-out loss).
@pytest.mark.long
def test_a_ps_killed_with_sigkill_rolls_the_job_back_to_its_checkpoint(tmp_path: Path) -> None:
    """Every PS restores the last committed checkpoint and the master its shard ledger and
    counts: the shards done since are trained again and counted once."""
    spec = _spec(
        2_000_000, "{count: 2, cpu: 0.5, memory: 2Gi}", "{count: 2, cpu: 0.25, memory: 2Gi}"
    )
    settings = RunSettings(sample_interval_s=1.0, checkpoint_interval_s=2.0)
    seen: dict[str, float] = {}

    def kill_a_ps(run: JobRun[ElasticPolicy], backend: LocalBackend) -> None:
        deadline = time.monotonic() + 120
        checkpoints = tmp_path / "out" / "checkpoints"
        while time.monotonic() < deadline:
            committed = [p for p in checkpoints.glob("step-*") if not p.name.endswith(".tmp")]
            if committed and run.samples and run.samples[-1].throughput > 0:
                break
            time.sleep(0.05)
        time.sleep(1.5)  # some shards done after the checkpoint, to be taken back
        seen["samples_before"] = run.state.totals()[0]
        pid = backend.pid_of("elastic-ps-1")
        assert pid is not None
        os.kill(pid, signal.SIGKILL)

    result = _run(spec, tmp_path, settings, during=kill_a_ps, planner=QUIET)
    profile = result.profile
    assert seen, "the PS was never killed"
    assert result.succeeded, profile.outcome.reason
    assert profile.outcome.samples_processed == _trained_rows(spec, settings)
    failures = [e for e in profile.events if e.kind == "failure"]
    assert [e.node for e in failures] == ["elastic-ps-1"], profile.events
    restores = [e for e in profile.events if e.kind == "relaunch"]
    assert [e.node for e in restores] == ["elastic-ps-1"], profile.events
    assert "every PS restored from the checkpoint of step" in restores[0].detail
    assert "samples trained since are taken back" in restores[0].detail
    # What the restored state forgot is not counted, and the shards in flight at its
    # checkpoint were leased again from where PS 0's part of them ended (core/applied.py;
    # 11,776 samples twice in a run when they were trained again from their start). A shard a
    # worker finished between the ledger's snapshot and the PS's is trained again whole: at
    # most one per worker, put down to the rollback (16,384 in one run of three here).
    twice = profile.metrics.applied_twice
    print(f"samples applied twice: {twice}")
    assert twice is not None and set(twice) <= {"rollback"}, twice
    assert twice.get("rollback", 0) <= 2 * settings.shard_rows, twice
    assert profile.metrics.auc is not None and profile.metrics.auc > 0.6


#: Memory that grows by 32 MiB every half second (every page written, so all of it resident).
GROW_MEMORY = (
    "import time\n"
    "chunks = []\n"
    "for _ in range(60):\n"
    "    chunks.append(b'x' * (32 << 20))\n"
    "    time.sleep(0.5)\n"
    "time.sleep(600)\n"
)


# 32 s: the memory-trend rule is tested in tests/unit/test_post_scale.py, a relaunch with more
# memory after an OOM in the default chaos suite (a worker over its memory limit).
@pytest.mark.long
def test_a_worker_whose_memory_heads_for_its_limit_is_relaunched_bigger_before_it_dies(
    tmp_path: Path,
) -> None:
    """Stage 3 extrapolates a pod's memory one planning interval ahead: a worker growing toward
    its limit is replaced by a bigger one before the kernel kills it. The growth is a process
    exec'd into the worker's pod (its cgroup), as a leaking library would be."""
    spec = _spec(
        3_000_000, "{count: 2, cpu: 0.5, memory: 1Gi}", "{count: 1, cpu: 0.5, memory: 2Gi}"
    )
    settings = RunSettings(sample_interval_s=1.0, checkpoint_interval_s=0.0)
    planner = dataclasses.replace(
        QUIET, post_scale=dataclasses.replace(QUIET.post_scale, oom_horizon_s=10.0)
    )
    started: dict[str, float] = {}

    def leak_in_worker_0(run: JobRun[ElasticPolicy], backend: LocalBackend) -> None:
        if not backend.cpu_enforced:
            return  # without cgroups an exec'd process is not counted against the pod
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if sum(1 for s in run.samples if s.throughput > 0) >= 3:
                break
            time.sleep(0.05)
        backend.exec_in("elastic-worker-0", (sys.executable, "-c", GROW_MEMORY))
        started["at"] = time.monotonic() - run.start

    with LocalBackend(tmp_path / "probe") as probe:
        if not probe.cpu_enforced:
            pytest.skip("needs cgroups (root or a delegated group) to count memory per pod")
    result = _run(spec, tmp_path, settings, during=leak_in_worker_0, planner=planner)
    profile = result.profile
    assert started, "the leak never started"
    assert result.succeeded, profile.outcome.reason
    assert profile.outcome.samples_processed == _trained_rows(spec, settings)
    assert not [e for e in profile.events if e.kind == "oom"], profile.events
    relaunches = [e for e in profile.events if e.kind == "relaunch"]
    assert [e.node for e in relaunches] == ["elastic-worker-0"], profile.events
    assert "before it is OOM-killed" in relaunches[0].detail
    assert relaunches[0].time > started["at"]
    assert profile.plans[-1].workers.memory_mb > 1024, profile.plans[-1]
