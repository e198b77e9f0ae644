"""``dlrover-kfp record`` and ``dlrover-kfp history ...`` end to end, through ``main([...])``.

Each test works on SQLite files under ``tmp_path``; the environment is controlled with
``monkeypatch`` so that no test touches the real user data directory.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from dlrover_kfp.cli.main import EXIT_TRANSIENT, EXIT_USER_ERROR, main
from dlrover_kfp.core.documents import to_dict, to_json
from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.history import ENV_VAR, default_history_path, open_history, resolve_history_url
from dlrover_kfp.history.migrations import LATEST_VERSION, schema_version
from tests.chaos.harness import SmallDisk, mounted_small_disk
from tests.contract.test_history_store import POSTGRES_ENV, POSTGRES_SKIP
from tests.factories import make_profile

T0 = 1_793_491_200.0  # 2026-11-01T00:00:00Z


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No inherited history URL; the default data directory lives under tmp_path."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write_profile(path: Path, profile: JobProfile) -> Path:
    path.write_text(to_json(profile), encoding="utf-8")
    return path


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def stored_ids(db: Path) -> list[str]:
    with open_history(str(db)) as store:
        return sorted(s.run_id for s in store.list(limit=1000))


# -- record -----------------------------------------------------------------------------------


def test_record_prints_the_run_id_and_whether_it_was_new(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = tmp_path / "h.db"
    profile = write_profile(tmp_path / "p.json", make_profile("ctr-1"))
    code, out, _ = run(capsys, "record", "--profile", str(profile), "--history", str(db))
    assert code == 0
    assert json.loads(out) == {"run_id": "ctr-1", "new": True}
    assert out.count("\n") == 1
    code, out, _ = run(capsys, "record", "--profile", str(profile), "--history", str(db))
    assert (code, json.loads(out)) == (0, {"run_id": "ctr-1", "new": False})
    assert stored_ids(db) == ["ctr-1"]


def test_record_accepts_a_yaml_profile(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(to_dict(make_profile("yaml-1"))), encoding="utf-8")
    code, out, _ = run(
        capsys, "record", "--profile", str(path), "--history", str(tmp_path / "h.db")
    )
    assert (code, json.loads(out)["new"]) == (0, True)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d.update(surprise=1), "surprise: unknown key"),
        (lambda d: d["outcome"].update(status="maybe"), "outcome.status"),
        (lambda d: d.update(started_at="last tuesday"), "started_at: not an ISO 8601 time"),
        (lambda d: d.pop("job"), "job: required key is missing"),
    ],
)
def test_record_of_an_invalid_profile_names_the_file_and_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, edit: object, expected: str
) -> None:
    data = to_dict(make_profile("bad-1"))
    assert callable(edit)
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    db = tmp_path / "h.db"
    code, out, err = run(capsys, "record", "--profile", str(path), "--history", str(db))
    assert code == EXIT_USER_ERROR
    assert out == ""
    line = one_error_line(err)
    assert str(path) in line
    assert expected in line
    assert not db.exists() or stored_ids(db) == []


@pytest.mark.parametrize(
    ("auc", "loss", "key"),
    [(1.5, 0.4, "metrics.auc"), (-0.1, 0.4, "metrics.auc"), (0.8, -7.0, "metrics.loss")],
)
def test_record_refuses_impossible_metrics(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, auc: float, loss: float, key: str
) -> None:
    path = write_profile(tmp_path / "p.json", make_profile("impossible", auc=auc, loss=loss))
    db = tmp_path / "h.db"
    code, out, err = run(capsys, "record", "--profile", str(path), "--history", str(db))
    assert (code, out) == (EXIT_USER_ERROR, "")
    line = one_error_line(err)
    assert line.startswith(f"dlrover-kfp: error: {path}: {key}: "), line
    assert stored_ids(db) == []


def test_record_of_a_missing_file_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "nope.json"
    code, _, err = run(
        capsys, "record", "--profile", str(missing), "--history", str(tmp_path / "h")
    )
    assert code == EXIT_USER_ERROR
    assert f"{missing}: no such file" in one_error_line(err)


# -- list and show ----------------------------------------------------------------------------


@pytest.fixture
def filled(tmp_path: Path) -> Path:
    db = tmp_path / "filled.db"
    with open_history(str(db)) as store:
        store.record_many(
            [
                make_profile("ads-1", scenario="ads", started_at=T0 + 10, workers=4, ps=2),
                make_profile("ads-2", scenario="ads", started_at=T0 + 20, workers=6, ps=3),
                make_profile("feed-1", scenario="feed", started_at=T0 + 30, status="failed"),
            ]
        )
    return db


def test_list_prints_a_table_newest_first(capsys: pytest.CaptureFixture[str], filled: Path) -> None:
    code, out, _ = run(capsys, "history", "list", "--history", str(filled))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "RUN_ID", "STARTED", "SCENARIO", "STATUS", "JCT_S", "WORKERS", "PS", "PEAK_PS_CPU"
    ]  # fmt: skip
    assert [line.split()[0] for line in lines[1:]] == ["feed-1", "ads-2", "ads-1"]
    assert "2026-11-01T00:00:30Z" in lines[1]
    assert "failed" in lines[1]
    assert "6x4cpu/8192Mi" in lines[2]


def test_list_json_filters_and_limits(capsys: pytest.CaptureFixture[str], filled: Path) -> None:
    code, out, _ = run(
        capsys,
        "history",
        "list",
        "--scenario",
        "ads",
        "--limit",
        "1",
        "--json",
        "--history",
        str(filled),
    )
    assert code == 0
    (row,) = json.loads(out)
    assert row["run_id"] == "ads-2"
    assert row["workers"] == {"count": 6, "cpu": 4.0, "memory_mb": 8192}
    assert row["started_at"] == "2026-11-01T00:00:20Z"
    assert row["observations"][0]["config"]["workers"] == 6


def test_list_of_an_empty_history(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, "history", "list", "--history", str(tmp_path / "new.db"))
    assert code == 0
    assert out.split() == [
        "RUN_ID",
        "STARTED",
        "SCENARIO",
        "STATUS",
        "JCT_S",
        "WORKERS",
        "PS",
        "PEAK_PS_CPU",
    ]
    assert "no jobs recorded" in err
    code, out, _ = run(capsys, "history", "list", "--json", "--history", str(tmp_path / "new.db"))
    assert json.loads(out) == []


def test_list_refuses_a_limit_below_one(capsys: pytest.CaptureFixture[str], filled: Path) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["history", "list", "--limit", "0", "--history", str(filled)])
    assert stop.value.code == EXIT_USER_ERROR
    assert "--limit: must be at least 1" in one_error_line(capsys.readouterr().err)


def test_show_prints_the_stored_profile(capsys: pytest.CaptureFixture[str], filled: Path) -> None:
    code, out, _ = run(capsys, "history", "show", "ads-2", "--history", str(filled))
    assert code == 0
    assert json.loads(out) == to_dict(
        make_profile("ads-2", scenario="ads", started_at=T0 + 20, workers=6, ps=3)
    )


def test_show_of_an_unknown_run_names_it(capsys: pytest.CaptureFixture[str], filled: Path) -> None:
    code, out, err = run(capsys, "history", "show", "nope-7", "--history", str(filled))
    assert code == EXIT_USER_ERROR
    assert out == ""
    assert "'nope-7' is not in the history" in one_error_line(err)


# -- broken, locked, newer and unreachable histories ------------------------------------------


@pytest.mark.parametrize(
    "content",
    [os.urandom(4096), b"this is a text file, not a database\n" * 40],
    ids=["random-bytes", "text-file"],
)
@pytest.mark.parametrize("argv", [("history", "list"), ("history", "show", "x")])
def test_a_file_that_is_not_a_history_is_one_line_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes, argv: tuple[str, ...]
) -> None:
    path = tmp_path / "corrupt.db"
    path.write_bytes(content)
    code, out, err = run(capsys, *argv, "--history", str(path))
    assert code == EXIT_USER_ERROR
    assert out == ""
    line = one_error_line(err)
    assert f"{path}: not a dlrover-kfp history database" in line
    assert path.read_bytes() == content  # left exactly as it was


def test_another_applications_sqlite_file_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    conn.close()
    code, _, err = run(capsys, "history", "list", "--history", str(path))
    assert code == EXIT_USER_ERROR
    assert "not a dlrover-kfp history database (it has tables invoices" in one_error_line(err)


def test_a_history_from_a_newer_version_is_refused(
    capsys: pytest.CaptureFixture[str], filled: Path
) -> None:
    engine = sa.create_engine(f"sqlite:///{filled}")
    with engine.begin() as conn:
        conn.execute(
            sa.insert(schema_version),
            {"version": LATEST_VERSION + 1, "description": "future", "applied_at": 0.0},
        )
    engine.dispose()
    code, _, err = run(capsys, "history", "list", "--history", str(filled))
    assert code == EXIT_USER_ERROR
    assert "written by a newer dlrover-kfp" in one_error_line(err)


def test_a_locked_history_is_a_temporary_failure(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, filled: Path
) -> None:
    profile = write_profile(tmp_path / "p.json", make_profile("late-1"))
    holder = sqlite3.connect(filled, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another writer holds the write lock
        url = f"sqlite:///{filled}?timeout=0.2"
        code, out, err = run(capsys, "record", "--profile", str(profile), "--history", url)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert code == EXIT_TRANSIENT
    assert out == ""
    line = one_error_line(err)
    assert "temporary failure" in line
    assert "locked" in line
    code, out, _ = run(capsys, "record", "--profile", str(profile), "--history", str(filled))
    assert (code, json.loads(out)["new"]) == (0, True)


def test_an_unreachable_server_never_shows_the_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = "postgresql://planner:s3cret-pw@127.0.0.1:1/history"
    code, out, err = run(capsys, "history", "list", "--history", url)
    assert code == EXIT_TRANSIENT
    assert out == ""
    line = one_error_line(err)
    assert "s3cret-pw" not in line
    assert "planner:***@127.0.0.1:1/history" in line


def test_a_directory_as_history_is_a_user_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(capsys, "history", "list", "--history", str(tmp_path))
    assert code == EXIT_USER_ERROR
    assert "is a directory" in one_error_line(err)


def test_a_history_path_whose_directory_does_not_exist_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A typo in the path must not start an empty history (every run would cold-start)."""
    typo = tmp_path / "histroy" / "h.db"
    for given in (str(typo), f"sqlite:///{typo}"):
        code, out, err = run(capsys, "history", "list", "--history", given)
        assert (code, out) == (EXIT_USER_ERROR, "")
        line = one_error_line(err)
        assert str(typo) in line and "does not exist" in line
    assert not typo.parent.exists()
    # A new file in an existing directory is how a user starts a history.
    code, _, _ = run(capsys, "history", "list", "--history", str(tmp_path / "new.db"))
    assert code == 0 and (tmp_path / "new.db").is_file()
    # The default location is created (the first run on a machine).
    assert not default_history_path().parent.exists()
    assert run(capsys, "history", "list")[0] == 0
    assert default_history_path().is_file()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """A 1 MiB tmpfs (root only: the chaos suite's full disk)."""
    yield from mounted_small_disk(tmp_path / "disk", 1)


