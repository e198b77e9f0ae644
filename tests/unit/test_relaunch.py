"""The relaunch policy (core/planner/relaunch.py), as a function."""

from __future__ import annotations

import dataclasses
import random

import pytest

from dlrover_kfp.core.planner import PlannerSettings
from dlrover_kfp.core.planner.relaunch import (
    ExitCause,
    FailJob,
    NoRelaunch,
    PodExit,
    Relaunch,
    decide_relaunch,
    oom_grown_memory,
)
from dlrover_kfp.core.planner.settings import RelaunchSettings

SETTINGS = PlannerSettings()


def _exit(
    cause: ExitCause,
    *,
    node: str = "worker-1",
    time: float = 1000.0,
    code: int | None = 1,
    memory_mb: int = 2048,
) -> PodExit:
    return PodExit(
        node=node,
        role="ps" if node.startswith("ps") else "worker",
        cause=cause,
        exit_code=code,
        time=time,
        cpu=1.5,
        memory_mb=memory_mb,
    )


def test_a_completed_pod_is_not_relaunched() -> None:
    decision = decide_relaunch(_exit(ExitCause.COMPLETED, code=0), [], SETTINGS)
    assert isinstance(decision, NoRelaunch)


@pytest.mark.parametrize(
    "cause", [ExitCause.EVICTED, ExitCause.PREEMPTED, ExitCause.DELETED, ExitCause.NODE_LOST]
)
def test_stops_from_outside_relaunch_as_they_were_and_are_never_counted(cause: ExitCause) -> None:
    # Twenty evictions in a minute: still relaunched, same resources.
    earlier = [_exit(cause, time=1000.0 + k) for k in range(20)]
    decision = decide_relaunch(_exit(cause, time=1030.0), earlier, SETTINGS)
    assert isinstance(decision, Relaunch)
    assert (decision.cpu, decision.memory_mb, decision.counted) == (1.5, 2048, False)


def test_an_oom_kill_relaunches_with_more_memory() -> None:
    decision = decide_relaunch(_exit(ExitCause.OOM_KILLED, code=137), [], SETTINGS)
    assert isinstance(decision, Relaunch) and decision.counted
    # x2, at most +8 GiB (the Stage 3 rule).
    assert decision.memory_mb == 4096 and decision.cpu == 1.5
    big = decide_relaunch(_exit(ExitCause.OOM_KILLED, code=137, memory_mb=20480), [], SETTINGS)
    assert isinstance(big, Relaunch) and big.memory_mb == 20480 + 8192
    assert "OOM-killed at 2048Mi: relaunched with 4096Mi" in decision.reason


@pytest.mark.parametrize(
    ("room", "memory"),
    [(None, 4096), (8192, 4096), (2048, 4096), (1000, 2048 + 768), (255, 2048), (-512, 2048)],
)
def test_an_oom_kill_grows_a_pod_only_as_far_as_the_jobs_memory_quota_leaves(
    room: int | None, memory: int
) -> None:
    """x2 wanted (2048 -> 4096); the room the quota leaves, rounded down to the 256 MiB step,
    caps it; with less than a step (or a job already over its quota) the pod is relaunched as
    it was, counted, and Stage 3 may reshape the job within its quota."""
    stop = _exit(ExitCause.OOM_KILLED, code=137)
    decision = decide_relaunch(stop, [], SETTINGS, memory_room_mb=room)
    assert isinstance(decision, Relaunch) and decision.counted
    assert decision.memory_mb == memory
    if memory == 2048:
        assert "memory quota leaves no room for more" in decision.reason
    elif room is not None and room < 2048:
        assert "the most the job's memory quota leaves" in decision.reason


def test_repeated_oom_kills_with_no_room_in_the_quota_fail_the_job_saying_so() -> None:
    earlier = [_exit(ExitCause.OOM_KILLED, time=t, code=137) for t in (800.0, 900.0)]
    stop = _exit(ExitCause.OOM_KILLED, time=1000.0, code=137)
    decision = decide_relaunch(stop, earlier, SETTINGS, memory_room_mb=0)
    assert isinstance(decision, FailJob)
    assert "last: was OOM-killed (exit code 137) at 2048Mi" in decision.reason
    assert decision.reason.endswith(
        "the job's memory quota leaves no room for more (0Mi free): raise resources.limits.memory"
    )
    roomy = decide_relaunch(stop, earlier, SETTINGS, memory_room_mb=4096)
    assert isinstance(roomy, FailJob) and "quota" not in roomy.reason


