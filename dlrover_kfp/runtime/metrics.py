"""The job master's Prometheus endpoint: what a platform team's dashboards and alerts read.

A run served with ``metrics_port`` (``dlrover-kfp run --metrics-port N``; docs/observability.md)
answers ``GET /metrics`` in Prometheus' text format while its master lives, from
:func:`serve_metrics` until the run ends. Why it is built this way:

* **Read at scrape time, not pushed.** :class:`RunCollector` is a custom collector that reads
  the run's own record (the newest runtime sample, the shape it runs at now, its events) and
  the master's state (shard ledger, counts, under the state's lock) when Prometheus asks, so the
  runtime's code has no metrics calls in it and a value can never drift from what the profile
  says: the numbers come from the same objects the profile is written from.
* **Its own registry.** Each run gets a fresh ``CollectorRegistry``, never the process-global
  one: a process may run several masters one after another (the quickstart's rounds, the tests,
  Airflow's in-process master), and a global registry would keep the first run's collector (or
  refuse the second's).
* **Stopped with the run.** The HTTP server is a context manager around the whole run: a port in
  use fails the run before anything is written (a :class:`~dlrover_kfp.errors.UserInputError`,
  exit 2), and the port is free again once the run has returned, whatever way it ended.

Metric values follow Prometheus' base units (seconds, bytes, cores) and its naming rules (a
``_total`` counter for the events; gauges for what can go back, such as the trained-sample count
after a rollback to a checkpoint).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol, get_args
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dlrover_kfp.core.plan import NodeGroup
from dlrover_kfp.core.profile import EventKind, JobEvent, RuntimeSample
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.ports import ClusterBackend, PodPhase
from dlrover_kfp.runtime.master import MasterState
from dlrover_kfp.runtime.options import RunSettings

log = logging.getLogger(__name__)

#: The prefix of every metric the master exports.
PREFIX = "dlrover_kfp"
#: The port a master in a pod serves on unless told otherwise (``--metrics-port``), declared
#: as the pod's ``metrics`` containerPort: 8080, the metrics port Kubernetes controllers
#: (controller-runtime's ``--metrics-bind-address``) serve on by convention, free in a pod
#: where the master is the only server. A local run serves none unless asked.
DEFAULT_METRICS_PORT = 8080
#: Where a local master listens: only this machine's own scraper reaches it.
LOOPBACK = "127.0.0.1"
#: Where a master in a pod listens (it is alone in its network namespace with its sidecars).
ALL_INTERFACES = "0.0.0.0"  # on purpose: a scraper elsewhere must reach it
_MIB = 1024 * 1024
_ROLES = ("worker", "ps")
_EVENT_KINDS: tuple[str, ...] = get_args(EventKind)


class ObservedRun(Protocol):
    """What the collector reads of a run (a :class:`~dlrover_kfp.runtime.job.JobRun`): named
    here, not imported, so that the run can start its own endpoint without an import cycle."""

    spec: JobSpec
    run_id: str
    started_wall: float
    workers: NodeGroup
    ps: NodeGroup
    samples: list[RuntimeSample]
    events: list[JobEvent]
    state: MasterState
    backend: ClusterBackend


@dataclass(frozen=True, slots=True)
class ShardCounts:
    """The shard queue over every epoch: to do, leased to a worker, done."""

    todo: int
    in_progress: int
    done: int


def shard_counts(state: MasterState) -> ShardCounts:
    """The ledger's queue, read under the master's lock (its handlers change it)."""
    with state.lock:
        ledger = state.ledger
        per_epoch = len(ledger.ranges)
        total = per_epoch * ledger.epochs
        done = min(total, ledger.epoch * per_epoch + len(ledger.done))
        doing = len(ledger.doing)
    return ShardCounts(todo=max(0, total - done - doing), in_progress=doing, done=done)


class RunCollector(Collector):
    """The run's metrics, built from its record and state on every scrape."""

    def __init__(self, run: ObservedRun) -> None:
        self._run = run

    def collect(self) -> Iterator[Metric]:
        run = self._run
        yield from self._identity(run)
        yield from self._progress(run)
        yield from self._plan(run.workers, run.ps)
        yield _events(list(run.events))
        yield from _shards(shard_counts(run.state))
        yield _pods(run.backend)

    @staticmethod
    def _identity(run: ObservedRun) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            f"{PREFIX}_run_info",
            "The run this master trains (always 1): its job name and run id.",
            labels=["job_name", "run_id"],
        )
        info.add_metric([run.spec.name, run.run_id], 1.0)
        yield info
        yield GaugeMetricFamily(
            f"{PREFIX}_run_start_time_seconds",
            "When the run started (seconds since the epoch; a resumed run's first start).",
            value=run.started_wall,
        )

    @staticmethod
    def _progress(run: ObservedRun) -> Iterator[Metric]:
        newest = run.samples[-1] if run.samples else None
        # (samples, steps, loss sum, bad rows) under the master's lock
        trained, steps, _, bad = run.state.totals()
        with run.state.lock:
            to_train = run.state.ledger.total_rows
        yield GaugeMetricFamily(
            f"{PREFIX}_samples_per_second",
            "The job's training speed over the newest sample interval (the profile's "
            "samples[-1].throughput); 0 before the first sample.",
            value=newest.throughput if newest is not None else 0.0,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_global_step",
            "Training steps of all workers together (goes back on a rollback to a checkpoint).",
            value=float(steps),
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_samples_trained",
            "Samples trained so far, each counted once (goes back on a rollback).",
            value=float(trained),
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_samples_to_train",
            "Samples the run trains in all: the training rows times the epochs.",
            value=float(to_train),
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_bad_rows",
            "Input rows skipped as malformed so far.",
            value=float(bad),
        )

    @staticmethod
    def _plan(workers: NodeGroup, ps: NodeGroup) -> Iterator[Metric]:
        count = GaugeMetricFamily(
            f"{PREFIX}_plan_pods",
            "Pods of each role in the shape the job runs at now (the applied plan).",
            labels=["role"],
        )
        cpu = GaugeMetricFamily(
            f"{PREFIX}_plan_pod_cpu_cores",
            "CPU cores of one pod of each role (requests = limits) in the applied plan.",
            labels=["role"],
        )
        memory = GaugeMetricFamily(
            f"{PREFIX}_plan_pod_memory_bytes",
            "Memory of one pod of each role (requests = limits) in the applied plan.",
            labels=["role"],
        )
        for role, group in zip(_ROLES, (workers, ps), strict=True):
            count.add_metric([role], float(group.count))
            cpu.add_metric([role], group.cpu)
            memory.add_metric([role], float(group.memory_mb * _MIB))
        yield from (count, cpu, memory)


