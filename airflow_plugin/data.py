"""The training data's location from a task: a templated URL or path, and the Airflow
connection whose credentials read it.

The location replaces the job spec's ``data.path`` (``s3://clicks/{{ ds }}/`` for each day's
partition). Its credentials never go into the spec, a parameter or a log line: they come from an
Airflow connection of type ``aws`` and become the job master's environment, which its worker
processes inherit and the object-storage layer reads (:mod:`dlrover_kfp.steps`' data readers:
the standard ``AWS_*`` variables). The connection is named as Airflow's own object storage
(``ObjectStoragePath``) names it, in the URL's user part, ``s3://aws_default@bucket/key``, or by
the operator's ``data_conn_id``; the URL the job reads is the URL without it.

What an ``aws`` connection holds, as the Amazon provider reads it: login = access key id,
password = secret access key; extra ``aws_session_token``, ``region_name``, ``endpoint_url``
(an S3-compatible store: MinIO, Ceph; ``host`` in older connections). The Amazon provider need
not be installed: the connection is read through Airflow's own connection API (without the
provider Airflow stores such a connection as type ``generic``, which is read the same way). A
connection without a key (an "empty" ``aws://`` connection) adds nothing, so the worker's own
chain (its role, ``~/.aws``) applies, as with the provider.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit, urlunsplit

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_plugin.hooks import connection_extra
from dlrover_kfp.errors import UserInputError

if TYPE_CHECKING:
    from airflow.sdk import Connection

#: Connection types read as AWS credentials: ``aws``; ``s3``, Airflow 1's; ``generic``, what
#: Airflow stores for ``airflow connections add --conn-type aws`` (and the UI offers) when the
#: Amazon provider is not installed.
AWS_TYPES: Final = frozenset({"aws", "s3", "generic"})
#: URL schemes an ``aws`` connection reads.
S3_SCHEMES: Final = frozenset({"s3", "s3a"})


@dataclass(frozen=True, slots=True)
class DataLocation:
    """Where a run reads its data, and the environment its credentials are in (secret)."""

    url: str
    conn_id: str | None = None
    environment: dict[str, str] = field(default_factory=dict, repr=False)

    def describe(self) -> str:
        """For the log: the URL and the connection's name, never what it holds."""
        if self.conn_id is None:
            return self.url
        return f"{self.url} (credentials from connection {self.conn_id})"


def split_connection(url: str, source: str = "data_path") -> tuple[str, str | None]:
    """``s3://conn_id@bucket/key`` -> (``s3://bucket/key``, ``conn_id``); a URL without a user
    part is returned as it is. A password in the URL is refused: it would be in the task's
    rendered fields and its log."""
    text = url.strip()
    if "://" not in text:
        return text, None
    parts = urlsplit(text)
    if "@" not in parts.netloc:
        return text, None
    user, _, host = parts.netloc.rpartition("@")
    if ":" in user:
        raise UserInputError(
            f"{source}: {parts.scheme}://***@{host}{parts.path}: a password in the URL is "
            "printed with the task's fields; name an Airflow connection instead "
            f"({parts.scheme}://CONN_ID@{host}/..., or data_conn_id)"
        )
    return urlunsplit(parts._replace(netloc=host)), user


def aws_environment(conn: Connection) -> dict[str, str]:
    """The ``AWS_*`` variables an ``aws`` connection describes (see the module docstring)."""
    conn_type = (conn.conn_type or "").lower()
    if conn_type not in AWS_TYPES:
        raise UserInputError(
            f"data_conn_id: connection {conn.conn_id!r} is of type {conn.conn_type!r}; expected "
            "an 'aws' connection (login: access key id, password: secret access key, extra: "
            "endpoint_url, region_name)"
        )
    extra = connection_extra(conn)
    env = {
        "AWS_ACCESS_KEY_ID": conn.login or str(extra.get("aws_access_key_id") or ""),
        "AWS_SECRET_ACCESS_KEY": conn.password or str(extra.get("aws_secret_access_key") or ""),
        "AWS_SESSION_TOKEN": str(extra.get("aws_session_token") or ""),
        "AWS_DEFAULT_REGION": str(extra.get("region_name") or ""),
        "AWS_ENDPOINT_URL": str(extra.get("endpoint_url") or extra.get("host") or ""),
    }
    return {k: v for k, v in env.items() if v}


def resolve_data_location(data_path: str, data_conn_id: str | None = None) -> DataLocation:
    """The location a train task reads (``data_path`` with any connection in it taken out) and
    the environment of its connection (``data_path``'s, else ``data_conn_id``). The secrets are
    handed to Airflow's masker, so that a line that prints one shows ``***``."""
    url, named = split_connection(data_path)
    explicit = (data_conn_id or "").strip() or None
    if named and explicit and named != explicit:
        raise UserInputError(
            f"data_path names connection {named!r} and data_conn_id {explicit!r}; name one"
        )
    conn_id = named or explicit
    if conn_id is None:
        return DataLocation(url)
    scheme = urlsplit(url).scheme if "://" in url else ""
    if scheme not in S3_SCHEMES:
        raise UserInputError(
            f"data_path: {url!r} with connection {conn_id!r}: an aws connection reads s3:// "
            "URLs; for gs:// set GOOGLE_APPLICATION_CREDENTIALS in the workers' environment"
        )
    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise UserInputError(f"data_conn_id: connection {conn_id!r} is not configured") from None
    environment = aws_environment(conn)
    _mask(environment)
    return DataLocation(url, conn_id, environment)


def _mask(environment: dict[str, str]) -> None:
    try:
        from airflow.sdk.log import mask_secret  # noqa: PLC0415 - not in every task SDK
    except ImportError:  # pragma: no cover - older task SDKs
        return
    for key in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        if environment.get(key):
            mask_secret(environment[key])


__all__ = [
    "AWS_TYPES",
    "DataLocation",
    "aws_environment",
    "resolve_data_location",
    "split_connection",
]