def test_a_history_on_a_read_only_mount_says_read_only(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, small_disk: SmallDisk
) -> None:
    existing = small_disk.path / "h.db"
    assert run(capsys, "history", "list", "--history", str(existing))[0] == 0
    remount = ["mount", "-o", "remount,ro", str(small_disk.path)]
    subprocess.run(remount, check=True, capture_output=True)
    for db in (existing, small_disk.path / "new.db"):
        code, out, err = run(capsys, "history", "list", "--history", str(db))
        assert (code, out) == (EXIT_USER_ERROR, "")
        line = one_error_line(err)
        assert str(db) in line and "read-only" in line, line


def test_a_full_disk_is_disk_full_not_busy(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, small_disk: SmallDisk
) -> None:
    db = small_disk.path / "h.db"
    profile = write_profile(tmp_path / "p.json", make_profile("on-a-full-disk"))
    assert run(capsys, "history", "list", "--history", str(db))[0] == 0
    free = small_disk.fill()
    for argv in (
        ["record", "--profile", str(profile), "--history", str(db)],
        ["history", "list", "--history", str(small_disk.path / "new.db")],
    ):
        code, out, err = run(capsys, *argv)
        assert (code, out) == (EXIT_USER_ERROR, ""), err
        line = one_error_line(err)
        assert "disk full" in line and "busy" not in line, line
    free()
    assert run(capsys, "record", "--profile", str(profile), "--history", str(db))[0] == 0
    assert stored_ids(db) == ["on-a-full-disk"]


