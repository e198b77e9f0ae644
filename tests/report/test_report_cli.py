"""``dlrover-kfp report`` end to end through ``main([...])``: files written, exit codes, one-line
errors without a traceback."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import pytest

from dlrover_kfp.cli import main as cli_main
from dlrover_kfp.core.documents import to_json
from dlrover_kfp.history import ENV_VAR, open_history
from tests.factories import make_profile
from tests.report.builders import elastic_profile


@pytest.fixture(autouse=True)
def _no_inherited_history(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No inherited history URL or user data directory."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli_main.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(err: str, *fragments: str) -> None:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("dlrover-kfp"), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, err)


def test_report_of_a_profile(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    profile = elastic_profile()
    source = tmp_path / "profile.json"
    source.write_text(to_json(profile))
    target = tmp_path / "out" / "report.html"
    code, out, err = run(capsys, "report", str(source), "-o", str(target))
    assert code == 0, err
    assert out == ""
    assert f"wrote {target} (run {profile.run_id})" in err
    page = target.read_text()
    assert page.startswith("<!DOCTYPE html>") and profile.run_id in page
    assert '<figure id="plot-model">' in page


def test_report_of_a_scenario(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'history.db'}"
    with closing(open_history(url)) as store:
        for day in (1, 2, 3):
            store.record(make_profile(f"ads-{day}", started_at=f"2026-11-0{day}T02:00:00Z"))
        store.record(make_profile("other", scenario="search", started_at="2026-11-04T02:00:00Z"))
    target = tmp_path / "ads.html"
    code, out, err = run(
        capsys, "report", "--history", url, "--scenario", "ads-ctr", "-o", str(target)
    )
    assert code == 0, err
    assert out == ""
    assert "scenario ads-ctr, 3 run(s)" in err
    page = target.read_text()
    assert page.index("ads-1") < page.index("ads-2") < page.index("ads-3")
    assert "other" not in page
    # --limit keeps the newest
    code, _, err = run(
        capsys,
        "report",
        "--history",
        url,
        "--scenario",
        "ads-ctr",
        "--limit",
        "2",
        "-o",
        str(target),
    )
    assert code == 0, err
    assert "ads-1" not in target.read_text()


def test_a_scenario_without_runs_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    target = tmp_path / "page.html"
    code, _, err = run(capsys, "report", "--history", url, "--scenario", "nope", "-o", str(target))
    assert code == cli_main.EXIT_USER_ERROR
    _one_line_error(err, "no runs of scenario 'nope' in the history")
    assert not target.exists()


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "no such file"),
        ("{not json", "bad.json"),
        ('{"run_id": "x"}', "bad.json"),
    ],
)
def test_a_bad_profile_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str | None, fragment: str
) -> None:
    source = tmp_path / "bad.json"
    if content is not None:
        source.write_text(content)
    target = tmp_path / "report.html"
    code, out, err = run(capsys, "report", str(source), "-o", str(target))
    assert code == cli_main.EXIT_USER_ERROR
    assert out == ""
    _one_line_error(err, fragment)
    assert not target.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["report", "-o", "x.html"],  # neither
        ["report", "p.json", "--scenario", "s", "-o", "x.html"],  # both
        ["report", "p.json", "--history", "sqlite:///h.db", "-o", "x.html"],
    ],
)
def test_wrong_arguments_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, _, err = run(capsys, *argv)
    assert code == cli_main.EXIT_USER_ERROR
    _one_line_error(err)


def test_output_is_required_and_help_has_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli_main.main(["report", "p.json"])
    assert exit_info.value.code == cli_main.EXIT_USER_ERROR
    _one_line_error(capsys.readouterr().err, "-o/--output")
    with pytest.raises(SystemExit) as exit_info:
        cli_main.main(["report", "--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    assert "Examples:" in help_text and "dlrover-kfp report" in help_text
