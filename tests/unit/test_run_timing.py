"""The static run's timed decisions, on a fake clock (tests/fakes/clock.py) and pods that are
only statuses (tests/fakes/pods.py): each test asserts how long the master waited, in its real
lengths (a 180 s startup timeout, a 30 s grace, 1-2-4 s back-offs), in milliseconds of real
time.

The master polls: it sees a change at its next loop turn, so a decision due at ``T`` is taken
in ``(T, T + turn]``, where ``turn`` is the loop's sleep (read from the clock, not assumed).
Every test bounds the fake time it allows (:func:`_give_up_after`), so that code which never
decides fails the test instead of looping for ever.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dlrover_kfp.core.documents import parse
from dlrover_kfp.core.node_id import NodeId
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.ports import PodPhase
from dlrover_kfp.runtime.job import (
    FINAL_CHECKPOINT_ATTEMPTS,
    JobFailedError,
    JobRun,
    StaticPolicy,
    static_run,
)
from dlrover_kfp.runtime.master import MasterService
from dlrover_kfp.runtime.options import RunOptions, RunSettings
from dlrover_kfp.training.checkpoint import CheckpointWriteError
from dlrover_kfp.training.wire import Server
from tests.fakes.clock import FakeClock
from tests.fakes.pods import RunningPods

#: A small job: two PS and two workers of the spec's own size (a static run keeps them).
SPEC: dict[str, Any] = {
    "name": "timing",
    "model": {"embedding_dim": 4, "table_sizes": [100], "dense_features": 2, "bottom_mlp": [4]},
    "data": {"format": "synthetic", "rows": 20_000, "seed": 1},
    "training": {"batch_size": 256},
    "resources": {
        "workers": {"count": 2, "cpu": 0.5, "memory": "512Mi"},
        "ps": {"count": 2, "cpu": 0.5, "memory": "512Mi"},
    },
}

Run = JobRun[StaticPolicy]
MakeRun = Callable[..., Run]


@pytest.fixture
def make_run(tmp_path: Path) -> Iterator[MakeRun]:
    """Builds a static run on :class:`RunningPods` (pods launched in ``phase``) and a
    :class:`FakeClock`, with ``settings`` over the defaults. Its master's socket exists (the
    pods' command names its address) but is not served."""
    servers: list[Server] = []

    def make(phase: PodPhase = PodPhase.RUNNING, **settings: Any) -> Run:
        spec = parse(JobSpec, SPEC, "timing")
        options = RunOptions(
            output_dir=tmp_path / "out", base_dir=tmp_path, settings=RunSettings(**settings)
        )
        run = static_run(
            spec,
            RunningPods(phase),  # type: ignore[arg-type]
            options,
            progress=lambda line: None,
            clock=FakeClock(),
        )
        service = MasterService(run.state, clock=run.clock.monotonic)
        run.server = Server(("127.0.0.1", 0), run.secret, service.handle)
        servers.append(run.server)
        return run

    yield make
    for server in servers:
        server.close()


def _clock(run: Run) -> FakeClock:
    assert isinstance(run.clock, FakeClock)
    return run.clock


def _pods(run: Run) -> RunningPods:
    assert isinstance(run.backend, RunningPods)
    return run.backend


def _give_up_after(run: Run, seconds: float) -> None:
    """Fail the test once the fake clock has moved ``seconds`` on: the code never decided."""
    clock = _clock(run)
    deadline = clock.monotonic() + seconds

    def check(now: float) -> None:
        if now > deadline:
            raise AssertionError(f"still waiting {seconds:g}s of fake time later")

    clock.world.append(check)


def _turn(run: Run) -> float:
    """The loop's sleep: how late after it is due a polled decision may be taken."""
    sleeps = set(_clock(run).sleeps)
    assert len(sleeps) == 1, sleeps
    return sleeps.pop()


# -- waiting for the PS ----------------------------------------------------------------------


def _launch_ps(run: Run) -> list[str]:
    for k in range(run.ps.count):
        run.launch(NodeId("ps", k), run.ps)
    return [run.pod_name(NodeId("ps", k)) for k in range(run.ps.count)]


def test_a_ps_set_that_never_registers_fails_the_run_after_the_startup_timeout(
    make_run: MakeRun,
) -> None:
    run = make_run(phase=PodPhase.PENDING)  # the PS pods never run (no room, say)
    _launch_ps(run)
    clock = _clock(run)
    limit = run.settings.startup_timeout_s
    assert limit == 180.0  # the real default
    _give_up_after(run, 2 * limit)
    launched: list[float] = []
    start = clock.monotonic()
    with pytest.raises(JobFailedError, match="the PS did not start within 180s"):
        run.wait_for_ps(run.state, start, lambda: launched.append(clock.monotonic()))
    waited = clock.monotonic() - start
    assert limit < waited <= limit + _turn(run)
    assert launched == []  # no PS pod ran: the workers were never started


