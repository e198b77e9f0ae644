"""Kubernetes objects as plain dicts: what the Kubernetes backend creates, and what it reads back.

Pure functions, no I/O and no ``kubernetes`` import, so that ``--dry-run`` and the tests render
exactly what a run would send, and the status rules are tested as functions:

* :func:`render_pod` / :func:`render_secret`: the manifests (wire format, camelCase), requests
  equal to limits, ``restartPolicy: Never``, the job's env values only as ``secretKeyRef``\\ s;
* :func:`render_lease` / :func:`lease_record` / :class:`Holder`: the job's one-master Lease
  (``coordination.k8s.io/v1``) and who holds it, with MicroTimes in the exact wire format;
* :func:`resize_patch` / :func:`resize_progress`: an in-place resize through the pod's
  ``resize`` subresource (Kubernetes 1.33+), and how far the kubelet got with it;
* :func:`pod_status`: a pod object as the API server returns it -> :class:`PodStatus`, reading
  OOMKilled and exit codes from the container's ``state`` / ``lastState``, eviction, preemption
  and node loss from ``status.reason`` and the ``DisruptionTarget`` condition, and why a pod
  waits unplaced from the scheduler's ``PodScheduled`` condition;
* :class:`KubernetesSettings`: where and how the pods run, read once at the edge;
* Kubernetes quantities (``250m``, ``1.5``, ``2Gi``, ``123456Ki``, ``1e3``) as metrics.k8s.io
  and the API server write them are read by the core's one parser
  (:mod:`dlrover_kfp.core.quantity`), which specs share.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dlrover_kfp.backends.api import last_error_line
from dlrover_kfp.core.profile import Role
from dlrover_kfp.core.quantity import quantity_cores, quantity_mebibytes
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.ports import PodEvent, PodPhase, PodReason, PodSpec, PodStatus

#: Labels every object of a job carries (with ``job``: :func:`job_labels`).
MANAGED_BY = {"app.kubernetes.io/managed-by": "dlrover-kfp"}

#: Where a PS's flash-checkpoint buffer lives: POSIX shared memory, i.e. ``/dev/shm``, which a
#: pod gets as an ``emptyDir`` in memory. Its pages count against the pod's memory limit (the
#: plan's PS memory includes the snapshot buffer for that reason).
SHM_PATH = "/dev/shm"
#: The annotation a user's canceller sets on a job master's pod before deleting it, the reason
#: as its value: the master then ends the run as cancelled (dlrover_kfp/runtime/cancel.py).
CANCEL_ANNOTATION = "dlrover-kfp.io/cancel"

#: The ``DisruptionTarget`` condition's reasons (Kubernetes 1.26+) -> why the pod stopped.
_DISRUPTIONS = {
    "EvictionByEvictionAPI": PodReason.EVICTED,
    "TerminationByKubelet": PodReason.EVICTED,
    "PreemptionByScheduler": PodReason.PREEMPTED,
    "PreemptionByKubeScheduler": PodReason.PREEMPTED,
    "DeletionByTaintManager": PodReason.NODE_LOST,
    "DeletionByPodGC": PodReason.NODE_LOST,
}
#: ``status.reason`` of a pod stopped by its node rather than by its container.
_POD_REASONS = {
    "Evicted": PodReason.EVICTED,
    "Preempting": PodReason.PREEMPTED,
    "NodeLost": PodReason.NODE_LOST,
    "Shutdown": PodReason.EVICTED,
    "NodeShutdown": PodReason.EVICTED,
    "Terminated": PodReason.EVICTED,
}
#: A container's terminated reasons that mean it never ran.
_START_ERRORS = frozenset({"StartError", "ContainerCannotRun", "CreateContainerError"})

_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


@dataclass(frozen=True, slots=True)
class OwnerRef:
    """The object whose deletion deletes the job's pods and Secret (the master's own pod when
    it runs in the cluster): Kubernetes' garbage collector then cleans up after a master that
    is deleted, even one killed before it could."""

    name: str
    uid: str
    kind: str = "Pod"
    api_version: str = "v1"

    def manifest(self) -> dict[str, Any]:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
        }


@dataclass(frozen=True, slots=True)
class Volume:
    """A PersistentVolumeClaim mounted at the same path in every pod (and in the master): the
    run's checkpoints and profile are written under it."""

    claim: str
    mount_path: str


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Backoff for transient API failures: ``initial_s`` doubling to ``max_s``, until
    ``deadline_s`` has passed since the first attempt."""

    initial_s: float = 0.2
    max_s: float = 5.0
    deadline_s: float = 120.0


#: A job master's Lease term (``leaseDurationSeconds``): how long a master killed without the
#: chance to release it (SIGKILL, its node lost) blocks a successor at most. Its holder renews
#: it every :data:`LEASE_RENEW_S`, a third of the term, so that two renewals in a row may fail
#: (an API blip, a throttle) before it runs out; client-go's leader election keeps a similar
#: margin (15 s lease, 10 s renew deadline). 30 s is short next to a KFP or Airflow retry's
#: back-off (minutes) and long next to the API's own latency (milliseconds).
LEASE_DURATION_S = 30
LEASE_RENEW_S = LEASE_DURATION_S / 3


@dataclass(frozen=True, slots=True)
class KubernetesSettings:
    """Where and how the job's pods run. Read once at the edge (the CLI, a component)."""

    namespace: str
    image: str
    image_pull_policy: str = "IfNotPresent"
    #: the run's volume (PVC and the path it is mounted at in every pod), if any
    volume: Volume | None = None
    #: the object that owns the job's pods (the master's pod); None outside the cluster
    owner: OwnerRef | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    #: seconds one API call may take (connect and read)
    request_timeout_s: float = 30.0
    #: seconds a watch runs before it is renewed (the server ends it then)
    watch_timeout_s: int = 60
    #: extra seconds :meth:`KubernetesBackend.delete` waits past the grace period
    delete_slack_s: float = 30.0
    #: the job master's Lease term and how often its holder renews it (whole seconds, as the
    #: API takes the term)
    lease_duration_s: int = LEASE_DURATION_S
    lease_renew_s: float = LEASE_RENEW_S

    def __post_init__(self) -> None:
        if not self.namespace:
            raise UserInputError("kubernetes: --namespace is required")
        if not self.image:
            raise UserInputError("kubernetes: --image is required")
        if not 0 < self.lease_renew_s < self.lease_duration_s:
            raise UserInputError(
                f"kubernetes: lease renewal every {self.lease_renew_s:g}s must be shorter than "
                f"the lease term ({self.lease_duration_s}s)"
            )


