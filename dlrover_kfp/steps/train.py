"""The train step: the elastic run from a given plan, on the local or the Kubernetes backend."""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping
from pathlib import Path

from dlrover_kfp import __version__
from dlrover_kfp.core.plan import ResourcePlan
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.files import read_document
from dlrover_kfp.runtime.job import Progress, RunResult, RunSettings
from dlrover_kfp.runtime.kube import DEFAULT_MOUNT_PATH, KubeOptions, master_host, run_kubernetes
from dlrover_kfp.runtime.launch import record_run, run_local
from dlrover_kfp.steps.spec import (
    TrainingFailedError,
    check_backend,
    history_url_or_default,
    load_job_spec,
    planner_for,
)

#: Where a pod finds its own namespace (every pod with a service account token has it).
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

#: The environment variable that names the worker and PS pods' image in a cluster; default:
#: the project's image at this package's version (deploy/build.sh tags it so).
IMAGE_ENV = "DLROVER_KFP_IMAGE"


def read_plan(path: str | os.PathLike[str]) -> ResourcePlan:
    return read_document(ResourcePlan, path)


def in_cluster_options(
    *,
    claim: str | None,
    namespace: str | None = None,
    image: str | None = None,
    mount_path: str = DEFAULT_MOUNT_PATH,
    environ: Mapping[str, str] = os.environ,
) -> KubeOptions:
    """The Kubernetes backend's options for a job master that runs in a pod of the cluster (a
    pipeline step): its own namespace, the project's image at this version, its own address
    (``POD_IP`` from the downward API, else what its host name resolves to: a pod's own IP)."""
    host = environ.get("POD_IP") or socket.gethostbyname(socket.gethostname())
    return KubeOptions(
        namespace=namespace or _own_namespace(),
        image=image or environ.get(IMAGE_ENV) or f"dlrover-kfp:{__version__}",
        claim=claim or None,
        mount_path=mount_path,
        master_host=host,
    )


def _own_namespace() -> str:
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip()
    except OSError:
        raise UserInputError(
            "backend kubernetes: not in a pod with a service account (no "
            f"{SERVICE_ACCOUNT_NAMESPACE}); give the namespace"
        ) from None


def train_step(
    job_spec: str,
    plan: ResourcePlan | None,
    *,
    output_dir: Path,
    history_url: str | None = None,
    backend: str = "kubernetes",
    kube: KubeOptions | None = None,
    settings: RunSettings | None = None,
    progress: Progress = print,
) -> RunResult:
    """Train ``job_spec`` from ``plan`` (Stage 1's own plan when None) to the end, elastic,
    writing ``output_dir`` (profile.json, model/, checkpoints). A run that succeeds is not
    recorded (the record step does it); a failed one is, then :class:`TrainingFailedError`."""
    check_backend(backend)
    loaded = load_job_spec(job_spec)
    url = history_url_or_default(history_url)
    settings = settings or RunSettings()
    if backend == "local":
        result = run_local(
            loaded.spec,
            output_dir=output_dir,
            base_dir=loaded.base_dir,
            settings=settings,
            progress=progress,
            history_url=url,
            plan=plan,
            record=False,
        )
    else:
        if kube is None:
            raise UserInputError("backend kubernetes: no cluster options given")
        # the pods run the image's interpreter, not this one's path
        settings = dataclasses.replace(settings, master_host=master_host(kube), python="python")
        result = run_kubernetes(
            loaded.spec,
            kube,
            output_dir=output_dir,
            base_dir=loaded.base_dir,
            settings=settings,
            progress=progress,
            history_url=url,
            planner=planner_for(backend),
            plan=plan,
            record=False,
        )
    if not result.succeeded:
        result = record_run(url, result, progress)
        reason = result.profile.outcome.reason or "see the profile's events"
        raise TrainingFailedError(
            f"{loaded.spec.name}: run {result.profile.run_id} failed: {reason} (its profile is "
            f"in the history and in {output_dir / 'profile.json'})"
        )
    return result


__all__ = [
    "DEFAULT_MOUNT_PATH",
    "IMAGE_ENV",
    "KubeOptions",
    "in_cluster_options",
    "read_plan",
    "train_step",
]
