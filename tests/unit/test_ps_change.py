"""One PS change as its protocol (runtime/ps_change.py), step by step, without a process.

The pods are statuses (tests/fakes/pods.py) and the master's clock a fake one
(tests/fakes/clock.py); what the pods' processes would do is scripted at every tick of that
clock against the master's real RPC service: the new PS asks for its configuration (copies its
rows when told, says so, and registers once given the rest), the workers pause when asked. The
PS the master's checkpoint coordinator talks to answer on the real wire, each a tiny server
that writes its checkpoint part and stops when told. Every test moves PS 0 of two to a new pod
(generation 1) and asserts the order in which the parts acted.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dlrover_kfp.core.node_id import NodeId
from dlrover_kfp.ports import PodPhase
from dlrover_kfp.runtime.elastic import ElasticPolicy
from dlrover_kfp.runtime.job import JobRun
from dlrover_kfp.runtime.master import MasterService
from dlrover_kfp.runtime.ps_change import FIRST_REPORT_S, SILENT_S, PsChange
from dlrover_kfp.training import checkpoint as ckpt
from dlrover_kfp.training.checkpoint.format import PartMeta
from dlrover_kfp.training.checkpoint.persist import PartRecord
from dlrover_kfp.training.master_protocol import CONFIG, READY, REGISTER
from dlrover_kfp.training.wire import Message, PeerInfo, Server
from tests.fakes.clock import FakeClock
from tests.fakes.pods import RunningPods
from tests.unit.test_elastic_master import build_run

NEW_PS = "pause-ps-0-g1"
#: what the new PS says its move carried (REGISTER's ``moved``)
MOVED = {"rows": 55.0, "bytes": 2**20, "copy_s": 0.5, "finish_s": 0.01, "resent_rows": 3.0}

Run = JobRun[ElasticPolicy]


class _Ps:
    """A PS as the master's checkpoint coordinator sees it, on the real wire: it writes its
    part of a checkpoint into the run's directory, says it is persisted, and on ``shutdown``
    ends its pod. Every request it acts on goes into ``log``."""

    def __init__(self, run: Run, index: int, pod: str, log: list[str]) -> None:
        self.run, self.index, self.pod, self.log = run, index, pod, log
        self.part: PartRecord | None = None
        self.server = Server(("127.0.0.1", 0), run.secret, self.handle)
        self.server.serve_in_thread()

    def handle(self, peer: PeerInfo, msg: Message) -> Message:
        if msg.kind == "checkpoint":
            self.log.append(f"checkpoint {self.pod}")
            self.part = self._write(int(msg.meta["step"]))
            return Message("ok", {"blocked_s": 0.0}, ())
        if msg.kind == "checkpoint_status":
            assert self.part is not None
            meta = {"step": self.part.step, "done": True, "error": None}
            return Message("ok", {**meta, "part": self.part.to_dict()}, ())
        if msg.kind == "transfer_untrack":
            self.log.append(f"untrack {self.pod} {msg.meta['generation']}")
            return Message("ok", {}, ())
        assert msg.kind == "shutdown", msg.kind
        self.log.append(f"shutdown {self.pod}")
        pods = self.run.backend
        assert isinstance(pods, RunningPods)
        pods.set_phase(self.pod, PodPhase.SUCCEEDED)
        return Message("ok", {}, ())

    def _write(self, step: int) -> PartRecord:
        data = bytes(8)
        tmp = self.run.checkpoint_dir / f"step-{step:010d}.tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / f"ps-{self.index}.bin").write_bytes(data)
        meta = PartMeta(self.run.run_id, 2, self.index, 110, 4, (100, 10))
        return PartRecord(meta, step, 0, f"ps-{self.index}.bin", 8, zlib.crc32(data), ())


class _Processes:
    """What the new PS and the workers do at every tick of the fake clock, against the
    master's service; each thing they do goes into ``log`` as it happens."""

    def __init__(self, run: Run, service: MasterService, new_ps: _Ps, log: list[str]) -> None:
        self.run, self.service, self.new_ps, self.log = run, service, new_ps, log
        self.ps_meta: dict[str, Any] = {"role": "ps", "index": 0, "generation": 1}
        self.registered = False
        #: set to make the new PS fail once it has been asked to copy
        self.fail_copy = False
        #: set to make the new PS run without a word to the master (frozen)
        self.silent = False
        #: workers that do not pause (frozen)
        self.frozen_workers: set[int] = set()

    def __call__(self, now: float) -> None:
        pods = self.run.backend
        assert isinstance(pods, RunningPods)
        pod = pods.pods.get(NEW_PS)
        if pod is not None and f"launch {NEW_PS}" not in self.log:
            self.log.append(f"launch {NEW_PS}")
        if pod is not None and pod.phase is PodPhase.RUNNING and not self.silent:
            self._new_ps(pods)
        switch = self.run.state.switch
        if switch is not None and switch.pausing and "pause" not in self.log:
            self.log.append("pause")
            for k in set(range(2)) - self.frozen_workers:
                meta = {"generation": switch.generation, "worker": NodeId.worker(k).key}
                self._ask(READY, meta)

    def _new_ps(self, pods: RunningPods) -> None:
        if self.registered:
            return
        reply = self._ask(CONFIG, self.ps_meta)
        if "copy" in reply:
            self.log.append("copy")
            if self.fail_copy:
                pods.set_phase(NEW_PS, PodPhase.FAILED)
                return
            self.ps_meta["copied"] = True
            self._ask(CONFIG, self.ps_meta)
        elif not reply.get("wait"):
            self.log.append("migrate" if "migrate" in reply else "restore")
            address = list(self.new_ps.server.address)
            self._ask(REGISTER, {"index": 0, "generation": 1, "address": address, "moved": MOVED})
            self.registered = True

    def _ask(self, kind: str, meta: dict[str, Any]) -> dict[str, Any]:
        return self.service.handle(PeerInfo(9, ("h", 9)), Message(kind, meta, ())).meta