def owner_from_env(env: Mapping[str, str]) -> OwnerRef | None:
    """The master's own pod, from the downward API variables deploy/master-pod.yaml sets."""
    name, uid = env.get("POD_NAME"), env.get("POD_UID")
    return OwnerRef(name=name, uid=uid) if name and uid else None


def label_value(text: str) -> str:
    """``text`` as a valid label value: at most 63 characters of ``[A-Za-z0-9-_.]``, starting
    and ending alphanumeric; a value that had to change gets a hash suffix so that two
    different texts stay different."""
    if len(text) <= 63 and _LABEL_VALUE.fullmatch(text):
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:54].strip("-_.")
    return f"{cleaned}-{digest}" if cleaned else digest


def dns_name(text: str, max_length: int = 253) -> str:
    """``text`` as a DNS-1123 name (lower case, ``[a-z0-9-]``), for object names built from a
    run id; a changed text gets a hash suffix, as in :func:`label_value`."""
    lowered = re.sub(r"[^a-z0-9-]", "-", text.lower()).strip("-")
    if lowered == text and len(text) <= max_length:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{lowered[: max_length - 9].strip('-')}-{digest}" if lowered else digest


def secret_name(job: str) -> str:
    """The Secret that holds a job's env values (one per job, as its pod names are)."""
    return f"{dns_name(job, 240)}-env"


def job_labels(job: str) -> dict[str, str]:
    """The labels that scope a job's objects (its pods add ``role``, ``index`` and ``run``)."""
    return {**MANAGED_BY, "job": label_value(job)}


def selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def cpu_quantity(cores: float) -> str:
    """Cores as millicores, the unit the scheduler works in (0.25 -> ``250m``)."""
    return f"{max(1, round(cores * 1000))}m"


def memory_quantity(mb: int) -> str:
    return f"{mb}Mi"


def pod_resources(spec: PodSpec) -> dict[str, Any]:
    """A container's ``resources``: requests equal to limits, the Guaranteed class, so that
    the planner's CPU is the pod's and a busy node evicts this pod last. An in-place resize
    sends the same (Kubernetes refuses a resize that would change the QoS class)."""
    amounts = {"cpu": cpu_quantity(spec.cpu), "memory": memory_quantity(spec.memory_mb)}
    return {"requests": dict(amounts), "limits": dict(amounts)}


