"""The master's RPC handlers: PS registration, worker configuration, shard leases and reports."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from dlrover_kfp.core.node_id import NodeId
from dlrover_kfp.core.shards import ShardLedger
from dlrover_kfp.runtime.master import MasterService, MasterState, PsSwitch
from dlrover_kfp.training.master_protocol import (
    CONFIG,
    GET_SHARD,
    READY,
    REGISTER,
    REPORT,
    SWITCH,
    USAGE,
)
from dlrover_kfp.training.wire import (
    Message,
    PeerInfo,
    RemoteError,
    Server,
    connect,
    new_secret,
)

RANGES = ((0, 0, 100), (0, 100, 200), (0, 200, 250))
JOB_CONFIG = {"job_id": "job-1", "seed": 3, "spec": {"name": "demo"}}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_service(num_ps: int = 2, lease_s: float = 60.0) -> tuple[MasterService, Clock]:
    ledger = ShardLedger(ranges=RANGES, epochs=1, lease_s=lease_s)
    state = MasterState(ledger=ledger, num_ps=num_ps, job_config=dict(JOB_CONFIG))
    clock = Clock()
    return MasterService(state, clock=clock), clock


def call(service: MasterService, peer: PeerInfo, kind: str, **meta: Any) -> Message:
    return service.handle(peer, Message(kind, meta, ()))


def get_shard(service: MasterService, peer: PeerInfo, worker: str) -> dict[str, Any]:
    reply = call(service, peer, GET_SHARD, worker=worker)
    assert reply.kind == "shard"
    return reply.meta


def report(
    service: MasterService, peer: PeerInfo, worker: str, shard: int, epoch: int = 0, **extra: Any
) -> bool:
    meta = {"samples": 100, "steps": 2, "loss_sum": 1.5, **extra}
    reply = call(service, peer, REPORT, worker=worker, shard=shard, epoch=epoch, **meta)
    assert reply.kind == "ok"
    return bool(reply.meta["accepted"])


def test_worker_config_waits_until_every_ps_registered() -> None:
    service, _ = make_service(num_ps=2)
    ps1, ps0, worker = PeerInfo(1, ("h", 1)), PeerInfo(2, ("h", 2)), PeerInfo(3, ("h", 3))
    assert call(service, worker, CONFIG, role="worker", index=0).meta == {"wait": True}
    assert call(service, ps1, REGISTER, index=1, address=["10.0.0.2", 7001]).kind == "ok"
    assert call(service, worker, CONFIG, role="worker", index=0).meta == {"wait": True}
    assert not service.state.all_ps_registered
    call(service, ps0, REGISTER, index=0, address=["10.0.0.1", 7000])
    assert service.state.all_ps_registered
    reply = call(service, worker, CONFIG, role="worker", index=0)
    assert reply.kind == "config"
    # The job config, with the PS addresses in PS-index order (not registration order).
    addresses = [["10.0.0.1", 7000], ["10.0.0.2", 7001]]
    assert reply.meta == {**JOB_CONFIG, "ps": addresses, "generation": 0}
    assert "wait" not in reply.meta


def test_ps_get_their_config_without_waiting() -> None:
    service, _ = make_service(num_ps=2)
    reply = call(service, PeerInfo(1, ("h", 1)), CONFIG, role="ps")
    assert reply.meta == {**JOB_CONFIG, "ps": [], "generation": 0}


def test_re_registration_replaces_the_address() -> None:
    service, _ = make_service(num_ps=1)
    peer = PeerInfo(1, ("h", 1))
    call(service, peer, REGISTER, index=0, address=["a", 1])
    call(service, peer, REGISTER, index=0, address=["b", 2])
    assert service.state.ps_addresses == {0: ("b", 2)}


@pytest.mark.parametrize("index", [-1, 2, 7])
def test_register_out_of_range_is_refused(index: int) -> None:
    service, _ = make_service(num_ps=2)
    with pytest.raises(ValueError, match="out of range"):
        call(service, PeerInfo(1, ("h", 1)), REGISTER, index=index, address=["h", 1])
    assert service.state.ps_addresses == {}


def test_unknown_request_is_refused() -> None:
    service, _ = make_service()
    with pytest.raises(ValueError, match="unknown request"):
        call(service, PeerInfo(1, ("h", 1)), "launch_missiles")


def test_get_shard_leases_and_report_completes() -> None:
    service, _ = make_service()
    peer = PeerInfo(1, ("h", 1))
    first = get_shard(service, peer, "w0")
    assert first == {
        "shard": {"id": 0, "source": 0, "start": 0, "end": 100, "epoch": 0},
        "finished": False,
    }
    assert peer.state["leases_for"] == "w0"
    assert report(service, peer, "w0", 0, samples=100, steps=2, loss_sum=1.5, bad_rows=1)
    ledger = service.state.ledger
    assert ledger.done == {0}
    assert ledger.rows_done == 100
    stats = service.state.workers["w0"]
    assert (stats.samples, stats.steps, stats.loss_sum, stats.bad_rows) == (100, 2, 1.5, 1)

    for expected in (1, 2):
        shard = get_shard(service, peer, "w0")["shard"]
        assert shard["id"] == expected
        assert report(service, peer, "w0", expected, samples=shard["end"] - shard["start"])
    assert get_shard(service, peer, "w0") == {"shard": None, "finished": True}
    assert ledger.finished
    assert service.state.totals() == (250, 6, 4.5, 1)


def test_no_shard_while_all_are_leased_is_not_finished() -> None:
    service, _ = make_service()
    peer = PeerInfo(1, ("h", 1))
    for _ in RANGES:
        assert get_shard(service, peer, "w0")["shard"] is not None
    assert get_shard(service, PeerInfo(2, ("h", 2)), "w1") == {"shard": None, "finished": False}


def test_foreign_and_expired_reports_are_refused_but_samples_count() -> None:
    service, clock = make_service(lease_s=60.0)
    a, b = PeerInfo(1, ("h", 1)), PeerInfo(2, ("h", 2))
    assert get_shard(service, a, "wa")["shard"]["id"] == 0
    # Another worker reporting wa's shard: refused, the lease stays wa's.
    assert not report(service, b, "wb", 0, samples=40, steps=1, loss_sum=0.5)
    assert service.state.ledger.doing[0].worker == "wa"
    assert service.state.ledger.rows_done == 0

    # wa stalls past its lease; wb is handed the shard again and wa's late report is refused.
    clock.now = 61.0
    assert get_shard(service, b, "wb")["shard"]["id"] == 0
    assert not report(service, a, "wa", 0, samples=100, steps=3, loss_sum=2.0, bad_rows=2)
    assert report(service, b, "wb", 0, samples=100, steps=3, loss_sum=1.0)
    assert service.state.ledger.rows_done == 100
    # The refused reports' work was still done (the PS were updated): it counts in the totals.
    assert service.state.totals() == (240, 7, 3.5, 2)
    assert service.state.workers["wa"].samples == 100
    assert service.state.workers["wa"].last_report == 61.0
    assert service.state.workers["wb"].samples == 140


def test_disconnect_requeues_the_peers_leases() -> None:
    service, _ = make_service()
    a, b = PeerInfo(1, ("h", 1)), PeerInfo(2, ("h", 2))
    assert get_shard(service, a, "wa")["shard"]["id"] == 0
    assert get_shard(service, b, "wb")["shard"]["id"] == 1
    assert get_shard(service, a, "wa")["shard"]["id"] == 2
    service.on_disconnect(a)
    ledger = service.state.ledger
    assert list(ledger.todo) == [0, 2]
    assert set(ledger.doing) == {1}
    # A peer that never asked for a shard (a PS, say) requeues nothing.
    service.on_disconnect(PeerInfo(3, ("h", 3)))
    assert set(ledger.doing) == {1}
    # The requeued shards are handed out again; wa's stale report is refused.
    assert get_shard(service, b, "wb")["shard"]["id"] == 0
    assert not report(service, a, "wa", 0)
    assert report(service, b, "wb", 0)


def test_over_the_wire_a_dropped_worker_gives_its_shards_back() -> None:
    """The real server calls on_disconnect when a worker's connection ends."""
    service, _ = make_service(num_ps=1)
    secret = new_secret()
    disconnected = threading.Event()

    def on_disconnect(peer: PeerInfo) -> None:
        service.on_disconnect(peer)
        disconnected.set()

    server = Server(("127.0.0.1", 0), secret, service.handle, on_disconnect=on_disconnect)
    server.serve_in_thread()
    try:
        with connect(server.address, secret, timeout=10) as conn:
            with pytest.raises(RemoteError, match="out of range"):
                conn.request(REGISTER, {"index": 5, "address": ["h", 1]})
            shard = conn.request(GET_SHARD, {"worker": "w0"}).meta["shard"]
            assert shard["id"] == 0
            assert service.state.ledger.doing[0].worker == "w0"
        assert disconnected.wait(10)  # set after the requeue
        assert not service.state.ledger.doing
        assert list(service.state.ledger.todo) == [0, 1, 2]
    finally:
        server.close()


