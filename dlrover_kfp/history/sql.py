"""The history store over SQL (SQLAlchemy 2 Core): an embedded SQLite file or a server.

Two tables. ``profiles`` keeps each run's full profile as JSON text, keyed by ``run_id``: the
record of truth, read back only by :meth:`SqlHistoryStore.get` and exports. ``job_summaries``
keeps the planning summary (:func:`~dlrover_kfp.core.summary.summarize`) as one plain column per
number, indexed by (scenario, started_at) and (model_signature, started_at), so that warm start
over thousands of jobs reads a few rows through an index and never parses a profile.

Idempotence rests on the primary key, not on a check-then-insert: two processes recording the
same run race to the insert, one wins, and the loser's ``IntegrityError`` becomes "already
stored". The schema is created and upgraded by :mod:`dlrover_kfp.history.migrations`;
:func:`dlrover_kfp.history.open_history` runs them before it builds this store.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine

from dlrover_kfp.core.documents import parse, to_dict
from dlrover_kfp.core.observation import Config, Observation
from dlrover_kfp.core.plan import NodeGroup
from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.core.summary import JobSummary
from dlrover_kfp.errors import (
    HistoryCorruptError,
    HistoryUnavailableError,
    NotFoundError,
    UserInputError,
)
from dlrover_kfp.history.engine import (
    describe_url,
    read_transaction,
    translated_errors,
    write_transaction,
)
from dlrover_kfp.history.validation import checked_batch, checked_summary
from dlrover_kfp.ports import SimilarityQuery

metadata = sa.MetaData()

#: The full profile of each run, as the JSON the profile contract defines.
profiles = sa.Table(
    "profiles",
    metadata,
    sa.Column("run_id", sa.String(128), primary_key=True),
    sa.Column("document", sa.Text, nullable=False),
    sa.Column("recorded_at", sa.Double, nullable=False),
)

#: One row per profile: :class:`JobSummary` with its node groups flattened into columns.
job_summaries = sa.Table(
    "job_summaries",
    metadata,
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
    sa.Column("observations", sa.Text, nullable=False, comment="JSON list of observations"),
    sa.Index("ix_job_summaries_scenario_started", "scenario", "started_at", "run_id"),
    sa.Index("ix_job_summaries_signature_started", "model_signature", "started_at", "run_id"),
    sa.Index("ix_job_summaries_started", "started_at", "run_id"),
)

#: How many run_ids one ``IN (...)`` lists: far below every backend's bound-parameter limit.
_IN_CHUNK = 500
#: How often ``record_many`` starts over after losing a race to another writer.
_RACE_ATTEMPTS = 5

_NEWEST_FIRST = (job_summaries.c.started_at.desc(), job_summaries.c.run_id.desc())


class SqlHistoryStore:
    """:class:`~dlrover_kfp.ports.HistoryStore` over a SQLAlchemy engine.

    The engine should come from :func:`~dlrover_kfp.history.engine.create_history_engine` (as
    :func:`~dlrover_kfp.history.open_history` does) so that SQLite writers lock up front, and the
    schema must already be migrated. The store owns the engine: :meth:`close` disposes it.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._where = describe_url(engine.url)
        self._secret = engine.url.password if isinstance(engine.url.password, str) else None

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def where(self) -> str:
        """How messages name this store (a SQLite path, or the URL without its password)."""
        return self._where

    def __enter__(self) -> SqlHistoryStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SqlHistoryStore({self._where!r})"

    # -- writing ---------------------------------------------------------------------------

    def record(self, profile: JobProfile) -> bool:
        summary = checked_summary(profile)
        with translated_errors(self._where, self._secret):
            try:
                with write_transaction(self._engine) as conn:
                    if _stored_ids(conn, [profile.run_id]):
                        return False
                    _insert(conn, [(profile, summary)])
            except sa_exc.IntegrityError:
                # Another writer stored the same run between our check and our insert.
                if self._exists(profile.run_id):
                    return False
                raise
        return True

    def record_many(self, profiles: Iterable[JobProfile]) -> int:
        batch = checked_batch(profiles)
        if not batch:
            return 0
        ids = [p.run_id for p, _ in batch]
        with translated_errors(self._where, self._secret):
            for _ in range(_RACE_ATTEMPTS):
                try:
                    with write_transaction(self._engine) as conn:
                        stored = _stored_ids(conn, ids)
                        fresh = [item for item in batch if item[0].run_id not in stored]
                        _insert(conn, fresh)
                    return len(fresh)
                except sa_exc.IntegrityError:
                    # A concurrent writer stored some of these after we looked; the whole batch
                    # was rolled back, so look again and insert what is still missing.
                    continue
        raise HistoryUnavailableError(
            f"{self._where}: other writers kept storing the same runs; "
            f"gave up after {_RACE_ATTEMPTS} attempts"
        )

    def replace(self, profile: JobProfile) -> bool:
        summary = checked_summary(profile)
        document = profile_to_document(profile)
        with translated_errors(self._where, self._secret):
            for _ in range(_RACE_ATTEMPTS):
                try:
                    with write_transaction(self._engine) as conn:
                        stored = conn.execute(
                            sa.select(profiles.c.document).where(
                                profiles.c.run_id == profile.run_id
                            )
                        ).scalar_one_or_none()
                        if stored == document:
                            return False
                        if stored is not None:
                            # summaries first: their foreign key names the profile
                            conn.execute(
                                sa.delete(job_summaries).where(
                                    job_summaries.c.run_id == profile.run_id
                                )
                            )
                            conn.execute(
                                sa.delete(profiles).where(profiles.c.run_id == profile.run_id)
                            )
                        _insert(conn, [(profile, summary)])
                    return True
                except sa_exc.IntegrityError:
                    continue  # another writer inserted this run between our read and insert
        raise HistoryUnavailableError(
            f"{self._where}: other writers kept storing run {profile.run_id!r}; "
            f"gave up after {_RACE_ATTEMPTS} attempts"
        )

    # -- reading ---------------------------------------------------------------------------

    def get(self, run_id: str) -> JobProfile:
        with translated_errors(self._where, self._secret), read_transaction(self._engine) as conn:
            document = conn.execute(
                sa.select(profiles.c.document).where(profiles.c.run_id == run_id)
            ).scalar_one_or_none()
        if document is None:
            raise NotFoundError(f"run {run_id!r} is not in the history ({self._where})")
        return profile_from_document(document, f"{self._where}: stored profile {run_id!r}")

    def list(self, *, scenario: str | None = None, limit: int = 50) -> list[JobSummary]:
        if limit <= 0:
            return []
        query = sa.select(job_summaries)
        if scenario is not None:
            query = query.where(job_summaries.c.scenario == scenario)
        return self._summaries(query.order_by(*_NEWEST_FIRST).limit(limit))

    def find_similar(self, query: SimilarityQuery) -> builtins.list[JobSummary]:
        """Newest similar jobs first, read from the summary table alone (see the module doc)."""
        if query.limit <= 0:
            return []
        select = sa.select(job_summaries)
        if query.scenario is not None:
            select = select.where(job_summaries.c.scenario == query.scenario)
        else:
            select = select.where(job_summaries.c.model_signature == query.model_signature)
        if query.since is not None:
            select = select.where(job_summaries.c.started_at >= query.since)
        return self._summaries(select.order_by(*_NEWEST_FIRST).limit(query.limit))

    def iter_profiles(self) -> Iterator[JobProfile]:
        """Every profile, oldest first, streamed (one connection is held until exhausted)."""
        query = (
            sa.select(profiles.c.run_id, profiles.c.document)
            .join(job_summaries, job_summaries.c.run_id == profiles.c.run_id)
            .order_by(job_summaries.c.started_at.asc(), job_summaries.c.run_id.asc())
        )
        with translated_errors(self._where, self._secret), read_transaction(self._engine) as conn:
            rows = conn.execution_options(yield_per=200).execute(query)
            for run_id, document in rows:
                yield profile_from_document(document, f"{self._where}: stored profile {run_id!r}")

    def count(self) -> int:
        with translated_errors(self._where, self._secret), read_transaction(self._engine) as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(profiles)).scalar_one())

    def close(self) -> None:
        self._engine.dispose()

    # -- helpers ---------------------------------------------------------------------------

    def _exists(self, run_id: str) -> bool:
        with read_transaction(self._engine) as conn:
            return bool(_stored_ids(conn, [run_id]))

    def _summaries(self, query: sa.Select[Any]) -> builtins.list[JobSummary]:
        with translated_errors(self._where, self._secret), read_transaction(self._engine) as conn:
            rows = conn.execute(query).mappings().all()
        return [summary_from_row(row, self._where) for row in rows]


