"""Error types that carry their retry meaning.

Callers (the CLI, the KFP components, the Airflow operators, the runtime loop) decide what to do
from the type alone: a :class:`PermanentError` will fail the same way again, so it is reported
once and never retried; a :class:`TransientError` may succeed on a later attempt, so Airflow's
retries or the runtime's back-off should handle it.
"""

from __future__ import annotations

#: The exit statuses every entry point uses (the CLI, the KFP components, the Airflow master):
#: 1 a run that ended failed, 2 a :class:`PermanentError` (bad input: do not retry),
#: 75 (EX_TEMPFAIL) a :class:`TransientError` (retry later).
EXIT_FAILED_RUN = 1
EXIT_USER_ERROR = 2
EXIT_TRANSIENT = 75


class DlroverKfpError(Exception):
    """Base of every error this package raises on purpose."""

    retryable: bool = False


class PermanentError(DlroverKfpError):
    """Retrying cannot help: bad input, corrupt data, an impossible request."""

    retryable = False


class TransientError(DlroverKfpError):
    """The outside world was briefly unavailable (a locked database, a refused connection)."""

    retryable = True


class UserInputError(PermanentError, ValueError):
    """Something the user wrote is wrong. The message names the file or key and the value.

    A ``ValueError`` so that library callers can catch it the idiomatic way.
    """


class SpecError(UserInputError):
    """A job spec, plan or profile document does not validate."""


class HistoryError(DlroverKfpError):
    """Base of history-store errors."""


class HistoryCorruptError(HistoryError, PermanentError):
    """The history store exists but cannot be read as a history store."""


class HistoryUnavailableError(HistoryError, TransientError):
    """The history store could not be reached or was locked; try again later."""


class HistoryDiskFullError(HistoryError, PermanentError):
    """The disk that holds the history store is full. Retrying on a timer cannot help (a lock
    is released by its holder, a full disk by nobody until someone frees space), so it is the
    user's to act on; a run's profile still waits in the pending store for that."""


class NotFoundError(UserInputError, LookupError):
    """A named object (a job id in the history, say) does not exist."""


class MissingExtraError(PermanentError):
    """An optional part of dlrover-kfp is not installed; the message names the extra that
    installs it (``pip install 'dlrover-kfp[train]'``). Permanent: the same environment fails
    the same way on every retry, so Airflow and KFP must not retry it."""


class DataError(UserInputError):
    """The training data the spec names is missing or refused: no such object, credentials the
    object store rejects, none at all. Permanent: the same spec and environment fail the same
    way again, until someone fixes the path or the credentials."""


class DataUnavailableError(TransientError):
    """The object store holding the training data could not be reached (connection refused,
    timeout, HTTP 5xx, throttling), or the data changed while the job read it: a later attempt,
    which lists the data again, may succeed."""
