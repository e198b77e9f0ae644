"""A worker's connections to the parameter servers: one request per PS per step, each way.

Nothing waits for a push: it is sent, and its acknowledgement is read later, in order, while
the worker waits for the rows of a later lookup. A connection delivers in order, so every reply
is expected: per connection, a queue of the reply kinds still to come (``rows`` for a lookup,
``ok`` for a push) says what the next one must be.

A lookup sent with :meth:`RemotePs.request` sees every push sent before it on that connection,
and none sent after it. The pipelined worker (:meth:`.step.WorkerModel.train_pipelined`) sends
step ``n+1``'s lookup before step ``n``'s push: a staleness of one step, documented there. In
*synchronous* mode every push waits for its acknowledgement (used by the step-by-step
correctness test).

:attr:`RemotePs.pushes_sent` and :meth:`RemotePs.applied` let the worker report a data shard
done only once every push of it has been applied, without waiting for that.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np
import torch

from dlrover_kfp.training.step import PendingRows, PushTag, Rows
from dlrover_kfp.training.wire import Connection, Message, RemoteError

LOOKUP = "lookup"
PUSH = "push"
ROWS = "rows"
ACK = "ok"


class _Pending:
    """The lookup just sent; at most one is outstanding at a time."""

    def __init__(self, servers: RemotePs, with_dense: bool) -> None:
        self.servers = servers
        self.with_dense = with_dense
        self.done = False

    def wait(self) -> Rows:
        if self.done:
            raise RuntimeError("the rows of a lookup can be waited for once")
        self.done = True
        servers = self.servers
        servers.outstanding = None
        rows: list[torch.Tensor] = []
        dense: torch.Tensor | None = None
        for k in range(servers.num_ps):
            # The arrays are views into the connection's receive buffer, valid until its next
            # recv: that is when the next lookup is waited for, after this step's push.
            reply = servers.receive(k, until=ROWS)
            rows.append(torch.from_numpy(reply.arrays[0]))
            if k == 0 and self.with_dense:
                dense = torch.from_numpy(reply.arrays[1])
        return rows, dense


class RemotePs:
    """:class:`~dlrover_kfp.training.step.ParameterServers` over one connection per PS."""

    def __init__(self, connections: Sequence[Connection], *, synchronous: bool = False) -> None:
        if not connections:
            raise ValueError("a job needs at least one PS")
        self.connections = list(connections)
        self.synchronous = synchronous
        self._expected: list[deque[str]] = [deque() for _ in self.connections]
        self._acked = [0] * len(self.connections)
        self.pushes_sent = 0
        self.outstanding: _Pending | None = None

    @property
    def num_ps(self) -> int:
        return len(self.connections)

    def receive(self, k: int, *, until: str) -> Message:
        """Read PS ``k``'s replies in order up to and including the next ``until`` one."""
        expected = self._expected[k]
        while True:
            if not expected:
                raise RuntimeError(f"PS {k}: waiting for a {until!r} reply that was not asked for")
            kind = expected.popleft()
            reply = _expect(self.connections[k].recv(), kind, k)
            if kind == ACK:
                self._acked[k] += 1
            if kind == until:
                return reply

    def request(self, slots: Sequence[torch.Tensor], with_dense: bool) -> PendingRows:
        if self.outstanding is not None:
            raise RuntimeError("a lookup is already outstanding; wait for its rows first")
        for k, conn in enumerate(self.connections):
            conn.send(LOOKUP, {"dense": with_dense and k == 0}, (slots[k].numpy(),))
            self._expected[k].append(ROWS)
        self.outstanding = _Pending(self, with_dense)
        return self.outstanding

    def lookup(self, slots: Sequence[torch.Tensor], with_dense: bool) -> Rows:
        return self.request(slots, with_dense).wait()

    def push(
        self,
        slots: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor],
        dense_grad: torch.Tensor | None,
        tag: PushTag | None = None,
    ) -> None:
        for k, conn in enumerate(self.connections):
            arrays: tuple[np.ndarray, ...] = (slots[k].numpy(), grads[k].numpy())
            meta = None
            if k == 0:
                if dense_grad is not None:
                    arrays += (dense_grad.numpy(),)
                if tag is not None:
                    meta = {
                        "tag": [
                            tag.epoch,
                            tag.shard,
                            tag.offset,
                            tag.rows,
                            tag.shard_rows,
                            int(tag.last),
                        ]
                    }
            conn.send(PUSH, meta, arrays)
            self._expected[k].append(ACK)
        self.pushes_sent += 1
        if self.synchronous:
            self.flush()

    def applied(self, pushes: int) -> bool:
        """Whether the first ``pushes`` pushes are known to be applied on every PS."""
        return min(self._acked) >= pushes

    def flush(self) -> None:
        """Wait until every push sent so far is applied (no lookup may be outstanding)."""
        if self.outstanding is not None:
            raise RuntimeError("flush with a lookup outstanding would drop its rows")
        for k in range(self.num_ps):
            while self._expected[k]:
                self.receive(k, until=ACK)

    def close(self) -> None:
        for conn in self.connections:
            conn.close()


def _expect(reply: Message, kind: str, ps: int) -> Message:
    if reply.kind == "error":
        raise RemoteError(f"PS {ps}: {reply.meta.get('message', 'request failed')}")
    if reply.kind != kind:
        raise RuntimeError(f"PS {ps} answered {reply.kind!r}, expected {kind!r}")
    return reply
