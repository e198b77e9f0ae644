"""From the pods a job has to the pods its plan wants: the ordered changes that get there.

The job master's "apply" step, kept pure: given the running pods and a target
:class:`~dlrover_kfp.core.plan.ResourcePlan`, :func:`reconcile` lists the pod changes, in the
order that never takes the job above its quota on the way, when both ends are within it:

1. **Worker shrinks**: workers beyond the target count (highest index first) are removed;
   workers whose memory would shrink are removed too (a new pod of the new size replaces the
   old one: Kubernetes' in-place resize refuses a memory decrease, and a worker holds no
   state, its leased shards go back to the queue); workers whose CPU falls, their memory
   unchanged or growing, are **resized in place** to the new CPU (the memory, if it grows,
   waits for step 3): the same process goes on under the new quota, no restart, no re-read.
2. **PS changes**, at most one kind:
   - the count changes: one *repartition* to the target count and size (flash checkpoint, new
     PS started from the snapshot with the rows re-partitioned, workers switched, old PS
     deleted);
   - the count stays and the size changes: one *migration* per PS, one after another.
   A PS change is *live* (new pods start before the old ones stop, so training pauses only for
   the switch) when the quota has room for old and new together at that point; otherwise it is
   stop-and-restart (old pods stop first; training waits for the new ones).
3. **Worker growths**: the in-place resizes that grow (CPU up, or memory up: a worker whose
   CPU fell and memory grows gets its memory here, a second resize), then the additions: the
   removed-for-resizing workers at their new size and the new ones, lowest index first.

After step 1 every pod is at most its old size; after the PS change every worker is at most
its target size in each resource (kept, shrunk, or not yet grown) and the PS are the target's;
each growth moves one pod up to its target. So no intermediate state is above a quota both
ends fit (`tests/unit/test_reconcile.py` checks it over random plans). Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from dlrover_kfp.core.plan import NodeGroup, ResourcePlan
from dlrover_kfp.core.profile import Role


@dataclass(frozen=True, slots=True, kw_only=True)
class Pod:
    """A running pod of the job, as the master sees it."""

    role: Role
    index: int
    cpu: float
    memory_mb: int

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"


class ChangeKind(StrEnum):
    REMOVE_WORKER = "remove_worker"
    #: a running worker's CPU (and memory, never down) changed in place: the same process
    RESIZE_WORKER = "resize_worker"
    REPARTITION_PS = "repartition_ps"
    MIGRATE_PS = "migrate_ps"
    ADD_WORKER = "add_worker"


@dataclass(frozen=True, slots=True, kw_only=True)
class PodChange:
    """One step. For ``REPARTITION_PS``, ``index`` is the new PS count and ``cpu`` and
    ``memory_mb`` each new PS's; for the others they name one pod and its new size (for
    ``RESIZE_WORKER``, the size it has after this step: a worker whose CPU falls and memory
    grows is resized twice, CPU in step 1 and memory in step 3).
    ``live``: for PS changes, whether old and new pods may run together (see the module)."""

    kind: ChangeKind
    index: int
    cpu: float = 0.0
    memory_mb: int = 0
    live: bool = False
    reason: str = ""


@dataclass(frozen=True, slots=True)
class _Total:
    cpu: float
    memory_mb: int

    def plus(self, cpu: float, memory_mb: int) -> _Total:
        return _Total(self.cpu + cpu, self.memory_mb + memory_mb)

    def within(self, quota_cpu: float, quota_memory_mb: int) -> bool:
        return self.cpu <= quota_cpu + 1e-9 and self.memory_mb <= quota_memory_mb


def _total(pods: Sequence[Pod]) -> _Total:
    return _Total(sum(p.cpu for p in pods), sum(p.memory_mb for p in pods))


def _sized(pod: Pod, group: NodeGroup) -> bool:
    return abs(pod.cpu - group.cpu) < 1e-9 and pod.memory_mb == group.memory_mb


def reconcile(
    current: Sequence[Pod], target: ResourcePlan, quota_cpu: float, quota_memory_mb: int
) -> tuple[PodChange, ...]:
    """The changes that turn ``current`` into ``target`` (module docstring), in order.

    Workers keep their indices: the target's workers are ``worker-0 .. worker-(n-1)``; a
    running worker with a higher index is removed, a missing lower one added. PS are
    ``ps-0 .. ps-(p-1)`` likewise, and their count changes only by a repartition.
    """
    workers = sorted((p for p in current if p.role == "worker"), key=lambda p: p.index)
    ps = sorted((p for p in current if p.role == "ps"), key=lambda p: p.index)
    want_w, want_p = target.workers, target.ps
    changes: list[PodChange] = []

    # 1. Worker shrinks: removals beyond the count (highest first), then replacements (memory
    #    down), then in-place CPU cuts.
    beyond = [w for w in reversed(workers) if w.index >= want_w.count]
    stay = [w for w in workers if w.index < want_w.count]
    replaced = [w for w in stay if want_w.memory_mb < w.memory_mb]
    resized = [w for w in stay if not _sized(w, want_w) and w not in replaced]
    for w in (*beyond, *replaced):
        what = "beyond the target count" if w in beyond else "to be replaced at its new size"
        changes.append(
            PodChange(kind=ChangeKind.REMOVE_WORKER, index=w.index, reason=f"{w.name}: {what}")
        )
    # Each resized worker at its size between steps 1 and 3: CPU min(old, new), memory old.
    interim = [
        Pod(role="worker", index=w.index, cpu=min(w.cpu, want_w.cpu), memory_mb=w.memory_mb)
        for w in resized
    ]
    for w, mid in zip(resized, interim, strict=True):
        if mid.cpu < w.cpu - 1e-9:
            changes.append(_resize(w, mid))
    kept = [w for w in stay if _sized(w, want_w)]
    running = _total([*kept, *interim]).plus(_total(ps).cpu, _total(ps).memory_mb)

    # 2. PS: a repartition when the count changes, else one migration per PS to be resized.
    if len(ps) != want_p.count or any(p.index >= want_p.count for p in ps):
        if ps or want_p.count:
            peak = running.plus(want_p.total_cpu, want_p.total_memory_mb)
            changes.append(
                PodChange(
                    kind=ChangeKind.REPARTITION_PS,
                    index=want_p.count,
                    cpu=want_p.cpu,
                    memory_mb=want_p.memory_mb,
                    live=bool(ps) and peak.within(quota_cpu, quota_memory_mb),
                    reason=f"{len(ps)} -> {want_p.count} PS, rows re-partitioned",
                )
            )
        running = _total([*kept, *interim]).plus(want_p.total_cpu, want_p.total_memory_mb)
    else:
        for p in ps:
            if _sized(p, want_p):
                continue
            peak = running.plus(want_p.cpu, want_p.memory_mb)
            changes.append(
                PodChange(
                    kind=ChangeKind.MIGRATE_PS,
                    index=p.index,
                    cpu=want_p.cpu,
                    memory_mb=want_p.memory_mb,
                    live=peak.within(quota_cpu, quota_memory_mb),
                    reason=f"{p.name}: {p.cpu:g} cpu / {p.memory_mb}Mi -> {want_p.cpu:g} cpu / "
                    f"{want_p.memory_mb}Mi",
                )
            )
            running = running.plus(want_p.cpu - p.cpu, want_p.memory_mb - p.memory_mb)

    # 3. Worker growths: in-place resizes up to the target, then additions, lowest index first.
    for mid in interim:
        if not _sized(mid, want_w):
            grown = Pod(role="worker", index=mid.index, cpu=want_w.cpu, memory_mb=want_w.memory_mb)
            changes.append(_resize(mid, grown))
    have = {w.index for w in (*kept, *resized)}
    for index in range(want_w.count):
        if index not in have:
            changes.append(
                PodChange(
                    kind=ChangeKind.ADD_WORKER,
                    index=index,
                    cpu=want_w.cpu,
                    memory_mb=want_w.memory_mb,
                    reason=f"worker-{index}: {want_w.cpu:g} cpu / {want_w.memory_mb}Mi",
                )
            )
    return tuple(changes)


def plan_pods(plan: ResourcePlan) -> list[Pod]:
    """The pods a plan runs: ``worker-0 ..`` and ``ps-0 ..`` at their groups' sizes."""
    roles: tuple[tuple[Role, NodeGroup], ...] = (("worker", plan.workers), ("ps", plan.ps))
    return [
        Pod(role=role, index=k, cpu=group.cpu, memory_mb=group.memory_mb)
        for role, group in roles
        for k in range(group.count)
    ]


