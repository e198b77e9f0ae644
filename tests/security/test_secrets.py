"""Secrets stay where they belong: used, never shown.

* The history database password: driver errors quoted in this package's messages hide it
  (:func:`dlrover_kfp.history.engine.mask_password`), as a whole token only, so that a short
  password does not mangle the message around it.
* The per-job RPC secret: a real local run leaves it in no file of its output directory and in
  no log record; on Kubernetes it lives in the job's Secret, referenced by the pods, never
  inline in a pod spec, and ``--dry-run`` shows it redacted.
* The Airflow connection's password: the hook uses it and prints or logs it nowhere.
"""

from __future__ import annotations

import base64
import json
import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from dlrover_kfp.backends.k8s_objects import (
    redacted,
    render_pod,
    render_secret,
    secret_keys,
)
from dlrover_kfp.core.documents import load_text, parse
from dlrover_kfp.core.node_id import NodeId
from dlrover_kfp.core.plan import NodeGroup, ResourcePlan, Stage
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.errors import DlroverKfpError, UserInputError
from dlrover_kfp.history import open_history
from dlrover_kfp.history.engine import classify_error, create_history_engine, parse_url
from dlrover_kfp.runtime.job import trainer_pod
from dlrover_kfp.runtime.kube import KubeOptions, dry_run_manifests, kube_settings
from dlrover_kfp.runtime.options import RunOptions, RunSettings
from dlrover_kfp.training.wire import SECRET_ENV_VAR, secret_to_env

PASSWORDS = ["p", "port", "a@b:c/d", "s3cr3t"]
LIBPQ_LOGIN = (
    'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
    'FATAL:  password authentication failed for user "dlrover"'
)
#: Words that hold the test passwords inside them: none may lose a letter to the mask.
INNOCENT = "report: ports support p2p and xs3cr3ts; spare passwords"


def masked(text: str, password: str) -> str:
    """What classify_error makes of a driver's message, without the prefix it adds."""
    error = classify_error(
        sa_exc.OperationalError("SELECT 1", None, Exception(text)), "W", password
    )
    # A refused login is the user's to fix; any other connection failure is transient.
    prefixes = ("W: the server refused the login: ", "W: cannot reach the history database: ")
    prefix = next((p for p in prefixes if str(error).startswith(p)), None)
    assert prefix is not None, str(error)
    return str(error)[len(prefix) :]


# -- the history password -------------------------------------------------------------------------


@pytest.mark.parametrize("password", PASSWORDS)
def test_words_that_contain_the_password_are_left_whole(password: str) -> None:
    assert masked(INNOCENT, password) == INNOCENT
    expected = LIBPQ_LOGIN.replace(" port ", " *** ") if password == "port" else LIBPQ_LOGIN
    # A password that is itself a word of the message hides that word: safety first.
    assert masked(LIBPQ_LOGIN, password) == expected


@pytest.mark.parametrize("password", PASSWORDS)
def test_the_password_is_hidden_wherever_a_driver_quotes_it(password: str) -> None:
    cases = {
        # a URL, as SQLAlchemy renders it (percent-encoded) and raw
        f"cannot use postgresql://dlrover:{quote(password, safe='')}@db:5432/h": (
            "cannot use postgresql://dlrover:***@db:5432/h"
        ),
        f"cannot use postgresql://dlrover:{password}@db:5432/h": (
            "cannot use postgresql://dlrover:***@db:5432/h"
        ),
        # a libpq connection string, bare and quoted
        f"invalid dsn: host=db password={password} dbname=h": (
            "invalid dsn: host=db password=*** dbname=h"
        ),
        f"invalid dsn: host=db password='{password}' dbname=h": (
            "invalid dsn: host=db password=*** dbname=h"
        ),
        # anywhere else, as a whole token
        f'login of "dlrover" with "{password}" refused': 'login of "dlrover" with "***" refused',
        f"password {password} expired": "password *** expired",
    }
    for text, expected in cases.items():
        assert masked(text, password) == expected


def test_a_url_with_an_unescaped_password_is_a_user_error_that_hides_it() -> None:
    """A ":" or "@" left unescaped makes SQLAlchemy read part of the password as a port; that
    was a traceback showing a fragment of it, and is now a one-line error without it."""
    for url in ("postgresql://u:a@b:c/d@db/h", "postgresql://u:s3cr3t@db:port/h"):
        with pytest.raises(UserInputError) as caught:
            parse_url(url)
        text = str(caught.value)
        assert "u:***@" in text and "not a valid URL" in text
        assert "a@b:c/d" not in text and "s3cr3t" not in text and "'c'" not in text


