"""Fuzzing the CPU and memory quantity parsers (``dlrover_kfp.core.quantity``).

Every spec's resources go through them, so any string or number a YAML file can hold must come
out as a positive finite amount or a ``ValueError`` with a message (pydantic turns that into the
spec's keyed error), and what :func:`format_cpu`/:func:`format_memory` write must parse back to
the same amount. The Kubernetes backend reads the API server's quantities with the same
grammar (:func:`parse_quantity`): any text gives a finite value or a ``UserInputError``, and
where a spec's parser accepts a text it says the same amount.
"""

from __future__ import annotations

import math
from decimal import Decimal

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from dlrover_kfp.core.quantity import (
    MAX_CPU_CORES,
    MAX_MEMORY_MB,
    MIB,
    format_cpu,
    format_memory,
    parse_cpu,
    parse_memory_mb,
    parse_quantity,
)
from dlrover_kfp.errors import UserInputError
from tests.fuzz._support import expect_clean, fuzz_settings, time_limit

pytestmark = time_limit(60)

_SUFFIXES = ["", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "m", "u", "i"]
_UNITS = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}

#: Text that looks like a quantity: digits, a dot, an exponent, a suffix, signs and spaces.
quantity_like = st.builds(
    lambda sign, digits, frac, exp, suffix, pad: f"{pad}{sign}{digits}{frac}{exp}{suffix}{pad}",
    st.sampled_from(["", "", "-", "+"]),
    st.text("0123456789", min_size=0, max_size=400),
    st.one_of(st.just(""), st.text("0123456789", max_size=20).map(lambda t: "." + t)),
    st.one_of(
        st.just(""),
        st.tuples(st.sampled_from("eE"), st.sampled_from(["", "+", "-"]), st.integers(0, 999)).map(
            lambda t: f"{t[0]}{t[1]}{t[2]}"
        ),
    ),
    st.sampled_from(_SUFFIXES),
    st.sampled_from(["", " ", "\t", "\n", "\u00a0"]),
)
#: Anything a YAML or JSON document can put where a quantity goes.
any_value = st.one_of(
    quantity_like,
    st.text(max_size=50),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@fuzz_settings()
@given(any_value)
@example("1e308Ei")  # overflowed to infinity inside the unit product: OverflowError
@example(10**400)  # an int too large for a float: OverflowError
@example("9" * 400)  # parses to inf: was reported as "must be positive"
@example("1" * 5000)  # more digits than int() accepts by default
def test_memory_parses_or_says_why(value: object) -> None:
    result = expect_clean(lambda: parse_memory_mb(value), (ValueError,))
    if result is not None:
        assert isinstance(result, int) and not isinstance(result, bool)
        assert 1 <= result <= MAX_MEMORY_MB


@fuzz_settings()
@given(any_value)
@example(10**400)  # OverflowError in float()
@example("9" * 400)  # inf: was reported as "must be positive"
def test_cpu_parses_or_says_why(value: object) -> None:
    result = expect_clean(lambda: parse_cpu(value), (ValueError,))
    if result is not None:
        assert isinstance(result, float)
        assert 0.001 <= result <= MAX_CPU_CORES and math.isfinite(result)
        assert result == round(result, 3)


@fuzz_settings()
@given(st.integers(1, MAX_MEMORY_MB))
@example(MAX_MEMORY_MB)
@example(1024)
@example(1023)
def test_memory_round_trips(memory_mb: int) -> None:
    text = format_memory(memory_mb)
    assert parse_memory_mb(text) == memory_mb
    assert format_memory(parse_memory_mb(text)) == text


@fuzz_settings()
@given(st.integers(1, int(MAX_CPU_CORES * 1000)))
@example(int(MAX_CPU_CORES * 1000))
@example(1)
def test_cpu_round_trips(millis: int) -> None:
    cores = millis / 1000
    text = format_cpu(cores)
    assert parse_cpu(text) == round(cores, 3)
    assert format_cpu(parse_cpu(text)) == text


@fuzz_settings()
@given(
    st.integers(0, 10**6),
    st.integers(0, 999),
    st.sampled_from(sorted(_UNITS)),
)
def test_memory_matches_exact_arithmetic(whole: int, thousandths: int, suffix: str) -> None:
    """A quantity means exactly ``number x unit`` bytes, rounded up to whole MiB (at least 1)."""
    text = f"{whole}.{thousandths:03d}{suffix}"
    exact = Decimal(f"{whole}.{thousandths:03d}") * _UNITS[suffix]
    if exact == 0:
        with pytest.raises(ValueError, match="must be positive"):
            parse_memory_mb(text)
        return
    expected = max(1, math.ceil(exact / MIB))
    if expected > MAX_MEMORY_MB + 1:
        with pytest.raises(ValueError, match="too large"):
            parse_memory_mb(text)
        return
    if expected > MAX_MEMORY_MB:
        return  # on the bound itself float rounding decides; both answers are right
    got = parse_memory_mb(text)
    # Floats carry ~16 digits: allow the rounding-up to land one MiB off on the boundary.
    assert abs(got - expected) <= max(1, expected // 10**12)


def test_too_large_quantities_say_so() -> None:
    """Regression: these overflowed (OverflowError) or called an infinite value "not positive"."""
    for value in ("1e308Ei", "9" * 400, 10**400, float(2**80)):
        with pytest.raises(ValueError, match="too large"):
            parse_memory_mb(value)
    for value in ("9" * 400, 10**400, 1e300):
        with pytest.raises(ValueError, match="too large"):
            parse_cpu(value)


#: What the API server or metrics.k8s.io could send where a quantity goes.
any_text = st.one_of(quantity_like, st.text(max_size=50))


@fuzz_settings()
@given(any_text)
@example("1e" + "9" * 5000)  # an exponent of more digits than int() reads
@example("1e999999999Ei")  # beyond any Decimal context: infinite, "too large"
def test_kubernetes_quantity_parses_or_says_why(text: str) -> None:
    result = expect_clean(lambda: parse_quantity(text), (UserInputError,))
    if result is not None:
        assert isinstance(result, Decimal) and result.is_finite()


@fuzz_settings()
@given(quantity_like)
@example("1.5e3M")
@example(".5Gi")
def test_a_specs_parsers_say_what_the_kubernetes_reading_says(text: str) -> None:
    """One grammar: a spec's amount is the exact Kubernetes value, rounded to its unit."""
    try:
        exact = parse_quantity(text)
    except UserInputError:
        exact = None
    memory = expect_clean(lambda: parse_memory_mb(text), (ValueError,))
    if memory is not None:
        assert exact is not None, text
        assert memory == max(1, math.ceil(exact / MIB)), text
    cpu = expect_clean(lambda: parse_cpu(text), (ValueError,))
    if cpu is not None:
        assert exact is not None, text
        assert cpu == float(round(exact, 3)), text
