"""A fake kubelet that runs a :class:`~tests.fakes.kube_apiserver.FakeApiServer`'s pods as local
processes, for tests: the pods of one node.

Like a real kubelet it talks to the API server over HTTP only (its requests carry the header
``X-Fake-Kubelet``, which exempts them from the server's injected faults and authorization and
marks them ``from_kubelet`` in its audit log): it lists and watches pods (relisting after a 410),
binds unscheduled pods to its node (``pods/NAME/binding``) unless a
:class:`~tests.fakes.scheduler.FakeScheduler` places them on several nodes, resolves the first
container's environment as the kubelet does (in order: a ``value`` with ``$(VAR)`` expanded
from the variables before it, a ``secretKeyRef`` (``optional`` honoured; a missing Secret or key
keeps the pod Pending in ``CreateContainerConfigError`` until it appears), a ``fieldRef``: the
downward API's ``metadata.name``/``namespace``/``uid``, ``labels['k']``/``annotations['k']``,
``spec.nodeName``, ``spec.serviceAccountName``, ``status.podIP(s)``/``hostIP(s)``), expands
``$(VAR)`` in ``command`` and ``args`` from that environment (:func:`expand`: ``$$`` is ``$``,
an undefined reference stays as written), runs the command through
:class:`dlrover_kfp.backends.LocalBackend` (which enforces
the CPU limit with cgroups where it can and the memory limit, OOMKilled with 137), and writes
the pod's status through ``pods/NAME/status`` as a kubelet does (phase, IPs, conditions,
``containerStatuses`` with running/terminated states and the running container's
``resources`` / ``allocatedResources``). A change of a running pod's desired resources (the
API server's ``pods/NAME/resize``) is actuated in place: ``PodResizePending`` ``Infeasible``
when it exceeds the node's ``allocatable``, ``Deferred`` while the node's other pods leave no
room for it (tried again on every pass), else ``PodResizeInProgress`` while
:meth:`LocalBackend.resize` rewrites the process's cgroup quota, then the new resources in the
status and no condition; ``PodResizeInProgress`` ``Error`` when the backend refuses (a memory
limit below what the pod holds), until a new request. A pod marked for deletion is stopped with
its grace period, its terminated state written, and then removed with a grace-0 DELETE. Usage
goes to the server's metrics API every ``metrics_interval_s``. Each container's output is kept
as a runtime keeps it, line by line with the time it was read (:mod:`.container_log`), until
its pod is deleted, and served for the API server's ``pods/NAME/log``
(:meth:`FakeKubelet.container_log`: tail, since, timestamps, limit, follow; 400 in the
kubelet's words for a container waiting to start or never started, and for ``previous``).

The faults the tests inject through it: :meth:`FakeKubelet.evict` (node pressure),
:meth:`~FakeKubelet.preempt` (the scheduler), :meth:`~FakeKubelet.lose_node`; and
:meth:`~FakeKubelet.pid_of` / :meth:`~FakeKubelet.exec_in` reach a pod's process (SIGKILL,
SIGSTOP).

Choices where a local process cannot be a container:

* the image is not pulled or used; ``command`` + ``args`` must name something runnable here, and
  ``argv[0]`` is looked up in ``executables`` first (by default ``python`` and ``python3`` map to
  this interpreter, the one with the project installed, and ``dlrover-kfp`` to its console
  script: :func:`default_executables`);
* the ``role`` and ``index`` labels become the local backend's role and index; a pod without a
  ``worker``/``ps`` role label runs as role ``worker``, index 0 when the label is missing or not
  an integer;
* a container without a CPU or memory limit runs with its request, else with this machine's
  cores and 1 GiB;
* every pod runs once, as under the backend's ``restartPolicy: Never`` (no restart in place);
  every pod IP 127.0.0.1; no ``envFrom``, ``configMapKeyRef`` or ``resourceFieldRef`` (such an
  env source keeps the pod waiting, as a missing Secret does), no service environment
  (``KUBERNETES_SERVICE_HOST``) and no service-account token: a pod that calls the API is given
  a kubeconfig; no events; the process inherits this process's environment and working
  directory; ``workingDir``, volumes, probes and init containers are ignored; only the first
  container runs (another container's log is "not available");
* each pod's ``/dev/shm`` is its own all the same: the local backend gives every pod a new,
  empty directory in ``DLROVER_KFP_SHM_DIR`` (an env entry of that name in the manifest is
  dropped, as the backend's own variables are) and removes it when the pod ends, is deleted or
  its node is lost. So does a cluster: the runtime gives every pod sandbox a private
  ``/dev/shm``, whether or not the manifest mounts an ``emptyDir`` there, and the kubelet tears
  a terminated pod's memory-backed volumes down. No pod reads another's shared memory here,
  even though all run on this one host.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import http.client
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlencode

from dlrover_kfp.backends import LocalBackend, PodSpec, PodStatus
from dlrover_kfp.core.profile import Role
from dlrover_kfp.ports import RESERVED_ENV
from tests.fakes.container_log import LOG_POLL_S, ContainerLog, PodLogOptions, read_log
from tests.fakes.kube_apiserver import (
    DEFAULT_NODE,
    KUBELET_HEADER,
    ApiError,
    FakeApiServer,
    Json,
    format_quantity,
    parse_quantity,
    rfc3339,
)

_MIB = 1024 * 1024
_KUBELET_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")
_RESIZE_CONDITIONS = ("PodResizePending", "PodResizeInProgress")
_POLL_S = 0.05
#: How long a pod waiting for its Secret waits before the kubelet looks again.
_CONFIG_RETRY_S = 0.5
#: ``metadata.labels['key']`` / ``metadata.annotations['key']`` in a fieldRef.
_SUBSCRIPT = re.compile(r"metadata\.(labels|annotations)\['(.*)'\]")


class _ConfigError(Exception):
    """The container's configuration cannot be built (a missing secret): it waits."""


