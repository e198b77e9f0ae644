"""The shard ledger: leases, completions, requeues, expiry, epochs and checkpoint round trips."""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import pytest

from dlrover_kfp.core.shards import Shard, ShardLedger

# Six shards over two sources with uneven sizes, so rows_done catches a wrong shard's rows.
RANGES = ((0, 0, 100), (0, 100, 250), (0, 250, 260), (1, 0, 40), (1, 40, 200), (1, 200, 201))
ROWS_PER_EPOCH = sum(end - start for _, start, end in RANGES)


def make(epochs: int = 1, lease_s: float = 600.0) -> ShardLedger:
    return ShardLedger(ranges=RANGES, epochs=epochs, lease_s=lease_s)


def snapshot(ledger: ShardLedger) -> dict[str, Any]:
    """Everything observable about a ledger, including who holds which lease until when."""
    leases = {i: (lease.worker, lease.deadline, lease.shard) for i, lease in ledger.doing.items()}
    return {**ledger.to_dict(), "todo_only": list(ledger.todo), "leases": leases}


def test_leases_in_order_with_their_rows() -> None:
    ledger = make()
    got = [ledger.lease("w", now=0.0) for _ in RANGES]
    assert got == [Shard(i, s, a, b, 0) for i, (s, a, b) in enumerate(RANGES)]
    assert [shard.rows for shard in got if shard] == [100, 150, 10, 40, 160, 1]
    # Everything is leased: nothing more until a shard comes back, and the job is not finished.
    assert ledger.lease("other", now=0.0) is None
    assert not ledger.finished


def test_complete_only_by_the_leasing_worker_in_the_current_epoch() -> None:
    ledger = make(epochs=2)
    shard = ledger.lease("a", now=0.0)
    assert shard is not None
    before = snapshot(ledger)
    assert not ledger.complete("b", shard.id, 0)  # foreign worker
    assert not ledger.complete("a", shard.id, 1)  # wrong epoch
    assert not ledger.complete("a", shard.id + 1, 0)  # a shard not leased at all
    assert snapshot(ledger) == before
    assert ledger.complete("a", shard.id, 0)
    assert ledger.rows_done == 100
    assert ledger.done == {0}
    # A second report of the same shard is refused and counts nothing.
    assert not ledger.complete("a", shard.id, 0)
    assert ledger.rows_done == 100


def test_report_from_a_previous_epoch_is_refused() -> None:
    ledger = make(epochs=2)
    for _ in RANGES:
        shard = ledger.lease("a", now=0.0)
        assert shard is not None
        assert ledger.complete("a", shard.id, 0)
    assert ledger.epoch == 1
    again = ledger.lease("a", now=0.0)
    assert again == Shard(0, *RANGES[0], epoch=1)
    before = snapshot(ledger)
    # The same worker holds shard 0 again, but a late epoch-0 report must not complete it.
    assert not ledger.complete("a", 0, 0)
    assert snapshot(ledger) == before
    assert ledger.complete("a", 0, 1)


def test_requeue_gives_back_only_that_workers_shards_to_the_front() -> None:
    ledger = make()
    held = {"a": [], "b": []}
    for worker in ["a", "b", "a", "b"]:
        shard = ledger.lease(worker, now=0.0)
        assert shard is not None
        held[worker].append(shard.id)
    assert held == {"a": [0, 2], "b": [1, 3]}
    assert ledger.requeue("a") == [0, 2]
    assert list(ledger.todo) == [0, 2, 4, 5]
    assert {i: lease.worker for i, lease in ledger.doing.items()} == {1: "b", 3: "b"}
    assert ledger.requeue("nobody") == []
    # The given-back shards are leased again first, in id order, to whoever asks.
    next_ids = [ledger.lease("c", now=1.0) for _ in range(3)]
    assert [s.id for s in next_ids if s] == [0, 2, 4]
    # The departed worker's late reports no longer count.
    assert not ledger.complete("a", 0, 0)
    assert ledger.complete("c", 0, 0)
    assert ledger.complete("b", 1, 0)


def test_lease_ages_are_per_holder_and_its_oldest_lease() -> None:
    ledger = make(lease_s=100.0)
    ledger.lease("a", now=0.0)
    ledger.lease("a", now=7.0)
    ledger.lease("b", now=5.0)
    assert ledger.lease_ages(12.0) == {"a": 12.0, "b": 7.0}
    ledger.complete("a", 0, 0)  # its oldest is done: its age is the next one's
    assert ledger.lease_ages(12.0) == {"a": 5.0, "b": 7.0}
    ledger.requeue("b")
    assert ledger.lease_ages(12.0) == {"a": 5.0}


def test_expire_requeues_past_deadline_leases() -> None:
    ledger = make(lease_s=10.0)
    ledger.lease("a", now=0.0)  # deadline 10
    ledger.lease("b", now=5.0)  # deadline 15
    assert ledger.expire(9.99) == []
    assert ledger.expire(10.0) == [0]
    assert list(ledger.todo)[:1] == [0]
    assert set(ledger.doing) == {1}
    # lease() expires too: at t=15 b's lease is over and goes to the front, then is handed out.
    shard = ledger.lease("c", now=15.0)
    assert shard is not None
    assert shard.id == 1
    assert list(ledger.todo) == [0, 2, 3, 4, 5]
    assert not ledger.complete("b", 1, 0)  # stalled worker reports after its lease ended
    assert ledger.rows_done == 0


