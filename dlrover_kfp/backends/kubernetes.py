"""A :class:`~dlrover_kfp.ports.ClusterBackend` whose pods are Kubernetes pods.

The only module of the project that imports ``kubernetes`` (the official client, pinned
``kubernetes==30.1.0`` as every kfp 2.x requires). What it does, and why:

* **Pods** are rendered by :mod:`.k8s_objects` (requests = limits, ``restartPolicy: Never``,
  labels ``job``/``run``/``role``/``index``, the flash-checkpoint buffer in an in-memory
  ``emptyDir`` on ``/dev/shm``, the run's volume where the master writes too). A relaunch under
  the same name deletes the old, finished object first, as the local backend replaces its
  record.
* **Secrets**: the job's env values (the per-job RPC secret among them) go into one Secret per
  run; pods reference keys of it, so no value is in a pod spec, a log line or an error.
* **Status from a watch**, not polling: a background thread lists the run's pods and watches
  from the list's ``resourceVersion``; a watch that expires (410 Gone) relists and resumes.
  Each event's raw object becomes a :class:`PodStatus` (:func:`.k8s_objects.pod_status`).
* **Retries in one place** (:meth:`KubernetesBackend._call`): 429 (after its ``Retry-After``),
  5xx and dropped connections are retried with exponential backoff up to a deadline, each
  retry logged; 4xx other than 429 are raised at once with the API's own message
  (:class:`KubernetesApiError`, permanent). The client's own urllib3 retries are switched off
  so that nothing retries twice.
* **In-place resize** (:meth:`KubernetesBackend.resize`): a strategic merge patch of the pod's
  ``resize`` subresource (Kubernetes 1.33+; the pinned client predates it, so the call goes
  through its ``ApiClient``), then reads of the pod until the kubelet reports the new limits
  in ``status.containerStatuses[].resources``. What it cannot have (an older cluster's 404, a
  422, ``PodResizePending`` ``Infeasible``, a kubelet ``Error``, the timeout) it answers with
  ``in_place=False`` and withdraws the request, so that the pod stays as it was and the
  caller replaces it instead.
* **Usage** from ``metrics.k8s.io`` when the cluster serves it (metrics-server); without it
  :meth:`usage` reports nothing and says so once.
* **Owner**: when the master runs in a pod (``POD_NAME``/``POD_UID`` from the downward API),
  its pods, Secret and Lease name it as owner, so that deleting the master deletes its job.
* **One master per job** (Kubernetes leader election): pod and Secret names are per job, so a
  second master of a job in the namespace (a KFP retry, a re-run task, a master on another
  host) would replace the first one's Secret and pods. Opening the backend first takes the
  job's Lease (``coordination.k8s.io/v1``, :func:`.k8s_objects.lease_name`), before any Secret
  or pod; a live holder's Lease refuses the newcomer at once (:class:`JobHeldError`, exit 2).
  A thread renews it every ``lease_renew_s``; one whose holder stopped renewing (killed) is
  taken over once its term has run out, or at once when its holder was a process of this
  same machine that is gone. A master whose Lease was taken refuses to launch or delete
  (:class:`LeaseLostError`) and leaves the job's objects to its successor. Closing deletes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import math
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Self, TypeVar

import urllib3
from kubernetes import client as k8s  # type: ignore[import-untyped]
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException  # type: ignore[import-untyped]

from dlrover_kfp.backends.k8s_objects import (
    CANCEL_ANNOTATION,
    Holder,
    KubernetesSettings,
    LeaseRecord,
    OwnerRef,
    job_labels,
    lease_name,
    lease_record,
    micro_time,
    pod_status,
    render_event,
    render_lease,
    render_pod,
    render_secret,
    resize_patch,
    resize_progress,
    secret_keys,
    secret_name,
    selector,
)
from dlrover_kfp.core.quantity import quantity_cores, quantity_mebibytes
from dlrover_kfp.errors import PermanentError, TransientError, UserInputError
from dlrover_kfp.ports import (
    BackendClosedError,
    BackendError,
    PodEvent,
    PodExistsError,
    PodNotFoundError,
    PodPhase,
    PodReason,
    PodSpec,
    PodStatus,
    PodUsage,
    ResizeOutcome,
)

log = logging.getLogger("dlrover_kfp.kubernetes")

T = TypeVar("T")

#: HTTP statuses worth another try: throttled, or the API server (or what is in front of it)
#: failing for the moment.
_RETRYABLE = frozenset({429, 500, 502, 503, 504})


class KubernetesApiError(BackendError, PermanentError):
    """The API refused a call for good (403 Forbidden, 422 Invalid, ...): the message is the
    API server's own, with the call that failed."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class KubernetesUnavailableError(BackendError, TransientError):
    """The API kept failing (5xx, 429, connection errors) past the retry deadline."""


class JobHeldError(BackendError, UserInputError):
    """Another master of the job is live in the namespace (it holds the job's Lease and
    renews it): a second one would take over its pods. The message names the holder and when
    it last renewed."""


class LeaseLostError(BackendError, PermanentError):
    """Another master took this master's Lease (this one could not renew it in time) or it
    was deleted: the job's pods and Secret may be the other's now, so this master must stop."""


