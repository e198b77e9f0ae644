"""The train step: the elastic run from a given plan, on the local or the Kubernetes backend."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from dlrover_kfp.core.plan import ResourcePlan
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.files import read_document
from dlrover_kfp.runtime.job import Progress, RunResult
from dlrover_kfp.runtime.kube import DEFAULT_MOUNT_PATH, KubeOptions, master_host, run_kubernetes
from dlrover_kfp.runtime.launch import record_run, run_local
from dlrover_kfp.runtime.options import RunOptions, RunSettings
from dlrover_kfp.runtime.rundir import earlier_run_id
from dlrover_kfp.steps.image import IMAGE_ENV, check_image, pipeline_image
from dlrover_kfp.steps.run_ids import stable_run_id
from dlrover_kfp.steps.spec import (
    TrainingFailedError,
    check_backend,
    history_url_or_default,
    load_job_spec,
)

#: Where a pod finds its own namespace (every pod with a service account token has it).
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


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
    pipeline step): its own namespace, the pipeline's image for its pods (``image``, else
    ``$DLROVER_KFP_IMAGE``, else the default: :func:`~dlrover_kfp.steps.image.pipeline_image`,
    which refuses a name without a registry or a tag), its own address (``POD_IP`` from the
    downward API, else what its host name resolves to: a pod's own IP)."""
    host = environ.get("POD_IP") or socket.gethostbyname(socket.gethostname())
    return KubeOptions(
        namespace=namespace or _own_namespace(),
        image=check_image(image, "image") if image else pipeline_image(environ),
        claim=claim or None,
        mount_path=mount_path,
        master_host=host,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class OrchestratedRun:
    """Where an orchestrator's run lives and the id it has in the history."""

    run_id: str
    output_dir: Path


def orchestrated_run(
    parent: Path, job_name: str, keys: tuple[str, ...], *, now: float | None = None
) -> OrchestratedRun:
    """The run of ``job_name`` that ``keys`` name (a KFP run and task), in ``parent``.

    A retried task must land in the same directory, to resume from the last checkpoint rather
    than start afresh, so the directory is named by the keys alone
    (:func:`~dlrover_kfp.steps.run_ids.stable_run_id` without a date). The run id is that with
    the date for people (UTC, ``now``) unless an earlier attempt left one in the directory (its
    run file or profile): a retry after midnight keeps the first attempt's id, so that the
    history still holds one run for the logical run.
    """
    output_dir = parent / stable_run_id(job_name, keys)
    date = time.strftime("%Y%m%d", time.gmtime(now))
    run_id = earlier_run_id(output_dir) or stable_run_id(job_name, keys, date)
    return OrchestratedRun(run_id, output_dir)


def _own_namespace() -> str:
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip()
    except OSError:
        raise UserInputError(
            "backend kubernetes: not in a pod with a service account (no "
            f"{SERVICE_ACCOUNT_NAMESPACE}); give the namespace"
        ) from None


#: The run options of a job spec whose relative data paths resolve against the given directory:
#: the spec file's, known only once the step has loaded the spec. A new run option is a field of
#: :class:`RunOptions` the caller sets, not a parameter of :func:`train_step`.
OptionsFor = Callable[[Path], RunOptions]


def train_step(
    job_spec: str,
    options_for: OptionsFor,
    *,
    backend: str = "kubernetes",
    kube: KubeOptions | None = None,
    progress: Progress = print,
) -> RunResult:
    """Train ``job_spec`` to the end, elastic, with the options ``options_for`` gives for the
    spec file's directory: from their plan (Stage 1's own plan when None), writing their
    output dir (profile.json, model/, checkpoints), reading their history (else the default
    one: :func:`~dlrover_kfp.steps.spec.history_url_or_default`). A run that succeeds is not
    recorded whatever ``record`` says (the record step does it, so that a pipeline records each
    run once); a failed one is, then :class:`TrainingFailedError`."""
    check_backend(backend)
    loaded = load_job_spec(job_spec)
    options = options_for(loaded.base_dir)
    url = history_url_or_default(options.history_url)
    options = dataclasses.replace(options, history_url=url, record=False)
    if backend == "local":
        result = run_local(loaded.spec, options, progress=progress)
    else:
        if kube is None:
            raise UserInputError("backend kubernetes: no cluster options given")
        # the pods run the image's interpreter, not this one's path
        settings = dataclasses.replace(
            options.settings, master_host=master_host(kube), python="python"
        )
        options = dataclasses.replace(options, settings=settings)
        result = run_kubernetes(loaded.spec, kube, options, progress=progress)
    if not result.succeeded:
        result = record_run(url, result, progress)
        reason = result.profile.outcome.reason or "see the profile's events"
        raise TrainingFailedError(
            f"{loaded.spec.name}: run {result.profile.run_id} failed: {reason} (its profile is "
            f"in the history and in {options.output_dir / 'profile.json'})"
        )
    return result


__all__ = [
    "DEFAULT_MOUNT_PATH",
    "IMAGE_ENV",
    "KubeOptions",
    "OptionsFor",
    "OrchestratedRun",
    "RunOptions",
    "RunSettings",
    "in_cluster_options",
    "orchestrated_run",
    "read_plan",
    "train_step",
]