@pytest.fixture
def moving(tmp_path: Path) -> Iterator[tuple[Run, _Processes, list[str]]]:
    """A run with two PS serving (each a :class:`_Ps`), its checkpoint coordinator connected
    to them, and two workers configured; the new PS 0 is a :class:`_Ps` too, which
    :class:`_Processes` registers. Yields the run, the scripted processes and the log."""
    run, service, _ = build_run(tmp_path)
    run.start = run.clock.monotonic()
    log: list[str] = []
    old = [_Ps(run, k, run.pod_name(NodeId("ps", k)), log) for k in range(2)]
    for k, ps in enumerate(old):
        run.launch(NodeId("ps", k), run.ps)
        run.state.ps_addresses[k] = ps.server.address
    run.coordinator = run.new_coordinator(run.state)
    new = _Ps(run, 0, NEW_PS, log)
    processes = _Processes(run, service, new, log)
    assert isinstance(run.clock, FakeClock)
    run.clock.world.append(processes)
    yield run, processes, log
    run.coordinator.close()
    assert run.server is not None
    for server in [run.server, *(ps.server for ps in [*old, new])]:
        server.close()


def _path(change: PsChange) -> str:
    """The steps the change went through."""
    return " ".join(change.history)


def _change(run: Run, *, live: bool) -> PsChange:
    """The policy's change moving PS 0 to a new pod of the same size."""
    return run.policy._ps_change(run.ps, frozenset({0}), live=live)


def test_a_live_change_copies_pauses_finishes_and_switches_in_order(
    moving: tuple[Run, _Processes, list[str]],
) -> None:
    run, processes, log = moving
    old_coordinator = run.coordinator
    before = dict(run.state.ps_addresses)
    change = _change(run, live=True)
    outcome = change.carry_out()
    assert _path(change) == "starting copying pausing finishing switched"
    # The old PS 0 stops once its last checkpoint is committed, off the main thread; PS 1 stays.
    assert outcome.retiring is not None
    outcome.retiring.join(10.0)
    # The copy while training went on; the rows updated since only once every worker paused;
    # the old PS stopped last.
    assert log == [f"launch {NEW_PS}", "copy", "pause", "migrate", "shutdown pause-ps-0"]
    state = run.state
    assert state.ps_addresses == {0: processes.new_ps.server.address, 1: before[1]}
    assert (state.generation, state.num_ps, state.switch) == (1, 2, None)
    assert run.coordinator is not old_coordinator
    assert dict(outcome.ps_nodes) == {0: NodeId("ps", 0, 1), 1: NodeId("ps", 1)}
    assert outcome.pause_s is not None and 0 < outcome.pause_s < 0.1
    assert outcome.stopped_workers == ()
    [event] = run.events
    assert event.kind == "migration"
    assert "PS 0 moved to new pods (2 x 0.5 cpu, 1024 MiB) over the network: 55 rows" in (
        event.detail
    )
    assert "pause-ps-0" in run.stopping