#: Both resources resize without a restart (Kubernetes' default, spelled out: 1.33 forbids a
#: memory decrease under it, 1.34+ allows one, the kubelet refusing it below current usage).
#: The policy cannot be changed on a running pod, so it is set at launch.
RESIZE_POLICY = (
    {"resourceName": "cpu", "restartPolicy": "NotRequired"},
    {"resourceName": "memory", "restartPolicy": "NotRequired"},
)


def env_key(name: str, version: int = 0) -> str:
    """The Secret key that holds env variable ``name``'s ``version``-th distinct value (pods
    whose values differ each find their own; keys say nothing about the values)."""
    return f"{name.lower().replace('_', '-')}-{version}"


def secret_keys(
    env: Mapping[str, str], known: dict[tuple[str, str], str]
) -> tuple[dict[str, str], dict[str, str]]:
    """Keys of ``env``'s values in a job's Secret: (env name -> key, new key -> value).
    ``known`` maps (name, value) to keys already written, and gains the new ones."""
    keys: dict[str, str] = {}
    new: dict[str, str] = {}
    for name, value in env.items():
        key = known.get((name, value))
        if key is None:
            version = sum(1 for n, _ in known if n == name)
            key = known[(name, value)] = env_key(name, version)
            new[key] = value
        keys[name] = key
    return keys, new


def render_secret(
    name: str,
    namespace: str,
    data: Mapping[str, str],
    labels: Mapping[str, str],
    owner: OwnerRef | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(name, namespace, labels, owner),
        "type": "Opaque",
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in sorted(data.items())},
    }


def lease_name(job: str) -> str:
    """The Lease that says which master runs a job (one per job, as its pod names are)."""
    return f"{dns_name(job, 240)}-master"


def micro_time(t: float) -> str:
    """Seconds since the epoch as a ``metav1.MicroTime``: RFC 3339 in UTC with exactly six
    fraction digits, the only form the API server decodes (Go's ``RFC3339Micro``). The
    official client's own rendering of a ``datetime`` drops the fraction when it is zero,
    which the server refuses, hence a string here."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a job's Lease: one master, in one process on one host.

    ``host`` is the master's pod name (or its machine's name), ``boot`` the machine's boot id
    (so that two machines with one name, or one machine before and after a reboot, differ),
    ``process`` a random token of the process and ``serial`` which backend of it: two masters
    never share an identity, and a master on this same machine whose process is gone can be
    told from one that still runs (:meth:`identity` is ``holderIdentity``)."""

    host: str
    pid: int
    boot: str
    process: str
    serial: int = 0

    @property
    def identity(self) -> str:
        return f"{self.host}:{self.pid}:{self.boot}:{self.process}-{self.serial}"

    @staticmethod
    def parse(identity: str) -> Holder | None:
        """The holder an identity of :attr:`identity`'s form names; None for any other form
        (a lease written by someone else: nothing is assumed about it)."""
        parts = identity.split(":")
        if len(parts) != 4 or not parts[1].isdigit():
            return None
        process, _, serial = parts[3].rpartition("-")
        if not process or not serial.isdigit():
            return None
        return Holder(parts[0], int(parts[1]), parts[2], process, int(serial))


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """A Lease as read back: its holder ("" once released) and when it runs out."""

    holder: str
    duration_s: int
    renewed_at: float | None
    acquired_at: float | None
    transitions: int
    resource_version: str

    @property
    def expires_at(self) -> float:
        """When a successor may take it: the holder's last renewal plus the term (by the
        holder's clock: masters whose clocks differ by more than a few seconds shift this)."""
        last = self.renewed_at if self.renewed_at is not None else self.acquired_at
        return (last or 0.0) + self.duration_s

    def held(self, now: float) -> bool:
        return bool(self.holder) and now < self.expires_at


def lease_record(lease: Mapping[str, Any]) -> LeaseRecord:
    spec = lease.get("spec") or {}
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        duration_s=int(spec.get("leaseDurationSeconds") or 0),
        renewed_at=timestamp(spec.get("renewTime")),
        acquired_at=timestamp(spec.get("acquireTime")),
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=str((lease.get("metadata") or {}).get("resourceVersion") or ""),
    )


