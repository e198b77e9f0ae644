"""The transport between the processes of a parameter-server training job.

Workers, parameter servers and the master talk over TCP (loopback when run locally, the pod
network on Kubernetes). Every step moves a batch's embedding rows (about 1 MB each way), and
the job does thousands of steps per second in all, so the transport is built around three
costs that dominate in Python: per-element encoding, per-message allocation and syscalls.

* Arrays travel as their raw bytes, described by a small table (dtype code, shape). Nothing
  is pickled and nothing received is ever unpickled: a peer that can reach the port must not
  be able to run code in the trainer.
* A frame is sent with one ``sendmsg`` (header and array buffers gathered by the kernel, no
  concatenation copy) and received with ``recv_into`` into one reusable ``bytearray`` per
  connection. Received arrays are numpy views into that buffer.
* Every length in a header is checked against per-connection limits *before* any memory is
  reserved for it, so a hostile or broken peer cannot make a process allocate gigabytes.

Wire format (all integers little-endian)::

    header   24 bytes  struct "<4sBBBBIIQ": magic b"DKFW", version 1, flags 0,
                       kind_len (1..32), n_arrays (0..64), meta_len (<= 64 KiB),
                       table_len, data_len
    preamble           kind (ASCII) | meta (UTF-8 JSON object; empty means {}) |
                       array table: per array "<BB" dtype code, ndim, then ndim x "<Q" dims |
                       zero padding to a multiple of 8 bytes
    data               each array's C-order bytes, each padded with zeros to a multiple of 8,
                       so data_len == sum(align8(nbytes)) and every array lands 8-aligned

Authentication happens once per connection, before any frame, with the per-job secret: both
sides send a random 32-byte nonce and each returns ``HMAC-SHA256(secret, other's nonce || role
label)``, compared with :func:`hmac.compare_digest`. The role label differs per direction, so
an answer reflected back at its sender (or relayed through a second connection) does not
verify. On the wire::

    client -> server   b"DKFA", version, 3 zero bytes, client nonce (32)
    server -> client   server nonce (32), HMAC(secret, client nonce || b"dlrover-kfp-wire/1 server")
    client -> server   HMAC(secret, server nonce || b"dlrover-kfp-wire/1 client")
    server -> client   b"DKOK"

Frames after that are **not** individually MACed. HMAC-SHA256 runs at about 1.8 GB/s even with
SHA CPU extensions, so MACing a step's ~852 KB batch costs ~0.5 ms per direction on each side:
a large share of a ~6 ms step, and more than the whole round trip costs without it. The
network is the job's own loopback or pod network; the handshake keeps strangers (other jobs,
scanners, a misconfigured process) out. Integrity and secrecy against an active attacker on
that network would need TLS, which is out of scope here.

The secret is never logged, and never appears in a repr, a str or an exception message.

The modules, each importing only those listed above it:

* :mod:`.codec`: the frame format's constants, :class:`Message`, :func:`encode_frame`,
  :func:`decode_frame` and the incremental parser both ends read with (no I/O).
* :mod:`.auth`: the job secret (:func:`new_secret`, :func:`secret_to_env`,
  :func:`secret_from_env`) and the handshake's constants.
* :mod:`.sockets`: gather-sends and socket options both ends share.
* :mod:`.client`: :func:`connect` and :class:`Connection`.
* :mod:`.server`: :class:`Server` and the :class:`PeerInfo` its handlers see.

Everything public is imported here: callers write ``from dlrover_kfp.training.wire import X``.

.. warning::
   Arrays returned by :meth:`Connection.recv` (and passed to a :class:`Server` handler) are
   **views into the connection's reusable receive buffer**. They are valid only until the next
   receive on that connection, which overwrites them in place. Pass ``copy=True`` (or
   ``Server(copy_arrays=True)``), or copy what you keep, whenever the data must outlive the
   next message.
"""

from __future__ import annotations

from dlrover_kfp.training.wire.auth import (
    SECRET_ENV_VAR,
    AuthenticationError,
    new_secret,
    secret_from_env,
    secret_to_env,
)
from dlrover_kfp.training.wire.client import (
    Connection,
    ConnectionClosedError,
    PeerUnavailableError,
    RemoteError,
    WireTimeoutError,
    connect,
)
from dlrover_kfp.training.wire.codec import (
    DEFAULT_MAX_MESSAGE_BYTES,
    HEADER,
    MAGIC,
    MAX_ARRAYS,
    MAX_KIND_BYTES,
    MAX_META_BYTES,
    MAX_NDIM,
    VERSION,
    Message,
    MessageError,
    ProtocolError,
    Reply,
    decode_frame,
    encode_frame,
)
from dlrover_kfp.training.wire.server import (
    PeerInfo,
    Server,
)

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "HEADER",
    "MAGIC",
    "MAX_ARRAYS",
    "MAX_KIND_BYTES",
    "MAX_META_BYTES",
    "MAX_NDIM",
    "SECRET_ENV_VAR",
    "VERSION",
    "AuthenticationError",
    "Connection",
    "ConnectionClosedError",
    "Message",
    "MessageError",
    "PeerInfo",
    "PeerUnavailableError",
    "ProtocolError",
    "RemoteError",
    "Reply",
    "Server",
    "WireTimeoutError",
    "connect",
    "decode_frame",
    "encode_frame",
    "new_secret",
    "secret_from_env",
    "secret_to_env",
]
