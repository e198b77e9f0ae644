"""The training transport: framing, limits, authentication, and the server's event loop.

Servers run in a thread of the test process on 127.0.0.1 with an OS-chosen port. Hostile
peers are raw sockets that speak the documented handshake by hand, so these tests also pin
the wire format the module docstring promises.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import socket
import struct
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import numpy as np
import pytest

from dlrover_kfp.errors import PermanentError, TransientError, UserInputError
from dlrover_kfp.training.wire import (
    HEADER,
    MAGIC,
    AuthenticationError,
    Connection,
    ConnectionClosedError,
    Message,
    MessageError,
    PeerInfo,
    PeerUnavailableError,
    ProtocolError,
    RemoteError,
    Server,
    WireTimeoutError,
    connect,
    decode_frame,
    encode_frame,
    new_secret,
    secret_from_env,
    secret_to_env,
)

pytestmark = pytest.mark.timeout(30)

SECRET = b"\x01test-job-secret\xfe" + bytes(range(15))
LOCAL = ("127.0.0.1", 0)
GIB = 1024**3

DTYPES = [np.float32, np.float64, np.int64, np.int32, np.uint8, np.bool_]
SHAPES = [(), (0,), (7,), (3, 0, 2), (2, 3, 4), (1, 1, 1, 1, 1, 1, 1, 5)]


def echo(peer: PeerInfo, msg: Message) -> Message | None:
    if msg.kind == "fail":
        raise ValueError("boom\nsecond line")
    if msg.kind == "silent":
        return None
    if msg.kind == "bad-reply":
        return Message("ok", {}, (np.array([object()]),))
    return Message(msg.kind, msg.meta, msg.arrays)


# The server's two ways of serving: one loop thread, or a thread per connection (the PS's).
THREADED = pytest.mark.parametrize("threaded", [False, True], ids=["loop", "threaded"])


@contextmanager
def serving(
    handler: Callable[[PeerInfo, Message], Message | None] = echo, **kwargs: Any
) -> Iterator[Server]:
    server = Server(LOCAL, SECRET, handler, **kwargs)
    server.serve_in_thread()
    try:
        yield server
    finally:
        server.close()


def values(rng: np.random.Generator, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    """Random values (NaN, inf and -0.0 among the floats), always as an ndarray, even 0-d."""
    if dtype is np.bool_:
        return np.asarray(rng.random(shape) < 0.5)
    if np.issubdtype(dtype, np.floating):
        out = np.asarray(rng.standard_normal(shape), dtype=dtype)
        if out.size >= 3:
            out.flat[:3] = [np.nan, np.inf, -0.0]
        return out
    info = np.iinfo(dtype)
    return np.asarray(rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True))


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def raw_authenticated(address: tuple[str, int], secret: bytes = SECRET) -> socket.socket:
    """A client socket past the handshake, built from the documented protocol by hand."""
    sock = socket.create_connection(address, timeout=5)
    nonce = secrets.token_bytes(32)
    sock.sendall(b"DKFA\x01\x00\x00\x00" + nonce)
    challenge = recv_exact(sock, 64)
    server_nonce, proof = challenge[:32], challenge[32:]
    assert hmac.compare_digest(
        proof, hmac.digest(secret, nonce + b"dlrover-kfp-wire/1 server", hashlib.sha256)
    )
    sock.sendall(hmac.digest(secret, server_nonce + b"dlrover-kfp-wire/1 client", hashlib.sha256))
    assert recv_exact(sock, 4) == b"DKOK"
    return sock


def recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "peer closed"
        data += chunk
    return data


def closed_by_peer(sock: socket.socket, within: float = 2.0) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


@contextmanager
def fake_server(payload: bytes, secret: bytes = SECRET) -> Iterator[tuple[str, int]]:
    """Accepts one client, runs the server handshake by hand, then sends ``payload`` raw."""
    listener = socket.create_server(LOCAL)
    listener.settimeout(5)

    def run() -> None:
        sock, _ = listener.accept()
        with sock:
            hello = recv_exact(sock, 40)
            nonce = secrets.token_bytes(32)
            proof = hmac.digest(secret, hello[8:] + b"dlrover-kfp-wire/1 server", hashlib.sha256)
            sock.sendall(nonce + proof)
            try:
                recv_exact(sock, 32)
            except AssertionError:
                return  # the client gave up on us
            sock.sendall(b"DKOK" + payload)
            sock.settimeout(5)
            # until the client goes; one that refused a frame resets with bytes still unread
            with suppress(ConnectionResetError):
                while sock.recv(65536):
                    pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[:2]
    finally:
        thread.join(5)
        listener.close()


def header(**fields: int | bytes) -> bytes:
    values_ = dict(magic=MAGIC, version=1, flags=0, kind=1, n=0, meta=0, table=0, data=0) | fields
    return HEADER.pack(*values_.values())


def one_array_frame() -> bytearray:
    """kind "k", no meta, one float32 (2, 3): table entry at 25 (code, ndim, 2 dims)."""
    return bytearray(encode_frame("k", None, (np.ones((2, 3), np.float32),)))


# --------------------------------------------------------------------------- frame format


def test_encoded_frame_has_the_documented_layout() -> None:
    frame = encode_frame("k", {"a": 1}, (np.arange(3, dtype=np.int32),))
    magic, version, flags, kind_len, n_arrays, meta_len, table_len, data_len = HEADER.unpack_from(
        frame
    )
    assert (magic, version, flags, kind_len, n_arrays) == (b"DKFW", 1, 0, 1, 1)
    assert frame[24:25] == b"k" and frame[25 : 25 + meta_len] == b'{"a":1}'
    code, ndim, dim = struct.unpack_from("<BBQ", frame, 25 + meta_len)
    assert (code, ndim, dim, table_len) == (3, 1, 3, 10)
    assert data_len == 16  # 12 bytes padded to 8
    assert len(frame) % 8 == 0 and len(frame) == 24 + 24 + 16
    assert frame[48:60] == np.arange(3, dtype="<i4").tobytes()


def test_decode_frame_round_trips_every_dtype_and_shape() -> None:
    rng = np.random.default_rng(0)
    arrays = tuple(values(rng, dt, shape) for dt in DTYPES for shape in SHAPES[:3])
    msg = decode_frame(encode_frame("batch", {"step": 3}, arrays))
    assert msg.kind == "batch" and msg.meta == {"step": 3}
    assert all(same(a, b) for a, b in zip(arrays, msg.arrays, strict=True))


def test_the_announced_size_is_checked_before_anything_is_allocated() -> None:
    tracemalloc.start()
    try:
        t0 = time.process_time()  # the CPU given: allocating 10 GiB would take seconds of it
        with pytest.raises(ProtocolError, match="limit"):
            decode_frame(header(data=10 * GIB))
        elapsed = time.process_time() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 0.5 and peak < 10 * 1024 * 1024


@pytest.mark.parametrize(
    ("patch", "match"),
    [
        (lambda f: f.__setitem__(slice(0, 4), b"XXXX"), "magic"),
        (lambda f: f.__setitem__(4, 9), "version"),
        (lambda f: f.__setitem__(5, 1), "flags"),
        (lambda f: f.__setitem__(25, 99), "dtype code"),
        (lambda f: f.__setitem__(26, 9), "dimensions"),
        (lambda f: struct.pack_into("<Q", f, 27, 3), "header announced"),  # 3x3 != bytes sent
        (lambda f: struct.pack_into("<Q", f, 27, 2**40), "implausibly"),
        (lambda f: f.__setitem__(24, ord(" ")), "kind"),
    ],
)
def test_malformed_frames_are_protocol_errors(
    patch: Callable[[bytearray], None], match: str
) -> None:
    frame = one_array_frame()
    decode_frame(bytes(frame))  # the unpatched frame is fine
    patch(frame)
    with pytest.raises(ProtocolError, match=match):
        decode_frame(bytes(frame))


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"n": 65}, "at most 64"),
        ({"meta": 64 * 1024 + 1}, "meta"),
        ({"kind": 0}, "kind length"),
        ({"kind": 33}, "kind length"),
        ({"n": 2, "table": 2}, "table"),
        ({"data": 4}, "multiple of 8"),
    ],
)
def test_header_limits(fields: dict[str, int], match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_frame(header(**fields) + bytes(64))


def test_an_empty_array_with_an_absurd_shape_is_refused() -> None:
    # 0 bytes of data, but numpy itself would refuse the shape: it must not escape as ValueError.
    entry = struct.pack("<BB8Q", 2, 8, *([2**29] * 7), 0)
    frame = header(n=1, table=len(entry)) + b"k" + entry
    frame += bytes(-len(frame) % 8)
    with pytest.raises(ProtocolError, match="implausibly"):
        decode_frame(frame)
    ok = struct.pack("<BB3Q", 2, 3, 5, 0, 7)
    frame = header(n=1, table=len(ok)) + b"k" + ok
    assert decode_frame(frame + bytes(-len(frame) % 8)).arrays[0].shape == (5, 0, 7)


def test_meta_must_be_a_json_object() -> None:
    for meta in (b"[1,2]", b"{not json", b"[" * 5000 + b"]" * 5000):
        frame = header(meta=len(meta)) + b"k" + meta
        frame += bytes(-len(frame) % 8)
        with pytest.raises(ProtocolError, match="meta"):
            decode_frame(frame)


# -------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_round_trip_every_dtype_and_shape(dtype: Any) -> None:
    rng = np.random.default_rng(1)
    arrays = tuple(values(rng, dtype, shape) for shape in SHAPES)
    with serving() as server, connect(server.address, SECRET) as conn:
        reply = conn.request("echo", None, arrays, copy=True)
    assert len(reply.arrays) == len(arrays)
    for sent, got in zip(arrays, reply.arrays, strict=True):
        assert same(sent, got), (sent, got)


def test_meta_round_trip() -> None:
    meta = {
        "step": 12345678901234,
        "lr": 0.001,
        "ok": True,
        "none": None,
        "name": "wörker-3 ✓",
        "shards": [[0, 10], [10, 20]],
        "nested": {"a": {"b": [1.5, "x", False, None]}},
    }
    with serving() as server, connect(server.address, SECRET) as conn:
        assert conn.request("echo", meta).meta == meta
        assert conn.request("echo").meta == {}


def test_views_are_overwritten_by_the_next_recv_but_copies_are_not() -> None:
    ones = np.ones(1000, np.float32)
    twos = np.full(1000, 2.0, np.float32)
    with serving() as server, connect(server.address, SECRET) as conn:
        view = conn.request("echo", arrays=(ones,)).arrays[0]
        assert (view == 1).all()
        conn.request("echo", arrays=(twos,))
        assert (view == 2).all()  # the documented hazard: same buffer, overwritten in place

        kept = conn.request("echo", arrays=(ones,), copy=True).arrays[0]
        conn.request("echo", arrays=(twos,))
        assert (kept == 1).all()


def test_large_arrays_survive_partial_sends_both_ways() -> None:
    big = np.random.default_rng(2).standard_normal((1024, 2048)).astype(np.float32)  # 8 MiB
    with serving() as server, connect(server.address, SECRET) as conn:
        for _ in range(3):
            reply = conn.request("echo", {"n": 1}, (big, big[:10]))
            assert same(reply.arrays[0], big) and same(reply.arrays[1], big[:10])


def test_non_contiguous_and_big_endian_arrays_are_sent_as_contiguous_copies() -> None:
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    odd = (base[:, ::2], base.T, base.astype(">f8"), base.astype(">i4"))
    with serving() as server, connect(server.address, SECRET) as conn:
        reply = conn.request("echo", arrays=odd)
    for sent, got in zip(odd, reply.arrays, strict=True):
        assert got.dtype == sent.dtype.newbyteorder("<") and got.flags.c_contiguous
        np.testing.assert_array_equal(got, sent)


@pytest.mark.parametrize(
    ("kind", "meta", "arrays", "match"),
    [
        ("x", None, (np.array([object(), 1]),), "dtype object"),
        ("x", None, (np.zeros(3, np.float16),), "dtype float16"),
        ("x", None, (np.array(["a"]),), "dtype <U1"),
        ("x", None, ([1.0, 2.0],), "not a numpy.ndarray"),
        ("x", None, (np.zeros((1,) * 9),), "9 dimensions"),
        ("x", None, (np.zeros(1),) * 65, "65 arrays"),
        ("x", {"s": {1, 2}}, (), "not plain JSON"),
        ("x", {"s": "y" * 70_000}, (), "at most 65536"),
        ("x" * 33, None, (), "1..32"),
        ("ümlaut", None, (), "not ASCII"),
        ("has space", None, (), "characters"),
    ],
)
def test_invalid_messages_are_refused_before_sending(
    kind: str, meta: dict[str, Any] | None, arrays: tuple[Any, ...], match: str
) -> None:
    with serving() as server, connect(server.address, SECRET) as conn:
        with pytest.raises(MessageError, match=match):
            conn.send(kind, meta, arrays)
        assert conn.request("echo", {"still": "usable"}).meta == {"still": "usable"}


def test_messages_over_the_senders_own_limit_are_refused() -> None:
    with (
        serving() as server,
        connect(server.address, SECRET, max_message_bytes=64 * 1024) as conn,
    ):
        with pytest.raises(MessageError, match="limit"):
            conn.send("x", None, (np.zeros(20_000, np.float32),))
        conn.request("echo", None, (np.zeros(1000, np.float32),))


# ------------------------------------------------------------------------ authentication


def test_a_client_with_the_wrong_secret_is_rejected_and_the_server_keeps_serving() -> None:
    with serving() as server:
        with pytest.raises(AuthenticationError, match="could not prove"):
            connect(server.address, b"another job's secret, 32 bytes!")
        deadline = time.monotonic() + 2
        while server.failed_handshakes < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.failed_handshakes == 1
        with connect(server.address, SECRET) as conn:
            assert conn.request("echo", {"a": 1}).meta == {"a": 1}


def test_the_server_rejects_a_bad_proof_and_keeps_serving() -> None:
    with serving() as server:
        sock = socket.create_connection(server.address, timeout=5)
        with sock:
            sock.sendall(b"DKFA\x01\x00\x00\x00" + secrets.token_bytes(32))
            challenge = recv_exact(sock, 64)
            # Reflect the server's own proof: the role label makes it worthless.
            sock.sendall(challenge[32:])
            assert closed_by_peer(sock)
        with connect(server.address, SECRET) as conn:
            assert conn.request("echo").kind == "echo"
            assert server.failed_handshakes == 1 and server.connections == 1


def test_garbage_and_silent_peers_are_dropped_during_the_handshake() -> None:
    with serving(handshake_timeout=0.3) as server:
        with socket.create_connection(server.address, timeout=5) as garbage:
            garbage.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(20))
            assert closed_by_peer(garbage)
        with socket.create_connection(server.address, timeout=5) as silent:
            t0 = time.monotonic()
            assert closed_by_peer(silent, within=3)
            assert 0.2 < time.monotonic() - t0 < 2
        with connect(server.address, SECRET) as conn:
            conn.request("echo")


def test_a_client_rejects_a_server_with_the_wrong_secret() -> None:
    with (
        fake_server(b"", secret=b"not the secret the client holds!") as address,
        pytest.raises(AuthenticationError) as info,
    ):
        connect(address, SECRET)
    assert isinstance(info.value, PermanentError)


def test_the_secret_never_appears_in_reprs_or_errors() -> None:
    texts: list[str] = []
    with serving() as server:
        texts += [repr(server), str(server)]
        with connect(server.address, SECRET) as conn:
            texts += [repr(conn), str(conn)]
        texts.append(repr(conn))
        with pytest.raises(ConnectionClosedError) as closed:
            conn.send("x")
        texts.append(str(closed.value))
    with (
        fake_server(b"", secret=b"not the secret the client holds!") as address,
        pytest.raises(AuthenticationError) as auth,
    ):
        connect(address, SECRET)
    texts.append(str(auth.value))
    with pytest.raises(UserInputError) as short:
        Server(LOCAL, SECRET[:8], echo)
    texts.append(str(short.value))
    assert all(text for text in texts)
    for text in texts:
        for form in (SECRET.hex(), repr(SECRET), SECRET.decode("latin-1")[1:12]):
            assert form not in text, text


# ---------------------------------------------------------------------- size limits live


def test_a_server_closes_a_peer_announcing_10_gib_without_allocating_it() -> None:
    with serving() as server:
        tracemalloc.start()
        try:
            with raw_authenticated(server.address) as sock:
                t0 = time.monotonic()
                sock.sendall(header(data=10 * GIB))
                assert closed_by_peer(sock)
                assert time.monotonic() - t0 < 1.0
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 20 * 1024 * 1024
        with connect(server.address, SECRET) as conn:
            assert conn.request("echo", {"alive": True}).meta == {"alive": True}


def test_a_client_rejects_a_10_gib_frame_without_allocating_it() -> None:
    with fake_server(header(data=10 * GIB)) as address:
        conn = connect(address, SECRET)
        tracemalloc.start()
        try:
            t0 = time.monotonic()
            with pytest.raises(ProtocolError, match="limit"):
                conn.recv()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert time.monotonic() - t0 < 1.0 and peak < 20 * 1024 * 1024
        assert conn.closed
        with pytest.raises(ConnectionClosedError):
            conn.recv()


@pytest.mark.parametrize(
    ("patch", "match"),
    [
        (lambda f: f.__setitem__(slice(0, 4), b"EVIL"), "magic"),
        (lambda f: f.__setitem__(25, 200), "dtype code"),
        (lambda f: struct.pack_into("<Q", f, 27, 4), "header announced"),
    ],
)
def test_a_client_rejects_malformed_frames(patch: Callable[[bytearray], None], match: str) -> None:
    frame = one_array_frame()
    patch(frame)
    with fake_server(bytes(frame)) as address, connect(address, SECRET) as conn:
        with pytest.raises(ProtocolError, match=match):
            conn.recv()
        assert conn.closed


@pytest.mark.parametrize("patch_at", [0, 25, 27])
@THREADED
def test_a_malformed_frame_closes_only_that_peer(patch_at: int, threaded: bool) -> None:
    frame = one_array_frame()
    frame[patch_at] ^= 0x5A
    with serving(threaded=threaded) as server, connect(server.address, SECRET) as good:
        good.request("echo")
        with raw_authenticated(server.address) as bad:
            bad.sendall(bytes(frame))
            assert closed_by_peer(bad)
        assert good.request("echo", {"after": 1}).meta == {"after": 1}


def test_a_frame_over_the_servers_limit_closes_the_connection() -> None:
    with serving(max_message_bytes=1024 * 1024) as server:
        with connect(server.address, SECRET) as conn:
            conn.request("echo", None, (np.zeros(1000, np.float32),))
            with pytest.raises(ConnectionClosedError):
                conn.request("echo", None, (np.zeros(2 * 1024 * 1024, np.uint8),))
        with connect(server.address, SECRET) as conn:
            conn.request("echo")


# ------------------------------------------------------------ the size limit to the byte
# The tests above announce 10 GiB, or send twice a server's limit: a bound checked against
# twice the limit (or the limit plus a header) still refuses those. These pin it to the byte, at
# each place that enforces it: the sender, the parser's check of an announced size, a server and
# a client. Frames are whole multiples of 8 bytes, so "just over" is the limit plus 8.

BOUND = 64 * 1024


def filling(total: int) -> tuple[np.ndarray]:
    """The one uint8 array that makes a kind-"k" message exactly ``total`` bytes on the wire:
    header 24, then "k" and the 10-byte table entry padded to 16, then the data (``total`` - 40,
    a multiple of 8 when ``total`` is, so no padding)."""
    return (np.zeros(total - 40, np.uint8),)


def test_a_frame_of_exactly_the_limit_passes_and_one_8_bytes_longer_does_not() -> None:
    frame = encode_frame("k", None, filling(BOUND), max_message_bytes=BOUND)
    assert len(frame) == BOUND
    assert decode_frame(frame, max_message_bytes=BOUND).arrays[0].nbytes == BOUND - 40
    with pytest.raises(MessageError, match=f"message of {BOUND + 8} bytes exceeds"):
        encode_frame("k", None, filling(BOUND + 8), max_message_bytes=BOUND)
    # A bare header announcing kind "k" and data: 24 + 8 (kind padded) + data bytes in all. At
    # the limit it is only cut short; 8 bytes over, the announcement itself is refused.
    with pytest.raises(ProtocolError, match="truncated"):
        decode_frame(header(data=BOUND - 32), max_message_bytes=BOUND)
    with pytest.raises(ProtocolError, match=f"frame of {BOUND + 8} bytes announced"):
        decode_frame(header(data=BOUND + 8 - 32), max_message_bytes=BOUND)


@THREADED
def test_a_server_answers_a_frame_of_exactly_its_limit_and_drops_one_8_bytes_longer(
    threaded: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dlrover_kfp.training.wire")
    with serving(max_message_bytes=BOUND, threaded=threaded) as server:
        with connect(server.address, SECRET) as conn:
            assert conn.request("k", None, filling(BOUND)).arrays[0].nbytes == BOUND - 40
            conn.send("k", None, filling(BOUND + 8))
            with pytest.raises(ConnectionClosedError):
                conn.recv()
        with connect(server.address, SECRET) as conn:
            conn.request("echo")
    # Dropped for its announcement, not because the receive buffer (capped at the limit) filled.
    assert f"frame of {BOUND + 8} bytes announced" in caplog.text


def test_a_client_takes_a_frame_of_exactly_its_limit_and_refuses_one_8_bytes_longer() -> None:
    at = encode_frame("k", None, filling(BOUND))
    over = encode_frame("k", None, filling(BOUND + 8))
    with (
        fake_server(at + over) as address,
        connect(address, SECRET, max_message_bytes=BOUND) as conn,
    ):
        assert conn.recv().arrays[0].nbytes == BOUND - 40
        with pytest.raises(ProtocolError, match=f"frame of {BOUND + 8} bytes announced"):
            conn.recv()
        assert conn.closed


# ----------------------------------------------------------------------- server behaviour


@THREADED
def test_a_handler_exception_becomes_a_remote_error_and_the_server_keeps_serving(
    threaded: bool,
) -> None:
    with serving(threaded=threaded) as server, connect(server.address, SECRET) as conn:
        with pytest.raises(RemoteError) as info:
            conn.request("fail")
        assert str(info.value) == "ValueError: boom second line"
        assert info.value.remote_type == "ValueError"
        with pytest.raises(RemoteError, match="object"):
            conn.request("bad-reply")
        assert conn.request("echo", {"n": 2}).meta == {"n": 2}
        with connect(server.address, SECRET) as other:
            other.request("echo")


def test_no_reply_and_a_recv_timeout_leave_the_connection_usable() -> None:
    with serving() as server, connect(server.address, SECRET, timeout=0.2) as conn:
        conn.send("silent")
        with pytest.raises(WireTimeoutError) as info:
            conn.recv()
        assert isinstance(info.value, TransientError)
        assert conn.request("echo", {"x": 1}).meta == {"x": 1}


@THREADED
def test_on_disconnect_sees_the_peer_state_when_a_client_dies(threaded: bool) -> None:
    gone: list[dict[str, Any]] = []
    event = threading.Event()

    def handler(peer: PeerInfo, msg: Message) -> Message:
        peer.state["worker"] = msg.meta["worker"]
        return Message("ok")

    def on_disconnect(peer: PeerInfo) -> None:
        gone.append(dict(peer.state, id=peer.id))
        event.set()

    with serving(handler, on_disconnect=on_disconnect, threaded=threaded) as server:
        with raw_authenticated(server.address) as sock:
            sock.sendall(encode_frame("hello", {"worker": 7}))
            recv_exact(sock, HEADER.size + 8)
            # Die abruptly: an RST, as when the worker's process is killed.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        assert event.wait(2)
        assert gone[0]["worker"] == 7
        event.clear()
        conn = connect(server.address, SECRET)
        conn.request("hello", {"worker": 8})
        conn.close()
        assert event.wait(2)
        assert [g["worker"] for g in gone] == [7, 8] and gone[0]["id"] != gone[1]["id"]
    assert len(gone) == 2


@THREADED
def test_on_disconnect_is_called_for_open_peers_at_shutdown(threaded: bool) -> None:
    gone: list[int] = []
    server = Server(
        LOCAL, SECRET, echo, on_disconnect=lambda p: gone.append(p.id), threaded=threaded
    )
    server.serve_in_thread()
    with connect(server.address, SECRET) as conn:
        conn.request("echo")
        server.close()
        assert len(gone) == 1
        with pytest.raises(ConnectionClosedError):
            conn.request("echo")
    assert "stopped" in repr(server)


@THREADED
def test_stop_from_a_handler(threaded: bool) -> None:
    server: Server

    def handler(peer: PeerInfo, msg: Message) -> Message:
        server.stop()
        return Message("bye")

    server = Server(LOCAL, SECRET, handler, threaded=threaded)
    thread = server.serve_in_thread()
    with connect(server.address, SECRET) as conn:
        assert conn.request("stop").kind == "bye"
    thread.join(2)
    assert not thread.is_alive()


@THREADED
def test_pipelined_messages_are_handled_and_answered_in_order(threaded: bool) -> None:
    seen: list[int] = []

    def handler(peer: PeerInfo, msg: Message) -> Message:
        seen.append(msg.meta["seq"])
        return Message("ok", msg.meta, (msg.arrays[0] + 1,))

    with serving(handler, threaded=threaded) as server, connect(server.address, SECRET) as conn:
        for seq in range(50):
            conn.send("work", {"seq": seq}, (np.full(100, seq, np.int32),))
        for seq in range(50):
            reply = conn.recv()
            assert reply.meta == {"seq": seq} and (reply.arrays[0] == seq + 1).all()
    assert seen == list(range(50))


@THREADED
def test_many_concurrent_clients_get_their_own_replies(threaded: bool) -> None:
    def handler(peer: PeerInfo, msg: Message) -> Message:
        return Message("ok", msg.meta, (msg.arrays[0] * 2,))

    errors: list[BaseException] = []

    def client(address: tuple[str, int], who: int) -> None:
        try:
            with connect(address, SECRET) as conn:
                for seq in range(200):
                    data = np.arange(16, dtype=np.int64) + who * 100_000 + seq
                    reply = conn.request("work", {"who": who, "seq": seq}, (data,))
                    assert reply.meta == {"who": who, "seq": seq}
                    np.testing.assert_array_equal(reply.arrays[0], data * 2)
        except BaseException as exc:
            errors.append(exc)

    with serving(handler, threaded=threaded) as server:
        threads = [threading.Thread(target=client, args=(server.address, who)) for who in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
    assert not errors, errors[0]


def test_a_threaded_server_serves_connections_in_parallel() -> None:
    # Both handlers must be inside at once to pass the barrier: one loop thread could not.
    barrier = threading.Barrier(2, timeout=5)

    def handler(peer: PeerInfo, msg: Message) -> Message:
        barrier.wait()
        return Message("ok", msg.meta)

    replies: list[dict[str, Any]] = []

    def client(address: tuple[str, int], who: int) -> None:
        with connect(address, SECRET) as conn:
            replies.append(conn.request("meet", {"who": who}).meta)

    with serving(handler, threaded=True) as server:
        threads = [threading.Thread(target=client, args=(server.address, w)) for w in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
    assert sorted(r["who"] for r in replies) == [0, 1]
    assert not barrier.broken


# ------------------------------------------------------------------------------ connecting


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(LOCAL)
        port: int = sock.getsockname()[1]
        return port


def test_connect_retries_until_a_late_server_starts() -> None:
    port = free_port()
    started: list[Server] = []

    def start_late() -> None:
        time.sleep(0.3)
        server = Server(("127.0.0.1", port), SECRET, echo)
        started.append(server)
        server.serve_forever()

    thread = threading.Thread(target=start_late, daemon=True)
    thread.start()
    t0 = time.monotonic()
    try:
        with connect(("127.0.0.1", port), SECRET, retry_for=5.0) as conn:
            assert time.monotonic() - t0 >= 0.25
            assert conn.request("echo", {"late": True}).meta == {"late": True}
    finally:
        thread.join(0.5) if not started else started[0].stop()
        thread.join(2)


def test_connect_gives_up_naming_the_address() -> None:
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(PeerUnavailableError, match=f"127.0.0.1:{port}") as info:
        connect(("127.0.0.1", port), SECRET)
    assert isinstance(info.value, TransientError) and time.monotonic() - t0 < 1
    t0 = time.monotonic()
    with pytest.raises(PeerUnavailableError):
        connect(("127.0.0.1", port), SECRET, retry_for=0.3)
    assert 0.3 <= time.monotonic() - t0 < 1.5


def test_a_peer_that_refuses_is_given_up_after_refused_for_not_retry_for() -> None:
    """A refusal means nothing listens there: a pod whose master was killed while it started
    exits after ``refused_for``, not after the long ``retry_for`` meant for a slow start."""
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(PeerUnavailableError, match=f"127.0.0.1:{port}: refused for") as info:
        connect(("127.0.0.1", port), SECRET, retry_for=60.0, refused_for=0.3)
    assert isinstance(info.value, TransientError)
    assert 0.3 <= time.monotonic() - t0 < 1.5


def test_server_address_reports_the_chosen_port() -> None:
    with serving() as server:
        host, port = server.address
        assert host == "127.0.0.1" and port > 0
        assert f"127.0.0.1:{port}" in repr(server)


def test_a_connection_is_a_context_manager_and_closes_once() -> None:
    with serving() as server:
        conn = connect(server.address, SECRET)
        assert isinstance(conn, Connection) and not conn.closed
        with conn:
            pass
        assert conn.closed
        conn.close()
        with pytest.raises(ConnectionClosedError):
            conn.recv()


# --------------------------------------------------------------------------------- secrets


def test_secret_helpers(monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = new_secret(), new_secret()
    assert len(first) == 32 and first != second
    monkeypatch.setenv("DLROVER_KFP_JOB_SECRET", secret_to_env(first))
    assert secret_from_env() == first
    monkeypatch.setenv("MY_SECRET", secret_to_env(second))
    assert secret_from_env("MY_SECRET") == second


@pytest.mark.parametrize("value", [None, "", "zz-not-hex-deadbeef", "abcd"])
def test_a_missing_or_malformed_secret_names_the_variable_not_the_value(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv("DLROVER_KFP_JOB_SECRET", raising=False)
    else:
        monkeypatch.setenv("DLROVER_KFP_JOB_SECRET", value)
    with pytest.raises(UserInputError, match="DLROVER_KFP_JOB_SECRET") as info:
        secret_from_env()
    if value:
        assert value not in str(info.value)
