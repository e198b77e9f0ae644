"""The elastic master's own bookkeeping, on a cluster whose pods run until deleted (no
processes) and a fake clock (tests/fakes/clock.py: the master's timeouts pass in microseconds,
at their real lengths): which workers a PS switch waits for, and which pods Stage 3 looks at.

A worker relaunched before a switch has not asked for its configuration yet, so it cannot pause
(it is told to wait) and must not be waited for; it gets the new PS set afterwards. A PS that a
live move replaced runs on until it has persisted the move's checkpoint; it is no longer the
job's, and Stage 3 must not move it again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dlrover_kfp.core.documents import load_text, parse
from dlrover_kfp.core.node_id import NodeId
from dlrover_kfp.core.plan import ResourcePlan, Stage
from dlrover_kfp.core.planner import PlannerSettings
from dlrover_kfp.core.planner.auto_scale import AutoScaleDecision
from dlrover_kfp.core.planner.relaunch import Relaunch
from dlrover_kfp.core.profile import NodeSample, RuntimeSample
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.ports import PodPhase, PodStatus
from dlrover_kfp.runtime import liveness, ps_change
from dlrover_kfp.runtime.elastic import ElasticPolicy, elastic_run
from dlrover_kfp.runtime.job import JobFailedError, JobRun
from dlrover_kfp.runtime.master import MasterService
from dlrover_kfp.runtime.options import RunOptions
from dlrover_kfp.runtime.ps_change import PsChange, Step
from dlrover_kfp.training.master_protocol import CONFIG, LOADING, USAGE, USAGE_INTERVAL_S
from dlrover_kfp.training.wire import Message, PeerInfo, Server
from tests.factories import node_sample, runtime_sample
from tests.fakes.clock import FakeClock
from tests.fakes.pods import RunningPods

SPEC = """
name: pause
model:
  {embedding_dim: 4, table_sizes: [100, 10], dense_features: 3, bottom_mlp: [8, 4], top_mlp: [8, 1]}
data: {format: synthetic, rows: 20000, seed: 1}
training: {batch_size: 256}
resources:
  workers: {count: 2, cpu: 0.5, memory: 1Gi}
  ps: {count: 2, cpu: 0.5, memory: 1Gi}
"""


def _config(service: MasterService, index: int) -> dict[str, object]:
    """A worker asks the master for its configuration."""
    peer = PeerInfo(index, ("h", index))
    return service.handle(peer, Message(CONFIG, {"role": "worker", "index": index}, ())).meta


Run = JobRun[ElasticPolicy]
_servers: list[Server] = []


@pytest.fixture(autouse=True)
def _close_servers() -> Iterator[None]:
    yield
    while _servers:
        _servers.pop().close()


def build_run(tmp_path: Path) -> tuple[Run, MasterService, RunningPods]:
    """An elastic run of SPEC on :class:`RunningPods` and a :class:`FakeClock`, its two
    workers started and configured against generation 0 (also tests/unit/test_ps_change.py's).
    Its master's socket exists (the pods' command names its address) but is not served: the
    caller closes it."""
    spec = parse(JobSpec, load_text(SPEC, "pause"), "pause")
    assert spec.resources.workers is not None and spec.resources.ps is not None
    plan = ResourcePlan(
        workers=spec.resources.workers.to_group(),
        ps=spec.resources.ps.to_group(),
        stage=Stage.MANUAL,
        reason="test",
    )
    pods = RunningPods()
    run = elastic_run(
        spec,
        pods,  # type: ignore[arg-type]
        RunOptions(output_dir=tmp_path / "out", base_dir=tmp_path, planner=PlannerSettings()),
        plan=plan,
        progress=lambda line: None,
        clock=FakeClock(),
    )
    run.state.ps_addresses = {0: ("127.0.0.1", 1), 1: ("127.0.0.1", 2)}
    service = MasterService(run.state, clock=run.clock.monotonic)
    run.server = Server(("127.0.0.1", 0), run.secret, service.handle)
    for k in range(2):  # both workers start and are configured against generation 0
        run.policy._launch_worker(k, run.workers)
        _config(service, k)
    return run, service, pods


def _run(tmp_path: Path) -> tuple[Run, MasterService, RunningPods]:
    run, service, pods = build_run(tmp_path)
    assert run.server is not None
    _servers.append(run.server)
    return run, service, pods


def _change(run: Run) -> PsChange:
    """The policy's live change moving PS 0 (generation 1), its record installed."""
    change = run.policy._ps_change(run.ps, frozenset({0}), live=True)
    change.start()
    return change


