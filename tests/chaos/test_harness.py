"""The chaos harness's own accounting: which injected faults the profile's events explain.

A check that passed whatever the events said would make every chaos run pass; these pin the
rule down on hand-made timelines.
"""

from __future__ import annotations

from dlrover_kfp.core.profile import JobEvent, RuntimeSample
from tests.chaos.harness import THROTTLE_SEEN_AFTER, Fault, Injected, explained
from tests.factories import node_sample, runtime_sample

ROLLBACK = "relaunched as it was: every PS restored from the checkpoint of step 100"


def _event(t: float, kind: str, node: str | None, detail: str = "") -> JobEvent:
    return JobEvent(time=t, kind=kind, node=node, detail=detail or kind)


def test_a_fault_is_explained_by_an_event_of_its_kind_naming_its_pod() -> None:
    kill = Injected(Fault.WORKER_KILL, "job-worker-0", 10.0)
    assert explained([kill], [_event(10.2, "failure", "job-worker-0")]) == []
    # Another pod's failure, or one before the fault, or of another kind, does not.
    assert explained([kill], [_event(10.2, "failure", "job-worker-1")]) == [kill]
    assert explained([kill], [_event(8.0, "failure", "job-worker-0")]) == [kill]
    assert explained([kill], [_event(10.2, "oom", "job-worker-0")]) == [kill]


def test_one_event_explains_one_fault() -> None:
    first = Injected(Fault.WORKER_KILL, "job-worker-0", 10.0)
    second = Injected(Fault.WORKER_KILL, "job-worker-0", 20.0)
    events = [_event(10.1, "failure", "job-worker-0")]
    assert explained([first, second], events) == [second]


def test_a_rollback_soon_after_covers_a_pod_fault_it_replaced() -> None:
    stop = Injected(Fault.WORKER_STOP, "job-worker-0", 10.0)
    assert explained([stop], [_event(14.0, "relaunch", "job-ps-0", ROLLBACK)]) == []
    assert explained([stop], [_event(16.0, "relaunch", "job-ps-0", ROLLBACK)]) == [stop]


def _sample(t: float, throughput: float, pods: tuple[str, ...]) -> RuntimeSample:
    """A sample in which ``pods`` are PS throttled to a tenth."""
    nodes = [node_sample(pod, "ps", cpu_used=0.05, cpu_throttled=0.9) for pod in pods]
    return runtime_sample(t, nodes, throughput=throughput)


def test_a_rollback_covers_a_throttle_until_the_master_had_samples_enough_to_see_it() -> None:
    """The starved-PS rule sees a throttle only in samples of training with that PS in them:
    a rollback after fewer of them replaced it unseen, one after more did not."""
    throttle = Injected(Fault.PS_THROTTLE, "job-ps-1", 10.0)
    rollback = [_event(21.0, "relaunch", "job-ps-0", ROLLBACK)]
    busy = [_sample(10.0 + k, 2000.0, ("job-ps-0", "job-ps-1")) for k in range(1, 11)]
    assert explained([throttle], rollback, busy) == [throttle]
    enough = busy[:THROTTLE_SEEN_AFTER]
    assert explained([throttle], rollback, enough) == [throttle]
    assert explained([throttle], rollback, enough[:-1]) == []
    # Samples while training was paused (a PS move: an idle PS is never throttled), or
    # without that PS (it had been moved), or before the throttle, tell nothing about it.
    paused = [_sample(10.0 + k, 0.0, ("job-ps-0", "job-ps-1")) for k in range(1, 11)]
    other = [_sample(10.0 + k, 2000.0, ("job-ps-0", "job-ps-1-g1")) for k in range(1, 11)]
    before = [_sample(k, 2000.0, ("job-ps-0", "job-ps-1")) for k in range(1, 10)]
    assert explained([throttle], rollback, [*enough[:-1], *paused, *other, *before]) == []
    # A rollback before the throttle does not cover it.
    early = [_event(8.0, "relaunch", "job-ps-0", ROLLBACK)]
    assert explained([throttle], early, []) == [throttle]


def test_a_master_sigkill_covers_a_throttle_for_10_s() -> None:
    """A killed master's samples since its last checkpoint are gone with it: a time bound."""
    throttle = Injected(Fault.PS_THROTTLE, "job-ps-1", 10.0)
    for at, missing in ((19.0, []), (21.0, [throttle])):
        kill = Injected(Fault.MASTER_KILL, None, at)
        restarted = _event(
            at + 3.0, "relaunch", None, "master restarted: resumed from the checkpoint of step 9"
        )
        assert explained([throttle, kill], [restarted]) == missing


def test_a_disk_fault_needs_a_failed_checkpoint() -> None:
    disk = Injected(Fault.DISK_FULL, None, 10.0)
    failed = _event(11.0, "failure", None, "checkpoint failed: No space left on device")
    assert explained([disk], [failed]) == []
    assert explained([disk], [_event(11.0, "failure", None, "PS change abandoned")]) == [disk]
    # A rollback does not cover the disk: it is no pod.
    assert explained([disk], [_event(11.0, "relaunch", "job-ps-0", ROLLBACK)]) == [disk]


def test_a_fault_a_rollback_covers_leaves_the_pods_next_event_to_the_next_fault() -> None:
    """Soak seed 104: worker-0 killed just before a PS's rollback (which replaced it unseen),
    then killed again; the one failure event of worker-0 is the second kill's."""
    first = Injected(Fault.WORKER_KILL, "job-worker-0", 14.0)
    second = Injected(Fault.WORKER_KILL, "job-worker-0", 22.2)
    events = [
        _event(15.3, "relaunch", "job-ps-0", ROLLBACK),
        _event(22.3, "failure", "job-worker-0"),
    ]
    assert explained([first, second], events) == []
