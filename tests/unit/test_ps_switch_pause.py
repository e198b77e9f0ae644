"""Which workers a PS switch waits for: those configured against the PS set being replaced.

The master's own bookkeeping, on a cluster whose pods run until deleted (no processes): a
worker relaunched before the switch has not asked for its configuration yet, so it cannot
pause (it is told to wait) and must not be waited for; it gets the new PS set afterwards.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dlrover_kfp.backends.api import PodPhase, PodSpec, PodStatus, PodUsage
from dlrover_kfp.core.documents import load_text, parse
from dlrover_kfp.core.plan import ResourcePlan, Stage
from dlrover_kfp.core.planner import PlannerSettings
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.runtime import elastic
from dlrover_kfp.runtime.elastic import ElasticRun
from dlrover_kfp.runtime.job import RunSettings
from dlrover_kfp.runtime.master import MasterService, MasterState, PsSwitch
from dlrover_kfp.training.master_protocol import CONFIG
from dlrover_kfp.training.wire import Message, PeerInfo

SPEC = """
name: pause
model:
  {embedding_dim: 4, table_sizes: [100, 10], dense_features: 3, bottom_mlp: [8, 4], top_mlp: [8, 1]}
data: {format: synthetic, rows: 20000, seed: 1}
training: {batch_size: 256}
resources:
  workers: {count: 2, cpu: 0.5, memory: 1Gi}
  ps: {count: 2, cpu: 0.5, memory: 1Gi}
"""


class RunningPods:
    """Pods that run until deleted."""

    enforcement = "none"

    def __init__(self) -> None:
        self.pods: dict[str, PodStatus] = {}

    def launch(self, pod: PodSpec) -> None:
        self.pods[pod.name] = PodStatus(
            name=pod.name, role=pod.role, index=pod.index, phase=PodPhase.RUNNING
        )

    def delete(self, name: str, grace_s: float = 5.0) -> None:
        self.pods.pop(name, None)

    def statuses(self) -> list[PodStatus]:
        return list(self.pods.values())

    def usage(self) -> list[PodUsage]:
        return []

    def close(self) -> None:
        pass


def _config(service: MasterService, index: int) -> dict[str, object]:
    """A worker asks the master for its configuration."""
    peer = PeerInfo(index, ("h", index))
    return service.handle(peer, Message(CONFIG, {"role": "worker", "index": index}, ())).meta


@pytest.fixture(autouse=True)
def _short_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A switch gives up on a worker that never pauses after 1 s here (5-20 s in a job)."""
    monkeypatch.setattr(elastic, "_PAUSE_TIMEOUT_S", 1.0)
    monkeypatch.setattr(elastic, "_PAUSE_MIN_S", 1.0)


def _run(tmp_path: Path) -> tuple[ElasticRun, MasterService, RunningPods]:
    spec = parse(JobSpec, load_text(SPEC, "pause"), "pause")
    assert spec.resources.workers is not None and spec.resources.ps is not None
    plan = ResourcePlan(
        workers=spec.resources.workers.to_group(),
        ps=spec.resources.ps.to_group(),
        stage=Stage.MANUAL,
        reason="test",
    )
    pods = RunningPods()
    run = ElasticRun(
        spec,
        pods,  # type: ignore[arg-type]
        plan=plan,
        planner=PlannerSettings(),
        output_dir=tmp_path / "out",
        base_dir=tmp_path,
        settings=RunSettings(),
        progress=lambda line: None,
    )
    run.state = MasterState(ledger=run.ledger, num_ps=2, job_config={})
    run.state.ps_addresses = {0: ("127.0.0.1", 1), 1: ("127.0.0.1", 2)}
    run.address = ("127.0.0.1", 3)
    service = MasterService(run.state)
    for k in range(2):  # both workers start and are configured against generation 0
        run._launch_worker(k, run.workers)
        _config(service, k)
    return run, service, pods


def _switch() -> PsSwitch:
    return PsSwitch(generation=1, num_ps=2, replaced=frozenset({0}), job_config={}, pausing=True)


def test_a_switch_waits_for_a_configured_worker_until_it_pauses(tmp_path: Path) -> None:
    run, _, _ = _run(tmp_path)
    switch = _switch()
    switch.ready.add("worker-1")
    started = time.monotonic()
    waiting = run._await_pause(run.state, switch)
    # worker-0 never paused: the switch gave up on it after its timeout, and names it.
    assert waiting == [run._worker_name(0)]
    assert time.monotonic() - started >= 0.9


def test_a_worker_relaunched_before_it_was_configured_is_not_waited_for(tmp_path: Path) -> None:
    run, service, _ = _run(tmp_path)
    run._launch_worker(0, run.workers)  # worker-0 failed and was relaunched; not yet asked
    switch = _switch()
    switch.ready.add("worker-1")
    started = time.monotonic()
    assert run._await_pause(run.state, switch) == []
    assert time.monotonic() - started < 0.5
    # Asking during the switch, it is told to wait; afterwards it gets the new PS set.
    run.state.switch = switch
    assert _config(service, 0) == {"wait": True}