def test_a_postgres_database_that_does_not_exist_is_a_user_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = os.environ.get(POSTGRES_ENV)
    if not server:
        pytest.skip(reason=POSTGRES_SKIP)
    url = sa.make_url(server).set(database="no_such_history_db")
    given = url.render_as_string(hide_password=False)
    code, out, err = run(capsys, "history", "list", "--history", given)
    assert (code, out) == (EXIT_USER_ERROR, "")
    line = one_error_line(err)
    assert "'no_such_history_db'" in line and "no database" in line
    assert isinstance(url.password, str) and url.password not in line
    # A server that is down stays a temporary failure.
    down = url.set(port=1, database="dlrover_kfp").render_as_string(hide_password=False)
    assert run(capsys, "history", "list", "--history", down)[0] == EXIT_TRANSIENT


# -- import and export ------------------------------------------------------------------------


def _jsonl(path: Path, profiles: list[JobProfile]) -> Path:
    path.write_text("".join(to_json(p, indent=None) + "\n" for p in profiles), encoding="utf-8")
    return path


def test_export_then_import_round_trips(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, filled: Path
) -> None:
    dump = tmp_path / "out" / "backup.jsonl"
    code, out, _ = run(capsys, "history", "export", str(dump), "--history", str(filled))
    assert (code, json.loads(out)) == (0, {"file": str(dump), "profiles": 3})
    lines = dump.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["run_id"] for line in lines] == ["ads-1", "ads-2", "feed-1"]

    copy = tmp_path / "copy.db"
    code, out, _ = run(capsys, "history", "import", str(dump), "--history", str(copy))
    assert (code, json.loads(out)) == (0, {"file": str(dump), "new": 3, "skipped": 0})
    code, out, _ = run(capsys, "history", "import", str(dump), "--history", str(copy))
    assert json.loads(out) == {"file": str(dump), "new": 0, "skipped": 3}

    again = tmp_path / "again.jsonl"
    run(capsys, "history", "export", str(again), "--history", str(copy))
    assert again.read_bytes() == dump.read_bytes()
    with open_history(str(filled)) as a, open_history(str(copy)) as b:
        assert list(a.iter_profiles()) == list(b.iter_profiles())
        assert a.list() == b.list()
    assert not [p for p in dump.parent.iterdir() if p.name.startswith(".")]  # no temp files left


