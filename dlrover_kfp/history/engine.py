"""SQLAlchemy engines for the history store, and what their errors mean to a caller.

Three things live here because both the store (``sql.py``) and the migrations need them:

* **Engine settings.** SQLite gets WAL (readers never wait for the writer), a 30 s busy timeout
  (a writer waits for another instead of failing at once) and foreign keys, and SQLAlchemy takes
  over ``BEGIN`` from Python's ``sqlite3`` so that write transactions start with
  ``BEGIN IMMEDIATE``. A deferred transaction that reads and then writes can fail with "database
  is locked" *without* waiting when another process committed in between (WAL snapshots cannot
  be upgraded); taking the write lock up front turns that into an orderly wait.
* **Error meaning.** A driver error becomes a :class:`HistoryUnavailableError` (locked, server
  down: retrying may help), a :class:`HistoryDiskFullError` (the store's disk is full: no retry
  frees it), a :class:`HistoryCorruptError` (not our database, damaged schema) or a
  :class:`UserInputError` (wrong password, no such database, a read-only or unusable path).
* **Secrets.** Every message names the store by :func:`describe_url`, which hides the password.
"""

from __future__ import annotations

import os
import random
import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Connection, Engine

from dlrover_kfp.errors import (
    DlroverKfpError,
    HistoryCorruptError,
    HistoryDiskFullError,
    HistoryUnavailableError,
    UserInputError,
)

#: How long a SQLite writer waits for another before giving up (seconds). Recording a profile
#: takes milliseconds, so 30 s only runs out when something holds the file for far too long.
SQLITE_BUSY_TIMEOUT_S = 30.0

#: How long to wait for a database server to answer a connection attempt (seconds).
SERVER_CONNECT_TIMEOUT_S = 10

#: PostgreSQL: how long one statement waits for a lock another session holds (a table locked
#: by hand, a long migration), and how long any statement may run (seconds). PostgreSQL's
#: defaults are 0, no limit: a locked history made every run's end hang with no message. As
#: SQLite's busy timeout, far longer than a record takes; a statement stopped by either is
#: SQLSTATE 55P03 or 57014, a transient error (exit 75, retry later).
SERVER_LOCK_TIMEOUT_S = 30
SERVER_STATEMENT_TIMEOUT_S = 60

#: Execution option that marks a connection's next transaction as a writer (BEGIN IMMEDIATE).
_WRITE_OPTION = "dlrover_kfp_write"

#: PostgreSQL SQLSTATE classes that say "try again later".
_PG_TRANSIENT_CLASSES = ("08", "53", "57", "58")
_PG_TRANSIENT_STATES = frozenset({"40001", "40P01", "55P03"})

_SQLITE_TRANSIENT = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_IOERR")

#: Free space (bytes) below which SQLite's "disk I/O error" is read as a full disk. Recording a
#: profile writes the 32 KiB WAL index and the profile's pages (tens to hundreds of KiB), so a
#: disk with under 1 MiB free fails with ENOSPC, which SQLite reports as a plain I/O error.
DISK_FULL_BELOW_BYTES = 1 << 20

_SQLITE_CORRUPT = ("SQLITE_NOTADB", "SQLITE_CORRUPT")
_SQLITE_UNUSABLE = ("SQLITE_CANTOPEN", "SQLITE_READONLY", "SQLITE_PERM", "SQLITE_AUTH")


