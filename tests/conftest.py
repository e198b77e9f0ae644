"""Fixtures shared by every test package: a real S3 API (tests/storage_server.py).

``moto_server`` starts one moto server process for the whole session, only when a test asks
for it (~1 s); ``s3_bucket`` gives a test a new bucket and sets the environment that s3fs, boto3
and any ``dlrover-kfp`` child process read (endpoint, credentials, region), undone after it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.storage_server import Bucket, MotoServer, new_bucket, start_moto, stop_moto


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    pytest.importorskip("moto.server", reason="needs moto[server]")
    server = start_moto(tmp_path_factory.mktemp("moto") / "server.log")
    try:
        yield server
    finally:
        stop_moto(server)


@pytest.fixture
def s3_bucket(moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> Bucket:
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in moto_server.environment().items():
        monkeypatch.setenv(name, value)
    return new_bucket(moto_server)
