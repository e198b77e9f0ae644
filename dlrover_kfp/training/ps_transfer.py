"""The new PS's side of a live change of the PS set: its rows from the old PS, over the wire.

On Kubernetes every pod's ``/dev/shm`` is its own, so a new PS cannot restore from the snapshot
of the PS it replaces; it asks the old PS for its rows instead (:mod:`.transfer_protocol`), in
two passes:

1. :func:`copy_rows`, while the workers train on: ask each old PS holding rows of this one's
   partition to *track* (mark every row it updates from now on), then copy those rows chunk by
   chunk. A row updated during the copy may arrive stale or torn; it is marked.
2. :func:`finish_copy`, once the master has paused the workers and every push they sent is
   applied (the old PS are quiescent): fetch again only the marked rows, and the dense
   parameters. The workers wait only for this pass.

Why it is exact: every update that lands after a source's ``track`` returns marks its rows
after writing them (:meth:`.PsState.apply_sparse`), so a row is either copied after its last
update or marked; an update that started before ``track`` and finds no tracking had written its
rows before ``track`` installed it, hence before the copy read them. Pass 2 reads every marked
row after the last update; it equals the old PS's row bit for bit.

The rows new PS ``k`` of ``N`` takes from old PS ``j`` of ``M`` are
:func:`~dlrover_kfp.core.partition.overlap` of the two; a source with an empty overlap is not
contacted at all (moving one PS of an unchanged set talks to that one PS only).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from dlrover_kfp.core.applied import AppliedTally
from dlrover_kfp.core.partition import Overlap, Partition, overlap
from dlrover_kfp.errors import DlroverKfpError, PermanentError
from dlrover_kfp.training import memory
from dlrover_kfp.training import transfer_protocol as transfer
from dlrover_kfp.training.ps_state import PsConfig, PsState, startup_threads
from dlrover_kfp.training.wire import Connection, Message, RemoteError, connect

Address = tuple[str, int]

#: How long an old PS is retried before the transfer gives up: it is serving, so an address
#: that does not answer within this is gone (the master then abandons the change).
SOURCE_CONNECT_S = 10.0
#: Requests of one source in flight at once: the old PS selects the next chunk while this PS
#: copies the previous one in, and across hosts the round trip hides behind both. (Not
#: measurable in one test process, where both ends share one interpreter: 250-350 MiB/s at
#: depths 1 to 3 alike on 2 busy cores.)
PIPELINE_DEPTH = 2


class TransferError(PermanentError):
    """An old PS could not give its rows (gone, or not tracking this change): the new PS
    cannot be built from it, and the master abandons the change."""


@dataclass(frozen=True, slots=True)
class TransferStats:
    """What one pass moved: rows, bytes received (rows and dense) and seconds."""

    rows: int
    bytes: int
    seconds: float


@dataclass(slots=True)
class _Tally:
    rows: int = 0
    bytes: int = 0
    began: float = field(default_factory=time.perf_counter)

    def add(self, reply: Message, rows: int) -> None:
        self.rows += rows
        self.bytes += sum(a.nbytes for a in reply.arrays)

    def stats(self) -> TransferStats:
        return TransferStats(self.rows, self.bytes, time.perf_counter() - self.began)


def copy_rows(
    config: PsConfig,
    sources: Sequence[Address],
    from_num_ps: int,
    secret: bytes,
    generation: int,
    *,
    chunk_bytes: int = transfer.CHUNK_BYTES,
) -> tuple[PsState, TransferStats]:
    """Pass 1: a new PS's state copied from the old PS at ``sources`` (old PS index order),
    which go on training meanwhile; :func:`finish_copy` makes it exact."""
    _check_sources(sources, from_num_ps)
    tally = _Tally()
    state = _blank_state(config)
    for j, part in _overlaps(config, from_num_ps):
        with _source(sources, j, config.ps_index, secret) as conn:
            conn.request(transfer.TRACK, {"generation": generation})
            _fetch(conn, part, state, generation, dirty=False, chunk=chunk_bytes, tally=tally)
    if state.holds_dense:
        _fetch_dense(sources, state, secret, tally)
    return state, tally.stats()


def finish_copy(
    state: PsState,
    sources: Sequence[Address],
    from_num_ps: int,
    secret: bytes,
    generation: int,
    *,
    chunk_bytes: int = transfer.CHUNK_BYTES,
) -> TransferStats:
    """Pass 2, with the old PS quiescent: the rows they updated since :func:`copy_rows` began,
    and the dense parameters, into ``state``."""
    _check_sources(sources, from_num_ps)
    tally = _Tally()
    for j, part in _overlaps(state.config, from_num_ps):
        with _source(sources, j, state.config.ps_index, secret) as conn:
            _fetch(conn, part, state, generation, dirty=True, chunk=chunk_bytes, tally=tally)
    if state.holds_dense:
        _fetch_dense(sources, state, secret, tally)
    return tally.stats()


def _check_sources(sources: Sequence[Address], from_num_ps: int) -> None:
    if len(sources) != from_num_ps:
        raise TransferError(f"expected {from_num_ps} old PS addresses, got {len(sources)}")


def _blank_state(config: PsConfig) -> PsState:
    """A state of the right shape whose rows the copy writes: the weights not initialised
    (that would compute every row once for nothing), only mapped in, as :class:`PsState` maps
    its own accumulator."""
    shape = (config.partition.rows_on(config.ps_index), config.model.embedding_dim)
    threads = startup_threads(os.environ)

    def blank() -> torch.Tensor:
        return torch.from_numpy(
            memory.touched_empty(shape, np.float32, threads=threads, huge_pages=True)
        )

    return PsState(config, weights=blank())  # its accumulator: zeros, mapped in, as always


def _overlaps(config: PsConfig, from_num_ps: int) -> Iterator[tuple[int, Overlap]]:
    """The old PS holding rows of this one, with the rows each holds."""
    old = Partition(config.partition.total_rows, from_num_ps)
    for j in range(from_num_ps):
        part = overlap(old, j, config.partition, config.ps_index)
        if part.count:
            yield j, part


@contextlib.contextmanager
def _source(sources: Sequence[Address], j: int, new_ps: int, secret: bytes) -> Iterator[Connection]:
    """A connection to old PS ``j``, closed after use; every failure to reach it or of a
    request to it becomes a :class:`TransferError` that says which PS and where."""
    host, port = str(sources[j][0]), int(sources[j][1])
    what = f"PS {new_ps}: old PS {j} at {host}:{port}"
    try:
        conn = connect((host, port), secret, retry_for=SOURCE_CONNECT_S)
    except DlroverKfpError as exc:
        raise TransferError(f"{what} does not answer: {exc}") from exc
    try:
        yield conn
    except TransferError:
        raise
    except DlroverKfpError as exc:
        raise TransferError(f"{what}: {exc}") from exc
    finally:
        conn.close()


def _fetch(
    conn: Connection,
    part: Overlap,
    state: PsState,
    generation: int,
    *,
    dirty: bool,
    chunk: int,
    tally: _Tally,
) -> None:
    """Rows of ``part`` (all, or the marked ones) into ``state``, chunk by chunk.

    :data:`PIPELINE_DEPTH` requests are in flight: the old PS selects chunk ``i + 1`` while
    this one copies chunk ``i`` in (a connection answers in order). A reply's arrays are views
    into the connection's receive buffer, valid until the next receive: copied in before it.
    """
    step = max(
        1, min(chunk, transfer.MAX_TRANSFER_BYTES) // transfer.row_bytes(state.weights.shape[1])
    )
    meta = {
        "num_ps": part.new.num_ps,
        "index": part.new_ps,
        "generation": generation,
        "dirty": dirty,
    }
    starts = iter(range(0, part.count, step))
    in_flight = 0

    def send_next() -> int:
        start = next(starts, None)
        if start is None:
            return 0
        conn.send(transfer.ROWS, {**meta, "start": start, "count": step})
        return 1

    for _ in range(PIPELINE_DEPTH):
        in_flight += send_next()
    while in_flight:
        reply = _reply(conn, transfer.ROWS)
        in_flight += send_next() - 1
        new_slots, weights, accum = (torch.from_numpy(a) for a in reply.arrays)
        state.weights.index_copy_(0, new_slots, weights)
        state.accum.index_copy_(0, new_slots, accum)
        tally.add(reply, len(new_slots))


def _fetch_dense(sources: Sequence[Address], state: PsState, secret: bytes, tally: _Tally) -> None:
    """The dense parameters and their accumulator, from old PS 0 (which holds them)."""
    assert state.dense is not None and state.dense_accum is not None
    with _source(sources, 0, state.config.ps_index, secret) as conn:
        reply = conn.request(transfer.DENSE)
        dense, dense_accum = (torch.from_numpy(a) for a in reply.arrays)
        state.dense.copy_(dense)
        state.dense_accum.copy_(dense_accum)
        # The rows applied per shard go with the dense parameters (core/applied.py).
        state.applied = AppliedTally.from_dict(reply.meta.get("applied"))
        tally.add(reply, 0)


def _reply(conn: Connection, kind: str) -> Message:
    """The next reply, which must be ``kind`` (an error reply raises :class:`RemoteError`)."""
    reply = conn.recv()
    if reply.kind == "error":
        raise RemoteError(str(reply.meta.get("message", "request failed")))
    if reply.kind != kind:
        raise TransferError(f"expected a {kind!r} reply, got {reply.kind!r}")
    return reply
