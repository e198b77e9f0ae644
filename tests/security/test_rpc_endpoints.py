"""Hostile peers against the job's two RPC endpoints, with their state compared before and after.

The endpoints are built as the runtime builds them: the job master's :class:`MasterService`
behind a single-threaded :class:`~dlrover_kfp.training.wire.Server` with ``on_disconnect``
(dlrover_kfp/runtime/job.py), and a PS's :class:`PsService` behind a threaded one
(dlrover_kfp/training/ps_server.py). Before each attack a legitimate client has changed their
state (a PS registered, shards leased and reported; a push applied) and stays connected.

Every attack carries requests that *would* change that state if served (a shard lease, a shard
report, a PS registration, a push), so "rejected" is checked where it matters: the master's
shard ledger (todo/doing/done), worker stats, PS addresses and usage, and the PS's rows,
optimizer state and counters are equal before and after, and the legitimate client is still
served. The hostile peers are raw sockets speaking the documented handshake by hand, so the
test does not trust the client code it attacks with. docs/security.md tabulates the responses
asserted here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import secrets
import socket
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from dlrover_kfp.core.shards import ShardLedger
from dlrover_kfp.core.spec import ModelSpec
from dlrover_kfp.runtime.master import MasterService, MasterState
from dlrover_kfp.training.master_protocol import CONFIG, GET_SHARD, REGISTER, REPORT, USAGE
from dlrover_kfp.training.ps_server import PsService
from dlrover_kfp.training.ps_state import PsConfig, PsState
from dlrover_kfp.training.wire import (
    DEFAULT_MAX_MESSAGE_BYTES,
    HEADER,
    MAGIC,
    AuthenticationError,
    Connection,
    Server,
    connect,
    encode_frame,
    new_secret,
)

pytestmark = pytest.mark.timeout(30)

SECRET = new_secret()
LOCAL = ("127.0.0.1", 0)
# The role labels as the wire module's docstring documents them (pinned here on purpose).
SERVER_LABEL = b"dlrover-kfp-wire/1 server"
CLIENT_LABEL = b"dlrover-kfp-wire/1 client"
HELLO = b"DKFA\x01\x00\x00\x00"
ACK = b"DKOK"
WIRE_LOG = "dlrover_kfp.training.wire"

RANGES = ((0, 0, 100), (0, 100, 200), (0, 200, 300), (0, 300, 400))
WORKER = {"worker": "worker-0", "incarnation": "a1b2"}
SPEC = ModelSpec(
    table_sizes=(300, 20, 5), embedding_dim=4, dense_features=3, bottom_mlp=(8, 4), top_mlp=(8, 1)
)


# -- the endpoints ----------------------------------------------------------------------------


@dataclass
class Endpoint:
    """One served endpoint: its server, a client that changed its state, what to compare."""

    name: str
    server: Server
    legit: Connection
    snapshot: Callable[[], Any]
    #: frames that change the endpoint's state when served (sent by the attacks)
    payload: bytes
    #: a request that changes nothing and proves the endpoint still serves
    probe: str


def master_snapshot(state: MasterState) -> dict[str, Any]:
    with state.lock:
        ledger = state.ledger
        return {
            "todo": list(ledger.todo),
            "doing": {i: (lease.worker, lease.deadline) for i, lease in ledger.doing.items()},
            "done": sorted(ledger.done),
            "epoch": ledger.epoch,
            "rows_done": ledger.rows_done,
            "workers": {n: dataclasses.astuple(s) for n, s in state.workers.items()},
            "ps": dict(state.ps_addresses),
            "configured": dict(state.configured),
            "usage": {k: list(v) for k, v in state.usage.items()},
            "last_report_at": state.last_report_at,
        }


def ps_snapshot(service: PsService) -> dict[str, Any]:
    arrays = {name: t.clone() for name, t in service.state.arrays().items()}
    counters = (service.lookups, service.pushes, service.rows_served, service.state.updates)
    return {"arrays": arrays, "counters": counters}


def same_ps_state(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["counters"] == b["counters"] and all(
        torch.equal(a["arrays"][k], b["arrays"][k]) for k in a["arrays"]
    )


def start_master() -> tuple[Endpoint, Callable[[], None]]:
    """The master as the runtime starts it, after a PS registered and worker-0 leased shards 0
    and 1 and reported shard 0 (so todo, doing and done are all non-empty)."""
    now = [100.0]
    state = MasterState(
        ledger=ShardLedger(RANGES, epochs=1, lease_s=600.0),
        num_ps=1,
        job_config={"job_id": "job-1", "seed": 1, "spec": {"name": "demo"}},
    )
    service = MasterService(state, clock=lambda: now[0])
    server = Server(LOCAL, SECRET, service.handle, on_disconnect=service.on_disconnect)
    server.serve_in_thread(name="master")
    legit = connect(server.address, SECRET, timeout=5)
    legit.request(REGISTER, {"index": 0, "address": ["10.0.0.1", 7000]})
    legit.request(CONFIG, {"role": "worker", "index": 0})
    first = legit.request(GET_SHARD, WORKER).meta["shard"]
    legit.request(GET_SHARD, WORKER)
    legit.request(
        REPORT,
        {**WORKER, "shard": first["id"], "epoch": 0, "samples": 100, "steps": 1, "loss_sum": 0.7},
    )
    legit.request(USAGE, {"role": "ps", "index": 0, "cpu_seconds": 1.0, "rss_mb": 50.0})
    payload = b"".join(
        (
            encode_frame(GET_SHARD, {"worker": "intruder"}),
            # the legitimate worker's own lease, as it would report it
            encode_frame(
                REPORT,
                {**WORKER, "shard": 1, "epoch": 0, "samples": 10**6, "steps": 9, "loss_sum": 1.0},
            ),
            encode_frame(REGISTER, {"index": 0, "address": ["203.0.113.66", 6666]}),
            encode_frame(USAGE, {"role": "ps", "index": 0, "cpu_seconds": 9.0, "rss_mb": 1.0}),
        )
    )
    endpoint = Endpoint(
        "master", server, legit, lambda: master_snapshot(state), payload, probe=CONFIG
    )
    before = endpoint.snapshot()
    assert before["todo"] and before["doing"] and before["done"] and before["workers"]

    def stop() -> None:
        legit.close()
        server.close()

    return endpoint, stop


def start_ps() -> tuple[Endpoint, Callable[[], None]]:
    """A PS as ps_server.serve starts it (threaded), after one push from a legitimate worker."""
    service = PsService(PsState(PsConfig(SPEC, 1, 0, 0.1, seed=3)), checkpointer=None)
    server = Server(LOCAL, SECRET, service.handle, threaded=True)
    service.server = server
    thread = server.serve_in_thread(name="ps")
    slots = np.array([0, 5, 7], np.int64)
    grads = np.full((3, SPEC.embedding_dim), 0.5, np.float32)
    legit = connect(server.address, SECRET, timeout=5)
    legit.request("push", None, (slots, grads))
    payload = b"".join(
        (
            encode_frame("push", None, (slots, grads * 100)),
            encode_frame("lookup", None, (slots,)),
            encode_frame("shutdown"),
        )
    )
    endpoint = Endpoint("ps", server, legit, lambda: ps_snapshot(service), payload, probe="stats")
    assert endpoint.snapshot()["counters"][1] == 1

    def stop() -> None:
        legit.close()
        server.close()
        thread.join(5)

    return endpoint, stop


@pytest.fixture(params=["master", "ps"])
def endpoint(request: pytest.FixtureRequest) -> Iterator[Endpoint]:
    made, stop = start_master() if request.param == "master" else start_ps()
    try:
        yield made
    finally:
        stop()


def assert_unchanged(endpoint: Endpoint, before: Any) -> None:
    """The state is as it was, and the endpoint still serves the client that was connected
    all along and a new one."""
    assert endpoint.legit.request(endpoint.probe).kind != "error"
    with connect(endpoint.server.address, SECRET, timeout=5) as fresh:
        fresh.request(endpoint.probe)
    after = endpoint.snapshot()
    if endpoint.name == "ps":
        assert same_ps_state(before, after), "the PS's rows or counters changed"
    else:
        assert after == before


# -- raw peers --------------------------------------------------------------------------------


def prove(secret: bytes, nonce: bytes, label: bytes) -> bytes:
    return hmac.digest(secret, nonce + label, hashlib.sha256)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, f"peer closed after {len(data)} of {n} bytes"
        data += chunk
    return data


def raw(address: tuple[str, int]) -> socket.socket:
    return socket.create_connection(address, timeout=5)


def hello(sock: socket.socket, client_nonce: bytes) -> tuple[bytes, bytes]:
    """Send a hello; return the server's (nonce, proof)."""
    sock.sendall(HELLO + client_nonce)
    challenge = recv_exact(sock, 64)
    return challenge[:32], challenge[32:]