def _pausing(run: Run) -> PsChange:
    """:func:`_change`, its workers asked to pause; worker-1 has."""
    change = _change(run)
    change.switch.pausing = True
    change.switch.ready.add("worker-1")
    return change


def _clock(run: Run) -> FakeClock:
    assert isinstance(run.clock, FakeClock)
    return run.clock


def test_a_switch_waits_for_a_configured_worker_until_it_pauses(tmp_path: Path) -> None:
    run, _, _ = _run(tmp_path)
    change = _pausing(run)
    started = run.clock.monotonic()
    waiting = change.await_pause()
    # worker-0 never paused: the switch gave up on it after its timeout, and names it. With no
    # shard time measured yet, the timeout is the whole bound.
    assert waiting == {run.worker_name(0): None}
    waited = run.clock.monotonic() - started
    assert ps_change.PAUSE_TIMEOUT_S <= waited < ps_change.PAUSE_TIMEOUT_S + 0.1


def test_the_pause_timeout_is_four_shards_at_the_median_speed_within_its_bounds(
    tmp_path: Path,
) -> None:
    """A shard of 8,192 rows at 1,000 samples/s per worker takes 8.2 s: four of them exceed the
    20 s bound (20 s); at 8,192 samples/s, four shards take 4 s; at 100,000 samples/s the
    3 s floor holds."""
    for speed, expected in [(1_000.0, 20.0), (8_192.0, 4.0), (100_000.0, 3.0)]:
        run, _, _ = _run(tmp_path / str(speed))
        workers = [
            node_sample(f"pause-worker-{k}", "worker", cpu_used=0.5, throughput=speed)
            for k in range(2)
        ]
        run.samples = [runtime_sample(float(t), workers, throughput=2 * speed) for t in range(1, 6)]
        change = _pausing(run)
        started = run.clock.monotonic()
        change.await_pause()
        assert expected <= run.clock.monotonic() - started < expected + 0.1, speed


def _reported(run: Run, index: int, ago_s: float) -> None:
    """Worker ``index`` last reported its usage ``ago_s`` seconds ago (master clock)."""
    run.state.usage[NodeId.worker(index)] = [(run.clock.monotonic() - ago_s, 12.0, 300.0, 1.0)]


def test_a_worker_silent_for_a_few_report_intervals_is_frozen_and_not_waited_for(
    tmp_path: Path,
) -> None:
    """A SIGSTOPped worker cannot pause and stops reporting: the switch goes on without it
    (it is stopped and relaunched) instead of waiting out its timeout."""
    run, _, _ = _run(tmp_path)
    _reported(run, 0, ps_change.SILENT_S + 1.0)
    _reported(run, 1, 0.5)
    waiting = _pausing(run).await_pause()
    assert _clock(run).sleeps == []  # at once
    assert list(waiting) == [run.worker_name(0)]
    assert waiting[run.worker_name(0)] == pytest.approx(ps_change.SILENT_S + 1.0)


@pytest.mark.parametrize("relaunched", [False, True])
def test_a_worker_heard_from_lately_or_not_yet_is_waited_for(
    tmp_path: Path, relaunched: bool
) -> None:
    """A worker that still reports is busy, not frozen; a relaunched one has not reported yet
    (its predecessor's silence is not its own)."""
    run, service, _ = _run(tmp_path)
    # Reporting every USAGE_INTERVAL_S while the switch waits: never silent for _SILENT_S.
    _clock(run).world.append(lambda now: _reported(run, 0, now % USAGE_INTERVAL_S))
    if relaunched:
        _reported(run, 0, ps_change.SILENT_S + 1.0)
        run.policy._launch_worker(0, run.workers)
        _clock(run).world.clear()
        _config(service, 0)
    change = _pausing(run)
    started = run.clock.monotonic()
    assert change.await_pause() == {run.worker_name(0): None}
    assert run.clock.monotonic() - started >= ps_change.PAUSE_TIMEOUT_S


