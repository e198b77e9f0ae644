"""From running pods to a target plan (core/reconcile.py): the end state and the way there."""

from __future__ import annotations

import random

from dlrover_kfp.core.plan import NodeGroup, ResourcePlan, Stage
from dlrover_kfp.core.reconcile import ChangeKind, Pod, PodChange, move_ps, reconcile


def _plan(w: tuple[int, float, int], p: tuple[int, float, int]) -> ResourcePlan:
    return ResourcePlan(
        workers=NodeGroup(count=w[0], cpu=w[1], memory_mb=w[2]),
        ps=NodeGroup(count=p[0], cpu=p[1], memory_mb=p[2]),
        stage=Stage.AUTO_SCALE,
        reason="test",
    )


def _pods(plan: ResourcePlan) -> list[Pod]:
    return [
        Pod(role=role, index=k, cpu=group.cpu, memory_mb=group.memory_mb)
        for role, group in (("worker", plan.workers), ("ps", plan.ps))
        for k in range(group.count)
    ]


def _apply(
    pods: list[Pod], changes: tuple[PodChange, ...], quota: tuple[float, int]
) -> tuple[dict[str, Pod], bool]:
    """Run the changes with the semantics the module documents; (end state, never above)."""
    state = {p.name: p for p in pods}
    ok = True

    def check() -> None:
        nonlocal ok
        cpu = sum(p.cpu for p in state.values())
        mem = sum(p.memory_mb for p in state.values())
        ok = ok and cpu <= quota[0] + 1e-9 and mem <= quota[1]

    for c in changes:
        if c.kind is ChangeKind.REMOVE_WORKER:
            del state[f"worker-{c.index}"]
        elif c.kind is ChangeKind.ADD_WORKER:
            state[f"worker-{c.index}"] = Pod(
                role="worker", index=c.index, cpu=c.cpu, memory_mb=c.memory_mb
            )
        elif c.kind is ChangeKind.MIGRATE_PS:
            new = Pod(role="ps", index=c.index, cpu=c.cpu, memory_mb=c.memory_mb)
            if c.live:
                state["new"] = new
                check()
                del state["new"]
            state[new.name] = new
        else:  # REPARTITION_PS
            old = [n for n, p in state.items() if p.role == "ps"]
            fresh = {
                f"new-{k}": Pod(role="ps", index=k, cpu=c.cpu, memory_mb=c.memory_mb)
                for k in range(c.index)
            }
            if c.live:
                state.update(fresh)
                check()
            for n in old:
                del state[n]
            for n in list(state):
                if n.startswith("new-"):
                    del state[n]
            state.update({p.name: p for p in fresh.values()})
        check()
    return state, ok


def test_nothing_to_do_when_the_pods_are_the_plan() -> None:
    plan = _plan((4, 2.0, 4096), (2, 1.0, 8192))
    assert reconcile(_pods(plan), plan, 64, 1 << 20) == ()


def test_growing_workers_adds_the_missing_ones() -> None:
    before, after = _plan((2, 1.0, 2048), (1, 1.0, 4096)), _plan((4, 1.0, 2048), (1, 1.0, 4096))
    changes = reconcile(_pods(before), after, 64, 1 << 20)
    assert [(c.kind, c.index) for c in changes] == [
        (ChangeKind.ADD_WORKER, 2),
        (ChangeKind.ADD_WORKER, 3),
    ]


def test_resizing_replaces_removes_first_and_migrates_ps_live_when_there_is_room() -> None:
    before, after = _plan((3, 1.0, 2048), (1, 1.0, 4096)), _plan((2, 2.0, 2048), (1, 2.0, 4096))
    changes = reconcile(_pods(before), after, 16, 1 << 20)
    assert [(c.kind, c.index) for c in changes] == [
        (ChangeKind.REMOVE_WORKER, 2),
        (ChangeKind.REMOVE_WORKER, 0),
        (ChangeKind.REMOVE_WORKER, 1),
        (ChangeKind.MIGRATE_PS, 0),
        (ChangeKind.ADD_WORKER, 0),
        (ChangeKind.ADD_WORKER, 1),
    ]
    assert changes[3].live
    # Removing the resized workers first made the room. With four kept workers filling the
    # quota there is none for the old and the new PS together: stop-and-restart.
    kept, bigger_ps = _plan((4, 1.0, 2048), (1, 1.0, 4096)), _plan((4, 1.0, 2048), (1, 2.0, 4096))
    tight = reconcile(_pods(kept), bigger_ps, 6, 1 << 20)
    assert [(c.kind, c.live) for c in tight] == [(ChangeKind.MIGRATE_PS, False)]