def in_place(before: ResourcePlan, after: ResourcePlan) -> bool:
    """Whether going from ``before`` to ``after`` changes running pods in place only (every
    change an in-place worker resize: the same counts and PS, the workers' CPU or memory up, or
    CPU down with memory kept): nothing starts, stops or re-reads data. The planner prices such
    a step by it (core/planner/auto_scale.py)."""
    changes = reconcile(plan_pods(before), after, math.inf, 1 << 62)  # no quota: the kinds
    return bool(changes) and all(c.kind is ChangeKind.RESIZE_WORKER for c in changes)


def _resize(old: Pod, new: Pod) -> PodChange:
    """Worker ``old`` resized in place to ``new``'s CPU and memory (memory never down)."""
    return PodChange(
        kind=ChangeKind.RESIZE_WORKER,
        index=old.index,
        cpu=new.cpu,
        memory_mb=new.memory_mb,
        reason=f"{old.name}: {old.cpu:g} -> {new.cpu:g} cpu"
        + (f", {old.memory_mb} -> {new.memory_mb}Mi" if new.memory_mb != old.memory_mb else "")
        + " in place",
    )


def move_ps(
    current: Sequence[Pod], index: int, quota_cpu: float, quota_memory_mb: int
) -> PodChange:
    """Move PS ``index`` to a new pod of its own size (a hot PS leaving a contended node).

    Live when the quota has room for the new pod beside every current one; otherwise the old
    pod stops first (stop-and-restart of that PS).
    """
    old = next((p for p in current if p.role == "ps" and p.index == index), None)
    if old is None:
        raise ValueError(f"ps-{index} is not a current pod")
    peak = _total(current).plus(old.cpu, old.memory_mb)
    return PodChange(
        kind=ChangeKind.MIGRATE_PS,
        index=index,
        cpu=old.cpu,
        memory_mb=old.memory_mb,
        live=peak.within(quota_cpu, quota_memory_mb),
        reason=f"{old.name}: moved to a new pod of {old.cpu:g} cpu / {old.memory_mb}Mi",
    )


__all__ = ["ChangeKind", "Pod", "PodChange", "in_place", "move_ps", "plan_pods", "reconcile"]
