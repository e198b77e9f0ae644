"""The servable model end to end: a real run on real Criteo rows exports model.onnx, and a
process that cannot import this package scores the held-out rows with it.

One training run (``dlrover-kfp run --static``, 1 worker and 1 PS, 600 real rows in three files
of three layouts: a few seconds) is shared by the tests of this module.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from dlrover_kfp.cli.main import main
from dlrover_kfp.core.documents import load_text, parse
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.training.data import split_ranges
from dlrover_kfp.training.datasets import open_dataset
from dlrover_kfp.training.metrics import roc_auc
from tests.storage_server import Bucket

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
SCORER = REPO / "tests" / "standalone" / "score_without_package.py"
TABLES = [1000, 500, 7, 3000, 50, 200, 100, 20, 1, 800, 60, 900, 30]
JOB = f"""\
name: served-model
model: {{embedding_dim: 8, table_sizes: {TABLES + TABLES}, bottom_mlp: [16, 8], top_mlp: [16, 1]}}
data: {{format: criteo, path: "data/*"}}
training: {{batch_size: 32, epochs: 3, learning_rate: 0.05}}
resources:
  workers: {{count: 1, cpu: 1, memory: 2Gi}}
  ps: {{count: 1, cpu: 1, memory: 2Gi}}
"""


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "dlrover_kfp.cli.main", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run's directory: data/ (three real Criteo files, a comma-separated one with a header, a
    CRLF one without, a tab-separated one with non-hex tokens in two columns), job.yaml,
    out/model/."""
    root = tmp_path_factory.mktemp("served")
    data = root / "data"
    data.mkdir()
    shutil.copy(DATA / "criteo_sample.csv", data / "a_sample.csv")  # comma, header
    shutil.copy(DATA / "criteo_kaggle_train.csv", data / "b_kaggle.csv")  # CRLF, no header
    rows = [r.split(",") for r in (DATA / "criteo_kaggle_test.csv").read_text().splitlines()]
    for r in rows:  # C1 and C2 as tokens that are not hex numbers: they go through BLAKE2b
        r[14:16] = [f"site {t}" if t else "" for t in r[14:16]]
    (data / "c_day.tsv").write_text("\n".join("\t".join(r) for r in rows) + "\n")
    (root / "job.yaml").write_text(JOB)
    done = _cli(
        "run", "--job", "job.yaml", "--static", "--output-dir", "out", "--checkpoint-interval",
        "0", cwd=root,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return root


def _standalone(model_dir: Path, *args: object) -> dict[str, Any]:
    """tests/standalone/score_without_package.py's JSON, run outside this repository's path."""
    done = subprocess.run(
        [sys.executable, str(SCORER), str(model_dir), *map(str, args)],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_onnxruntime_without_the_package_scores_the_held_out_rows_as_the_run_did(
    trained: Path,
) -> None:
    """The Must-show: |AUC - model.json's AUC| <= 1e-4 and the same held-out row count."""
    model_dir = trained / "out" / "model"
    described = json.loads((model_dir / "model.json").read_text())
    spec = parse(JobSpec, load_text((trained / "job.yaml").read_text(), "job"), "job")
    dataset = open_dataset(spec.data, spec.model, trained)
    _, held_out = split_ranges(dataset.source_rows, 8192, 0.1)  # the run's defaults
    files = sorted((trained / "data").iterdir())
    ranges = [f"--range={r.start}:{r.end}" for r in held_out]
    scored = _standalone(model_dir, *files, *ranges)
    metrics = described["metrics"]
    print(
        f"\nheld-out rows: run {metrics['eval_rows']}, onnxruntime {scored['rows']}; "
        f"AUC run {metrics['auc']}, onnxruntime {scored['auc']:.6f}; "
        f"loss run {metrics['loss']}, onnxruntime {scored['loss']:.6f}"
    )
    assert scored["rows"] == metrics["eval_rows"]
    assert abs(scored["auc"] - metrics["auc"]) <= 1e-4
    assert abs(scored["loss"] - metrics["loss"]) <= 1e-4


def _score(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, object], str]:
    """``dlrover-kfp score ARGS`` in this process: (exit code, stdout JSON or {}, stderr)."""
    code = main(["score", *args])
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if code == 0 else {}), captured.err


