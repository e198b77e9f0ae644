"""Who a process of a job is: its role, its index and, for a PS, its generation.

Each identity has three spellings, one per audience, and this module is the only place that
writes or reads them:

* the **pod name** the cluster knows: ``<job>-worker-3``, ``<job>-ps-1``, and ``<job>-ps-1-g2``
  for a PS of a later generation (a changed PS set starts new pods beside the old ones, and
  Kubernetes names are unique);
* the **key** a process reports under to the master: ``worker-3``, ``ps-1``. It carries no
  generation: a worker's progress counts per index across its relaunches;
* the **lease holder** of a worker process: ``worker-3#<token>``, the key and a token each
  process draws, so that a relaunched worker's leases are not its predecessor's.

Everything else holds a :class:`NodeId` and asks it for the spelling it needs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, cast

from dlrover_kfp.core.profile import Role

_ROLES = ("worker", "ps")
_KEY = re.compile(r"(worker|ps)-(0|[1-9]\d*)")
_POD_SUFFIX = re.compile(r"(worker|ps)-(0|[1-9]\d*)(?:-g([1-9]\d*))?")


@dataclass(frozen=True, slots=True, order=True)
class NodeId:
    """One PS or worker of a job; ``generation`` 0 for every worker and the first PS set."""

    role: Role
    index: int
    generation: int = 0

    def __post_init__(self) -> None:
        if self.role not in _ROLES:
            raise ValueError(f"role must be one of {_ROLES}, got {self.role!r}")
        if self.index < 0 or self.generation < 0:
            raise ValueError(
                f"index and generation must be >= 0, got {self.index}, {self.generation}"
            )

    @classmethod
    def worker(cls, index: int) -> NodeId:
        return cls("worker", index)

    @property
    def key(self) -> str:
        """What the process reports under to the master."""
        return f"{self.role}-{self.index}"

    def pod_name(self, job: str) -> str:
        """The pod's name in job ``job``."""
        base = f"{job}-{self.key}"
        return base if self.generation == 0 else f"{base}-g{self.generation}"

    def holder(self, incarnation: str) -> str:
        """The lease holder of this worker's process ``incarnation``."""
        return holder_name(self.key, incarnation)

    @classmethod
    def from_key(cls, key: str) -> NodeId | None:
        """The node a master key names (``worker-3``), None for anything else."""
        match = _KEY.fullmatch(key)
        return None if match is None else cls(_role(match[1]), int(match[2]))

    @classmethod
    def from_holder(cls, holder: str) -> NodeId | None:
        """The worker a lease holder (``worker-3#<token>``, or a bare key) is of."""
        return cls.from_key(holder.split("#", 1)[0])

    @classmethod
    def from_pod_name(cls, job: str, name: str) -> NodeId | None:
        """The node a pod of job ``job`` is, None for a name that is not one of its pods."""
        prefix = f"{job}-"
        if not name.startswith(prefix):
            return None
        match = _POD_SUFFIX.fullmatch(name[len(prefix) :])
        if match is None:
            return None
        return cls(_role(match[1]), int(match[2]), int(match[3] or 0))


def holder_name(worker: str, incarnation: str | int | None) -> str:
    """Who holds a lease: the worker's name (as it reported it) and its process's token."""
    return worker if incarnation is None else f"{worker}#{incarnation}"


def _role(text: str) -> Role:
    return cast(Literal["worker", "ps"], text)


__all__ = ["NodeId", "holder_name"]
