"""Versioned schema migrations of the history store, applied when a store is opened.

Why not Alembic: the store migrates itself on open (the default store is an embedded SQLite
file in the user's data directory, with no operator to run ``alembic upgrade``), the schema is a
handful of tables, and Alembic would need a script directory and an ini file shipped inside the
wheel and located at run time. An ordered list of ``(version, description, function)`` applied
in one locked transaction does the same job in a page.

Rules for adding a migration: append, never edit or reorder a released one; a migration builds
its tables from its own definitions (never from ``sql.py``'s current ones, which will move on);
``tests/contract/test_history_store.py`` checks that applying them all yields ``sql.py``'s schema.

Concurrency: two processes may open a fresh database at the same moment. The migrating
transaction takes a lock first (``BEGIN IMMEDIATE`` on SQLite, ``pg_advisory_xact_lock`` on
PostgreSQL) and re-reads the version under it, so the second process finds the work done.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dlrover_kfp.errors import HistoryCorruptError
from dlrover_kfp.history.engine import read_transaction, translated_errors, write_transaction

#: Key of the PostgreSQL advisory lock that serialises migrations ("dkfp" in ASCII); the second
#: key is a hash of the current schema, so stores in different schemas do not wait on each other.
_PG_LOCK_KEY = 0x646B6670
_PG_LOCK = sa.text("SELECT pg_advisory_xact_lock(:key, hashtext(coalesce(current_schema(), '')))")

_OUR_TABLES = frozenset({"profiles", "job_summaries", "schema_version"})


class SchemaTooNewError(HistoryCorruptError):
    """The database was migrated by a newer dlrover-kfp; this one must not touch it."""


class Migration(NamedTuple):
    version: int
    description: str
    apply: Callable[[Connection], None]


_meta = sa.MetaData()
schema_version = sa.Table(
    "schema_version",
    _meta,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("description", sa.Text, nullable=False),
    sa.Column("applied_at", sa.Double, nullable=False, comment="epoch seconds"),
)


def _v1_profiles_and_summaries(conn: Connection) -> None:
    """One row per run: the full profile JSON, and its planning summary as plain columns."""
    meta = sa.MetaData()
    sa.Table(
        "profiles",
        meta,
        sa.Column("run_id", sa.String(128), primary_key=True),
        sa.Column("document", sa.Text, nullable=False),
        sa.Column("recorded_at", sa.Double, nullable=False),
    )
    sa.Table(
        "job_summaries",
        meta,
        sa.Column(
            "run_id",
            sa.String(128),
            sa.ForeignKey("profiles.run_id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("scenario", sa.Text, nullable=True),
        sa.Column("model_signature", sa.Text, nullable=False),
        sa.Column("dataset_rows", sa.BigInteger, nullable=False),
        sa.Column("batch_size", sa.Integer, nullable=False),
        sa.Column("started_at", sa.Double, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("jct_seconds", sa.Double, nullable=False),
        sa.Column("samples_processed", sa.BigInteger, nullable=False),
        sa.Column("workers_count", sa.Integer, nullable=False),
        sa.Column("workers_cpu", sa.Double, nullable=False),
        sa.Column("workers_memory_mb", sa.BigInteger, nullable=False),
        sa.Column("ps_count", sa.Integer, nullable=False),
        sa.Column("ps_cpu", sa.Double, nullable=False),
        sa.Column("ps_memory_mb", sa.BigInteger, nullable=False),
        sa.Column("peak_worker_cpu", sa.Double, nullable=False),
        sa.Column("peak_worker_memory_mb", sa.BigInteger, nullable=False),
        sa.Column("peak_ps_cpu", sa.Double, nullable=False),
        sa.Column("peak_ps_memory_mb", sa.BigInteger, nullable=False),
        sa.Column("peak_total_ps_cpu", sa.Double, nullable=False),
        sa.Column("peak_total_ps_memory_mb", sa.BigInteger, nullable=False),
        sa.Column("mean_worker_cpu", sa.Double, nullable=False),
        sa.Column("mean_ps_cpu", sa.Double, nullable=False),
        sa.Column("oom_events", sa.Integer, nullable=False),
        sa.Column("observations", sa.Text, nullable=False),
        # Warm start asks "newest jobs of this scenario (or model shape)": each index answers
        # that by walking backwards from the newest entry and stopping at the limit.
        sa.Index("ix_job_summaries_scenario_started", "scenario", "started_at", "run_id"),
        sa.Index("ix_job_summaries_signature_started", "model_signature", "started_at", "run_id"),
        sa.Index("ix_job_summaries_started", "started_at", "run_id"),
    )
    meta.create_all(conn, checkfirst=False)


#: Every migration in order. The last version is the one this code reads and writes.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1, "profiles and job_summaries tables, similarity indexes", _v1_profiles_and_summaries
    ),
)
LATEST_VERSION = MIGRATIONS[-1].version


def current_version(conn: Connection) -> int | None:
    """The schema version of the database, or None when it has no ``schema_version`` table."""
    return _version(conn, set(sa.inspect(conn).get_table_names()))


def _version(conn: Connection, tables: set[str]) -> int | None:
    if "schema_version" not in tables:
        return None
    version = conn.execute(sa.select(sa.func.max(schema_version.c.version))).scalar()
    return int(version) if version is not None else 0


def migrate(engine: Engine, *, where: str, secret: str | None = None) -> int:
    """Bring the database to :data:`LATEST_VERSION`; return the version found before.

    Safe to call on every open (a database already current costs one read and no lock) and from
    several processes at once. Raises :class:`SchemaTooNewError` for a newer database and
    :class:`HistoryCorruptError` for a database that holds other tables but is not ours.
    """
    with translated_errors(where, secret):
        with read_transaction(engine) as conn:
            found = _checked_version(conn, where)
        if found == LATEST_VERSION:
            return found
        with write_transaction(engine) as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(_PG_LOCK, {"key": _PG_LOCK_KEY})
            found = _checked_version(conn, where)
            if found is None:
                schema_version.create(conn, checkfirst=False)
            for migration in MIGRATIONS:
                if migration.version > (found or 0):
                    migration.apply(conn)
                    conn.execute(
                        sa.insert(schema_version),
                        {
                            "version": migration.version,
                            "description": migration.description,
                            "applied_at": time.time(),
                        },
                    )
    return found or 0


def _checked_version(conn: Connection, where: str) -> int | None:
    """The version, after refusing databases we must not touch.

    The table list is read once and every decision made from it: outside the lock, another
    process may commit the whole schema between two catalog reads (under READ COMMITTED each
    statement sees new commits), and "no schema_version, but profiles exist" read from two
    different moments would look like a foreign database.
    """
    tables = set(sa.inspect(conn).get_table_names())
    version = _version(conn, tables)
    if version is not None and version > LATEST_VERSION:
        raise SchemaTooNewError(
            f"{where}: history schema version {version} was written by a newer dlrover-kfp "
            f"(this one knows versions up to {LATEST_VERSION}); upgrade dlrover-kfp to use it"
        )
    if version is None:
        _refuse_foreign_database(conn, tables, where)
    return version


def _refuse_foreign_database(conn: Connection, tables: set[str], where: str) -> None:
    """Refuse to add our tables to a database that is evidently something else.

    A SQLite file is one application's database, so any table there means a wrong path. A
    PostgreSQL database is often shared, so only tables with our names (but no version) count.
    """
    clash = tables & _OUR_TABLES if conn.dialect.name != "sqlite" else tables
    if clash:
        listed = ", ".join(sorted(clash)[:5])
        raise HistoryCorruptError(
            f"{where}: not a dlrover-kfp history database (it has tables {listed} "
            "but no schema_version)"
        )