def render_lease(
    name: str,
    namespace: str,
    *,
    holder: str,
    duration_s: int,
    now: float,
    acquired_at: float,
    labels: Mapping[str, str],
    owner: OwnerRef | None = None,
    transitions: int = 0,
    resource_version: str | None = None,
) -> dict[str, Any]:
    """The job's Lease held by ``holder``, renewed ``now``. With ``resource_version`` it is
    an update that succeeds only if nobody wrote the Lease since that version was read (a
    takeover or a renewal racing another master's fails with 409 Conflict). Owned by the
    master's pod when it runs in one, so that deleting that pod frees the job at once."""
    meta = _metadata(name, namespace, labels, owner)
    if resource_version is not None:
        meta["resourceVersion"] = resource_version
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": meta,
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration_s,
            "acquireTime": micro_time(acquired_at),
            "renewTime": micro_time(now),
            "leaseTransitions": transitions,
        },
    }


#: Who tells the job's Events: their ``source.component`` and ``reportingComponent``, what
#: ``kubectl get events`` shows under SOURCE.
EVENT_SOURCE = "dlrover-kfp-master"
#: The longest Event message sent (events.k8s.io's limit for an Event's note; client-go cuts
#: core/v1 messages to the same): a message, not a log.
MAX_EVENT_MESSAGE = 1024
#: The longest ``reportingInstance`` the API server accepts.
_MAX_REPORTING_INSTANCE = 128


def render_event(
    event: PodEvent,
    subject: OwnerRef,
    namespace: str,
    *,
    instance: str,
    now: float,
    labels: Mapping[str, str],
) -> dict[str, Any]:
    """A core/v1 Event about ``subject`` (the pod, or the master's own pod for the job as a
    whole) as the kubelet's own are written: named ``<object>.<nanoseconds in hex>`` as
    client-go names them, count 1, first and last seen ``now``, without ``eventTime`` (which
    would make it a new-style Event that needs an ``action``). ``kubectl describe pod`` finds
    it by the involved object's name, namespace and uid; the job's labels let ``kubectl get
    events -l`` select a job's Events. An empty uid (a pod not seen by the watch yet) is left
    out rather than sent wrong."""
    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    involved = {
        "apiVersion": subject.api_version,
        "kind": subject.kind,
        "name": subject.name,
        "namespace": namespace,
    } | ({"uid": subject.uid} if subject.uid else {})
    message = event.message
    if len(message) > MAX_EVENT_MESSAGE:
        message = message[: MAX_EVENT_MESSAGE - 3] + "..."
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": _metadata(f"{subject.name}.{int(now * 1e9):x}", namespace, labels, None),
        "involvedObject": involved,
        "reason": event.reason,
        "message": message,
        "type": "Warning" if event.warning else "Normal",
        "count": 1,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "source": {"component": EVENT_SOURCE},
        "reportingComponent": EVENT_SOURCE,
        "reportingInstance": instance[:_MAX_REPORTING_INSTANCE],
    }


def render_pod(
    spec: PodSpec,
    *,
    namespace: str,
    image: str,
    labels: Mapping[str, str],
    secret_name: str,
    secret_keys: Mapping[str, str],
    owner: OwnerRef | None = None,
    volume: Volume | None = None,
    image_pull_policy: str = "IfNotPresent",
) -> dict[str, Any]:
    """A pod for ``spec``. ``secret_keys`` maps each of ``spec.env``'s names to its key in the
    Secret ``secret_name``: no env value appears in the pod's manifest (anyone who may read
    pods may read a pod spec), only the reference. The resource variables the trainer sizes
    its threads by are plain values: they are the pod's limits, not secrets."""
    missing = set(spec.env) - set(secret_keys)
    if missing:
        raise ValueError(f"pod {spec.name}: no Secret key for env {sorted(missing)}")
    env: list[dict[str, Any]] = [
        {"name": k, "value": v} for k, v in sorted(spec.resource_env().items())
    ] + [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": secret_keys[k]}}}
        for k in sorted(spec.env)
    ]
    resources = pod_resources(spec)
    mounts: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    if spec.role == "ps":
        volumes.append(
            {
                "name": "shm",
                "emptyDir": {"medium": "Memory", "sizeLimit": resources["limits"]["memory"]},
            }
        )
        mounts.append({"name": "shm", "mountPath": SHM_PATH})
    if volume is not None:
        volumes.append({"name": "runs", "persistentVolumeClaim": {"claimName": volume.claim}})
        mounts.append({"name": "runs", "mountPath": volume.mount_path})
    container: dict[str, Any] = {
        "name": spec.role,
        "image": image,
        "imagePullPolicy": image_pull_policy,
        "command": list(spec.command),
        "env": env,
        "resources": resources,
        "resizePolicy": [dict(p) for p in RESIZE_POLICY],
        # The kubelet puts the tail of a failed container's log in its terminated state's
        # message: the job master reads the cause (an exception line) without the logs API.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if mounts:
        container["volumeMounts"] = mounts
    pod_labels = {
        **{k: label_value(v) for k, v in spec.labels.items()},
        **labels,
        "role": spec.role,
        "index": str(spec.index),
    }
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(spec.name, namespace, pod_labels, owner),
        "spec": {
            # A failed pod is relaunched by the job master under the same name, with new
            # resources if the planner says so; the kubelet restarting it in place would not.
            "restartPolicy": "Never",
            # Workers and PS never call the API: no token in their filesystem.
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [container],
        },
    }
    if volumes:
        body["spec"]["volumes"] = volumes
    return body


