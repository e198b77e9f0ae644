"""The job master as a pod of the cluster, for ``ElasticTrainOperator(backend="kubernetes")``.

With the Kubernetes backend nothing of a run lives on the Airflow worker: the operator submits
the job master as a pod (the project's image, the run's claim, a service account with
deploy/rbac.yaml's Role), and the trigger watches that pod through the Kubernetes API. So any
executor (Celery, Kubernetes) and any triggerer host can run the task, and a worker recycled
mid-run takes nothing with it. This module is all the Airflow side says to the API server:

- :func:`master_pod_manifest` and :func:`history_secret_manifest`: what is created. The pod
  runs ``python -m airflow_plugin.master --pod -- run ...`` (:mod:`airflow_plugin.master`):
  the job spec and plan come in its environment, the history URL from a Secret (never on a
  command line or in the pod's spec), its identity from the downward API (its pods reach it at
  its IP and are owned by it, so they go when it goes);
- :class:`MasterPods`: create (pod first, then the Secret owned by the pod, so that it goes
  with it), read its state, read its log, cancel (annotate with the reason, then delete), delete.

The official client is synchronous; the trigger calls it through ``asyncio.to_thread`` so that
the triggerer's event loop never blocks (one short request per poll).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from kubernetes import client as k8s  # type: ignore[import-untyped]
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException  # type: ignore[import-untyped]

from airflow_plugin.master import JOB_SPEC_ENV, PLAN_ENV, PROFILE_PREFIX
from dlrover_kfp.history import ENV_VAR
from dlrover_kfp.steps.cancel import CANCEL_ANNOTATION

#: The container of the master pod (the log is read from it).
CONTAINER: Final = "master"
#: The key of the history URL in the run's Secret.
HISTORY_KEY: Final = "url"
#: The master stops its pods on SIGTERM before it exits: the grace it gets for that.
GRACE_S: Final = 60
_TERMINAL: Final = frozenset({"Succeeded", "Failed"})


def load_api(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """An API client: in-cluster when the worker runs in a pod (and no kubeconfig is named),
    else the kubeconfig (``kubeconfig``, else ``$KUBECONFIG`` or ``~/.kube/config``)."""
    if kubeconfig is None and context is None:
        try:
            k8s_config.load_incluster_config()
            return k8s.ApiClient()
        except k8s_config.ConfigException:
            pass
    return k8s_config.new_client_from_config(config_file=kubeconfig, context=context)


@dataclass(frozen=True, slots=True)
class MasterPodSpec:
    """Everything the master pod of one run is made of."""

    name: str
    namespace: str
    image: str
    run_id: str
    #: the run's directory on the claim, as the master sees it
    output_dir: str
    claim: str
    mount_path: str
    job_yaml: str
    plan_json: str | None
    secret: str
    dlrover_args: tuple[str, ...] = ()
    service_account: str | None = None
    cpu: str = "1"
    memory: str = "1Gi"
    labels: Mapping[str, str] | None = None


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def master_pod_manifest(spec: MasterPodSpec) -> dict[str, Any]:
    """The master's pod, as deploy/master-pod.yaml's Job template has it (the same image,
    security context and downward-API identity), for one run."""
    out = spec.output_dir
    args = [
        "-m", "airflow_plugin.master", "--pod", "--",
        "run", "--job", f"{out}/job.yaml", "--output-dir", out, "--no-record",
        "--backend", "kubernetes", "--namespace", "$(POD_NAMESPACE)", "--image", spec.image,
        "--claim", spec.claim, "--mount-path", spec.mount_path, "--run-id", spec.run_id,
        *spec.dlrover_args,
    ]  # fmt: skip
    if spec.plan_json is not None:
        args += ["--plan", f"{out}/plan.json"]
    env: list[dict[str, Any]] = [
        _field_env("POD_NAME", "metadata.name"),
        _field_env("POD_NAMESPACE", "metadata.namespace"),
        _field_env("POD_UID", "metadata.uid"),
        _field_env("POD_IP", "status.podIP"),
        {
            "name": ENV_VAR,
            "valueFrom": {"secretKeyRef": {"name": spec.secret, "key": HISTORY_KEY}},
        },
        {"name": JOB_SPEC_ENV, "value": spec.job_yaml},
    ]
    if spec.plan_json is not None:
        env.append({"name": PLAN_ENV, "value": spec.plan_json})
    labels = {
        "app.kubernetes.io/name": "dlrover-kfp",
        "app.kubernetes.io/component": "master",
        "app.kubernetes.io/managed-by": "dlrover-kfp-airflow",
        **dict(spec.labels or {}),
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": GRACE_S,
        "containers": [
            {
                "name": CONTAINER,
                "image": spec.image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["python"],
                "args": args,
                "env": env,
                # the master's Prometheus metrics (docs/observability.md): 8080 in a pod
                "ports": [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}],
                "resources": {
                    "requests": {"cpu": spec.cpu, "memory": spec.memory},
                    "limits": {"cpu": spec.cpu, "memory": spec.memory},
                },
                "volumeMounts": [{"name": "runs", "mountPath": spec.mount_path}],
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                },
            }
        ],
        "volumes": [{"name": "runs", "persistentVolumeClaim": {"claimName": spec.claim}}],
    }
    if spec.service_account:
        pod_spec["serviceAccountName"] = spec.service_account
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": labels},
        "spec": pod_spec,
    }


def history_secret_manifest(
    name: str, namespace: str, url: str, owner_name: str, owner_uid: str
) -> dict[str, Any]:
    """The run's history URL as a Secret owned by the master pod: deleted with it."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "dlrover-kfp"},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": owner_name, "uid": owner_uid}
            ],
        },
        "type": "Opaque",
        "stringData": {HISTORY_KEY: url},
    }


