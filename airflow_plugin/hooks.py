"""The history store from an Airflow connection.

:class:`DlroverHistoryHook` turns a connection into the SQLAlchemy URL that
:func:`dlrover_kfp.history.open_history` takes, the way Airflow's own hooks turn a connection
into a client. What a connection may hold, first match wins:

1. ``extra`` with a ``url``: any SQLAlchemy URL (``postgresql+psycopg://...``,
   ``sqlite:////var/lib/dlrover-kfp/history.db``). The connection's password, when it has one,
   fills in a URL that names a user but no password, so that the secret stays in Airflow's
   password field.
2. A PostgreSQL server: connection type ``postgres``/``postgresql``, or this provider's type
   ``dlrover_kfp_history`` with a host: ``postgresql+psycopg://login:password@host:port/schema``.
   The other keys of ``extra`` (``sslmode``, ``connect_timeout``, ...) become URL parameters.
3. A SQLite file: connection type ``sqlite``, or ``dlrover_kfp_history`` without a host; the
   file is the host field, else the schema field (where ``sqlite:////path`` URIs put it).

The URL carries the password. It is handed only to the history store (and, for a training
run, to the job master's environment); whatever is shown (logs, exceptions, XCom) names the
store by :func:`describe_history_url`, which hides it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from airflow_plugin import CONNECTION_TYPE
from dlrover_kfp.errors import DlroverKfpError, UserInputError
from dlrover_kfp.history import SqlHistoryStore, open_history

if TYPE_CHECKING:
    from airflow.sdk import Connection

log = logging.getLogger(__name__)

#: The connection the operators and the example DAG use when it exists.
DEFAULT_CONN_ID: Final = "dlrover_kfp_history"

_POSTGRES_TYPES: Final = frozenset({"postgres", "postgresql"})
_SQLITE_TYPES: Final = frozenset({"sqlite"})
#: ``extra`` keys the hook reads itself (everything else of a PostgreSQL connection's extra
#: becomes a URL parameter).
_URL_KEY: Final = "url"


def history_url_from_connection(conn: Connection) -> str:
    """The history URL a connection describes (see the module docstring for the rules).

    Raises :class:`~dlrover_kfp.errors.UserInputError` naming the connection (never its
    password) when it describes no store.
    """
    extra = connection_extra(conn)
    conn_type = (conn.conn_type or "").lower()
    if extra.get(_URL_KEY):
        return _explicit_url(conn, str(extra[_URL_KEY]))
    if conn_type in _POSTGRES_TYPES or (conn_type == CONNECTION_TYPE and conn.host):
        if not conn.host:
            raise UserInputError(f"connection {conn.conn_id!r}: a PostgreSQL store needs a host")
        query = {str(k): str(v) for k, v in extra.items() if k != _URL_KEY}
        url = URL.create(
            "postgresql+psycopg",
            username=conn.login or None,
            password=conn.password or None,
            host=conn.host,
            port=conn.port or None,
            database=conn.schema or None,
            query=query,
        )
        return url.render_as_string(hide_password=False)
    if conn_type in _SQLITE_TYPES or conn_type == CONNECTION_TYPE:
        path = conn.host or conn.schema
        if not path:
            raise UserInputError(
                f"connection {conn.conn_id!r}: no SQLite file (set its host or schema to the "
                'file\'s path, or extra {"url": ...})'
            )
        database = os.path.abspath(os.path.expanduser(path))
        return URL.create("sqlite", database=database).render_as_string(hide_password=False)
    raise UserInputError(
        f"connection {conn.conn_id!r}: type {conn.conn_type!r} names no history store; use "
        f"{CONNECTION_TYPE!r}, 'postgres' or 'sqlite', or put a SQLAlchemy URL in extra "
        '{"url": ...}'
    )


def connection_extra(conn: Connection) -> dict[str, Any]:
    """The connection's ``extra`` as a dict. Parsed here rather than by ``extra_dejson``, which
    logs bad JSON and carries on with nothing; the message leaves the text out (it may hold
    secrets)."""
    if not conn.extra or not conn.extra.strip():
        return {}
    try:
        extra = json.loads(conn.extra)
    except ValueError:
        extra = None
    if not isinstance(extra, dict):
        raise UserInputError(f"connection {conn.conn_id!r}: extra is not a JSON object")
    return extra


def _explicit_url(conn: Connection, text: str) -> str:
    try:
        url = make_url(text)
    except (ArgumentError, ValueError):  # not a URL at all; a port that is not a number
        raise UserInputError(
            f"connection {conn.conn_id!r}: extra url is not a SQLAlchemy URL"
        ) from None
    if conn.password and url.password is None and url.username:
        url = url.set(password=conn.password)
    return url.render_as_string(hide_password=False)


def describe_history_url(url: str) -> str:
    """How messages name a store: the URL with its password hidden."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "<unparsable history URL>"