@dataclass(frozen=True, slots=True)
class StatusWrite:
    """One status the kubelet wrote: ``at`` is ``time.monotonic()`` just before the request."""

    at: float
    namespace: str
    name: str
    phase: str
    reason: str | None


@dataclass(eq=False)
class _Pod:
    """The kubelet's record of one pod (by uid); fields guarded by ``FakeKubelet._lock``."""

    uid: str
    namespace: str
    name: str
    obj: Json
    local_name: str = ""
    # pending (not started), waiting (config error), running, terminated
    state: str = "pending"
    stopping: bool = False  # a deletion or eviction is stopping it
    terminating: bool = False  # marked for deletion: being stopped, then removed
    deleted: bool = False  # removed from the API
    start_time: str | None = None
    started_at: str | None = None
    container_id: str = ""
    terminated: Json | None = None
    waiting: Json | None = None
    pod_reason: str | None = None
    pod_message: str | None = None
    failed: bool = False  # a pod-level failure (evicted) whatever the exit code
    extra_conditions: list[Json] = field(default_factory=list)
    # (cpu cores, memory MiB) the running process has; a desired change its kubelet refused
    applied: tuple[Fraction, int] | None = None
    refused: tuple[Fraction, int] | None = None
    resize_condition: Json | None = None  # PodResizePending / PodResizeInProgress, if any
    retry_at: float = 0.0
    write_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def spec(self) -> Json:
        spec = self.obj.get("spec")
        return spec if isinstance(spec, dict) else {}

    @property
    def container(self) -> Json:
        containers = self.spec.get("containers") or [{}]
        first = containers[0]
        return first if isinstance(first, dict) else {}


class ApiClient:
    """A minimal JSON client with a keep-alive connection per thread, for the cluster's own
    components (``agent``: the kubelet of a node, the scheduler): its requests carry
    ``X-Fake-Kubelet``, so the server's faults, meant for the product, spare them."""

    def __init__(self, api: FakeApiServer, agent: str) -> None:
        self.api = api
        self._agent = agent
        self._local = threading.local()

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {
            "User-Agent": f"{self._agent} (linux/amd64) fake/v1.34.0",
            "Accept": "application/json",
            KUBELET_HEADER: self._agent,
        }
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def _connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection("127.0.0.1", self.api.port, timeout=30)
            self._local.conn = conn
        return conn

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        for attempt in range(3):
            conn = self._connection()
            try:
                conn.request(method, path, body=data, headers=self._headers(content_type))
                resp = conn.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt == 2 or self.api.closed:
                    raise
                time.sleep(0.05)
                continue
            ctype = resp.getheader("Content-Type") or ""
            if raw and ctype.startswith("application/json"):
                return resp.status, json.loads(raw)
            return resp.status, raw.decode(errors="replace")
        raise AssertionError("unreachable")

    def stream(
        self, path: str, query: Mapping[str, Any], on_open: threading.Event | None = None
    ) -> Iterator[Json]:
        """A watch: yields events; :meth:`close_watch` ends it from another thread.
        ``on_open`` is set once the server has answered 200."""
        conn = http.client.HTTPConnection("127.0.0.1", self.api.port, timeout=None)
        self.watch_conn = conn
        try:
            conn.request("GET", path + "?" + urlencode(query), headers=self._headers())
            resp = conn.getresponse()
            if resp.status != 200:
                body = resp.read()
                try:
                    status = json.loads(body)
                except ValueError:
                    status = {"code": resp.status, "message": body.decode(errors="replace")}
                yield {"type": "ERROR", "object": status}
                return
            if on_open is not None:
                on_open.set()
            while True:
                line = resp.readline()
                if not line:
                    return
                if line.strip():
                    yield json.loads(line)
        finally:
            conn.close()

    watch_conn: http.client.HTTPConnection | None = None

    def close_watch(self) -> None:
        """End :meth:`stream`'s watch from another thread."""
        conn = self.watch_conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(2)


def watch_pods(
    client: ApiClient,
    stop: threading.Event,
    synced: threading.Event,
    emit: Callable[[str, Json], None],
) -> None:
    """List every pod, then watch from the list's version until ``stop``, as an informer
    does: ``emit("SYNC", {"items": [...]})`` after each list (the first, and again after a 410
    Gone), then ``emit(type, object)`` for each event. ``synced`` is set once a watch is
    open."""
    rv: str | None = None
    while not stop.is_set():
        try:
            if rv is None:
                code, listing = client.request("GET", "/api/v1/pods")
                if code != 200:
                    time.sleep(0.1)
                    continue
                rv = listing["metadata"]["resourceVersion"]
                emit("SYNC", {"items": listing.get("items") or []})
            query = {
                "watch": "1",
                "resourceVersion": rv,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": 300,
            }
            for event in client.stream("/api/v1/pods", query, synced):
                if stop.is_set():
                    return
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    rv = None if obj.get("code") == 410 else rv
                    break
                new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                if new_rv:
                    rv = new_rv
                if kind != "BOOKMARK":
                    emit(str(kind), obj)
        except (OSError, http.client.HTTPException, ValueError):
            if stop.is_set() or client.api.closed:
                return
            time.sleep(0.05)