def _stored_ids(conn: Connection, run_ids: Sequence[str]) -> set[str]:
    found: set[str] = set()
    for start in range(0, len(run_ids), _IN_CHUNK):
        chunk = run_ids[start : start + _IN_CHUNK]
        found.update(
            conn.execute(sa.select(profiles.c.run_id).where(profiles.c.run_id.in_(chunk))).scalars()
        )
    return found


def _insert(conn: Connection, items: Sequence[tuple[JobProfile, JobSummary]]) -> None:
    """Insert profiles, then their summaries (the foreign key wants that order)."""
    if not items:
        return
    now = time.time()
    conn.execute(
        sa.insert(profiles),
        [
            {"run_id": p.run_id, "document": profile_to_document(p), "recorded_at": now}
            for p, _ in items
        ],
    )
    conn.execute(sa.insert(job_summaries), [summary_to_row(s) for _, s in items])


# -- rows <-> contract objects --------------------------------------------------------------


def profile_to_document(profile: JobProfile) -> str:
    """The stored form of a profile: the contract's JSON on one line."""
    return json.dumps(to_dict(profile), separators=(",", ":"), ensure_ascii=False)


def profile_from_document(document: str, source: str) -> JobProfile:
    """A stored profile back as a :class:`JobProfile`; damage is a :class:`HistoryCorruptError`."""
    try:
        data = json.loads(document)
    except json.JSONDecodeError as exc:
        raise HistoryCorruptError(f"{source}: not valid JSON ({exc.msg})") from None
    try:
        return parse(JobProfile, data, source)
    except UserInputError as exc:
        raise HistoryCorruptError(str(exc)) from None