def test_an_oom_kill_at_the_node_maximum_fails_the_job() -> None:
    top = SETTINGS.node.max_memory_mb
    decision = decide_relaunch(_exit(ExitCause.OOM_KILLED, memory_mb=top), [], SETTINGS)
    assert isinstance(decision, FailJob)
    assert "worker-1" in decision.reason and f"{top}Mi" in decision.reason


def test_repeated_failures_within_the_window_fail_the_job_naming_pod_and_codes() -> None:
    earlier = [
        _exit(ExitCause.ERROR, time=500.0, code=1),
        _exit(ExitCause.OOM_KILLED, time=700.0, code=137),
        _exit(ExitCause.ERROR, node="worker-2", time=900.0, code=2),  # another pod
        _exit(ExitCause.EVICTED, time=950.0, code=None),  # not counted
    ]
    decision = decide_relaunch(_exit(ExitCause.ERROR, time=1000.0, code=3), earlier, SETTINGS)
    assert isinstance(decision, FailJob)
    assert decision.reason.startswith("worker-1 failed 3 times within 600 s (exit codes 1, 137, 3")
    # The first failure is 500 s before: outside a 400 s window, two failures remain.
    narrow = dataclasses.replace(SETTINGS, relaunch=RelaunchSettings(failure_window_s=400.0))
    kept = decide_relaunch(_exit(ExitCause.ERROR, time=1000.0, code=3), earlier, narrow)
    assert isinstance(kept, Relaunch) and "failure 2 of 3" in kept.reason


def test_relaunch_settings_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="max_failures"):
        RelaunchSettings(max_failures=0)
    with pytest.raises(ValueError, match="failure_window_s"):
        RelaunchSettings(failure_window_s=0.0)


def test_stage_3_and_the_relaunch_policy_grow_memory_by_one_rule() -> None:
    s, node = SETTINGS.post_scale, SETTINGS.node
    for requested in (512, 700, 2048, 9000, 30000, 60000):
        expected = min(requested * s.oom_memory_factor, requested + s.oom_max_step_mb)
        step = node.memory_step_mb
        expected = min(node.max_memory_mb, -(-int(expected) // step) * step)
        assert oom_grown_memory(requested, s, node) == expected


def test_property_against_a_reference_over_random_histories() -> None:
    # 1,000 random streams of stops over three pods: every decision matches a reference written
    # from the rules in the module docstring, independently of the implementation.
    causes = list(ExitCause)
    for seed in range(1000):
        rng = random.Random(seed)
        relaunch = RelaunchSettings(
            max_failures=rng.randint(1, 5), failure_window_s=rng.choice([60.0, 600.0, 3600.0])
        )
        settings = dataclasses.replace(SETTINGS, relaunch=relaunch)
        history: list[PodExit] = []
        t = 0.0
        for _ in range(rng.randint(1, 25)):
            t += rng.expovariate(1 / 120)
            stop = _exit(
                rng.choice(causes),
                node=rng.choice(["worker-0", "worker-1", "ps-0"]),
                time=t,
                code=rng.choice([None, 0, 1, 2, 137, 143]),
                memory_mb=rng.choice([512, 2048, 8192, SETTINGS.node.max_memory_mb]),
            )
            decision = decide_relaunch(stop, history, settings)
            own = stop.cause in (ExitCause.ERROR, ExitCause.OOM_KILLED, ExitCause.START_ERROR)
            in_window = [
                e
                for e in history
                if e.node == stop.node
                and e.cause in (ExitCause.ERROR, ExitCause.OOM_KILLED, ExitCause.START_ERROR)
                and e.time > stop.time - relaunch.failure_window_s
            ]
            where = f"seed {seed}: {stop} after {len(in_window)} -> {decision}"
            if stop.cause is ExitCause.COMPLETED:
                assert isinstance(decision, NoRelaunch), where
            elif not own:
                assert isinstance(decision, Relaunch) and not decision.counted, where
                assert (decision.cpu, decision.memory_mb) == (stop.cpu, stop.memory_mb), where
            elif len(in_window) + 1 >= relaunch.max_failures:
                assert isinstance(decision, FailJob), where
                assert stop.node in decision.reason, where
            elif (
                stop.cause is ExitCause.OOM_KILLED and stop.memory_mb >= SETTINGS.node.max_memory_mb
            ):
                assert isinstance(decision, FailJob), where
            elif stop.cause is ExitCause.OOM_KILLED:
                assert isinstance(decision, Relaunch) and decision.counted, where
                assert stop.memory_mb < decision.memory_mb <= SETTINGS.node.max_memory_mb, where
            else:
                assert isinstance(decision, Relaunch) and decision.counted, where
                assert (decision.cpu, decision.memory_mb) == (stop.cpu, stop.memory_mb), where
            history.append(stop)
