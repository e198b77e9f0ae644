"""Running a job's pods on Kubernetes: settings from the command line, the run, the dry run.

The job master is the same as on the local backend (:func:`~dlrover_kfp.runtime.launch.run_job`);
only the backend differs. The master must be reachable from its pods: in the cluster it
listens on its own pod IP (``POD_IP`` from the downward API, as deploy/master-pod.yaml sets);
elsewhere ``--master-host`` names an address the pods can reach.

``kubernetes`` (the client library) is imported only when a run starts, so that ``--dry-run``
and the rest of the CLI work without it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dlrover_kfp.backends.k8s_objects import (
    KubernetesSettings,
    Volume,
    job_labels,
    owner_from_env,
    redacted,
    render_pod,
    render_secret,
    secret_keys,
    secret_name,
)
from dlrover_kfp.core.node_id import NodeId
from dlrover_kfp.core.plan import ResourcePlan
from dlrover_kfp.core.planner import PlannerSettings
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.runtime.cancel import first_reason
from dlrover_kfp.runtime.job import Progress, RunResult, trainer_pod
from dlrover_kfp.runtime.launch import run_job
from dlrover_kfp.runtime.metrics import pod_defaults
from dlrover_kfp.runtime.options import RunOptions, RunSettings
from dlrover_kfp.runtime.rundir import hold_output_dir
from dlrover_kfp.training.wire import new_secret

#: Where the run's volume is mounted in every pod unless told otherwise.
DEFAULT_MOUNT_PATH = "/var/lib/dlrover-kfp"


@dataclass(frozen=True, slots=True)
class KubeOptions:
    """What the command line says about the cluster (``dlrover-kfp run --backend kubernetes``)."""

    namespace: str
    image: str
    kubeconfig: str | None = None
    context: str | None = None
    #: a PersistentVolumeClaim mounted in every pod at ``mount_path``; the output dir is on it
    claim: str | None = None
    mount_path: str = DEFAULT_MOUNT_PATH
    #: the address pods reach the master at; default ``POD_IP``
    master_host: str | None = None
    image_pull_policy: str = "IfNotPresent"


def kube_settings(opts: KubeOptions, env: Mapping[str, str] = os.environ) -> KubernetesSettings:
    return KubernetesSettings(
        namespace=opts.namespace,
        image=opts.image,
        image_pull_policy=opts.image_pull_policy,
        volume=Volume(opts.claim, opts.mount_path) if opts.claim else None,
        owner=owner_from_env(env),
    )


def master_host(opts: KubeOptions, env: Mapping[str, str] = os.environ) -> str:
    host = opts.master_host or env.get("POD_IP")
    if not host:
        raise UserInputError(
            "--backend kubernetes: the pods must reach the job master: run it in the cluster "
            "(deploy/master-pod.yaml sets POD_IP) or name a reachable address with --master-host"
        )
    return host


def check_output_dir(opts: KubeOptions, output_dir: Path) -> None:
    """With a volume, the run's files must be on it: the PS persist checkpoints there."""
    if opts.claim is None:
        return
    mount = Path(opts.mount_path)
    resolved = output_dir.resolve() if not output_dir.is_absolute() else output_dir
    if mount != resolved and mount not in resolved.parents:
        raise UserInputError(
            f"--output-dir {output_dir}: must be under --mount-path {opts.mount_path}, where "
            f"the claim {opts.claim} is mounted in every pod"
        )


def dry_run_manifests(
    spec: JobSpec,
    plan: ResourcePlan,
    settings: RunSettings,
    kube: KubernetesSettings,
    run_id: str,
) -> list[dict[str, Any]]:
    """What a run would create first, as kubectl's ``--dry-run=client -o yaml`` shows it: the
    job's Secret (values redacted), its PS pods, then its workers. The master's port is chosen
    when it starts: the pods' ``--master`` shows port 0."""
    key = new_secret()
    master = (settings.master_host, 0)
    pods = [
        trainer_pod(spec.name, run_id, key, settings, NodeId("ps", k), plan.ps, master)
        for k in range(plan.ps.count)
    ] + [
        trainer_pod(spec.name, run_id, key, settings, NodeId.worker(k), plan.workers, master)
        for k in range(plan.workers.count)
    ]
    known: dict[tuple[str, str], str] = {}
    data: dict[str, str] = {}
    for p in pods:
        data |= secret_keys(p.env, known)[1]
    labels = job_labels(spec.name)
    secret = secret_name(spec.name)
    out = [redacted(render_secret(secret, kube.namespace, data, labels, kube.owner))]
    for p in pods:
        out.append(
            render_pod(
                p,
                namespace=kube.namespace,
                image=kube.image,
                labels=labels,
                secret_name=secret,
                secret_keys=secret_keys(p.env, known)[0],
                owner=kube.owner,
                volume=kube.volume,
                image_pull_policy=kube.image_pull_policy,
            )
        )
    return out


def run_kubernetes(
    spec: JobSpec, kube: KubeOptions, options: RunOptions, *, progress: Progress
) -> RunResult:
    """:func:`run_job` with the pods on Kubernetes (cluster planner settings unless
    ``options.planner`` is given), holding ``options.output_dir`` as
    :func:`~dlrover_kfp.runtime.launch.run_local` does."""
    # the client library is an extra; imported only when a run starts
    from dlrover_kfp.backends.kubernetes import KubernetesBackend, load_client  # noqa: PLC0415

    check_output_dir(kube, options.output_dir)
    cluster = kube_settings(kube)
    api = load_client(kube.kubeconfig, kube.context)
    with (
        hold_output_dir(options.output_dir, fresh=options.fresh, progress=progress) as held,
        KubernetesBackend(api, cluster, job=spec.name) as backend,
    ):
        planner = options.planner or PlannerSettings()
        probe = first_reason(options.cancel_probe, backend.owner_cancel_reason)
        settings = pod_defaults(options.settings, os.environ)  # its metrics port
        options = replace(
            options, output_dir=held, planner=planner, cancel_probe=probe, settings=settings
        )
        return run_job(spec, backend, options, progress=progress)


__all__ = [
    "DEFAULT_MOUNT_PATH",
    "KubeOptions",
    "dry_run_manifests",
    "kube_settings",
    "master_host",
    "run_kubernetes",
]