def test_a_relaunched_worker_keeps_its_leases_when_its_predecessor_drops() -> None:
    # worker-0 is relaunched: the new process leases a shard before the master sees the old
    # connection drop. The drop must give back the old process's lease only.
    service, _ = make_service()
    old, new = PeerInfo(1, ("h", 1)), PeerInfo(2, ("h", 2))
    old_shard = call(service, old, GET_SHARD, worker="worker-0", incarnation="a").meta["shard"]
    new_shard = call(service, new, GET_SHARD, worker="worker-0", incarnation="b").meta["shard"]
    service.on_disconnect(old)
    ledger = service.state.ledger
    assert ledger.todo[0] == old_shard["id"], "the old lease is back at the front"
    assert new_shard["id"] in ledger.doing, "the new process's lease survives the old drop"
    accepted = report(service, new, "worker-0", new_shard["id"], incarnation="b")
    assert accepted
    # The dead process's late report of its shard is not taken: the shard is queued again.
    assert not report(service, old, "worker-0", old_shard["id"], incarnation="a")
    assert service.state.workers["worker-0"].samples == 200, "progress counts per name"


def test_a_ps_switch_pauses_workers_and_hands_them_the_new_ps() -> None:
    """The protocol of a live PS change (runtime/master.py), step by step."""
    service, _ = make_service(num_ps=2)
    state = service.state
    ps0, ps1, new_ps1, w0, w1 = (PeerInfo(k, ("h", k)) for k in range(5))
    call(service, ps0, REGISTER, index=0, address=["a", 1])
    call(service, ps1, REGISTER, index=1, address=["b", 2])
    assert call(service, w0, CONFIG, role="worker", index=0).meta["generation"] == 0
    leased = get_shard(service, w0, "worker-0")["shard"]["id"]

    config = {**JOB_CONFIG, "num_ps": 2, "restore": True}
    switch = state.switch = PsSwitch(1, 2, frozenset({1}), config)
    # Standby: the new PS 1 waits; training goes on (not pausing yet).
    assert call(service, new_ps1, CONFIG, role="ps", index=1, generation=1).meta == {"wait": True}
    assert switch.standby == {1}
    assert get_shard(service, w0, "worker-0")["shard"] is not None
    # A PS of this generation for an index it does not replace is refused.
    with pytest.raises(ValueError, match="not replaced"):
        call(service, new_ps1, CONFIG, role="ps", index=0, generation=1)
    # Pausing: no lease, the answer says switch; reports are accepted and say switch too.
    switch.pausing = True
    meta = get_shard(service, w0, "worker-0")
    assert meta == {"shard": None, "finished": False, SWITCH: 1}
    reply = call(
        service,
        w0,
        REPORT,
        worker="worker-0",
        shard=leased,
        epoch=0,
        samples=100,
        steps=2,
        loss_sum=1.5,
    )
    assert reply.meta == {"accepted": True, SWITCH: 1}
    # A worker that starts now waits for the new set instead of connecting to the old one.
    assert call(service, w1, CONFIG, role="worker", index=1).meta == {"wait": True}
    call(service, w0, READY, worker="worker-0", generation=1)
    assert switch.ready == {"worker-0"}
    assert call(service, w0, CONFIG, role="worker", index=0).meta == {"wait": True}
    # Released: the new PS gets the new generation's config, restores and registers.
    switch.released = True
    reply = call(service, new_ps1, CONFIG, role="ps", index=1, generation=1)
    assert reply.meta == {**config, "generation": 1}
    call(service, new_ps1, REGISTER, index=1, generation=1, address=["c", 3])
    assert switch.addresses == {1: ("c", 3)}
    assert state.ps_addresses == {0: ("a", 1), 1: ("b", 2)}  # not in use before the switch
    # A registration for an unknown generation is refused.
    with pytest.raises(ValueError, match="generation 7"):
        call(service, new_ps1, REGISTER, index=1, generation=7, address=["d", 4])
    # The switch (what the elastic run does once every new PS registered).
    with state.lock:
        state.ps_addresses = {0: ("a", 1), 1: switch.addresses[1]}
        state.generation, state.switch = 1, None
    reply = call(service, w0, CONFIG, role="worker", index=0)
    assert reply.meta["ps"] == [["a", 1], ["c", 3]]
    assert reply.meta["generation"] == 1
    assert state.configured == {"worker-0": 1}
    assert get_shard(service, w0, "worker-0")["shard"] is not None


