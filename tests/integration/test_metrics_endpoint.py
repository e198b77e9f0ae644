"""The job master's Prometheus endpoint (runtime/metrics.py) during a real local run.

A static run of real PS and worker processes, scraped over HTTP while it trains; every value
is checked against what the same run wrote in its profile (its plan, its samples, its counts),
never against a constant. Then the command line's side: a port in use fails the run at once
with a clear error and exit code 2, and the port is free again after a run.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dlrover_kfp.backends import LocalBackend
from dlrover_kfp.cli.main import main
from dlrover_kfp.core.documents import load_text, parse
from dlrover_kfp.core.shards import ShardLedger
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.runtime.job import static_run
from dlrover_kfp.runtime.master import MasterState
from dlrover_kfp.runtime.metrics import DEFAULT_METRICS_PORT, pod_defaults, shard_counts
from dlrover_kfp.runtime.options import RunOptions, RunSettings

MIB = 1024 * 1024
SPEC = """
name: scraped
model: {embedding_dim: 8, table_sizes: [1000, 50, 7, 3000], dense_features: 13,
        bottom_mlp: [16, 8], top_mlp: [16, 1]}
data: {format: synthetic, rows: 9000, seed: 5}
training: {batch_size: 256, epochs: 2}
resources:
  workers: {count: 2, cpu: 0.5, memory: 1Gi}
  ps: {count: 1, cpu: 0.5, memory: 768Mi}
"""

Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> Scrape:
    """Every sample of ``/metrics``, by (name, sorted labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrapes_while(port: int, done: threading.Event) -> Iterator[Scrape]:
    """Scrapes every 50 ms until ``done`` (the run has returned)."""
    while not done.is_set():
        try:
            found: Scrape | None = scrape(port)
        except (urllib.error.URLError, ConnectionError):
            found = None  # not serving yet, or already stopped
        if found is not None:
            yield found
        time.sleep(0.05)


def test_a_scrape_during_a_local_run_reads_the_runs_own_values(tmp_path: Path) -> None:
    spec = parse(JobSpec, load_text(SPEC, "test"), "test")
    port = free_port()
    settings = RunSettings(checkpoint_interval_s=0.0, sample_interval_s=0.2, metrics_port=port)
    seen: list[Scrape] = []
    done = threading.Event()
    scraper = threading.Thread(target=lambda: seen.extend(scrapes_while(port, done)))
    scraper.start()
    try:
        with LocalBackend(tmp_path / "out" / "logs") as backend:
            options = RunOptions(output_dir=tmp_path / "out", base_dir=tmp_path, settings=settings)
            result = static_run(spec, backend, options, progress=lambda line: None).run()
    finally:
        done.set()
        scraper.join()
    profile = result.profile
    assert result.succeeded, profile.outcome.reason
    training = [s for s in seen if s[("dlrover_kfp_samples_per_second", ())] > 0]
    assert training, f"no scrape while it trained ({len(seen)} scrapes)"

    first = seen[0]
    info = ("dlrover_kfp_run_info", (("job_name", "scraped"), ("run_id", profile.run_id)))
    assert first[info] == 1.0
    plan = profile.plans[0]
    for role, group in (("worker", plan.workers), ("ps", plan.ps)):
        labels = (("role", role),)
        assert first[("dlrover_kfp_plan_pods", labels)] == group.count
        assert first[("dlrover_kfp_plan_pod_cpu_cores", labels)] == group.cpu
        assert first[("dlrover_kfp_plan_pod_memory_bytes", labels)] == group.memory_mb * MIB
    # Every samples/s scraped is one the profile recorded (the newest sample's, at that time).
    recorded = {s.throughput for s in profile.samples}
    assert {s[("dlrover_kfp_samples_per_second", ())] for s in training} <= recorded
    steps = {s.global_step for s in profile.samples}
    assert any(s[("dlrover_kfp_global_step", ())] in steps for s in training)
    # Counts: what the run trains in all is what it processed; the queue always adds up.
    total = profile.outcome.samples_processed
    assert all(s[("dlrover_kfp_samples_to_train", ())] == total for s in seen)
    trained = [s[("dlrover_kfp_samples_trained", ())] for s in seen]
    assert trained == sorted(trained) and 0 < max(trained) <= total
    shards = [
        {st: s[("dlrover_kfp_shards", (("state", st),))] for st in ("todo", "in_progress", "done")}
        for s in seen
    ]
    assert len({sum(q.values()) for q in shards}) == 1  # every shard of every epoch, once
    assert any(q["in_progress"] > 0 for q in shards) and shards[-1]["done"] > shards[0]["done"]
    # The pods as the backend saw them: the plan's PS all running at some scrape.
    ps_running = ("dlrover_kfp_pods", (("phase", "Running"), ("role", "ps")))
    assert max(s[ps_running] for s in seen) == plan.ps.count
    # Every event kind is a series from the start; this run had none.
    kinds = {dict(k[1])["kind"] for k in first if k[0] == "dlrover_kfp_events_total"}
    assert kinds == {"oom", "relaunch", "migration", "straggler", "scale", "failure"}
    assert all(v == len(profile.events) == 0 for k, v in seen[-1].items() if "events" in k[0])
    # Stopped with the run: nothing listens on the port, and a server may take it again.
    with pytest.raises(urllib.error.URLError):
        scrape(port)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as every HTTP server does
        s.bind(("127.0.0.1", port))
        s.listen()


def test_a_master_in_a_pod_serves_by_default_one_elsewhere_only_when_asked() -> None:
    pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}  # what the kubelet sets in every container
    default = RunSettings()
    assert (default.metrics_port, default.metrics_host) == (None, None)  # off: a local run
    served = pod_defaults(default, pod)
    assert (served.metrics_port, served.metrics_host) == (DEFAULT_METRICS_PORT, "0.0.0.0")
    assert pod_defaults(default, {}) == default  # a laptop, a fake kubelet's "pod": off
    assert pod_defaults(RunSettings(metrics_port=0), pod).metrics_port == 0  # off stays off
    chosen = pod_defaults(RunSettings(metrics_port=9464, metrics_host="10.0.0.7"), pod)
    assert (chosen.metrics_port, chosen.metrics_host) == (9464, "10.0.0.7")