def test_a_worker_relaunched_before_it_was_configured_is_not_waited_for(tmp_path: Path) -> None:
    run, service, _ = _run(tmp_path)
    run.policy._launch_worker(0, run.workers)  # worker-0 failed and was relaunched; not asked
    change = _pausing(run)
    assert change.await_pause() == {}
    assert _clock(run).sleeps == []
    # Asking during the switch, it is told to wait; afterwards it gets the new PS set.
    assert run.state.switch is change.switch
    assert _config(service, 0) == {"wait": True}


def _node(name: str, role: str, *, used: float, throttled: float = 0.0) -> NodeSample:
    speed = 1000.0 if role == "worker" else None
    return node_sample(name, role, cpu_used=used, throughput=speed, cpu_throttled=throttled)


def _samples(ps_nodes: list[NodeSample]) -> list[RuntimeSample]:
    """Five samples of steady training: two workers at 1,000 samples/s, ``ps_nodes`` as given."""
    workers = [_node(f"pause-worker-{k}", "worker", used=0.45) for k in range(2)]
    return [
        runtime_sample(float(t), [*workers, *ps_nodes], throughput=2000.0, global_step=100 * t)
        for t in range(1, 6)
    ]


def _stage3_actions(
    tmp_path: Path,
    ps_pods: dict[int, str],
    ps_nodes: list[NodeSample],
    *,
    starts: list[int] | None = None,
    starved_samples: int = 2,
) -> list[Any]:
    """What the master decides after five samples, its PS at ``ps_pods`` (``starts``: where
    pods were started, the job's start first)."""
    run, _, _ = _run(tmp_path)
    policy = run.policy
    policy.planner = dataclasses.replace(
        policy.planner,
        post_scale=dataclasses.replace(
            policy.planner.post_scale, starved_ps_samples=starved_samples
        ),
    )
    nodes = {k: NodeId.from_pod_name("pause", name) for k, name in ps_pods.items()}
    policy._ps_nodes = {k: node for k, node in nodes.items() if node is not None}
    run.samples = _samples(ps_nodes)
    policy._starts = starts or [0]
    decided: list[Any] = []
    policy._apply_actions = lambda state, plan: decided.append(plan)  # type: ignore[method-assign]
    policy._apply = lambda state, target: decided.append(target)  # type: ignore[method-assign]
    policy.decide(5.0)
    return [(a.kind, a.node) for d in decided for a in d.actions]


#: PS 0 was moved to a new pod; PS 1 kept its own.
MOVED = {0: "pause-ps-0-g1", 1: "pause-ps-1"}


def test_stage3_moves_a_starved_ps_of_the_job(tmp_path: Path) -> None:
    starved = _node("pause-ps-0-g1", "ps", used=0.05, throttled=0.9)
    decided = _stage3_actions(tmp_path, MOVED, [starved, _node("pause-ps-1", "ps", used=0.2)])
    assert decided == [("migrate_ps", "pause-ps-0-g1")]


def test_stage3_leaves_alone_a_ps_a_move_replaced(tmp_path: Path) -> None:
    """The old pod of PS 0, held to a tenth of a core while it persists the move's checkpoint,
    is starved by the rule's measure; the job's own PS are fine."""
    job_ps = [_node("pause-ps-0-g1", "ps", used=0.2), _node("pause-ps-1", "ps", used=0.2)]
    starved = _node("pause-ps-0", "ps", used=0.05, throttled=0.9)
    assert _stage3_actions(tmp_path, MOVED, [starved, *job_ps]) == []
    # Nor is it hot when it persists at its whole request: not the job's to move.
    hot = _node("pause-ps-0", "ps", used=0.5)
    assert _stage3_actions(tmp_path / "hot", MOVED, [hot, *job_ps]) == []
    assert (
        _stage3_actions(
            tmp_path / "own", MOVED, [_node("pause-ps-0-g1", "ps", used=0.5), job_ps[1]]
        )
        != []
    )


