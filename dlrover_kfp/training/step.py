"""One worker's training step, written once against a small port to the parameter servers.

The same :class:`WorkerModel` trains against PS in other processes (:mod:`.ps_client`) and
against PS states in this process (:class:`InProcessPs`, for tests and for the side-by-side
benchmark), so the arithmetic under test is the arithmetic that runs.

A step, for a batch of ``B`` rows and ``T`` tables on ``P`` servers:

1. global ids ``[B, T]`` -> ``U`` unique ids and the inverse map (one ``torch.unique``);
2. per PS ``k``: the slots of the unique ids it owns -> one lookup request per PS, which also
   fetches the dense parameters from PS 0;
3. forward and backward through the dense network. The looked-up rows form one leaf tensor
   ``[U, d]`` that is gathered into ``[B, T, d]``; autograd's backward of that gather sums the
   gradients of repeated ids, so the leaf's gradient is already the per-unique-id gradient;
4. one push per PS with its slots and gradient rows, plus the dense gradient to PS 0.

**Pipelining.** :meth:`WorkerModel.train_pipelined` sends step ``n+1``'s lookups as soon as step
``n``'s rows have arrived, before step ``n``'s forward pass, so that the PS serve them while the
worker computes; the worker then never waits for the PS to apply its own last push (it used to
wait 9-16% of every step for that). The price is a bounded staleness of one step: the rows and
dense parameters of step ``n+1`` include the worker's own updates up to step ``n-1``, not
step ``n`` (the PS serve lookup ``n+1`` before push ``n``: a connection delivers in order and
the lookup was sent first). Other workers' updates land whenever their pushes do, as before.
:meth:`WorkerModel.train_step` keeps the strict order (lookup after the previous push was
applied) for the synchronous mode, which stays bit-exact against an in-process reference.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
import torch
from torch.nn import functional as F  # noqa: N812 (the usual alias)

from dlrover_kfp.core.partition import table_offsets
from dlrover_kfp.core.spec import ModelSpec
from dlrover_kfp.training.data import Batch
from dlrover_kfp.training.model import DenseDLRM, FlatParameters
from dlrover_kfp.training.ps_state import PsState

Rows = tuple[list[torch.Tensor], torch.Tensor | None]
Tag = TypeVar("Tag")
_END: Any = object()  # the end of an iterator, told apart from a None item


class PendingRows(Protocol):
    """A lookup sent and not yet answered."""

    def wait(self) -> Rows:
        """Rows ``[len(slots[k]), d]`` from every PS ``k``, and the dense vector if asked. The
        tensors may be views valid only until the next lookup is waited for."""
        ...


@dataclass(frozen=True, slots=True)
class PushTag:
    """Which shard a push's batch belongs to: PS 0 counts the rows it applied per shard, so a
    run can tell how many samples' gradients it applied more than once (a shard trained
    again after a worker stopped part-way through it)."""

    epoch: int
    shard: int
    #: where this batch's rows start in the shard as read (bad rows skipped), and how many
    offset: int
    rows: int
    shard_rows: int
    #: the shard's last batch (a pass sends them in order)
    last: bool


class ParameterServers(Protocol):
    """The PS of a job as one worker sees them."""

    @property
    def num_ps(self) -> int: ...

    def request(self, slots: Sequence[torch.Tensor], with_dense: bool) -> PendingRows:
        """Send a lookup now; its rows reflect every push sent before it."""
        ...

    def lookup(self, slots: Sequence[torch.Tensor], with_dense: bool) -> Rows:
        """``request(...).wait()``."""
        ...

    def push(
        self,
        slots: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor],
        dense_grad: torch.Tensor | None,
        tag: PushTag | None = None,
    ) -> None:
        """Apply the gradient rows on every PS and the dense gradient on PS 0; ``tag`` goes
        with PS 0's part."""
        ...


@dataclass(frozen=True, slots=True)
class _Answered:
    rows: Rows

    def wait(self) -> Rows:
        return self.rows


class InProcessPs:
    """PS states held in this process: the reference path for tests and benchmarks.

    A lookup is answered when it is requested, so a pipelined worker sees exactly what it sees
    from one remote PS (which serves a lookup before the push sent after it)."""

    def __init__(self, states: Sequence[PsState]) -> None:
        self.states = list(states)

    @property
    def num_ps(self) -> int:
        return len(self.states)

    def request(self, slots: Sequence[torch.Tensor], with_dense: bool) -> PendingRows:
        rows = [state.lookup(s) for state, s in zip(self.states, slots, strict=True)]
        dense = self.states[0].dense if with_dense else None
        return _Answered((rows, dense.clone() if dense is not None else None))

    def lookup(self, slots: Sequence[torch.Tensor], with_dense: bool) -> Rows:
        return self.request(slots, with_dense).wait()

    def push(
        self,
        slots: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor],
        dense_grad: torch.Tensor | None,
        tag: PushTag | None = None,
    ) -> None:
        """As the remote PS apply it; ``tag`` is not counted here (no server)."""
        for state, s, g in zip(self.states, slots, grads, strict=True):
            if len(s):
                state.apply_sparse(s, g)
        if dense_grad is not None:
            self.states[0].apply_dense(dense_grad)


