"""Which samples' gradients the parameter servers applied more than once.

The shard ledger (:mod:`.shards`) proves that every sample is *counted* once. It does not
prove that every sample's gradient is *applied* once: a worker stopped part-way through a
shard (its pod relaunched, scaled in, replaced as a straggler, or stopped for a rollback) has
had the pushes of the batches it trained applied, and the shard goes back to the queue and is
trained again from its first row. PS 0 sees every batch (each push carries the dense gradient
there), so it keeps this tally, fed by the shard tag each push carries.

Per shard ``(epoch, shard)`` of ``n`` rows, each push adding its batch's ``rows``::

    applied <- applied + rows
    at the last batch of a pass (a whole pass: a worker sends a shard's batches in order):
        twice   <- twice + applied - (n if this is the shard's first whole pass else 0)
        applied <- 0

A pass cut short, then a whole one, folds the cut pass's rows into ``twice``; so do passes
side by side (a straggler and the worker its shard went to), whichever ends first; a second
whole pass counts whole. Rows left in ``applied`` after a whole pass are applied twice too, and
so are all of them once the run has ended, every shard done. The tally is a plain value: PS 0
puts it in each checkpoint and takes it back with the state it restores, so a rollback forgets
exactly the pushes the restored state forgets. Its size is that of the shard ledger's.

The pushes of a pass also say where in the shard their rows lie, so the tally knows the prefix
of a shard that is applied (:meth:`AppliedTally.resume_points`): a rollback leases the shards
in flight at its checkpoint again from there, and applies none of their rows twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Key = tuple[int, int]  # (epoch, shard id)


@dataclass
class AppliedTally:
    """Rows applied per shard pass; mutated only through :meth:`add`."""

    #: per (epoch, shard): [rows applied since its last whole pass ended, the shard's rows,
    #: the rows from its first that those pushes cover]
    partial: dict[Key, list[int]] = field(default_factory=dict)
    #: the shards that had a whole pass
    whole: set[Key] = field(default_factory=set)
    #: per (epoch, shard): rows applied beyond its first whole pass, folded
    twice: dict[Key, int] = field(default_factory=dict)

    def add(self, epoch: int, shard: int, offset: int, rows: int, total: int, last: bool) -> None:
        """A push of the ``rows`` rows from ``offset`` of shard ``shard`` (``total`` rows);
        ``last``: the last batch of its pass."""
        key = (epoch, shard)
        entry = self.partial.setdefault(key, [0, total, 0])
        entry[0] += rows
        entry[2] = max(entry[2], offset + rows)
        if not last:
            return
        extra = entry[0] - (0 if key in self.whole else entry[1])
        self.whole.add(key)
        del self.partial[key]
        if extra > 0:
            self.twice[key] = self.twice.get(key, 0) + extra

    def applied_twice(self, finished: bool) -> dict[Key, int]:
        """Rows applied more than once, per shard; with ``finished`` (every shard done) the
        rows of passes left partial count too."""
        out = dict(self.twice)
        for key, (applied, _, _) in self.partial.items():
            if finished or key in self.whole:
                out[key] = out.get(key, 0) + applied
        return {k: v for k, v in out.items() if v}

    def resume_points(self, epoch: int) -> dict[int, int]:
        """Per shard of ``epoch`` never trained whole: the rows from its first that are
        applied (every pass starts at its first row or at such a point and goes on in order,
        so what they applied is a prefix). Training it again from there applies nothing
        twice: after a rollback, the part a shard in flight at the checkpoint had pushed."""
        return {
            s: covered
            for (e, s), (_, _, covered) in self.partial.items()
            if e == epoch and (e, s) not in self.whole and covered > 0
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "partial": [[e, s, *entry] for (e, s), entry in sorted(self.partial.items())],
            "whole": [[e, s] for e, s in sorted(self.whole)],
            "twice": [[e, s, r] for (e, s), r in sorted(self.twice.items())],
        }

    @classmethod
    def from_dict(cls, data: object) -> AppliedTally:
        """Parse :meth:`to_dict`'s form (a ValueError naming what is wrong); None: empty."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ValueError(f"applied: must be an object, got {type(data).__name__}")
        tally = cls()
        for row in _rows(data, "partial", 5):
            tally.partial[(row[0], row[1])] = [row[2], row[3], row[4]]
        for row in _rows(data, "whole", 2):
            tally.whole.add((row[0], row[1]))
        for row in _rows(data, "twice", 3):
            tally.twice[(row[0], row[1])] = row[2]
        return tally


def by_cause(twice: dict[Key, int], causes: dict[Key, str]) -> dict[str, int]:
    """Rows applied twice summed per cause (the reason each shard was given back; ``other``
    where none was noted), every cause named, zeros left out."""
    out: dict[str, int] = {}
    for key, rows in twice.items():
        cause = causes.get(key, "other")
        out[cause] = out.get(cause, 0) + rows
    return dict(sorted(out.items()))


def _rows(data: dict[str, Any], key: str, width: int) -> list[list[int]]:
    rows = data.get(key, [])
    if not isinstance(rows, list):
        raise ValueError(f"applied.{key}: must be a list, got {type(rows).__name__}")
    for row in rows:
        if (
            not isinstance(row, list)
            or len(row) != width
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in row)
        ):
            raise ValueError(f"applied.{key}: every entry must be {width} integers >= 0: {row!r}")
    return rows
