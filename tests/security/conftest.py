"""Shared set-up of the security tests: a throwaway Airflow home (the hook test imports Airflow,
which reads its configuration on first import), and a PostgreSQL schema of its own per test
when ``DLROVER_KFP_TEST_POSTGRES_URL`` names a server (``eval "$(bash .ci/postgres.sh)"``)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

if "AIRFLOW_HOME" not in os.environ:
    _home = tempfile.mkdtemp(prefix="dlrover-kfp-airflow-home-")
    os.environ["AIRFLOW_HOME"] = _home
    atexit.register(shutil.rmtree, _home, True)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

# The history suite's PostgreSQL fixtures: a session URL, and a fresh schema per test.
from tests.contract.test_history_store import postgres_schema_url, postgres_url

__all__ = ["postgres_schema_url", "postgres_url"]