def test_the_policy_keeps_what_a_change_leaves_and_relaunches_a_worker_it_stopped(
    moving: tuple[Run, _Processes, list[str]],
) -> None:
    """Worker 1 froze (no usage report for SILENT_S): the change does not wait for it, stops
    it, and the policy launches it again, with the new PS nodes and the pause kept."""
    run, processes, _ = moving
    processes.frozen_workers = {1}
    run.state.usage[NodeId.worker(1)] = [(run.clock.monotonic() - SILENT_S - 1, 9.0, 300.0, 1.0)]
    run.policy._switch_ps(run.ps, frozenset({0}))
    run.policy.finish()  # the old PS 0 stopped
    assert [(e.kind, e.node) for e in run.events] == [
        ("straggler", "pause-worker-1"),
        ("migration", None),
    ]
    assert "pause-worker-1" in {s.name for s in run.backend.statuses()}  # launched again
    assert "pause-worker-1" not in run.stopping
    assert run.policy._ps_nodes == {0: NodeId("ps", 0, 1), 1: NodeId("ps", 1)}
    [pause] = run.policy.ps_pauses
    assert 0 < pause < 0.1


def test_a_new_ps_that_fails_while_copying_abandons_the_change(
    moving: tuple[Run, _Processes, list[str]],
) -> None:
    """The old PS serve on: same addresses, same generation, same coordinator; the workers
    were never asked to pause."""
    run, processes, log = moving
    processes.fail_copy = True
    addresses = dict(run.state.ps_addresses)
    coordinator = run.coordinator
    change = _change(run, live=True)
    outcome = change.carry_out()
    assert _path(change) == "starting copying abandoned"
    # The old PS were marking rows for the new one: they are told to stop.
    assert log == [f"launch {NEW_PS}", "copy", "untrack pause-ps-0 1", "untrack pause-ps-1 1"]
    assert run.state.ps_addresses == addresses
    assert (run.state.generation, run.state.switch) == (0, None)
    assert run.coordinator is coordinator
    assert dict(outcome.ps_nodes) == {0: NodeId("ps", 0), 1: NodeId("ps", 1)}
    assert (outcome.pause_s, outcome.retiring) == (None, None)
    assert NEW_PS not in {s.name for s in run.backend.statuses()} and NEW_PS in run.stopping
    [event] = run.events
    assert event.detail.startswith(f"PS change abandoned: pod {NEW_PS}")


def test_a_new_ps_that_never_reports_abandons_the_change_within_the_first_report_time(
    moving: tuple[Run, _Processes, list[str]],
) -> None:
    """Running (by the backend) without a word: frozen after FIRST_REPORT_S, killed, not
    waited for until the startup timeout (180 s)."""
    run, processes, log = moving
    processes.silent = True
    change = _change(run, live=True)
    started = run.clock.monotonic()
    change.carry_out()
    took = run.clock.monotonic() - started
    assert FIRST_REPORT_S < took <= FIRST_REPORT_S + 0.02, took
    assert _path(change) == "starting copying abandoned"
    # Untracked though it never asked for its copy: a frozen PS may have sent its TRACK.
    assert log == [f"launch {NEW_PS}", "untrack pause-ps-0 1", "untrack pause-ps-1 1"]
    assert (run.state.generation, run.state.switch) == (0, None)
    assert NEW_PS not in {s.name for s in run.backend.statuses()}
    [event] = run.events
    assert "frozen: no usage report within" in event.detail


def test_stop_first_checkpoints_then_stops_the_old_ps_then_starts_the_new_one(
    moving: tuple[Run, _Processes, list[str]],
) -> None:
    run, processes, log = moving
    change = _change(run, live=False)
    outcome = change.carry_out()
    assert _path(change) == "starting pausing checkpointing stopping_old restoring switched"
    assert log == [
        "pause",
        "checkpoint pause-ps-0",
        "checkpoint pause-ps-1",
        "shutdown pause-ps-0",
        f"launch {NEW_PS}",
        "restore",  # the new PS restores the checkpoint: no copy over the network
    ]
    assert ckpt.list_checkpoints(run.checkpoint_dir) == [0]  # committed before the stop
    assert run.state.ps_addresses[0] == processes.new_ps.server.address
    assert run.state.generation == 1 and outcome.retiring is None
    [event] = run.events
    assert "from the checkpoint of step 0, after the old ones stopped" in event.detail


def test_a_change_moves_only_forward(moving: tuple[Run, _Processes, list[str]]) -> None:
    run, _, _ = moving
    change = _change(run, live=True)
    with pytest.raises(RuntimeError, match="None -> copying is no step"):
        change.copy()
    change.start()
    with pytest.raises(RuntimeError, match="starting -> finishing is no step"):
        change.finish()
