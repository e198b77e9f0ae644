"""Fuzzing profile import: JSON Lines -> ``JobProfile`` -> the history's own checks.

``dlrover-kfp history import FILE`` reads every line with ``read_jsonl`` (parse, then
``checked_summary``, the check every store makes before it writes) and stores them in one
transaction. A profile file may come from another version, another tool or a hand edit: every
line must become a stored profile or a :class:`UserInputError` naming ``<file>:<line>``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from dlrover_kfp.core.documents import parse, to_dict
from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.history.jsonl import import_jsonl, read_jsonl
from dlrover_kfp.history.memory import InMemoryHistoryStore
from dlrover_kfp.history.validation import checked_summary
from tests.factories import make_profile
from tests.fuzz._support import (
    assert_clean_error,
    deep_nesting,
    fuzz_settings,
    json_values,
    mutated,
    time_limit,
)

pytestmark = time_limit(120)

VALID: dict[str, Any] = to_dict(make_profile("run-1", samples=3, oom_events=1))
SHORT: dict[str, Any] = to_dict(make_profile("run-2", samples=0, with_request=False))


def check_profile_document(doc: object) -> None:
    """A document is a profile the history accepts, or an error naming the source."""
    try:
        profile = parse(JobProfile, doc, "p.json")
        summary = checked_summary(profile, "p.json")
    except UserInputError as exc:
        assert str(exc).startswith("p.json: "), str(exc)
        assert_clean_error(exc)
        return
    # Accepted: what the store computes from it is finite, and the profile round-trips.
    assert math.isfinite(summary.started_at)
    assert math.isfinite(summary.jct_seconds)
    for value in (summary.peak_worker_cpu, summary.peak_ps_cpu, summary.mean_worker_cpu):
        assert math.isfinite(value)
    for obs in summary.observations:
        assert math.isfinite(obs.throughput) and obs.throughput >= 0
    assert parse(JobProfile, to_dict(profile), "p.json") == profile


def _with(path: tuple[Any, ...], value: object, base: dict[str, Any] = VALID) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(base))
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


@fuzz_settings()
@given(st.one_of(mutated(VALID), mutated(SHORT)))
@example(_with(("started_at",), "2026-99-01"))
@example(_with(("started_at",), "9999-12-31T23:59:59-23:59"))  # past datetime's range
@example(_with(("started_at",), "0001-01-01T00:00:00+23:59"))
@example(_with(("samples", 0, "throughput"), float("inf")))
@example(_with(("samples", 1, "time"), float("inf")))
@example(_with(("outcome", "jct_seconds"), float("inf")))
@example(_with(("samples", 0, "nodes", 0, "cpu_used"), float("inf")))
@example(_with(("job", "data", "rows"), 10**400))
@example(_with(("job", "model", "table_sizes"), [10**400]))
def test_mutated_profile_is_accepted_or_rejected_cleanly(doc: object) -> None:
    check_profile_document(doc)


@fuzz_settings()
@given(json_values)
def test_any_document_is_a_profile_or_an_error(doc: object) -> None:
    check_profile_document(doc)


#: Lines of a JSONL file: valid profiles, mutated ones, arbitrary JSON, arbitrary text.
lines = st.one_of(
    st.just(json.dumps(VALID)),
    mutated(VALID).map(lambda d: json.dumps(d, allow_nan=True)),
    json_values.map(lambda d: json.dumps(d, allow_nan=True)),
    st.text(max_size=40),
    st.sampled_from(["", "   ", "1" * 5000, deep_nesting(5000), "[" * 50000, '"\\ud800"']),
)


@fuzz_settings()
@given(st.lists(lines, max_size=4), st.sampled_from(["\n", "\r\n"]))
@example(["1" * 5000], "\n")  # json.loads: int > 4300 digits raised a bare ValueError
@example([deep_nesting(100_000)], "\n")  # json.loads: RecursionError
@example([json.dumps(VALID), json.dumps(VALID)], "\n")  # one run_id twice
def test_history_import_accepts_or_names_the_line(
    tmp_path_factory: pytest.TempPathFactory, content: list[str], newline: str
) -> None:
    path = tmp_path_factory.getbasetemp() / "import.jsonl"
    path.write_bytes(newline.join(content).encode("utf-8", "surrogatepass"))
    store = InMemoryHistoryStore()
    try:
        new, skipped = import_jsonl(store, path)
    except UserInputError as exc:
        assert str(exc).startswith(f"{path}:"), str(exc)
        assert_clean_error(exc)
        assert list(store.iter_profiles()) == []  # all or nothing
        return
    assert new + skipped == len(read_jsonl(path))
    assert len(list(store.iter_profiles())) == new


def test_bad_json_lines_are_user_errors(tmp_path: Path) -> None:
    """Regression: a 5000-digit number and deep nesting escaped ``iter_json_lines`` as a bare
    ValueError and a RecursionError."""
    for text in ("1" * 5000, deep_nesting(100_000)):
        path = tmp_path / "bad.jsonl"
        path.write_text(text + "\n")
        with pytest.raises(UserInputError, match=r"bad\.jsonl:1: "):
            read_jsonl(path)


@pytest.mark.parametrize(
    ("path", "field"),
    [
        (("samples", 0, "throughput"), r"samples\[0\]\.throughput"),
        (("samples", 1, "time"), r"samples\[1\]\.time"),
        (("samples", 0, "nodes", 0, "cpu_used"), r"samples\[0\]\.nodes\[0\]\.cpu_used"),
        (("outcome", "jct_seconds"), r"outcome\.jct_seconds"),
    ],
)
@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_numbers_are_user_errors(
    path: tuple[Any, ...], field: str, value: float
) -> None:
    """Regression: ``Infinity`` (valid in Python's JSON) reached the summary as an infinite
    throughput, which the planner would fit on, and NaN would make SQLite refuse the row. The
    contract's float types refuse them (``core.types``), naming the field."""
    with pytest.raises(UserInputError, match=rf"^p\.json: {field}: .*finite number"):
        parse(JobProfile, _with(path, value), "p.json")
