"""The job master's shard service under a small load: ``benchmarks/shard_load.py`` at 8 client
processes for 3 s, one of them killed while it holds a lease.

The benchmark's own checks are the assertions: no shard lost, none completed twice (counted by
the clients and by the ledger), the killed client's lease back in the queue, the ledger's
invariants intact. The full 64-client, 60-second run is the benchmark's (docs/load.md).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.load.conftest import load_benchmark

bench: Any = load_benchmark("shard_load")

#: A broken requeue or a stuck client must fail here, not hang the suite.
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("shard-load") / "clients.log"
    with path.open("a+") as log:
        # Small epochs (40 shards a client) so that epoch ends, where clients wait for the
        # last shards of the epoch, are crossed many times.
        try:
            return dict(
                bench.run_load(clients=8, seconds=3.0, kill=1, shards=320, epochs=10**6, log=log)
            )
        except Exception:
            log.seek(0)
            print(log.read()[-4000:])  # shown by pytest with the failure
            raise


def test_no_shard_is_lost_or_completed_twice(result: dict[str, Any]) -> None:
    assert result["ledger_problems"] == []
    assert result["shards_lost"] == 0
    assert result["shards_done_twice"] == {"clients": 0, "ledger": 0}
    assert result["rejected_reports"] == 0
    assert result["epochs_started"] > 2, "the run should cross several epoch ends"
    assert result["ok"]


def test_a_killed_clients_lease_comes_back(result: dict[str, Any]) -> None:
    (kill,) = result["kills"]
    assert kill["leases_held"] == 1
    assert kill["requeued"]
    assert result["leases_returned"] == 1


def test_requests_are_answered_and_timed(result: dict[str, Any]) -> None:
    assert result["pairs_per_s"] > 100
    for kind in ("get_shard", "report"):
        figures = result[kind]
        assert figures["n"] > 300
        assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]
