"""The run's events told to the cluster (runtime/pod_events.py): each event the master records
reaches the backend once, in order, with its reason and type, from the master's own loop; on
pods that are only statuses (tests/fakes/pods.py) and a fake clock, in milliseconds."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

from dlrover_kfp.core.profile import EventKind, JobEvent
from dlrover_kfp.ports import PodEvent, PodPhase, PodStatus
from dlrover_kfp.runtime.pod_events import REASONS, EventForwarder, pod_event
from tests.fakes.pods import RunningPods
from tests.unit.test_elastic_master import _close_servers, _run
from tests.unit.test_run_timing import MakeRun, _give_up_after, _training_over, make_run

__all__ = ["_close_servers", "make_run"]  # fixtures: the run's, and closing its server after


def test_every_event_kind_has_a_reason_and_a_type() -> None:
    assert set(REASONS) == set(get_args(EventKind))
    warnings = {kind for kind, (_, warning) in REASONS.items() if warning}
    assert warnings == {"oom", "failure", "straggler"}  # what went wrong, not what was chosen
    event = JobEvent(time=1.0, kind="oom", node="job-worker-1", detail="exit code 137")
    assert pod_event(event) == PodEvent(
        pod="job-worker-1", reason="OOMKilled", message="exit code 137", warning=True
    )


def test_the_forwarder_sends_each_new_event_once_and_not_the_earlier_masters() -> None:
    pods = RunningPods()
    earlier = [JobEvent(time=1.0, kind="relaunch", node="j-worker-0", detail="by the last master")]
    events = list(earlier)
    told = EventForwarder(pods, already=len(events))  # type: ignore[arg-type]
    told.forward(events)
    assert pods.events == []
    events += [
        JobEvent(time=2.0, kind="scale", detail="3 workers"),
        JobEvent(time=3.0, kind="migration", node="j-ps-0", detail="moved"),
    ]
    told.forward(events)
    told.forward(events)
    assert pods.events == [
        PodEvent(pod=None, reason="Scaled", message="3 workers"),
        PodEvent(pod="j-ps-0", reason="MigratedPS", message="moved"),
    ]


def test_the_masters_loop_tells_an_event_at_its_next_turn(make_run: MakeRun) -> None:
    """A worker stopped for lingering after the last shard: the straggler event reaches the
    backend from the training loop itself, before the loop ends."""
    run = make_run(checkpoint_interval_s=0)
    _, worker = _training_over(run)
    _give_up_after(run, 10 * run.settings.finish_grace_s)
    pods = run.backend
    assert isinstance(pods, RunningPods)
    run._train(run.state)
    [event] = [e for e in run.events if e.kind == "straggler"]
    assert pods.events == [
        PodEvent(pod=worker, reason="Straggler", message=event.detail, warning=True)
    ]


def test_an_elastic_runs_failure_and_relaunch_are_told_on_the_pod(tmp_path: Path) -> None:
    run, _, pods = _run(tmp_path)
    run.start = run.clock.monotonic()
    name = run.worker_name(1)
    pods.set_phase(name, PodPhase.FAILED)
    failed = PodStatus(
        name=name, role="worker", index=1, phase=PodPhase.FAILED, exit_code=137, reason="OOMKilled"
    )
    run.policy.handle_failures([failed], 5.0)  # relaunched, bigger
    run.forward_events()
    assert [(e.reason, e.pod, e.warning) for e in pods.events] == [
        ("OOMKilled", name, True),
        ("Relaunched", name, False),
    ]
    assert [e.message for e in pods.events] == [e.detail for e in run.events]


def test_the_events_of_the_runs_last_turn_are_told_when_it_releases_its_pods(
    make_run: MakeRun,
) -> None:
    """A final checkpoint that failed after the loop, say: told on the way out, however the
    run ends."""
    run = make_run()
    pods = run.backend
    assert isinstance(pods, RunningPods) and run.server is not None
    run.events.append(JobEvent(time=9.0, kind="failure", detail="checkpoint failed: disk full"))
    run._release(run.server)
    assert pods.events == [
        PodEvent(pod=None, reason="Failed", message="checkpoint failed: disk full", warning=True)
    ]
