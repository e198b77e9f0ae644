"""The DLRM network: the dense part workers compute and the embedding initialisation PS use.

DLRM (Naumov et al., 2019) for one example with dense features x and categorical ids c_1..c_T:

    z_0 = bottom_mlp(x)                          (last layer size = embedding dim d)
    z_t = E_t[c_t]                               (one embedding bag per table; one id per bag)
    inter = { <z_i, z_j> : 0 <= j < i <= T }     pairwise dot products, T(T+1)/2 of them
    p = sigmoid(top_mlp([z_0, inter]))

The embedding tables E_t live on the parameter servers; :class:`DenseDLRM` is everything else,
taking the looked-up rows as an input tensor. :class:`FlatParameters` lays the dense parameters
and their gradients out as one contiguous vector each, so that pulling the MLPs from PS 0 and
pushing their gradient back is one array each way.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import cast

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from dlrover_kfp.core.partition import table_offsets
from dlrover_kfp.core.spec import ModelSpec

#: Rows initialised per chunk, so that initialising a large table needs little scratch memory.
_INIT_CHUNK_ROWS = 1 << 20


def _mlp(sizes: Sequence[int], *, last_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(sizes) - 2 or last_activation:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DenseDLRM(nn.Module):
    """Bottom MLP, dot-product interaction and top MLP; embeddings come in as a tensor."""

    _tri_rows: torch.Tensor
    _tri_cols: torch.Tensor

    def __init__(self, spec: ModelSpec, *, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.num_tables = len(spec.table_sizes)
        self.bottom = _mlp([spec.dense_features, *spec.bottom_mlp], last_activation=True)
        features = self.num_tables + 1
        n_inter = features * (features - 1) // 2
        self.top = _mlp([spec.embedding_dim + n_inter, *spec.top_mlp], last_activation=False)
        rows, cols = torch.tril_indices(features, features, offset=-1)
        self.register_buffer("_tri_rows", rows, persistent=False)
        self.register_buffer("_tri_cols", cols, persistent=False)

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """Logits ``[B]`` from dense features ``[B, D]`` and embedding rows ``[B, T, d]``."""
        z0 = self.bottom(dense)
        z = torch.cat([z0.unsqueeze(1), emb], dim=1)  # [B, T+1, d]
        gram = torch.bmm(z, z.transpose(1, 2))  # [B, T+1, T+1]
        inter = gram[:, self._tri_rows, self._tri_cols]  # strictly lower triangle
        logits: torch.Tensor = self.top(torch.cat([z0, inter], dim=1))
        return logits.squeeze(1)


class FlatParameters:
    """The module's parameters and gradients as views into two contiguous float32 vectors.

    Autograd accumulates into an existing ``.grad`` in place, so after ``zero_grad()`` and a
    backward pass :attr:`grad` holds the whole gradient without a copy, ready to send.
    """

    def __init__(self, module: nn.Module) -> None:
        params = list(module.parameters())
        total = sum(p.numel() for p in params)
        self.values = torch.empty(total, dtype=torch.float32)
        self.grad = torch.zeros(total, dtype=torch.float32)
        offset = 0
        for p in params:
            n = p.numel()
            self.values[offset : offset + n].copy_(p.data.reshape(-1))
            p.data = self.values[offset : offset + n].view_as(p)
            p.grad = self.grad[offset : offset + n].view_as(p)
            offset += n

    def __len__(self) -> int:
        return int(self.values.numel())

    def zero_grad(self) -> None:
        self.grad.zero_()

    def load(self, values: npt.NDArray[np.float32] | torch.Tensor) -> None:
        src = torch.from_numpy(values) if isinstance(values, np.ndarray) else values
        self.values.copy_(src)


def _splitmix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """SplitMix64 finaliser: a counter-based generator, so every value depends on its index only."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def init_embedding_rows(
    gids: npt.NDArray[np.int64], spec: ModelSpec, seed: int
) -> npt.NDArray[np.float32]:
    """Initial values of the rows with global ids ``gids``: ``[len(gids), d]`` float32.

    Row ``g`` of table ``t`` (``n_t`` rows) starts uniform in ±sqrt(1/n_t), as DLRM does. The
    value of element ``(g, j)`` is a hash of ``(seed, g·d + j)``, so it is the same whichever
    PS holds the row and however many PS there are: a job restarted on a different number of
    PS, or compared with an in-process reference, starts from the same model.
    """
    dim = spec.embedding_dim
    offsets = table_offsets(spec.table_sizes)
    sizes = np.asarray(spec.table_sizes, dtype=np.float64)
    out = np.empty((len(gids), dim), dtype=np.float32)
    key = _splitmix64(np.array([seed], dtype=np.uint64))[0]
    cols = np.arange(dim, dtype=np.uint64)
    for start in range(0, len(gids), _INIT_CHUNK_ROWS):
        chunk = gids[start : start + _INIT_CHUNK_ROWS]
        table = np.searchsorted(offsets, chunk, side="right") - 1
        bound = np.sqrt(1.0 / sizes[table]).astype(np.float32)
        counters = chunk.astype(np.uint64)[:, None] * np.uint64(dim) + cols[None, :]
        bits = _splitmix64(counters ^ key) >> np.uint64(40)  # 24 random bits
        unit = bits.astype(np.float32) * np.float32(1.0 / (1 << 24))  # [0, 1)
        out[start : start + len(chunk)] = (unit * 2.0 - 1.0) * bound[:, None]
    return out


