"""The plain in-process PyTorch trainer: stock modules and the stock optimiser.

It trains :class:`~dlrover_kfp.training.model.FullDLRM` (``nn.EmbeddingBag(sparse=True)`` per
table) with ``torch.optim.Adagrad``. It is the yardstick twice over: the correctness tests check
that the parameter-server job computes the same values step by step, and the throughput
benchmark compares the job's samples/s with this loop's on the same batches.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F  # noqa: N812 (the usual alias)

from dlrover_kfp.core.spec import ModelSpec
from dlrover_kfp.training.data import Batch
from dlrover_kfp.training.model import FullDLRM
from dlrover_kfp.training.ps_state import ADAGRAD_EPS, DENSE_INITIAL_ACCUMULATOR


class ReferenceTrainer:
    def __init__(self, spec: ModelSpec, learning_rate: float, *, seed: int = 0) -> None:
        self.model = FullDLRM(spec, seed=seed)
        self.optimizer = torch.optim.Adagrad(
            self.model.parameters(), lr=learning_rate, eps=ADAGRAD_EPS
        )
        # The dense MLPs start from a non-zero accumulator, the tables from zero, as on the PS
        # (see ps_state's docstring). Set on the state: torch's Adagrad initialises every
        # group's accumulator from the constructor's value, not from a group's own.
        for p in self.model.dense.parameters():
            self.optimizer.state[p]["sum"].fill_(DENSE_INITIAL_ACCUMULATOR)

    def train_step(self, batch: Batch) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        logits = self.model(torch.from_numpy(batch.dense), torch.from_numpy(batch.sparse))
        loss = F.binary_cross_entropy_with_logits(logits, torch.from_numpy(batch.labels))
        loss.backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()
        return float(loss.detach())

    @torch.no_grad()
    def predict(self, batch: Batch) -> torch.Tensor:
        logits = self.model(torch.from_numpy(batch.dense), torch.from_numpy(batch.sparse))
        return torch.sigmoid(logits)