def test_score_writes_every_good_row_with_its_index_and_the_held_out_auc_of_the_run(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model_dir = trained / "out" / "model"
    # The TSV file again, with two bad rows among its lines: they are skipped and counted, and
    # every other row keeps its own index.
    lines = (trained / "data" / "c_day.tsv").read_text().splitlines()
    lines.insert(5, "1\tnot-a-number" + "\t" * 38)
    lines.insert(9, "0\t1\t2")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "day.tsv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "scores" / "day.parquet"
    code, summary, err = _score(
        capsys,
        "--model",
        str(model_dir),
        "--data",
        str(tmp_path / "bad" / "day.tsv"),
        "--output",
        str(out),
    )
    assert code == 0, err
    assert (summary["rows"], summary["bad_rows"], summary["sources"]) == (200, 2, 1)
    assert "rows read" in err  # progress on stderr
    scored = pq.read_table(out)
    assert scored.column_names == ["source", "row", "label", "probability"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o644  # readable by a consumer (was 0600)
    kept = [i for i in range(202) if i not in (5, 9)]
    assert scored.column("row").to_pylist() == kept

    # The run's own data: the held-out rows score the AUC the run measured.
    code, summary, err = _score(
        capsys, "--model", str(model_dir), "--data", str(trained / "data" / "*"),
        "--output", str(tmp_path / "all.parquet"), "--chunk-rows", "64",
    )  # fmt: skip
    assert code == 0, err
    table = _columns(tmp_path / "all.parquet")
    assert summary["rows"] == len(table["row"]) == 600
    spec = parse(JobSpec, load_text((trained / "job.yaml").read_text(), "job"), "job")
    _, held_out = split_ranges(open_dataset(spec.data, spec.model, trained).source_rows, 8192, 0.1)
    mask = np.zeros(600, dtype=bool)
    for r in held_out:
        mask |= (table["source"] == r.source) & (table["row"] >= r.start) & (table["row"] < r.end)
    described = json.loads((model_dir / "model.json").read_text())["metrics"]
    auc = roc_auc(table["label"][mask], table["probability"][mask])
    assert mask.sum() == described["eval_rows"]
    assert auc is not None and abs(auc - described["auc"]) <= 1e-4
    # The rows of the bad file score as the same rows of the clean one: its rows 0 and 4, then
    # 6 and 12 (after one and two bad rows) are the clean file's 0, 4, 5 and 10.
    clean = table["probability"][table["source"] == 2]
    bad = _columns(out)["probability"]
    assert np.array_equal(bad[[0, 4, 5, 10]], clean[[0, 4, 5, 10]])
    assert kept[5] == 6 and kept[10] == 12


def _columns(path: Path) -> dict[str, np.ndarray]:
    table = pq.read_table(path)
    return {name: table.column(name).to_numpy() for name in table.column_names}


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        ("no model", "--model: {model}/model.json does not exist"),
        ("old model", "--model: {model}/model.json has no 'onnx' entry"),
        ("no onnx file", "--model: {model}/model.onnx (named by model.json) is missing"),
        ("no data", "data.path: no file"),
        ("wrong columns", "C26"),
    ],
)
def test_score_refuses_bad_input_in_one_line_with_exit_2(
    trained: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    breakage: str,
    message: str,
) -> None:
    model = tmp_path / "model"
    shutil.copytree(trained / "out" / "model", model)
    data = str(trained / "data" / "*")
    if breakage == "no model":
        shutil.rmtree(model)
    elif breakage == "old model":
        described = json.loads((model / "model.json").read_text())
        del described["onnx"]
        (model / "model.json").write_text(json.dumps(described))
    elif breakage == "no onnx file":
        (model / "model.onnx").unlink()
    elif breakage == "no data":
        data = str(tmp_path / "nothing" / "*.tsv")
    else:
        data = str(tmp_path / "rows.parquet")
        pq.write_table(_criteo_table(DATA / "criteo_sample.csv").drop_columns(["C26"]), data)
    out = tmp_path / "out.parquet"
    code, _, err = _score(capsys, "--model", str(model), "--data", data, "--output", str(out))
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert message.format(model=model) in err
    assert not out.exists()


def _criteo_table(path: Path) -> pa.Table:
    """A Criteo CSV file with a header as an Arrow table: numeric dense columns, text tokens."""
    convert = pacsv.ConvertOptions(
        column_types={
            **{f"I{i}": pa.float64() for i in range(1, 14)},
            **{f"C{i}": pa.string() for i in range(1, 27)},
        }
    )
    return pacsv.read_csv(path, convert_options=convert)