def test_epochs_advance_only_when_every_shard_is_done() -> None:
    ledger = make(epochs=2)
    shards = [ledger.lease("a", now=0.0) for _ in RANGES]
    for shard in shards[1:]:
        assert shard is not None
        assert ledger.complete("a", shard.id, 0)
    # One shard of epoch 0 is still out: nothing of epoch 1 may be handed out.
    assert ledger.epoch == 0
    assert ledger.lease("b", now=0.0) is None
    assert ledger.complete("a", 0, 0)
    assert ledger.epoch == 1
    assert ledger.done == set()
    first = ledger.lease("b", now=0.0)
    assert first == Shard(0, *RANGES[0], epoch=1)


def test_finishes_after_the_last_epoch() -> None:
    ledger = make(epochs=3)
    assert ledger.total_rows == 3 * ROWS_PER_EPOCH
    while (shard := ledger.lease("a", now=0.0)) is not None:
        assert ledger.complete("a", shard.id, shard.epoch)
    assert ledger.finished
    assert ledger.epoch == 3
    assert ledger.rows_done == ledger.total_rows
    assert not ledger.todo
    assert not ledger.doing


def test_epochs_must_be_positive() -> None:
    with pytest.raises(ValueError, match="epochs"):
        ShardLedger(ranges=RANGES, epochs=0)


def leased_to(ledger: ShardLedger, worker: str) -> list[int]:
    return sorted(i for i, lease in ledger.doing.items() if lease.worker == worker)


def run_workers(
    ledger: ShardLedger,
    rng: random.Random,
    completions: list[tuple[int, int]],
    *,
    workers: tuple[str, ...] = ("w0", "w1", "w2"),
    dies: str | None = None,
    die_after: int = 0,
    stop_after: int | None = None,
    clock: list[float] | None = None,
) -> tuple[dict[str, list[Shard]], list[int]]:
    """Random interleaving of lease/complete by ``workers``.

    Each worker holds up to two leases. ``dies`` disconnects at its first action after
    ``die_after`` steps at which it holds a lease (its shards are requeued) and then reports the
    shards it held anyway, which must all be refused. Now and then the clock jumps past the
    lease time so that every current lease expires. Returns the leases still held and the shard
    ids given back when ``dies`` died.
    """
    now = clock if clock is not None else [0.0]
    held: dict[str, list[Shard]] = {w: [] for w in workers}
    alive = list(workers)
    given_back: list[int] = []
    per_epoch = len(ledger.ranges)
    for step in range(100_000):
        if ledger.finished or (stop_after is not None and step >= stop_after):
            break
        if dies in alive and step >= die_after and leased_to(ledger, dies):
            alive.remove(dies)
            expected = leased_to(ledger, dies)
            given_back = ledger.requeue(dies)
            # Only leases it still holds come back (an expired one may be someone else's now).
            assert given_back == expected
            assert set(given_back) <= {s.id for s in held[dies]}
            assert set(given_back) <= set(ledger.todo)
            for shard in held.pop(dies):
                assert not ledger.complete(dies, shard.id, shard.epoch)
            continue
        if rng.random() < 0.02:
            now[0] += ledger.lease_s * 1.5  # everyone stalls; all current leases expire
        worker = rng.choice(alive)
        mine = held[worker]
        if mine and (len(mine) == 2 or rng.random() < 0.5):
            shard = mine.pop(rng.randrange(len(mine)))
            if ledger.complete(worker, shard.id, shard.epoch):
                completions.append((shard.epoch, shard.id))
        else:
            shard = ledger.lease(worker, now[0])
            if shard is not None:
                # Epoch e + 1 is handed out only after every shard of epoch e was completed.
                assert shard.epoch == ledger.epoch
                if shard.epoch > 0:
                    done_before = sum(1 for e, _ in completions if e == shard.epoch - 1)
                    assert done_before == per_epoch
                mine.append(shard)
        now[0] += 1.0
    return held, given_back


@pytest.mark.parametrize("seed", range(20))
def test_random_interleavings_complete_every_shard_exactly_once(seed: int) -> None:
    rng = random.Random(seed)
    ledger = make(epochs=3, lease_s=25.0)
    completions: list[tuple[int, int]] = []
    _, given_back = run_workers(ledger, rng, completions, dies="w1", die_after=rng.randrange(5, 40))
    assert given_back, "the dying worker should have held a lease"
    assert ledger.finished
    expected = Counter((e, i) for e in range(3) for i in range(len(RANGES)))
    assert Counter(completions) == expected
    assert ledger.rows_done == ledger.total_rows == 3 * ROWS_PER_EPOCH


