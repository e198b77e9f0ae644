"""A trainer process on its own: how it ends when its master is gone."""

from __future__ import annotations

import logging
import time

import pytest

from dlrover_kfp.training import node
from dlrover_kfp.training.wire import SECRET_ENV_VAR, new_secret, secret_to_env
from tests.training.test_wire import free_port


def test_a_pod_whose_master_refuses_exits_retryable_naming_the_address(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A pod launched just before its master was killed finds nothing listening: it gives up
    after CONNECT_REFUSED_S (not the CONNECT_RETRY_S a slow start gets), with the retryable
    exit code, the master's address in its log and never the job secret. (A worker: ``main``
    sets torch's thread pools, which a process does once.)"""
    secret = new_secret()
    monkeypatch.setenv(SECRET_ENV_VAR, secret_to_env(secret))
    monkeypatch.setattr(node, "CONNECT_REFUSED_S", 0.3)
    port = free_port()
    started = time.monotonic()
    with caplog.at_level(logging.INFO):
        code = node.main(["worker", "0", "--master", f"127.0.0.1:{port}"])
    assert code == 75
    assert time.monotonic() - started < 5.0
    assert f"127.0.0.1:{port}: refused for" in caplog.text
    assert secret.hex() not in caplog.text and secret_to_env(secret) not in caplog.text