def test_the_same_rows_in_parquet_score_as_in_criteo_text(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model_dir = str(trained / "out" / "model")
    pq.write_table(_criteo_table(DATA / "criteo_sample.csv"), tmp_path / "rows.parquet")
    code, summary, err = _score(
        capsys, "--model", model_dir, "--data", str(tmp_path / "rows.parquet"),
        "--output", str(tmp_path / "from_parquet.parquet"),
    )  # fmt: skip
    assert code == 0, err
    code, text_summary, err = _score(
        capsys, "--model", model_dir, "--data", str(DATA / "criteo_sample.csv"),
        "--output", str(tmp_path / "from_text.parquet"),
    )  # fmt: skip
    assert code == 0, err
    assert summary["rows"] == text_summary["rows"] == 200
    from_parquet = _columns(tmp_path / "from_parquet.parquet")
    from_text = _columns(tmp_path / "from_text.parquet")
    np.testing.assert_array_equal(from_parquet["row"], from_text["row"])
    np.testing.assert_allclose(from_parquet["probability"], from_text["probability"], atol=1e-6)
    # And the scorer without the package reads the Parquet file to the same figures.
    standalone = _standalone(trained / "out" / "model", tmp_path / "rows.parquet")
    assert standalone["rows"] == 200
    assert abs(standalone["auc"] - summary["auc"]) <= 1e-4
    assert abs(standalone["loss"] - summary["loss"]) <= 1e-4


def test_score_reads_from_and_writes_to_s3(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], s3_bucket: Bucket
) -> None:
    """Rows in a bucket scored into the bucket (a real S3 API: the moto server): the same
    probabilities as from the local file; the predictions object appears whole."""
    s3_bucket.put_file("in/day.tsv", trained / "data" / "c_day.tsv")
    model_dir = str(trained / "out" / "model")
    code, summary, err = _score(
        capsys, "--model", model_dir, "--data", s3_bucket.url("in/"), "--format", "criteo",
        "--output", s3_bucket.url("scores/day.parquet"),
    )  # fmt: skip
    assert code == 0, err
    assert summary["output"] == s3_bucket.url("scores/day.parquet")
    (tmp_path / "got.parquet").write_bytes(
        s3_bucket.server.client()
        .get_object(Bucket=s3_bucket.name, Key="scores/day.parquet")["Body"]
        .read()
    )
    code, local, err = _score(
        capsys, "--model", model_dir, "--data", str(trained / "data" / "c_day.tsv"),
        "--output", str(tmp_path / "local.parquet"),
    )  # fmt: skip
    assert code == 0, err
    assert summary["rows"] == local["rows"] == 200
    np.testing.assert_array_equal(
        _columns(tmp_path / "got.parquet")["probability"],
        _columns(tmp_path / "local.parquet")["probability"],
    )
    # a URL with credentials in it is refused before anything is read, without repeating them
    code, _, err = _score(
        capsys, "--model", model_dir, "--data", str(trained / "data" / "c_day.tsv"),
        "--output", f"s3://AKIA:hunter2@{s3_bucket.name}/x.parquet",
    )  # fmt: skip
    assert code == 2 and "hunter2" not in err and "credentials do not belong" in err


def test_score_runs_without_torch(trained: Path, tmp_path: Path) -> None:
    """The ``serve`` extra has onnxruntime and pyarrow, not torch: the command must not need it.

    An import hook makes ``import torch`` fail as it does where torch is not installed
    (``sys.modules["torch"] = None`` would not do here: scipy.stats looks torch up in
    ``sys.modules`` and trips over the None)."""
    out = tmp_path / "scores.parquet"
    code = (
        "import sys\n"
        "class NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'torch':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}')\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "from dlrover_kfp.cli.main import main\n"
        f"code = main(['score', '--model', {str(trained / 'out' / 'model')!r}, '--data', "
        f"{str(DATA / 'criteo_sample.csv')!r}, '--output', {str(out)!r}])\n"
        "assert 'torch' not in sys.modules\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"] == 200
    assert pq.read_metadata(out).num_rows == 200


# ---- the evaluate step: the exported model must reproduce the run's held-out evaluation ----


def _evaluate(
    capsys: pytest.CaptureFixture[str], model: Path, data: str, out: Path
) -> tuple[int, str]:
    """``dlrover-kfp evaluate`` in this process: (exit code, stderr); files into ``out``."""
    code = main(
        ["evaluate", "--model", str(model), "--data", data,
         "--predictions", str(out / "held_out.parquet"), "--metrics", str(out / "metrics.json")]
    )  # fmt: skip
    return code, capsys.readouterr().err


