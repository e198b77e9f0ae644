"""Striping of embedding rows over PS: ownership, slots, per-PS row counts, global ids."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlrover_kfp.core.partition import Partition, global_ids, overlap, table_offsets

SIZES = [(r, p) for p in range(1, 8) for r in range(1, 51)]


@pytest.mark.parametrize("num_ps", range(1, 8))
def test_every_gid_has_exactly_one_owner(num_ps: int) -> None:
    part = Partition(50, num_ps)
    gids = np.arange(50, dtype=np.int64)
    owners = part.owner(gids)
    assert owners.min() >= 0
    assert owners.max() < num_ps
    held = np.concatenate([part.gids_of(k) for k in range(num_ps)])
    # Every gid appears in exactly one PS's list, and no PS lists a gid outside [0, R).
    assert np.array_equal(np.sort(held), gids)


def test_rows_on_sums_to_total_rows() -> None:
    for rows, num_ps in SIZES:
        part = Partition(rows, num_ps)
        counts = [part.rows_on(k) for k in range(num_ps)]
        assert sum(counts) == rows, (rows, num_ps, counts)
        assert counts == [len(part.gids_of(k)) for k in range(num_ps)]
        # Striping is balanced: no PS holds more than one row more than another.
        assert max(counts) - min(counts) <= 1


def test_rows_on_when_fewer_rows_than_ps() -> None:
    part = Partition(3, 5)
    assert [part.rows_on(k) for k in range(5)] == [1, 1, 1, 0, 0]
    assert part.gids_of(4).size == 0


def test_slot_and_owner_round_trip() -> None:
    for rows, num_ps in SIZES:
        part = Partition(rows, num_ps)
        gids = np.arange(rows, dtype=np.int64)
        slots, owners = part.slot(gids), part.owner(gids)
        assert np.array_equal(slots * num_ps + owners, gids)
        # Each slot lies inside its owner's local arrays.
        for k in range(num_ps):
            mine = slots[owners == k]
            assert np.all(mine < part.rows_on(k))


def test_gids_of_is_the_owned_gids_in_slot_order() -> None:
    for rows, num_ps in SIZES:
        part = Partition(rows, num_ps)
        gids = np.arange(rows, dtype=np.int64)
        for k in range(num_ps):
            mine = part.gids_of(k)
            assert mine.dtype == np.int64
            assert np.array_equal(mine, gids[part.owner(gids) == k])
            # Position i of PS k's list is the row stored at slot i.
            assert np.array_equal(part.slot(mine), np.arange(len(mine)))


def test_table_offsets_and_global_ids() -> None:
    sizes = [4, 1, 7, 3]
    offsets = table_offsets(sizes)
    assert offsets.dtype == np.int64
    assert offsets.tolist() == [0, 4, 5, 12]
    assert table_offsets([9]).tolist() == [0]

    sparse = np.array([[0, 0, 0, 0], [3, 0, 6, 2], [1, 0, 2, 1]], dtype=np.int64)
    gids = global_ids(sparse, offsets)
    assert gids.tolist() == [[0, 4, 5, 12], [3, 4, 11, 14], [1, 4, 7, 13]]
    # The last id of the last table is the last global row.
    assert gids.max() == sum(sizes) - 1
    # Every (table, id) maps to a distinct global id covering [0, sum(sizes)).
    every = np.concatenate([np.arange(n, dtype=np.int64) + offsets[t] for t, n in enumerate(sizes)])
    assert np.array_equal(every, np.arange(sum(sizes)))


@pytest.mark.parametrize(("rows", "num_ps"), [(0, 1), (1, 0), (-3, 2), (5, -1)])
def test_invalid_partition_raises(rows: int, num_ps: int) -> None:
    with pytest.raises(ValueError, match="partition needs"):
        Partition(rows, num_ps)


@pytest.mark.parametrize("ps", [-1, 3, 10])
def test_rows_on_out_of_range_raises(ps: int) -> None:
    with pytest.raises(ValueError, match="out of range"):
        Partition(10, 3).rows_on(ps)


@pytest.mark.parametrize("ps", [-1, 3, 10])
def test_gids_of_out_of_range_raises(ps: int) -> None:
    # Like rows_on: PS -1 of 3 would otherwise "hold" gid -1 and PS 2's rows [2, 5, 8].
    with pytest.raises(ValueError, match="out of range"):
        Partition(10, 3).gids_of(ps)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=1, max_value=8),
    st.integers(min_value=1, max_value=8),
    st.integers(min_value=1, max_value=500),
)
def test_the_overlaps_of_a_new_ps_cover_its_slots_once_with_the_same_rows(
    old_ps: int, new_ps: int, rows: int
) -> None:
    old, new = Partition(rows, old_ps), Partition(rows, new_ps)
    for k in range(new_ps):
        taken = []
        for j in range(old_ps):
            part = overlap(old, j, new, k)
            old_slots, new_slots = part.slots()
            assert old_slots.dtype == new_slots.dtype == np.int64
            assert len(old_slots) == len(new_slots) == part.count
            # The same global rows on both sides, each held by j before and by k after.
            assert np.array_equal(old_slots * old_ps + j, new_slots * new_ps + k)
            assert np.all(old_slots < old.rows_on(j))
            assert np.all(np.diff(new_slots) > 0)  # new-slot order
            taken.append(new_slots)
        # Every slot of new PS k comes from exactly one old PS.
        assert np.array_equal(np.sort(np.concatenate(taken)), np.arange(new.rows_on(k)))


@pytest.mark.parametrize(("start", "count"), [(0, 3), (2, 4), (5, 100), (40, 5), (0, 0)])
def test_a_slice_of_an_overlap_is_that_slice_of_the_whole(start: int, count: int) -> None:
    part = overlap(Partition(100, 2), 1, Partition(100, 3), 2)
    whole_old, whole_new = part.slots()
    old_slots, new_slots = part.slots(start, count)
    assert np.array_equal(old_slots, whole_old[start : start + count])
    assert np.array_equal(new_slots, whole_new[start : start + count])


def test_overlap_refuses_other_tables_and_unknown_ps() -> None:
    with pytest.raises(ValueError, match="different tables"):
        overlap(Partition(10, 2), 0, Partition(11, 2), 0)
    with pytest.raises(ValueError, match="out of range"):
        overlap(Partition(10, 2), 2, Partition(10, 3), 0)
    with pytest.raises(ValueError, match="out of range"):
        overlap(Partition(10, 2), 0, Partition(10, 3), 3)
