"""What every fuzz target shares: the hypothesis profiles and the check of what a parser raised.

Profiles: a short ``ci`` one and an opt-in ``long`` one.

The profiles are applied per test (``@fuzz_settings()``) rather than loaded globally, so that
other property tests in the suite keep their own settings. ``DLROVER_KFP_FUZZ_PROFILE=long``
selects the long run; the default suite runs ``ci``. Neither writes an example database:
the checkout is shared, and every crash found gets an explicit ``@example`` instead.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

PROFILE_ENV = "DLROVER_KFP_FUZZ_PROFILE"
_SUPPRESSED = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

settings.register_profile(
    "ci",
    max_examples=120,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=_SUPPRESSED,
    print_blob=True,
)
settings.register_profile(
    "long",
    max_examples=20_000,
    deadline=None,
    database=None,
    suppress_health_check=_SUPPRESSED,
    print_blob=True,
)

F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R")


def active_profile() -> str:
    name = os.environ.get(PROFILE_ENV, "ci").strip() or "ci"
    if name not in ("ci", "long"):
        raise ValueError(f"{PROFILE_ENV}={name!r}: expected ci or long")
    return name


def time_limit(seconds: float) -> pytest.MarkDecorator:
    """``pytest.mark.timeout`` for a fuzz module: ``seconds`` in the ci profile, enough for
    the long one's ~170x more inputs. A hang still fails (each input has its own deadline)."""
    return pytest.mark.timeout(seconds if active_profile() == "ci" else seconds * 200)


#: Longest one input may take in a pure parser: far above what any takes (milliseconds), so
#: only a hang or a blow-up (quadratic work, a giant allocation) trips it, even on a busy CPU.
PARSER_DEADLINE = timedelta(seconds=2)


def fuzz_settings(
    *, scale: float = 1.0, deadline: timedelta | None = PARSER_DEADLINE
) -> Callable[[F], F]:
    """The active profile for one test. ``scale`` < 1 gives slow targets (a live server) fewer
    examples, in the same proportion in both profiles; ``deadline`` bounds each input (None
    where a server's thread scheduling makes timings meaningless: a socket timeout bounds
    those instead)."""
    profile = settings.get_profile(active_profile())
    examples = max(10, int(profile.max_examples * scale))

    def apply(test: F) -> F:
        decorated: F = settings(profile, max_examples=examples, deadline=deadline)(test)
        return decorated

    return apply


#: What a parser must never let escape, whatever the input: each means a missed check.
UNEXPECTED = (
    KeyError,
    TypeError,
    IndexError,
    AttributeError,
    RecursionError,
    UnicodeError,
    OverflowError,
    MemoryError,
    ZeroDivisionError,
    AssertionError,
)


def expect_clean(call: Callable[[], R], allowed: tuple[type[BaseException], ...]) -> R | None:
    """``call()``'s result, or None when it raised one of ``allowed`` with a message.

    Anything else propagates, so hypothesis shrinks it to the smallest input. An allowed error
    still fails if it is also one of :data:`UNEXPECTED` (a ``UnicodeDecodeError`` is a
    ``ValueError`` too) or carries no message a user could act on.
    """
    try:
        return call()
    except allowed as exc:
        if isinstance(exc, UNEXPECTED):
            raise
        assert str(exc).strip(), f"{type(exc).__name__} without a message"
        return None


# ------------------------------------------------------------------------- documents and bytes

#: JSON-like leaves, with the awkward ones: huge ints, NaN, infinities, odd text.
json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["", "0", "-1", "8Gi", "500m", "1e400", "NaN", "synthetic", "criteo"]),
)

#: Arbitrary nested documents (what ``json.loads``/``yaml.safe_load`` can return, and more).
json_values = st.recursive(
    json_leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text(max_size=12), children, max_size=5),
    ),
    max_leaves=25,
)


def paths(doc: object, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside ``doc`` (dict keys and list indices), the root first."""
    found = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            found += paths(value, (*prefix, index))
    return found


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


@st.composite
def mutated(draw: st.DrawFn, valid: object, *, max_edits: int = 3) -> object:
    """``valid`` (a JSON-like document) with 1..max_edits random edits: a value replaced by any
    value, a key dropped or renamed, an unknown key added, a list emptied, grown or cut, a
    value wrapped in a list or a mapping."""
    doc = copy.deepcopy(valid)
    for _ in range(draw(st.integers(1, max_edits))):
        path = draw(st.sampled_from(paths(doc)))
        target = _get(doc, path)
        choice = draw(st.integers(0, 6))
        if not path or choice == 0:
            new = draw(json_values)
            if not path:
                doc = new
                continue
            _get(doc, path[:-1])[path[-1]] = new
        elif choice == 1:
            parent = _get(doc, path[:-1])
            del parent[path[-1]]
        elif choice == 2 and isinstance(target, dict):
            target[draw(st.text(max_size=12))] = draw(json_values)
        elif choice == 3 and isinstance(target, dict) and target:
            key = draw(st.sampled_from(sorted(target, key=str)))
            target[draw(st.text(max_size=12))] = target.pop(key)
        elif choice == 4 and isinstance(target, list):
            cut: bool = draw(st.booleans())
            if target and cut:
                del target[draw(st.integers(0, len(target) - 1)) :]
            else:
                target.extend(draw(st.lists(json_leaves, min_size=1, max_size=3)))
        elif choice == 5:
            _get(doc, path[:-1])[path[-1]] = draw(st.sampled_from([[target], {"x": target}]))
        else:
            _get(doc, path[:-1])[path[-1]] = draw(json_leaves)
    return doc


def deep_nesting(depth: int, kind: str = "[") -> str:
    """Text nested ``depth`` levels deep (``[[[...]]]`` or ``{"a":{"a":...}}``)."""
    if kind == "[":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


def assert_clean_error(exc: BaseException) -> None:
    """An error a target raised on purpose: none of :data:`UNEXPECTED`, and with a message."""
    assert not isinstance(exc, UNEXPECTED), f"{type(exc).__name__}: {exc}"
    assert str(exc).strip(), f"{type(exc).__name__} without a message"