def summary_to_row(summary: JobSummary) -> dict[str, Any]:
    """A summary as a ``job_summaries`` row: node groups flattened, observations as JSON."""
    row: dict[str, Any] = {}
    for field in dataclasses.fields(summary):
        value = getattr(summary, field.name)
        if isinstance(value, NodeGroup):
            row[f"{field.name}_count"] = value.count
            row[f"{field.name}_cpu"] = value.cpu
            row[f"{field.name}_memory_mb"] = value.memory_mb
        elif field.name == "observations":
            row[field.name] = json.dumps([dataclasses.asdict(o) for o in value])
        else:
            row[field.name] = value
    return row


def summary_from_row(row: Mapping[Any, Any], where: str) -> JobSummary:
    """The inverse of :func:`summary_to_row`."""
    try:
        observations = tuple(_observation(o) for o in json.loads(row["observations"]))
    except (json.JSONDecodeError, TypeError, KeyError) as exc:
        raise HistoryCorruptError(
            f"{where}: summary of {row['run_id']!r} has unreadable observations ({exc})"
        ) from None
    return JobSummary(
        run_id=row["run_id"],
        name=row["name"],
        scenario=row["scenario"],
        model_signature=row["model_signature"],
        dataset_rows=int(row["dataset_rows"]),
        batch_size=int(row["batch_size"]),
        started_at=float(row["started_at"]),
        status=row["status"],
        jct_seconds=float(row["jct_seconds"]),
        samples_processed=int(row["samples_processed"]),
        workers=_group(row, "workers"),
        ps=_group(row, "ps"),
        peak_worker_cpu=float(row["peak_worker_cpu"]),
        peak_worker_memory_mb=int(row["peak_worker_memory_mb"]),
        peak_ps_cpu=float(row["peak_ps_cpu"]),
        peak_ps_memory_mb=int(row["peak_ps_memory_mb"]),
        peak_total_ps_cpu=float(row["peak_total_ps_cpu"]),
        peak_total_ps_memory_mb=int(row["peak_total_ps_memory_mb"]),
        mean_worker_cpu=float(row["mean_worker_cpu"]),
        mean_ps_cpu=float(row["mean_ps_cpu"]),
        oom_events=int(row["oom_events"]),
        observations=observations,
    )


def _group(row: Mapping[Any, Any], prefix: str) -> NodeGroup:
    return NodeGroup(
        count=int(row[f"{prefix}_count"]),
        cpu=float(row[f"{prefix}_cpu"]),
        memory_mb=int(row[f"{prefix}_memory_mb"]),
    )


def _observation(data: dict[str, Any]) -> Observation:
    return Observation(**{**data, "config": Config(**data["config"])})
