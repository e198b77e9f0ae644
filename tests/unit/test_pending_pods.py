"""Pods that no node has room for (Pending, ``Unschedulable``): the master does not wait for
them forever; it goes on with the pods it has and says which pod waited, how long, and why.

* a worker (a scale-up's, say) pending longer than the planner's ``pending_timeout_s`` is
  relaunched smaller by Stage 3's pending rule, the scheduler's message in its event; the job
  trains on meanwhile with the workers that run;
* a new PS of a live change pending for capacity longer than ``PENDING_S`` abandons the change:
  the old PS serve on;
* a PS pending at the job's start fails it at the startup timeout, saying why.

On :class:`~tests.fakes.pods.RunningPods` and a :class:`~tests.fakes.clock.FakeClock`, so that
the bounds are asserted at their real lengths in microseconds (the PS change's scripted pods
are tests/unit/test_ps_change.py's).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dlrover_kfp.core.node_id import NodeId
from dlrover_kfp.core.planner import PlannerSettings
from dlrover_kfp.ports import PodPhase
from dlrover_kfp.runtime.job import JobFailedError
from dlrover_kfp.runtime.ps_change import PENDING_S
from tests.fakes.clock import FakeClock
from tests.fakes.pods import RunningPods
from tests.unit.test_elastic_master import build_run
from tests.unit.test_ps_change import NEW_PS, Run, _change, _path, _Processes, moving

__all__ = ["moving"]  # the fixture, imported for these tests

WHY = "0/2 nodes are available: 2 Insufficient cpu."
TIMEOUT_S = PlannerSettings().post_scale.pending_timeout_s


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Run]:
    """An elastic run whose two workers (0.5 cpu each) run, its master not serving."""
    run, _, _ = build_run(tmp_path)
    yield run
    assert run.server is not None
    run.server.close()


def _fakes(run: Run) -> tuple[RunningPods, FakeClock]:
    """The run's pods and clock, as the fakes they are."""
    pods, clock = run.backend, run.clock
    assert isinstance(pods, RunningPods) and isinstance(clock, FakeClock)
    return pods, clock


def test_a_worker_pending_too_long_is_relaunched_smaller_and_says_why(run: Run) -> None:
    pods, clock = _fakes(run)
    pods.set_phase("pause-worker-1", PodPhase.PENDING, WHY)
    clock.advance(TIMEOUT_S - 1)
    run.policy.decide(run.t())
    assert run.events == [] and run.launched["pause-worker-1"].memory_mb == 1024  # not yet
    clock.advance(2)
    run.policy.decide(run.t())
    [event] = run.events
    assert (event.kind, event.node) == ("relaunch", "pause-worker-1")
    assert event.detail == (
        f"pending {TIMEOUT_S + 1:.0f}s (> {TIMEOUT_S:.0f}s; the scheduler: {WHY!r}): relaunch "
        "smaller so that it fits a node"
    )
    # A new pod of half the size under the same name (the CPU at the planner's 0.5-core
    # floor); the running worker is left alone.
    assert (run.launched["pause-worker-1"].cpu, run.launched["pause-worker-1"].memory_mb) == (
        0.5,
        512,
    )
    assert pods.pods["pause-worker-1"].phase is PodPhase.RUNNING
    assert run.launched["pause-worker-0"].cpu == 0.5 and "pause-worker-0" not in run.stopping
    assert run.policy.plans[-1].reason.startswith("pause-worker-1: pending")
    # Its wait starts again with the new pod.
    run.policy.decide(run.t())
    assert len(run.events) == 1


def test_a_worker_stopped_on_purpose_is_not_judged_pending(run: Run) -> None:
    """A pod the master is stopping (a scale-down's) may still show Pending: not the job's."""
    pods, clock = _fakes(run)
    pods.set_phase("pause-worker-1", PodPhase.PENDING, WHY)
    run.stopping.add("pause-worker-1")
    clock.advance(TIMEOUT_S + 1)
    run.policy.decide(run.t())
    assert run.events == []


