"""The one quantity parser (``core/quantity.py``), read by a spec and by the Kubernetes backend.

The expected values are written from Kubernetes' ``resource.Quantity`` grammar (a signed
number, then a binary-SI suffix, a decimal-SI suffix or a decimal exponent), not from running
any parser: the table below is the one the Kubernetes backend's own parser was tested on,
with the grammar's other forms added. A spec's parsers read the same grammar, so where they
accept a string they must say the same amount, rounded to their unit.
"""

from __future__ import annotations

import math
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlrover_kfp.backends.k8s_objects import cpu_quantity, memory_quantity
from dlrover_kfp.core.quantity import (
    MIB,
    parse_cpu,
    parse_memory_mb,
    parse_quantity,
    quantity_cores,
    quantity_mebibytes,
)
from dlrover_kfp.errors import UserInputError

#: Kubernetes quantities and their exact values, from the grammar.
KUBERNETES: list[tuple[str, Decimal]] = [
    # the Kubernetes backend's table (what metrics.k8s.io and the API server write)
    ("250m", Decimal("0.25")),
    ("1", Decimal(1)),
    ("1.5", Decimal("1.5")),
    ("1234567n", Decimal("0.001234567")),
    ("2Gi", Decimal(2 * 2**30)),
    ("512Mi", Decimal(512 * 2**20)),
    ("123456Ki", Decimal(123456 * 2**10)),
    ("1G", Decimal(10**9)),
    ("100M", Decimal(10**8)),
    ("1k", Decimal(1000)),
    ("1e3", Decimal(1000)),
    ("5u", Decimal("0.000005")),
    # the rest of the grammar: zero, signs, "<digits>." and ".<digits>", every suffix
    ("0", Decimal(0)),
    ("+2", Decimal(2)),
    ("-1", Decimal(-1)),
    ("-500m", Decimal("-0.5")),
    (".5", Decimal("0.5")),
    ("5.", Decimal(5)),
    ("0.1m", Decimal("0.0001")),
    ("1.5Gi", Decimal(3 * 2**29)),
    ("1Ti", Decimal(2**40)),
    ("1Pi", Decimal(2**50)),
    ("1Ei", Decimal(2**60)),
    ("7T", Decimal(7 * 10**12)),
    ("3P", Decimal(3 * 10**15)),
    ("1E", Decimal(10**18)),  # a bare E is the exa suffix ...
    ("1E3", Decimal(1000)),  # ... with digits after it, an exponent
    ("1e-3", Decimal("0.001")),
    ("1e+2", Decimal(100)),
    ("25e-2", Decimal("0.25")),
]
NOT_QUANTITIES = [
    "",
    "1.5.5",
    "12X",
    "Mi",
    "--1",
    "1K",
    "1e",
    "e3",
    ".",
    "1kB",
    "1 Gi",
    "1ki",
    "1e3.5",
    "0x10",
]


@pytest.mark.parametrize(("text", "value"), KUBERNETES)
def test_kubernetes_quantities_read_exactly(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value
    # what the Kubernetes backend reads a pod's usage with
    assert quantity_cores(text) == float(value)
    assert quantity_mebibytes(text) == float(value / MIB)


@pytest.mark.parametrize("bad", NOT_QUANTITIES)
def test_what_the_grammar_does_not_hold_is_refused(bad: str) -> None:
    with pytest.raises(UserInputError, match="not a Kubernetes quantity"):
        parse_quantity(bad)


def test_an_exponent_too_large_for_any_amount_says_so() -> None:
    for text in ("1e999999999999", "9e2000000Ei"):
        with pytest.raises(UserInputError, match="too large"):
            parse_quantity(text)
    assert parse_quantity("1e-999999999999") == 0  # far below a nanocore: nothing


@pytest.mark.parametrize(("text", "value"), KUBERNETES)
def test_a_specs_parsers_agree_with_the_kubernetes_reading(text: str, value: Decimal) -> None:
    """Where a spec accepts a quantity it means what Kubernetes means: cores to the nearest
    millicore, memory rounded up to whole MiB. It refuses zero and negative amounts, a CPU
    with a suffix other than m (``1.5k`` cores is a slip), memory in milli/micro/nano bytes."""
    cpu_form = not any(
        text.endswith(s)
        for s in ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "k", "M", "G", "T", "P", "E")
    )
    if value >= Decimal("0.001") and cpu_form:
        assert parse_cpu(text) == float(round(value, 3))
    else:
        with pytest.raises(ValueError, match="CPU"):
            parse_cpu(text)
    if value > 0 and not text.endswith(("m", "u", "n")):
        assert parse_memory_mb(text) == max(1, math.ceil(value / MIB))
    else:
        with pytest.raises(ValueError, match="memory"):
            parse_memory_mb(text)


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(st.integers(1, 10**12))
def test_what_the_kubernetes_objects_write_reads_back(millicores: int) -> None:
    """``cpu_quantity`` / ``memory_quantity`` (a pod's resources) parse back to what they say,
    through the spec's parsers and the backend's readings alike."""
    cores = millicores / 1000
    text = cpu_quantity(cores)
    assert parse_quantity(text) == Decimal(millicores) / 1000
    assert parse_cpu(text) == cores
    assert quantity_cores(text) == cores
    mb = millicores % (2**40) + 1
    text = memory_quantity(mb)
    assert parse_quantity(text) == mb * MIB
    assert parse_memory_mb(text) == mb
    assert quantity_mebibytes(text) == float(mb)
