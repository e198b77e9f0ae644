"""The chaos harness's own accounting: which injected faults the profile's events explain.

A check that passed whatever the events said would make every chaos run pass; these pin the
rule down on hand-made timelines.
"""

from __future__ import annotations

from dlrover_kfp.core.profile import JobEvent
from tests.chaos.harness import Fault, Injected, explained

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
    # A throttle takes longer to see (telling samples after a change settles): 10 s.
    throttle = Injected(Fault.PS_THROTTLE, "job-ps-1", 10.0)
    assert explained([throttle], [_event(16.0, "relaunch", "job-ps-0", ROLLBACK)]) == []
    assert explained([throttle], [_event(21.0, "relaunch", "job-ps-0", ROLLBACK)]) == [throttle]


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