def _hold_pending(pods: RunningPods, clock: FakeClock, until: float, why: str | None) -> None:
    """New pods start Pending (``why``: the scheduler's message) and run at time ``until``;
    ahead of the scripted processes, which act on a running pod."""
    pods.phase = PodPhase.PENDING

    def world(now: float) -> None:
        pod = pods.pods.get(NEW_PS)
        if pod is None or pod.phase is not PodPhase.PENDING:
            return
        if now >= until:
            pods.set_phase(NEW_PS, PodPhase.RUNNING)
        elif pod.message != why:
            pods.set_phase(NEW_PS, PodPhase.PENDING, why)

    clock.world.insert(0, world)


def test_a_new_ps_pending_for_capacity_abandons_the_change_after_the_bound(
    moving: tuple[Run, _Processes, list[str]],
) -> None:
    """Not at the startup timeout (180 s): after PENDING_S, with the pod, its wait and the
    scheduler's message in the event; its pod deleted, the old PS serving."""
    run, _, log = moving
    pods, clock = _fakes(run)
    _hold_pending(pods, clock, until=clock.monotonic() + 1e6, why=WHY)
    change = _change(run, live=True)
    started = clock.monotonic()
    outcome = change.carry_out()
    took = clock.monotonic() - started
    assert PENDING_S < took <= PENDING_S + 0.02, took
    assert _path(change) == "starting copying abandoned"
    assert log == [f"launch {NEW_PS}", "untrack pause-ps-0 1", "untrack pause-ps-1 1"]
    assert (run.state.generation, run.state.switch, outcome.pause_s) == (0, None, None)
    assert NEW_PS not in {s.name for s in run.backend.statuses()} and NEW_PS in run.stopping
    [event] = run.events
    assert event.kind == "failure"
    assert event.detail == (
        f"PS change abandoned: new PS {NEW_PS} pending {took:.1f}s, placed on no node ({WHY}); "
        "the old PS keep serving"
    )


@pytest.mark.parametrize(
    ("why", "pending_s"),
    [(WHY, PENDING_S - 1), (None, PENDING_S + 5)],
    ids=["placed-within-the-bound", "pending-for-another-cause"],
)
def test_a_new_ps_placed_in_time_or_pending_for_another_cause_switches(
    moving: tuple[Run, _Processes, list[str]], why: str | None, pending_s: float
) -> None:
    """Unschedulable for less than PENDING_S (room came), or pending past it without the
    scheduler's word (an image pulled, say: the startup timeout's to judge): the change goes
    on and switches once the pod runs."""
    run, _, _ = moving
    pods, clock = _fakes(run)
    _hold_pending(pods, clock, until=clock.monotonic() + pending_s, why=why)
    change = _change(run, live=True)
    outcome = change.carry_out()
    assert _path(change) == "starting copying pausing finishing switched"
    assert outcome.retiring is not None
    outcome.retiring.join(10.0)
    assert [e.kind for e in run.events] == ["migration"]


def test_a_ps_no_node_has_room_for_fails_the_start_saying_why(run: Run) -> None:
    """At the job's start no worker trains without every PS: past the startup timeout the job
    fails, and the failure carries the scheduler's message for the PS that waited."""
    pods, clock = _fakes(run)
    run.state.ps_addresses.clear()
    for k in range(2):
        run.launch(NodeId("ps", k), run.ps)
    pods.set_phase("pause-ps-1", PodPhase.PENDING, WHY)
    # PS 0 runs and reports its usage, as a running PS does (one silent for long would be
    # frozen and relaunched: liveness.starting_ps_frozen).
    ps0 = NodeId("ps", 0, run.state.generation)
    clock.world.append(lambda now: run.state.usage.__setitem__(ps0, [(now, 1.0, 100.0, now)]))
    started = clock.monotonic()
    with pytest.raises(JobFailedError) as failed:
        run.wait_for_ps(run.state, started, lambda: None)
    timeout = run.settings.startup_timeout_s
    assert str(failed.value) == (
        f"the PS did not start within {timeout:.0f}s; pause-ps-1 pending: {WHY}"
    )
    assert timeout < clock.monotonic() - started <= timeout + 0.1
