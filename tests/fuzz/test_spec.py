"""Fuzzing the job spec parser: ``load_text`` + ``parse(JobSpec, ...)`` and ``read_document``.

A spec is the one document every user writes by hand, for the CLI, KFP and Airflow alike.
Whatever its text, the parser must answer with a :class:`JobSpec` or a :class:`SpecError` /
:class:`UserInputError` naming the file (and, for a bad key, the key): never a traceback.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from dlrover_kfp.core.documents import load_text, parse, to_dict
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.errors import SpecError, UserInputError
from dlrover_kfp.files import read_document
from tests.fuzz._support import (
    assert_clean_error,
    deep_nesting,
    expect_clean,
    fuzz_settings,
    json_values,
    mutated,
    time_limit,
)

pytestmark = time_limit(120)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "jobs"
SOURCE = "job.yaml"
SMALL: dict[str, Any] = yaml.safe_load((EXAMPLES / "small.yaml").read_text())
PRODUCTION: dict[str, Any] = yaml.safe_load((EXAMPLES / "production.yaml").read_text())

#: Text with YAML's structure characters, tags, anchors and scalars that resolve to odd types.
yaml_like = st.lists(
    st.one_of(
        st.sampled_from(
            [
                "name: ",
                "model:",
                "  table_sizes: ",
                "[",
                "]",
                "{",
                "}",
                ", ",
                ": ",
                "- ",
                "\n",
                "\n  ",
                "&a ",
                "*a",
                "<<: ",
                "!!binary ",
                "!!set ",
                "!!omap ",
                "!!python/",
                "? ",
                "---\n",
                "...\n",
                "'",
                '"',
                "#",
                "|\n  ",
                ">\n  ",
                "%YAML 1.1\n",
                "\t",
                "2001-13-45",
                "2001-01-01 25:00:00",
                "0x",
                "0o",
                "0b",
                "1_000",
                "1e400",
                ".nan",
                ".inf",
                "~",
                "null",
                "yes",
                "8Gi",
                "500m",
                "9" * 50,
                "\ufeff",
                "\x85",
                "\u2028",
            ]
        ),
        st.text(max_size=8),
        st.integers().map(str),
    ),
    max_size=30,
).map("".join)


def check_spec_text(text: str) -> None:
    """The property of every text input: a JobSpec, or a SpecError that names the source."""
    try:
        spec = parse(JobSpec, load_text(text, SOURCE), SOURCE)
    except SpecError as exc:
        assert str(exc).startswith(SOURCE), str(exc)
        assert_clean_error(exc)
        return
    assert parse(JobSpec, to_dict(spec), SOURCE) == spec


@fuzz_settings()
@given(st.one_of(yaml_like, st.text(max_size=200)))
@example("a: " + "1" * 5000)  # int() refuses > 4300 digits: a bare ValueError escaped
@example("a: 0x" + "f" * 5000)
@example("a: 2001-13-45")  # YAML timestamp with a month of 13: a bare ValueError escaped
@example(deep_nesting(5000))  # RecursionError in the YAML composer
@example(deep_nesting(3000, "{"))
@example("[" * 10000)
@example("!!python/object:os.system x")
def test_any_text_is_a_spec_or_a_spec_error(text: str) -> None:
    check_spec_text(text)


@fuzz_settings()
@given(json_values)
@example({"name": "a", "model": {"table_sizes": [10**400]}, "data": {}, "training": {}})
def test_any_document_is_a_spec_or_a_spec_error(doc: object) -> None:
    expect_clean(lambda: parse(JobSpec, doc, SOURCE), (SpecError,))


def _with(doc: dict[str, Any], path: tuple[str, ...], value: object) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


@fuzz_settings()
@given(st.one_of(mutated(SMALL), mutated(PRODUCTION)))
# Regressions: numbers beyond a float's range reached float arithmetic in the quota check.
@example(_with(SMALL, ("model", "table_sizes"), [10**400]))
@example(_with(SMALL, ("resources", "workers", "count"), 10**400))
@example(_with(SMALL, ("resources", "limits", "memory"), 10**400))
@example(_with(SMALL, ("training", "batch_size"), 10**400))
@example(_with(SMALL, ("model", "embedding_dim"), 10**400))
def test_mutated_spec_is_a_spec_or_names_the_key(doc: object) -> None:
    try:
        spec = parse(JobSpec, doc, SOURCE)
    except SpecError as exc:
        message = str(exc)
        assert message.startswith(f"{SOURCE}: "), message
        assert_clean_error(exc)
        return
    # Accepted: it must survive its own round trip unchanged (what the CLI writes back).
    assert parse(JobSpec, to_dict(spec), SOURCE) == spec


@fuzz_settings()
@given(st.one_of(st.binary(max_size=300), yaml_like.map(lambda t: t.encode("utf-8", "replace"))))
@example(b"\xff\xfe")
@example(b"a: \xed\xa0\x80")  # an encoded surrogate: not UTF-8
@example(deep_nesting(5000).encode())
def test_read_document_never_crashes(tmp_path_factory: pytest.TempPathFactory, raw: bytes) -> None:
    path = tmp_path_factory.getbasetemp() / "spec.yaml"
    path.write_bytes(raw)
    try:
        read_document(JobSpec, path)
    except UserInputError as exc:
        assert str(path) in str(exc), str(exc)
        assert_clean_error(exc)


def test_huge_numbers_in_a_spec_name_the_key() -> None:
    """Regression: these raised OverflowError (a traceback) instead of a keyed SpecError."""
    cases = {
        ("model", "table_sizes"): [10**400],
        ("resources", "workers", "count"): 10**400,
        ("resources", "limits", "memory"): 10**400,
        ("training", "batch_size"): 10**400,
    }
    for path, value in cases.items():
        with pytest.raises(SpecError, match=path[-1]):
            parse(JobSpec, _with(SMALL, path, value), SOURCE)


def test_malformed_yaml_scalars_are_spec_errors() -> None:
    """Regression: YAML scalars that resolve to out-of-range values raised a bare ValueError,
    and deep nesting a RecursionError."""
    for text in ("a: " + "1" * 5000, "a: 2001-13-45", deep_nesting(5000)):
        with pytest.raises(SpecError, match=f"^{SOURCE}"):
            load_text(text, SOURCE)
