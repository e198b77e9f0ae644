"""Data-shard bookkeeping: which rows have been trained, which are leased, which are left.

The dataset is cut into small shards (a few batches each). Workers pull a shard, train on it and
report it done. Each shard of each epoch moves through

    TODO  --lease-->  DOING  --done-->  DONE
                        |
                        +--requeue (worker gone, lease expired)--> TODO

so that a worker that dies, is deleted or stalls gives its unfinished shards back and no shard
is counted twice: a "done" for a shard that is not leased to that worker is ignored. Epoch
``e + 1`` starts once every shard of epoch ``e`` is done. The ledger is a plain value with no
I/O: the master keeps one, checkpoints it with :meth:`ShardLedger.to_dict`, and restores it after
a restart without losing or repeating a completed shard.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class ShardState(StrEnum):
    """TODO -> DOING (leased) -> DONE; DOING -> TODO when its worker leaves or its lease ends."""

    TODO = "todo"
    DOING = "doing"
    DONE = "done"


@dataclass(frozen=True, slots=True)
class Shard:
    """Rows ``[start, end)`` of data source ``source``, in epoch ``epoch``."""

    id: int
    source: int
    start: int
    end: int
    epoch: int = 0

    @property
    def rows(self) -> int:
        return self.end - self.start


@dataclass(slots=True)
class _Lease:
    shard: Shard
    worker: str
    deadline: float


@dataclass
class ShardLedger:
    """Every shard of every epoch, with its state. Mutated only through its methods."""

    ranges: tuple[tuple[int, int, int], ...]  # (source, start, end) per shard id
    epochs: int
    lease_s: float = 600.0
    epoch: int = 0
    todo: deque[int] = field(default_factory=deque)
    doing: dict[int, _Lease] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)
    rows_done: int = 0
    #: per shard of this epoch, rows from its first that the PS already applied (a shard in
    #: flight at the checkpoint a rollback restored, core/applied.py): leased from there.
    #: Not saved: a restore derives it again from the tally committed with the state.
    skip: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if not self.todo and not self.doing and not self.done and self.epoch == 0:
            self.todo.extend(range(len(self.ranges)))

    @property
    def total_rows(self) -> int:
        """Rows of all epochs together."""
        return self.epochs * sum(end - start for _, start, end in self.ranges)

    @property
    def rows_to_lease(self) -> int:
        """Rows no worker holds or has done yet: this epoch's TODO shards and every later
        epoch's. What a change of the job's shape can still speed up (leased rows are trained
        by their holders whatever it does)."""
        if self.finished:
            return 0
        per_epoch = sum(end - start for _, start, end in self.ranges)
        todo = sum(self.ranges[i][2] - self.ranges[i][1] for i in self.todo)
        return todo + (self.epochs - self.epoch - 1) * per_epoch

    @property
    def finished(self) -> bool:
        return self.epoch >= self.epochs

    def _shard(self, shard_id: int) -> Shard:
        source, start, end = self.ranges[shard_id]
        return Shard(shard_id, source, start, end, self.epoch)

    def lease(self, worker: str, now: float) -> Shard | None:
        """The next TODO shard for ``worker``, or None (all leased, or the job is finished)."""
        self.expire(now)
        if self.finished or not self.todo:
            return None
        shard = self._shard(self.todo.popleft())
        self.doing[shard.id] = _Lease(shard, worker, now + self.lease_s)
        return shard

    def complete(self, worker: str, shard_id: int, epoch: int) -> bool:
        """Mark a leased shard done; False (and no change) if it is not ``worker``'s lease."""
        lease = self.doing.get(shard_id)
        if lease is None or lease.worker != worker or epoch != self.epoch:
            return False
        del self.doing[shard_id]
        self.done.add(shard_id)
        self.rows_done += lease.shard.rows
        if len(self.done) == len(self.ranges):
            self.epoch += 1
            self.done.clear()
            if not self.finished:
                self.todo.extend(range(len(self.ranges)))
        return True

    def requeue(self, worker: str) -> list[int]:
        """Give a departed worker's leased shards back (front of the queue, in id order)."""
        ids = sorted(i for i, lease in self.doing.items() if lease.worker == worker)
        for i in reversed(ids):
            del self.doing[i]
            self.todo.appendleft(i)
        return ids

    def expire(self, now: float) -> list[int]:
        """Requeue leases past their deadline (a worker that stalls without dying)."""
        ids = sorted(i for i, lease in self.doing.items() if lease.deadline <= now)
        for i in reversed(ids):
            del self.doing[i]
            self.todo.appendleft(i)
        return ids

    def lease_ages(self, now: float) -> dict[str, float]:
        """Per holder, how long it has held its oldest lease (a lease ends ``lease_s`` after
        it was granted, so it was granted at ``deadline - lease_s``)."""
        ages: dict[str, float] = {}
        for lease in self.doing.values():
            age = now - (lease.deadline - self.lease_s)
            ages[lease.worker] = max(age, ages.get(lease.worker, 0.0))
        return ages

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able snapshot. Leased shards are saved as TODO: their work is not done."""
        pending = sorted(self.doing) + list(self.todo)
        return {
            "ranges": [list(r) for r in self.ranges],
            "epochs": self.epochs,
            "epoch": self.epoch,
            "todo": pending,
            "done": sorted(self.done),
            "rows_done": self.rows_done,
            "lease_s": self.lease_s,
        }

    @classmethod
    def restored(
        cls, data: Any, ranges: tuple[tuple[int, int, int], ...], epochs: int
    ) -> ShardLedger:
        """The ledger of a checkpoint (:meth:`to_dict`), cross-checked against the run's own
        split before it is trusted: the same shards (``ranges``, from the data and the
        hold-out) and epochs; every shard of the current epoch either to do or done, once;
        the rows done those of the epochs and shards done. A checkpoint's ledger that fails
        any of these was changed after it was written (a flipped bit, an edit); restoring it
        trained a held-out row, or left nothing to lease with the epoch not done (the master
        waited forever at 100%). Raises :class:`ValueError` naming what is wrong."""
        if not isinstance(data, dict):
            raise ValueError("the shard ledger is not an object")
        try:
            ledger = cls.from_dict(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"the shard ledger is unreadable ({exc!r})") from None
        got = ledger.ranges
        if got != ranges:
            pairs = enumerate(zip(got, ranges, strict=False))
            diff = next((i for i, (a, b) in pairs if a != b), min(len(got), len(ranges)))
            raise ValueError(
                f"its shards are not this run's split ({len(got)} shards, this run has "
                f"{len(ranges)}; first difference at shard {diff})"
            )
        if ledger.epochs != epochs or not 0 <= ledger.epoch <= epochs:
            raise ValueError(f"epoch {ledger.epoch} of {ledger.epochs}, this run has {epochs}")
        todo, done = list(ledger.todo), ledger.done
        listed = [*todo, *done]
        if len(set(todo)) != len(todo) or set(todo) & done:
            raise ValueError("a shard is listed twice (to do and done)")
        everything = set(range(len(ranges)))
        if not set(listed) <= everything:
            raise ValueError("a shard id outside the split")
        if ledger.finished and listed:
            raise ValueError("every epoch is done but shards are still listed")
        if not ledger.finished and set(listed) != everything:
            missing = len(everything - set(listed))
            raise ValueError(f"{missing} shard(s) of epoch {ledger.epoch} neither to do nor done")
        per_epoch = sum(end - start for _, start, end in ranges)
        expected = ledger.epoch * per_epoch + sum(ranges[i][2] - ranges[i][1] for i in done)
        if ledger.rows_done != expected:
            raise ValueError(f"rows_done {ledger.rows_done}, its shards say {expected}")
        return ledger

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardLedger:
        ledger = cls(
            ranges=tuple((int(a), int(b), int(c)) for a, b, c in data["ranges"]),
            epochs=int(data["epochs"]),
            lease_s=float(data["lease_s"]),
            epoch=int(data["epoch"]),
            todo=deque(int(i) for i in data["todo"]),
            done={int(i) for i in data["done"]},
            rows_done=int(data["rows_done"]),
        )
        return ledger