def parse_url(url: str) -> URL:
    """Parse a history URL; ``postgresql://`` means psycopg 3 (the driver our extra installs)."""
    try:
        parsed = sa.make_url(url)
    except (sa_exc.ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise UserInputError(f"history URL {mask_url_text(url)!r} is not a valid URL") from None
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def mask_url_text(url: str) -> str:
    """Hide the password in a URL given as text, even when SQLAlchemy cannot parse it (and a
    ``password=`` query parameter, which libpq reads too)."""
    try:
        text = sa.make_url(url).render_as_string(hide_password=True)
    except (sa_exc.ArgumentError, ValueError):
        # ValueError: an unescaped ":" or "@" in the password made the rest read as a port.
        text = _URL_PASSWORD.sub(r"\1***@", url)
    return _CONNINFO_PASSWORD.sub(r"\1***", text)


def is_sqlite(url: URL) -> bool:
    return url.get_backend_name() == "sqlite"


def sqlite_path(url: URL) -> str | None:
    """The file a SQLite URL names, or None for an in-memory database."""
    database = url.database
    if not database or database == ":memory:" or url.query.get("mode") == "memory":
        return None
    return database


def describe_url(url: URL) -> str:
    """How messages name a store: a SQLite file by its path, a server by its URL sans password."""
    if is_sqlite(url):
        return sqlite_path(url) or "in-memory SQLite database"
    # a password in the query (``?password=``, which libpq reads) is hidden too
    return _CONNINFO_PASSWORD.sub(r"\1***", url.render_as_string(hide_password=True))


def create_history_engine(url: URL) -> Engine:
    """An engine configured for the history store (see the module docstring for why)."""
    if not is_sqlite(url):
        # pre_ping: a pooled connection the server dropped is replaced, not reported as an error.
        # connect_timeout: an unreachable server is a quick transient error, not a long hang.
        server_args: dict[str, Any] = {}
        if url.get_backend_name() == "postgresql":
            if "connect_timeout" not in url.query:
                server_args["connect_timeout"] = SERVER_CONNECT_TIMEOUT_S
            server_args["options"] = _pg_options(url)
        return sa.create_engine(url, pool_pre_ping=True, connect_args=server_args)
    connect_args: dict[str, Any] = {}
    if "timeout" not in url.query:
        connect_args["timeout"] = SQLITE_BUSY_TIMEOUT_S
    engine = sa.create_engine(url, connect_args=connect_args)
    event.listen(engine, "connect", _sqlite_on_connect)
    event.listen(engine, "begin", _sqlite_on_begin)
    return engine


def _pg_options(url: URL) -> str:
    """The URL's own ``?options=`` (a ``search_path``, say) with the bounded waits added,
    each unless the URL sets it itself."""
    given = url.query.get("options", "")
    own = " ".join(given) if isinstance(given, tuple) else given
    parts = [own] if own else []
    for name, seconds in (
        ("lock_timeout", SERVER_LOCK_TIMEOUT_S),
        ("statement_timeout", SERVER_STATEMENT_TIMEOUT_S),
    ):
        if name not in own:
            parts.append(f"-c {name}={int(seconds * 1000)}")
    return " ".join(parts)


def _sqlite_on_connect(dbapi_connection: Any, connection_record: Any) -> None:
    """Per-connection SQLite settings; also hands BEGIN over to :func:`_sqlite_on_begin`."""
    del connection_record
    # Python's sqlite3 would otherwise BEGIN (deferred) on its own before DML and never
    # before SELECT; with isolation_level None it leaves transactions entirely to us.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA foreign_keys=ON")
        _switch_to_wal(cursor)
    finally:
        cursor.close()


def _switch_to_wal(cursor: sqlite3.Cursor) -> None:
    """Put the file in WAL mode once; the mode is stored in the file, so later opens only read it.

    Switching needs an exclusive lock, and SQLite answers "database is locked" at once, without
    its busy handler, when processes opening a fresh file race to switch it. So the switch is
    retried with a growing pause for up to the busy timeout; the loser of the race then reads
    "wal" and stops.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    pause = 0.002
    while True:
        # Reading the mode first avoids asking for a write lock on every connect.
        (mode,) = cursor.execute("PRAGMA journal_mode").fetchone()
        if str(mode).lower() in ("wal", "memory"):
            return
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause * (0.5 + random.random()))
        pause = min(pause * 2, 0.1)


def _sqlite_on_begin(conn: Connection) -> None:
    write = bool(conn.get_execution_options().get(_WRITE_OPTION, False))
    conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


@contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """A transaction that will write: on SQLite it holds the write lock from its first statement.

    Commits when the block ends normally, rolls back on any exception.
    """
    with engine.connect() as conn:
        conn.execution_options(**{_WRITE_OPTION: True})
        with conn.begin():
            yield conn


@contextmanager
def read_transaction(engine: Engine) -> Iterator[Connection]:
    """A read-only transaction: one consistent snapshot, never blocks a SQLite writer (WAL)."""
    with engine.connect() as conn, conn.begin():
        yield conn


@contextmanager
def translated_errors(where: str, secret: str | None = None) -> Iterator[None]:
    """Turn driver errors raised inside the block into this package's error types.

    ``where`` names the store in messages; ``secret`` (the URL's password) is scrubbed from any
    driver text that is quoted.
    """
    try:
        yield
    except sa_exc.DBAPIError as exc:
        raise classify_error(exc, where, secret) from exc
    except sa_exc.TimeoutError as exc:
        raise HistoryUnavailableError(f"{where}: no free database connection ({exc})") from exc


def classify_error(exc: sa_exc.DBAPIError, where: str, secret: str | None) -> DlroverKfpError:
    """The package error that says what a driver error means for the caller."""
    orig = exc.orig
    text = mask_password(_first_line(str(orig) if orig is not None else str(exc)), secret)
    if isinstance(orig, sqlite3.Error):
        return _classify_sqlite(orig, text, where)
    state = getattr(orig, "sqlstate", None)
    if isinstance(state, str):
        if state.startswith("28"):
            return UserInputError(f"{where}: the server refused the login: {text}")
        if state == "3D000":
            return UserInputError(f"{where}: no such database: {text}")
        if state == "53100":  # disk_full: the server's disk, freed by no retry
            return HistoryDiskFullError(f"{where}: disk full on the database server: {text}")
        if state.startswith(_PG_TRANSIENT_CLASSES) or state in _PG_TRANSIENT_STATES:
            return HistoryUnavailableError(f"{where}: {text}")
        if state in ("42P01", "42703"):
            return HistoryCorruptError(f"{where}: the history schema is damaged: {text}")
    missing = _MISSING_DATABASE.search(text)
    if missing:
        # psycopg 3 raises a failed connection's FATAL 3D000 with no SQLSTATE, like a login:
        # a database that does not exist will not exist on a retry either.
        return UserInputError(
            f"{where}: the server has no database {missing.group(1)!r}: create it "
            "(CREATE DATABASE) or fix the database name in the URL"
        )
    if _REFUSED_LOGIN.search(text):
        # psycopg 3 raises a failed connection's login refusal with no SQLSTATE: a wrong
        # password is the user's to fix, not a transient error to retry.
        return UserInputError(f"{where}: the server refused the login: {text}")
    if isinstance(exc, sa_exc.OperationalError) or exc.connection_invalidated:
        return HistoryUnavailableError(f"{where}: cannot reach the history database: {text}")
    return HistoryCorruptError(f"{where}: database error: {text}")


#: How PostgreSQL words a connection to a database that does not exist (FATAL 3D000).
_MISSING_DATABASE = re.compile(r"database \"([^\"]*)\" does not exist")

#: How PostgreSQL words a refused login (FATAL 28P01 / 28000), as the driver quotes it.
_REFUSED_LOGIN = re.compile(
    r"password authentication failed|no pg_hba\.conf entry|role \"[^\"]*\" does not exist"
)


def _classify_sqlite(orig: sqlite3.Error, text: str, where: str) -> DlroverKfpError:
    name = str(getattr(orig, "sqlite_errorname", ""))
    damaged = "not a database" in text or "malformed" in text
    if name.startswith(_SQLITE_CORRUPT) or (isinstance(orig, sqlite3.DatabaseError) and damaged):
        return HistoryCorruptError(f"{where}: not a dlrover-kfp history database ({text})")
    if name.startswith("SQLITE_FULL") or (name.startswith("SQLITE_IOERR") and _disk_full(where)):
        return HistoryDiskFullError(
            f"{where}: disk full: the history cannot be written ({text}); free space on its disk"
        )
    if name.startswith(_SQLITE_TRANSIENT) or "locked" in text:
        return HistoryUnavailableError(f"{where}: the history database is busy ({text})")
    if name.startswith(_SQLITE_UNUSABLE):
        return UserInputError(f"{where}: {_why_unusable(where)} ({text})")
    if "no such table" in text or "no such column" in text:
        return HistoryCorruptError(f"{where}: the history schema is damaged ({text})")
    return HistoryCorruptError(f"{where}: database error ({text})")


def _disk_full(where: str) -> bool:
    """Whether the disk of the SQLite file ``where`` has (next to) no space left."""
    try:
        fs = os.statvfs(Path(where).parent)
    except (OSError, ValueError):
        return False
    # Root may write into the blocks the file system keeps back for it; others may not.
    free = fs.f_bfree if os.geteuid() == 0 else fs.f_bavail
    return free * fs.f_frsize < DISK_FULL_BELOW_BYTES


def _why_unusable(where: str) -> str:
    """Why SQLite could not open or write the file ``where``, as far as the file system says:
    a read-only mount and a directory without write permission read alike to SQLite ("unable
    to open database file", "attempt to write a readonly database")."""
    path = Path(where)
    directory = path.parent
    try:
        read_only = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except (OSError, ValueError):
        return "cannot use this history database file"
    if read_only:
        return f"read-only file system: {directory} is mounted read-only"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"read-only: no permission to write in {directory}"
    if path.exists() and not os.access(path, os.W_OK):
        return "read-only: no permission to write the file"
    return "cannot use this history database file"


#: ``password=...`` of a libpq connection string, its value bare or single-quoted.
_CONNINFO_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'?|\S+)", re.IGNORECASE)
#: The password of a URL's ``user:password@`` (up to the last ``@`` of the URL, since a raw
#: password may hold one).
_URL_PASSWORD = re.compile(r"(://[^\s:/@]*:)\S*@")


def mask_password(text: str, secret: str | None) -> str:
    """``text`` (a driver's message) with the store's password hidden.

    Whatever a URL's ``user:...@`` or a connection string's ``password=`` holds is hidden
    whatever it is. Elsewhere the password (as given, or percent-encoded as a URL carries it)
    is hidden where it stands as a whole token, not inside a longer word: a plain substring
    replace turns every ``p`` of "port" into ``***`` when the password is "p", which mangles
    the message and, by showing where the letters were, tells the password.
    """
    text = _URL_PASSWORD.sub(r"\1***@", text)
    text = _CONNINFO_PASSWORD.sub(r"\1***", text)
    if not secret:
        return text
    forms = {secret, quote(secret, safe=""), quote_plus(secret)}
    for form in sorted(forms, key=len, reverse=True):
        # A boundary only where the password's own edge is a word character: "p" must not
        # match inside "port", while "/pw" has no word edge on its left to respect.
        before = r"(?<!\w)" if re.match(r"\w", form[0]) else ""
        after = r"(?!\w)" if re.match(r"\w", form[-1]) else ""
        text = re.sub(before + re.escape(form) + after, "***", text)
    return text


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "unknown error"
