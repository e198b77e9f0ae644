"""A real S3 API for tests: the moto server as a process on loopback.

``moto.server`` speaks the S3 REST protocol over HTTP, so s3fs, boto3 and a ``dlrover-kfp``
child process all talk to it exactly as to a real store (signatures, ranged GETs, ETags,
error codes). The fixtures in tests/conftest.py start one server per test session and give each
test a fresh bucket; :func:`enforced_auth` makes the server check credentials, for the tests of
a refused one (moto checks none unless told: ``INITIAL_NO_AUTH_ACTION_COUNT``, settable on a
running server through ``POST /moto-api/reset-auth``).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: What every test process (and its children) needs to reach the server; no real credentials.
REGION = "us-east-1"
ACCESS_KEY_ID = "testing-key-id"
SECRET_ACCESS_KEY = "testing-secret-key"  # moto accepts any key until told to check


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class MotoServer:
    """A running ``python -m moto.server``: its endpoint URL and process."""

    endpoint: str
    process: subprocess.Popen[bytes]
    log: Path

    def environment(self) -> dict[str, str]:
        """The variables a client needs: credentials, region, endpoint (AWS_ENDPOINT_URL, which
        botocore, aiobotocore and so s3fs read themselves). The shared config files are pointed
        away and the instance metadata service is off, so that a developer's own AWS setup
        never leaks into a test and a missing credential fails at once."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self, **credentials: str) -> Any:
        """A boto3 S3 client on this server (the tests' own setup; not what the code uses)."""
        import boto3  # noqa: PLC0415

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=credentials.get("key", ACCESS_KEY_ID),
            aws_secret_access_key=credentials.get("secret", SECRET_ACCESS_KEY),
        )

    def post(self, path: str, body: bytes) -> bytes:
        request = urllib.request.Request(
            self.endpoint + path, data=body, method="POST", headers={"Content-Type": "text/plain"}
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            return bytes(reply.read())


def start_moto(log: Path, timeout: float = 30.0) -> MotoServer:
    """Starts the server on a free loopback port and waits until it answers."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "INITIAL_NO_AUTH_ACTION_COUNT"}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*_dies_with_parent(), "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    server = MotoServer(f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(server.endpoint + "/moto-api/data.json", timeout=1):
                return server
        except (urllib.error.URLError, OSError):
            if process.poll() is not None or time.monotonic() > deadline:
                stop_moto(server)
                raise RuntimeError(
                    f"moto server did not start: {log.read_text(errors='replace')[-2000:]}"
                ) from None
            time.sleep(0.05)


def _dies_with_parent() -> list[str]:
    """The Python command for the server, so that it gets SIGTERM when the test process dies,
    even by SIGKILL (a pytest timeout, an OOM kill), instead of living on as an orphan.
    Linux's parent-death signal survives the exec into moto."""
    if not sys.platform.startswith("linux"):
        return [sys.executable]
    arm = "import ctypes,os,signal,sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "
    arm += "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
    return [sys.executable, "-c", arm]


def stop_moto(server: MotoServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


@dataclass(frozen=True)
class Bucket:
    """One bucket of the server, new for each test."""

    server: MotoServer
    name: str

    def url(self, key: str = "") -> str:
        return f"s3://{self.name}/{key}"

    def put(self, key: str, data: bytes) -> str:
        """Writes an object; returns its s3:// URL."""
        self.server.client().put_object(Bucket=self.name, Key=key, Body=data)
        return self.url(key)

    def put_file(self, key: str, path: str | os.PathLike[str]) -> str:
        return self.put(key, Path(path).read_bytes())


def new_bucket(server: MotoServer) -> Bucket:
    name = f"test-{uuid.uuid4().hex[:16]}"
    server.client().create_bucket(Bucket=name)
    return Bucket(server, name)


@dataclass(frozen=True)
class AccessKey:
    key: str
    secret: str


def create_access_key(server: MotoServer) -> AccessKey:
    """An IAM user allowed s3:* and its access key: a credential moto accepts once checks are on
    (create it before :func:`enforced_auth`)."""
    import boto3  # noqa: PLC0415

    iam = boto3.client(
        "iam",
        endpoint_url=server.endpoint,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY_ID,
        aws_secret_access_key=SECRET_ACCESS_KEY,
    )
    user = f"reader-{uuid.uuid4().hex[:8]}"
    iam.create_user(UserName=user)
    policy = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
    }
    iam.put_user_policy(UserName=user, PolicyName="s3", PolicyDocument=json.dumps(policy))
    made = iam.create_access_key(UserName=user)["AccessKey"]
    return AccessKey(made["AccessKeyId"], made["SecretAccessKey"])


@contextlib.contextmanager
def enforced_auth(server: MotoServer) -> Iterator[None]:
    """Within: the server checks every request's signature and IAM policy. After: it checks
    none again, so that the session's other tests are unaffected."""
    server.post("/moto-api/reset-auth", b"0")
    try:
        yield
    finally:
        server.post("/moto-api/reset-auth", b"inf")
