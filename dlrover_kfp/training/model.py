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
import math
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from dlrover_kfp.core.partition import table_offsets
from dlrover_kfp.core.spec import ModelSpec
from dlrover_kfp.training import memory


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


# ------------------------------------------------------------------ embedding initialisation
#
# Every element (g, j) of the embedding (global row id g, column j < d) gets its initial value
# from a counter-based hash, so it depends on (seed, g, j) and its table's size only: a PS
# computes exactly its own rows, in any order, chunking and thread count, and they equal the
# rows any other partition (or the in-process reference) computes.
#
#   R       = floor(2^32 / d)                 rows per 32-bit block
#   b       = g div R,  c = (g mod R)·d + j   block and counter; c < 2^32, distinct in a block
#   k1, k2  = low and high halves of splitmix64(splitmix64(seed) xor b)   (per block, in Python)
#   x       = (c + k1) mod 2^32
#   x       = x xor (x >> 16);  x = x·0x7FEB352D;  x = x xor k2            (mod 2^32)
#   x       = x xor (x >> 15);  x = x·0x846CA68B
#   m       = x >> 9                           the top 23 bits, the best mixed ones
#   f       = float32 with bits 0x3F800000 | m = 1 + m/2^23, in [1, 2)
#   value   = (f - 1.5) · 2·s_t,   s_t = float32(sqrt(1/n_t))               in [-s_t, s_t)
#
# The mixing has the shape of the "lowbias32" integer hash (two xorshift-multiply rounds whose
# constants C. Wellons found by searching for low bias); k2 enters between the rounds so that
# another seed is not merely a shifted counter. lowbias32's last step, x xor (x >> 16), is left
# out: it folds high bits into the low 16, and of those only bits 9-15 reach the value, as its 7
# least significant mantissa bits (under 2^-16 of the range). Every step is a bijection of uint32
# (xor-shifts, odd multipliers, constants), so within a block no two elements share a hash
# before the truncation to 23 bits. The float steps keep the bound: f - 1.5 is exact (Sterbenz),
# 2·s_t is exact and |f - 1.5| <= 1/2, and rounding is monotone, so |value| <= s_t in float32.
#
# Cost: 14 numpy passes over uint32 lanes (an xor-shift is two), in chunks of _INIT_CHUNK_ELEMS
# elements that stay in cache, computed in place in the output: ~1.5 ns per element on one core
# here, 1.3 s for the medium model's 832M. The splitmix64 version before it (uint64 lanes, 1M-row
# temporaries) took 25-47 ns per element, 21-39 s. The ufuncs release the GIL, so threads help
# where the pod has the cores.

#: Elements hashed per chunk: big enough that numpy's per-call overhead (~1 us) is small, small
#: enough that a chunk's two uint32 buffers (2 MiB) stay in cache. 64K-512K elements measured
#: alike here (1.5 ns per element), 16K 40% slower.
_INIT_CHUNK_ELEMS = 1 << 18
#: Rows a worker thread takes at a time (and populates first when asked): the unit of sharing.
_INIT_PIECE_BYTES = 16 << 20
_MASK32 = 0xFFFFFFFF
_MASK64 = (1 << 64) - 1
_MUL1 = np.uint32(0x7FEB352D)
_MUL2 = np.uint32(0x846CA68B)
_ONE_BITS = np.uint32(0x3F800000)  # the bits of float32 1.0; OR-ing m in gives 1 + m/2^23
_HALF_RANGE = np.float32(1.5)


