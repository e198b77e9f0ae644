"""Chaos on the Kubernetes backend: the official client against the fake API server, whose
fake kubelet runs each pod as a real trainer process. A seeded schedule of SIGKILLs, a frozen
worker, an eviction and a preemption, with the same checks as on the local backend."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from dlrover_kfp.backends.k8s_objects import KubernetesSettings, RetryPolicy
from dlrover_kfp.backends.kubernetes import KubernetesBackend, load_client
from dlrover_kfp.core.plan import ResourcePlan, Stage
from dlrover_kfp.runtime.elastic import elastic_run
from dlrover_kfp.runtime.options import RunOptions
from tests.chaos.harness import (
    PLANNER,
    ROWS,
    SETTINGS,
    Fault,
    Injector,
    chaos_spec,
    check,
    draw_schedule,
    measure,
)
from tests.fakes.kube_apiserver import FakeApiServer
from tests.fakes.kubelet import FakeKubelet

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.skipif(
        not Path("/proc/self/cmdline").exists(), reason="finds the pods' processes in /proc"
    ),
]

KUBE_FAULTS = (
    Fault.WORKER_KILL,
    Fault.PS_KILL,
    Fault.WORKER_STOP,
    Fault.WORKER_EVICT,
    Fault.PS_PREEMPT,
)


class _KubeletPods:
    """The injector's view of the fake kubelet (pods by name in the default namespace)."""

    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    def pid_of(self, name: str) -> int | None:
        return self.kubelet.pid_of(name)

    def exec_in(self, name: str, argv: Sequence[str]) -> object:
        return self.kubelet.exec_in(name, argv)

    def evict(self, name: str) -> None:
        self.kubelet.evict(name)

    def preempt(self, name: str) -> None:
        self.kubelet.preempt(name)


# Seed 40 draws a worker eviction, a PS SIGKILL, a worker SIGSTOP and a PS preemption.
# 50 s with its cluster: the same checks as the local chaos suite, on the other backend; how the
# Kubernetes backend reads evictions, preemptions and lost nodes from pod status is tested in
# tests/backends/test_kubernetes_backend.py::test_evicted_preempted_and_lost_pods_say_so.
@pytest.mark.long
@pytest.mark.parametrize("seed", [40])
def test_faults_on_kubernetes_lose_nothing(
    seed: int, tmp_path: Path, reference_loss: float
) -> None:
    schedule = draw_schedule(seed, KUBE_FAULTS, 4, workers=2, ps=2)
    spec = chaos_spec(ROWS)
    plan = ResourcePlan(
        workers=spec.resources.workers.to_group(),  # type: ignore[union-attr]
        ps=spec.resources.ps.to_group(),  # type: ignore[union-attr]
        stage=Stage.MANUAL,
        reason="the user's guess",
    )
    injector = Injector(schedule)
    with (
        FakeApiServer() as api,
        FakeKubelet(api, log_dir=tmp_path / "kubelet", metrics_interval_s=1.0) as kubelet,
    ):
        client = load_client(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        kube = KubernetesSettings(
            namespace="default",
            image="dlrover-kfp:test",
            retry=RetryPolicy(initial_s=0.1, max_s=2.0),
        )
        with KubernetesBackend(client, kube, job=spec.name) as backend:
            options = RunOptions(
                output_dir=tmp_path / "out",
                base_dir=tmp_path,
                settings=dataclasses.replace(SETTINGS, python="python"),
                planner=PLANNER,
            )
            run = elastic_run(spec, backend, options, plan=plan, progress=lambda line: None)
            thread = threading.Thread(
                target=injector, args=(run, _KubeletPods(kubelet)), daemon=True
            )
            thread.start()
            result = run.run()
            thread.join(timeout=10)
    if injector.error is not None:
        raise injector.error
    profile = result.profile
    assert result.succeeded, (profile.outcome.reason, profile.events)
    assert len(injector.injected) == len(schedule), (injector.injected, injector.skipped)
    outcome = measure(seed, injector, run, result)
    check(outcome, reference_loss)