def test_stage3_keeps_a_ps_s_evidence_when_a_worker_is_relaunched(tmp_path: Path) -> None:
    """Soak seed 102: worker relaunches restarted Stage 3's window again and again, and a PS
    throttled among them was never judged. The PS is the same pod: its samples still count
    (worker-0 relaunched after the third sample; samples 4-5 settle it)."""
    starved = _node("pause-ps-1", "ps", used=0.05, throttled=0.9)
    decided = _stage3_actions(
        tmp_path,
        {0: "pause-ps-0", 1: "pause-ps-1"},
        [_node("pause-ps-0", "ps", used=0.2), starved],
        starts=[0, 3],
        starved_samples=3,
    )
    assert decided == [("migrate_ps", "pause-ps-1")]


# -- a frozen PS ------------------------------------------------------------------------------


def _watched(run: Run, answers: bool) -> list[tuple[str, int]]:
    """The job's PS watched, each probe answered or not; returns the probes made."""
    probes: list[tuple[str, int]] = []

    def probe(address: tuple[str, int], secret: bytes) -> bool:
        probes.append(address)
        return answers

    run.ps_watch = liveness.PsWatch(run.state, run.secret, run.clock.monotonic, answers=probe)
    run.start = run.clock.monotonic()
    for k in range(2):
        run.launch(NodeId("ps", k), run.ps)
    return probes


def _ps_reported(run: Run, index: int, ago_s: float, generation: int = 0) -> None:
    run.state.usage[NodeId("ps", index, generation)] = [
        (run.clock.monotonic() - ago_s, 3.0, 200.0, 1.0)
    ]


def _rollbacks(run: Run) -> list[tuple[str, str]]:
    done: list[tuple[str, str]] = []
    run.policy._restore_from_checkpoint = (  # type: ignore[method-assign]
        lambda name, decision, t: done.append((name, decision.reason))
    )
    return done


def test_a_ps_silent_and_not_answering_is_killed_and_the_job_rolls_back(tmp_path: Path) -> None:
    run, _, pods = _run(tmp_path)
    probes = _watched(run, answers=False)
    rollbacks = _rollbacks(run)
    run.policy.handle_failures(pods.statuses(), 1.0)  # first seen: the watch's baseline is now
    _ps_reported(run, 0, 0.5)
    _ps_reported(run, 1, liveness.SILENT_S + 1.0)
    run.ps_watch._since = dict.fromkeys(
        run.ps_watch._since, run.clock.monotonic() - 100
    )  # long watched
    run.policy.handle_failures(pods.statuses(), 2.0)
    assert probes == [("127.0.0.1", 2)]  # PS 1's address: PS 0 reported lately, not probed
    assert "pause-ps-1" not in pods.pods  # killed
    assert "pause-ps-1" in run.stopping  # its stop is not handled again as a failure
    assert rollbacks == [
        ("pause-ps-1", "pause-ps-1 froze: relaunched as it was (failure 1 of 3 within 600 s)")
    ]
    [event] = run.events
    assert (event.kind, event.node) == ("failure", "pause-ps-1")
    assert event.detail.startswith("frozen: no usage report for")


def test_a_ps_that_reports_or_answers_is_not_frozen(tmp_path: Path) -> None:
    """Busy or idle, a PS reports from its own thread; one whose reports alone stopped still
    answers the probe, and is probed again only after another SILENT_S."""
    run, _, pods = _run(tmp_path)
    probes = _watched(run, answers=True)
    rollbacks = _rollbacks(run)
    _ps_reported(run, 0, 0.5)
    _ps_reported(run, 1, liveness.SILENT_S + 1.0)
    run.ps_watch._since = dict.fromkeys(("pause-ps-0", "pause-ps-1"), run.clock.monotonic() - 100)
    for t in range(3):
        run.policy.handle_failures(pods.statuses(), float(t))
    assert probes == [("127.0.0.1", 2)]
    assert rollbacks == [] and run.events == []
    assert {"pause-ps-0", "pause-ps-1"} <= pods.pods.keys()