def _splitmix64_int(x: int) -> int:
    """SplitMix64's finaliser on one Python int (for keys; the arrays use 32-bit lanes)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _block_keys(seed: int, block: int) -> tuple[int, int]:
    """(k1, k2) of one block of rows: independent 32-bit keys per (seed, block)."""
    k = _splitmix64_int(_splitmix64_int(seed & _MASK64) ^ block)
    return k & _MASK32, k >> 32


def _rows_per_block(dim: int) -> int:
    return (1 << 32) // dim


def _half_width(size: int) -> np.float32:
    """2·s_t for a table of ``size`` rows; doubling a float32 is exact."""
    return np.float32(math.sqrt(1.0 / size)) * np.float32(2.0)


class _Scratch:
    """One thread's temporaries for :func:`_hash_rows` (reused for every chunk)."""

    def __init__(self, dim: int) -> None:
        self.rows = max(1, _INIT_CHUNK_ELEMS // dim)
        self.cols = np.arange(dim, dtype=np.uint32)
        self.index = np.arange(self.rows, dtype=np.uint32)
        self.base = np.empty(self.rows, dtype=np.uint32)
        self.tmp = np.empty((self.rows, dim), dtype=np.uint32)


def _hash_rows(
    out: npt.NDArray[np.float32],
    base: npt.NDArray[np.uint32],
    k2: np.uint32 | npt.NDArray[np.uint32],
    width: np.float32 | npt.NDArray[np.float32],
    scratch: _Scratch,
) -> None:
    """Fill ``out`` ``[n, d]`` (n <= scratch.rows) with the values of rows whose per-row
    ``c(g, 0) + k1`` is ``base`` ``[n]``; ``k2`` and ``width`` are scalars or ``[n, 1]``."""
    n = out.shape[0]
    x = out.view(np.uint32)
    t = scratch.tmp[:n]
    np.add(base[:, None], scratch.cols[None, :], out=x)  # x = c + k1, c = c(g, 0) + j
    np.right_shift(x, 16, out=t)
    np.bitwise_xor(x, t, out=x)
    np.multiply(x, _MUL1, out=x)
    np.bitwise_xor(x, k2, out=x)
    np.right_shift(x, 15, out=t)
    np.bitwise_xor(x, t, out=x)
    np.multiply(x, _MUL2, out=x)
    np.right_shift(x, 9, out=x)
    np.bitwise_or(x, _ONE_BITS, out=x)
    np.subtract(out, _HALF_RANGE, out=out)  # the bits now read as f in [1, 2)
    np.multiply(out, width, out=out)


def _stripe_segments(
    spec: ModelSpec, num_ps: int, ps_index: int, start: int, stop: int
) -> list[tuple[int, int, int, int]]:
    """Slot ranges ``[a, b)`` of PS ``ps_index`` within ``[start, stop)`` whose rows share one
    table and one block, as ``(a, b, table_size, block)``.

    Slot s holds gid s·P + k, so the first slot at or past gid G is ceil((G - k) / P).
    """
    dim = spec.embedding_dim
    per_block = _rows_per_block(dim)
    total = sum(spec.table_sizes)

    def first_slot(gid: int) -> int:
        return max(0, -((ps_index - gid) // num_ps))

    cuts = {start, stop}
    for offset in table_offsets(spec.table_sizes).tolist():
        cuts.add(first_slot(offset))
    for block_start in range(per_block, total, per_block):
        cuts.add(first_slot(block_start))
    bounds = sorted(c for c in cuts if start <= c <= stop)
    offsets = table_offsets(spec.table_sizes)
    segments = []
    for a, b in itertools.pairwise(bounds):
        if a == b:
            continue
        gid = a * num_ps + ps_index
        table = int(np.searchsorted(offsets, gid, side="right")) - 1
        segments.append((a, b, spec.table_sizes[table], gid // per_block))
    return segments


def init_embedding_slots(
    spec: ModelSpec,
    seed: int,
    *,
    num_ps: int = 1,
    ps_index: int = 0,
    start: int = 0,
    stop: int | None = None,
    out: npt.NDArray[np.float32] | None = None,
    threads: int = 1,
    populate: bool = False,
) -> npt.NDArray[np.float32]:
    """Initial values of PS ``ps_index`` of ``num_ps``'s slots ``[start, stop)``: the rows with
    global ids ``s·num_ps + ps_index``, ``[stop - start, d]`` float32, equal element by element to
    :func:`init_embedding_rows` of those ids.

    The fast path for a whole PS (or, with ``num_ps=1``, a range of whole tables): rows come in
    runs of one table, so each run needs only scalars besides the counters. ``out`` (C-contiguous
    float32) receives the values instead of a new array; ``threads`` share the rows in pieces,
    and with ``populate`` each piece's pages are mapped in just before it is computed (see
    :mod:`dlrover_kfp.training.memory`), so page faulting and hashing overlap across threads.
    """
    dim = spec.embedding_dim
    total = sum(spec.table_sizes)
    if not 0 <= ps_index < num_ps:
        raise ValueError(f"PS index {ps_index} out of range for {num_ps} PS")
    slots = max(0, (total - ps_index + num_ps - 1) // num_ps)
    stop = slots if stop is None else stop
    if not 0 <= start <= stop <= slots:
        raise ValueError(f"slots [{start}, {stop}) out of range for {slots} slots")
    if out is None:
        out = np.empty((stop - start, dim), dtype=np.float32)
    if out.shape != (stop - start, dim) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float32 [{stop - start}, {dim}]")
    piece_rows = max(1, _INIT_PIECE_BYTES // (dim * 4))
    # Work items: (first slot, last slot + 1, table size, block); none crosses a segment.
    items = [
        (a, min(a + piece_rows, b), size, block)
        for a0, b, size, block in _stripe_segments(spec, num_ps, ps_index, start, stop)
        for a in range(a0, b, piece_rows)
    ]
    per_block = _rows_per_block(dim)
    step = np.uint32((num_ps * dim) & _MASK32)  # counter step from one slot to the next

    def run(item: tuple[int, int, int, int], scratch: _Scratch) -> None:
        a, b, size, block = item
        piece = out[a - start : b - start]
        if populate:
            memory.populate(piece)
        k1, k2 = _block_keys(seed, block)
        width = _half_width(size)
        for s in range(a, b, scratch.rows):
            n = min(scratch.rows, b - s)
            first = (s * num_ps + ps_index - block * per_block) * dim + k1
            base = scratch.base[:n]
            np.multiply(scratch.index[:n], step, out=base)
            np.add(base, np.uint32(first & _MASK32), out=base)
            _hash_rows(piece[s - a : s - a + n], base, np.uint32(k2), width, scratch)

    workers = max(1, min(threads, len(items)))
    if workers == 1:
        scratch = _Scratch(dim)
        for item in items:
            run(item, scratch)
        return out
    pending = iter(items)
    lock = threading.Lock()

    def worker() -> None:
        scratch = _Scratch(dim)
        while True:
            with lock:
                item = next(pending, None)
            if item is None:
                return
            run(item, scratch)

    with ThreadPoolExecutor(workers, thread_name_prefix="init-embedding") as pool:
        for future in [pool.submit(worker) for _ in range(workers)]:
            future.result()
    return out


def init_embedding_rows(
    gids: npt.NDArray[np.int64], spec: ModelSpec, seed: int
) -> npt.NDArray[np.float32]:
    """Initial values of the rows with global ids ``gids`` (any ids, any order): ``[len(gids),
    d]`` float32.

    Row ``g`` of table ``t`` (``n_t`` rows) starts uniform in ±sqrt(1/n_t), as DLRM does. The
    value of element ``(g, j)`` is a 32-bit hash of ``(seed, g, j)`` (the equations are above this
    function), so it is the same whichever PS holds the row and however many PS there are: a job
    restarted on a different number of PS, or compared with an in-process reference, starts from
    the same model. A PS builds its rows with the faster :func:`init_embedding_slots`, which
    gives the same values.
    """
    dim = spec.embedding_dim
    gids = np.asarray(gids, dtype=np.int64)
    total = sum(spec.table_sizes)
    if gids.size and (int(gids.min()) < 0 or int(gids.max()) >= total):
        raise ValueError(f"global ids must lie in [0, {total})")
    offsets = table_offsets(spec.table_sizes)
    widths = np.array([_half_width(n) for n in spec.table_sizes], dtype=np.float32)
    per_block = _rows_per_block(dim)
    out = np.empty((len(gids), dim), dtype=np.float32)
    scratch = _Scratch(dim)
    for start in range(0, len(gids), scratch.rows):
        chunk = gids[start : start + scratch.rows]
        blocks = chunk // per_block
        distinct, which = np.unique(blocks, return_inverse=True)  # nearly always one block
        keys = np.array([_block_keys(seed, int(b)) for b in distinct.tolist()], dtype=np.int64)
        k1, k2 = keys[which, 0], keys[which, 1].astype(np.uint32)
        base = (((chunk - blocks * per_block) * dim + k1) & _MASK32).astype(np.uint32)
        table = np.searchsorted(offsets, chunk, side="right") - 1
        _hash_rows(
            out[start : start + len(chunk)], base, k2[:, None], widths[table][:, None], scratch
        )
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
                first = int(self.offsets[t])  # one PS of one: slot = global id
                rows = init_embedding_slots(
                    spec, seed if init_seed is None else init_seed, start=first, stop=first + n
                )
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
