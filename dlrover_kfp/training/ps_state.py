"""What one parameter server holds and the arithmetic it does: lookups and Adagrad updates.

PS ``k`` of ``P`` holds the embedding rows striped to it (see :mod:`dlrover_kfp.core.partition`)
and, on PS 0 only, the dense MLP parameters as one flat vector. Both are trained with Adagrad
(Duchi et al., 2011), the usual optimiser for DLRM embeddings: per weight,

    a <- a + g²
    w <- w - lr · g / (sqrt(a) + eps)

which is exactly what ``torch.optim.Adagrad`` does (lr_decay 0, weight decay 0, eps 1e-10; the
initial accumulator is 0 for the embeddings and :data:`DENSE_INITIAL_ACCUMULATOR` for the dense
parameters, as the reference's two parameter groups set it), so that an in-process reference
trains to the same values. Adagrad
rather than SGD: its per-row step size suits the very uneven frequencies of categorical ids (a
head id is updated every step, a tail id rarely), and its accumulator is the optimiser state that
a checkpoint must carry. It costs one extra array of the size of the embeddings.

Why the dense parameters start at a non-zero accumulator: from ``a = 0`` Adagrad's first step
moves every weight by ``lr · g/|g| = lr`` whatever the gradient's size, and asynchronous workers
each take such a step computed on the same stale values, so the steps of the first updates add
up. At lr 0.05 that pushes the pre-activations of whole ReLU units below zero for every input:
with 2 workers 9 of 40 runs of the ctr-local model ended "stalled" (AUC 0.61-0.73 against
0.814 for one worker), 10 of 20 with 4 and 10 of 10 with 7, with 10 to 16 of the 16 units at
the bottom MLP's output dead (benchmarks/async_quality.py; docs/training.md has the figures).
Starting at ``a_0 = 0.01`` bounds the first step by ``lr · |g|/sqrt(0.01 + g²)``, about
``10 · lr · |g|`` for the small gradients of the first updates, and leaves later steps, once
``sum(g²)`` dominates, as they were. Measured the same way: 0 of 40 two-worker runs stalled
(median 0.812 against 0.8135 for one worker, which lost 0.001); 6 of 20 four-worker and 10 of
10 seven-worker runs still end short (docs/training.md, "Known problems"). The embeddings keep
``a_0 = 0``: a tail id is updated a few times in a run and must move on its first update
(0.01 everywhere, or 0.1 as TensorFlow's default, trained them so little that two-worker runs
ended at AUC 0.70-0.71).

Updates arrive with unique slots (workers aggregate duplicate ids before pushing), so the
accumulator rows can be read, updated and written back with ``index_select``/``index_copy_``.
The weight update uses ``index_add_`` *without* ``alpha``: with ``alpha`` PyTorch leaves its fast
CPU path and the update is several times slower; the step is folded into the values instead.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from dlrover_kfp.core.applied import AppliedTally
from dlrover_kfp.core.partition import Partition
from dlrover_kfp.core.spec import ModelSpec
from dlrover_kfp.training import memory
from dlrover_kfp.training.cpu_limit import env_cpu
from dlrover_kfp.training.model import DenseDLRM, FlatParameters, init_embedding_slots

ADAGRAD_EPS = 1e-10
#: Adagrad's initial accumulator for the dense parameters (the embeddings start at 0); see the
#: module docstring for why and what it was measured against.
DENSE_INITIAL_ACCUMULATOR = 0.01
#: Most threads a PS uses to build its state, whatever CPU its pod has.
MAX_STARTUP_THREADS = 4
#: Serialises PsState.track (rare: once per old PS per new PS of a change); module-wide, so
#: that a state stays a plain object that copy.deepcopy can copy.
_TRACK_LOCK = threading.Lock()


def startup_threads(env: Mapping[str, str]) -> int:
    """Threads for building a PS's state: the pod's CPU (``DLROVER_KFP_POD_CPU``, rounded up,
    at most :data:`MAX_STARTUP_THREADS`); 1 when unset or not a positive number.

    A PS serves nothing until its state is built, so at start it may use its whole CPU share;
    more threads than that would only be throttled by the pod's CPU quota.
    """
    return max(1, min(MAX_STARTUP_THREADS, math.ceil(env_cpu(env))))


@dataclass(frozen=True, slots=True)
class PsConfig:
    """What a PS needs to build its state: which rows are its own, and how to train them."""

    model: ModelSpec
    num_ps: int
    ps_index: int
    learning_rate: float
    seed: int = 0

    @property
    def partition(self) -> Partition:
        return Partition(sum(self.model.table_sizes), self.num_ps)


@dataclass(frozen=True, slots=True)
class _Tracking:
    """Which rows were updated since a PS change to ``generation`` began copying them."""

    generation: int
    #: per slot: updated since
    marked: torch.Tensor


class PsState:
    """One PS's tensors. Not locked: a PS's connection threads call it concurrently, Hogwild
    style (see :mod:`dlrover_kfp.training.ps_server`)."""

    def __init__(
        self,
        config: PsConfig,
        *,
        weights: torch.Tensor | None = None,
        accum: torch.Tensor | None = None,
        dense: torch.Tensor | None = None,
        dense_accum: torch.Tensor | None = None,
    ) -> None:
        self.config = config
        self.lr = config.learning_rate
        dim = config.model.embedding_dim
        rows = config.partition.rows_on(config.ps_index)
        threads = startup_threads(os.environ)
        if weights is None:
            # Computed straight into memory that each piece maps in just before it is written
            # (see init_embedding_slots): one pass over the pages, faulted in cheaply. Huge
            # pages: random-row lookups and updates are ~20% faster on them (memory.anonymous).
            weights = torch.from_numpy(
                init_embedding_slots(
                    config.model,
                    config.seed,
                    num_ps=config.num_ps,
                    ps_index=config.ps_index,
                    out=memory.anonymous((rows, dim), np.float32, huge_pages=True),
                    threads=threads,
                    populate=True,
                )
            )
        self.weights = weights
        if accum is None:
            # Zeros, mapped in now rather than by the first pushes: a page faulted in during
            # training costs a push several microseconds per new page for a long while.
            accum = torch.from_numpy(
                memory.touched_empty(
                    tuple(weights.shape), np.float32, threads=threads, huge_pages=True
                )
            )
        self.accum = accum
        expected = (rows, dim)
        if tuple(self.weights.shape) != expected or self.accum.shape != self.weights.shape:
            raise ValueError(
                f"PS {config.ps_index}: state shape {tuple(self.weights.shape)} does not match "
                f"the partition {expected}"
            )
        self.dense: torch.Tensor | None = None
        self.dense_accum: torch.Tensor | None = None
        if config.ps_index == 0:
            if dense is None:
                dense = FlatParameters(DenseDLRM(config.model, seed=config.seed)).values
            self.dense = dense
            self.dense_accum = (
                dense_accum
                if dense_accum is not None
                else torch.full_like(dense, DENSE_INITIAL_ACCUMULATOR)
            )
        self.updates = 0
        self._tracking: _Tracking | None = None
        #: PS 0: rows applied per shard pass (pushes tag their shard), kept with the state it
        #: describes: checkpointed, restored and moved with it (see core/applied.py)
        self.applied = AppliedTally()

    @property
    def holds_dense(self) -> bool:
        return self.dense is not None

    def lookup(self, slots: torch.Tensor) -> torch.Tensor:
        """Rows at ``slots`` (``[k]`` int64) as a new ``[k, d]`` tensor."""
        return self.weights.index_select(0, slots)

    def apply_sparse(self, slots: torch.Tensor, grads: torch.Tensor) -> None:
        """Adagrad on the rows at unique ``slots`` with summed gradients ``grads`` ``[k, d]``."""
        # a <- a + g², added in place (not read, updated and written back) so that two pushes
        # that meet on a row race only element by element (see ps_server's Hogwild note).
        self.accum.index_add_(0, slots, grads * grads)
        acc = self.accum.index_select(0, slots)
        step = acc.sqrt_().add_(ADAGRAD_EPS)  # sqrt(a) + eps, in place of acc
        step = torch.div(grads, step, out=step).mul_(-self.lr)
        self.weights.index_add_(0, slots, step)
        # Marked after the writes, never before: a push that finds no tracking here wrote its
        # rows before track() installed it, so a copy that starts after track() returns reads
        # them; one that finds it marks them, and the transfer sends them again (ps_transfer).
        # Cost (1 thread, d = 16, 1M rows, 2 shared cores): index_fill_ 7.5 µs per 1,000 slots
        # (bool __setitem__ 11 µs) against 140-240 µs for the push itself, 34 µs per 10,000
        # against 1.3-2.1 ms: 3-5% of a push, and only while a PS change copies.
        tracking = self._tracking
        if tracking is not None:
            tracking.marked.index_fill_(0, slots, True)
        self.updates += 1

    @property
    def tracking(self) -> int | None:
        """The generation whose updated rows are being marked, if any."""
        tracking = self._tracking
        return None if tracking is None else tracking.generation

    def track(self, generation: int) -> None:
        """Mark every row updated from now on, for the PS change to ``generation``.

        Tracking the same generation again keeps its marks: every new PS holding rows of this
        one asks, at its own time, and a later ask must not erase what an earlier one's copy
        relies on (hence the lock: two first asks at once must not install two masks, one
        replacing the other after pushes marked it). Another generation starts afresh (its
        switch replaced an abandoned one). One byte per slot: 1/(4·d) of the weights' memory
        (1.6% at d = 16)."""
        with _TRACK_LOCK:
            if self.tracking == generation:
                return
            marked = torch.zeros(self.weights.shape[0], dtype=torch.bool)
            self._tracking = _Tracking(generation, marked)  # one reference, swapped whole

    def untrack(self) -> None:
        self._tracking = None

    def check_tracking(self, generation: int) -> None:
        """Raise unless updates are being marked for ``generation``: a copy without the marks,
        or for a switch that another one replaced, would miss the rows updated while it ran."""
        self._tracked(generation)

    def marked(self, slots: torch.Tensor, generation: int) -> torch.Tensor:
        """Per slot of ``slots``: whether it was updated since ``track(generation)`` (bool)."""
        return self._tracked(generation).marked.index_select(0, slots)

    def _tracked(self, generation: int) -> _Tracking:
        tracking = self._tracking
        if tracking is None or tracking.generation != generation:
            raise ValueError(
                f"PS {self.config.ps_index} is not tracking updates for generation {generation} "
                f"(tracking: {None if tracking is None else tracking.generation})"
            )
        return tracking

    def apply_dense(self, grad: torch.Tensor) -> None:
        """Adagrad on the flat dense parameters (PS 0 only)."""
        if self.dense is None or self.dense_accum is None:
            raise ValueError(f"PS {self.config.ps_index} does not hold the dense parameters")
        self.dense_accum.addcmul_(grad, grad)
        std = self.dense_accum.sqrt().add_(ADAGRAD_EPS)
        self.dense.addcdiv_(grad, std, value=-self.lr)

    def arrays(self) -> dict[str, torch.Tensor]:
        """The state a checkpoint must keep, by name."""
        out = {"weights": self.weights, "accum": self.accum}
        if self.dense is not None and self.dense_accum is not None:
            out["dense"] = self.dense
            out["dense_accum"] = self.dense_accum
        return out

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.arrays().values())


def as_tensor(array: npt.NDArray[np.generic]) -> torch.Tensor:
    """A tensor over a numpy array's memory (no copy)."""
    return torch.from_numpy(np.ascontiguousarray(array))
