"""Hostile text in the fields of a profile goes through the history store as data.

A job's name and scenario are free text chosen by whoever writes the job spec; the store must
keep them byte for byte and run none of them. Each profile is recorded, then read back through
every query that takes user text (get, list by scenario, find_similar), and the schema is
checked whole afterwards: same tables, same row counts. Runs on SQLite, and on PostgreSQL when
``DLROVER_KFP_TEST_POSTGRES_URL`` is set. ``test_source_rules.py`` checks the same from the
source side (no SQL built from strings).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from dlrover_kfp.core.documents import parse, to_dict
from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.errors import NotFoundError, SpecError
from dlrover_kfp.history import SqlHistoryStore, open_history
from dlrover_kfp.ports import SimilarityQuery
from tests.factories import make_profile

HOSTILE = [
    "x'); DROP TABLE profiles;--",
    "Robert'); DROP TABLE job_summaries; --",
    "Robert'); --",
    "' OR '1'='1",
    '" OR ""="',
    "1; DELETE FROM schema_version",
    "%s %(name)s {0} :run_id ? $1",  # placeholders of every paramstyle
    "back\\slash \\' \\\" ; --",
    "nul-free ünïcödé \u202e 日本語 🎯",  # with a right-to-left override
    "a" * 2000,  # far longer than run_id's column, in a Text column
]
TABLES = {"profiles", "job_summaries", "schema_version"}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'history.db'}"
    url: str = request.getfixturevalue("postgres_schema_url")
    return url


def schema_of(store: SqlHistoryStore) -> dict[str, int]:
    """Every table of the store with its row count."""
    with store.engine.connect() as conn:
        names = set(sa.inspect(conn).get_table_names())
        assert names >= TABLES, f"tables missing: {TABLES - names}"
        return {
            name: int(
                conn.execute(sa.select(sa.func.count()).select_from(sa.table(name))).scalar_one()
            )
            for name in sorted(names)
        }


def test_hostile_names_and_scenarios_are_stored_and_read_back_intact(store_url: str) -> None:
    store = open_history(store_url)
    try:
        benign = make_profile("run-benign", scenario="ads-ctr")
        store.record(benign)
        before = schema_of(store)
        for k, text in enumerate(HOSTILE):
            profile = make_profile(f"run-{k}", name=text, scenario=text)
            assert store.record(profile) is True
            assert store.get(profile.run_id) == profile
            listed = store.list(scenario=text)
            assert [s.run_id for s in listed] == [profile.run_id]
            assert listed[0].name == text and listed[0].scenario == text
            similar = store.find_similar(
                SimilarityQuery(scenario=text, model_signature="unused", limit=5)
            )
            assert [s.run_id for s in similar] == [profile.run_id]
        after = schema_of(store)
        assert after["profiles"] == before["profiles"] + len(HOSTILE)
        assert after["job_summaries"] == before["job_summaries"] + len(HOSTILE)
        assert after["schema_version"] == before["schema_version"]
        assert set(after) == set(before)
        assert store.get("run-benign") == benign
        assert [s.run_id for s in store.list(scenario="ads-ctr")] == ["run-benign"]
    finally:
        store.close()


def test_a_hostile_run_id_is_refused_by_the_contract_and_lookups_by_it_find_nothing(
    store_url: str,
) -> None:
    store = open_history(store_url)
    try:
        store.record(make_profile("run-benign"))
        before = schema_of(store)
        for text in HOSTILE[:4]:
            # run_id is [A-Za-z0-9._:-]{1,128} by contract: a profile document (what `record`
            # and the pipeline step read) naming such a run is refused before any SQL.
            document = {**to_dict(make_profile("run-x")), "run_id": text}
            with pytest.raises(SpecError, match="run_id"):
                parse(JobProfile, document, "profile.json")
            with pytest.raises(NotFoundError) as missing:
                store.get(text)
            assert repr(text) in str(missing.value)
        assert schema_of(store) == before
    finally:
        store.close()