class FakeKubelet:
    """Runs the pods of ``api`` bound to ``node_name`` as local processes, binding
    unscheduled ones there first when it ``schedules`` (the default: a one-node cluster);
    see the module docstring. Use as a context manager."""

    def __init__(
        self,
        api: FakeApiServer,
        *,
        node_name: str = DEFAULT_NODE,
        log_dir: Path,
        metrics_interval_s: float = 0.5,
        executables: Mapping[str, str] | None = None,
        schedules: bool = True,
        allocatable: tuple[Fraction, Fraction] | None = None,
    ) -> None:
        self.api = api
        #: The node's (cpu cores, memory bytes) for pods, against which a resize is admitted;
        #: None: any resize fits (a lone kubelet, whose node is this machine).
        self.allocatable = allocatable
        self.node_name = node_name
        #: Whether it binds unscheduled pods to its node itself (a one-node cluster); else a
        #: :class:`~tests.fakes.scheduler.FakeScheduler` binds them and it runs only its own.
        self.schedules = schedules
        self.log_dir = Path(log_dir)
        self.metrics_interval_s = metrics_interval_s
        self.executables = dict(executables if executables is not None else default_executables())
        #: Every status written, in order (for latency measurements).
        self.status_writes: list[StatusWrite] = []
        self.backend = LocalBackend(self.log_dir)
        self._client = ApiClient(api, f"kubelet/{node_name}")
        self._lock = threading.RLock()
        self._pods: dict[str, _Pod] = {}  # by uid
        self._logs: dict[str, ContainerLog] = {}  # by uid: the containers that have run
        self._events: list[tuple[str, Json]] = []
        self._events_ready = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._node_lost = False
        self._threads: list[threading.Thread] = []
        self._synced = threading.Event()  # listed and watching
        api.kubelet_nodes.add(node_name)
        api.log_sources[node_name] = self
        loops = ((self._watch_loop, "watch"), (self._sync_loop, "sync"), (self._log_loop, "logs"))
        for target, name in loops:
            thread = threading.Thread(target=target, name=f"fake-kubelet-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        self._synced.wait(timeout=10)

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop the loops and every process (the API objects stay as they are)."""
        if self._stop.is_set():
            return
        self._stop.set()
        with self._lock:
            self._events_ready.notify_all()
        self._client.close_watch()
        for thread in self._threads:
            thread.join(timeout=10)
        self.backend.close(grace_s=1.0)
        self.api.kubelet_nodes.discard(self.node_name)
        if self.api.log_sources.get(self.node_name) is self:
            del self.api.log_sources[self.node_name]
        with self._lock:
            logs = list(self._logs.values())
        for log in logs:
            log.end()

    # -- public helpers ----------------------------------------------------------------------

    def status_write(
        self, name: str, phases: tuple[str, ...], timeout_s: float = 5.0
    ) -> StatusWrite:
        """The first status written for pod ``name`` with one of ``phases``, waiting for it:
        a write is recorded once the API answered it, which a watcher may see first."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                found = next(
                    (w for w in self.status_writes if w.name == name and w.phase in phases), None
                )
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"no {phases} status written for {name} in {timeout_s}s")
            time.sleep(0.01)

    def pid_of(self, name: str, namespace: str = "default") -> int | None:
        pod = self._find(name, namespace)
        return self.backend.pid_of(pod.local_name) if pod and pod.local_name else None

    def exec_in(
        self, name: str, argv: Sequence[str], namespace: str = "default"
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` in a running pod's limits, as ``kubectl exec`` does."""
        pod = self._find(name, namespace)
        if pod is None or not pod.local_name:
            raise AssertionError(f"pod {namespace}/{name} is not running here")
        return self.backend.exec_in(pod.local_name, argv)

    def evict(self, name: str, namespace: str = "default", *, message: str | None = None) -> None:
        """Evict a pod as the kubelet's eviction manager does (node pressure): a
        ``DisruptionTarget`` condition (``TerminationByKubelet``), the process stopped,
        ``status.phase: Failed``, ``status.reason: Evicted`` and ``message``; the object
        stays."""
        pod = self._find(name, namespace)
        if pod is None:
            raise KeyError(f"pod {namespace}/{name} is not on node {self.node_name}")
        message = message or (
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi."
            f" Container {pod.container.get('name', 'main')} was using more than its request."
        )
        with self._lock:
            pod.stopping = True
            pod.failed = True
            pod.pod_reason, pod.pod_message = "Evicted", message
            pod.extra_conditions = [
                _condition("DisruptionTarget", "True", "TerminationByKubelet", message)
            ]
        self._stop_process(pod, 0.0)
        self._write_status(pod)

    def preempt(self, name: str, namespace: str = "default") -> None:
        """Preempt a pod as the scheduler does: a ``DisruptionTarget`` condition
        (``PreemptionByScheduler``), then a graceful delete; the kubelet then stops it and
        removes it."""
        pod = self._find(name, namespace)
        if pod is None:
            raise KeyError(f"pod {namespace}/{name} is not on node {self.node_name}")
        message = "default-scheduler: preempting to accommodate a higher priority pod"
        self._add_condition(pod, "DisruptionTarget", "PreemptionByScheduler", message)
        self._client.request("DELETE", self._pod_path(pod), {"kind": "DeleteOptions"})

    def lose_node(self) -> None:
        """The node stops responding, as the node lifecycle controller then sees it: its
        processes die (the machine is gone: no terminated state is ever written), and each of
        its pods gets a ``DisruptionTarget`` condition (``DeletionByTaintManager``) and is
        deleted. Without a kubelet to confirm, a real cluster leaves them Terminating; they are
        then removed (as pod GC or ``kubectl delete --force`` would). The toleration period
        (300 s by default) is not waited for."""
        with self._lock:
            self._node_lost = True
            pods = [p for p in self._pods.values() if not p.deleted]
        for pod in pods:
            if pod.local_name:
                self.backend.delete(pod.local_name, grace_s=0)
        message = "Taint manager: deleting due to NoExecute taint"
        for pod in pods:
            if not pod.spec.get("nodeName"):
                continue
            self._add_condition(pod, "DisruptionTarget", "DeletionByTaintManager", message)
            self._client.request("DELETE", self._pod_path(pod), {"kind": "DeleteOptions"})
            self._client.request("DELETE", self._pod_path(pod), {"gracePeriodSeconds": 0})

    # -- watch -------------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        watch_pods(self._client, self._stop, self._synced, self._enqueue)

    def _enqueue(self, kind: str, obj: Json) -> None:
        with self._lock:
            self._events.append((kind, obj))
            self._events_ready.notify()

    # -- container logs ------------------------------------------------------------------------

    def _log_loop(self) -> None:
        """Read the running containers' output as their runtime does, stamping each line."""
        while not self._stop.wait(LOG_POLL_S):
            with self._lock:
                logs = [log for log in self._logs.values() if not log.drained]
            for log in logs:
                log.pump()

    def _finish_log(self, pod: _Pod) -> None:
        """The container's process has ended: its last output goes to its log, before the
        status says so (a reader that sees the pod terminated reads the whole log)."""
        with self._lock:
            log = self._logs.get(pod.uid)
        if log is not None:
            log.pump(final=True)

    def container_log(
        self, namespace: str, name: str, container: str, options: PodLogOptions
    ) -> Iterator[bytes]:
        """``GET /containerLogs/NAMESPACE/NAME/CONTAINER``, which the API server proxies
        ``pods/NAME/log`` to: the container's log (:func:`read_log`), or why there is none
        (ApiError 400 in the kubelet's words, as the server passes them on), checked before
        anything is sent."""
        pod = self._find(name, namespace)
        if pod is None:  # not (or no longer) one of this node's pods
            raise ApiError(
                404,
                "NotFound",
                f"the server could not find the requested resource ( pods/log {name})",
            )
        where = f'container "{container}" in pod "{name}"'
        if container != pod.container.get("name"):  # only the first container runs here
            raise ApiError(400, "BadRequest", f"{where} is not available")
        if options.previous:  # every pod runs once: no container has terminated before
            raise ApiError(400, "BadRequest", f"previous terminated {where} not found")
        with self._lock:
            log, state, waiting = self._logs.get(pod.uid), pod.state, pod.waiting
        if log is None and state in ("pending", "waiting"):
            reason = (waiting or {}).get("reason") or "ContainerCreating"
            raise ApiError(400, "BadRequest", f"{where} is waiting to start: {reason}")
        if log is None:  # it never started (StartError, or deleted before)
            raise ApiError(400, "BadRequest", f"{where} is terminated")
        return read_log(log, options, lambda: not (self._stop.is_set() or self.api.closed))

    # -- the sync loop -----------------------------------------------------------------------

    def _sync_loop(self) -> None:
        next_metrics = time.monotonic() + self.metrics_interval_s
        while not self._stop.is_set():
            with self._lock:
                if not self._events:
                    self._events_ready.wait(timeout=_POLL_S)
                events, self._events = self._events, []
            try:
                for kind, obj in events:
                    if kind == "SYNC":
                        self._resync(obj["items"])
                    else:
                        self._handle(kind, obj)
                self._tick()
                if time.monotonic() >= next_metrics:
                    next_metrics = time.monotonic() + self.metrics_interval_s
                    self._report_usage()
            except (OSError, http.client.HTTPException):
                if self._stop.is_set() or self.api.closed:
                    return
                time.sleep(0.05)

    def _mine(self, obj: Json) -> bool:
        node = (obj.get("spec") or {}).get("nodeName") or ""
        return node == self.node_name or (not node and self.schedules)

    def _resync(self, items: list[Json]) -> None:
        seen = set()
        for obj in items:
            uid = obj["metadata"]["uid"]
            seen.add(uid)
            self._handle("MODIFIED", obj)
        with self._lock:
            gone = [p for uid, p in self._pods.items() if uid not in seen]
        for pod in gone:  # deleted while the watch was down
            self._handle("DELETED", pod.obj)

    def _handle(self, kind: str, obj: Json) -> None:
        meta = obj.get("metadata") or {}
        uid = meta.get("uid", "")
        if not uid or not self._mine(obj):
            return
        with self._lock:
            pod = self._pods.get(uid)
            if kind == "DELETED":
                if pod is None:
                    return
                pod.deleted = True
                del self._pods[uid]
            elif pod is None:
                pod = _Pod(uid, meta.get("namespace", ""), meta.get("name", ""), obj)
                self._pods[uid] = pod
            else:
                pod.obj = obj
            lost = self._node_lost
        if kind == "DELETED":
            if pod.local_name and pod.state == "running":
                self.backend.delete(pod.local_name, grace_s=0)  # force-deleted: kill it
            self.api.clear_pod_metrics(pod.namespace, pod.name)
            with self._lock:
                log = self._logs.pop(uid, None)
            if log is not None:  # the kubelet removes a deleted pod's containers and logs
                log.end()
            return
        if lost:
            return
        phase = (obj.get("status") or {}).get("phase")
        if not (obj.get("spec") or {}).get("nodeName"):
            if not meta.get("deletionTimestamp"):
                self._schedule(pod)
        elif meta.get("deletionTimestamp"):
            self._begin_termination(pod)
        elif pod.state == "pending" and phase not in ("Succeeded", "Failed"):
            self._start(pod)

    def _tick(self) -> None:
        with self._lock:
            if self._node_lost:
                return
            pods = list(self._pods.values())
        statuses = {s.name: s for s in self.backend.statuses()}
        now = time.monotonic()
        for pod in pods:
            if pod.deleted:
                continue
            deleting = bool((pod.obj.get("metadata") or {}).get("deletionTimestamp"))
            if not pod.spec.get("nodeName"):
                if not deleting:
                    self._schedule(pod)
            elif deleting:
                self._begin_termination(pod)
            elif pod.state == "running" and not pod.stopping:
                status = statuses.get(pod.local_name)
                if status is not None and status.phase.terminal:
                    self._on_exit(pod, status)
                else:
                    self._resize(pod)
            elif pod.state == "waiting" and not pod.stopping and now >= pod.retry_at:
                self._start(pod)

    # -- scheduling and running --------------------------------------------------------------

    def _schedule(self, pod: _Pod) -> None:
        code, _ = self._client.request(
            "POST",
            self._pod_path(pod) + "/binding",
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": pod.name, "namespace": pod.namespace},
                "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name},
            },
        )
        if code == 201:
            pod.obj = copy.deepcopy(pod.obj)
            pod.obj.setdefault("spec", {})["nodeName"] = self.node_name
            self._start(pod)

    def _start(self, pod: _Pod) -> None:
        if pod.stopping or pod.deleted or (pod.obj.get("metadata") or {}).get("deletionTimestamp"):
            return
        container = pod.container
        try:
            env = self._resolve_env(pod, container)
        except _ConfigError as e:
            with self._lock:
                pod.state = "waiting"
                pod.retry_at = time.monotonic() + _CONFIG_RETRY_S
                first = pod.waiting is None
                pod.waiting = {"reason": "CreateContainerConfigError", "message": str(e)}
                pod.start_time = pod.start_time or rfc3339()
            if first:
                self._write_status(pod)
            return
        argv = [
            expand(str(a), env)
            for a in (container.get("command") or []) + (container.get("args") or [])
        ]
        if argv:
            argv[0] = self.executables.get(argv[0], argv[0])
        labels = (pod.obj.get("metadata") or {}).get("labels") or {}
        role: Role = "ps" if labels.get("role") == "ps" else "worker"
        index_text = str(labels.get("index", "0"))
        index = int(index_text) if index_text.isdigit() else 0
        cpu, memory_mb = self._limits(pod)
        local_name = pod.local_name or self._local_name(pod)
        clean_env = {k: v for k, v in env.items() if k not in RESERVED_ENV}
        now = rfc3339()
        with self._lock:
            pod.local_name = local_name
            pod.waiting = None
            pod.start_time = pod.start_time or now
        if not argv:
            self._record_start_failure(pod, "no command specified", now)
            return
        log = ContainerLog.at_end_of(self.backend.log_path(local_name), local_name)
        try:
            self.backend.launch(
                PodSpec(
                    name=local_name,
                    role=role,
                    index=index,
                    command=tuple(argv),
                    env=clean_env,
                    cpu=float(cpu),
                    memory_mb=memory_mb,
                    labels={k: str(v) for k, v in labels.items()},
                )
            )
        except Exception as e:  # PodExistsError, a spec the backend refuses
            self._record_start_failure(pod, str(e), now)
            return
        status = next((s for s in self.backend.statuses() if s.name == local_name), None)
        if status is not None and status.reason == "StartError":
            self._record_start_failure(pod, f"exec: {argv[0]!r}: executable file not found", now)
            return
        with self._lock:
            self._logs[pod.uid] = log
            pod.state = "running"
            pod.applied = (cpu, memory_mb)
            pod.started_at = now
            pod.container_id = f"containerd://{uuid.uuid4().hex}{uuid.uuid4().hex}"
            pod.terminated = None
        self._write_status(pod)

    # -- in-place resize -----------------------------------------------------------------------

    def _resize(self, pod: _Pod) -> None:
        """Actuate a change of a running pod's desired resources, as the kubelet's resize does:
        admit it against the node, then apply it to the running process (its cgroup quota)."""
        want = self._limits(pod)
        if want in (pod.applied, pod.refused):
            if want == pod.applied and pod.resize_condition is not None:
                self._set_resize_condition(pod, None)  # withdrawn: nothing left to do
            return
        pending = self._admit(pod, want)
        if pending is not None:
            self._set_resize_condition(pod, _condition("PodResizePending", "True", *pending))
            return
        self._set_resize_condition(pod, _condition("PodResizeInProgress", "True", "", ""))
        outcome = self.backend.resize(pod.local_name, float(want[0]), want[1])
        if not outcome.in_place:
            pod.refused = want
            error = _condition("PodResizeInProgress", "True", "Error", outcome.reason)
            self._set_resize_condition(pod, error)
            return
        with self._lock:
            pod.applied, pod.refused = want, None
        self._set_resize_condition(pod, None)

    def _admit(self, pod: _Pod, want: tuple[Fraction, int]) -> tuple[str, str] | None:
        """None if the node has room for ``want`` now; else ``Infeasible`` (more than the
        node's allocatable: never) or ``Deferred`` (beside its other pods: not now), with a
        message in the kubelet's words."""
        if self.allocatable is None:
            return None
        asked = (want[0], Fraction(want[1] * _MIB))
        with self._lock:
            others = [
                p.applied or self._limits(p)
                for p in self._pods.values()
                if p is not pod and not p.deleted and p.state != "terminated"
            ]
        used = (
            sum((o[0] for o in others), Fraction(0)),
            Fraction(sum(o[1] for o in others) * _MIB),
        )
        for i, kind in enumerate(("cpu", "memory")):
            capacity, requested = self.allocatable[i], _amount(kind, asked[i])
            if asked[i] > capacity:
                return "Infeasible", (
                    f"Node didn't have enough capacity: {kind}, requested: {requested},"
                    f" capacity: {_amount(kind, capacity)}"
                )
        for i, kind in enumerate(("cpu", "memory")):
            capacity, requested = self.allocatable[i], _amount(kind, asked[i])
            if asked[i] > capacity - used[i]:
                return "Deferred", (
                    f"Node didn't have enough resource: {kind}, requested: {requested},"
                    f" used: {_amount(kind, used[i])}, capacity: {_amount(kind, capacity)}"
                )
        return None

    def _set_resize_condition(self, pod: _Pod, condition: Json | None) -> None:
        """Write the pod's status with ``condition`` as its one resize condition (none: the
        resize is done), unless that is already what it says."""
        current = pod.resize_condition
        same = (current is None and condition is None) or (
            current is not None
            and condition is not None
            and all(current.get(k) == condition.get(k) for k in ("type", "reason", "message"))
        )
        if same:
            return
        with self._lock:
            pod.resize_condition = condition
        self._write_status(pod)

    def _record_start_failure(self, pod: _Pod, message: str, now: str) -> None:
        with self._lock:
            pod.state = "terminated"
            pod.failed = True
            pod.terminated = {
                "exitCode": 128,
                "reason": "StartError",
                "message": message,
                "startedAt": "1970-01-01T00:00:00Z",
                "finishedAt": now,
                "containerID": "",
            }
        self._write_status(pod)

    def _on_exit(self, pod: _Pod, status: PodStatus) -> None:
        """The process ended on its own (or was OOM-killed)."""
        terminated = self._terminated_state(pod, status)
        self._finish_log(pod)
        with self._lock:
            pod.terminated = terminated
            pod.state = "terminated"
        self.api.clear_pod_metrics(pod.namespace, pod.name)
        self._write_status(pod)

    def _terminated_state(self, pod: _Pod, status: PodStatus | None) -> Json:
        code = 137 if status is None or status.exit_code is None else status.exit_code
        reason = status.reason if status is not None else None
        if reason in ("OOMKilled", "StartError"):
            shown = reason
        else:
            shown = "Completed" if code == 0 else "Error"
        return {
            "exitCode": code,
            "reason": shown,
            "startedAt": pod.started_at or rfc3339(),
            "finishedAt": rfc3339(status.finished_at if status and status.finished_at else None),
            "containerID": pod.container_id,
        }

    def _stop_process(self, pod: _Pod, grace_s: float) -> None:
        """Stop the pod's process (if any) and record its terminated state."""
        if pod.local_name and pod.state == "running":
            self.backend.delete(pod.local_name, grace_s=grace_s)
            status = next((s for s in self.backend.statuses() if s.name == pod.local_name), None)
            self._finish_log(pod)
            with self._lock:
                pod.terminated = self._terminated_state(pod, status)
                pod.state = "terminated"
        else:
            with self._lock:
                if pod.state in ("waiting", "pending"):
                    pod.state = "terminated"
        self.api.clear_pod_metrics(pod.namespace, pod.name)

    def _begin_termination(self, pod: _Pod) -> None:
        with self._lock:
            if pod.terminating:
                return
            pod.terminating = True
            pod.stopping = True
        grace = int((pod.obj.get("metadata") or {}).get("deletionGracePeriodSeconds") or 0)
        threading.Thread(
            target=self._terminate, args=(pod, grace), daemon=True, name="fake-kubelet-kill"
        ).start()

    def _terminate(self, pod: _Pod, grace: int) -> None:
        try:
            was_running = pod.state == "running"
            self._stop_process(pod, float(grace))
            if was_running or pod.terminated is not None:
                self._write_status(pod)
            if self._node_lost:
                return
            self._client.request(
                "DELETE",
                self._pod_path(pod),
                {"gracePeriodSeconds": 0, "preconditions": {"uid": pod.uid}},
            )
        except (OSError, http.client.HTTPException):
            pass  # the server went away

    # -- status ------------------------------------------------------------------------------

    def _pod_path(self, pod: _Pod) -> str:
        return f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}"

    def _phase(self, pod: _Pod) -> str:
        if pod.state in ("pending", "waiting"):
            return "Pending"
        if pod.state == "running":
            return "Running"
        if pod.failed:
            return "Failed"
        code = (pod.terminated or {}).get("exitCode", 1)
        return "Succeeded" if code == 0 else "Failed"

    def _conditions(
        self, pod: _Pod, current: list[Json], ready: bool, terminal: bool
    ) -> list[Json]:
        """The kubelet's own conditions (transition times kept while unchanged), the extra
        ones of an eviction, and the others (PodScheduled, DisruptionTarget) as they are."""
        now = rfc3339()
        owned = {
            "PodReadyToStartContainers": "True" if not terminal else "False",
            "Initialized": "True",
            "ContainersReady": "True" if ready else "False",
            "Ready": "True" if ready else "False",
        }
        old = {c.get("type"): c for c in current}
        conditions = [
            c
            for c in current
            if c.get("type") not in owned and c.get("type") not in _RESIZE_CONDITIONS
        ]
        if pod.resize_condition is not None:
            conditions.append(pod.resize_condition)
        for extra in pod.extra_conditions:
            conditions = [c for c in conditions if c.get("type") != extra["type"]]
            conditions.append(extra)
        for kind in _KUBELET_CONDITIONS:
            value = owned[kind]
            previous = old.get(kind)
            cond: Json = {
                "type": kind,
                "status": value,
                "lastProbeTime": None,
                "lastTransitionTime": (
                    previous["lastTransitionTime"]
                    if previous and previous.get("status") == value
                    else now
                ),
            }
            if value == "False" and kind in ("Ready", "ContainersReady"):
                if terminal:
                    cond["reason"] = "PodCompleted"
                else:
                    cond["reason"] = "ContainersNotReady"
                    cond["message"] = (
                        f"containers with unready status: [{pod.container.get('name')}]"
                    )
            conditions.append(cond)
        return conditions

    def _render(self, pod: _Pod, current: Json) -> Json:
        status = copy.deepcopy(current)
        now = rfc3339()
        phase = self._phase(pod)
        status["phase"] = phase
        status["hostIP"] = "127.0.0.1"
        status["hostIPs"] = [{"ip": "127.0.0.1"}]
        if pod.state != "pending" or pod.start_time:
            status["podIP"] = "127.0.0.1"
            status["podIPs"] = [{"ip": "127.0.0.1"}]
            status["startTime"] = pod.start_time or now
        if pod.pod_reason:
            status["reason"] = pod.pod_reason
            status["message"] = pod.pod_message or ""
        running = pod.state == "running" and not (pod.stopping and pod.terminated)
        terminal = phase in ("Succeeded", "Failed")
        ready = running and not terminal
        status["conditions"] = self._conditions(
            pod, status.get("conditions") or [], ready, terminal
        )
        container = pod.container
        state: Json
        if pod.terminated is not None and (pod.state == "terminated" or pod.stopping):
            state = {"terminated": pod.terminated}
        elif pod.state == "running":
            state = {"running": {"startedAt": pod.started_at or now}}
        else:
            state = {"waiting": pod.waiting or {"reason": "ContainerCreating"}}
        image = container.get("image", "")
        entry: Json = {
            "name": container.get("name", ""),
            "state": state,
            "lastState": {},
            "ready": ready,
            "restartCount": 0,
            "image": image,
            "imageID": f"fake://{image}",
            "started": "running" in state,
        }
        if pod.container_id:
            entry["containerID"] = pod.container_id
        if pod.applied is not None and "running" in state:
            cpu, memory_mb = pod.applied
            actual = {
                "cpu": format_quantity(cpu),
                "memory": format_quantity(memory_mb * _MIB, "BinarySI"),
            }
            entry["allocatedResources"] = dict(actual)
            entry["resources"] = {"requests": dict(actual), "limits": dict(actual)}
        status["containerStatuses"] = [entry]
        return status

    def _write_status(self, pod: _Pod) -> None:
        """Render the pod's status from the kubelet's record and PUT it (retrying conflicts)."""
        if self._node_lost or self._stop.is_set():
            return
        path = self._pod_path(pod) + "/status"
        with pod.write_lock:
            for _ in range(10):
                code, current = self._client.request("GET", self._pod_path(pod))
                if code != 200 or current["metadata"].get("uid") != pod.uid:
                    return
                with self._lock:
                    current["status"] = self._render(pod, current.get("status") or {})
                    phase = current["status"]["phase"]
                    state = current["status"]["containerStatuses"][0]["state"]
                reason = next(iter(state.values())).get("reason") if state else None
                at = time.monotonic()
                code, _ = self._client.request("PUT", path, current)
                if code == 200:
                    with self._lock:
                        self.status_writes.append(
                            StatusWrite(at, pod.namespace, pod.name, phase, reason)
                        )
                        log = self._logs.get(pod.uid) if pod.state == "terminated" else None
                    if log is not None:  # reported terminated: a follower's stream ends
                        log.end()
                    return
                if code != 409:
                    return

    def _add_condition(self, pod: _Pod, kind: str, reason: str, message: str) -> None:
        condition = _condition(kind, "True", reason, message)
        with self._lock:
            pod.extra_conditions = [c for c in pod.extra_conditions if c["type"] != kind]
            pod.extra_conditions.append(condition)
        self._client.request(
            "PATCH",
            self._pod_path(pod) + "/status",
            {"status": {"conditions": [condition]}},
            content_type="application/strategic-merge-patch+json",
        )

    def _report_usage(self) -> None:
        with self._lock:
            by_local = {
                p.local_name: p for p in self._pods.values() if p.local_name and not p.deleted
            }
        for usage in self.backend.usage():
            pod = by_local.get(usage.name)
            if pod is not None and pod.state == "running":
                self.api.set_pod_metrics(
                    pod.namespace,
                    pod.name,
                    usage.cpu_cores,
                    int(usage.memory_mb * _MIB),
                    window_s=self.metrics_interval_s,
                )

    # -- configuration -----------------------------------------------------------------------

    def _find(self, name: str, namespace: str) -> _Pod | None:
        with self._lock:
            return next(
                (p for p in self._pods.values() if p.name == name and p.namespace == namespace),
                None,
            )

    def _local_name(self, pod: _Pod) -> str:
        """The local backend's pod name: the pod's own when it is a DNS-1123 label not in use
        by another namespace's pod, else one made from the uid."""
        name = pod.name
        with self._lock:
            taken = {p.local_name for p in self._pods.values() if p is not pod and p.local_name}
        valid = len(name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)
        if valid and name not in taken:
            return name
        return "pod-" + pod.uid.replace("-", "")[:20]

    def _limits(self, pod: _Pod) -> tuple[Fraction, int]:
        resources = pod.container.get("resources") or {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        cpu = parse_quantity(limits.get("cpu") or requests.get("cpu") or os.cpu_count() or 1)
        memory = parse_quantity(limits.get("memory") or requests.get("memory") or "1Gi")
        memory_mb = max(1, math.ceil(memory / _MIB))
        return (cpu if cpu > 0 else Fraction(1, 1000)), memory_mb

    def _secret(self, namespace: str, name: str) -> dict[str, str]:
        code, secret = self._client.request("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}")
        if code == 404:
            raise _ConfigError(f'secret "{name}" not found')
        if code != 200:
            raise _ConfigError(f"cannot read secret {name}: {code}")
        return {
            k: base64.b64decode(v).decode(errors="replace")
            for k, v in (secret.get("data") or {}).items()
        }

    def _resolve_env(self, pod: _Pod, container: Json) -> dict[str, str]:
        """The container's environment as the kubelet builds it: in order, a ``value``
        expanded against the variables defined before it, a ``valueFrom`` resolved (never
        expanded); another source keeps the pod waiting (:class:`_ConfigError`)."""
        env: dict[str, str] = {}
        for item in container.get("env") or []:
            name = item.get("name", "")
            source = item.get("valueFrom")
            if not source:
                env[name] = expand(str(item.get("value") or ""), env)
            elif "fieldRef" in source:
                env[name] = self._field_value(pod, source["fieldRef"] or {})
            elif "secretKeyRef" in source:
                value = self._secret_value(pod, source["secretKeyRef"] or {})
                if value is not None:
                    env[name] = value
            else:
                raise _ConfigError(
                    f"env {name}: the fake kubelet resolves only fieldRef and secretKeyRef"
                )
        return env

    def _secret_value(self, pod: _Pod, ref: Json) -> str | None:
        """A ``secretKeyRef``'s value; None when it is ``optional`` and missing (the variable
        is then left out, as the kubelet does)."""
        optional = bool(ref.get("optional"))
        try:
            data = self._secret(pod.namespace, ref.get("name", ""))
        except _ConfigError:
            if optional:
                return None
            raise
        key = ref.get("key", "")
        if key not in data:
            if optional:
                return None
            raise _ConfigError(
                f"couldn't find key {key} in Secret {pod.namespace}/{ref.get('name')}"
            )
        return data[key]

    def _field_value(self, pod: _Pod, ref: Json) -> str:
        """A ``fieldRef`` (the downward API) as the kubelet resolves it: the paths the API
        server accepts for an env var (it refuses others at creation), from the pod as bound to
        this node; both IPs are 127.0.0.1 here."""
        path = str(ref.get("fieldPath") or "")
        meta, spec = pod.obj.get("metadata") or {}, pod.spec
        simple = {
            "metadata.name": meta.get("name", ""),
            "metadata.namespace": meta.get("namespace", ""),
            "metadata.uid": meta.get("uid", ""),
            "spec.nodeName": spec.get("nodeName") or self.node_name,
            "spec.serviceAccountName": spec.get("serviceAccountName", ""),
            "status.hostIP": "127.0.0.1",
            "status.hostIPs": "127.0.0.1",
            "status.podIP": "127.0.0.1",
            "status.podIPs": "127.0.0.1",
        }
        if path in simple:
            return str(simple[path])
        subscripted = _SUBSCRIPT.fullmatch(path)
        if subscripted is not None:
            values = meta.get(subscripted.group(1)) or {}
            return str(values.get(subscripted.group(2), ""))
        raise _ConfigError(f"unsupported fieldPath: {path}")


def default_executables() -> dict[str, str]:
    """What an image's ``argv[0]`` runs here: ``python``/``python3`` this interpreter (the one
    with the project installed), ``dlrover-kfp`` its console script beside it (the image has
    that command on its ``PATH``, deploy/Dockerfile)."""
    found = {"python": sys.executable, "python3": sys.executable}
    script = Path(sys.executable).with_name("dlrover-kfp")
    if script.exists():
        found["dlrover-kfp"] = str(script)
    return found


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (``third_party/forked/golang/expansion``), as the
    kubelet applies it to an env var's value and to ``command`` and ``args``: ``$(NAME)``
    becomes ``env[NAME]``, or stays as written when ``NAME`` is not defined; ``$$`` is a
    literal ``$``; any other ``$``, and an unclosed ``$(``, stay as written."""
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "$" or i + 1 == len(text):
            out.append(char)
            i += 1
            continue
        following = text[i + 1]
        if following == "$":
            out.append("$")
            i += 2
        elif following == "(" and (close := text.find(")", i + 2)) != -1:
            name = text[i + 2 : close]
            out.append(env.get(name, f"$({name})"))
            i = close + 1
        else:  # "$x" or an unclosed "$(": the "$" and the next character as they are
            out.append(text[i : i + 2])
            i += 2
    return "".join(out)


def _condition(kind: str, status: str, reason: str, message: str) -> Json:
    condition: Json = {
        "type": kind,
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": rfc3339(),
        "reason": reason,
        "message": message,
    }
    if not reason:  # PodResizeInProgress while it goes well has neither
        del condition["reason"], condition["message"]
    return condition


def _amount(kind: str, value: Fraction) -> int:
    """How the kubelet's resize messages count: millicores, bytes."""
    return round(value * 1000) if kind == "cpu" else round(value)


__all__ = ["ApiClient", "FakeKubelet", "StatusWrite", "watch_pods"]
