"""``dlrover-kfp model {fit,predict}``: JSON only on stdout, one-line errors with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlrover_kfp.cli.main import main
from dlrover_kfp.core.model_io import (
    FORM,
    FORM_V1,
    model_from_dict,
    observations_from_csv,
)
from dlrover_kfp.core.observation import Config
from dlrover_kfp.core.perf_model import (
    THETA_NAMES,
    fit,
)

SAMPLES = """\
workers,ps,worker_cpu,ps_cpu,batch_size,throughput
2,1,4,2,512,104800
4,2,4,2,512,207400
8,2,8,4,512,403600
8,4,8,4,512,631500
16,4,8,2,512,568800
"""


@pytest.fixture
def samples(tmp_path: Path) -> Path:
    path = tmp_path / "samples.csv"
    path.write_text(SAMPLES, encoding="utf-8")
    return path


@pytest.fixture
def model_file(tmp_path: Path, samples: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    output = tmp_path / "model.json"
    assert main(["model", "fit", "--samples", str(samples), "--output", str(output)]) == 0
    capsys.readouterr()
    return output


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_fit_writes_the_model_and_prints_only_json(
    tmp_path: Path, samples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "out" / "model.json"
    assert main(["model", "fit", "--samples", str(samples), "--output", str(output)]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)  # the whole of stdout is one JSON document
    assert set(summary) >= {"theta", "gamma", "pinned", "diagnostics"}
    assert summary["form"] == FORM
    assert list(summary["theta"]) == list(THETA_NAMES)
    assert summary["diagnostics"]["n_configs"] == 5
    # Five configurations fit four θ with one to spare: no room left for γ, pinned at 1.
    assert summary["gamma"] == 1.0
    assert summary["pinned"]["gamma"] is True
    written = json.loads(output.read_text(encoding="utf-8"))
    assert written == summary
    expected = fit(observations_from_csv(SAMPLES, "samples.csv"))
    assert model_from_dict(written, str(output)) == expected
    assert [p.name for p in output.parent.iterdir()] == ["model.json"]  # no temporary left


def test_predict_prints_exactly_the_throughput(
    model_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["model", "predict", "--model", str(model_file), "--workers", "12", "--ps", "3"]
    argv += ["--worker-cpu", "8", "--ps-cpu", "500m", "--batch-size", "512"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.endswith("\n") and out.count("\n") == 1
    result = json.loads(out)
    assert list(result) == ["throughput"]
    model = model_from_dict(json.loads(model_file.read_text(encoding="utf-8")), "m")
    assert result["throughput"] == model.throughput(Config(12, 3, 8.0, 0.5), 512)


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--workers", "0", "argument --workers: workers must be >= 1, got '0'"),
        ("--ps", "two", "argument --ps: PS must be a whole number, got 'two'"),
        ("--worker-cpu", "4x", "argument --worker-cpu: '4x' is not a CPU quantity"),
        ("--ps-cpu", "0", "argument --ps-cpu: CPU must be positive"),
        ("--batch-size", "-512", "argument --batch-size: batch size must be >= 1"),
    ],
)
def test_predict_rejects_bad_values_in_one_line(
    model_file: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, message: str
) -> None:
    values = {"--workers": "4", "--ps": "2", "--worker-cpu": "4", "--ps-cpu": "2"}
    values["--batch-size"] = "512"
    values[option] = value
    argv = ["model", "predict", "--model", str(model_file)]
    for key, text in values.items():
        argv += [key, text]
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in _one_error_line(captured.err)


def test_predict_reads_a_v1_model_file_as_gamma_one(
    model_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(model_file.read_text(encoding="utf-8"))
    data["form"] = FORM_V1
    del data["gamma"], data["pinned"]["gamma"], data["diagnostics"]["identifiable"]["gamma"]
    del data["overlap"], data["diagnostics"]["overlap_searched"]
    model_file.write_text(json.dumps(data), encoding="utf-8")
    argv = ["model", "predict", "--model", str(model_file), "--workers", "12", "--ps", "3"]
    argv += ["--worker-cpu", "8", "--ps-cpu", "4000m", "--batch-size", "512"]
    assert main(argv) == 0
    # The figure of the help's example (and docs/model.md), from a v1 file of the same fit.
    result = json.loads(capsys.readouterr().out)
    assert result == {"throughput": pytest.approx(602431.9636167515, rel=1e-12)}


def test_predict_with_a_missing_model_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.json"
    argv = ["model", "predict", "--model", str(missing), "--workers", "1", "--ps", "1"]
    argv += ["--worker-cpu", "1", "--ps-cpu", "1", "--batch-size", "64"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert _one_error_line(captured.err) == f"dlrover-kfp: error: {missing}: no such file"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", ":1: not JSON: "),
        ('{"form": "dlrover-kfp/ps-async-v1"}', ": key theta: required key is missing"),
        # Regressions: json.loads raised a bare ValueError (more digits than int() takes) and
        # RecursionError, which the CLI printed as tracebacks.
        (
            '{"gamma": ' + "9" * 5000 + "}",
            ": not JSON: unreadable value: Exceeds the limit (4300 digits) for integer string "
            "conversion: value has 5000 digits",
        ),
        ("[" * 100_000, ": not JSON: nested too deeply"),
        ('{"theta": ' + "[" * 100_000 + "]" * 100_000 + "}", ": not JSON: nested too deeply"),
    ],
    ids=["not-json", "missing-key", "5000-digit-int", "deep-brackets", "deep-theta"],
)
def test_predict_with_a_malformed_model_file_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    path = tmp_path / "model.json"
    path.write_text(content, encoding="utf-8")
    argv = ["model", "predict", "--model", str(path), "--workers", "1", "--ps", "1"]
    argv += ["--worker-cpu", "1", "--ps-cpu", "1", "--batch-size", "64"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    line = _one_error_line(captured.err)
    assert line.startswith(f"dlrover-kfp: error: {path}{message}")
    assert len(line) < 300, line


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            SAMPLES.replace("4,2,4,2,512,207400", "4,2,4,2,512,fast"),
            "samples.csv:3: column throughput: expected a number, got 'fast'",
        ),
        ("workers,ps\n", "samples.csv:1: missing column(s) worker_cpu, ps_cpu, batch_size"),
        (SAMPLES.splitlines()[0] + "\n", "samples.csv: no samples, only a header"),
    ],
)
def test_fit_with_bad_samples_exits_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    samples = tmp_path / "samples.csv"
    samples.write_text(content, encoding="utf-8")
    output = tmp_path / "model.json"
    assert main(["model", "fit", "--samples", str(samples), "--output", str(output)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in _one_error_line(captured.err)
    assert not output.exists()


@pytest.mark.parametrize("argv", [["model"], ["model", "fit"], ["model", "fit", "--samples", "s"]])
def test_missing_arguments_are_one_line_usage_errors(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "required" in _one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("command", [["model"], ["model", "fit"], ["model", "predict"]])
def test_help_shows_an_example(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([*command, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "Example" in out
    assert "dlrover-kfp model" in out.split("Example", 1)[1]