def test_evaluate_reproduces_the_run_and_the_gate_judges_its_auc(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dlrover_kfp.steps.publish import publish_step  # noqa: PLC0415

    model = trained / "out" / "model"
    described = json.loads((model / "model.json").read_text())
    assert described["held_out"]["eval_fraction"] == 0.1
    assert described["held_out"]["source_rows"] == [200, 200, 200]
    # The same files read from another place (a KFP artifact downloaded into another pod):
    # other paths and times, the same names, sizes and rows.
    elsewhere = tmp_path / "copy"
    shutil.copytree(trained / "data", elsewhere)
    code, err = _evaluate(capsys, model, str(elsewhere), tmp_path)
    assert code == 0, err
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    print(
        f"\nevaluate: held-out rows {metrics['rows']}; AUC onnxruntime {metrics['auc']}, run "
        f"{metrics['train_auc']} (difference {metrics['auc_difference']}); "
        f"{metrics['seconds']} s"
    )
    assert metrics["rows"] == described["metrics"]["eval_rows"] == 60
    assert metrics["auc_difference"] <= 1e-4
    assert metrics["train_auc"] == described["metrics"]["auc"]
    held_out = pq.read_table(tmp_path / "held_out.parquet")
    assert held_out.column("row").to_pylist() == [*range(180, 200)] * 3
    decision = publish_step(model, tmp_path / "published", evaluation=tmp_path / "metrics.json")
    assert decision.published and decision.measured_by == "evaluate"
    assert decision.auc == metrics["auc"]
    kept = tmp_path / "published" / "versions" / str(decision.version) / "evaluation.json"
    assert json.loads(kept.read_text()) == metrics  # what the next model is judged against


def test_evaluate_catches_a_broken_export_and_the_gate_never_publishes_it(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """model.onnx of another model beside this run's model.json: training's AUC still reads
    well; evaluate fails (exit 1) and writes no metrics, and the gate refuses the good model's
    evaluation for it."""
    from dlrover_kfp.steps.publish import UserInputError, publish_step  # noqa: PLC0415
    from dlrover_kfp.training import onnx_model  # noqa: PLC0415
    from dlrover_kfp.training.model import FullDLRM  # noqa: PLC0415

    good = trained / "out" / "model"
    code, err = _evaluate(capsys, good, str(trained / "data"), tmp_path)
    assert code == 0, err
    spec = parse(JobSpec, load_text((trained / "job.yaml").read_text(), "job"), "job")
    other = onnx_model.save_onnx(
        onnx_model.dlrm_weights(FullDLRM(spec.model, seed=7)), tmp_path / "other"
    )
    broken = tmp_path / "broken"
    shutil.copytree(good, broken)
    shutil.copy(tmp_path / "other" / other.file, broken / "model.onnx")
    (tmp_path / "out").mkdir()
    code, err = _evaluate(capsys, broken, str(trained / "data"), tmp_path / "out")
    assert code == 1
    (line,) = [x for x in err.splitlines() if "rows read" not in x]  # one line, not progress
    assert "the exported model is not the trained one; not publishable" in line, err
    assert not (tmp_path / "out" / "metrics.json").exists()
    # the KFP component fails its task the same way (exit 1), and writes no evaluation
    from components.glue import evaluate_model  # noqa: PLC0415

    with pytest.raises(SystemExit) as failed:
        evaluate_model(
            str(broken), str(trained / "data"), str(tmp_path / "kfp.parquet"), str(tmp_path / "e")
        )
    assert failed.value.code == 1 and not (tmp_path / "e").exists()
    with pytest.raises(UserInputError, match=r"the evaluation of model .*, not of the model in"):
        publish_step(broken, tmp_path / "published", evaluation=tmp_path / "metrics.json")
    assert not (tmp_path / "published" / "CURRENT").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("a file less", "not the files the model was trained on (2 file(s), training read 3)"),
        ("a file rewritten", "file 2 is c_day.tsv of"),
    ],
)
def test_evaluate_refuses_other_files_than_the_run_trained_on(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], change: str, message: str
) -> None:
    data = tmp_path / "data"
    shutil.copytree(trained / "data", data)
    if change == "a file less":
        (data / "a_sample.csv").unlink()
    else:
        lines = (data / "c_day.tsv").read_text().splitlines()
        (data / "c_day.tsv").write_text("\n".join(lines[:-1]) + "\n")
    code, err = _evaluate(capsys, trained / "out" / "model", str(data), tmp_path)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "metrics.json").exists()