def test_a_ps_not_heard_from_yet_is_judged_from_when_it_was_first_watched(
    tmp_path: Path,
) -> None:
    run, _, pods = _run(tmp_path)
    probes = _watched(run, answers=False)
    _rollbacks(run)
    run.policy.handle_failures(pods.statuses(), 1.0)
    assert probes == []  # just started: not silent yet
    run.ps_watch._since = {k: v - liveness.SILENT_S - 1 for k, v in run.ps_watch._since.items()}
    run.policy.handle_failures(pods.statuses(), 2.0)
    assert len(probes) == 1 and run.events[0].node == "pause-ps-0"


def _new_ps(run: Run, pods: RunningPods, generation: int = 1) -> list[PodStatus]:
    run.launch(NodeId("ps", 0, generation), run.ps)
    return [s for s in pods.statuses() if s.name.endswith(f"-g{generation}")]


def test_a_new_ps_of_a_switch_is_frozen_when_silent(tmp_path: Path) -> None:
    run, _, pods = _run(tmp_path)
    change = _change(run)
    new = _new_ps(run, pods)
    assert change.frozen(new) is None  # just started, not reported yet
    _ps_reported(run, 0, 0.5, generation=1)
    assert change.frozen(new) is None  # reported lately
    _ps_reported(run, 0, ps_change.SILENT_S + 1.0, generation=1)
    frozen = change.frozen(new)
    assert frozen is not None and frozen[0] == "pause-ps-0-g1"
    assert "frozen: no usage report for" in frozen[1]


def test_a_new_ps_running_without_a_first_report_is_frozen_a_pending_one_is_not(
    tmp_path: Path,
) -> None:
    run, _, pods = _run(tmp_path)
    change = _change(run)
    new = _new_ps(run, pods)
    assert change.frozen(new) is None
    change.running_since["pause-ps-0-g1"] -= liveness.FIRST_REPORT_S + 1.0
    frozen = change.frozen(new)
    assert frozen is not None and "no usage report within" in frozen[1]
    pending = [dataclasses.replace(s, phase=PodPhase.PENDING) for s in new]
    change.running_since.clear()
    assert change.frozen(pending) is None
    assert change.running_since == {}  # not running yet: its clock has not started


def test_a_frozen_new_ps_abandons_the_switch_at_once(tmp_path: Path) -> None:
    """The old PS keep serving: no new generation, no switch, the new pod deleted; well
    before the startup timeout."""
    run, _, pods = _run(tmp_path)
    run.settings = dataclasses.replace(run.settings, startup_timeout_s=60.0)
    run.start = run.clock.monotonic()
    change = _change(run)
    _ps_reported(run, 0, ps_change.SILENT_S + 1.0, generation=1)
    ok = change.copy()  # launches the new pod, which has gone silent
    assert not ok and _clock(run).sleeps == []
    assert change.history == [Step.STARTING, Step.COPYING, Step.ABANDONED]
    assert run.state.switch is None and run.state.generation == 0
    assert "pause-ps-0-g1" not in pods.pods
    [event] = run.events
    assert event.detail.startswith("PS change abandoned: new PS pause-ps-0-g1 frozen")


def _stop_worker_1(run: Run, reason: str, times: int, first: int = 0) -> list[Any]:
    """The master's decisions when worker-1 ends ``times`` times with the backend's
    ``reason``, a second apart from second ``first`` (raises when the job must fail)."""
    decisions = []
    for k in range(first, first + times):
        gone = PodStatus(
            name=run.worker_name(1),
            role="worker",
            index=1,
            phase=PodPhase.FAILED,
            reason=reason,
            exit_code=1 if reason == "Error" else None,
            started_at=float(k),
        )
        decisions.append(run.policy._decide_stop(gone, 10.0 + k))
    return decisions


