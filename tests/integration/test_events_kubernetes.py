"""A real elastic run's Events on the fake cluster: the master (its own pod in the cluster, so
that the job's events have a place) grows the job, a worker is SIGKILLed and relaunched, and
each event the profile lists is an Event on its pod, which ``kubectl get events`` shows.

Opt-in (``pytest -m long``, 30-90 s): the elastic runtime's scale and relaunch paths on this
backend are tests/integration/test_elastic_kubernetes.py's; here only what reaches the API."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dlrover_kfp.backends.k8s_objects import (
    EVENT_SOURCE,
    KubernetesSettings,
    OwnerRef,
    RetryPolicy,
)
from dlrover_kfp.backends.kubernetes import KubernetesBackend, load_client
from dlrover_kfp.core.plan import ResourcePlan, Stage
from dlrover_kfp.runtime.elastic import ElasticPolicy, elastic_run
from dlrover_kfp.runtime.job import JobRun
from dlrover_kfp.runtime.options import RunOptions, RunSettings
from dlrover_kfp.runtime.pod_events import REASONS
from tests.integration.test_elastic_kubernetes import (
    NAMESPACE,
    THREE_EACH,
    Cluster,
    cluster,
)
from tests.integration.test_elastic_run import PLANNER, _spec

__all__ = ["cluster"]  # the fixture, used by name below

MASTER = "elastic-master"


def _master_pod(cluster: Cluster) -> OwnerRef:
    """A pod standing for the master (what deploy/master-pod.yaml runs), so that the job's
    pods are owned by a pod that exists and the job's own events have a pod to be on."""
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": MASTER, "namespace": NAMESPACE},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "master",
                    "image": "dlrover-kfp:test",
                    "command": ["python", "-c", "import time; time.sleep(600)"],
                    "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}},
                }
            ],
        },
    }
    created = cluster.api.create_object("pods", body, NAMESPACE)
    return OwnerRef(name=MASTER, uid=created["metadata"]["uid"])


@pytest.mark.long
@pytest.mark.parametrize("cluster", [THREE_EACH], indirect=True)
def test_a_runs_scale_failure_and_relaunch_are_events_on_its_pods(
    tmp_path: Path, cluster: Cluster
) -> None:
    spec = _spec(
        800_000, "{count: 1, cpu: 0.25, memory: 2Gi}", "{count: 1, cpu: 0.25, memory: 2Gi}"
    )
    settings = RunSettings(sample_interval_s=1.0, checkpoint_interval_s=0.0, python="python")
    one_step = dataclasses.replace(
        PLANNER, auto_scale=dataclasses.replace(PLANNER.auto_scale, max_job_cpu_growth=100.0)
    )
    config = cluster.api.write_kubeconfig(tmp_path / "kubeconfig", namespace=NAMESPACE)
    owner = _master_pod(cluster)
    kube = KubernetesSettings(
        namespace=NAMESPACE,
        image="dlrover-kfp:test",
        owner=owner,
        retry=RetryPolicy(initial_s=0.1, max_s=2.0),
    )
    plan = ResourcePlan(
        workers=spec.resources.workers.to_group(),  # type: ignore[union-attr]
        ps=spec.resources.ps.to_group(),  # type: ignore[union-attr]
        stage=Stage.MANUAL,
        reason="the user's guess",
    )
    killed: list[str] = []

    def kill_a_worker_after_the_first_scale(run: JobRun[ElasticPolicy]) -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            steps = [p for p in run.policy.plans if p.stage is Stage.AUTO_SCALE]
            last = run.samples[-1] if run.samples else None
            if steps and last and last.time > steps[0].time + 2 and last.throughput > 0:
                break
            time.sleep(0.1)
        pid = cluster.kubelet_of("elastic-worker-0").pid_of("elastic-worker-0")
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        killed.append("elastic-worker-0")

    with KubernetesBackend(load_client(str(config)), kube, job=spec.name) as backend:
        options = RunOptions(
            output_dir=tmp_path / "out", base_dir=tmp_path, settings=settings, planner=one_step
        )
        run = elastic_run(spec, backend, options, plan=plan, progress=lambda line: None)
        threading.Thread(target=kill_a_worker_after_the_first_scale, args=(run,)).start()
        result = run.run()
    profile = result.profile
    assert result.succeeded, profile.outcome.reason
    assert killed, "the worker was never killed"
    told = sorted(
        cluster.api.list_objects("events", NAMESPACE), key=lambda e: str(e["metadata"]["name"])
    )
    ours = [e for e in told if e.get("reportingComponent") == EVENT_SOURCE]
    # One Event per profile event, each on its pod (the job's own on the master's pod).
    expected = sorted(
        (REASONS[e.kind][0], e.node or MASTER, e.detail[:1024]) for e in profile.events
    )
    got = sorted(
        (str(e["reason"]), str(e["involvedObject"]["name"]), str(e["message"])) for e in ours
    )
    assert got == expected
    reasons = {r for r, _, _ in got}
    assert {"Scaled", "Failed", "Relaunched"} <= reasons, got
    relaunched = [e for e in ours if e["reason"] == "Relaunched"]
    assert any(e["involvedObject"]["name"] == "elastic-worker-0" for e in relaunched)
    scaled = [e for e in ours if e["reason"] == "Scaled" and e["involvedObject"]["name"] == MASTER]
    assert all(e["involvedObject"]["uid"] == owner.uid for e in scaled)
    shown = subprocess.run(
        [
            *("kubectl", "--kubeconfig", str(config), "get", "events", "-l", "job=elastic"),
            "-o=custom-columns=TYPE:.type,REASON:.reason,OBJECT:.involvedObject.name,"
            "SOURCE:.source.component,MESSAGE:.message",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    print("\nkubectl get events -l job=elastic:\n" + shown)
    rows = [line.split(maxsplit=4) for line in shown.splitlines()[1:]]
    assert ["Normal", "Relaunched", "elastic-worker-0", EVENT_SOURCE] in [r[:4] for r in rows]
