"""What one parameter server holds and the arithmetic it does: lookups and Adagrad updates.

PS ``k`` of ``P`` holds the embedding rows striped to it (see :mod:`dlrover_kfp.core.partition`)
and, on PS 0 only, the dense MLP parameters as one flat vector. Both are trained with Adagrad
(Duchi et al., 2011), the usual optimiser for DLRM embeddings: per weight,

    a <- a + g²
    w <- w - lr · g / (sqrt(a) + eps)

which is exactly what ``torch.optim.Adagrad`` does (lr_decay 0, weight decay 0, initial
accumulator 0, eps 1e-10), so that an in-process reference trains to the same values. Adagrad
rather than SGD: its per-row step size suits the very uneven frequencies of categorical ids (a
head id is updated every step, a tail id rarely), and its accumulator is the optimiser state that
a checkpoint must carry. It costs one extra array of the size of the embeddings.

Updates arrive with unique slots (workers aggregate duplicate ids before pushing), so the
accumulator rows can be read, updated and written back with ``index_select``/``index_copy_``.
The weight update uses ``index_add_`` *without* ``alpha``: with ``alpha`` PyTorch leaves its fast
CPU path and the update is several times slower; the step is folded into the values instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from dlrover_kfp.core.partition import Partition
from dlrover_kfp.core.spec import ModelSpec
from dlrover_kfp.training.model import DenseDLRM, FlatParameters, init_embedding_rows

ADAGRAD_EPS = 1e-10


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


class PsState:
    """One PS's tensors. Not thread-safe: a PS serves its requests one at a time."""

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
        if weights is None:
            gids = config.partition.gids_of(config.ps_index)
            weights = torch.from_numpy(init_embedding_rows(gids, config.model, config.seed))
        self.weights = weights
        self.accum = accum if accum is not None else torch.zeros_like(weights)
        expected = (config.partition.rows_on(config.ps_index), dim)
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
            self.dense_accum = dense_accum if dense_accum is not None else torch.zeros_like(dense)
        self.updates = 0

    @property
    def holds_dense(self) -> bool:
        return self.dense is not None

    def lookup(self, slots: torch.Tensor) -> torch.Tensor:
        """Rows at ``slots`` (``[k]`` int64) as a new ``[k, d]`` tensor."""
        return self.weights.index_select(0, slots)

    def apply_sparse(self, slots: torch.Tensor, grads: torch.Tensor) -> None:
        """Adagrad on the rows at unique ``slots`` with summed gradients ``grads`` ``[k, d]``."""
        acc = self.accum.index_select(0, slots)
        acc.addcmul_(grads, grads)
        self.accum.index_copy_(0, slots, acc)
        step = acc.sqrt_().add_(ADAGRAD_EPS)  # sqrt(a) + eps, in place of acc
        step = torch.div(grads, step, out=step).mul_(-self.lr)
        self.weights.index_add_(0, slots, step)
        self.updates += 1

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
