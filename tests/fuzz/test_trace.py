"""Fuzzing the simulator's trace reader (``sim.cluster.trace.read_trace``).

``dlrover-kfp simulate --trace FILE`` replays a user's JSON Lines trace: an optional header,
then one job per line with its spec and hidden truth. Any file must become a list of jobs the
simulator can run, or a :class:`UserInputError` naming ``<file>:<line>``.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from dlrover_kfp.core.documents import to_dict
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.sim.cluster.trace import (
    TraceHeader,
    manual_jct,
    manual_throughput,
    read_trace,
    synthetic_trace,
)
from tests.fuzz._support import (
    assert_clean_error,
    deep_nesting,
    fuzz_settings,
    json_values,
    mutated,
    time_limit,
)

pytestmark = time_limit(180)

_JOBS = synthetic_trace(2, seed=0) + synthetic_trace(1, seed=0, family="roofline")
JOBS: list[dict[str, Any]] = [to_dict(job) for job in _JOBS]
JOBS[2]["id"] = "job-roofline"
HEADER = json.dumps(to_dict(TraceHeader(description="fuzz")))


def _with(path: tuple[Any, ...], value: object) -> str:
    doc = json.loads(json.dumps(JOBS[0]))
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return json.dumps(doc)


lines = st.one_of(
    st.sampled_from([json.dumps(job) for job in JOBS]),
    st.sampled_from(JOBS).flatmap(mutated).map(json.dumps),
    st.just(HEADER),
    mutated(json.loads(HEADER)).map(json.dumps),
    json_values.map(json.dumps),
    st.text(max_size=30),
    st.sampled_from(["", "1" * 5000, deep_nesting(100_000), '{"trace_version": true}']),
)


@fuzz_settings()
@given(st.lists(lines, max_size=4))
@example([_with(("arrival_s",), float("inf"))])
@example([_with(("truth", "throughput", "base"), float("nan"))])
@example([_with(("truth", "memory", "worker_mb"), float("inf"))])
@example([_with(("spec", "data", "rows"), 10**400)])
@example([_with(("spec", "training", "epochs"), 10**400)])
@example([HEADER, HEADER])
@example(['{"trace_version": 1.0}'])
def test_trace_reads_or_names_the_line(
    tmp_path_factory: pytest.TempPathFactory, content: list[str]
) -> None:
    path = tmp_path_factory.getbasetemp() / "trace.jsonl"
    path.write_text("\n".join(content), encoding="utf-8", errors="surrogatepass")
    try:
        jobs = read_trace(path)
    except UserInputError as exc:
        assert str(exc).startswith(f"{path}:"), str(exc)
        assert_clean_error(exc)
        return
    # Accepted: every job is one the simulator can start (finite arrival, a manual JCT).
    assert [j.arrival_s for j in jobs] == sorted(j.arrival_s for j in jobs)
    assert len({j.id for j in jobs}) == len(jobs)
    for job in jobs:
        assert math.isfinite(job.arrival_s)
        assert job.total_samples > 0
        assert math.isfinite(manual_throughput(job)) and manual_throughput(job) >= 0
        manual_jct(job)


def test_non_finite_arrival_is_a_user_error(tmp_path: pytest.TempPathFactory) -> None:
    """Regression: ``Infinity`` and ``NaN`` (Python's JSON reads them) were accepted as an
    arrival time and in the hidden truth, where the simulator's arithmetic then ran on them."""
    cases = {
        ("arrival_s",): "arrival_s",
        ("truth", "throughput", "base"): "truth.throughput.base",
        ("truth", "memory", "worker_mb"): "truth.memory.worker_mb",
    }
    for key, message in cases.items():
        path = tmp_path / "t.jsonl"  # type: ignore[operator]
        path.write_text(_with(key, float("inf")) + "\n")
        with pytest.raises(UserInputError, match=message):
            read_trace(path)
