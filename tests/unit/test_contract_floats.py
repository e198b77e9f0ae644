"""Every float of a plan or profile contract is finite (``core.types``, ``core.plan``).

Python's JSON reads ``Infinity`` and ``NaN``, so a plan or profile document can carry them; an
infinite CPU, time or throughput (or a NaN, which passes no comparison) would reach the
planner's arithmetic, the simulator or a SQL column. Each is refused, with an error that names
the field: pydantic's ``ValidationError`` when a contract is built in Python, a one-line
``SpecError`` naming the file and the key when a document is parsed.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dlrover_kfp.core.documents import parse
from dlrover_kfp.core.plan import MAX_PODS, NodeAction, NodeGroup, ResourcePlan
from dlrover_kfp.core.profile import (
    AppliedPlan,
    JobEvent,
    Metrics,
    NodeSample,
    Outcome,
    ProfileTraining,
    RuntimeSample,
)
from dlrover_kfp.core.quantity import MAX_CPU_CORES, MAX_MEMORY_MB
from dlrover_kfp.core.spec import NodeRequest, Quota, TrainingSpec
from dlrover_kfp.errors import SpecError

GROUP: dict[str, Any] = {"count": 2, "cpu": 1.5, "memory_mb": 2048}
PLAN: dict[str, Any] = {
    "workers": GROUP,
    "ps": {"count": 1, "cpu": 2.0, "memory_mb": 4096},
    "stage": "warm_start",
    "reason": "test",
    "predicted_throughput": 1234.5,
}
NODE: dict[str, Any] = {
    "name": "worker-0",
    "role": "worker",
    "cpu_used": 1.2,
    "cpu_requested": 1.5,
    "memory_used_mb": 900,
    "memory_requested_mb": 2048,
    "throughput": 300.0,
}
SAMPLE: dict[str, Any] = {
    "time": 12.5,
    "global_step": 40,
    "throughput": 600.0,
    "workers": 2,
    "ps": 1,
    "worker_cpu": 1.5,
    "ps_cpu": 2.0,
    "nodes": [NODE],
}

#: (contract, a valid document of it, the path of one float field in it, the key a message shows)
FIELDS: list[tuple[type[Any], dict[str, Any], tuple[Any, ...], str]] = [
    (NodeGroup, GROUP, ("cpu",), "cpu"),
    (
        NodeAction,
        {"kind": "relaunch", "node": "ps-0", "reason": "oom", "cpu": 2.0},
        ("cpu",),
        "cpu",
    ),
    (ResourcePlan, PLAN, ("workers", "cpu"), "workers.cpu"),
    (ResourcePlan, PLAN, ("ps", "cpu"), "ps.cpu"),
    (ResourcePlan, PLAN, ("predicted_throughput",), "predicted_throughput"),
    (NodeSample, NODE, ("cpu_used",), "cpu_used"),
    (NodeSample, NODE, ("cpu_requested",), "cpu_requested"),
    (NodeSample, NODE, ("throughput",), "throughput"),
    (RuntimeSample, SAMPLE, ("time",), "time"),
    (RuntimeSample, SAMPLE, ("throughput",), "throughput"),
    (RuntimeSample, SAMPLE, ("worker_cpu",), "worker_cpu"),
    (RuntimeSample, SAMPLE, ("ps_cpu",), "ps_cpu"),
    (RuntimeSample, SAMPLE, ("nodes", 0, "cpu_used"), "nodes[0].cpu_used"),
    (
        AppliedPlan,
        {"time": 3.0, "stage": "auto_scale", "reason": "r", "workers": GROUP, "ps": GROUP},
        ("time",),
        "time",
    ),
    (JobEvent, {"time": 3.0, "kind": "scale"}, ("time",), "time"),
    (
        Outcome,
        {"status": "succeeded", "jct_seconds": 60.0, "samples_processed": 10},
        ("jct_seconds",),
        "jct_seconds",
    ),
    (
        ProfileTraining,
        {"batch_size": 64, "epochs": 1, "learning_rate": 0.1},
        ("learning_rate",),
        "learning_rate",
    ),
    (TrainingSpec, {"batch_size": 64, "learning_rate": 0.1}, ("learning_rate",), "learning_rate"),
]
NON_FINITE = [math.inf, -math.inf, math.nan]


def _with(doc: dict[str, Any], path: tuple[Any, ...], value: object) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(doc))
    node: Any = copy
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return copy


IDS = [f"{cls.__name__}.{key}" for cls, _, _, key in FIELDS]


@pytest.mark.parametrize(("cls", "doc", "path", "key"), FIELDS, ids=IDS)
def test_the_valid_documents_are_valid(
    cls: type[Any], doc: dict[str, Any], path: tuple[Any, ...], key: str
) -> None:
    parse(cls, doc, "doc.json")
    cls(**doc)


@pytest.mark.parametrize("value", NON_FINITE, ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize(("cls", "doc", "path", "key"), FIELDS, ids=IDS)
def test_a_non_finite_float_is_refused_naming_the_field(
    cls: type[Any], doc: dict[str, Any], path: tuple[Any, ...], key: str, value: float
) -> None:
    bad = _with(doc, path, value)
    # Built in Python (the runtime, the planner): a ValidationError at the field's location.
    with pytest.raises(ValidationError) as info:
        cls(**bad)
    errors = info.value.errors()
    assert any(tuple(e["loc"]) == path for e in errors), errors
    # Parsed from a document (a file, a KFP artifact): one line naming the file and the key.
    with pytest.raises(SpecError, match=rf"^doc\.json: {re.escape(key)}: .*finite number"):
        parse(cls, bad, "doc.json")


@pytest.mark.parametrize(
    ("cls", "doc", "path", "value"),
    [
        (NodeGroup, GROUP, ("cpu",), MAX_CPU_CORES * 10),
        (NodeGroup, GROUP, ("memory_mb",), MAX_MEMORY_MB + 1),
        (NodeGroup, GROUP, ("memory_mb",), 10**400),
        (NodeGroup, GROUP, ("count",), MAX_PODS + 1),
        (NodeGroup, GROUP, ("count",), 10**400),  # total_cpu raised OverflowError
        (NodeSample, NODE, ("cpu_used",), 1e308),
        (NodeSample, NODE, ("memory_used_mb",), 10**400),
        (ResourcePlan, PLAN, ("predicted_throughput",), -1.0),
        (ResourcePlan, PLAN, ("predicted_throughput",), "1234.5"),  # strict: a number
    ],
    ids=[
        "cpu-1e13",
        "memory-2^53+1",
        "memory-400-digits",
        "count-2^53+1",
        "count-400-digits",
        "cpu_used-1e308",
        "memory_used-400-digits",
        "predicted-negative",
        "predicted-string",
    ],
)
def test_absurd_values_are_refused_naming_the_field(
    cls: type[Any], doc: dict[str, Any], path: tuple[Any, ...], value: object
) -> None:
    with pytest.raises(SpecError, match=rf"^doc\.json: {re.escape('.'.join(map(str, path)))}: "):
        parse(cls, _with(doc, path, value), "doc.json")


@pytest.mark.parametrize(
    "value", [*NON_FINITE, MAX_CPU_CORES * 10], ids=["inf", "-inf", "nan", "1e13"]
)
@pytest.mark.parametrize(
    ("cls", "doc"),
    [
        (NodeRequest, {"count": 1, "cpu": 1, "memory": "1Gi"}),
        (Quota, {"cpu": 8, "memory": "16Gi"}),
    ],
)
def test_a_specs_cpu_is_finite_and_bounded(
    cls: type[Any], doc: dict[str, Any], value: float
) -> None:
    """A spec's CPU (``Cores``) goes through ``parse_cpu``, which bounds it already."""
    with pytest.raises(SpecError, match=r"^doc\.json: cpu: CPU (must be positive|is too large)"):
        parse(cls, {**doc, "cpu": value}, "doc.json")