#: This process's part of every holder identity it uses (:class:`Holder`).
_PROCESS_TOKEN = secrets.token_hex(4)
_SERIALS = itertools.count()


def _boot_id() -> str:
    """The running kernel's boot id (Linux); "" where there is none."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip().replace("-", "")[:12]
    except OSError:
        return ""


def local_holder(env: Mapping[str, str] = os.environ) -> Holder:
    """A new identity for a master of this process: its pod's name (``POD_NAME`` from the
    downward API) or this machine's, its pid, the boot id and this process's token."""
    host = env.get("POD_NAME") or socket.gethostname() or "unknown-host"
    return Holder(host, os.getpid(), _boot_id(), _PROCESS_TOKEN, next(_SERIALS))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def gone_locally(identity: str, me: Holder) -> bool:
    """Whether ``identity`` was a master on this machine (same name, same boot) whose process
    is gone (or was an earlier process under this one's pid, as after a restart in a
    container), so that its Lease need not run out: an OS-level fact, as the output
    directory's file lock is. False whenever that cannot be told."""
    other = Holder.parse(identity)
    if other is None or not me.boot or (other.host, other.boot) != (me.host, me.boot):
        return False
    if other.pid == me.pid:
        return other.process != me.process
    return not _pid_alive(other.pid)


def load_client(kubeconfig: str | None = None, context: str | None = None) -> k8s.ApiClient:
    """An API client: in-cluster (a service account's token) when the master runs in a pod
    and no kubeconfig is named, else from the kubeconfig (``KUBECONFIG`` or ~/.kube/config)."""
    configuration = k8s.Configuration()
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            k8s_config.load_incluster_config(client_configuration=configuration)
        else:
            k8s_config.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
    except (k8s_config.ConfigException, OSError) as exc:
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise UserInputError(
            f"kubernetes: cannot load the configuration ({where}): {exc}"
        ) from None
    # One place retries (KubernetesBackend._call); urllib3 retrying underneath would multiply.
    configuration.retries = False
    return k8s.ApiClient(configuration)


def _api_message(exc: ApiException) -> str:
    """The API server's own message from a Status body, else the HTTP reason."""
    try:
        body = json.loads(exc.body) if exc.body else {}
    except (TypeError, ValueError):
        body = {}
    if isinstance(body, dict) and body.get("message"):
        reason = body.get("reason") or exc.reason
        return f"{exc.status} {reason}: {body['message']}"
    return f"{exc.status} {exc.reason}"


def _since(started: float) -> float:
    return round(time.monotonic() - started, 3)


def _retry_after(exc: ApiException) -> float | None:
    headers = exc.headers or {}
    value = headers.get("Retry-After") or headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    urllib3.exceptions.HTTPError,
    ConnectionError,
    TimeoutError,
)


_WATCH_ERRORS: tuple[type[BaseException], ...] = (*_CONNECTION_ERRORS, ValueError)

#: What a cluster answers a ``resize`` it will not take: 404 (before 1.33 the subresource does
#: not exist), 405, 422 (a change it forbids: a memory decrease on 1.33, a QoS class change),
#: 403 (a Role from before resize: deploy/rbac.yaml grants ``pods/resize``). The pod is then
#: replaced instead, as on a cluster without in-place resize.
_RESIZE_REFUSED = frozenset({403, 404, 405, 422})
#: Seconds an Event is retried for (a 429, a 5xx): a moment, since telling about the run must
#: not hold up the master's loop, and a lost Event loses nothing the profile does not have.
EVENT_RETRY_S = 2.0
#: Seconds between two reads of a pod being resized: the kubelet actuates a CPU change in
#: well under a second.
_RESIZE_POLL_S = 0.1


