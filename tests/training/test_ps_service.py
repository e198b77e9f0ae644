"""A parameter server over the real transport: PsService behind a wire.Server, used via RemotePs.

Two PS run in threads of the test process on 127.0.0.1. Every check compares the served state
with a copy of the same PsState updated directly, so the transport must neither lose, reorder
nor alter an update.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from dlrover_kfp.core.spec import ModelSpec
from dlrover_kfp.training import ps_server
from dlrover_kfp.training.data import Batch, RowRange, SyntheticCriteo
from dlrover_kfp.training.ps_client import RemotePs
from dlrover_kfp.training.ps_server import PsService
from dlrover_kfp.training.ps_state import PsConfig, PsState
from dlrover_kfp.training.step import InProcessPs, PendingRows, PushTag, Rows, WorkerModel
from dlrover_kfp.training.wire import (
    Connection,
    PeerUnavailableError,
    RemoteError,
    Server,
    connect,
    new_secret,
)

pytestmark = pytest.mark.timeout(30)

SPEC = ModelSpec(
    table_sizes=(300, 20, 5),
    embedding_dim=4,
    dense_features=3,
    bottom_mlp=(8, 4),
    top_mlp=(8, 1),
)
NUM_PS = 2
LR = 0.1
SEED = 4
SECRET = new_secret()


@dataclass
class RunningPs:
    service: PsService
    server: Server
    thread: threading.Thread


@dataclass
class Cluster:
    ps: list[RunningPs]
    conns: list[Connection]

    @property
    def states(self) -> list[PsState]:
        return [p.service.state for p in self.ps]

    def client(self, *, synchronous: bool) -> RemotePs:
        return RemotePs(self.conns, synchronous=synchronous)


def start_ps(k: int) -> RunningPs:
    service = PsService(PsState(PsConfig(SPEC, NUM_PS, k, LR, seed=SEED)), checkpointer=None)
    server = Server(("127.0.0.1", 0), SECRET, service.handle, threaded=True)  # as ps_server
    service.server = server
    return RunningPs(service, server, server.serve_in_thread(name=f"ps-{k}"))


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    ps = [start_ps(k) for k in range(NUM_PS)]
    conns = [connect(p.server.address, SECRET, timeout=10) for p in ps]
    try:
        yield Cluster(ps, conns)
    finally:
        for conn in conns:
            conn.close()
        for p in ps:
            p.server.close()


def twin(states: list[PsState]) -> list[PsState]:
    """Independent copies of the PS states, to update directly as the expected result."""
    return [copy.deepcopy(s) for s in states]


def random_push(
    rng: np.random.Generator, states: list[PsState], dense: bool
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor | None]:
    slots, grads = [], []
    for s in states:
        rows = s.weights.shape[0]
        n = int(rng.integers(0, 12))
        slots.append(torch.from_numpy(rng.choice(rows, size=n, replace=False).astype(np.int64)))
        grads.append(torch.from_numpy(rng.standard_normal((n, SPEC.embedding_dim), np.float32)))
    dense_grad = None
    if dense:
        assert states[0].dense is not None
        size = states[0].dense.numel()
        dense_grad = torch.from_numpy(rng.standard_normal(size, np.float32))
    return slots, grads, dense_grad


def apply_directly(
    states: list[PsState],
    slots: list[torch.Tensor],
    grads: list[torch.Tensor],
    dense_grad: torch.Tensor | None,
) -> None:
    for s, sl, g in zip(states, slots, grads, strict=True):
        if len(sl):
            s.apply_sparse(sl, g)
    if dense_grad is not None:
        states[0].apply_dense(dense_grad)


def assert_same_state(served: list[PsState], expected: list[PsState]) -> None:
    for a, b in zip(served, expected, strict=True):
        for name, tensor in b.arrays().items():
            assert torch.equal(a.arrays()[name], tensor), name


def test_lookup_returns_exactly_the_states_rows(cluster: Cluster) -> None:
    ps = cluster.client(synchronous=True)
    rng = np.random.default_rng(0)
    for with_dense in (True, False, True):
        slots = [
            torch.from_numpy(rng.integers(0, s.weights.shape[0], size=9).astype(np.int64))
            for s in cluster.states
        ]
        rows, dense = ps.lookup(slots, with_dense)
        assert len(rows) == NUM_PS
        for r, s, state in zip(rows, slots, cluster.states, strict=True):
            assert r.dtype == torch.float32
            assert torch.equal(r, state.weights[s])
        if with_dense:
            assert dense is not None
            assert torch.equal(dense, cluster.states[0].dense)
        else:
            assert dense is None
    # An empty request for a PS is answered with no rows.
    empty = torch.zeros(0, dtype=torch.int64)
    rows, _ = ps.lookup([empty, empty], False)
    assert [tuple(r.shape) for r in rows] == [(0, SPEC.embedding_dim)] * NUM_PS


def test_synchronous_push_applies_adagrad_as_the_state_would(cluster: Cluster) -> None:
    expected = twin(cluster.states)
    ps = cluster.client(synchronous=True)
    rng = np.random.default_rng(1)
    for i in range(5):
        slots, grads, dense_grad = random_push(rng, expected, dense=i % 2 == 0)
        ps.push(slots, grads, dense_grad)
        apply_directly(expected, slots, grads, dense_grad)
        # Synchronous: applied by the time push returns.
        assert_same_state(cluster.states, expected)
    assert cluster.ps[0].service.pushes == 5
    assert cluster.ps[1].service.pushes == 5
    # Something did change (the comparison is not between two untouched states).
    fresh = PsState(PsConfig(SPEC, NUM_PS, 0, LR, seed=SEED))
    assert not torch.equal(cluster.states[0].weights, fresh.weights)


def test_asynchronous_pushes_are_all_applied_after_flush(cluster: Cluster) -> None:
    expected = twin(cluster.states)
    ps = cluster.client(synchronous=False)
    rng = np.random.default_rng(2)
    n = 20
    for _ in range(n):
        slots, grads, dense_grad = random_push(rng, expected, dense=True)
        ps.push(slots, grads, dense_grad)
        apply_directly(expected, slots, grads, dense_grad)
    assert ps.pushes_sent == n
    assert not ps.applied(1)  # nothing waited for yet
    ps.flush()
    assert ps.applied(n)
    assert_same_state(cluster.states, expected)
    assert [p.service.pushes for p in cluster.ps] == [n] * NUM_PS


def test_asynchronous_lookup_sees_the_workers_own_earlier_pushes(cluster: Cluster) -> None:
    expected = twin(cluster.states)
    ps = cluster.client(synchronous=False)
    rng = np.random.default_rng(3)
    for _ in range(3):
        slots, grads, dense_grad = random_push(rng, expected, dense=True)
        ps.push(slots, grads, dense_grad)
        apply_directly(expected, slots, grads, dense_grad)
    every = [torch.arange(s.weights.shape[0]) for s in expected]
    rows, dense = ps.lookup(every, True)  # drains the acks first; no flush needed
    for r, state in zip(rows, expected, strict=True):
        assert torch.equal(r, state.weights)
    assert dense is not None
    assert torch.equal(dense, expected[0].dense)


@pytest.mark.parametrize("synchronous", [True, False])
def test_worker_over_the_wire_trains_like_in_process(cluster: Cluster, synchronous: bool) -> None:
    local = twin(cluster.states)
    data = SyntheticCriteo(64 * 4, SPEC.table_sizes, SPEC.dense_features, seed=1)
    remote_worker = WorkerModel(SPEC, cluster.client(synchronous=synchronous), seed=SEED)
    local_worker = WorkerModel(SPEC, InProcessPs(local), seed=SEED)
    for step in range(4):
        batch = data.read(RowRange(0, 64 * step, 64 * (step + 1)))
        assert remote_worker.train_step(batch) == local_worker.train_step(batch)
    held_out = data.read(RowRange(0, 0, 64))
    assert np.array_equal(remote_worker.predict(held_out), local_worker.predict(held_out))
    assert_same_state(cluster.states, local)


def test_checkpoint_without_checkpointer_is_an_error_and_serving_goes_on(
    cluster: Cluster,
) -> None:
    conn = cluster.conns[0]
    with pytest.raises(RemoteError, match="without a checkpoint directory") as err:
        conn.request("checkpoint", {"step": 7})
    assert err.value.remote_type == "ValueError"
    with pytest.raises(RemoteError, match="without a checkpoint directory"):
        conn.request("checkpoint_status")
    # The same connection still works.
    ps = cluster.client(synchronous=True)
    slots = [torch.tensor([0, 1]), torch.tensor([2])]
    rows, _ = ps.lookup(slots, False)
    assert torch.equal(rows[0], cluster.states[0].weights[:2])


def test_unknown_request_and_bad_requests_are_remote_errors(cluster: Cluster) -> None:
    with pytest.raises(RemoteError, match="unknown request 'frobnicate'"):
        cluster.conns[1].request("frobnicate")
    # Only PS 0 has dense parameters to send.
    with pytest.raises(RemoteError, match="holds no dense parameters"):
        cluster.conns[1].request("lookup", {"dense": True}, (np.array([0], dtype=np.int64),))
    before = cluster.states[1].weights.clone()
    rows = cluster.states[1].weights.shape[0]
    with pytest.raises(RemoteError):
        cluster.conns[1].request(
            "push", None, (np.array([rows], np.int64), np.ones((1, 4), np.float32))
        )
    assert torch.equal(cluster.states[1].weights, before)  # a refused push changes nothing
    assert cluster.conns[1].request("stats").meta["ps_index"] == 1


def test_stats_count_lookups_and_pushes(cluster: Cluster) -> None:
    ps = cluster.client(synchronous=True)
    slots = [torch.tensor([0, 1, 2]), torch.tensor([3, 4])]
    grads = [torch.ones(3, 4), torch.ones(2, 4)]
    for _ in range(3):
        ps.lookup(slots, True)
    ps.push(slots, grads, None)
    stats = [conn.request("stats").meta for conn in cluster.conns]
    assert [s["ps_index"] for s in stats] == [0, 1]
    assert [s["lookups"] for s in stats] == [3, 3]
    assert [s["pushes"] for s in stats] == [1, 1]
    assert [s["rows_served"] for s in stats] == [9, 6]
    assert stats[0]["state_bytes"] == cluster.states[0].nbytes
    assert stats[1]["state_bytes"] == cluster.states[1].nbytes < stats[0]["state_bytes"]
    assert all(s["busy_s"] >= 0 for s in stats)


def test_shutdown_stops_the_server(cluster: Cluster) -> None:
    running = cluster.ps[1]
    assert cluster.conns[1].request("shutdown").kind == "ok"
    running.thread.join(timeout=10)
    assert not running.thread.is_alive()
    with pytest.raises(PeerUnavailableError):
        connect(running.server.address, SECRET, timeout=2)
    # The other PS is unaffected.
    assert cluster.conns[0].request("stats").meta["ps_index"] == 0


@pytest.mark.parametrize(
    ("env", "threads"),
    [
        ({}, 1),
        ({"DLROVER_KFP_POD_CPU": "0.5"}, 1),
        ({"DLROVER_KFP_POD_CPU": "2"}, 2),
        ({"DLROVER_KFP_POD_CPU": "1.5"}, 2),
        ({"DLROVER_KFP_POD_CPU": "16"}, 4),
        ({"DLROVER_KFP_POD_CPU": "lots"}, 1),
    ],
)
def test_snapshot_copy_uses_the_pods_cpu(env: dict[str, str], threads: int) -> None:
    assert ps_server.snapshot_copy_threads(env) == threads


# ------------------------------------------------------------------- pipelining and threads


def batches_of(rows: int, batch: int, seed: int = 9) -> list[Batch]:
    data = SyntheticCriteo(rows, SPEC.table_sizes, SPEC.dense_features, seed=seed).read(
        RowRange(0, 0, rows)
    )
    return [data.slice(s, min(s + batch, rows)) for s in range(0, rows, batch)]


class Recording:
    """InProcessPs that logs the order of lookups and pushes."""

    def __init__(self, inner: InProcessPs) -> None:
        self.inner = inner
        self.log: list[str] = []
        self.lookups = 0
        self.pushes = 0

    @property
    def num_ps(self) -> int:
        return self.inner.num_ps

    def request(self, slots: Sequence[torch.Tensor], with_dense: bool) -> PendingRows:
        self.log.append(f"L{self.lookups}")
        self.lookups += 1
        return self.inner.request(slots, with_dense)

    def lookup(self, slots: Sequence[torch.Tensor], with_dense: bool) -> Rows:
        return self.request(slots, with_dense).wait()

    def push(
        self,
        slots: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor],
        dense_grad: torch.Tensor | None,
        tag: PushTag | None = None,
    ) -> None:
        self.log.append(f"P{self.pushes}")
        self.pushes += 1
        self.inner.push(slots, grads, dense_grad, tag)


def fresh_states() -> list[PsState]:
    return [PsState(PsConfig(SPEC, NUM_PS, k, LR, seed=SEED)) for k in range(NUM_PS)]


def test_the_pipeline_sends_each_lookup_one_push_ahead_and_a_none_drains_it() -> None:
    ps = Recording(InProcessPs(fresh_states()))
    model = WorkerModel(SPEC, ps, seed=SEED)
    b = batches_of(5 * 32, 32)
    items = [(b[0], 0), (b[1], 1), (b[2], 2), None, (b[3], 3), (b[4], 4)]

    tags = [tag for tag, _ in model.train_pipelined(items)]

    assert tags == [0, 1, 2, 3, 4]
    # Lookup n+1 goes out before push n (one step of staleness), except across the None,
    # where step 2 is pushed before the next lookup is even known.
    assert ps.log == ["L0", "L1", "P0", "L2", "P1", "P2", "L3", "L4", "P3", "P4"]


def test_pipelined_training_over_the_wire_equals_pipelined_in_process_bit_for_bit(
    cluster: Cluster,
) -> None:
    # One worker: a connection is served in order, so the PS see exactly the in-process order.
    expected = fresh_states()
    local = WorkerModel(SPEC, InProcessPs(expected), seed=SEED)
    remote_ps = cluster.client(synchronous=False)
    remote = WorkerModel(SPEC, remote_ps, seed=SEED)
    items = [(batch, i) for i, batch in enumerate(batches_of(12 * 64, 64))]

    local_losses = [loss for _, loss in local.train_pipelined(items)]
    remote_losses = [loss for _, loss in remote.train_pipelined(items)]
    remote_ps.flush()

    assert remote_losses == local_losses
    assert_same_state(cluster.states, expected)
    # And pipelining changed the arithmetic: strict order gives other values.
    strict = fresh_states()
    strict_model = WorkerModel(SPEC, InProcessPs(strict), seed=SEED)
    for batch, _ in items:
        strict_model.train_step(batch)
    assert not torch.equal(strict[0].weights, expected[0].weights)


def test_a_checkpoint_waits_for_requests_in_flight_and_holds_new_ones() -> None:
    service = PsService(fresh_states()[0], checkpointer=None)
    gate = service.gate
    order: list[str] = []
    inside = threading.Event()
    release = threading.Event()

    def request() -> None:
        with gate.shared():
            order.append("request in")
            inside.set()
            release.wait(5)
            order.append("request out")

    def checkpoint() -> None:
        with gate.exclusive():
            order.append("checkpoint")

    def late_request() -> None:
        with gate.shared():
            order.append("late request")

    first = threading.Thread(target=request)
    first.start()
    assert inside.wait(5)
    writer = threading.Thread(target=checkpoint)
    writer.start()
    time.sleep(0.05)  # the checkpoint now waits for the request in flight
    late = threading.Thread(target=late_request)
    late.start()
    time.sleep(0.05)  # and the late request waits behind the checkpoint
    assert order == ["request in"]
    release.set()
    for t in (first, writer, late):
        t.join(5)
    assert order == ["request in", "request out", "checkpoint", "late request"]


def test_concurrent_pushes_from_several_connections_all_land(cluster: Cluster) -> None:
    # Disjoint rows per client: Hogwild races cannot lose anything, so the result is exact.
    clients = 4
    per_client = 25
    rows = cluster.states[1].weights.shape[0]
    before = cluster.states[1].weights.clone()
    errors: list[BaseException] = []

    def client(who: int) -> None:
        try:
            with connect(cluster.ps[1].server.address, SECRET, timeout=10) as conn:
                ps = RemotePs([conn])
                slots = torch.arange(who, rows, clients)
                grads = torch.full((len(slots), SPEC.embedding_dim), 0.5)
                for _ in range(per_client):
                    ps.push([slots], [grads], None)
                ps.flush()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(w,)) for w in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors, errors[0]
    # Replay the same pushes directly, row by row: Adagrad on a constant gradient.
    expected = PsState(PsConfig(SPEC, NUM_PS, 1, LR, seed=SEED))
    every = torch.arange(rows)
    for _ in range(per_client):
        expected.apply_sparse(every, torch.full((rows, SPEC.embedding_dim), 0.5))
    torch.testing.assert_close(cluster.states[1].weights, expected.weights)
    assert not torch.equal(cluster.states[1].weights, before)
    assert cluster.ps[1].service.pushes == clients * per_client


def test_ps_zero_counts_the_rows_it_applied_per_shard_and_checkpoints_the_tally(
    cluster: Cluster,
) -> None:
    """Pushes carry their shard (core/applied.py): a shard part-trained, then trained whole,
    shows its first part as applied twice; a bad tag applies nothing."""
    ps = cluster.client(synchronous=True)
    slots = [torch.tensor([0, 1]), torch.tensor([2])]
    grads = [torch.ones(2, 4), torch.ones(1, 4)]
    dense = torch.zeros(cluster.states[0].dense.numel())  # type: ignore[union-attr]
    ps.push(slots, grads, dense, PushTag(0, 5, 0, 4, 10, last=False))  # stopped after 4 rows
    for offset, rows in ((0, 4), (4, 4), (8, 2)):  # shard 5 again, whole
        ps.push(slots, grads, dense, PushTag(0, 5, offset, rows, 10, last=rows == 2))
    applied = cluster.conns[0].request("stats").meta["applied"]
    assert applied == {"partial": [], "whole": [[0, 5]], "twice": [[0, 5, 4]]}
    assert cluster.conns[1].request("stats").meta["applied"]["twice"] == []  # PS 0 counts
    before = cluster.states[0].dense.clone()  # type: ignore[union-attr]
    with pytest.raises(RemoteError, match="meta key 'tag'"):
        cluster.conns[0].request(
            "push",
            {"tag": [0, 5, 8, 4, 10, 0]},
            (np.array([0], np.int64), np.ones((1, 4), np.float32), np.ones_like(dense.numpy())),
        )
    assert torch.equal(cluster.states[0].dense, before)  # type: ignore[arg-type]
    assert cluster.conns[0].request("stats").meta["applied"] == applied