def response(sock: socket.socket, within: float = 3.0) -> bytes | None:
    """Everything the server sends until it closes the connection (None: it kept it open)."""
    sock.settimeout(within)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        return None
    return received


def authenticated(address: tuple[str, int]) -> socket.socket:
    """A raw socket past a correct handshake (a peer that holds the secret)."""
    sock = raw(address)
    server_nonce, _ = hello(sock, secrets.token_bytes(32))
    sock.sendall(prove(SECRET, server_nonce, CLIENT_LABEL))
    assert recv_exact(sock, 4) == ACK
    return sock


def failed_handshakes_reach(server: Server, count: int) -> bool:
    deadline = time.monotonic() + 3
    while server.failed_handshakes < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return server.failed_handshakes >= count


# -- without the secret -----------------------------------------------------------------------


def test_frames_without_a_handshake_are_dropped_unread(
    endpoint: Endpoint, caplog: pytest.LogCaptureFixture
) -> None:
    before = endpoint.snapshot()
    caplog.set_level(logging.INFO, logger=WIRE_LOG)
    with raw(endpoint.server.address) as sock:
        sock.sendall(endpoint.payload)
        assert response(sock) == b""  # closed, not one byte back
    assert failed_handshakes_reach(endpoint.server, 1)
    assert "bad hello" in caplog.text
    assert_unchanged(endpoint, before)


