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