@pytest.mark.parametrize(
    ("bad_line", "expected"),
    [
        ("{not json", "malformed JSON"),
        ('{"run_id": "x"}', "required key is missing"),
        ("[1, 2, 3]", "expected a mapping"),
        (None, "run_id 'p-0' already appears on line 1"),
        (to_json(make_profile("bad", auc=1.5), indent=None), "metrics.auc: must be within [0, 1]"),
        (to_json(make_profile("bad", loss=-7.0), indent=None), "metrics.loss: must be at least 0"),
        (
            to_json(make_profile("bad"), indent=None).replace(
                '"samples_processed":', '"samples_processed":-1,"was":'
            ),
            "outcome.samples_processed",
        ),
    ],
    ids=[
        "malformed",
        "invalid",
        "not-an-object",
        "duplicate",
        "auc-above-1",
        "negative-loss",
        "negative-count",
    ],
)
def test_import_with_one_bad_line_imports_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, bad_line: str | None, expected: str
) -> None:
    good = [make_profile(f"p-{i}", started_at=T0 + i) for i in range(5)]
    lines = [to_json(p, indent=None) for p in good]
    lines.insert(1, "")  # blank lines are allowed
    lines.insert(4, bad_line if bad_line is not None else to_json(good[0], indent=None))
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    db = tmp_path / "h.db"
    code, out, err = run(capsys, "history", "import", str(path), "--history", str(db))
    assert code == EXIT_USER_ERROR
    assert out == ""
    line = one_error_line(err)
    assert f"{path}:5: " in line
    assert expected in line
    assert stored_ids(db) == []


