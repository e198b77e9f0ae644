"""The record hand-off under what shared stores see: many drains at once, a PostgreSQL server
restarted while they run, a pending file that cannot be read, a history locked by another
session, runs of one job started in the same second, a relative SQLite URL.

Each case lost or duplicated a profile, or hung, before: 4 concurrent ``record --pending``
crashed 3 of them (a file another drain had recorded and removed), an unreadable pending file
failed every later run's record (its own profile neither recorded nor kept), a locked
PostgreSQL history hung every run's end with no limit, and 6 runs started together into one
history left 1 row.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from dlrover_kfp.cli.main import EXIT_TRANSIENT, main
from dlrover_kfp.core.documents import to_json
from dlrover_kfp.history import ENV_VAR, engine, open_history, pending, resolve_history_url
from dlrover_kfp.history.pending import (
    PENDING_ENV_VAR,
    QUARANTINE_DIR,
    keep_pending,
    pending_dir,
    record_or_keep,
)
from dlrover_kfp.runtime.job import new_run_id
from tests.factories import make_profile

pytestmark = pytest.mark.chaos

ROOT = Path(__file__).resolve().parents[2]
RESTART_ENV = "DLROVER_KFP_TEST_POSTGRES_RESTART"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setenv(PENDING_ENV_VAR, str(tmp_path / "pending"))


@pytest.fixture
def pg_url(postgres_schema_url: str) -> str:
    """A fresh schema of the test server (its URL carries its own ``?options=``)."""
    return postgres_schema_url


def _stored(url: str) -> list[str]:
    with open_history(url) as store:
        return sorted(s.run_id for s in store.list(limit=1000))


def _keep(url: str, n: int) -> list[str]:
    ids = [f"daily-{k:03d}" for k in range(n)]
    for k, run_id in enumerate(ids):
        keep_pending(url, make_profile(run_id=run_id, started_at=1_793_491_200.0 + k))
    return ids


def _drain(url: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "dlrover_kfp.cli.main", "record", "--pending", "--history", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _drains(url: str, n: int, during: threading.Thread | None = None) -> list[tuple[int, str]]:
    procs = [_drain(url) for _ in range(n)]
    if during is not None:
        during.start()
    outcomes = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert "Traceback" not in err, err
        outcomes.append((proc.returncode, out))
    if during is not None:
        during.join()
    return outcomes


def _recorded(outcomes: list[tuple[int, str]]) -> list[str]:
    return [r["run_id"] for code, out in outcomes if code == 0 for r in json.loads(out)["recorded"]]


def test_four_concurrent_drains_record_every_profile_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'history.db'}"
    _stored(url)
    ids = _keep(url, 60)
    outcomes = _drains(url, 4)
    assert [code for code, _ in outcomes] == [0, 0, 0, 0], outcomes
    recorded = _recorded(outcomes)
    assert sorted(recorded) == ids  # each by exactly one drain
    assert _stored(url) == ids
    assert not list(pending_dir(url).iterdir())


@pytest.mark.postgres
def test_drains_through_a_postgresql_restart_record_every_profile(pg_url: str) -> None:
    restart = os.environ.get(RESTART_ENV)
    if not restart:
        pytest.skip(f"{RESTART_ENV} not set: .ci/postgres.sh says how to restart its server")
    _stored(pg_url)
    ids = _keep(pg_url, 80)

    def restart_soon() -> None:
        time.sleep(1.0)
        subprocess.run(["bash", "-c", restart], check=True, capture_output=True, timeout=60)

    outcomes = _drains(pg_url, 4, during=threading.Thread(target=restart_soon))
    # Each drain ends recorded (0) or told to retry (75): none crashes, none loses a file.
    assert {code for code, _ in outcomes} <= {0, EXIT_TRANSIENT}, outcomes
    left = {p.name for p in pending_dir(pg_url).iterdir()}
    assert all(name.endswith(".json") and not name.startswith(".") for name in left), left
    [(code, _)] = _drains(pg_url, 1)
    assert code == 0
    assert _stored(pg_url) == ids
    assert not list(pending_dir(pg_url).iterdir())


def test_an_unreadable_pending_file_neither_stops_a_run_nor_the_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'history.db'}"
    _stored(url)
    ids = _keep(url, 3)
    bad = pending_dir(url) / "daily-bad.json"
    bad.write_text('{"run_id": "daily-bad", "tru')  # cut short
    os.utime(bad, (0, 0))  # the oldest: drained first
    own = make_profile(run_id="today", started_at=1_793_577_600.0)
    outcome = record_or_keep(url, own)
    assert outcome.recorded and outcome.new
    assert sorted(outcome.drained) == ids
    assert _stored(url) == sorted([*ids, "today"])
    set_aside = pending_dir(url) / QUARANTINE_DIR / "daily-bad.json"
    assert set_aside.exists()
    assert str(set_aside) in caplog.text
    assert not list(pending_dir(url).glob("*.json"))


def test_the_runs_own_profile_is_recorded_when_draining_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'history.db'}"
    _stored(url)
    _keep(url, 2)

    def broken(url: str, environ: object = None) -> list[tuple[str, bool]]:
        raise RuntimeError("the pending directory went away")

    monkeypatch.setattr(pending, "record_pending", broken)
    outcome = record_or_keep(url, make_profile(run_id="today"))
    assert outcome.recorded and outcome.drained == ()
    assert _stored(url) == ["today"]
    assert "stay in" in caplog.text
    assert len(list(pending_dir(url).glob("*.json"))) == 2  # still kept for later


@pytest.mark.postgres
def test_a_locked_postgresql_history_exits_75_within_its_lock_timeout(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _stored(pg_url)
    monkeypatch.setattr(engine, "SERVER_LOCK_TIMEOUT_S", 2)
    path = tmp_path / "p.json"
    path.write_text(to_json(make_profile(run_id="blocked")))
    holder = sa.create_engine(pg_url)
    try:
        with holder.connect() as conn:
            conn.exec_driver_sql("BEGIN")
            conn.exec_driver_sql("LOCK TABLE profiles IN ACCESS EXCLUSIVE MODE")
            t0 = time.monotonic()
            code = main(["record", "--profile", str(path), "--history", pg_url])
            took = time.monotonic() - t0
            conn.exec_driver_sql("ROLLBACK")
    finally:
        holder.dispose()
    err = capsys.readouterr().err
    assert code == EXIT_TRANSIENT, err
    assert 1.5 < took < 20, took
    assert "lock timeout" in err and "Traceback" not in err
    password = sa.make_url(pg_url).password
    assert password and str(password) not in err


@pytest.mark.postgres
def test_postgresql_waits_are_bounded_by_default(pg_url: str) -> None:
    """PostgreSQL's own defaults are 0, no limit: the store's engine sets both."""
    with open_history(pg_url) as store, store.engine.connect() as conn:
        lock = conn.exec_driver_sql("SHOW lock_timeout").scalar()
        statement = conn.exec_driver_sql("SHOW statement_timeout").scalar()
        path = conn.exec_driver_sql("SHOW search_path").scalar()
    assert (lock, statement) == ("30s", "1min")
    assert str(path).startswith("t_")  # the URL's own options are kept


def test_runs_of_one_job_started_in_one_second_get_their_own_rows(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'history.db'}"
    same_second = 1_796_601_600.4
    ids = {new_run_id("ctr-daily", same_second) for _ in range(6)}
    assert len(ids) == 6
    assert all(i.startswith("ctr-daily-20261207T000000-") for i in ids)
    for run_id in ids:
        assert record_or_keep(url, make_profile(run_id=run_id)).new
    assert _stored(url) == sorted(ids)


def test_a_relative_sqlite_url_keeps_its_pending_profiles_with_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    relative = "sqlite:///history.db"
    assert resolve_history_url(relative, {}) == f"sqlite:///{tmp_path / 'a' / 'history.db'}"
    here = pending_dir(relative)
    monkeypatch.chdir(tmp_path / "b")
    assert pending_dir(relative) != here  # another directory: another file, another store
    assert pending_dir(f"sqlite:///{tmp_path / 'a' / 'history.db'}") == here


def test_a_claim_left_by_a_dead_drain_is_taken_over_once_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drain killed between its claim and its record leaves ``.NAME.json.claim-*``: a fresh
    one belongs to a drain still at work and is left alone; one older than STALE_CLAIM_S is
    taken over, its age renewed while it is recorded (a rename keeps the mtime, so a third
    drain would have taken it again)."""
    url = f"sqlite:///{tmp_path / 'history.db'}"
    _stored(url)
    [run_id] = _keep(url, 1)
    directory = pending_dir(url)
    claim = directory / f".{run_id}.json.claim-deadbeef0000"
    (directory / f"{run_id}.json").rename(claim)
    assert pending.record_pending(url) == []  # a live drain's claim: not taken
    old = time.time() - pending.STALE_CLAIM_S - 60
    os.utime(claim, (old, old))
    ages = []
    recording = pending.record_profile

    def record(url: str, profile: object) -> bool:
        [held] = [p for p in directory.iterdir() if ".claim-" in p.name]
        ages.append(time.time() - held.stat().st_mtime)
        return recording(url, profile)  # type: ignore[arg-type]

    monkeypatch.setattr(pending, "record_profile", record)
    assert pending.record_pending(url) == [(run_id, True)]
    assert ages and ages[0] < 60, ages  # renewed, not left looking stale
    assert _stored(url) == [run_id]
    assert not [p for p in directory.iterdir() if p.is_file()]
