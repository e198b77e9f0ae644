"""Fuzzing the fitted resource-model file reader and the samples CSV (``core.model_io``).

``dlrover-kfp model predict --model FILE`` and warm start read model files that ``model fit``
wrote, possibly in an older form (v1, v2) or edited by hand; ``model fit`` reads a CSV of
measurements. Either gives a model / observations, or a :class:`UserInputError` naming the
source and the key, line or column.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from dlrover_kfp.cli.model_cmd import load_model
from dlrover_kfp.core.model_io import (
    CSV_COLUMNS,
    FORM_V1,
    FORM_V2,
    model_from_dict,
    model_to_dict,
    observations_from_csv,
)
from dlrover_kfp.core.observation import Config
from dlrover_kfp.errors import UserInputError
from tests.fuzz._support import (
    assert_clean_error,
    expect_clean,
    fuzz_settings,
    json_values,
    mutated,
    time_limit,
)

pytestmark = time_limit(120)

FITTED = Path(__file__).resolve().parents[2] / "benchmarks" / "data"
#: The fitted models committed with the resource-curve benchmark (additive and overlap forms).
_FORMS = json.loads((FITTED / "resource_curves_small.fit.json").read_text())["forms"]
V3: dict[str, Any] = _FORMS[-1]["model"]
V3_ADDITIVE: dict[str, Any] = _FORMS[0]["model"]


def _older(form: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(V3_ADDITIVE))
    doc["form"] = form
    del doc["overlap"]
    if doc["diagnostics"] is not None:
        del doc["diagnostics"]["overlap_searched"]
    if form == FORM_V1:
        del doc["gamma"]
        del doc["pinned"]["gamma"]
        if doc["diagnostics"] is not None:
            del doc["diagnostics"]["identifiable"]["gamma"]
    return doc


V2, V1 = _older(FORM_V2), _older(FORM_V1)


def check_model_document(doc: object) -> None:
    try:
        model = model_from_dict(doc, "model.json")
    except UserInputError as exc:
        assert str(exc).startswith("model.json: "), str(exc)
        assert_clean_error(exc)
        return
    # A model read is one the planner can use: finite, positive predictions...
    throughput = model.throughput(Config(workers=4, ps=2, worker_cpu=4.0, ps_cpu=2.0), 512)
    assert math.isfinite(throughput) and throughput > 0
    # ... and one that writes back to a file that reads as the same model.
    assert model_from_dict(model_to_dict(model), "model.json") == model


def _with(key: str, value: object, base: dict[str, Any] = V3) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(base))
    doc[key] = value
    return doc


@fuzz_settings()
@given(st.one_of(mutated(V3), mutated(V3_ADDITIVE), mutated(V2), mutated(V1)))
@example(_with("gamma", 1e308))  # γ so large that the prediction overflows
@example(_with("gamma", 1e-300))
@example(_with("theta", dict.fromkeys(V3["theta"], 1e308)))
@example(_with("theta", dict.fromkeys(V3["theta"], 10**400)))
@example(_with("theta", {**dict.fromkeys(V3["theta"], 0), next(iter(V3["theta"])): 5e-324}))
def test_mutated_model_file_reads_or_names_the_key(doc: object) -> None:
    check_model_document(doc)


@fuzz_settings()
@given(json_values)
def test_any_document_is_a_model_or_an_error(doc: object) -> None:
    check_model_document(doc)


@fuzz_settings()
@given(st.one_of(st.text(max_size=200), json_values.map(json.dumps), mutated(V3).map(json.dumps)))
@example('{"gamma": ' + "9" * 5000 + "}")  # json.loads: ValueError, over int()'s 4300 digits
@example("[" * 100_000)  # json.loads: RecursionError
@example('{"theta": {"a": ' + "[" * 100_000 + "}}")
@example(json.dumps(V3))
def test_model_file_reads_or_names_the_file(
    tmp_path_factory: pytest.TempPathFactory, text: str
) -> None:
    """``model predict --model FILE`` (``cli.model_cmd.load_model``): any file content is a
    model or a UserInputError naming the file."""
    path = tmp_path_factory.getbasetemp() / "model.json"
    path.write_text(text, encoding="utf-8")
    model = expect_clean(lambda: load_model(str(path)), (UserInputError,))
    if model is None:
        with pytest.raises(UserInputError) as info:
            load_model(str(path))
        assert str(info.value).startswith(f"{path}"), str(info.value)
        assert_clean_error(info.value)


cells = st.one_of(
    st.integers(-5, 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", " ", "500m", "1e400", "nan", "inf", "9" * 5000, "0x10", "1_000", '"']),
    st.text(max_size=8),
)
rows = st.lists(cells, min_size=0, max_size=8).map(",".join)
headers = st.one_of(
    st.permutations(list(CSV_COLUMNS)).map(",".join),
    st.lists(st.sampled_from([*CSV_COLUMNS, "x", ""]), max_size=8).map(",".join),
)


@fuzz_settings()
@given(headers, st.lists(rows, max_size=5), st.sampled_from(["\n", "\r\n", "\r"]))
@example(",".join(CSV_COLUMNS), ["4,2,1,1,512," + "9" * 5000], "\n")
@example(",".join(CSV_COLUMNS), ["9" * 5000 + ",2,1,1,512,1"], "\n")  # int() > 4300 digits
@example(",".join(CSV_COLUMNS), ["4,2,1,1,512,1e400"], "\n")
@example(",".join(CSV_COLUMNS), ['4,2,1,1,512,"1\n2"'], "\n")
def test_samples_csv_parses_or_names_the_line(header: str, body: list[str], newline: str) -> None:
    text = newline.join([header, *body])
    result = expect_clean(lambda: observations_from_csv(text, "s.csv"), (UserInputError,))
    if result is None:
        with pytest.raises(UserInputError, match=r"^s\.csv"):
            observations_from_csv(text, "s.csv")
        return
    assert isinstance(result, list)
    for obs in result:
        assert obs.config.workers >= 1 and obs.config.ps >= 1 and obs.batch_size >= 1
        assert math.isfinite(obs.throughput) and obs.throughput > 0


def test_huge_numbers_in_a_samples_csv_are_user_errors() -> None:
    """A cell of more digits than int() takes (4300) stays a UserInputError naming the line
    and the column (int() raises ValueError for it, which the reader already catches)."""
    text = ",".join(CSV_COLUMNS) + "\n" + "9" * 5000 + ",2,1,1,512,1\n"
    with pytest.raises(UserInputError, match=r"^s\.csv:2: column workers"):
        observations_from_csv(text, "s.csv")


def test_out_of_range_model_files_are_user_errors() -> None:
    """Regression: a 400-digit θ raised OverflowError in the reader; γ = 1e308 was accepted and
    overflowed in the first prediction; a θ of 5e-324 alone predicted an infinite throughput."""
    tiny = {**dict.fromkeys(V3["theta"], 0), next(iter(V3["theta"])): 5e-324}
    cases = [
        (_with("theta", dict.fromkeys(V3["theta"], 10**400)), "theta.*finite number"),
        (_with("gamma", 1e308), "gamma: must be > 0 and <= 8"),
        (_with("theta", dict.fromkeys(V3["theta"], 1e308)), "theta.*must be <="),
        (_with("theta", tiny), "theta: every coefficient is below"),
    ]
    for doc, message in cases:
        with pytest.raises(UserInputError, match=message):
            model_from_dict(doc, "model.json")