class _Routing:
    """Where each unique id of a batch lives: per PS, its slots and its positions in the batch."""

    def __init__(self, unique: torch.Tensor, num_ps: int) -> None:
        self.size = int(unique.numel())
        if num_ps == 1:
            self.positions: list[torch.Tensor] | None = None
            self.slots = [unique]
            return
        owner = unique % num_ps
        self.positions = [torch.nonzero(owner == k).squeeze(1) for k in range(num_ps)]
        self.slots = [unique.index_select(0, pos) // num_ps for pos in self.positions]

    def gather(self, rows: list[torch.Tensor], dim: int) -> torch.Tensor:
        if self.positions is None:
            return rows[0]
        out = torch.empty(self.size, dim)
        for pos, r in zip(self.positions, rows, strict=True):
            out.index_copy_(0, pos, r)
        return out

    def scatter(self, grad: torch.Tensor) -> list[torch.Tensor]:
        if self.positions is None:
            return [grad]
        return [grad.index_select(0, pos) for pos in self.positions]


@dataclass(frozen=True, slots=True)
class Routed:
    """A batch with its ids deduplicated and routed to the PS: the step's work that needs no
    parameters, so a worker's prefetch thread can do it while the main thread trains."""

    batch: Batch
    routing: _Routing
    inverse: torch.Tensor
    tag: PushTag | None = None


def route(batch: Batch, offsets: torch.Tensor, num_ps: int, tag: PushTag | None = None) -> Routed:
    """Global ids ``[B, T]`` -> unique ids per PS and the inverse map (one ``torch.unique``)."""
    gids = torch.from_numpy(batch.sparse) + offsets
    unique, inverse = torch.unique(gids.view(-1), return_inverse=True)
    return Routed(batch, _Routing(unique, num_ps), inverse, tag)


@dataclass(frozen=True, slots=True)
class _Step:
    batch: Batch
    routing: _Routing
    inverse: torch.Tensor
    pending: PendingRows
    tag: PushTag | None


class WorkerModel:
    """A worker's half of the model: the dense network and the routing of ids to PS."""

    def __init__(self, spec: ModelSpec, servers: ParameterServers, *, seed: int = 0) -> None:
        self.spec = spec
        self.servers = servers
        self.net = DenseDLRM(spec, seed=seed)
        self.flat = FlatParameters(self.net)
        self.offsets = torch.from_numpy(table_offsets(spec.table_sizes))

    def route(self, batch: Batch, tag: PushTag | None = None) -> Routed:
        """:func:`route` for this model and its PS (thread-safe: it touches no parameters)."""
        return route(batch, self.offsets, self.servers.num_ps, tag)

    def _begin(self, item: Batch | Routed, *, with_dense: bool) -> _Step:
        """Route the batch's ids (unless done already) and send its lookups."""
        r = item if isinstance(item, Routed) else self.route(item)
        pending = self.servers.request(r.routing.slots, with_dense)
        return _Step(r.batch, r.routing, r.inverse, pending, r.tag)

    def _leaf(self, step: _Step, rows: Rows) -> torch.Tensor:
        found, dense = rows
        if dense is not None:
            self.flat.load(dense)
        return step.routing.gather(found, self.spec.embedding_dim)

    def _compute(self, step: _Step, rows: Rows) -> float:
        """Forward, backward and push of one step whose rows have arrived."""
        batch, routing = step.batch, step.routing
        leaf = self._leaf(step, rows)
        leaf.requires_grad_(True)
        n, tables = batch.sparse.shape
        emb = leaf.index_select(0, step.inverse).view(n, tables, self.spec.embedding_dim)
        logits = self.net(torch.from_numpy(batch.dense), emb)
        loss = F.binary_cross_entropy_with_logits(logits, torch.from_numpy(batch.labels))
        self.flat.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        assert leaf.grad is not None
        self.servers.push(routing.slots, routing.scatter(leaf.grad), self.flat.grad, step.tag)
        return float(loss.detach())

    def train_step(self, batch: Batch | Routed) -> float:
        """One step on ``batch``, its lookup sent only now (after every earlier push); returns
        its mean log-loss before the update."""
        step = self._begin(batch, with_dense=True)
        return self._compute(step, step.pending.wait())

    def train_pipelined(
        self, items: Iterable[tuple[Batch | Routed, Tag] | None]
    ) -> Iterator[tuple[Tag, float]]:
        """Train on every batch with the next batch's lookup in flight (see the module
        docstring); yields each batch's tag and mean log-loss, after its push was sent.

        ``None`` in ``items`` means that no batch is ready yet: the step in flight is completed
        without a lookahead, so that the caller can wait for the PS to apply it (and report
        its data) before the iterator blocks for more.
        """
        it = iter(items)
        while True:
            item = next(it, _END)
            if item is _END:
                return
            if item is None:
                continue
            step = self._begin(item[0], with_dense=True)
            while True:
                rows = step.pending.wait()
                following = next(it, _END)
                # Sent before this step's push: the PS serve it while this step computes.
                upcoming = None
                if following is not None and following is not _END:
                    upcoming = self._begin(following[0], with_dense=True)
                loss = self._compute(step, rows)
                yield item[1], loss
                if following is _END:
                    return
                if upcoming is None or following is None:
                    break
                step, item = upcoming, following

    @torch.no_grad()
    def predict(self, batch: Batch, *, refresh_dense: bool = True) -> np.ndarray:
        """Click probabilities for ``batch`` with the PS's current parameters (no update)."""
        step = self._begin(batch, with_dense=refresh_dense)
        leaf = self._leaf(step, step.pending.wait())
        n, tables = batch.sparse.shape
        emb = leaf.index_select(0, step.inverse).view(n, tables, self.spec.embedding_dim)
        logits = self.net(torch.from_numpy(batch.dense), emb)
        return torch.sigmoid(logits).numpy()