def test_self_reported_usage_is_cpu_time_over_wall_time_of_the_last_two_reports() -> None:
    service, clock = make_service()
    peer = PeerInfo(1, ("h", 1))
    state = service.state

    def usage(role: str, index: int, cpu: float, rss: float, generation: int = 0) -> None:
        call(service, peer, USAGE, role=role, index=index, generation=generation,
             cpu_seconds=cpu, rss_mb=rss)  # fmt: skip

    usage("worker", 0, 10.0, 300.0)
    assert state.self_reported_usage(clock.now, max_age_s=5.0) == {}  # one report: no rate
    clock.now = 2.0
    usage("worker", 0, 11.0, 310.0)  # 1 CPU second in 2 s: half a core
    usage("ps", 0, 5.0, 900.0, generation=1)
    assert state.self_reported_usage(clock.now, 5.0) == {NodeId.worker(0): (0.5, 310.0)}
    clock.now = 4.0
    usage("worker", 0, 13.0, 320.0)  # the last two only: 2 s in 2 s
    assert state.self_reported_usage(clock.now, 5.0)[NodeId.worker(0)] == (1.0, 320.0)
    # a new pod of the same name starts its CPU time over: no negative rate, one reading
    clock.now = 6.0
    usage("worker", 0, 0.5, 200.0)
    assert NodeId.worker(0) not in state.self_reported_usage(clock.now, 5.0)
    # a pod that stopped reporting is not reported for ever
    clock.now = 20.0
    assert state.self_reported_usage(clock.now, 5.0) == {}


