"""How embedding rows are spread over parameter servers.

Every categorical table's rows get one *global id*: the tables are laid end to end,

    gid = offset[t] + id,        offset[t] = table_sizes[0] + ... + table_sizes[t-1]

and PS ``k`` of ``P`` owns the rows whose global id is ``k`` modulo ``P``, stored at *slot*
``gid // P`` of its local arrays:

    owner(gid) = gid mod P        slot(gid) = gid div P        gid = slot·P + owner

Striping by modulo (not by contiguous ranges) spreads every table's popular head rows over all
PS, so that no PS is hot just because it holds the low ids of a Zipf-distributed table; and a
row's new home after a change from ``P`` to ``P'`` servers is a closed formula, which is what
restoring a checkpoint onto a different number of PS needs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Partition:
    """``total_rows`` embedding rows striped over ``num_ps`` servers."""

    total_rows: int
    num_ps: int

    def __post_init__(self) -> None:
        if self.total_rows < 1 or self.num_ps < 1:
            raise ValueError(f"partition needs rows >= 1 and PS >= 1, got {self}")

    def rows_on(self, ps: int) -> int:
        """Rows PS ``ps`` holds: ceil((R - k) / P) for k < R, else 0."""
        if not 0 <= ps < self.num_ps:
            raise ValueError(f"PS index {ps} out of range for {self.num_ps} PS")
        return max(0, (self.total_rows - ps + self.num_ps - 1) // self.num_ps)

    def owner(self, gids: IntArray) -> IntArray:
        return gids % self.num_ps

    def slot(self, gids: IntArray) -> IntArray:
        return gids // self.num_ps

    def gids_of(self, ps: int) -> IntArray:
        """Global ids held by ``ps``, in slot order."""
        if not 0 <= ps < self.num_ps:
            raise ValueError(f"PS index {ps} out of range for {self.num_ps} PS")
        return np.arange(ps, self.total_rows, self.num_ps, dtype=np.int64)


def table_offsets(table_sizes: Sequence[int]) -> IntArray:
    """offset[t] for every table (length T): where table t starts in the global id space."""
    sizes = np.asarray(table_sizes, dtype=np.int64)
    return np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)


def global_ids(sparse: IntArray, offsets: IntArray) -> IntArray:
    """Per-table ids of a batch ``[n, T]`` to global ids ``[n, T]``."""
    return sparse + offsets[np.newaxis, :]


@dataclass(frozen=True, slots=True)
class Overlap:
    """The rows that PS ``new_ps`` of a new partition takes from PS ``old_ps`` of an old one.

    A row ``g`` moves from old PS ``j`` (of ``M``) to new PS ``k`` (of ``N``) when

        g ≡ j (mod M)  and  g ≡ k (mod N).

    By the Chinese remainder theorem these rows exist iff ``j ≡ k (mod gcd(M, N))``, and then
    they are exactly one residue class modulo ``L = lcm(M, N)``: ``g = first + i·L``, ``i >= 0``.
    So the i-th row of the overlap is a closed formula, and a slice ``[start, start + count)``
    of it costs only its own length to compute, whatever the table size: a transfer asks for
    the overlap chunk by chunk and neither side ever lists it whole. The rows come in increasing
    ``g``, hence increasing new slot ``g // N`` and old slot ``g // M`` alike.
    """

    old: Partition
    old_ps: int
    new: Partition
    new_ps: int
    #: the smallest row of the overlap (meaningless when ``count`` is 0)
    first: int
    #: lcm(M, N): the distance between two consecutive rows of the overlap
    step: int
    #: how many rows the overlap holds
    count: int

    def slots(self, start: int = 0, count: int | None = None) -> tuple[IntArray, IntArray]:
        """(old slots, new slots) of rows ``[start, start + count)`` of the overlap (clipped to
        it; all of it from ``start`` when ``count`` is None), in new-slot order."""
        stop = self.count if count is None else min(self.count, start + max(count, 0))
        gids = self.first + self.step * np.arange(max(start, 0), stop, dtype=np.int64)
        return self.old.slot(gids), self.new.slot(gids)


def overlap(old: Partition, old_ps: int, new: Partition, new_ps: int) -> Overlap:
    """The rows new PS ``new_ps`` takes from old PS ``old_ps`` (see :class:`Overlap`)."""
    if old.total_rows != new.total_rows:
        raise ValueError(f"partitions of different tables: {old} and {new}")
    for part, ps in ((old, old_ps), (new, new_ps)):
        if not 0 <= ps < part.num_ps:
            raise ValueError(f"PS index {ps} out of range for {part.num_ps} PS")
    m, n = old.num_ps, new.num_ps
    step = m * n // math.gcd(m, n)
    # The first row is among new_ps + t·N for t < M / gcd (the residues mod L of that class);
    # at most M candidates, M being a handful of PS.
    first = next((g for g in range(new_ps, step, n) if g % m == old_ps), None)
    if first is None or first >= old.total_rows:
        return Overlap(old, old_ps, new, new_ps, first=0, step=step, count=0)
    count = (old.total_rows - first + step - 1) // step
    return Overlap(old, old_ps, new, new_ps, first=first, step=step, count=count)
