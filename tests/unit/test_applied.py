"""PS 0's tally of rows applied per shard pass (core/applied.py), against a count made
independently: every pass a shard went through, written down whole, then compared."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlrover_kfp.core.applied import AppliedTally, by_cause

BATCH = 4


@st.composite
def histories(draw: st.DrawFn) -> tuple[dict[tuple[int, int], int], list[tuple]]:
    """Per shard a size and its passes: some cut short (a worker stopped after k batches),
    one or two whole (a lease that expired while its holder went on); the pushes of all passes
    interleaved in a random order that keeps each pass's own batches in order (one connection
    each)."""
    sizes: dict[tuple[int, int], int] = {}
    passes: list[list[tuple]] = []
    for shard in range(draw(st.integers(1, 6))):
        key = (draw(st.integers(0, 2)), shard)
        n = draw(st.integers(1, 23))
        sizes[key] = n
        batches = [min(BATCH, n - s) for s in range(0, n, BATCH)]
        cut = draw(st.lists(st.integers(0, len(batches) - 1), max_size=3))
        whole = draw(st.integers(0, len(cut)))
        again = [len(batches)] if draw(st.booleans()) else []  # both reported, one accepted
        lengths = [*cut[:whole], len(batches), *again, *cut[whole:]]
        for length in lengths:
            passes.append(
                [
                    (key, i * BATCH, rows, n, i == len(batches) - 1)
                    for i, rows in enumerate(batches[:length])
                ]
            )
    order = draw(st.permutations([i for i, p in enumerate(passes) for _ in p]))
    cursors = [0] * len(passes)
    pushes = []
    for i in order:
        pushes.append(passes[i][cursors[i]])
        cursors[i] += 1
    return sizes, pushes


@settings(max_examples=300, deadline=None)
@given(histories())
def test_rows_applied_beyond_one_whole_pass_are_counted_exactly(history) -> None:  # type: ignore[no-untyped-def]
    sizes, pushes = history
    tally = AppliedTally()
    for (epoch, shard), offset, rows, n, last in pushes:
        tally.add(epoch, shard, offset, rows, n, last)
    applied: dict[tuple[int, int], int] = {}
    for key, _, rows, _, _ in pushes:
        applied[key] = applied.get(key, 0) + rows
    expected = {k: applied[k] - sizes[k] for k in sizes if applied[k] > sizes[k]}
    assert tally.applied_twice(finished=True) == expected
    # Round trip: what a checkpoint carries gives the same answer.
    again = AppliedTally.from_dict(tally.to_dict())
    assert again.applied_twice(finished=True) == expected


def test_a_pass_cut_short_then_a_whole_one_is_counted_before_the_end() -> None:
    tally = AppliedTally()
    tally.add(0, 7, 0, 4, 10, last=False)  # a worker trained one batch of shard 7, stopped
    assert tally.applied_twice(finished=False) == {}  # could still be the first pass
    assert tally.resume_points(0) == {7: 4}
    for offset, rows in ((0, 4), (4, 4), (8, 2)):  # the shard again, whole, by another worker
        tally.add(0, 7, offset, rows, 10, last=rows == 2)
    assert tally.applied_twice(finished=False) == {(0, 7): 4}
    assert by_cause(tally.applied_twice(finished=True), {(0, 7): "scale-in"}) == {"scale-in": 4}
    assert by_cause({(1, 2): 3}, {}) == {"other": 3}


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {"partial": [[0, 1, 2, 3]]},
        {"partial": "x"},
        {"twice": [[0, 1, -3]]},
        {"whole": [[0]]},
        {"twice": [[0, 1, True]]},
    ],
)
def test_a_malformed_tally_is_refused_by_name(bad: object) -> None:
    with pytest.raises(ValueError, match="applied"):
        AppliedTally.from_dict(bad)


def test_a_pass_resumed_where_the_applied_prefix_ends_applies_nothing_twice() -> None:
    tally = AppliedTally()
    tally.add(2, 3, 0, 4, 10, last=False)
    tally.add(2, 3, 4, 4, 10, last=False)  # in flight at a checkpoint: rows 0-7 applied
    restored = AppliedTally.from_dict(tally.to_dict())
    assert restored.resume_points(2) == {3: 8} and restored.resume_points(1) == {}
    restored.add(2, 3, 8, 2, 10, last=True)  # leased again from row 8
    assert restored.applied_twice(finished=True) == {}
    assert restored.resume_points(2) == {}
    # A cut pass and a pass from the first row overlap: the prefix is the longer one.
    overlap = AppliedTally()
    overlap.add(0, 1, 0, 4, 10, last=False)
    overlap.add(0, 1, 0, 4, 10, last=False)
    overlap.add(0, 1, 4, 4, 10, last=False)
    assert overlap.resume_points(0) == {1: 8}
