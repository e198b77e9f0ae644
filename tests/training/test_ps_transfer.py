"""A PS's state moved to the PS that replace it, over the wire (ps_transfer against PsService).

The old PS run as real servers in threads of the test process; pushes reach them over the wire
while the new PS copy, and more land between the copy and its finish. After the finish every
new PS must hold, bit for bit, what the old PS hold for its rows: a row lost, stale or sent to
the wrong slot fails ``torch.equal``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from dlrover_kfp.core.documents import to_dict
from dlrover_kfp.core.spec import ModelSpec
from dlrover_kfp.training import node
from dlrover_kfp.training import transfer_protocol as transfer
from dlrover_kfp.training.master_protocol import CONFIG, REGISTER
from dlrover_kfp.training.ps_server import PsService
from dlrover_kfp.training.ps_state import PsConfig, PsState
from dlrover_kfp.training.ps_transfer import TransferError, copy_rows, finish_copy
from dlrover_kfp.training.wire import (
    Connection,
    Message,
    PeerInfo,
    RemoteError,
    Server,
    connect,
    new_secret,
)

pytestmark = pytest.mark.timeout(60)

SPEC = ModelSpec(
    table_sizes=(2000, 300, 7),
    embedding_dim=4,
    dense_features=3,
    bottom_mlp=(8, 4),
    top_mlp=(8, 1),
)
LR = 0.1
SEED = 5
GENERATION = 3
SECRET = new_secret()
#: ~25 rows a request at d = 4: many requests, so that pushes land between them
SMALL_CHUNK = 1024


@dataclass
class OldPs:
    services: list[PsService]
    servers: list[Server]

    @property
    def states(self) -> list[PsState]:
        return [s.state for s in self.services]

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [s.address for s in self.servers]


@contextmanager
def old_ps(num_ps: int, spec: ModelSpec = SPEC) -> Iterator[OldPs]:
    services = [
        PsService(PsState(PsConfig(spec, num_ps, j, LR, seed=SEED)), None) for j in range(num_ps)
    ]
    servers = []
    for service in services:
        server = Server(("127.0.0.1", 0), SECRET, service.handle, threaded=True)  # as ps_server
        service.server = server
        server.serve_in_thread(name=f"old-ps-{service.state.config.ps_index}")
        servers.append(server)
    try:
        yield OldPs(services, servers)
    finally:
        for server in servers:
            server.close()


def push_once(conns: Sequence[Connection], states: list[PsState], rng: np.random.Generator) -> None:
    """A random push to every old PS, over the wire (and a dense gradient to PS 0)."""
    for j, conn in enumerate(conns):
        rows = states[j].weights.shape[0]
        slots = rng.choice(rows, size=min(rows, 40), replace=False).astype(np.int64)
        grads = rng.standard_normal((len(slots), SPEC.embedding_dim), np.float32)
        arrays: tuple[np.ndarray, ...] = (slots, grads)
        dense = states[j].dense
        if dense is not None:
            arrays += (rng.standard_normal(dense.numel(), np.float32),)
        conn.request("push", None, arrays)


def push_a_few(old: OldPs, seed: int, times: int = 3) -> None:
    """``times`` random pushes to the old PS, each applied before this returns."""
    rng = np.random.default_rng(seed)
    conns = [connect(a, SECRET, timeout=10) for a in old.addresses]
    try:
        for _ in range(times):
            push_once(conns, old.states, rng)
    finally:
        for conn in conns:
            conn.close()


class Pusher:
    """Pushes to the old PS from a thread of its own until stopped."""

    def __init__(self, old: OldPs) -> None:
        self.old = old
        self.pushes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pusher", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        rng = np.random.default_rng(0)
        conns = [connect(a, SECRET, timeout=10) for a in self.old.addresses]
        try:
            while not self._stop.is_set():
                push_once(conns, self.old.states, rng)
                self.pushes += 1
        except BaseException as exc:  # surfaced by stop()
            self.error = exc
        finally:
            for conn in conns:
                conn.close()

    def __enter__(self) -> Pusher:
        self._thread.start()
        while self.pushes < 5 and self._thread.is_alive():
            time.sleep(0.001)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if self.error is not None:
            raise self.error


def expected(old: list[PsState], config: PsConfig) -> dict[str, torch.Tensor]:
    """What new PS ``config.ps_index`` must hold: each of its rows read where it lives now."""
    gids = config.partition.gids_of(config.ps_index)
    num_old = len(old)
    out = {}
    for name in ("weights", "accum"):
        rows = torch.empty(len(gids), config.model.embedding_dim)
        for j, state in enumerate(old):
            mine = gids % num_old == j
            rows[torch.from_numpy(mine)] = getattr(state, name)[
                torch.from_numpy(gids[mine] // num_old)
            ]
        out[name] = rows
    if config.ps_index == 0:
        assert old[0].dense is not None and old[0].dense_accum is not None
        out["dense"], out["dense_accum"] = old[0].dense, old[0].dense_accum
    return out


def assert_holds(state: PsState, want: dict[str, torch.Tensor]) -> None:
    got = state.arrays()
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


def new_config(num_ps: int, k: int) -> PsConfig:
    return PsConfig(SPEC, num_ps, k, LR, seed=SEED)


@pytest.mark.parametrize(("old_n", "new_n"), [(1, 1), (2, 1), (1, 2), (2, 3)])
def test_a_copy_during_pushes_finished_after_them_equals_the_old_ps(old_n: int, new_n: int) -> None:
    with old_ps(old_n) as old:
        with Pusher(old) as pusher:
            before = pusher.pushes
            copies = [
                copy_rows(
                    new_config(new_n, k),
                    old.addresses,
                    old_n,
                    SECRET,
                    GENERATION,
                    chunk_bytes=SMALL_CHUNK,
                )
                for k in range(new_n)
            ]
            during = pusher.pushes - before
        push_a_few(old, seed=1)  # after the copies, before the finish: sent again
        stale = [k for k, (state, _) in enumerate(copies) if not _equal(state, old.states)]
        assert stale, "the pushes after the copy changed none of its rows: the test shows nothing"
        for k, (state, copied) in enumerate(copies):
            finished = finish_copy(state, old.addresses, old_n, SECRET, GENERATION)
            assert_holds(state, expected(old.states, state.config))
            assert copied.rows == state.weights.shape[0]
            assert finished.rows > 0, (k, finished)
    assert during > 0, "no push landed during the copies"


def _equal(state: PsState, old: list[PsState]) -> bool:
    want = expected(old, state.config)
    return all(torch.equal(state.arrays()[n], t) for n, t in want.items())


def test_moving_one_ps_of_an_unchanged_set_asks_only_that_ps() -> None:
    with old_ps(3) as old:
        state, _ = copy_rows(new_config(3, 1), old.addresses, 3, SECRET, GENERATION)
        finish_copy(state, old.addresses, 3, SECRET, GENERATION)
        assert_holds(state, expected(old.states, state.config))
        assert [s.state.tracking for s in old.services] == [None, GENERATION, None]
        assert [s.stats()["transfer_bytes"] > 0 for s in old.services] == [False, True, False]


def test_finishing_a_copy_that_another_switch_replaced_is_refused() -> None:
    with old_ps(2) as old:
        state, _ = copy_rows(new_config(1, 0), old.addresses, 2, SECRET, GENERATION)
        # A later switch tracks afresh: the marks of this one are gone, so it must not finish.
        old.states[1].track(GENERATION + 1)
        with pytest.raises(TransferError, match=r"old PS 1 at .*not tracking updates for gen"):
            finish_copy(state, old.addresses, 2, SECRET, GENERATION)


def test_a_source_that_does_not_answer_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dlrover_kfp.training.ps_transfer.SOURCE_CONNECT_S", 0.2)
    with old_ps(1) as old:
        gone = old.addresses
    with pytest.raises(TransferError, match=r"PS 0: old PS 0 at 127\.0\.0\.1:\d+ does not answer"):
        copy_rows(new_config(1, 0), gone, 1, SECRET, GENERATION)


def test_track_keeps_the_marks_of_its_generation_and_restarts_for_another() -> None:
    state = PsState(new_config(1, 0))
    slots = torch.tensor([3, 7])
    state.track(1)
    state.apply_sparse(slots, torch.ones(2, SPEC.embedding_dim))
    state.track(1)  # a retried request: the marks stay
    assert state.marked(torch.arange(8), 1).nonzero().flatten().tolist() == [3, 7]
    state.track(2)
    assert not state.marked(torch.arange(8), 2).any()
    state.untrack()
    with pytest.raises(ValueError, match="not tracking updates for generation 2"):
        state.marked(slots, 2)


def test_the_transfer_requests_are_checked() -> None:
    with old_ps(2) as old, connect(old.addresses[1], SECRET, timeout=10) as conn:
        rows = {"num_ps": 1, "index": 0, "start": 0, "count": 10, "dirty": False}
        with pytest.raises(RemoteError, match="not tracking updates for generation 3"):
            conn.request(transfer.ROWS, {**rows, "generation": GENERATION})
        conn.request(transfer.TRACK, {"generation": GENERATION})
        limit = transfer.MAX_TRANSFER_BYTES // transfer.row_bytes(SPEC.embedding_dim)
        too_many = {**rows, "count": limit + 1, "generation": GENERATION}
        with pytest.raises(RemoteError, match=f"exceeds {limit} rows a request"):
            conn.request(transfer.ROWS, too_many)
        with pytest.raises(RemoteError, match="'start' must be an integer >= 0"):
            conn.request(transfer.ROWS, {**rows, "start": -1, "generation": GENERATION})
        with pytest.raises(RemoteError, match="out of range"):
            conn.request(transfer.ROWS, {**rows, "index": 1, "generation": GENERATION})
        with pytest.raises(RemoteError, match="PS 1 holds no dense parameters"):
            conn.request(transfer.DENSE)
        conn.request(transfer.UNTRACK, {"generation": GENERATION})
        assert old.states[1].tracking is None


def test_copy_rate_of_a_quarter_gib_ps() -> None:
    """256 MiB of rows and accumulators (d = 16) moved PS to PS over loopback; prints the rate."""
    spec = ModelSpec(
        table_sizes=(2 << 20,),
        embedding_dim=16,
        dense_features=3,
        bottom_mlp=(8, 16),
        top_mlp=(8, 1),
    )
    with old_ps(1, spec) as old:
        config = PsConfig(spec, 1, 0, LR, seed=SEED)
        state, copied = copy_rows(config, old.addresses, 1, SECRET, GENERATION)
        finished = finish_copy(state, old.addresses, 1, SECRET, GENERATION)
        assert torch.equal(state.weights, old.states[0].weights)
        assert copied.bytes >= 256 << 20
        assert finished.rows == 0
        print(
            f"copied {copied.bytes / 2**20:.0f} MiB in {copied.seconds:.2f}s "
            f"({copied.bytes / 2**20 / copied.seconds:.0f} MiB/s); "
            f"finish with nothing updated {finished.seconds * 1e3:.1f} ms"
        )


class SwitchMaster:
    """The master's side of the CONTRACT for one new PS (runtime/master.py ``_switch_config``):
    ``copy`` while training goes on (when ``copy``), ``wait`` once copied (and three more
    pushes land then, as the workers finish their steps), then the configuration, with
    ``migrate`` when ``migrate`` (a live move) or without (the stop-first path)."""

    def __init__(self, old: OldPs, num_ps: int, *, copy: bool, migrate: bool) -> None:
        self.old = old
        self.copy = copy
        self.migrate = migrate
        self.job = {
            "spec": {"model": to_dict(SPEC), "training": {"learning_rate": LR}},
            "num_ps": num_ps,
            "seed": SEED,
            "job_id": "job",
            "generation": GENERATION,
        }
        self.sources = {"from": [list(a) for a in old.addresses], "from_num_ps": len(old.states)}
        self.asked: list[dict[str, object]] = []
        self.registered: dict[str, object] | None = None
        self.server = Server(("127.0.0.1", 0), SECRET, self.handle, threaded=True)
        self.server.serve_in_thread(name="master")

    def handle(self, peer: PeerInfo, msg: Message) -> Message:
        if msg.kind == REGISTER:
            self.registered = dict(msg.meta)
            return Message("ok", {}, ())
        assert msg.kind == CONFIG
        self.asked.append(dict(msg.meta))
        if self.copy and not msg.meta.get("copied"):
            return Message("config", {"wait": True, "copy": {**self.job, **self.sources}}, ())
        if len(self.asked) <= 2:
            push_a_few(self.old, seed=2)  # the workers finish their steps
            return Message("config", {"wait": True}, ())
        released = {**self.job, "migrate": self.sources} if self.migrate else self.job
        return Message("config", released, ())


def run_new_ps(master: SwitchMaster, num_ps: int, k: int) -> dict[str, torch.Tensor]:
    """Run new PS ``k`` (node.run_ps, generation > 0) against ``master`` until it registers;
    return every row (and, from PS 0, the dense vector) it then serves, and stop it."""
    ps = threading.Thread(
        target=node.run_ps, args=(k, master.server.address, SECRET, GENERATION), daemon=True
    )
    ps.start()
    deadline = time.monotonic() + 30
    while master.registered is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert master.registered is not None, "the new PS never registered"
    host, port = master.registered["address"]  # type: ignore[misc]
    rows = new_config(num_ps, k).partition.rows_on(k)
    with connect((str(host), int(port)), SECRET, timeout=10) as conn:
        reply = conn.request("lookup", {"dense": k == 0}, (np.arange(rows, dtype=np.int64),))
        out = {"weights": torch.from_numpy(reply.arrays[0].copy())}
        if k == 0:
            out["dense"] = torch.from_numpy(reply.arrays[1].copy())
        conn.request("shutdown")
    ps.join(timeout=10)
    master.server.close()
    return out


@pytest.mark.parametrize(
    ("copy", "migrate"),
    [
        (True, True),  # live: copy while training, the rest once paused
        (False, True),  # released before asked to copy: all of it once paused
        (True, False),  # copied, then the master fell back to stop-first: the copy is dropped
        (False, False),  # stop-first
    ],
)
def test_a_ps_of_a_switch_serves_the_old_rows_when_migrating_else_builds_its_state(
    copy: bool, migrate: bool
) -> None:
    with old_ps(2) as old:
        push_a_few(old, seed=3)  # trained before the switch: its rows are not the initial ones
        master = SwitchMaster(old, 1, copy=copy, migrate=migrate)
        served = run_new_ps(master, 1, 0)
        assert master.registered is not None
        if migrate:
            want = expected(old.states, new_config(1, 0))
            assert torch.equal(served["weights"], want["weights"])
            assert torch.equal(served["dense"], want["dense"])
            moved = master.registered["moved"]
            assert isinstance(moved, dict)
            assert moved["rows"] == sum(SPEC.table_sizes)
            # The three pushes after the copy, sent again (none when all moved at once).
            assert (moved["resent_rows"] > 0) == copy
        else:
            assert "moved" not in master.registered
            # Initialised from the seed (no checkpoint_dir), as at a first start.
            assert torch.equal(served["weights"], PsState(new_config(1, 0)).weights)
        assert [bool(m.get("copied")) for m in master.asked] == [False] + [copy] * 2