def redacted(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """A copy whose Secret values read ``***`` (for ``--dry-run`` and logs)."""
    out = copy.deepcopy(dict(manifest))
    for key in ("data", "stringData"):
        if isinstance(out.get(key), dict):
            out[key] = {k: "***" for k in out[key]}
    return out


def _metadata(
    name: str, namespace: str, labels: Mapping[str, str], owner: OwnerRef | None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels)}
    if owner is not None:
        meta["ownerReferences"] = [owner.manifest()]
    return meta


# -- reading back --------------------------------------------------------------------------


def timestamp(text: str | None) -> float | None:
    """An RFC 3339 time of the API (``2026-11-24T05:12:18Z``) as seconds since the epoch."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _disruption(status: Mapping[str, Any]) -> PodReason | None:
    cond = _condition(status, "DisruptionTarget")
    if cond is not None:
        return _DISRUPTIONS.get(str(cond.get("reason")), PodReason.EVICTED)
    return _POD_REASONS.get(str(status.get("reason")))


def _terminated(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The first container's terminated state: ``state``, else ``lastState`` (a container
    that was restarted in place keeps its last end there)."""
    for cs in status.get("containerStatuses") or ():
        for key in ("state", "lastState"):
            term = (cs.get(key) or {}).get("terminated")
            if term:
                return term  # type: ignore[no-any-return]
    return None


def _unschedulable(status: Mapping[str, Any]) -> str | None:
    """The scheduler's word on a pod that fits no node ("0/2 nodes are available: 2
    Insufficient cpu."): the ``PodScheduled`` condition, False with reason ``Unschedulable``.
    The scheduler writes it on the pod (its ``FailedScheduling`` event says the same, but
    reading events would need another watch and another right)."""
    cond = _condition(status, "PodScheduled", "False")
    if cond is None or cond.get("reason") != "Unschedulable":
        return None
    return str(cond.get("message") or "Unschedulable")


def resize_patch(spec: PodSpec) -> dict[str, Any]:
    """The strategic merge patch of the ``resize`` subresource that gives the pod ``spec``'s
    CPU and memory (its one container is named after its role, as :func:`render_pod` names
    it)."""
    return {"spec": {"containers": [{"name": spec.role, "resources": pod_resources(spec)}]}}


@dataclass(frozen=True, slots=True)
class ResizeProgress:
    """How far a pod's in-place resize got: ``applied`` (the running container has the new
    limits), ``refused`` (the kubelet will not apply them: ``PodResizePending`` ``Infeasible``,
    or ``PodResizeInProgress`` ``Error``, such as a memory limit below current usage), or
    ``ended`` (the pod stopped); else still ``waiting`` (not yet seen, ``Deferred``, in
    progress). ``message`` is the condition's own."""

    state: str
    message: str = ""


def _condition(
    status: Mapping[str, Any], kind: str, value: str = "True"
) -> Mapping[str, Any] | None:
    """The pod's condition of type ``kind`` when its status is ``value`` (a pod has at most
    one condition of each type)."""
    for cond in status.get("conditions") or ():
        if cond.get("type") == kind and cond.get("status") == value:
            return cond  # type: ignore[no-any-return]
    return None