def test_a_wrong_secret_is_refused_by_the_server(
    endpoint: Endpoint, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = new_secret()
    before = endpoint.snapshot()
    caplog.set_level(logging.INFO, logger=WIRE_LOG)
    with raw(endpoint.server.address) as sock:
        client_nonce = secrets.token_bytes(32)
        server_nonce, server_proof = hello(sock, client_nonce)
        # The server's proof does not verify under the wrong secret; an attacker goes on anyway.
        assert server_proof != prove(wrong, client_nonce, SERVER_LABEL)
        sock.sendall(prove(wrong, server_nonce, CLIENT_LABEL) + endpoint.payload)
        assert response(sock) == b""  # no "DKOK", no reply to the requests
    assert failed_handshakes_reach(endpoint.server, 1)
    assert "authentication failed" in caplog.text and "wrong job secret" in caplog.text
    # The library's own client refuses first: the server cannot prove the client's secret.
    with pytest.raises(AuthenticationError, match="could not prove it knows the job secret"):
        connect(endpoint.server.address, wrong, timeout=5)
    assert_unchanged(endpoint, before)


# -- replays ----------------------------------------------------------------------------------


def test_a_client_proof_recorded_on_one_connection_is_refused_on_another(
    endpoint: Endpoint,
) -> None:
    before = endpoint.snapshot()
    # What an eavesdropper records from a legitimate handshake (which succeeds) ...
    recorded_hello = HELLO + secrets.token_bytes(32)
    with raw(endpoint.server.address) as genuine:
        genuine.sendall(recorded_hello)
        nonce_a = recv_exact(genuine, 64)[:32]
        recorded_proof = prove(SECRET, nonce_a, CLIENT_LABEL)
        genuine.sendall(recorded_proof)
        assert recv_exact(genuine, 4) == ACK
        # ... played back byte for byte on a second connection, with the requests after it.
        with raw(endpoint.server.address) as replay:
            replay.sendall(recorded_hello)
            nonce_b = recv_exact(replay, 64)[:32]
            assert nonce_b != nonce_a  # a fresh server nonce per connection
            replay.sendall(recorded_proof + endpoint.payload)
            assert response(replay) == b""
    assert failed_handshakes_reach(endpoint.server, 1)
    assert_unchanged(endpoint, before)


def test_a_server_proof_reflected_as_a_client_proof_is_refused(endpoint: Endpoint) -> None:
    """Connection A's server nonce sent as B's client nonce makes the server compute
    HMAC(secret, Ns_A || label) itself; sent back on A it would authenticate A if the server
    and client labels were the same. The role labels are what refuses it."""
    before = endpoint.snapshot()
    with raw(endpoint.server.address) as a, raw(endpoint.server.address) as b:
        nonce_a, _ = hello(a, secrets.token_bytes(32))
        _, reflected = hello(b, nonce_a)  # = HMAC(secret, Ns_A || server label)
        a.sendall(reflected + endpoint.payload)
        assert response(a) == b""
    assert failed_handshakes_reach(endpoint.server, 2)  # A refused, B abandoned
    assert_unchanged(endpoint, before)


# -- frames over the limits, and frames cut short ---------------------------------------------


def header(**fields: int) -> bytes:
    values = {
        "kind": 1,
        "n": 0,
        "meta": 0,
        "table": 0,
        "data": 0,
    } | fields
    return HEADER.pack(
        MAGIC, 1, 0, values["kind"], values["n"], values["meta"], values["table"], values["data"]
    )


OVERSIZED = {
    "meta over 64 KiB": (header(meta=64 * 1024 + 1), "meta of 65537 bytes announced; at most"),
    "data over the message limit": (
        header(data=DEFAULT_MAX_MESSAGE_BYTES),
        f"this connection's limit is {DEFAULT_MAX_MESSAGE_BYTES}",
    ),
    "kind of 33 bytes": (header(kind=33), "kind length 33 outside 1..32"),
    "empty kind": (header(kind=0), "kind length 0 outside 1..32"),
    "65 arrays": (header(n=65, table=65 * 10), "65 arrays announced; at most 64"),
}


@pytest.mark.parametrize("kind", list(OVERSIZED))
def test_an_oversized_frame_closes_the_connection_before_anything_is_allocated(
    endpoint: Endpoint, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    frame, logged = OVERSIZED[kind]
    before = endpoint.snapshot()
    caplog.set_level(logging.INFO, logger=WIRE_LOG)
    with authenticated(endpoint.server.address) as sock:
        tracemalloc.start()
        try:
            sock.sendall(frame + bytes(4096))  # the start of the body it announces
            assert response(sock) == b""
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    # The receive buffer of a connection starts at 64 KiB; nothing near the announced size.
    assert peak < 4 * 1024 * 1024, f"{peak} bytes allocated while refusing the frame"
    assert "protocol error" in caplog.text and logged in caplog.text
    assert_unchanged(endpoint, before)


def truncated_frames(payload: bytes) -> dict[str, bytes]:
    """A valid push/lookup-sized frame cut in the header, in the preamble and in the data."""
    big = encode_frame("push", None, (np.zeros(256 * 1024, np.uint8),))
    return {
        "in the header": payload[:10],
        "in the preamble": payload[: HEADER.size + 3],  # inside the first frame's kind
        "in the data": big[: len(big) // 2],
    }


@pytest.mark.parametrize("cut", ["in the header", "in the preamble", "in the data"])
def test_a_frame_cut_short_by_a_closed_connection_is_never_handled(
    endpoint: Endpoint, cut: str
) -> None:
    before = endpoint.snapshot()
    with authenticated(endpoint.server.address) as sock:
        sock.sendall(truncated_frames(endpoint.payload)[cut])
        sock.shutdown(socket.SHUT_WR)  # the peer goes away mid-frame
        assert response(sock) == b""
    assert_unchanged(endpoint, before)


# -- malformed requests from a peer that holds the secret ----------------------------------------


def leased_report(**values: Any) -> dict[str, Any]:
    """A report of shard 1, which worker-0 holds in both endpoints' set-up."""
    return {**WORKER, "shard": 1, "epoch": 0, "steps": 1, **values}


MALFORMED: dict[str, list[tuple[str, dict[str, Any], tuple[np.ndarray, ...]]]] = {
    "master": [
        ("drop_tables", {}, ()),
        (GET_SHARD, {}, ()),
        (REPORT, {**WORKER, "epoch": 0}, ()),
        (REGISTER, {"index": 7, "address": ["h", 1]}, ()),
        (REGISTER, {"index": 0, "address": "h:1"}, ()),
        # worker-0's own leased shard, reported with values that cannot be counted: the
        # shard must stay leased, not be completed with nothing counted
        (REPORT, leased_report(samples="many", loss_sum=0), ()),
        (REPORT, leased_report(samples=-5, loss_sum=0), ()),
    ],
    "ps": [
        ("drop_tables", {}, ()),
        ("push", {}, (np.array([-1]), np.ones((1, 4), np.float32))),
        ("push", {}, (np.array([1, 2]), np.ones((3, 4), np.float32))),
        ("push", {}, (np.array([1]),)),
        ("checkpoint", {"step": 1}, ()),
        # refused whole: no valid slot of the push may be updated before the bad one is seen
        ("push", {}, (np.array([0, 10**6]), np.ones((2, 4), np.float32))),
        ("push", {}, (np.array([1]), np.ones((1, 4), np.float32), np.ones(3, np.float32))),
        ("push", {}, (np.array([1]), np.full((1, 4), np.nan, np.float32))),
        # a PS change's transfer: rows without tracking, an oversize or negative slice, a
        # requester index out of range, the dense parameters from a PS that has none
        ("transfer_rows", {"num_ps": 1, "index": 0, "start": 0, "count": 1, "generation": 7}, ()),
        ("transfer_track", {"generation": -1}, ()),
        ("transfer_rows", {"num_ps": 1, "index": 0, "start": -1, "count": 1, "generation": 0}, ()),
        ("transfer_rows", {"num_ps": 1, "index": 5, "start": 0, "count": 1, "generation": 0}, ()),
        ("transfer_rows", {"num_ps": 1, "index": 0, "start": 0, "count": 10**9}, ()),
    ],
}


def test_a_malformed_request_with_the_secret_gets_an_error_frame_and_changes_nothing(
    endpoint: Endpoint,
) -> None:
    """A peer that holds the secret is trusted to be honest, not to be well-formed: a bad
    request is refused whole, even when part of it (a valid slot, the peer's own lease) could
    have been applied."""
    before = endpoint.snapshot()
    with connect(endpoint.server.address, SECRET, timeout=5) as conn:
        for kind, meta, arrays in MALFORMED[endpoint.name]:
            conn.send(kind, meta, arrays)
            reply = conn.recv()
            # The text is the handler's (docs/security.md quotes examples); the point here is
            # an error frame on a connection that stays usable, and no state change.
            assert reply.kind == "error", (kind, meta)
            assert reply.meta["type"] and reply.meta["message"], reply.meta
    assert_unchanged(endpoint, before)
