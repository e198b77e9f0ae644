"""The server end: :class:`Server`, one ``selectors`` loop (or a thread per connection)
serving many authenticated peers, each through its own :class:`_Peer` state."""

from __future__ import annotations

import contextlib
import hmac
import logging
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from dlrover_kfp.training.wire.auth import (
    _ACK,
    _CLIENT_LABEL,
    _HELLO_BYTES,
    _HELLO_MAGIC,
    _NONCE_BYTES,
    _PROOF_BYTES,
    _SERVER_LABEL,
    _Key,
)
from dlrover_kfp.training.wire.codec import (
    DEFAULT_MAX_MESSAGE_BYTES,
    VERSION,
    Message,
    ProtocolError,
    _check_limit,
    _encode,
    _FrameReader,
)
from dlrover_kfp.training.wire.sockets import (
    Address,
    _consume,
    _format_address,
    _send_all,
    _tune,
)

#: The package's logger, named as before the transport was split into modules: the log lines
#: and any filter or level set on "dlrover_kfp.training.wire" stay as they were.
log = logging.getLogger("dlrover_kfp.training.wire")


@dataclass(eq=False)
class PeerInfo:
    """One authenticated client as the handler sees it.

    ``state`` is the handler's own per-connection scratch space (a worker's id, its leased
    shards); it survives until ``on_disconnect`` has been called for this peer.
    """

    id: int
    address: Address
    state: dict[str, Any] = field(default_factory=dict)


Handler = Callable[[PeerInfo, Message], Message | None]


class _Phase(Enum):
    HELLO = 1
    PROOF = 2
    READY = 3
    CLOSED = 4


class _Peer:
    """Server-side connection state: handshake progress, receive buffer, unsent reply bytes."""

    __slots__ = (
        "deadline",
        "events",
        "hs_buf",
        "hs_have",
        "info",
        "nonce",
        "out",
        "phase",
        "reader",
        "sock",
    )

    def __init__(self, sock: socket.socket, info: PeerInfo, deadline: float) -> None:
        self.sock = sock
        self.info = info
        self.phase = _Phase.HELLO
        self.deadline = deadline
        self.hs_buf = bytearray(_HELLO_BYTES)
        self.hs_have = 0
        self.nonce = b""
        self.reader: _FrameReader | None = None
        self.out: list[bytes | memoryview] = []
        self.events = selectors.EVENT_READ


_LISTENER = object()
_WAKER = object()


