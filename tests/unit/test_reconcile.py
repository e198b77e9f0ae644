"""From running pods to a target plan (core/reconcile.py): the end state and the way there."""

from __future__ import annotations

import random

from dlrover_kfp.core.plan import NodeGroup, ResourcePlan, Stage
from dlrover_kfp.core.reconcile import (
    ChangeKind,
    Pod,
    PodChange,
    in_place,
    move_ps,
    plan_pods,
    reconcile,
)


def _plan(w: tuple[int, float, int], p: tuple[int, float, int]) -> ResourcePlan:
    return ResourcePlan(
        workers=NodeGroup(count=w[0], cpu=w[1], memory_mb=w[2]),
        ps=NodeGroup(count=p[0], cpu=p[1], memory_mb=p[2]),
        stage=Stage.AUTO_SCALE,
        reason="test",
    )


_pods = plan_pods


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
        elif c.kind is ChangeKind.RESIZE_WORKER:
            # In place: the same pod, its memory never lowered (Kubernetes refuses that).
            old = state[f"worker-{c.index}"]
            assert c.memory_mb >= old.memory_mb, (old, c)
            state[old.name] = Pod(role="worker", index=c.index, cpu=c.cpu, memory_mb=c.memory_mb)
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


def test_a_worker_memory_cut_replaces_removes_first_and_migrates_ps_live_with_room() -> None:
    before, after = _plan((3, 1.0, 2048), (1, 1.0, 4096)), _plan((2, 2.0, 1024), (1, 2.0, 4096))
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


def test_a_worker_cpu_change_is_an_in_place_resize_cuts_first_growths_last() -> None:
    # CPU up, memory kept: resized in place after the PS change, nothing removed or added.
    before, after = _plan((2, 1.0, 2048), (1, 1.0, 4096)), _plan((2, 2.0, 2048), (1, 2.0, 4096))
    changes = reconcile(_pods(before), after, 16, 1 << 20)
    assert [(c.kind, c.index, c.cpu, c.memory_mb) for c in changes] == [
        (ChangeKind.MIGRATE_PS, 0, 2.0, 4096),
        (ChangeKind.RESIZE_WORKER, 0, 2.0, 2048),
        (ChangeKind.RESIZE_WORKER, 1, 2.0, 2048),
    ]
    # CPU down, memory up: the CPU cut goes first (it frees quota for the PS), the memory
    # growth last, each in place.
    bigger_ps = _plan((1, 1.0, 3072), (1, 2.0, 4096))
    cut = reconcile(_pods(_plan((1, 2.0, 2048), (1, 1.0, 4096))), bigger_ps, 3, 1 << 20)
    assert [(c.kind, c.cpu, c.memory_mb, c.live) for c in cut] == [
        (ChangeKind.RESIZE_WORKER, 1.0, 2048, False),
        (ChangeKind.MIGRATE_PS, 2.0, 4096, False),
        (ChangeKind.RESIZE_WORKER, 1.0, 3072, False),
    ]
    assert cut[0].reason == "worker-0: 2 -> 1 cpu in place"


def test_a_ps_count_change_is_one_repartition() -> None:
    before, after = _plan((2, 1.0, 2048), (1, 1.0, 8192)), _plan((2, 1.0, 2048), (2, 1.0, 4608))
    changes = reconcile(_pods(before), after, 16, 1 << 20)
    assert [(c.kind, c.index, c.live) for c in changes] == [(ChangeKind.REPARTITION_PS, 2, True)]


def test_property_reaches_the_target_and_never_leaves_the_quota() -> None:
    # 3,000 random (current, target) pairs: the target changes each of worker count, worker
    # size, PS count and PS size with probability 1/2, and the quota leaves 0-4 cores and
    # 0-8 GiB above the larger end, so that it is often tight. The changes end exactly at the
    # target, never pass through a state above the quota, remove no worker that matches, and
    # resize in place (never lowering memory) every kept worker whose memory does not shrink.
    rng = random.Random(11)
    sizes = [0.5, 1.0, 2.0, 4.0]
    mems = [1024, 2048, 4096, 8192]
    stop_and_restart = resizes = 0
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
        # A worker that stays and whose memory does not shrink is resized, never replaced.
        in_place = {
            f"worker-{k}"
            for k in range(min(before.workers.count, after.workers.count))
            if after.workers.memory_mb >= before.workers.memory_mb
        }
        assert not in_place & removed, changes
        resizes += sum(1 for c in changes if c.kind is ChangeKind.RESIZE_WORKER)
    # The tight quotas do force stop-and-restart PS changes: the live rule is exercised; and
    # so are the in-place resizes.
    assert stop_and_restart > 100
    assert resizes > 1000


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


def test_a_step_is_in_place_when_only_worker_cpu_or_memory_growth_changes() -> None:
    base = _plan((2, 1.0, 2048), (1, 1.0, 4096))
    assert in_place(base, _plan((2, 2.0, 2048), (1, 1.0, 4096)))
    assert in_place(base, _plan((2, 0.5, 4096), (1, 1.0, 4096)))
    assert not in_place(base, base)  # no change at all
    assert not in_place(base, _plan((2, 2.0, 1024), (1, 1.0, 4096)))  # memory down: replaced
    assert not in_place(base, _plan((3, 2.0, 2048), (1, 1.0, 4096)))  # a worker added
    assert not in_place(base, _plan((2, 2.0, 2048), (1, 2.0, 4096)))  # a PS migrated
