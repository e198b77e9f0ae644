"""A worker's connections to the parameter servers: one request per PS per step, each way.

In *asynchronous* mode (the default, as in DLRover's PS jobs) a push is sent without waiting for
its acknowledgement: the worker goes on to cut the next batch while the PS applies the update,
and collects the acknowledgement before it reads the next lookup's reply. A connection delivers
in order, so a worker always reads rows that include its own previous update; other workers'
updates land whenever their pushes do. In *synchronous* mode every push waits for its
acknowledgement (used by the step-by-step correctness test).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from dlrover_kfp.training.wire import Connection, Message, RemoteError

LOOKUP = "lookup"
PUSH = "push"
ACK = "ok"


class RemotePs:
    """:class:`~dlrover_kfp.training.step.ParameterServers` over one connection per PS."""

    def __init__(self, connections: Sequence[Connection], *, synchronous: bool = False) -> None:
        if not connections:
            raise ValueError("a job needs at least one PS")
        self.connections = list(connections)
        self.synchronous = synchronous
        self._unacked = [0] * len(self.connections)

    @property
    def num_ps(self) -> int:
        return len(self.connections)

    def _drain(self, k: int) -> None:
        while self._unacked[k]:
            reply = self.connections[k].recv()
            self._unacked[k] -= 1
            _expect(reply, ACK, k)

    def lookup(
        self, slots: Sequence[torch.Tensor], with_dense: bool
    ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        for k, conn in enumerate(self.connections):
            conn.send(LOOKUP, {"dense": with_dense and k == 0}, (slots[k].numpy(),))
        rows: list[torch.Tensor] = []
        dense: torch.Tensor | None = None
        for k, conn in enumerate(self.connections):
            self._drain(k)
            # The arrays are views into the connection's receive buffer, valid until its next
            # recv: that is after this step's backward pass, when they are no longer needed.
            reply = _expect(conn.recv(), "rows", k)
            rows.append(torch.from_numpy(reply.arrays[0]))
            if k == 0 and with_dense:
                dense = torch.from_numpy(reply.arrays[1])
        return rows, dense

    def push(
        self,
        slots: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor],
        dense_grad: torch.Tensor | None,
    ) -> None:
        for k, conn in enumerate(self.connections):
            arrays: tuple[np.ndarray, ...] = (slots[k].numpy(), grads[k].numpy())
            if k == 0 and dense_grad is not None:
                arrays += (dense_grad.numpy(),)
            conn.send(PUSH, None, arrays)
            self._unacked[k] += 1
            if self.synchronous:
                self._drain(k)

    def flush(self) -> None:
        """Wait until every push sent so far is applied."""
        for k in range(len(self.connections)):
            self._drain(k)

    def close(self) -> None:
        for conn in self.connections:
            conn.close()


def _expect(reply: Message, kind: str, ps: int) -> Message:
    if reply.kind == "error":
        raise RemoteError(f"PS {ps}: {reply.meta.get('message', 'request failed')}")
    if reply.kind != kind:
        raise RuntimeError(f"PS {ps} answered {reply.kind!r}, expected {kind!r}")
    return reply