class Server:
    """A single-threaded, ``selectors``-based server for many authenticated connections.

    One thread does everything (accept, handshakes, reads, handler calls, writes), so handlers
    need no locks and see each connection's messages in arrival order. The handshake runs in
    the loop too, non-blocking: a client that stalls mid-handshake costs nothing but a slot,
    and is dropped after ``handshake_timeout`` seconds (at most ``max_pending_handshakes`` at
    once). A handler exception becomes an ``"error"`` reply; a malformed frame closes only that
    peer's connection.

    While a reply is only partly sent (the client is slow to read), the server neither reads
    from nor dispatches for that peer: this bounds memory per peer to one reply, and it makes
    returning the request's own arrays (views into the receive buffer) in a reply safe.

    Handler arrays are views into the peer's receive buffer, valid only during the handler
    call, unless ``copy_arrays=True``. Reply arrays are sent after the handler returns and may
    be referenced until fully sent: do not modify them in place after returning them.

    ``on_disconnect(peer)`` runs in the loop thread exactly once for every authenticated peer
    whose connection ends, for whatever reason (EOF, reset, protocol error, :meth:`stop`), with
    ``peer.state`` as the handler left it; the master requeues a dead worker's shards there.
    The listening socket is bound in the constructor, so :attr:`address` is known (and clients
    may already connect) before :meth:`serve_forever` runs.

    ``threaded=True`` serves every authenticated connection on a thread of its own instead
    (accept and handshakes stay in the loop): a parameter server's handlers spend their time in
    numpy/torch kernels that release the GIL, so requests from several workers then run in
    parallel on as many cores as the process may use. Each connection's messages are still
    handled in arrival order, one at a time, but handlers of different connections run
    concurrently and must be thread-safe; ``on_disconnect`` then runs in the connection's own
    thread. A threaded connection blocks in ``send`` while its client is slow to read, which
    bounds its memory to one reply just as the loop does.
    """

    def __init__(
        self,
        address: Address,
        secret: bytes,
        handler: Handler,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        on_disconnect: Callable[[PeerInfo], None] | None = None,
        handshake_timeout: float = 5.0,
        max_pending_handshakes: int = 128,
        copy_arrays: bool = False,
        backlog: int = 128,
        threaded: bool = False,
    ) -> None:
        self._key = _Key(secret)
        self._threaded = threaded
        self._peer_threads: dict[int, threading.Thread] = {}
        self._drop_lock = threading.Lock()
        self._limit = _check_limit(max_message_bytes)
        self._handler = handler
        self._on_disconnect = on_disconnect
        self._handshake_timeout = handshake_timeout
        self._max_pending = max_pending_handshakes
        self._copy = copy_arrays
        self._listener = socket.create_server(address, backlog=backlog)
        self._listener.setblocking(False)
        bound = self._listener.getsockname()
        self._address: Address = (bound[0], bound[1])
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, _LISTENER)
        self._selector.register(self._wake_r, selectors.EVENT_READ, _WAKER)
        self._peers: dict[int, _Peer] = {}
        self._handshaking: dict[int, _Peer] = {}
        self._next_id = 1
        self._failed_handshakes = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._started = False
        self._finished = False
        self._thread: threading.Thread | None = None

    # --- public -------------------------------------------------------------------------

    @property
    def address(self) -> Address:
        """The bound address; with port 0 this is the port the OS chose."""
        return self._address

    @property
    def failed_handshakes(self) -> int:
        """Connections closed before authenticating (wrong secret, garbage, timeout, EOF)."""
        return self._failed_handshakes

    @property
    def connections(self) -> int:
        """Authenticated connections currently open."""
        return len(self._peers) - len(self._handshaking)

    def serve_forever(self) -> None:
        """Run the event loop in this thread until :meth:`stop`; then close every socket."""
        with self._lock:
            if self._started:
                raise RuntimeError("a Server serves once; make a new one")
            self._started = True
        try:
            while not self._stop.is_set():
                timeout = self._select_timeout() if self._handshaking else None
                for key, mask in self._selector.select(timeout):
                    data = key.data
                    if isinstance(data, _Peer):
                        self._service(data, mask)
                    elif data is _LISTENER:
                        self._accept()
                    else:  # the waker: stop() was called
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                if self._handshaking:
                    self._expire_handshakes()
        finally:
            self._shutdown()

    def serve_in_thread(self, name: str = "wire-server") -> threading.Thread:
        """Start :meth:`serve_forever` in a daemon thread and return it."""
        thread = threading.Thread(target=self.serve_forever, name=name, daemon=True)
        self._thread = thread
        thread.start()
        return thread

    def stop(self) -> None:
        """Ask the loop to finish. Thread-safe, and safe to call from a handler or twice."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def close(self) -> None:
        """Stop, wait for a :meth:`serve_in_thread` thread, and release the sockets."""
        self.stop()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        for peer_thread in list(self._peer_threads.values()):
            if peer_thread is not threading.current_thread():
                peer_thread.join(timeout=5.0)
        with self._lock:
            never_served = not self._started
            self._started = True
        if never_served:
            self._shutdown()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "stopped" if self._finished else "running" if self._started else "not started"
        return (
            f"<Server on {_format_address(self._address)} {state}, {self.connections} connections>"
        )

    # --- loop ---------------------------------------------------------------------------

    def _select_timeout(self) -> float:
        earliest = min(peer.deadline for peer in self._handshaking.values())
        return max(0.0, earliest - time.monotonic())

    def _expire_handshakes(self) -> None:
        now = time.monotonic()
        for peer in [p for p in self._handshaking.values() if p.deadline <= now]:
            log.warning("authentication with %s timed out", _format_address(peer.info.address))
            self._drop(peer, failed_handshake=True)

    def _accept(self) -> None:
        while True:
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE: keep serving the connections we have
                log.warning("accept failed: %s", exc)
                return
            sock.setblocking(False)
            _tune(sock)
            info = PeerInfo(self._next_id, (addr[0], addr[1]))
            self._next_id += 1
            if len(self._handshaking) >= self._max_pending:
                log.warning(
                    "too many pending handshakes; refusing %s", _format_address(info.address)
                )
                self._failed_handshakes += 1
                sock.close()
                continue
            peer = _Peer(sock, info, time.monotonic() + self._handshake_timeout)
            self._peers[info.id] = peer
            self._handshaking[info.id] = peer
            self._selector.register(sock, selectors.EVENT_READ, peer)

    def _service(self, peer: _Peer, mask: int) -> None:
        # A peer is registered for reading or for writing, never both (see _queue).
        if peer.phase is _Phase.CLOSED:
            return
        if mask & selectors.EVENT_READ:
            if peer.phase is _Phase.READY:
                self._read_frames(peer)
            else:
                self._read_handshake(peer)
        elif self._flush(peer):
            self._set_events(peer, selectors.EVENT_READ)
            if peer.phase is _Phase.READY:
                if self._threaded:
                    self._hand_off(peer)  # the handshake's acknowledgement went out
                else:
                    self._dispatch(peer)  # frames that arrived while we were writing

    def _read_handshake(self, peer: _Peer) -> None:
        need = _HELLO_BYTES if peer.phase is _Phase.HELLO else _PROOF_BYTES
        try:
            count = peer.sock.recv_into(memoryview(peer.hs_buf)[peer.hs_have : need])
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(peer, failed_handshake=True)
            return
        if count == 0:
            log.info("%s closed during authentication", _format_address(peer.info.address))
            self._drop(peer, failed_handshake=True)
            return
        peer.hs_have += count
        if peer.hs_have < need:
            return
        peer.hs_have = 0
        data = bytes(peer.hs_buf[:need])
        if peer.phase is _Phase.HELLO:
            if data[:4] != _HELLO_MAGIC or data[4] != VERSION:
                log.warning("bad hello from %s", _format_address(peer.info.address))
                self._drop(peer, failed_handshake=True)
                return
            peer.nonce = secrets.token_bytes(_NONCE_BYTES)
            peer.phase = _Phase.PROOF
            self._queue(peer, [peer.nonce + self._key.prove(data[8:], _SERVER_LABEL)])
        else:
            if not hmac.compare_digest(data, self._key.prove(peer.nonce, _CLIENT_LABEL)):
                log.warning(
                    "authentication failed for %s (wrong job secret)",
                    _format_address(peer.info.address),
                )
                self._drop(peer, failed_handshake=True)
                return
            peer.phase = _Phase.READY
            peer.reader = _FrameReader(self._limit)
            del self._handshaking[peer.info.id]
            self._queue(peer, [_ACK])
            if self._threaded and not peer.out and peer.phase is _Phase.READY:
                self._hand_off(peer)

    def _hand_off(self, peer: _Peer) -> None:
        """Give an authenticated connection its own thread (``threaded=True``). The loop has
        read only handshake bytes from it, so the thread starts at a frame boundary."""
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(peer.sock)
        peer.sock.setblocking(True)
        thread = threading.Thread(
            target=self._serve_peer, args=(peer,), name=f"wire-peer-{peer.info.id}", daemon=True
        )
        self._peer_threads[peer.info.id] = thread
        thread.start()

    def _serve_peer(self, peer: _Peer) -> None:
        """One connection's blocking loop: read a frame, call the handler, send the reply."""
        reader = peer.reader
        assert reader is not None
        where = _format_address(peer.info.address)
        try:
            while not self._stop.is_set():
                message = reader.next_message(self._copy)
                if message is None:
                    count = peer.sock.recv_into(reader.free())
                    if count == 0:
                        return
                    reader.advance(count)
                    continue
                reply = self._call_handler(peer.info, message)
                if reply is not None:
                    _send_all(peer.sock, reply, sum(memoryview(b).nbytes for b in reply))
        except ProtocolError as exc:
            log.warning("closing %s: protocol error: %s", where, exc)
        except OSError as exc:
            if not self._stop.is_set():
                log.info("connection from %s broke: %s", where, exc)
        except Exception:  # a parser bug must cost one peer, not every peer
            log.exception("closing %s: unexpected error", where)
        finally:
            self._drop(peer)
            # Only now: close() joins the threads it finds here, so on_disconnect has run by
            # the time it returns.
            self._peer_threads.pop(peer.info.id, None)

    def _read_frames(self, peer: _Peer) -> None:
        reader = peer.reader
        assert reader is not None
        try:
            count = peer.sock.recv_into(reader.free())
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.info("connection from %s broke: %s", _format_address(peer.info.address), exc)
            self._drop(peer)
            return
        if count == 0:
            self._drop(peer)
            return
        reader.advance(count)
        self._dispatch(peer)

    def _dispatch(self, peer: _Peer) -> None:
        """Hand every whole buffered frame to the handler, in order, until a reply is stuck."""
        reader = peer.reader
        assert reader is not None
        while not peer.out and peer.phase is _Phase.READY:
            try:
                message = reader.next_message(self._copy)
            except ProtocolError as exc:
                log.warning(
                    "closing %s: protocol error: %s", _format_address(peer.info.address), exc
                )
                self._drop(peer)
                return
            except Exception:  # a parser bug must cost one peer, not every peer
                log.exception("closing %s: unexpected error", _format_address(peer.info.address))
                self._drop(peer)
                return
            if message is None:
                return
            reply = self._call_handler(peer.info, message)
            if reply is not None:
                self._queue(peer, reply)

    def _call_handler(self, info: PeerInfo, message: Message) -> list[bytes | memoryview] | None:
        try:
            reply = self._handler(info, message)
            if reply is None:
                return None
            if not isinstance(reply, Message):
                raise TypeError(f"handler returned {type(reply).__name__}, not Message or None")
            return _encode(reply.kind, reply.meta, reply.arrays, self._limit)[0]
        except Exception as exc:
            log.warning(
                "handler failed on %r from %s",
                message.kind,
                _format_address(info.address),
                exc_info=True,
            )
            text = " ".join(f"{type(exc).__name__}: {exc}".split())[:1000]
            error = {"message": text, "type": type(exc).__name__}
            return _encode("error", error, (), self._limit)[0]

    def _queue(self, peer: _Peer, buffers: list[bytes | memoryview]) -> None:
        peer.out.extend(buffers)
        if not self._flush(peer):
            self._set_events(peer, selectors.EVENT_WRITE)

    def _flush(self, peer: _Peer) -> bool:
        """Send what is queued without blocking; True when all of it went out."""
        while peer.out:
            try:
                sent = peer.sock.sendmsg(peer.out)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError as exc:
                log.info("connection from %s broke: %s", _format_address(peer.info.address), exc)
                self._drop(peer)
                return False
            _consume(peer.out, sent)
        return True

    def _set_events(self, peer: _Peer, events: int) -> None:
        if peer.phase is not _Phase.CLOSED and peer.events != events:
            self._selector.modify(peer.sock, events, peer)
            peer.events = events

    def _drop(self, peer: _Peer, *, failed_handshake: bool = False) -> None:
        with self._drop_lock:  # a threaded peer's thread and the loop's shutdown may race
            if peer.phase is _Phase.CLOSED:
                return
            was_ready = peer.phase is _Phase.READY
            peer.phase = _Phase.CLOSED
        peer.out.clear()
        self._peers.pop(peer.info.id, None)
        self._handshaking.pop(peer.info.id, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(peer.sock)
        peer.sock.close()
        if failed_handshake:
            self._failed_handshakes += 1
        if was_ready and self._on_disconnect is not None:
            try:
                self._on_disconnect(peer.info)
            except Exception:  # the callback's bug must not stop the loop serving the others
                log.exception("on_disconnect failed for peer %d", peer.info.id)

    def _shutdown(self) -> None:
        for peer in list(self._peers.values()):
            if peer.info.id in self._peer_threads:
                # Its own thread closes it: wake a blocked recv instead of closing the file
                # descriptor under it (the number could be reused by another socket at once).
                # Only the reading side: a reply being sent (to "shutdown", say) still leaves.
                with contextlib.suppress(OSError):
                    peer.sock.shutdown(socket.SHUT_RD)
            else:
                self._drop(peer)
        with contextlib.suppress(OSError):
            self._selector.close()
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()
        self._finished = True
