"""The history hook: an Airflow connection -> a history store URL, the password never shown."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

pytest.importorskip("airflow.sdk", reason="the airflow extra is not installed")

from airflow.sdk import Connection
from airflow.sdk.exceptions import AirflowNotFoundException
from sqlalchemy.engine import make_url

from airflow_plugin.hooks import (
    DEFAULT_CONN_ID,
    DlroverHistoryHook,
    describe_history_url,
    history_url_from_connection,
    resolve_history_url,
)
from airflow_plugin.operators import PlanResourcesOperator
from dlrover_kfp.errors import UserInputError

SECRET = "pa:ss@w/rd-7Qx"  # characters that must be escaped in a URL


@contextlib.contextmanager
def _connections(**config: object) -> Iterator[mock.MagicMock]:
    """Patch the hook's connection lookup with a strict mock (the classmethod's signature)."""
    strict = mock.create_autospec(DlroverHistoryHook.get_connection, **config)
    with mock.patch.object(DlroverHistoryHook, "get_connection", new=staticmethod(strict)):
        yield strict


def _conn(**fields: object) -> Connection:
    return Connection(conn_id=DEFAULT_CONN_ID, **fields)  # type: ignore[arg-type]


def test_a_postgres_connection_becomes_a_psycopg_url_with_its_password() -> None:
    conn = _conn(
        conn_type="postgres",
        host="db.example",
        port=5433,
        login="dlrover",
        password=SECRET,
        schema="history",
        extra=json.dumps({"sslmode": "require"}),
    )
    url = make_url(history_url_from_connection(conn))
    assert url.drivername == "postgresql+psycopg"
    assert (url.host, url.port, url.username, url.database) == (
        "db.example",
        5433,
        "dlrover",
        "history",
    )
    assert url.password == SECRET
    assert url.query == {"sslmode": "require"}


def test_the_providers_own_type_with_a_host_is_postgres_without_one_sqlite(tmp_path: Path) -> None:
    server = _conn(conn_type="dlrover_kfp_history", host="db", login="u", password=SECRET)
    assert make_url(history_url_from_connection(server)).drivername == "postgresql+psycopg"
    file = _conn(conn_type="dlrover_kfp_history", schema=str(tmp_path / "h.db"))
    assert history_url_from_connection(file) == f"sqlite:///{tmp_path / 'h.db'}"


def test_a_sqlite_connection_names_its_file_in_host_or_schema(tmp_path: Path) -> None:
    from_uri = Connection.from_uri(f"sqlite:///{tmp_path}/a.db", conn_id="x")  # path in schema
    assert history_url_from_connection(from_uri) == f"sqlite:///{tmp_path}/a.db"
    from_ui = _conn(conn_type="sqlite", host=str(tmp_path / "b.db"))
    assert history_url_from_connection(from_ui) == f"sqlite:///{tmp_path}/b.db"


def test_an_explicit_url_in_extra_wins_and_takes_the_password_field() -> None:
    conn = _conn(
        conn_type="dlrover_kfp_history",
        host="ignored",
        password=SECRET,
        extra=json.dumps({"url": "postgresql+psycopg://dlrover@db2/hist"}),
    )
    url = make_url(history_url_from_connection(conn))
    assert (url.host, url.username, url.password) == ("db2", "dlrover", SECRET)
    no_user = _conn(conn_type="sqlite", extra=json.dumps({"url": "sqlite:////var/h.db"}))
    assert history_url_from_connection(no_user) == "sqlite:////var/h.db"
    empty_extra = _conn(conn_type="sqlite", host="/var/h.db", extra="{}")
    assert history_url_from_connection(empty_extra) == "sqlite:////var/h.db"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"conn_type": "http", "host": "x", "password": SECRET}, "type 'http' names no history"),
        ({"conn_type": "sqlite", "password": SECRET}, "no SQLite file"),
        ({"conn_type": "postgres", "password": SECRET}, "needs a host"),
        (
            {"conn_type": "postgres", "host": "h", "password": SECRET, "extra": "{not json"},
            "not a JSON",
        ),
        ({"conn_type": "postgres", "host": "h", "extra": f'["{SECRET}"]'}, "not a JSON object"),
        # make_url's two refusals: not a URL at all, and a port that is not a number
        ({"conn_type": "sqlite", "extra": '{"url": "not a url"}'}, "not a SQLAlchemy URL"),
        (
            {
                "conn_type": "sqlite",
                "password": SECRET,
                "extra": '{"url": "postgresql://u@h:port/db"}',
            },
            "not a SQLAlchemy URL",
        ),
    ],
)
def test_a_connection_that_names_no_store_is_a_user_error_without_its_password(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(UserInputError, match=message) as caught:
        history_url_from_connection(_conn(**fields))
    assert DEFAULT_CONN_ID in str(caught.value)
    assert SECRET not in str(caught.value)


def test_the_hook_reads_its_connection_and_describes_the_store_without_the_password() -> None:
    conn = _conn(conn_type="postgres", host="db", login="u", password=SECRET, schema="h")
    with _connections(return_value=conn) as get_connection:
        hook = DlroverHistoryHook()
        url = hook.get_history_url()
    get_connection.assert_called_once_with(DEFAULT_CONN_ID)
    assert make_url(url).password == SECRET
    shown = describe_history_url(url)
    assert SECRET not in shown and "***" in shown
    assert SECRET not in repr(hook)
    assert describe_history_url("not a url ://") == "<unparsable history URL>"
    assert describe_history_url("postgresql://u:pw@h:port/db") == "<unparsable history URL>"


def test_the_hook_opens_a_sqlite_store(tmp_path: Path) -> None:
    conn = _conn(conn_type="sqlite", host=str(tmp_path / "h.db"))
    with _connections(return_value=conn):
        hook = DlroverHistoryHook()
        store = hook.get_store()
        try:
            assert store.count() == 0
        finally:
            store.close()
        assert hook.test_connection() == (True, "history store reachable: 0 run(s)")
    assert (tmp_path / "h.db").exists()


def test_resolution_order_url_then_connection_then_environment_then_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"DLROVER_KFP_HISTORY_URL": f"sqlite:///{tmp_path}/env.db"}
    conn = _conn(conn_type="sqlite", host=str(tmp_path / "conn.db"))
    with _connections(return_value=conn):
        assert resolve_history_url(url=str(tmp_path / "given.db"), environ=env) == (
            f"sqlite:///{tmp_path}/given.db",
            "the task's history_url",
        )
        assert resolve_history_url(environ=env) == (
            f"sqlite:///{tmp_path}/conn.db",
            f"connection {DEFAULT_CONN_ID}",
        )
        assert resolve_history_url(conn_id=None, environ=env)[1] == "$DLROVER_KFP_HISTORY_URL"
    missing = AirflowNotFoundException(f"The conn_id `{DEFAULT_CONN_ID}` isn't defined")
    with _connections(side_effect=missing):
        assert resolve_history_url(url="  ", environ=env) == (
            f"sqlite:///{tmp_path}/env.db",
            "$DLROVER_KFP_HISTORY_URL",
        )
        monkeypatch.setattr("platformdirs.user_data_dir", lambda *a, **k: str(tmp_path / "data"))
        url, source = resolve_history_url(environ={})
    assert (url, source) == (f"sqlite:///{tmp_path}/data/history.db", "the default store")


def test_the_operators_log_the_store_never_the_password(caplog: pytest.LogCaptureFixture) -> None:
    conn = _conn(conn_type="postgres", host="db", login="u", password=SECRET, schema="h")
    operator = PlanResourcesOperator(task_id="plan", job_spec="job.yaml")
    logger = logging.getLogger("test.dlrover_kfp.airflow")
    with (
        caplog.at_level(logging.DEBUG),
        _connections(return_value=conn),
    ):
        url = operator._history(logger)
    assert make_url(url).password == SECRET
    assert "postgresql+psycopg://u:***@db/h (from connection dlrover_kfp_history)" in caplog.text
    assert SECRET not in caplog.text