def test_the_workers_start_once_every_ps_pod_runs_and_the_wait_ends_at_registration(
    make_run: MakeRun,
) -> None:
    run = make_run(phase=PodPhase.PENDING)
    names = _launch_ps(run)
    pods = _pods(run)
    clock = _clock(run)
    start = clock.monotonic()
    # PS 0 runs at 1 s, PS 1 at 2 s; both register their addresses at 3 s.
    runs_at = {names[0]: 1.0, names[1]: 2.0}

    def world(now: float) -> None:
        for name, at in runs_at.items():
            if now - start >= at and pods.pods[name].phase is PodPhase.PENDING:
                pods.set_phase(name, PodPhase.RUNNING)
        if now - start >= 3.0:
            with run.state.lock:
                run.state.ps_addresses = {k: ("127.0.0.1", 1 + k) for k in range(run.ps.count)}

    clock.world.append(world)
    _give_up_after(run, 60.0)
    launched: list[float] = []
    run.wait_for_ps(run.state, start, lambda: launched.append(clock.monotonic() - start))
    turn = _turn(run)
    # Once, when the last PS pod ran: not at the first one, and before any PS registered.
    assert len(launched) == 1
    assert 2.0 <= launched[0] <= 2.0 + turn
    assert 3.0 <= clock.monotonic() - start <= 3.0 + turn


# -- the end of training ---------------------------------------------------------------------


class _Coordinator:
    """What the master's loop and its final checkpoint ask of the
    :class:`~dlrover_kfp.runtime.checkpoints.CheckpointCoordinator`; the first ``failures``
    checkpoints fail to write (a full disk)."""

    busy = False

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        #: the step of every checkpoint asked for
        self.steps: list[int] = []

    def take_failure(self) -> BaseException | None:
        return None

    def checkpoint(self, step: int, *, extra: dict[str, Any], wait: bool = True) -> bool:
        self.steps.append(step)
        if len(self.steps) <= self.failures:
            raise CheckpointWriteError("No space left on device")
        return True


def _finish_every_shard(run: Run) -> None:
    """Every shard of every epoch leased and done, through the ledger's own calls."""
    ledger = run.state.ledger
    while not ledger.finished:
        shard = ledger.lease("worker-x", 0.0)
        assert shard is not None
        assert ledger.complete("worker-x", shard.id, shard.epoch)


def _training_over(run: Run) -> tuple[_Coordinator, str]:
    """Every shard done, worker 0's pod running, no periodic checkpoint: what
    :meth:`JobRun._train` sees when only a lingering worker is left."""
    coordinator = _Coordinator()
    run.coordinator = coordinator  # type: ignore[assignment]
    run.launch(NodeId.worker(0), run.workers)
    _finish_every_shard(run)
    return coordinator, run.worker_name(0)


def test_a_worker_still_running_after_the_last_shard_is_stopped_after_the_grace(
    make_run: MakeRun,
) -> None:
    run = make_run(checkpoint_interval_s=0)  # 0: no periodic checkpoint
    coordinator, worker = _training_over(run)
    grace = run.settings.finish_grace_s
    assert grace == 30.0  # the real default
    _give_up_after(run, 10 * grace)
    t0 = run.t()
    run._train(run.state)
    turn = _turn(run)
    [event] = [e for e in run.events if e.kind == "straggler"]
    assert event.node == worker
    assert "30s after every shard was done" in event.detail
    # Seen lingering at the loop's first turn; stopped at the first turn past the grace.
    assert grace < event.time - (t0 + turn) <= grace + turn
    assert worker not in _pods(run).pods and worker in run.stopping
    assert coordinator.steps == []


def test_a_worker_that_exits_within_the_grace_is_not_stopped(make_run: MakeRun) -> None:
    run = make_run(checkpoint_interval_s=0)
    _, worker = _training_over(run)
    pods = _pods(run)
    clock = _clock(run)
    start = clock.monotonic()

    def world(now: float) -> None:  # it asks for a shard at 10 s, gets none, and exits
        if now - start >= 10.0 and pods.pods[worker].phase is PodPhase.RUNNING:
            pods.set_phase(worker, PodPhase.SUCCEEDED)

    clock.world.append(world)
    _give_up_after(run, 10 * run.settings.finish_grace_s)
    run._train(run.state)
    assert [e for e in run.events if e.kind == "straggler"] == []
    assert pods.pods[worker].phase is PodPhase.SUCCEEDED and not run.stopping
    assert 10.0 <= clock.monotonic() - start <= 10.0 + 2 * _turn(run)


# -- the final checkpoint --------------------------------------------------------------------


def _checkpoint_failures(run: Run) -> list[float]:
    return [e.time for e in run.events if e.detail.startswith("checkpoint failed")]


def test_the_final_checkpoint_retries_a_write_error_with_doubling_waits_then_fails(
    make_run: MakeRun,
) -> None:
    run = make_run()
    coordinator = _Coordinator(failures=FINAL_CHECKPOINT_ATTEMPTS + 1)
    run.coordinator = coordinator  # type: ignore[assignment]
    with pytest.raises(
        JobFailedError, match=f"final checkpoint of step 7 failed {FINAL_CHECKPOINT_ATTEMPTS} times"
    ):
        run._final_checkpoint(run.state, 7)
    assert FINAL_CHECKPOINT_ATTEMPTS == 4
    assert _clock(run).sleeps == [1.0, 2.0, 4.0]
    assert coordinator.steps == [7] * FINAL_CHECKPOINT_ATTEMPTS
    # One event per try, at the time of the try: 0, 1, 1 + 2, 1 + 2 + 4.
    assert _checkpoint_failures(run) == [0.0, 1.0, 3.0, 7.0]


def test_a_final_checkpoint_that_fails_once_is_retried_after_one_second(
    make_run: MakeRun,
) -> None:
    run = make_run()
    coordinator = _Coordinator(failures=1)
    run.coordinator = coordinator  # type: ignore[assignment]
    run._final_checkpoint(run.state, 7)
    assert _clock(run).sleeps == [1.0]
    assert coordinator.steps == [7, 7]
    assert _checkpoint_failures(run) == [0.0]