@pytest.mark.parametrize("reason", ["Evicted", "Preempted", "NodeLost", "Deleted"])
def test_a_pod_stopped_from_outside_is_relaunched_however_often_and_never_fails_the_job(
    tmp_path: Path, reason: str
) -> None:
    # The backend's reason goes to the relaunch policy as a disruption, not an error: twice
    # the failure budget (max_failures 3 within 600 s) still relaunches, as it was, uncounted.
    run, _, _ = _run(tmp_path)

    decisions = _stop_worker_1(run, reason, times=6)

    assert [(type(d), d.counted, d.cpu) for d in decisions] == [(Relaunch, False, 0.5)] * 6
    assert [e.kind for e in run.events] == ["failure"] * 6


def test_a_pod_failing_on_its_own_fails_the_job_at_the_budget(tmp_path: Path) -> None:
    run, _, _ = _run(tmp_path)
    assert all(d.counted for d in _stop_worker_1(run, "Error", times=2))  # failures 1, 2 of 3
    with pytest.raises(JobFailedError, match="failed 3 times within 600 s"):
        _stop_worker_1(run, "Error", times=1, first=2)


# -- a worker's CPU changed in place ------------------------------------------------------------


def _cpu_to(run: Run, cpu: float) -> None:
    """The policy applies a plan that changes only the workers' CPU."""
    workers = dataclasses.replace(run.workers, cpu=cpu)
    run.policy._apply(run.state, dataclasses.replace(run.policy.plan, workers=workers))


def _requested(run: Run, index: int) -> float | None:
    """The requested CPU the run's next sample gives worker ``index`` (from its own reports:
    RunningPods measures nothing)."""
    now = run.clock.monotonic()
    run.state.usage[NodeId.worker(index)] = [(now - 1, 10.0, 300.0, 1.0), (now, 10.5, 300.0, 2.0)]
    run._sample(run.state, run.t(), (run.t() - 1, 0, 0.0))
    node = next(n for n in run.samples[-1].nodes if n.name == run.worker_name(index))
    return node.cpu_requested


def test_a_worker_cpu_change_resizes_the_running_pods_in_place(tmp_path: Path) -> None:
    run, _, pods = _run(tmp_path)
    run.start = run.clock.monotonic()
    started = list(pods.launched)
    _cpu_to(run, 2.0)
    # The same pods go on: nothing stopped, nothing started, the new limits on each.
    assert pods.launched == started and run.stopping == set()
    names = [run.worker_name(k) for k in range(2)]
    assert [pods.limits[n] for n in names] == [(2.0, 1024)] * 2
    assert [(e.kind, e.node, e.detail) for e in run.events] == [
        ("scale", n, f"{n} resized in place to 2 cpu in 0.25s") for n in names
    ]
    assert run.workers.cpu == 2.0 and run.policy.resize_in_place
    assert _requested(run, 0) == 2.0


def test_a_refused_resize_replaces_the_worker_and_prices_later_changes_as_replacements(
    tmp_path: Path,
) -> None:
    run, _, pods = _run(tmp_path)
    run.start = run.clock.monotonic()
    pods.refuse_resize = "the API has no resize subresource (404)"
    started = list(pods.launched)
    _cpu_to(run, 2.0)
    names = [run.worker_name(k) for k in range(2)]
    # Each stopped and started again at the new size (RunningPods keeps no deleted pod).
    assert pods.launched == [*started, *names]
    assert all(n in pods.pods for n in names)
    assert [pods.limits[n] for n in names] == [(2.0, 1024)] * 2
    assert [e.detail for e in run.events] == [
        f"{n}: in-place resize refused (the API has no resize subresource (404)): replaced"
        for n in names
    ]
    assert not run.policy.resize_in_place
    assert _requested(run, 1) == 2.0


def test_a_worker_dead_before_its_resize_is_a_failure_relaunched_at_the_new_size(
    tmp_path: Path,
) -> None:
    """Worker 1 failed while the loop was held (a PS change): the step's resize finds it dead.
    That is a failure (its event, counted against the budget) and a relaunch at the new size,
    not a refused resize, and it does not turn in-place resizing off for the run."""
    run, _, pods = _run(tmp_path)
    run.start = run.clock.monotonic()
    pods.set_phase(run.worker_name(1), PodPhase.FAILED)
    _cpu_to(run, 2.0)
    name = run.worker_name(1)
    kinds = [(e.kind, e.node) for e in run.events]
    assert ("failure", name) in kinds and ("relaunch", name) in kinds, run.events
    assert not any("refused" in e.detail for e in run.events), run.events
    assert pods.pods[name].phase is PodPhase.RUNNING and pods.limits[name][0] == 2.0
    assert run.policy.resize_in_place
    assert run.policy._stops and run.policy._stops[-1].node == name  # counted