def test_self_reported_cpu_is_over_the_pods_own_interval_not_the_arrivals() -> None:
    """A report held up on its way arrives 1.5 s after the one before though it was read 2 s
    after it: the arrivals would say 1 CPU second in 1.5 s (0.67 cores) for a pod held to
    half a core. The pod's own clock says 0.5."""
    service, clock = make_service()
    peer = PeerInfo(1, ("h", 1))
    meta = {"role": "worker", "index": 0, "generation": 0}
    call(service, peer, USAGE, **meta, cpu_seconds=10.0, rss_mb=300.0, at=100.0)
    clock.now = 1.5
    call(service, peer, USAGE, **meta, cpu_seconds=11.0, rss_mb=300.0, at=102.0)
    assert service.state.self_reported_usage(clock.now, 5.0) == {NodeId.worker(0): (0.5, 300.0)}


def test_a_restore_leases_a_part_applied_shard_from_its_prefix_and_names_the_cause() -> None:
    """core/applied.py: after a rollback the shard PS 0 had part-applied is leased from where
    that part ends; one it holds whole while the ledger has it to do is put down to the
    rollback (trained again whole)."""
    ranges = tuple((0, i * 100, (i + 1) * 100) for i in range(4))
    initial = ShardLedger(ranges, epochs=1)
    checkpointed = ShardLedger(ranges, epochs=1)
    state = MasterState(ledger=initial, num_ps=1, job_config=dict(JOB_CONFIG))
    extra = {
        "shards": checkpointed.to_dict(),
        "stats": {},
        "applied": {"partial": [[0, 2, 40, 100, 40]], "whole": [[0, 1]], "twice": []},
    }
    with state.lock:
        state.restore_committed(extra, initial, cause="rollback")
    assert state.ledger.skip == {2: 40}
    assert state.requeued == {(0, 1): "rollback", (0, 2): "rollback"}