@pytest.mark.parametrize("seed", range(10))
def test_round_trip_mid_run_resumes_without_repeating(seed: int) -> None:
    rng = random.Random(1000 + seed)
    ledger = make(epochs=2, lease_s=25.0)
    completions: list[tuple[int, int]] = []
    clock = [0.0]
    held, _ = run_workers(ledger, rng, completions, stop_after=rng.randrange(4, 20), clock=clock)
    assert not ledger.finished

    data = json.loads(json.dumps(ledger.to_dict()))  # must survive JSON
    restored = ShardLedger.from_dict(data)
    assert restored.epoch == ledger.epoch
    assert restored.done == ledger.done
    assert restored.rows_done == ledger.rows_done
    assert restored.lease_s == ledger.lease_s
    assert restored.ranges == ledger.ranges
    # Leased shards come back as TODO (ahead of the rest); nothing is leased after a restart.
    assert not restored.doing
    assert list(restored.todo) == sorted(ledger.doing) + list(ledger.todo)
    assert set(restored.todo).isdisjoint(restored.done)
    assert set(restored.todo) | restored.done == set(range(len(RANGES)))
    # The old processes' leases died with the old master: their reports are refused.
    for worker, shards in held.items():
        for shard in shards:
            assert not restored.complete(worker, shard.id, shard.epoch)

    run_workers(restored, rng, completions, workers=("n0", "n1"), clock=clock)
    assert restored.finished
    expected = Counter((e, i) for e in range(2) for i in range(len(RANGES)))
    assert Counter(completions) == expected
    assert restored.rows_done == restored.total_rows


def test_round_trip_of_a_fresh_and_a_finished_ledger() -> None:
    fresh = ShardLedger.from_dict(make(epochs=2).to_dict())
    assert list(fresh.todo) == list(range(len(RANGES)))
    assert fresh.epoch == 0
    assert fresh.rows_done == 0

    done = make(epochs=1)
    while (shard := done.lease("a", now=0.0)) is not None:
        done.complete("a", shard.id, shard.epoch)
    again = ShardLedger.from_dict(done.to_dict())
    assert again.finished
    assert again.lease("a", now=0.0) is None
    assert again.rows_done == again.total_rows


# -- a checkpoint's ledger, cross-checked before it is trusted ---------------------------------


def _progressed(epochs: int, steps: int, seed: int) -> ShardLedger:
    """A ledger after ``steps`` random leases, completions and requeues (workers a, b)."""
    rng = random.Random(seed)
    ledger = make(epochs=epochs)
    for _ in range(steps):
        worker = rng.choice("ab")
        action = rng.random()
        if action < 0.5:
            ledger.lease(worker, now=0.0)
        elif action < 0.9:
            held = [i for i, lease in ledger.doing.items() if lease.worker == worker]
            if held:
                ledger.complete(worker, rng.choice(held), ledger.epoch)
        else:
            ledger.requeue(worker)
    return ledger


def _ints(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path of every integer in a JSON document."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [path]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _ints(v, (*path, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _ints(v, (*path, i))]
    return []


def _set(document: Any, path: tuple[Any, ...], value: int) -> Any:
    copy = json.loads(json.dumps(document))
    target = copy
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return copy


@pytest.mark.parametrize("seed", range(40))
def test_a_checkpoints_ledger_is_restored_as_saved_and_any_flipped_bit_is_refused(
    seed: int,
) -> None:
    """Every state a run reaches round-trips; then each integer of the saved ledger with one
    of its low 8 bits flipped (the range bounds, the epoch, the shard ids, the rows done) is
    refused: none restores a ledger that would train another row or another count."""
    rng = random.Random(seed)
    epochs = rng.choice([1, 2, 3])
    ledger = _progressed(epochs, rng.randrange(0, 60), seed)
    saved = json.loads(json.dumps(ledger.to_dict()))  # through JSON, as in a manifest
    restored = ShardLedger.restored(saved, RANGES, epochs)
    assert restored.to_dict() == ledger.to_dict()
    for path in _ints(saved):
        bit = rng.randrange(8)
        flipped = _set(saved, path, saved_value(saved, path) ^ (1 << bit))
        with pytest.raises(ValueError):
            ShardLedger.restored(flipped, RANGES, epochs)


def saved_value(document: Any, path: tuple[Any, ...]) -> int:
    for key in path:
        document = document[key]
    return int(document)


def test_a_ledger_of_another_split_or_with_nothing_to_lease_is_refused_naming_why() -> None:
    ledger = make()
    saved = ledger.to_dict()
    with pytest.raises(ValueError, match="not this run's split"):
        ShardLedger.restored(saved, (*RANGES[:-1], (1, 200, 202)), 1)
    with pytest.raises(ValueError, match="epoch 0 of 1, this run has 2"):
        ShardLedger.restored(saved, RANGES, 2)
    # epoch 0 with shard 0 done and nothing to lease: the master would wait forever
    stuck = {**saved, "todo": [], "done": [0], "rows_done": 100}
    with pytest.raises(ValueError, match="5 shard\\(s\\) of epoch 0 neither to do nor done"):
        ShardLedger.restored(stuck, RANGES, 1)
    assert ShardLedger.restored(saved, RANGES, 1).to_dict() == saved