def dense_parameter_count(spec: ModelSpec) -> int:
    return len(FlatParameters(DenseDLRM(spec)))


class FullDLRM(nn.Module):
    """The whole model in one process: the trained model a job exports, and the reference.

    ``sparse=True`` embedding bags with ``mode="sum"`` and one id per bag are exactly the
    lookup the PS serve; the reference trainer pairs them with ``torch.optim.Adagrad``.
    """

    def __init__(
        self,
        spec: ModelSpec,
        *,
        seed: int = 0,
        init_seed: int | None = None,
        initialise: bool = True,
    ) -> None:
        """``initialise=False`` leaves the tables uninitialised, for a model about to be loaded
        from a checkpoint (initialising a billion values only to overwrite them takes minutes).
        """
        super().__init__()
        self.dense = DenseDLRM(spec, seed=seed)
        self.offsets = table_offsets(spec.table_sizes)
        tables = []
        for t, n in enumerate(spec.table_sizes):
            if initialise:
                gids = np.arange(n, dtype=np.int64) + self.offsets[t]
                rows = init_embedding_rows(gids, spec, seed if init_seed is None else init_seed)
                weight = torch.from_numpy(rows)
            else:
                weight = torch.empty(n, spec.embedding_dim)
            # ``_weight`` hands the table its values; without it the constructor would first
            # fill it with N(0, 1) draws that are thrown away.
            tables.append(
                nn.EmbeddingBag(n, spec.embedding_dim, mode="sum", sparse=True, _weight=weight)
            )
        self.tables = nn.ModuleList(tables)

    def embedding_bags(self) -> list[nn.EmbeddingBag]:
        return [cast(nn.EmbeddingBag, table) for table in self.tables]

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        """Logits from dense features ``[B, D]`` and per-table ids ``[B, T]``."""
        emb = torch.stack(
            [table(sparse[:, t : t + 1]) for t, table in enumerate(self.tables)], dim=1
        )
        out: torch.Tensor = self.dense(dense, emb)
        return out


def load_flat(module: nn.Module, values: torch.Tensor) -> None:
    """Copy a flat vector (in :class:`FlatParameters` order) into ``module``'s parameters.

    The size is checked first, so a vector of the wrong size changes nothing.
    """
    params = list(module.parameters())
    total = sum(p.numel() for p in params)
    if values.numel() != total:
        raise ValueError(f"flat vector of {values.numel()} values for {total} parameters")
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.copy_(values[offset : offset + n].view_as(p))
            offset += n