def test_import_of_a_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(
        capsys, "history", "import", str(tmp_path / "x.jsonl"), "--history", str(tmp_path / "h.db")
    )
    assert code == EXIT_USER_ERROR
    assert "x.jsonl: no such file" in one_error_line(err)


def test_export_to_a_directory_is_a_user_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, filled: Path
) -> None:
    code, _, err = run(capsys, "history", "export", str(tmp_path), "--history", str(filled))
    assert code == EXIT_USER_ERROR
    assert "is a directory" in one_error_line(err)


# -- where the history is ---------------------------------------------------------------------


def test_history_flag_beats_the_environment_which_beats_the_default(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flag_db, env_db = tmp_path / "flag.db", tmp_path / "env.db"
    default_db = tmp_path / "xdg-data" / "dlrover-kfp" / "history.db"
    assert default_history_path() == default_db
    p1 = write_profile(tmp_path / "p1.json", make_profile("by-default"))
    p2 = write_profile(tmp_path / "p2.json", make_profile("by-env"))
    p3 = write_profile(tmp_path / "p3.json", make_profile("by-flag"))

    assert run(capsys, "record", "--profile", str(p1))[0] == 0
    monkeypatch.setenv(ENV_VAR, str(env_db))
    assert run(capsys, "record", "--profile", str(p2))[0] == 0
    assert run(capsys, "record", "--profile", str(p3), "--history", str(flag_db))[0] == 0

    assert stored_ids(default_db) == ["by-default"]
    assert stored_ids(env_db) == ["by-env"]
    assert stored_ids(flag_db) == ["by-flag"]


def test_resolve_history_url() -> None:
    env = {ENV_VAR: "postgresql://u:p@db/h"}
    assert resolve_history_url("sqlite:////x/y.db", env) == "sqlite:////x/y.db"
    assert resolve_history_url(None, env) == "postgresql://u:p@db/h"
    assert resolve_history_url(None, {ENV_VAR: "/data/h.db"}) == "sqlite:////data/h.db"
    assert resolve_history_url(None, {ENV_VAR: "  "}) == f"sqlite:///{default_history_path()}"
    assert resolve_history_url(None, {}) == f"sqlite:///{default_history_path()}"
    relative = resolve_history_url("rel/h.db", {})
    assert relative == f"sqlite:///{Path.cwd() / 'rel' / 'h.db'}"
    with pytest.raises(UserInputError, match="--history: empty"):
        resolve_history_url("", env)


# -- help -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ("record",),
        ("history",),
        ("history", "list"),
        ("history", "show"),
        ("history", "import"),
        ("history", "export"),
    ],
)
def test_every_command_has_help_with_an_example(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]
) -> None:
    with pytest.raises(SystemExit) as stop:
        main([*argv, "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "Example" in out
    assert "dlrover-kfp " + argv[0] in out
    if argv != ("history",):
        assert "--history URL" in out