def sqlite_error(tmp_path: Path, statement: str) -> sa_exc.DBAPIError:
    engine = create_history_engine(parse_url(f"sqlite:///{tmp_path / 'h.db'}"))
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(statement)
    except sa_exc.DBAPIError as exc:
        return exc
    finally:
        engine.dispose()
    raise AssertionError(f"{statement!r} did not fail")


@pytest.mark.parametrize(
    "statement", ["SELECT report_port FROM sqlite_master", "SELECT * FROM support_ports"]
)
def test_sqlite_errors_are_quoted_whole_whatever_the_password(
    tmp_path: Path, statement: str
) -> None:
    exc = sqlite_error(tmp_path, statement)
    assert isinstance(exc.orig, sqlite3.Error)
    plain = str(classify_error(exc, "h.db", None))
    assert "report_port" in plain or "support_ports" in plain
    for password in PASSWORDS:
        assert str(classify_error(exc, "h.db", password)) == plain


@pytest.mark.postgres
@pytest.mark.parametrize("password", PASSWORDS)
def test_a_refused_postgresql_login_names_the_store_without_the_password(
    postgres_url: str, password: str
) -> None:
    url = sa.make_url(postgres_url).set(password=password).render_as_string(hide_password=False)
    with pytest.raises(DlroverKfpError) as caught:
        open_history(url)
    error = caught.value
    # A wrong password is the user's to fix: not a transient error that a pipeline retries.
    assert isinstance(error, UserInputError), type(error)
    assert "the server refused the login" in str(error)
    texts = [str(error), repr(error)]
    cause = error.__cause__
    while cause is not None:  # a traceback prints the chained driver errors too
        texts.append(str(cause))
        cause = cause.__cause__
    shown = str(error)
    assert "password authentication failed" in shown
    assert f"{sa.make_url(postgres_url).username}:***@" in shown
    assert "***ort" not in shown and "***assword" not in shown  # no letter taken from words
    if len(password) > 4:  # longer ones occur in none of the message's own words
        for text in texts:
            assert password not in text and quote(password, safe="") not in text


# -- the job secret on a local run --------------------------------------------------------------

TINY_JOB = """
name: secret-scan
model: {embedding_dim: 4, table_sizes: [50, 7], dense_features: 3,
        bottom_mlp: [8, 4], top_mlp: [8, 1]}
data: {format: synthetic, rows: 600, seed: 2}
training: {batch_size: 100, learning_rate: 0.05}
resources:
  workers: {count: 1, cpu: 1, memory: 1Gi}
  ps: {count: 1, cpu: 1, memory: 1Gi}
"""


def secret_forms(secret: bytes) -> dict[str, bytes]:
    """Every way the job secret could be written down."""
    hex_ = secret_to_env(secret)
    return {
        "raw": secret,
        "hex": hex_.encode(),
        "HEX": hex_.upper().encode(),
        "base64": base64.b64encode(secret),
        "base64 of hex": base64.b64encode(hex_.encode()),  # a Kubernetes Secret's data
        "repr": repr(secret).encode(),
    }


def leaks(blob: bytes, secret: bytes) -> list[str]:
    return [name for name, form in secret_forms(secret).items() if form in blob]


