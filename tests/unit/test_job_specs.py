"""Every job spec a user copies (README.md's, examples/) is one that runs: it validates, its
model has the shape of the data it names (Criteo: 13 dense features and 26 tables, checked
against real Criteo rows), and its own resources clear the model's memory minimums."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from dlrover_kfp.core.documents import parse
from dlrover_kfp.core.spec import CriteoData, JobSpec
from dlrover_kfp.planning import check_plan
from dlrover_kfp.training.data import RowRange
from dlrover_kfp.training.datasets import open_dataset

ROOT = Path(__file__).resolve().parents[2]
CRITEO_SAMPLE = ROOT / "tests" / "data" / "criteo_sample.csv"
_YAML_BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _job_documents() -> list[tuple[str, dict[str, Any]]]:
    """(where, document) of every job spec in README.md's yaml blocks and examples/."""
    found = []
    readme = (ROOT / "README.md").read_text()
    for k, block in enumerate(_YAML_BLOCK.findall(readme)):
        found.append((f"README.md yaml block {k}", yaml.safe_load(block)))
    for path in sorted((ROOT / "examples").rglob("*.yaml")):
        found.append((str(path.relative_to(ROOT)), yaml.safe_load(path.read_text())))
    return [(where, doc) for where, doc in found if isinstance(doc, dict) and "model" in doc]


DOCUMENTS = _job_documents()


def test_the_readme_and_the_examples_hold_job_specs() -> None:
    where = {w for w, _ in DOCUMENTS}
    assert any(w.startswith("README.md") for w in where)
    assert {"examples/ctr-daily.yaml", "examples/jobs/small.yaml"} <= where


@pytest.mark.parametrize(("where", "document"), DOCUMENTS, ids=[w for w, _ in DOCUMENTS])
def test_a_documented_job_spec_runs_on_criteo_rows(where: str, document: dict[str, Any]) -> None:
    spec = parse(JobSpec, document, where)
    # Each is Criteo-shaped (README.md's offers `{format: criteo, ...}` as its data): its
    # model reads real Criteo rows, and none of them is a bad row.
    criteo = open_dataset(CriteoData(path=str(CRITEO_SAMPLE)), spec.model)
    batch = criteo.read(RowRange(0, 0, criteo.source_rows[0]))
    assert len(batch) == 200 and batch.bad_rows == 0
    if isinstance(spec.data, CriteoData):
        assert spec.data.path.startswith("/"), "a relative Criteo path: ship its data"
    else:
        data = open_dataset(spec.data, spec.model)
        assert len(data.read(RowRange(0, 0, 512))) == 512
    res = spec.resources
    if res.workers is not None and res.ps is not None:
        check_plan(spec, res.workers.to_group(), res.ps.to_group(), source=where)