def test_a_ps_count_change_is_one_repartition() -> None:
    before, after = _plan((2, 1.0, 2048), (1, 1.0, 8192)), _plan((2, 1.0, 2048), (2, 1.0, 4608))
    changes = reconcile(_pods(before), after, 16, 1 << 20)
    assert [(c.kind, c.index, c.live) for c in changes] == [(ChangeKind.REPARTITION_PS, 2, True)]


def test_property_reaches_the_target_and_never_leaves_the_quota() -> None:
    # 3,000 random (current, target) pairs: the target changes each of worker count, worker
    # size, PS count and PS size with probability 1/2, and the quota leaves 0-4 cores and
    # 0-8 GiB above the larger end, so that it is often tight. The changes end exactly at the
    # target, never pass through a state above the quota, and remove no worker that matches.
    rng = random.Random(11)
    sizes = [0.5, 1.0, 2.0, 4.0]
    mems = [1024, 2048, 4096, 8192]
    stop_and_restart = 0
    for _ in range(3000):
        w = (rng.randint(1, 12), rng.choice(sizes), rng.choice(mems))
        p = (rng.randint(1, 4), rng.choice(sizes), rng.choice(mems))
        w2 = (
            rng.randint(1, 12) if rng.random() < 0.5 else w[0],
            *((rng.choice(sizes), rng.choice(mems)) if rng.random() < 0.5 else w[1:]),
        )
        p2 = (
            rng.randint(1, 4) if rng.random() < 0.5 else p[0],
            *((rng.choice(sizes), rng.choice(mems)) if rng.random() < 0.5 else p[1:]),
        )
        before, after = _plan(w, p), _plan(w2, p2)  # type: ignore[arg-type]
        quota = (
            max(before.total_cpu, after.total_cpu) + rng.choice([0, 0.5, 1, 4]),
            max(before.total_memory_mb, after.total_memory_mb) + rng.choice([0, 1024, 8192]),
        )
        changes = reconcile(_pods(before), after, *quota)
        stop_and_restart += sum(
            1
            for c in changes
            if c.kind is not ChangeKind.REMOVE_WORKER
            and c.kind is not ChangeKind.ADD_WORKER
            and not c.live
        )
        state, within = _apply(_pods(before), changes, quota)
        assert within, (before, after, quota, changes)
        assert sorted(state) == sorted(p.name for p in _pods(after)), changes
        for pod in _pods(after):
            assert (state[pod.name].cpu, state[pod.name].memory_mb) == (pod.cpu, pod.memory_mb)
        kept = {
            f"worker-{k}"
            for k in range(min(before.workers.count, after.workers.count))
            if (before.workers.cpu, before.workers.memory_mb)
            == (after.workers.cpu, after.workers.memory_mb)
        }
        removed = {f"worker-{c.index}" for c in changes if c.kind is ChangeKind.REMOVE_WORKER}
        assert not kept & removed
    # The tight quotas do force stop-and-restart PS changes: the live rule is exercised.
    assert stop_and_restart > 100


def test_moving_a_ps_is_live_only_when_the_quota_holds_the_new_pod_beside_the_old() -> None:
    pods = _pods(_plan((2, 0.5, 1024), (2, 0.25, 512)))  # 1.5 cpu, 3072 MiB
    change = move_ps(pods, 1, 2.0, 8192)
    assert (change.kind, change.index, change.cpu, change.memory_mb) == (
        ChangeKind.MIGRATE_PS,
        1,
        0.25,
        512,
    )
    assert change.live
    assert not move_ps(pods, 1, 1.7, 8192).live  # 1.75 cpu at the peak
    assert not move_ps(pods, 1, 2.0, 3500).live  # 3584 MiB at the peak
    assert move_ps(pods, 1, 1.75, 3584).live  # exactly at the quota


def test_moving_a_ps_that_is_not_running_is_refused() -> None:
    pods = _pods(_plan((1, 0.5, 1024), (1, 0.25, 512)))
    try:
        move_ps(pods, 3, 2.0, 8192)
    except ValueError as exc:
        assert "ps-3" in str(exc)
    else:
        raise AssertionError("moving ps-3 was accepted")
