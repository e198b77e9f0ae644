"""The socket plumbing both ends share: gather-sends, buffer options, addresses in messages."""

from __future__ import annotations

import contextlib
import socket

Address = tuple[str, int]


def _format_address(address: Address) -> str:
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _consume(buffers: list[bytes | memoryview], sent: int) -> None:
    """Drop ``sent`` bytes from the front of a gather list (after a partial ``sendmsg``)."""
    while sent:
        first = buffers[0]
        if sent >= len(first):
            sent -= len(first)
            del buffers[0]
        else:
            buffers[0] = memoryview(first)[sent:]
            sent = 0


def _send_all(sock: socket.socket, buffers: list[bytes | memoryview], total: int) -> None:
    """Gather-send a whole frame; usually one syscall, more when the socket buffer fills."""
    sent = sock.sendmsg(buffers)
    if sent == total:
        return
    pending = list(buffers)
    while True:
        _consume(pending, sent)
        if not pending:
            return
        sent = sock.sendmsg(pending)


#: Socket buffer size asked for on every connection. A worker's push of a small-model step is
#: ~0.85 MB (a medium one several MB): with the default buffers (~200 KB) ``sendmsg`` blocks
#: until the PS has read most of it, and the worker waited 17% of every step in it. The kernel
#: caps the request at ``net.core.wmem_max``/``rmem_max`` (4 MiB here); pages are used only
#: while data is in flight.
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024


def _tune(sock: socket.socket) -> None:
    """Small messages leave at once (no Nagle); large ones fit the kernel's buffers whole."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)
