"""The publish gate: its rule (dlrover_kfp.core.gate) and the step that copies a model
(dlrover_kfp.steps.publish). A model here is a directory with a model.json whose metrics are
set by the test and a model.pt of random bytes; tests/airflow/test_publish_dag.py refuses a
really worse trained model."""

from __future__ import annotations

import functools
import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from dlrover_kfp.core.gate import judge
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.steps.publish import (
    CURRENT,
    VERSIONS,
    current_version,
    publish_step,
    read_model_metrics,
    version_name,
)


def _model(path: Path, auc: float | None, *, size: int = 1024, seed: int = 0) -> Path:
    path.mkdir(parents=True)
    metrics = {"loss": 0.45, "auc": auc, "eval_rows": 0 if auc is None else 2000}
    (path / "model.json").write_text(json.dumps({"step": seed, "metrics": metrics}))
    (path / "model.pt").write_bytes(os.urandom(size))
    (path / "model.onnx").write_bytes(os.urandom(size // 2))
    return path


@pytest.mark.parametrize(
    ("auc", "last", "publish", "says"),
    [
        (0.70, None, True, "the first model published here"),
        (0.72, 0.70, True, "published: AUC 0.720000 >= 0.695000"),
        (0.696, 0.70, True, "published: AUC 0.696000 >= 0.695000"),  # within the tolerance
        (0.69, 0.70, False, "refused: AUC 0.690000 < 0.695000 (the published 0.700000"),
        (None, 0.70, False, "no held-out AUC"),
        (None, None, False, "no held-out AUC"),  # not even a first publish
    ],
)
def test_the_rule(auc: float | None, last: float | None, publish: bool, says: str) -> None:
    verdict = judge(auc, last, 0.005)
    assert verdict.publish is publish
    assert says in verdict.reason, verdict.reason


def test_the_first_model_is_published_then_a_worse_one_is_refused_and_a_better_one_replaces_it(
    tmp_path: Path,
) -> None:
    published = tmp_path / "published"
    first = publish_step(_model(tmp_path / "day1", 0.70, seed=1), published)
    assert (first.published, first.auc, first.last_auc) == (True, 0.70, None)
    served = current_version(published)
    assert served is not None and served.name == first.version
    assert sorted(p.name for p in served.iterdir()) == ["model.json", "model.onnx", "model.pt"]
    assert (served / "model.pt").read_bytes() == (tmp_path / "day1" / "model.pt").read_bytes()

    worse = publish_step(_model(tmp_path / "day2", 0.68, seed=2), published)
    assert (worse.published, worse.auc, worse.last_auc) == (False, 0.68, 0.70)
    assert worse.reason.startswith("refused: AUC 0.680000 < 0.695000")
    assert worse.version == first.version
    assert current_version(published) == served  # still the first day's model
    assert len(list((published / VERSIONS).iterdir())) == 1  # nothing copied

    better = publish_step(_model(tmp_path / "day3", 0.71, seed=3), published)
    assert (better.published, better.last_auc) == (True, 0.70)
    assert current_version(published).name == better.version != first.version  # type: ignore[union-attr]
    assert read_model_metrics(current_version(published)).auc == 0.71  # type: ignore[arg-type]


def test_the_gate_judges_the_evaluated_auc_and_keeps_it_for_the_next_model(
    tmp_path: Path,
) -> None:
    """With the evaluate step's document, its AUC is judged (not model.json's), the version
    keeps it, and the next model is compared with it; another model's evaluation is refused."""
    published = tmp_path / "published"
    day1 = _model(tmp_path / "day1", 0.70, seed=1)
    evaluation = tmp_path / "evaluation.json"
    evaluation.write_text(json.dumps({"model": version_name(day1), "auc": 0.6999}))
    first = publish_step(day1, published, evaluation=evaluation)
    assert (first.published, first.auc, first.measured_by) == (True, 0.6999, "evaluate")
    served = current_version(published)
    assert served is not None and (served / "evaluation.json").read_text() == evaluation.read_text()
    later = publish_step(_model(tmp_path / "day2", 0.6949, seed=2), published)
    assert (later.published, later.last_auc, later.measured_by) == (True, 0.6999, "train")
    with pytest.raises(UserInputError, match=r"the evaluation of model '[0-9a-f]+', not of"):
        publish_step(_model(tmp_path / "day3", 0.9, seed=3), published, evaluation=evaluation)


def test_a_model_without_an_auc_is_refused_even_first(tmp_path: Path) -> None:
    decision = publish_step(_model(tmp_path / "m", None), tmp_path / "published")
    assert not decision.published
    assert "no held-out AUC" in decision.reason
    assert current_version(tmp_path / "published") is None


def test_publishing_the_same_model_again_copies_nothing(tmp_path: Path) -> None:
    model = _model(tmp_path / "m", 0.7)
    first = publish_step(model, tmp_path / "published")
    again = publish_step(model, tmp_path / "published")
    assert again.published and again.version == first.version
    assert len(list((tmp_path / "published" / VERSIONS).iterdir())) == 1


def test_a_copy_that_fails_half_way_leaves_the_served_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    published = tmp_path / "published"
    first = publish_step(_model(tmp_path / "day1", 0.70, seed=1), published)
    copied: list[str] = []
    real_copy = shutil.copy2

    def copy_then_fail(src: str, dst: str, **kwargs: object) -> object:
        if copied:
            raise OSError(28, "No space left on device")
        copied.append(src)
        return real_copy(src, dst)

    real_copytree = shutil.copytree
    monkeypatch.setattr(
        shutil, "copytree", functools.partial(real_copytree, copy_function=copy_then_fail)
    )
    with pytest.raises(UserInputError, match="cannot copy the model there"):
        publish_step(_model(tmp_path / "day2", 0.75, seed=2), published)
    assert copied  # it did copy one file before failing
    assert current_version(published).name == first.version  # type: ignore[union-attr]
    assert [p.name for p in (published / VERSIONS).iterdir()] == [first.version]  # no half copy


def test_a_reader_never_sees_half_a_model(tmp_path: Path) -> None:
    """A reader follows CURRENT while versions of 4 MB are published one after another: every
    version it finds is complete (its model.pt as long as its model.json says)."""
    published = tmp_path / "published"
    sizes = {}
    models = []
    for day in range(6):
        size = 4_000_000 + day
        models.append(_model(tmp_path / f"day{day}", 0.70 + day / 100, size=size, seed=day))
        sizes[json.loads((models[-1] / "model.json").read_text())["step"]] = size
    publish_step(models[0], published)
    seen: list[tuple[int, int]] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            served = current_version(published)
            assert served is not None
            step = json.loads((served / "model.json").read_text())["step"]
            seen.append((sizes[step], (served / "model.pt").stat().st_size))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for model in models[1:]:
            assert publish_step(model, published).published
    finally:
        done.set()
        reader.join()
    assert len(seen) > 1
    assert all(expected == size for expected, size in seen), seen
    assert (published / CURRENT).read_text().strip() == current_version(published).name  # type: ignore[union-attr]


def test_bad_input_is_one_line_naming_what(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match=r"model\.json: no such file"):
        publish_step(tmp_path / "nothing", tmp_path / "published")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.json").write_text('{"metrics": {"auc": "high"}}')
    with pytest.raises(UserInputError, match=r"metrics\.auc: 'high'; expected a number"):
        publish_step(bad, tmp_path / "published")
    model = _model(tmp_path / "m", 0.7)
    with pytest.raises(UserInputError, match=r"published: 's3://models/ctr'; publish to a dir"):
        publish_step(model, "s3://models/ctr")
    with pytest.raises(UserInputError, match=r"max_auc_drop: -0.1; expected an AUC difference"):
        publish_step(model, tmp_path / "published", max_auc_drop=-0.1)
    assert publish_step(model, (tmp_path / "p2").as_uri()).published  # a file:// URL is a dir