class KubernetesBackend:
    """One run's pods in one namespace. Build with an API client (:func:`load_client`), use
    as a context manager. Thread-safe, like every :class:`ClusterBackend`."""

    def __init__(
        self,
        api: k8s.ApiClient,
        settings: KubernetesSettings,
        *,
        job: str,
        sleep: Callable[[float], None] = time.sleep,
        holder: Holder | None = None,
    ) -> None:
        self.settings = settings
        self.namespace = settings.namespace
        self._api = api
        self._core = k8s.CoreV1Api(api)
        self._custom = k8s.CustomObjectsApi(api)
        self._coordination = k8s.CoordinationV1Api(api)
        # Pod names are per job (``JOB-ROLE-INDEX``), so a namespace runs one run of a job at
        # a time and the job's label scopes the watch; a restarted master finds its pods.
        self._labels = job_labels(job)
        self._selector = selector(self._labels)
        self._secret = secret_name(job)
        self._sleep = sleep
        self._lock = threading.Condition()
        self._order: list[str] = []
        #: the last status of every pod launched here, by name (the watch keeps it current)
        self._status: dict[str, PodStatus] = {}
        #: the resources each pod was launched with
        self._specs: dict[str, PodSpec] = {}
        #: pods deleted by :meth:`delete` while they ran: they end FAILED/Deleted
        self._deleted: set[str] = set()
        #: uid of the object last seen for each name, and the uids of replaced objects (a
        #: relaunch's predecessor), whose late events must not touch the new pod's record
        self._uids: dict[str, str] = {}
        self._stale: set[str] = set()
        #: the Secret's data (key -> value) and which (env name, value) each key holds
        self._secret_data: dict[str, str] = {}
        self._keys: dict[tuple[str, str], str] = {}
        self._secret_created = False
        self._closed = False
        self._stop = threading.Event()
        self._response: Any = None  # the watch's open HTTP response
        self._metrics_missing_logged = False
        #: when each pod's create call returned (monotonic): a relist sent later that lacks it
        #: proves it was deleted in between
        self._created_at: dict[str, float] = {}
        self._synced = threading.Event()
        # The job's Lease first: a second master is refused before it writes anything.
        self._job = job
        self._lease = lease_name(job)
        self._holder = holder or local_holder()
        #: why this master lost its Lease (None while it holds it)
        self._lease_lost: str | None = None
        self._lease_stop = threading.Event()
        self._acquire_lease()
        self._renewer = threading.Thread(
            target=self._renew_loop, name="k8s-lease-renew", daemon=True
        )
        self._renewer.start()
        self._watcher = threading.Thread(target=self._watch, name="k8s-pod-watch", daemon=True)
        self._watcher.start()
        # Launches come after the first list, so that the watch sees every pod from its start.
        self._synced.wait(timeout=settings.request_timeout_s)

    # -- the port ------------------------------------------------------------------------------

    @property
    def cpu_enforced(self) -> bool:
        return True

    @property
    def enforcement(self) -> str:
        return (
            f"kubernetes (namespace {self.namespace}): requests = limits; the kubelet enforces "
            "CPU (CFS quota) and memory (OOM kill)"
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def holder(self) -> str:
        """This master's ``holderIdentity`` on the job's Lease."""
        return self._holder.identity

    @property
    def lease_lost(self) -> str | None:
        """Why this master lost the job's Lease, or None while it holds it."""
        with self._lock:
            return self._lease_lost

    def launch(self, pod: PodSpec) -> None:
        with self._lock:
            if self._closed:
                raise BackendClosedError("the Kubernetes backend is closed")
            self._check_lease()
            current = self._status.get(pod.name)
            if current is not None and not current.phase.terminal:
                raise PodExistsError(f"pod {pod.name} is still {current.phase.value}")
        if current is not None:
            # A finished pod's object stays until deleted; the new one needs its name.
            self._remove_object(pod.name)
        keys = self._ensure_secret(pod.env)
        body = render_pod(
            pod,
            namespace=self.namespace,
            image=self.settings.image,
            labels=self._labels,
            secret_name=self._secret,
            secret_keys=keys,
            owner=self.settings.owner,
            volume=self.settings.volume,
            image_pull_policy=self.settings.image_pull_policy,
        )
        with self._lock:
            self._specs[pod.name] = pod
            self._deleted.discard(pod.name)
            self._created_at.pop(pod.name, None)
            if pod.name in self._uids:
                self._stale.add(self._uids.pop(pod.name))
            if pod.name in self._order:
                self._order.remove(pod.name)
            self._order.append(pod.name)
            self._status[pod.name] = PodStatus(
                name=pod.name, role=pod.role, index=pod.index, phase=PodPhase.PENDING
            )
        try:
            created = self._call(
                f"create pod {pod.name}",
                self._core.create_namespaced_pod,
                self.namespace,
                body,
                ok_conflict=True,
            )
            if created is None:
                # An object of that name from an earlier master of this job (killed, its pods
                # stopped or stopping): it is replaced, as a relaunch replaces a finished pod.
                log.warning("kubernetes: pod %s exists from an earlier run: replacing it", pod.name)
                self._disown(pod.name, pod)
                self._remove_object(pod.name)
                self._call(
                    f"create pod {pod.name}",
                    self._core.create_namespaced_pod,
                    self.namespace,
                    body,
                )
            with self._lock:
                self._created_at[pod.name] = time.monotonic()
        except BaseException:
            with self._lock:
                self._order.remove(pod.name)
                del self._status[pod.name]
                del self._specs[pod.name]
            raise
        log.info(
            "kubernetes: created pod %s (%s %d, cpu %g, memory %d MiB)",
            pod.name,
            pod.role,
            pod.index,
            pod.cpu,
            pod.memory_mb,
        )

    def delete(self, name: str, grace_s: float = 5.0) -> None:
        with self._lock:
            self._check_lease()
            current = self._status.get(name)
            if current is None or current.phase.terminal:
                return
            self._deleted.add(name)
        self._call(
            f"delete pod {name}",
            self._core.delete_namespaced_pod,
            name,
            self.namespace,
            # whole seconds, as the API takes them; rounded up so that a pod gets its grace
            grace_period_seconds=max(0, math.ceil(grace_s)),
            ok_missing=True,
        )
        deadline = time.monotonic() + grace_s + self.settings.delete_slack_s
        while True:
            with self._lock:
                if self._status[name].phase.terminal:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    waited = grace_s + self.settings.delete_slack_s
                    raise KubernetesUnavailableError(
                        f"pod {name} did not stop within {waited:g}s of its deletion"
                    )
                self._lock.wait(min(left, 1.0))
                if self._status[name].phase.terminal:
                    return
            # The watch may have missed it (created and deleted between two lists): ask.
            if self._read_pod(name) is None:
                self._mark_gone(name)

    def resize(
        self, name: str, cpu: float, memory_mb: int, timeout_s: float = 30.0
    ) -> ResizeOutcome:
        """Resize running pod ``name`` in place through its ``resize`` subresource (requests =
        limits, as launched) and wait until the kubelet reports the new limits on the running
        container (``in_place=True``). ``Deferred`` (the node has no room now) keeps waiting;
        a refusal or ``timeout_s`` returns ``in_place=False`` with the cluster's words after
        withdrawing the request. Transient API errors are retried as every call is.
        :class:`PodNotFoundError` if the pod is not running."""
        with self._lock:
            self._check_lease()
            current = self._status.get(name)
            if current is None or current.phase is not PodPhase.RUNNING:
                raise PodNotFoundError(f"pod {name} is not running")
            old = self._specs[name]
        new = dataclasses.replace(old, cpu=cpu, memory_mb=memory_mb)
        started = time.monotonic()
        try:
            self._call(f"resize pod {name}", self._patch_resize, name, resize_patch(new))
        except KubernetesApiError as exc:
            if exc.status not in _RESIZE_REFUSED:
                raise
            log.warning("kubernetes: pod %s not resized in place: %s", name, exc)
            return ResizeOutcome(in_place=False, reason=str(exc), seconds=_since(started))
        refused = self._await_resize(name, new, started + timeout_s)
        if refused is None:
            with self._lock:
                self._specs[name] = new
            log.info(
                "kubernetes: pod %s resized in place to cpu %g, memory %d MiB in %.2fs",
                name,
                cpu,
                memory_mb,
                _since(started),
            )
            return ResizeOutcome(in_place=True, seconds=_since(started))
        if refused == "timeout":
            refused = f"not applied within {timeout_s:g} s"
        self._withdraw_resize(name, old)
        log.warning("kubernetes: pod %s not resized in place: %s", name, refused)
        return ResizeOutcome(in_place=False, reason=refused, seconds=_since(started))

    def statuses(self) -> list[PodStatus]:
        with self._lock:
            return [self._status[name] for name in self._order]

    def usage(self) -> list[PodUsage]:
        with self._lock:
            running = {
                name: self._specs[name]
                for name in self._order
                if self._status[name].phase is PodPhase.RUNNING
            }
        if not running:
            return []
        try:
            listed = self._call(
                "list pod metrics",
                self._custom.list_namespaced_custom_object,
                "metrics.k8s.io",
                "v1beta1",
                self.namespace,
                "pods",
                label_selector=self._selector,
            )
        except KubernetesApiError as exc:
            if exc.status not in (403, 404, 503):
                raise
            if not self._metrics_missing_logged:
                self._metrics_missing_logged = True
                log.warning(
                    "kubernetes: no pod metrics (%s): the profile will have no CPU and memory "
                    "use per pod; install metrics-server for them",
                    exc,
                )
            return []
        out = []
        for item in listed.get("items", []):
            name = item.get("metadata", {}).get("name")
            spec = running.get(name)
            if spec is None:
                continue
            containers = item.get("containers") or []
            cpu = sum(quantity_cores(c.get("usage", {}).get("cpu", "0")) for c in containers)
            mem = sum(quantity_mebibytes(c.get("usage", {}).get("memory", "0")) for c in containers)
            out.append(
                PodUsage(
                    name=name,
                    role=spec.role,
                    index=spec.index,
                    cpu_cores=cpu,
                    memory_mb=mem,
                    cpu_requested=spec.cpu,
                    memory_requested_mb=spec.memory_mb,
                )
            )
        return out

    def owner_cancel_reason(self) -> str | None:
        """Why a user cancelled this master, read from its own pod's annotation
        (:data:`~dlrover_kfp.runtime.cancel.CANCEL_ANNOTATION`, set by the canceller before it
        deletes the pod); None for a master outside the cluster, or when the stop was not a
        cancel (a drain, an eviction) or the pod cannot be read."""
        owner = self.settings.owner
        if owner is None:
            return None
        try:
            found = self._read_pod(owner.name, deadline_s=5.0)
        except (KubernetesApiError, TransientError) as exc:
            log.warning("cannot read the master's pod %s for a cancel: %s", owner.name, exc)
            return None
        if found is None:
            return None
        annotations = json.loads(found.data).get("metadata", {}).get("annotations") or {}
        reason = annotations.get(CANCEL_ANNOTATION)
        return str(reason) if reason else None

    def emit_event(self, event: PodEvent) -> None:
        """Create a core/v1 Event on the pod (:func:`.k8s_objects.render_event`); one about the
        job as a whole goes on the master's own pod, and is only logged for a master outside
        the cluster (it has no pod). Retried for :data:`EVENT_RETRY_S` at most; a refusal (a
        Role without ``events`` ``create``), a closed backend or a lost Lease drops it with a
        log line."""
        with self._lock:
            dropped = "closed" if self._closed else self._lease_lost
            uid = self._uids.get(event.pod, "") if event.pod else ""
        subject = self.settings.owner if event.pod is None else OwnerRef(name=event.pod, uid=uid)
        if dropped is not None or subject is None:
            why = dropped or "no master pod to put a job's event on"
            log.debug("kubernetes: event %s not created (%s): %s", event.reason, why, event)
            return
        body = render_event(
            event,
            subject,
            self.namespace,
            instance=self.holder,
            now=time.time(),
            labels=self._labels,
        )
        try:
            self._call(
                f"create event {event.reason} on {subject.name}",
                self._core.create_namespaced_event,
                self.namespace,
                body,
                deadline_s=EVENT_RETRY_S,
            )
        except BackendError as exc:
            log.warning("kubernetes: event not created, the run goes on: %s", exc)

    def close(self) -> None:
        """Deletes the run's pods (running ones with a short grace) and its Secret, then stops
        the watch. Statuses stay readable."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            lost = self._lease_lost
            names = [] if lost else list(self._order)
        if lost:
            # The pods and Secret of these names may be the new master's now: left to it.
            log.warning(
                "kubernetes: this master lost the lease of job %s (%s): its pods and secret "
                "are left to the master that holds it",
                self._job,
                lost,
            )
        errors: list[BaseException] = []
        for name in names:
            try:
                self.delete(name, grace_s=2.0)
                self._remove_object(name, wait=False)
            except BackendError as exc:
                errors.append(exc)
        if self._secret_created and not lost:
            try:
                self._call(
                    f"delete secret {self._secret}",
                    self._core.delete_namespaced_secret,
                    self._secret,
                    self.namespace,
                    ok_missing=True,
                )
            except BackendError as exc:
                errors.append(exc)
        self._stop.set()
        with self._lock:
            response = self._response
        if response is not None:
            with contextlib.suppress(Exception):  # ends the blocked read; any error is moot
                response.shutdown()
        self._watcher.join(timeout=5.0)
        # Last: a successor may start only once this master's pods are gone.
        self._release_lease()
        if errors:
            log.warning("kubernetes: close left %d object(s) behind: %s", len(errors), errors[0])

    # -- the job's Lease -----------------------------------------------------------------------

    def _check_lease(self) -> None:
        """Under ``self._lock``: refuse to act on the job's objects without its Lease."""
        if self._lease_lost is not None:
            raise LeaseLostError(
                f"kubernetes: job {self._job}: this master lost its lease {self._lease} "
                f"({self._lease_lost}): stopping, the job's pods are another master's"
            )

    def _read_lease(self, what: str, **retry: Any) -> LeaseRecord | None:
        response = self._call(
            f"{what} lease {self._lease}",
            self._coordination.read_namespaced_lease,
            self._lease,
            self.namespace,
            ok_missing=True,
            _preload_content=False,
            **retry,
        )
        return None if response is None else lease_record(json.loads(response.data))

    def _write_lease(
        self,
        now: float,
        *,
        acquired_at: float,
        transitions: int,
        version: str | None,
        deadline_s: float | None = None,
    ) -> str | None:
        """Create the Lease (``version`` None) or replace the one read at ``version``, held
        by this master as of ``now``; its new resourceVersion, None on 409 (it exists, or
        someone wrote it since ``version``)."""
        body = render_lease(
            self._lease,
            self.namespace,
            holder=self._holder.identity,
            duration_s=self.settings.lease_duration_s,
            now=now,
            acquired_at=acquired_at,
            labels=self._labels,
            owner=self.settings.owner,
            transitions=transitions,
            resource_version=version,
        )
        if version is None:
            response = self._call(
                f"create lease {self._lease}",
                self._coordination.create_namespaced_lease,
                self.namespace,
                body,
                ok_conflict=True,
                _preload_content=False,
            )
        else:
            response = self._call(
                f"update lease {self._lease}",
                self._coordination.replace_namespaced_lease,
                self._lease,
                self.namespace,
                body,
                ok_conflict=True,
                _preload_content=False,
                deadline_s=deadline_s,
            )
        if response is None:
            return None
        return lease_record(json.loads(response.data)).resource_version

    def _acquire_lease(self) -> None:
        try:
            self._try_acquire_lease()
        except KubernetesApiError as exc:
            if exc.status != 403:
                raise
            raise KubernetesApiError(
                f"{exc} (the master needs get, create, update and delete on leases in API "
                "group coordination.k8s.io: re-apply deploy/rbac.yaml)",
                exc.status,
            ) from None

    def _try_acquire_lease(self) -> None:
        """Create the job's Lease, or take over one whose holder is gone; else
        :class:`JobHeldError`. A takeover is an update at the version read, so that of two
        masters taking over at once one gets 409 and reads the other's Lease."""
        for _ in range(3):  # a Lease released or taken over between our calls: look again
            now = time.time()
            version = self._write_lease(now, acquired_at=now, transitions=0, version=None)
            if version is not None:
                log.info(
                    "kubernetes: job %s: lease %s acquired by %s",
                    self._job,
                    self._lease,
                    self._holder.identity,
                )
                return
            current = self._read_lease("read")
            if current is None:
                continue  # released in between
            now = time.time()
            if current.held(now) and not gone_locally(current.holder, self._holder):
                raise JobHeldError(self._held_message(current, now))
            version = self._write_lease(
                now,
                acquired_at=now,
                transitions=current.transitions + 1,
                version=current.resource_version,
            )
            if version is not None:
                log.warning(
                    "kubernetes: job %s: took over lease %s from %s (%s)",
                    self._job,
                    self._lease,
                    current.holder or "nobody",
                    "its process is gone" if current.held(now) else "expired",
                )
                return
        raise JobHeldError(
            f"kubernetes: job {self._job} in namespace {self.namespace}: another master keeps "
            f"taking lease {self._lease}; stop it first"
        )

    def _held_message(self, current: LeaseRecord, now: float) -> str:
        renewed = current.renewed_at if current.renewed_at is not None else current.acquired_at
        when = (
            f"renewed {now - renewed:.0f}s ago, at {micro_time(renewed)}"
            if renewed is not None
            else "never renewed"
        )
        return (
            f"kubernetes: job {self._job} already has a live master in namespace "
            f"{self.namespace}: lease {self._lease} is held by {current.holder} ({when}; it "
            f"runs out in {max(0.0, current.expires_at - now):.0f}s unless renewed); stop that "
            "master, or wait for its lease to run out"
        )

    def _renew_loop(self) -> None:
        """Renew every ``lease_renew_s`` until closed or the Lease is lost. A failed renewal
        is logged and tried again at the next tick: the Lease lasts three ticks."""
        while not self._lease_stop.wait(self.settings.lease_renew_s):
            try:
                self._renew()
            except LeaseLostError as exc:
                with self._lock:
                    self._lease_lost = str(exc)
                log.error("kubernetes: job %s: lease %s lost: %s", self._job, self._lease, exc)
                return
            except Exception as exc:  # the renewals must outlive any surprise, as the watch
                log.warning(
                    "kubernetes: job %s: could not renew lease %s (%s); again in %gs",
                    self._job,
                    self._lease,
                    exc,
                    self.settings.lease_renew_s,
                )

    def _renew(self) -> None:
        """Read the Lease, check it is still this master's, write a new renewTime at the
        version read. LeaseLostError when another holder has it or it is gone."""
        deadline = {"deadline_s": self.settings.lease_renew_s}
        for _ in range(2):  # a 409: someone wrote it since it was read; read it again
            current = self._read_lease("renew", **deadline)
            if current is None:
                raise LeaseLostError("it was deleted")
            if current.holder != self._holder.identity:
                raise LeaseLostError(f"it is held by {current.holder or 'nobody'} now")
            version = self._write_lease(
                time.time(),
                acquired_at=current.acquired_at or time.time(),
                transitions=current.transitions,
                version=current.resource_version,
                **deadline,
            )
            if version is not None:
                return
        raise KubernetesUnavailableError("the lease kept changing under its renewal")

    def _release_lease(self) -> None:
        """Stop renewing and delete the Lease if it is still this master's (a precondition on
        the version read, so that a successor's Lease is never deleted)."""
        self._lease_stop.set()
        if self._renewer is not threading.current_thread():
            self._renewer.join(timeout=self.settings.request_timeout_s)
        if self.lease_lost is not None:
            return
        try:
            current = self._read_lease("release")
            if current is None or current.holder != self._holder.identity:
                return
            self._call(
                f"delete lease {self._lease}",
                self._coordination.delete_namespaced_lease,
                self._lease,
                self.namespace,
                body=k8s.V1DeleteOptions(
                    preconditions=k8s.V1Preconditions(resource_version=current.resource_version)
                ),
                ok_missing=True,
                ok_conflict=True,
            )
        except BackendError as exc:  # it runs out by itself within its term
            log.warning(
                "kubernetes: job %s: lease %s not released (%s): it expires within %ds",
                self._job,
                self._lease,
                exc,
                self.settings.lease_duration_s,
            )

    # -- calls ---------------------------------------------------------------------------------

    def _call(
        self,
        what: str,
        fn: Callable[..., T],
        *args: Any,
        ok_missing: bool = False,
        ok_conflict: bool = False,
        deadline_s: float | None = None,
        **kwargs: Any,
    ) -> T | Any:
        """``fn(*args, **kwargs)`` with the retry policy; the one place that retries.

        ``ok_missing``: a 404 is success (None); ``ok_conflict``: a 409 is success (None);
        ``deadline_s``: retry for at most that long instead of the policy's deadline (the
        Lease's renewal gives up at its next tick, which tries again).
        """
        policy = self.settings.retry
        if deadline_s is not None:
            policy = dataclasses.replace(policy, deadline_s=deadline_s)
        started = time.monotonic()
        wait = policy.initial_s
        attempt = 0
        timeout = self.settings.request_timeout_s
        while True:
            attempt += 1
            try:
                return fn(*args, _request_timeout=timeout, **kwargs)
            except ApiException as exc:
                if exc.status == 404 and ok_missing:
                    return None
                if exc.status == 409 and ok_conflict:
                    return None
                if exc.status not in _RETRYABLE:
                    raise KubernetesApiError(
                        f"kubernetes: {what} in namespace {self.namespace}: {_api_message(exc)}",
                        exc.status or 0,
                    ) from None
                delay = _retry_after(exc) if exc.status == 429 else None
                problem = _api_message(exc)
            except _CONNECTION_ERRORS as exc:
                delay = None
                problem = f"{type(exc).__name__}: {exc}"
            delay = min(policy.max_s, wait) if delay is None else delay
            if time.monotonic() - started + delay > policy.deadline_s:
                raise KubernetesUnavailableError(
                    f"kubernetes: {what}: still failing after {attempt} attempts in "
                    f"{time.monotonic() - started:.0f}s ({problem})"
                )
            log.warning("kubernetes: %s: %s; retry %d in %.1fs", what, problem, attempt, delay)
            self._sleep(delay)
            wait = min(policy.max_s, wait * 2)

    def _patch_resize(self, name: str, body: Mapping[str, Any], **kwargs: Any) -> Any:
        """PATCH ``pods/NAME/resize`` (strategic merge). kubernetes==30.1.0 has no
        ``patch_namespaced_pod_resize``; this is the request it would make."""
        return self._api.call_api(
            "/api/v1/namespaces/{namespace}/pods/{name}/resize",
            "PATCH",
            {"namespace": self.namespace, "name": name},
            [],
            {
                "Accept": "application/json",
                "Content-Type": "application/strategic-merge-patch+json",
            },
            body=dict(body),
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _preload_content=False,
            **kwargs,
        )

    def _await_resize(self, name: str, new: PodSpec, deadline: float) -> str | None:
        """Read the pod until its resize is applied (None) or refused (why); ``"timeout"``
        once ``deadline`` passes with the kubelet still waiting (``Deferred``) or silent."""
        while True:
            found = self._read_pod(name)
            if found is None:
                return "the pod is gone"
            progress = resize_progress(json.loads(found.data), new)
            if progress.state == "applied":
                return None
            if progress.state != "waiting":
                return progress.message
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            self._sleep(min(_RESIZE_POLL_S, left))

    def _withdraw_resize(self, name: str, old: PodSpec) -> None:
        """Ask for the pod's old resources again, so that a refused or late resize does not
        change it after the caller has moved on (an ``Infeasible`` one stays pending for ever
        otherwise). Best effort: the pod may be gone."""
        try:
            self._call(
                f"withdraw resize of pod {name}",
                self._patch_resize,
                name,
                resize_patch(old),
                ok_missing=True,
            )
        except BackendError as exc:
            log.warning("kubernetes: pod %s: resize not withdrawn: %s", name, exc)

    def _ensure_secret(self, env: Mapping[str, str]) -> dict[str, str]:
        """The Secret keys of ``env``'s values, writing the Secret (or new keys) as needed."""
        with self._lock:
            known = dict(self._keys)
            keys, new = secret_keys(env, known)
            if not new:
                return keys
            data = {**self._secret_data, **new}
        body = render_secret(self._secret, self.namespace, data, self._labels, self.settings.owner)
        created = None
        if not self._secret_created:
            created = self._call(
                f"create secret {self._secret}",
                self._core.create_namespaced_secret,
                self.namespace,
                body,
                ok_conflict=True,
            )
        if created is None:  # written before by this backend, or left by an earlier master
            self._call(
                f"update secret {self._secret}",
                self._core.replace_namespaced_secret,
                self._secret,
                self.namespace,
                body,
            )
        with self._lock:
            self._keys = known
            self._secret_data = data
            self._secret_created = True
        return keys

    def _disown(self, name: str, pod: PodSpec) -> None:
        """The object named ``name`` is an earlier master's (its uid never seen here): its
        events, its deletion above all, must not become the new pod's status."""
        found = self._read_pod(name)
        if found is None:
            return
        uid = str(json.loads(found.data).get("metadata", {}).get("uid", ""))
        with self._lock:
            self._stale.add(uid)
            if self._uids.get(name) == uid:  # the watch saw it first
                del self._uids[name]
                self._status[name] = PodStatus(
                    name=name, role=pod.role, index=pod.index, phase=PodPhase.PENDING
                )

    def _read_pod(self, name: str, deadline_s: float | None = None) -> Any:
        """The pod object ``name`` as the raw response (None: there is none); retried for at
        most ``deadline_s`` when given, else by the policy."""
        return self._call(
            f"get pod {name}",
            self._core.read_namespaced_pod,
            name,
            self.namespace,
            ok_missing=True,
            deadline_s=deadline_s,
            _preload_content=False,
        )

    def _remove_object(self, name: str, *, wait: bool = True) -> None:
        """Delete a pod object at once (grace 0) and, with ``wait``, until it is gone, so that
        its name is free for a relaunch."""
        self._call(
            f"remove pod {name}",
            self._core.delete_namespaced_pod,
            name,
            self.namespace,
            grace_period_seconds=0,
            ok_missing=True,
        )
        if not wait:
            return
        deadline = time.monotonic() + self.settings.delete_slack_s
        while True:
            found = self._read_pod(name)
            if found is None:
                return
            if time.monotonic() > deadline:
                raise KubernetesUnavailableError(f"pod {name} was not removed in time")
            self._sleep(0.1)

    # -- the watch -----------------------------------------------------------------------------

    def _watch(self) -> None:
        """List, then watch from the list's resourceVersion; relist on 410 Gone."""
        version: str | None = None
        backoff = self.settings.retry.initial_s
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self._relist()
                version = self._watch_once(version)
                backoff = self.settings.retry.initial_s
            except ApiException as exc:
                if self._stop.is_set():
                    break
                if exc.status == 410:
                    log.warning("kubernetes: pod watch expired (410 Gone): relisting")
                    version = None
                    continue
                log.warning(
                    "kubernetes: pod watch failed (%s); again in %.1fs",
                    _api_message(exc),
                    backoff,
                )
                self._stop.wait(backoff)
                backoff = min(self.settings.retry.max_s, backoff * 2)
            except _WATCH_ERRORS as exc:
                if self._stop.is_set():
                    break
                log.warning("kubernetes: pod watch dropped (%s); again in %.1fs", exc, backoff)
                self._stop.wait(backoff)
                backoff = min(self.settings.retry.max_s, backoff * 2)
            except KubernetesUnavailableError as exc:
                log.warning("kubernetes: %s", exc)
            except Exception:  # the watch must outlive any surprise; the job master relies on it
                if self._stop.is_set():
                    break
                log.exception("kubernetes: pod watch error; relisting")
                version = None
                self._stop.wait(backoff)

    def _watch_once(self, version: str) -> str:
        """One watch request, read to its end (the server ends it after ``watch_timeout_s``);
        returns the resourceVersion to go on from. The raw response is kept so that
        :meth:`close` can end a read that would otherwise block until the next event."""
        response = self._core.list_namespaced_pod(
            self.namespace,
            label_selector=self._selector,
            resource_version=version,
            watch=True,
            timeout_seconds=self.settings.watch_timeout_s,
            allow_watch_bookmarks=True,
            _preload_content=False,
            _request_timeout=(self.settings.request_timeout_s, self.settings.watch_timeout_s + 15),
        )
        with self._lock:
            self._response = response
        if self._stop.is_set():
            # close() ran while this request was being sent: it could not end this read, so
            # the join would wait its whole timeout (5 s) for the server's next event.
            with contextlib.suppress(Exception):
                response.shutdown()
        try:
            for line in k8s_watch.watch.iter_resp_lines(response):
                if self._stop.is_set():
                    break
                event = json.loads(line)
                obj = event.get("object") or {}
                kind = event.get("type")
                if kind == "ERROR":
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                version = obj.get("metadata", {}).get("resourceVersion") or version
                if kind in ("ADDED", "MODIFIED"):
                    self._seen(obj)
                elif kind == "DELETED":
                    self._seen(obj, gone=True)
        finally:
            with self._lock:
                self._response = None
            response.release_conn()
        return version

    def _mark_gone(self, name: str) -> None:
        """A pod of ours whose object is gone without the watch having shown its end."""
        with self._lock:
            st = self._status[name]
            if st.phase.terminal:
                return
            self._status[name] = dataclasses.replace(
                st, phase=PodPhase.FAILED, reason=PodReason.DELETED.value, finished_at=time.time()
            )
            self._lock.notify_all()

    def _relist(self) -> str:
        """Replace the cache with a fresh list; pods of ours missing from it were deleted."""
        sent = time.monotonic()
        response = self._call(
            "list pods",
            self._core.list_namespaced_pod,
            self.namespace,
            label_selector=self._selector,
            _preload_content=False,
        )
        listed = json.loads(response.data)
        present = set()
        for obj in listed.get("items", []):
            present.add(obj["metadata"]["name"])
            self._seen(obj)
        with self._lock:
            missing = [
                name
                for name in self._order
                if name not in present and self._created_at.get(name, math.inf) < sent
            ]
        for name in missing:
            self._mark_gone(name)
        self._synced.set()
        return str(listed.get("metadata", {}).get("resourceVersion", ""))

    def _seen(self, obj: Mapping[str, Any], *, gone: bool = False) -> None:
        name = obj.get("metadata", {}).get("name")
        with self._lock:
            if name not in self._status:
                return  # not launched by this backend (or an older object of that name)
            uid = str(obj.get("metadata", {}).get("uid", ""))
            if uid in self._stale:
                return
            self._uids[name] = uid
            known = self._status[name]
            if known.phase.terminal and gone:
                return  # the end was already recorded; removal changes nothing
            new = pod_status(obj, gone=gone, deleted_by_us=name in self._deleted and gone)
            if name in self._deleted and new.phase.terminal:
                new = pod_status(obj, gone=True, deleted_by_us=True)
            if new.finished_at is None and new.phase.terminal:
                new = dataclasses.replace(new, finished_at=time.time())
            if known.phase.terminal and not new.phase.terminal:
                return  # phases only go forward; an older object's late event
            self._status[name] = new
            self._lock.notify_all()


__all__ = [
    "JobHeldError",
    "KubernetesApiError",
    "KubernetesBackend",
    "KubernetesUnavailableError",
    "LeaseLostError",
    "load_client",
    "local_holder",
]