def resize_progress(pod: Mapping[str, Any], spec: PodSpec) -> ResizeProgress:
    """Where the resize of ``pod`` (the object as read) to ``spec``'s resources stands.

    Applied means what the runtime reports for the running container
    (``status.containerStatuses[].resources.limits``) equals the request, with no resize
    condition left: the kubelet drops both conditions once it has actuated the change."""
    status = pod.get("status") or {}
    phase = str(status.get("phase"))
    if phase in ("Succeeded", "Failed") or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return ResizeProgress("ended", f"the pod is {phase.lower()} or being deleted")
    pending = _condition(status, "PodResizePending")
    busy = _condition(status, "PodResizeInProgress")
    for cond, refusal in ((pending, "Infeasible"), (busy, "Error")):
        if cond is not None and cond.get("reason") == refusal:
            return ResizeProgress("refused", f"{refusal}: {cond.get('message') or ''}".strip())
    if pending is not None:
        return ResizeProgress("waiting", f"{pending.get('reason')}: {pending.get('message')}")
    container: Mapping[str, Any] = next(
        (c for c in status.get("containerStatuses") or () if c.get("name") == spec.role), {}
    )
    limits = (container.get("resources") or {}).get("limits") or {}
    cpu, memory = limits.get("cpu"), limits.get("memory")
    applied = (
        busy is None
        and cpu is not None
        and memory is not None
        and quantity_cores(str(cpu)) == quantity_cores(cpu_quantity(spec.cpu))
        and quantity_mebibytes(str(memory)) == spec.memory_mb
    )
    return ResizeProgress("applied" if applied else "waiting")


def pod_status(
    pod: Mapping[str, Any], *, gone: bool = False, deleted_by_us: bool = False
) -> PodStatus:
    """What the job master sees of a pod object. ``gone``: the object was deleted (its last
    state is ``pod``); ``deleted_by_us``: the backend deleted it while it ran, so it ends
    ``FAILED``/``Deleted`` whatever its exit code (the port's rule for :meth:`delete`)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = pod.get("status") or {}
    role: Role = "ps" if labels.get("role") == "ps" else "worker"
    try:
        index = int(labels.get("index", 0))
    except ValueError:
        index = 0
    phase = {
        "Pending": PodPhase.PENDING,
        "Running": PodPhase.RUNNING,
        "Succeeded": PodPhase.SUCCEEDED,
        "Failed": PodPhase.FAILED,
    }.get(str(status.get("phase")), PodPhase.PENDING)
    term = _terminated(status)
    started = timestamp(status.get("startTime"))
    finished = timestamp(term.get("finishedAt")) if term else None
    exit_code = int(term["exitCode"]) if term and term.get("exitCode") is not None else None
    disruption = _disruption(status)
    # Deleted by someone (kubectl delete, a controller): its container's SIGTERM exit is not
    # its own failure.
    deleting = bool(meta.get("deletionTimestamp"))
    reason: str | None = None
    if disruption is not None and (phase.terminal or gone):
        phase, reason = PodPhase.FAILED, disruption.value
    elif deleting and phase is PodPhase.FAILED:
        reason = PodReason.DELETED.value
    elif phase.terminal:
        raw = str(term.get("reason")) if term else ""
        if phase is PodPhase.SUCCEEDED:
            reason = PodReason.COMPLETED.value
        elif raw == "OOMKilled":
            reason = PodReason.OOM_KILLED.value
        elif raw in _START_ERRORS:
            reason = PodReason.START_ERROR.value
        else:
            reason = PodReason.ERROR.value
    if gone and not phase.terminal:
        phase, reason = PodPhase.FAILED, (disruption or PodReason.DELETED).value
    if deleted_by_us:
        phase, reason = PodPhase.FAILED, PodReason.DELETED.value
    message: str | None = None
    if phase is PodPhase.PENDING:
        message = _unschedulable(status)  # so that the master can say why a pod waits
    elif term and phase is PodPhase.FAILED and reason != PodReason.DELETED.value:
        message = last_error_line(str(term.get("message") or ""))
    return PodStatus(
        name=str(meta.get("name", "")),
        role=role,
        index=index,
        phase=phase,
        exit_code=exit_code if phase.terminal else None,
        reason=reason if phase.terminal else None,
        started_at=started,
        finished_at=finished if phase.terminal else None,
        message=message,
    )
