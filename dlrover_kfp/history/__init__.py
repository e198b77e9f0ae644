"""The history store: finished jobs' profiles, queried by similarity for warm start.

Where the history lives is one URL, chosen at the edge (the CLI passes ``os.environ`` in):
``--history`` first, then ``DLROVER_KFP_HISTORY_URL``, then a SQLite file in the user's data
directory, so that a first run needs nothing started or configured. A plain path (no ``://``)
means a SQLite file at that path. :func:`open_history` builds the engine, migrates the schema
and maps what can go wrong to the package's error types, naming the store without its password.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import platformdirs
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL

from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.history.engine import (
    create_history_engine,
    describe_url,
    is_sqlite,
    mask_url_text,
    parse_url,
    sqlite_path,
)
from dlrover_kfp.history.memory import InMemoryHistoryStore
from dlrover_kfp.history.migrations import LATEST_VERSION, SchemaTooNewError, migrate
from dlrover_kfp.history.sql import SqlHistoryStore

__all__ = [
    "ENV_VAR",
    "LATEST_VERSION",
    "InMemoryHistoryStore",
    "SchemaTooNewError",
    "SqlHistoryStore",
    "default_history_path",
    "mask_url_text",
    "open_history",
    "record_profile",
    "resolve_history_url",
]

log = logging.getLogger(__name__)

#: The environment variable that names the history when ``--history`` is not given.
ENV_VAR = "DLROVER_KFP_HISTORY_URL"
_APP_NAME = "dlrover-kfp"
_DEFAULT_FILE = "history.db"


def default_history_path() -> Path:
    """The embedded default: ``history.db`` in the user's data directory."""
    return Path(platformdirs.user_data_dir(_APP_NAME)) / _DEFAULT_FILE


def resolve_history_url(cli_value: str | None, environ: Mapping[str, str]) -> str:
    """The history URL: ``--history``, else ``$DLROVER_KFP_HISTORY_URL``, else the default file.

    An empty environment variable counts as unset (the shell idiom); an empty ``--history`` is
    a mistake and is refused.
    """
    if cli_value is not None:
        if not cli_value.strip():
            raise UserInputError("--history: empty; give a SQLAlchemy URL or a file path")
        return _as_url(cli_value.strip())
    from_env = environ.get(ENV_VAR, "").strip()
    if from_env:
        return _as_url(from_env)
    return _sqlite_url(default_history_path())


def _as_url(value: str) -> str:
    """A history URL with a SQLite file's path made absolute: ``sqlite:///runs/h.db`` is
    relative to the working directory, and the same text from another directory would be
    another file (its pending profiles, keyed by the URL, would go to that one)."""
    if "://" not in value:
        return _sqlite_url(Path(value))
    try:
        parsed = parse_url(value)
    except UserInputError:
        return value  # refused, with its reason, where it is opened
    raw = sqlite_path(parsed) if is_sqlite(parsed) else None
    if raw is None or raw.startswith("file:") or Path(raw).is_absolute():
        return value
    absolute = str(Path(raw).expanduser().absolute())
    return parsed.set(database=absolute).render_as_string(hide_password=False)


def _sqlite_url(path: Path) -> str:
    absolute = path.expanduser().absolute()
    return URL.create("sqlite", database=str(absolute)).render_as_string(hide_password=False)


def open_history(url: str) -> SqlHistoryStore:
    """Open (creating or upgrading as needed) the history store at ``url`` (or a SQLite path).

    Raises :class:`~dlrover_kfp.errors.HistoryCorruptError` for a file that is not a history
    database or a database written by a newer version, :class:`~dlrover_kfp.errors.
    HistoryUnavailableError` for a locked database or an unreachable server, and
    :class:`~dlrover_kfp.errors.UserInputError` for a URL or path that cannot work.
    """
    parsed = parse_url(_as_url(url))
    where = describe_url(parsed)
    secret = parsed.password if isinstance(parsed.password, str) else None
    if is_sqlite(parsed):
        _prepare_sqlite_file(parsed)
    try:
        engine = create_history_engine(parsed)
    except (sa_exc.NoSuchModuleError, ImportError) as exc:
        hint = " (pip install 'dlrover-kfp[postgres]')" if "postgres" in parsed.drivername else ""
        raise UserInputError(
            f"{where}: no database driver for {parsed.drivername!r}{hint}: {exc}"
        ) from None
    except sa_exc.ArgumentError as exc:
        raise UserInputError(f"{where}: unusable history URL: {exc}") from None
    log.debug("opening history %s", where)
    try:
        migrate(engine, where=where, secret=secret)
    except BaseException:
        engine.dispose()
        raise
    return SqlHistoryStore(engine)


def record_profile(url: str, profile: JobProfile) -> bool:
    """Store ``profile`` in the history at ``url``, in place of an earlier attempt of the same
    run (:meth:`~dlrover_kfp.ports.HistoryStore.replace`: an orchestrator's re-run keeps its
    run id, and the history must hold one run per logical run, the latest attempt). False when
    the store already held exactly this profile (a retried record step changes nothing). The
    store is open only for the write."""
    store = open_history(url)
    try:
        changed = store.replace(profile)
    finally:
        store.close()
    log.info("history: %s %s", "recorded" if changed else "already had", profile.run_id)
    return changed


def _prepare_sqlite_file(url: URL) -> None:
    """Check the place of a SQLite file; create the default one's directory.

    A new history file is created in an existing directory only: a history path whose
    directory does not exist is far more often a typo (``~/runs/histroy/...``) than a wish,
    and creating it would silently start an empty history, so every run would cold-start.
    The default location is the exception: a first run creates it.
    """
    raw = sqlite_path(url)
    if raw is None or raw.startswith("file:"):
        return
    path = Path(raw)
    if path.is_dir():
        raise UserInputError(f"{path}: is a directory, expected a history database file")
    if path.parent.is_dir():
        return
    if path.parent.exists():
        raise UserInputError(f"{path}: {path.parent} is not a directory")
    if path.absolute() != default_history_path().absolute():
        raise UserInputError(
            f"{path}: its directory {path.parent} does not exist; check the history path, or "
            "create the directory to start a new history there"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserInputError(f"{path}: cannot create its directory: {exc.strerror}") from None