class DlroverHistoryHook(BaseHook):
    """The dlrover-kfp history store an Airflow connection names.

    :param conn_id: the connection (default ``dlrover_kfp_history``).
    """

    conn_name_attr = "conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = CONNECTION_TYPE
    hook_name = "dlrover-kfp history store"

    def __init__(self, conn_id: str = DEFAULT_CONN_ID) -> None:
        super().__init__()
        self.conn_id = conn_id

    def get_history_url(self) -> str:
        """The store's SQLAlchemy URL, password included: hand it to the store only."""
        url = history_url_from_connection(self.get_connection(self.conn_id))
        _mask(url)
        return url

    def get_store(self) -> SqlHistoryStore:
        """The opened (and migrated) history store; the caller closes it."""
        return open_history(self.get_history_url())

    def get_conn(self) -> SqlHistoryStore:
        return self.get_store()

    def test_connection(self) -> tuple[bool, str]:
        """For the UI's and ``airflow connections test``'s button: open the store and count."""
        try:
            store = self.get_store()
            try:
                count = store.count()
            finally:
                store.close()
        except DlroverKfpError as exc:  # the store's own errors hide the password
            return False, str(exc)
        return True, f"history store reachable: {count} run(s)"


def _mask(url: str) -> None:
    """Ask Airflow to mask a URL with a password in task logs as a whole (the password alone
    is masked already, as every connection's is). A URL without one (a SQLite file) stays
    readable."""
    if make_url(url).password is None:
        return
    try:
        from airflow.sdk.log import mask_secret  # noqa: PLC0415 - not in every task SDK
    except ImportError:  # pragma: no cover - older task SDKs
        return
    mask_secret(url)


def resolve_history_url(
    *,
    conn_id: str | None = DEFAULT_CONN_ID,
    url: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> tuple[str, str]:
    """The history store a task uses, and where it came from (for the log).

    ``url`` when given (a non-empty string); else the connection ``conn_id`` when it is
    configured; else ``$DLROVER_KFP_HISTORY_URL``; else the default SQLite file in the user
    data directory (:func:`dlrover_kfp.steps.spec.history_url_or_default`). A connection that
    is not configured is not an error: a first run needs nothing set up.
    """
    # Here, not at the top: the steps import the planner (scipy), and DAG files import this
    # module (through the operators) every time they are parsed.
    from dlrover_kfp.steps.spec import history_url_or_default  # noqa: PLC0415

    if url and url.strip():
        return history_url_or_default(url, environ), "the task's history_url"
    if conn_id:
        try:
            resolved = DlroverHistoryHook(conn_id).get_history_url()
        except AirflowNotFoundException:
            log.debug("connection %s is not configured", conn_id)
        else:
            return resolved, f"connection {conn_id}"
    source = (
        "$DLROVER_KFP_HISTORY_URL"
        if environ.get("DLROVER_KFP_HISTORY_URL", "").strip()
        else "the default store"
    )
    return history_url_or_default(None, environ), source


__all__ = [
    "DEFAULT_CONN_ID",
    "DlroverHistoryHook",
    "describe_history_url",
    "history_url_from_connection",
    "resolve_history_url",
]
