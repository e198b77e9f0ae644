"""Fuzzing the RPC transport's frame decoder and the master and PS handlers behind it.

Frames: random bytes, and valid frames from ``encode_frame`` with bytes flipped, header lengths
changed, cut short or extended, fed to ``decode_frame`` whole and to ``_FrameReader`` split at
random points. Each must decode to the message that was encoded or raise ``ProtocolError``, and
the reader's buffer must never grow past the connection's ``max_message_bytes``.

Servers: a live master (``MasterService`` over a small ``MasterState``) and a live PS
(``PsService``), each behind a ``wire.Server``, get generated requests from an authenticated
client. Each answer is a reply or an ``error`` frame naming the problem (``RemoteError`` here);
after it the server must still answer a valid request, the shard ledger must hold every shard
exactly once, and the PS's parameters must be unchanged by a refused push and finite.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from dlrover_kfp.core.shards import ShardLedger
from dlrover_kfp.core.spec import ModelSpec
from dlrover_kfp.runtime.master import MasterService, MasterState
from dlrover_kfp.training import wire
from dlrover_kfp.training.master_protocol import CONFIG, GET_SHARD, READY, REGISTER, REPORT, USAGE
from dlrover_kfp.training.ps_server import PsService
from dlrover_kfp.training.ps_state import PsConfig, PsState
from dlrover_kfp.training.wire import (
    HEADER,
    Message,
    ProtocolError,
    RemoteError,
    Server,
    connect,
    decode_frame,
    encode_frame,
    new_secret,
)
from dlrover_kfp.training.wire.codec import _FrameReader
from tests.fuzz._support import UNEXPECTED, fuzz_settings, time_limit

pytestmark = time_limit(300)

LIMIT = 16 * 1024  # a small connection limit, so that "too large" is reachable
DTYPES = ["<f4", "<f8", "<i4", "<i8", "u1", "?"]

kinds = st.one_of(
    st.sampled_from(["lookup", "push", "stats", "error", "ok", GET_SHARD, REPORT, CONFIG]),
    st.from_regex(r"[A-Za-z0-9_.:/-]{1,32}", fullmatch=True),
)
meta_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=10),
    ),
    lambda c: st.one_of(
        st.lists(c, max_size=3), st.dictionaries(st.text(max_size=5), c, max_size=3)
    ),
    max_leaves=10,
)
arrays = st.lists(
    st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 5), min_size=0, max_size=3)).map(
        lambda t: (np.arange(math.prod(t[1])) % 3).astype(t[0]).reshape(t[1])
    ),
    max_size=3,
)


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    meta = draw(st.dictionaries(st.text(max_size=8), meta_values, max_size=4))
    return encode_frame(draw(kinds), meta, draw(arrays), max_message_bytes=LIMIT)


def _repack(frame: bytes, **fields: int) -> bytes:
    names = [
        "magic",
        "version",
        "flags",
        "kind_len",
        "n_arrays",
        "meta_len",
        "table_len",
        "data_len",
    ]
    values = dict(zip(names, HEADER.unpack_from(frame), strict=True)) | fields
    return HEADER.pack(*(values[n] for n in names)) + frame[HEADER.size :]


@st.composite
def mutated_frames(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """(original, mutated): a valid frame and an edit of it."""
    frame = draw(frames())
    how = draw(st.sampled_from(["flip", "cut", "extend", "length", "same"]))
    if how == "flip":
        raw = bytearray(frame)
        for _ in range(draw(st.integers(1, 3))):
            raw[draw(st.integers(0, len(raw) - 1))] ^= 1 << draw(st.integers(0, 7))
        return frame, bytes(raw)
    if how == "cut":
        return frame, frame[: draw(st.integers(0, len(frame) - 1))]
    if how == "extend":
        return frame, frame + draw(st.binary(min_size=1, max_size=40))
    if how == "length":
        field = draw(st.sampled_from(["kind_len", "n_arrays", "meta_len", "table_len", "data_len"]))
        bound = {"kind_len": 255, "n_arrays": 255, "meta_len": 2**32 - 1, "table_len": 2**32 - 1}
        value = draw(
            st.one_of(
                st.integers(0, bound.get(field, 2**64 - 1)),
                st.integers(0, 300),
                st.sampled_from([LIMIT, LIMIT + 1, 2**63, 2**64 - 8]),
            ).filter(lambda v: v <= bound.get(field, 2**64 - 1))
        )
        return frame, _repack(frame, **{field: value})
    return frame, frame


def same_message(a: Message, b: Message) -> bool:
    return (
        a.kind == b.kind
        and _meta_equal(a.meta, b.meta)
        and len(a.arrays) == len(b.arrays)
        and all(
            x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y)
            for x, y in zip(a.arrays, b.arrays, strict=True)
        )
    )


def _meta_equal(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_meta_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_meta_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def decode_or_refuse(data: bytes) -> Message | None:
    try:
        return decode_frame(data, max_message_bytes=LIMIT)
    except ProtocolError as exc:
        assert str(exc)
        return None


@fuzz_settings()
@given(st.binary(max_size=300))
@example(b"DKFW" + bytes(20))
@example(HEADER.pack(b"DKFW", 1, 0, 1, 0, 0, 0, 2**64 - 8))  # a frame announcing 16 EiB
def test_random_bytes_are_a_frame_or_a_protocol_error(data: bytes) -> None:
    decode_or_refuse(data)


@fuzz_settings()
@given(mutated_frames())
def test_mutated_frames_decode_or_are_refused(pair: tuple[bytes, bytes]) -> None:
    original, data = pair
    message = decode_or_refuse(data)
    if data == original:
        assert message is not None and same_message(message, decode_frame(original))


@fuzz_settings()
@given(
    st.lists(mutated_frames(), min_size=1, max_size=4), st.lists(st.integers(1, 400), max_size=12)
)
def test_reader_fed_in_pieces_matches_whole_decoding(
    pairs: list[tuple[bytes, bytes]], cuts: list[int]
) -> None:
    """The stream reader gives, for any split of the byte stream, the messages that decoding
    each frame whole gives, up to the first invalid one; its buffer stays within the limit."""
    stream = b"".join(data for _, data in pairs)
    reader = _FrameReader(LIMIT, initial=64)
    got: list[Message] = []
    error: ProtocolError | None = None
    pos, pieces = 0, iter(cuts)
    while pos < len(stream) and error is None:
        piece = stream[pos : pos + next(pieces, len(stream))]
        while piece and error is None:
            room = reader.free()
            n = min(len(room), len(piece))
            assert n > 0, "the reader offered no room while a frame was incomplete"
            room[:n] = piece[:n]
            reader.advance(n)
            pos += n
            piece = piece[n:]
            assert len(reader._buf) <= LIMIT
            try:
                while (message := reader.next_message(copy=True)) is not None:
                    got.append(message)
            except ProtocolError as exc:
                error = exc
    expected: list[Message] = []
    for _, data in pairs:
        message = decode_or_refuse(data)
        if message is None:
            break
        expected.append(message)
    # A stream of valid frames decodes to exactly them; after an invalid one the stream is
    # unreadable, and the reader may stop at it or (when the bytes happen to frame) later.
    assert [same_message(a, b) for a, b in zip(got, expected, strict=False)] == [True] * min(
        len(got), len(expected)
    )
    if len(expected) == len(pairs):
        assert error is None and len(got) == len(expected)


# ----------------------------------------------------------------------------- live servers

SECRET = new_secret()
RANGES = tuple((0, 10 * i, 10 * i + 10) for i in range(8))
SPEC = ModelSpec(
    table_sizes=(50, 30), embedding_dim=4, dense_features=3, bottom_mlp=(8, 4), top_mlp=(8, 1)
)


class Live:
    """A server on a thread and one authenticated client; reconnects after a refused frame."""

    def __init__(self, handler: Any, *, threaded: bool, on_disconnect: Any = None) -> None:
        self.server = Server(
            ("127.0.0.1", 0),
            SECRET,
            handler,
            max_message_bytes=LIMIT,
            threaded=threaded,
            on_disconnect=on_disconnect,
        )
        self.thread = self.server.serve_in_thread()
        self.conn = self.connect()

    def connect(self) -> wire.Connection:
        return connect(self.server.address, SECRET, timeout=10.0, max_message_bytes=LIMIT)

    def request(
        self, kind: str, meta: dict[str, Any], arrays: tuple[Any, ...] = ()
    ) -> Message | RemoteError:
        if self.conn.closed:
            self.conn = self.connect()
        try:
            return self.conn.request(kind, meta, arrays, copy=True)
        except RemoteError as exc:
            assert str(exc), "an error frame without a message"
            return exc

    def close(self) -> None:
        self.conn.close()
        self.server.close()


@pytest.fixture(scope="module")
def master() -> Iterator[tuple[Live, MasterService]]:
    state = MasterState(ledger=ShardLedger(RANGES, epochs=2), num_ps=1, job_config={"job_id": "j"})
    service = MasterService(state)
    live = Live(service.handle, threaded=False, on_disconnect=service.on_disconnect)
    yield live, service
    live.close()


#: Exception types whose message does not say which request or key was wrong.
UNEXPECTED_REMOTE = {e.__name__ for e in UNEXPECTED} | {"RuntimeError", "Exception"}


def ledger_consistent(ledger: ShardLedger) -> None:
    todo, doing, done = list(ledger.todo), set(ledger.doing), set(ledger.done)
    if ledger.finished:
        assert not todo and not doing and not done
        return
    everything = todo + sorted(doing) + sorted(done)
    assert sorted(everything) == list(range(len(RANGES))), "a shard lost or held twice"


#: Keys the master's requests use, with values of every type; and some strangers.
master_meta = st.dictionaries(
    st.sampled_from(
        [
            "worker",
            "incarnation",
            "shard",
            "epoch",
            "samples",
            "steps",
            "loss_sum",
            "bad_rows",
            "index",
            "generation",
            "address",
            "role",
            "cpu_seconds",
            "rss_mb",
            "x",
        ]
    ),
    st.one_of(
        meta_values,
        st.sampled_from(["worker-0", "worker-1", "ps", "worker", 0, 1, 7, -1, 2**63, 10**30]),
        st.lists(st.one_of(st.text(max_size=5), st.integers(-1, 70000)), max_size=3),
    ),
    max_size=8,
)
master_kinds = st.one_of(
    st.sampled_from([REGISTER, CONFIG, GET_SHARD, REPORT, READY, USAGE]), kinds
)


@fuzz_settings(scale=0.5, deadline=None)
@given(master_kinds, master_meta, arrays)
@example(REPORT, {"worker": "worker-0", "shard": 0, "epoch": 0, "samples": "x"}, [])
@example(REGISTER, {"index": 0, "address": "ab"}, [])
@example(USAGE, {"role": "ps", "index": 0, "cpu_seconds": float("nan"), "rss_mb": 1}, [])
@example(GET_SHARD, {"worker": ["a"]}, [])
@example(
    REPORT,
    {"worker": "worker-0", "shard": 10**30, "epoch": 0, "samples": 1, "steps": 1, "loss_sum": 1.0},
    [],
)
def test_master_answers_every_request_and_keeps_its_ledger(
    master: tuple[Live, MasterService], kind: str, meta: dict[str, Any], arrs: list[Any]
) -> None:
    live, service = master
    answer = live.request(kind, meta, tuple(arrs))
    if isinstance(answer, RemoteError):
        assert answer.remote_type not in UNEXPECTED_REMOTE, str(answer)
    with service.state.lock:
        ledger_consistent(service.state.ledger)
        for stats in service.state.workers.values():
            assert stats.samples >= 0 and stats.steps >= 0 and stats.bad_rows >= 0
        for readings in service.state.usage.values():
            assert all(math.isfinite(c) and math.isfinite(r) for _, c, r, _ in readings)
    # Still serving: a valid request gets its answer.
    reply = live.request(CONFIG, {"role": "probe"})
    assert isinstance(reply, Message) and reply.kind == "config"


@pytest.fixture(scope="module")
def ps() -> Iterator[tuple[Live, PsService]]:
    service = PsService(PsState(PsConfig(SPEC, 2, 0, 0.1, seed=1)), checkpointer=None)
    live = Live(service.handle, threaded=True)
    service.server = live.server
    yield live, service
    live.close()


ps_arrays = st.lists(
    st.one_of(
        arrays.map(lambda a: a[0] if a else np.zeros(0, np.int64)),
        st.lists(st.integers(-3, 30), max_size=6).map(lambda v: np.array(v, dtype=np.int64)),
        st.integers(0, 6).map(lambda k: np.full((k, 4), 0.5, np.float32)),
        st.sampled_from([np.full((k, 4), np.nan, np.float32) for k in (1, 2)]),
        st.just(np.ones(1, np.float32)),
    ),
    max_size=4,
)


@fuzz_settings(scale=0.5, deadline=None)
@given(st.sampled_from(["lookup", "push", "stats", "checkpoint", "bogus"]), master_meta, ps_arrays)
@example("lookup", {}, [])
@example("push", {}, [np.array([0, 1]), np.ones((2, 4), np.float64)])
@example("push", {}, [np.array([0, 1]), np.ones((2, 4), np.float32), np.ones(1, np.float32)])
@example("push", {}, [np.array([0, 1]), np.full((2, 4), np.nan, np.float32)])
@example("push", {}, [np.array([0, 99]), np.ones((2, 4), np.float32)])
@example("lookup", {}, [np.array([[0, 1]])])
def test_ps_answers_every_request_and_keeps_its_state(
    ps: tuple[Live, PsService], kind: str, meta: dict[str, Any], arrs: list[Any]
) -> None:
    live, service = ps
    state = service.state
    before = (state.weights.clone(), state.accum.clone())
    answer = live.request(kind, meta, tuple(arrs))
    if isinstance(answer, RemoteError):
        # Refused: nothing changed, and the message says what was wrong.
        assert answer.remote_type not in UNEXPECTED_REMOTE, str(answer)
        assert state.weights.equal(before[0]) and state.accum.equal(before[1]), str(answer)
    assert bool(state.weights.isfinite().all()) and bool((state.accum >= 0).all())
    assert state.dense is not None and bool(state.dense.isfinite().all())
    reply = live.request("lookup", {}, (np.array([0, 1], np.int64),))
    assert isinstance(reply, Message) and reply.arrays[0].shape == (2, 4)


def test_handler_error_names_the_problem(ps: tuple[Live, PsService]) -> None:
    """Regression: a lookup without arrays answered "IndexError: tuple index out of range"; a
    push of mismatched gradients could apply part of itself; a NaN gradient was applied."""
    live, _ = ps
    cases = [
        ("lookup", (), "expected the slots"),
        ("push", (np.array([0, 1]), np.ones((2, 4), np.float64)), "gradients must be float32"),
        (
            "push",
            (np.array([0, 1]), np.ones((2, 4), np.float32), np.ones(1, np.float32)),
            "dense gradient must be",
        ),
        ("push", (np.array([0]), np.full((1, 4), np.nan, np.float32)), "NaN"),
        ("lookup", (np.array([10**6]),), "slots must be in"),
    ]
    for kind, arrs, message in cases:
        answer = live.request(kind, {}, arrs)
        assert isinstance(answer, RemoteError) and message in str(answer), (kind, answer)


def test_master_report_with_a_bad_key_changes_nothing() -> None:
    """Regression: a report whose ``samples`` was not a number completed the shard and then
    failed, leaving the shard done and its samples uncounted."""
    state = MasterState(ledger=ShardLedger(RANGES, epochs=1), num_ps=1, job_config={})
    service = MasterService(state)
    live = Live(service.handle, threaded=False, on_disconnect=service.on_disconnect)
    try:
        reply = live.request(GET_SHARD, {"worker": "worker-9"})
        assert isinstance(reply, Message)
        shard = reply.meta["shard"]
        bad = {
            "worker": "worker-9",
            "shard": shard["id"],
            "epoch": shard["epoch"],
            "samples": "x",
            "steps": 1,
            "loss_sum": 0.5,
        }
        answer = live.request(REPORT, bad)
        assert isinstance(answer, RemoteError) and "'samples'" in str(answer)
        with state.lock:
            assert shard["id"] in state.ledger.doing and not state.workers["worker-9"].samples
    finally:
        live.close()