def test_the_shard_queue_counts_every_epoch() -> None:
    """todo + in_progress + done is every shard of every epoch, across an epoch's end."""
    ledger = ShardLedger(ranges=((0, 0, 10), (0, 10, 20), (0, 20, 30)), epochs=2)
    state = MasterState(ledger=ledger, num_ps=1, job_config={})
    counts = shard_counts(state)
    assert (counts.todo, counts.in_progress, counts.done) == (6, 0, 0)
    for _ in range(3):
        shard = ledger.lease("w", 0.0)
        assert shard is not None
        ledger.complete("w", shard.id, shard.epoch)
    ledger.lease("w", 0.0)
    counts = shard_counts(state)
    assert (counts.todo, counts.in_progress, counts.done) == (2, 1, 3)


def test_a_metrics_port_in_use_fails_the_run_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit code 2 with the port named, before any pod or file of the run exists."""
    job = tmp_path / "job.yaml"
    job.write_text(SPEC)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["run", "--job", str(job), "--static", "--output-dir", str(tmp_path / "out")]
        code = main([*argv, "--metrics-port", str(port)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"--metrics-port {port}: cannot listen on 127.0.0.1:{port} (in use)" in err
    out = tmp_path / "out"
    assert not list((out / "logs").iterdir()), "a pod was started"
    assert not (out / "profile.json").exists() and not (out / "run.json").exists()
    assert main([*argv, "--metrics-port", "70000"]) == 2
    assert "--metrics-port 70000: must be 0 (no metrics) or a port 1-65535" in (
        capsys.readouterr().err
    )
