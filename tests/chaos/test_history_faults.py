"""The history store locked or unreachable when a run ends: the profile is kept, never lost.

Real stores: a SQLite file held by another connection's exclusive transaction (as a long
writer or a backup holds it), and a PostgreSQL URL whose port nothing listens on. The profile
goes to the store's pending directory with an event that says why; the next run into the same
store records it first, and ``dlrover-kfp record --pending`` records it on demand.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dlrover_kfp.cli.main import EXIT_TRANSIENT, main
from dlrover_kfp.core.documents import to_json
from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.files import read_document
from dlrover_kfp.history import ENV_VAR, open_history
from dlrover_kfp.history.pending import PENDING_ENV_VAR, pending_dir, record_or_keep
from dlrover_kfp.runtime.job import RunResult
from dlrover_kfp.runtime.launch import record_run
from tests.factories import make_profile

pytestmark = pytest.mark.chaos


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setenv(PENDING_ENV_VAR, str(tmp_path / "pending"))


def _url(db: Path) -> str:
    # A short busy timeout: the store is "locked" after half a second instead of 30 s.
    return f"sqlite:///{db}?timeout=0.5"


@contextmanager
def locked(db: Path) -> Iterator[None]:
    """Another connection holds the file's write lock (and blocks readers: EXCLUSIVE)."""
    other = sqlite3.connect(db, timeout=0)
    try:
        other.execute("BEGIN EXCLUSIVE")
        yield
    finally:
        other.rollback()
        other.close()


def _stored(db: Path) -> list[str]:
    with open_history(str(db)) as store:
        return sorted(s.run_id for s in store.list(limit=100))


def test_a_locked_store_keeps_the_profile_and_the_next_run_records_it(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    url = _url(db)
    _stored(db)  # the schema exists; the lock below is on a real history
    first = make_profile(run_id="daily-1", started_at=1_793_491_200.0)
    with locked(db):
        outcome = record_or_keep(url, first)
    assert not outcome.recorded and outcome.kept is not None
    kept = read_document(JobProfile, outcome.kept)
    event = kept.events[-1]
    assert event.kind == "failure" and "history unavailable at record time" in event.detail
    assert "dlrover-kfp record --pending" in event.detail
    assert _stored(db) == []
    # The next run into the same store records the kept profile first, then its own.
    second = make_profile(run_id="daily-2", started_at=1_793_577_600.0)
    outcome = record_or_keep(url, second)
    assert outcome.recorded and outcome.new and outcome.drained == ("daily-1",)
    assert _stored(db) == ["daily-1", "daily-2"]
    assert not list(pending_dir(url).glob("*.json"))
    with open_history(str(db)) as store:
        stored = store.get("daily-1")
    assert stored.events[-1] == event  # the profile as kept, with its event


def test_record_pending_records_what_an_unreachable_server_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """PostgreSQL down (nothing listens on port 1): the run's profile.json and the pending copy
    get the event; the password is in neither. Later ``record --pending`` puts it in a store
    (here the same pending directory drained into SQLite by naming that URL's directory)."""
    url = "postgresql://trainer:hunter2-secret@127.0.0.1:1/history?connect_timeout=1"
    profile = make_profile(run_id="daily-3", started_at=1_793_491_200.0)
    out = tmp_path / "run"
    out.mkdir()
    (out / "profile.json").write_text(to_json(profile))
    lines: list[str] = []
    result = record_run(
        url, RunResult(profile=profile, output_dir=out, model_dir=None), lines.append
    )
    assert result.profile.events[-1].kind == "failure"
    written = (out / "profile.json").read_text()
    assert "history unavailable at record time" in written
    kept = list(pending_dir(url).glob("*.json"))
    assert [p.name for p in kept] == ["daily-3.json"]
    for text in (written, kept[0].read_text(), *lines):
        assert "hunter2-secret" not in text
    # The server is still down: record --pending fails with the transient exit code and keeps it.
    code = main(["record", "--pending", "--history", url])
    assert code == EXIT_TRANSIENT
    assert [p.name for p in pending_dir(url).glob("*.json")] == ["daily-3.json"]
    capsys.readouterr()


def test_record_pending_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "history.db"
    url = _url(db)
    _stored(db)
    with locked(db):
        for k in range(3):
            record_or_keep(url, make_profile(run_id=f"daily-{k}", started_at=1_793_491_200.0 + k))
    assert len(list(pending_dir(url).glob("*.json"))) == 3
    with locked(db):
        code = main(["record", "--pending", "--history", url])
    assert code == EXIT_TRANSIENT  # transient: try again
    assert len(list(pending_dir(url).glob("*.json"))) == 3  # nothing lost on the way
    capsys.readouterr()
    code = main(["record", "--pending", "--history", url])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert sorted(r["run_id"] for r in out["recorded"]) == ["daily-0", "daily-1", "daily-2"]
    assert all(r["new"] for r in out["recorded"])
    assert _stored(db) == ["daily-0", "daily-1", "daily-2"]
    assert not list(pending_dir(url).glob("*.json"))
    # Nothing left: a second call records nothing.
    assert main(["record", "--pending", "--history", url]) == 0
    assert json.loads(capsys.readouterr().out) == {"recorded": []}
