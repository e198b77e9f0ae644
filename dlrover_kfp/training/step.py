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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch
from torch.nn import functional as F  # noqa: N812 (the usual alias)

from dlrover_kfp.core.partition import table_offsets
from dlrover_kfp.core.spec import ModelSpec
from dlrover_kfp.training.data import Batch
from dlrover_kfp.training.model import DenseDLRM, FlatParameters
from dlrover_kfp.training.ps_state import PsState


class ParameterServers(Protocol):
    """The PS of a job as one worker sees them."""

    @property
    def num_ps(self) -> int: ...

    def lookup(
        self, slots: Sequence[torch.Tensor], with_dense: bool
    ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """Rows ``[len(slots[k]), d]`` from every PS ``k``; the dense vector if asked."""
        ...

    def push(
        self,
        slots: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor],
        dense_grad: torch.Tensor | None,
    ) -> None:
        """Apply the gradient rows on every PS and the dense gradient on PS 0."""
        ...


class InProcessPs:
    """PS states held in this process: the reference path for tests and benchmarks."""

    def __init__(self, states: Sequence[PsState]) -> None:
        self.states = list(states)

    @property
    def num_ps(self) -> int:
        return len(self.states)

    def lookup(
        self, slots: Sequence[torch.Tensor], with_dense: bool
    ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        rows = [state.lookup(s) for state, s in zip(self.states, slots, strict=True)]
        dense = self.states[0].dense if with_dense else None
        return rows, (dense.clone() if dense is not None else None)

    def push(
        self,
        slots: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor],
        dense_grad: torch.Tensor | None,
    ) -> None:
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


class WorkerModel:
    """A worker's half of the model: the dense network and the routing of ids to PS."""

    def __init__(self, spec: ModelSpec, servers: ParameterServers, *, seed: int = 0) -> None:
        self.spec = spec
        self.servers = servers
        self.net = DenseDLRM(spec, seed=seed)
        self.flat = FlatParameters(self.net)
        self.offsets = torch.from_numpy(table_offsets(spec.table_sizes))

    def _embeddings(
        self, batch: Batch, *, with_dense: bool
    ) -> tuple[_Routing, torch.Tensor, torch.Tensor]:
        gids = torch.from_numpy(batch.sparse) + self.offsets
        unique, inverse = torch.unique(gids.view(-1), return_inverse=True)
        routing = _Routing(unique, self.servers.num_ps)
        rows, dense = self.servers.lookup(routing.slots, with_dense)
        if dense is not None:
            self.flat.load(dense)
        leaf = routing.gather(rows, self.spec.embedding_dim)
        return routing, leaf, inverse

    def train_step(self, batch: Batch) -> float:
        """One step on ``batch``; returns its mean log-loss before the update."""
        routing, leaf, inverse = self._embeddings(batch, with_dense=True)
        leaf.requires_grad_(True)
        n, tables = batch.sparse.shape
        emb = leaf.index_select(0, inverse).view(n, tables, self.spec.embedding_dim)
        logits = self.net(torch.from_numpy(batch.dense), emb)
        loss = F.binary_cross_entropy_with_logits(logits, torch.from_numpy(batch.labels))
        self.flat.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        assert leaf.grad is not None
        self.servers.push(routing.slots, routing.scatter(leaf.grad), self.flat.grad)
        return float(loss.detach())

    @torch.no_grad()
    def predict(self, batch: Batch, *, refresh_dense: bool = True) -> np.ndarray:
        """Click probabilities for ``batch`` with the PS's current parameters (no update)."""
        _, leaf, inverse = self._embeddings(batch, with_dense=refresh_dense)
        n, tables = batch.sparse.shape
        emb = leaf.index_select(0, inverse).view(n, tables, self.spec.embedding_dim)
        logits = self.net(torch.from_numpy(batch.dense), emb)
        return torch.sigmoid(logits).numpy()