def test_a_local_run_writes_the_job_secret_nowhere(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from dlrover_kfp.backends import LocalBackend  # noqa: PLC0415 - only this test runs pods
    from dlrover_kfp.runtime.job import static_run  # noqa: PLC0415

    caplog.set_level(logging.DEBUG)
    spec = parse(JobSpec, load_text(TINY_JOB, "job"), "job")
    out = tmp_path / "out"
    lines: list[str] = []
    with LocalBackend(out / "logs") as backend:
        settings = RunSettings(shard_rows=200, sample_interval_s=0.2, checkpoint_interval_s=0)
        options = RunOptions(output_dir=out, base_dir=tmp_path, settings=settings)
        run = static_run(spec, backend, options, progress=lines.append)
        result = run.run()
        statuses = repr(backend.statuses())
    assert result.succeeded, result.profile.outcome.reason
    secret = run.secret
    files = [p for p in out.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    # The scan saw what a run leaves: the profile, the pods' logs, a committed checkpoint.
    assert {"profile.json", "manifest.json", "model.pt"} <= names, sorted(names)
    assert any(p.suffix == ".log" for p in files), sorted(names)
    assert any("checkpoint" in str(p.relative_to(out)) for p in files), sorted(names)
    for path in files:
        assert leaks(path.read_bytes(), secret) == [], path
    # Every log record of this process (the master's), the progress lines, the pod statuses.
    assert leaks("\n".join([caplog.text, *lines, statuses, repr(result)]).encode(), secret) == []


# -- the job secret on Kubernetes -----------------------------------------------------------------

KNOWN_SECRET = bytes(range(100, 132))
PLAN = ResourcePlan(
    workers=NodeGroup(count=2, cpu=1.0, memory_mb=1024),
    ps=NodeGroup(count=1, cpu=1.0, memory_mb=1024),
    stage=Stage.MANUAL,
    reason="test",
)


def test_pods_reference_the_job_secret_and_never_hold_it() -> None:
    settings = RunSettings(master_host="10.0.0.5", python="python")
    pod = trainer_pod(
        "ctr", "ctr-1", KNOWN_SECRET, settings, NodeId("ps", 0), PLAN.ps, ("10.0.0.5", 7000)
    )
    keys, data = secret_keys(pod.env, {})
    manifest = render_pod(
        pod,
        namespace="ml",
        image="dlrover-kfp:test",
        labels={"job": "ctr"},
        secret_name="ctr-env",
        secret_keys=keys,
    )
    assert leaks(json.dumps(manifest).encode(), KNOWN_SECRET) == []
    env = {e["name"]: e for e in manifest["spec"]["containers"][0]["env"]}
    assert env[SECRET_ENV_VAR] == {
        "name": SECRET_ENV_VAR,
        "valueFrom": {"secretKeyRef": {"name": "ctr-env", "key": keys[SECRET_ENV_VAR]}},
    }
    secret = render_secret("ctr-env", "ml", data, {"job": "ctr"})
    stored = base64.b64decode(secret["data"][keys[SECRET_ENV_VAR]]).decode()
    assert stored == secret_to_env(KNOWN_SECRET)  # the Secret is where it lives
    assert leaks(json.dumps(redacted(secret)).encode(), KNOWN_SECRET) == []


def test_the_dry_run_shows_the_secret_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dlrover_kfp.runtime.kube.new_secret", lambda: KNOWN_SECRET)
    spec = parse(JobSpec, load_text(TINY_JOB, "job"), "job")
    opts = KubeOptions(namespace="ml", image="dlrover-kfp:test")
    settings = RunSettings(master_host="<master-ip>", python="python")
    manifests = dry_run_manifests(spec, PLAN, settings, kube_settings(opts), "secret-scan-1")
    assert [m["kind"] for m in manifests] == ["Secret", "Pod", "Pod", "Pod"]
    assert set(manifests[0]["data"].values()) == {"***"}
    assert leaks(json.dumps(manifests).encode(), KNOWN_SECRET) == []


# -- the Airflow connection's password -------------------------------------------------------------

AIRFLOW_PASSWORD = "Af-pa:ss@w/rd-9Zq"


@pytest.fixture
def airflow_hook_with(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Any]:
    pytest.importorskip("airflow.sdk", reason="the airflow extra is not installed")
    from airflow.sdk import Connection  # noqa: PLC0415 - after the Airflow home is set

    from airflow_plugin.hooks import DlroverHistoryHook  # noqa: PLC0415

    def make(**fields: Any) -> DlroverHistoryHook:
        conn = Connection(conn_id="dlrover_kfp_history", **fields)
        monkeypatch.setattr(DlroverHistoryHook, "get_connection", classmethod(lambda c, i: conn))
        return DlroverHistoryHook()

    yield make


def password_forms(password: str) -> list[str]:
    return [password, quote(password, safe=""), quote(password)]


def test_the_airflow_hook_uses_the_password_and_shows_it_nowhere(
    airflow_hook_with: Any,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    # A server that refuses the connection at once (a closed port on this machine).
    hook = airflow_hook_with(
        conn_type="postgres",
        host="127.0.0.1",
        port=1,
        login="dlrover",
        password=AIRFLOW_PASSWORD,
        schema="history",
        extra=json.dumps({"connect_timeout": "2"}),
    )
    url = hook.get_history_url()
    assert sa.make_url(url).password == AIRFLOW_PASSWORD  # used: handed to the store
    ok, message = hook.test_connection()
    assert not ok and "dlrover:***@127.0.0.1:1/history" in message
    captured = capsys.readouterr()
    shown = "\n".join([message, caplog.text, captured.out, captured.err, repr(hook)])
    for form in password_forms(AIRFLOW_PASSWORD):
        assert form not in shown


@pytest.mark.postgres
def test_the_airflow_hook_hides_the_password_of_a_refused_login(
    airflow_hook_with: Any,
    postgres_url: str,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    real = sa.make_url(postgres_url)
    hook = airflow_hook_with(
        conn_type="postgres",
        host=real.host,
        port=real.port,
        login=real.username,
        password=AIRFLOW_PASSWORD,  # not the role's password
        schema=real.database,
    )
    ok, message = hook.test_connection()
    assert not ok and "password authentication failed" in message
    captured = capsys.readouterr()
    shown = "\n".join([message, caplog.text, captured.out, captured.err])
    for form in password_forms(AIRFLOW_PASSWORD):
        assert form not in shown