@dataclass(frozen=True, slots=True)
class PodState:
    """What the trigger needs of the master pod: whether it ended, and how."""

    #: False: there is no pod of that name and uid any more (deleted, or replaced)
    exists: bool
    phase: str = ""
    exit_code: int | None = None
    #: the container's terminated reason and message, or the pod's
    reason: str = ""

    @property
    def ended(self) -> bool:
        return not self.exists or self.phase in _TERMINAL


@dataclass(frozen=True, slots=True)
class LogLine:
    #: the container runtime's RFC 3339 timestamp (nanoseconds), which orders the lines
    stamp: str
    text: str


def parse_log(raw: str) -> list[LogLine]:
    """``timestamps=true`` log text as lines (a line without a timestamp keeps "")."""
    out = []
    for line in raw.splitlines():
        stamp, sep, text = line.partition(" ")
        out.append(LogLine(stamp, text) if sep and stamp[:1].isdigit() else LogLine("", line))
    return out


def profile_from_log(raw: str) -> dict[str, Any] | None:
    """The profile document the master printed last (:data:`PROFILE_PREFIX`), if any."""
    for line in reversed(raw.splitlines()):
        _, _, text = line.partition(PROFILE_PREFIX)
        if text:
            try:
                document = json.loads(text)
            except ValueError:
                return None
            return document if isinstance(document, dict) else None
    return None


class MasterPods:
    """The master pods of one namespace, through the official client (module docstring)."""

    def __init__(self, api: Any, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self._core = k8s.CoreV1Api(api)

    def read(self, name: str) -> dict[str, Any] | None:
        try:
            response = self._core.read_namespaced_pod(name, self.namespace, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        document: dict[str, Any] = json.loads(response.data)
        return document

    def submit(self, spec: MasterPodSpec, history_url: str) -> tuple[str, str]:
        """Create the master pod, then its history Secret (owned by the pod); the pod waits
        for the Secret before its container starts. Returns the pod's (name, uid)."""
        pod = self._core.create_namespaced_pod(
            self.namespace, master_pod_manifest(spec), _preload_content=False
        )
        uid = str(json.loads(pod.data)["metadata"]["uid"])
        secret = history_secret_manifest(spec.secret, self.namespace, history_url, spec.name, uid)
        try:
            self._core.create_namespaced_secret(self.namespace, secret)
        except ApiException as exc:
            if exc.status != 409:
                raise
            # an earlier attempt's, not yet collected: this run's URL, this pod as its owner
            self._core.replace_namespaced_secret(spec.secret, self.namespace, secret)
        return spec.name, uid

    def state(self, name: str, uid: str) -> PodState:
        pod = self.read(name)
        if pod is None or pod.get("metadata", {}).get("uid") != uid:
            return PodState(exists=False, reason="the master pod was deleted")
        status = pod.get("status") or {}
        phase = str(status.get("phase") or "")
        for container in status.get("containerStatuses") or []:
            if container.get("name") != CONTAINER:
                continue
            ended = (container.get("state") or {}).get("terminated")
            if ended:
                reason = " ".join(
                    str(part) for part in (ended.get("reason"), ended.get("message")) if part
                )
                return PodState(True, phase, int(ended.get("exitCode", 1)), reason)
        reason = " ".join(str(p) for p in (status.get("reason"), status.get("message")) if p)
        return PodState(True, phase, None, reason)

    def log(self, name: str, since_seconds: int | None = None, tail: int | None = None) -> str:
        """The master container's log with timestamps ("" when it has none yet)."""
        kwargs: dict[str, Any] = {"container": CONTAINER, "timestamps": True}
        if since_seconds is not None:
            kwargs["since_seconds"] = max(1, since_seconds)
        if tail is not None:
            kwargs["tail_lines"] = tail
        try:
            response = self._core.read_namespaced_pod_log(
                name, self.namespace, _preload_content=False, **kwargs
            )
        except ApiException as exc:
            if exc.status in (400, 404):  # not started yet, or gone
                return ""
            raise
        return bytes(response.data).decode("utf-8", errors="replace")

    def cancel(self, name: str, uid: str, reason: str) -> None:
        """Say why on the pod (the master reads it when SIGTERM comes), then delete it with
        its grace period: the master stops its pods and records the run as cancelled."""
        patch = {"metadata": {"annotations": {CANCEL_ANNOTATION: reason}}}
        try:
            self._core.patch_namespaced_pod(name, self.namespace, patch)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        self.delete(name, uid, GRACE_S)

    def delete(self, name: str, uid: str, grace_s: int = GRACE_S) -> None:
        body = k8s.V1DeleteOptions(
            grace_period_seconds=grace_s, preconditions=k8s.V1Preconditions(uid=uid)
        )
        try:
            self._core.delete_namespaced_pod(name, self.namespace, body=body)
        except ApiException as exc:
            if exc.status not in (404, 409):  # gone, or replaced (the uid precondition)
                raise

    def wait_gone(self, name: str, uid: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.state(name, uid).exists:
                return True
            time.sleep(0.5)
        return False


__all__ = [
    "CONTAINER",
    "GRACE_S",
    "JOB_SPEC_ENV",
    "PLAN_ENV",
    "PROFILE_PREFIX",
    "LogLine",
    "MasterPodSpec",
    "MasterPods",
    "PodState",
    "history_secret_manifest",
    "load_api",
    "master_pod_manifest",
    "parse_log",
    "profile_from_log",
]
