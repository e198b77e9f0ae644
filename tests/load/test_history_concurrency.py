"""The history store under concurrent recording: ``benchmarks/history_concurrency.py`` at 8
writer processes x 20 profiles (+5 runs each shares with the next process), on a fresh SQLite
file and, when ``DLROVER_KFP_TEST_POSTGRES_URL`` names a server, on PostgreSQL.

The benchmark's checks are the assertions: no record call failed (a "database is locked" would
be one), every run stored exactly once and read back equal, and the "new" answers add up to the
distinct runs (recording is idempotent on run_id even when two processes race on one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.load.conftest import load_benchmark

bench: Any = load_benchmark("history_concurrency")

pytestmark = pytest.mark.timeout(120)

SIZE = {"processes": 8, "profiles": 20, "shared": 5}


def _check(result: dict[str, Any]) -> None:
    assert result["problems"] == []
    assert result["failures"] == 0
    assert result["distinct_runs"] == 8 * 20 + 8 * 5
    assert result["stored"] == result["distinct_runs"]
    assert result["record_calls"] == 8 * (20 + 2 * 5)
    assert result["ok"]


def test_concurrent_sqlite_writers_store_every_run_once(tmp_path: Path) -> None:
    _check(bench.run(f"sqlite:///{tmp_path / 'history.db'}", **SIZE))


@pytest.mark.postgres
def test_concurrent_postgres_writers_store_every_run_once(postgres_schema_url: str) -> None:
    _check(bench.run(postgres_schema_url, **SIZE))
