"""Shared set-up of the security tests: a throwaway Airflow home (the hook test imports Airflow,
which reads its configuration on first import), and a PostgreSQL schema of its own per test
when ``DLROVER_KFP_TEST_POSTGRES_URL`` names a server (``eval "$(bash .ci/postgres.sh)"``)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

if "AIRFLOW_HOME" not in os.environ:
    _home = tempfile.mkdtemp(prefix="dlrover-kfp-airflow-home-")
    os.environ["AIRFLOW_HOME"] = _home
    atexit.register(shutil.rmtree, _home, True)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

POSTGRES_ENV = "DLROVER_KFP_TEST_POSTGRES_URL"
POSTGRES_SKIP = (
    "PostgreSQL not available: set DLROVER_KFP_TEST_POSTGRES_URL (.ci/postgres.sh starts one)"
)


@pytest.fixture(scope="session")
def postgres_url() -> str:
    url = os.environ.get(POSTGRES_ENV, "").strip()
    if not url:
        pytest.skip(reason=POSTGRES_SKIP)
    pytest.importorskip("psycopg", reason="psycopg missing: pip install 'dlrover-kfp[postgres]'")
    return url


@pytest.fixture
def postgres_schema_url(postgres_url: str) -> Iterator[str]:
    """A URL whose ``search_path`` is a brand-new schema, dropped after the test."""
    schema = f"sec_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(postgres_url)
    try:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        url = sa.make_url(postgres_url).update_query_dict({"options": f"-csearch_path={schema}"})
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.dispose()