def _events(events: Iterable[JobEvent]) -> Metric:
    """Every kind, 0 included: a ``rate()`` or ``increase()`` needs the series from the start."""
    counts = dict.fromkeys(_EVENT_KINDS, 0)
    for event in events:
        counts[event.kind] = counts.get(event.kind, 0) + 1
    family = CounterMetricFamily(
        f"{PREFIX}_events",
        "The run's events by kind (oom, relaunch, migration, straggler, scale, failure), as "
        "its profile lists them.",
        labels=["kind"],
    )
    for kind, n in counts.items():
        family.add_metric([kind], float(n))
    return family


def _shards(counts: ShardCounts) -> Iterator[Metric]:
    family = GaugeMetricFamily(
        f"{PREFIX}_shards",
        "Data shards over every epoch by state: todo, in_progress (leased to a worker), done.",
        labels=["state"],
    )
    family.add_metric(["todo"], float(counts.todo))
    family.add_metric(["in_progress"], float(counts.in_progress))
    family.add_metric(["done"], float(counts.done))
    yield family


def _pods(backend: ClusterBackend) -> Metric:
    """The backend's pod records (its own copy, no API call) by role and phase."""
    counts = {(role, phase.value): 0 for role in _ROLES for phase in PodPhase}
    for status in backend.statuses():
        key = (status.role, status.phase.value)
        counts[key] = counts.get(key, 0) + 1
    family = GaugeMetricFamily(
        f"{PREFIX}_pods",
        "The job's pods by role and phase, as the backend last saw them (a finished pod "
        "counts until one of its name is launched again).",
        labels=["role", "phase"],
    )
    for (role, phase), n in counts.items():
        family.add_metric([role, phase], float(n))
    return family


def pod_defaults(settings: RunSettings, env: Mapping[str, str]) -> RunSettings:
    """``settings`` for a Kubernetes backend's master: in a pod (the kubelet sets
    ``KUBERNETES_SERVICE_HOST`` in every container) the default port where none was chosen, on
    every interface where none was named (Prometheus scrapes the pod IP, ``kubectl
    port-forward`` reaches localhost). Anywhere else (a laptop driving a cluster, a test's
    fake kubelet running "pods" as local processes) the port is shared with everything on the
    machine: ``None`` stays, which serves nothing, as on the local backend. The one place the
    default is decided."""
    if not env.get("KUBERNETES_SERVICE_HOST"):
        return settings
    port = DEFAULT_METRICS_PORT if settings.metrics_port is None else settings.metrics_port
    return dataclasses.replace(
        settings, metrics_port=port, metrics_host=settings.metrics_host or ALL_INTERFACES
    )


@contextlib.contextmanager
def serve_metrics(run: ObservedRun, settings: RunSettings) -> Iterator[str | None]:
    """``/metrics`` of ``run`` on ``settings.metrics_host:metrics_port`` while the block runs;
    yields the URL, or None when the port is 0 or None (off; see :func:`pod_defaults`). A port
    in use or not allowed is a :class:`UserInputError` naming it, raised before the block
    starts."""
    port = settings.metrics_port
    host = settings.metrics_host or LOOPBACK
    if not port:  # 0 or None: a master outside a pod serves none unless asked
        yield None
        return
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(run))
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        why = "in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
        raise UserInputError(
            f"--metrics-port {port}: cannot listen on {host}:{port} ({why}); "
            "choose another port, or 0 to export no metrics"
        ) from None
    url = f"http://{host}:{port}/metrics"
    log.info("metrics of run %s at %s", run.run_id, url)
    try:
        yield url
    finally:
        _stop(server, thread)


def _stop(server: WSGIServer, thread: threading.Thread) -> None:
    """Stop serving and free the port (a later run in this process may take it again)."""
    server.shutdown()
    server.server_close()
    thread.join(timeout=5.0)


__all__ = [
    "DEFAULT_METRICS_PORT",
    "PREFIX",
    "ObservedRun",
    "RunCollector",
    "ShardCounts",
    "pod_defaults",
    "serve_metrics",
    "shard_counts",
]