def test_the_bounds_themselves_are_accepted() -> None:
    group = parse(
        NodeGroup, {"count": MAX_PODS, "cpu": MAX_CPU_CORES, "memory_mb": MAX_MEMORY_MB}, "g.json"
    )
    assert math.isfinite(group.total_cpu) and group.total_memory_mb == MAX_PODS * MAX_MEMORY_MB
    assert parse(NodeGroup, {"count": 0, "cpu": 0, "memory_mb": 0}, "g.json").cpu == 0.0


def test_a_diverged_runs_nan_loss_is_still_recorded() -> None:
    """Losses are measurements, not resources: a diverging run's NaN loss is news for its
    report (the master accepts it on purpose), so the loss fields keep any float."""
    sample = parse(RuntimeSample, {**SAMPLE, "loss": math.nan}, "s.json")
    assert sample.loss is not None and math.isnan(sample.loss)
    metrics = parse(Metrics, {"loss": math.nan, "train_loss": math.inf}, "m.json")
    assert metrics.loss is not None and math.isnan(metrics.loss)


@settings(max_examples=200, deadline=None, database=None, derandomize=True)
@given(
    st.sampled_from(FIELDS),
    st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(NON_FINITE),
)
def test_any_float_is_accepted_finite_or_refused_naming_the_field(
    field: tuple[type[Any], dict[str, Any], tuple[Any, ...], str], value: float
) -> None:
    cls, doc, path, key = field
    try:
        result = parse(cls, _with(doc, path, value), "doc.json")
    except SpecError as exc:
        assert str(exc).startswith(f"doc.json: {key}: "), str(exc)
        return
    assert math.isfinite(value) and value >= 0
    node: Any = result
    for part in path:
        node = node[part] if isinstance(part, int) else getattr(node, part)
    assert node == value