def test_a_step_whose_ps_part_was_abandoned_names_the_shape_it_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stage 2 steps to one more worker and three PS; the new PS never say a word, so the PS
    change is abandoned (its own failure event). The step's event and its applied plan name the
    shape that runs, three workers and the old PS, not the one decided."""
    run, _, _ = _run(tmp_path)
    run.start = run.clock.monotonic()
    workers = [node_sample(f"pause-worker-{k}", "worker", cpu_used=0.5, throughput=500.0)
               for k in range(2)]  # fmt: skip
    run.samples = [runtime_sample(float(t), workers, throughput=1000.0) for t in range(1, 6)]
    decided = dataclasses.replace(
        run.policy.plan,
        workers=dataclasses.replace(run.workers, count=run.workers.count + 1),
        ps=dataclasses.replace(run.ps, count=3),
        stage=Stage.AUTO_SCALE,
        reason="auto-scale 2w + 2ps -> 3w + 3ps: the test's step",
        predicted_throughput=2000.0,
    )
    monkeypatch.setattr(
        "dlrover_kfp.runtime.elastic.auto_scale",
        lambda *a, **k: AutoScaleDecision(decided, "the test's step", kind="grow"),
    )
    monkeypatch.setattr("dlrover_kfp.runtime.elastic.post_scale", lambda *a, **k: None)
    run.policy.decide(run.t())
    abandoned = [e for e in run.events if e.detail.startswith("PS change abandoned")]
    assert abandoned, run.events
    [scale] = [e for e in run.events if e.kind == "scale" and e.node is None]
    assert "applied as 3w x 0.5cpu + 2ps x 0.5cpu" in scale.detail, scale.detail
    assert (run.policy.plans[-1].workers.count, run.policy.plans[-1].ps.count) == (3, 2)
    assert run.policy.plans[-1].reason == scale.detail


def _new_ps_running(change: PsChange) -> list[PodStatus]:
    (pod,) = change.new_pods.values()
    return [PodStatus(name=pod, role="ps", index=0, phase=PodPhase.RUNNING)]


def test_a_new_ps_loading_its_code_is_waited_for_within_its_budget_then_frozen(
    tmp_path: Path,
) -> None:
    """The new PS's supervisor said it is loading (training/node.py announce): its silence
    after that is not frozen until the loading budget of its CPU has passed (24 s of silence,
    more than the 10 s that used to abandon a change, is waited for); past the budget it is."""
    run, service, _ = _run(tmp_path)
    change = _change(run)
    pods = _new_ps_running(change)
    peer = PeerInfo(9, ("h", 9))
    meta = {"role": "ps", "index": 0, "generation": change.generation}
    service.handle(peer, Message(USAGE, {**meta, "cpu_seconds": 0.3, "rss_mb": 30.0,
                                          LOADING: True}, ()))  # fmt: skip
    assert change.frozen(pods) is None
    budget = liveness.load_budget_s(change.target.cpu)
    assert budget >= liveness.LOAD_MIN_S > liveness.FIRST_REPORT_S
    _clock(run).advance(budget - 1.0)
    assert change.frozen(pods) is None  # loading, silent for budget - 1 s: waited for
    _clock(run).advance(2.0)
    frozen = change.frozen(pods)
    assert frozen is not None and "still loading its code" in frozen[1], frozen
    # Once it runs (its own reports), the silence of a few report intervals is frozen again.
    service.handle(peer, Message(USAGE, {**meta, "cpu_seconds": 0.1, "rss_mb": 200.0}, ()))
    assert change.frozen(pods) is None
    _clock(run).advance(ps_change.SILENT_S + 0.5)
    frozen = change.frozen(pods)
    assert frozen is not None and "no usage report for" in frozen[1], frozen
