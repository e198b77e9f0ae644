"""The job master's steadiness on the unit loop (no processes, a fake clock): issue 30's two live
cases replayed through :meth:`ElasticPolicy.decide` with the real Stage 3 (and a scripted
Stage 2), each PS switch taking 1 s of the fake clock with nothing trained meanwhile.

- The PS hot at 0.25 core: Stage 3 moves it to 0.5, where it idles and Stage 2 gives the core
  back, where it is hot again... Without the steadiness rules it flip-flops on every turn
  (the issue's run: five times); with them the first round trip stands (the hot-PS move bought
  nothing: giving the core back is a rollback) and 0.5 is not entered again within its hold.
- A scale-out with every shard already leased is not taken.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dlrover_kfp.core.node_id import NodeId
from dlrover_kfp.core.plan import NodeGroup, ResourcePlan, Stage
from dlrover_kfp.core.planner import AutoScaleDecision, PlannerSettings
from dlrover_kfp.core.profile import RuntimeSample
from dlrover_kfp.runtime import elastic
from tests.factories import node_sample
from tests.fakes.clock import FakeClock

# _close_servers: test_elastic_master's autouse fixture, which closes the servers its _run made
from tests.unit.test_elastic_master import Run, _close_servers  # noqa: F401
from tests.unit.test_elastic_master import _run as _started


def _local(planner: PlannerSettings) -> PlannerSettings:
    """Stage 2 every 10 s from 3 samples, as ``dlrover-kfp run`` plans on one machine."""
    auto = dataclasses.replace(planner.auto_scale, min_interval_s=10.0, min_samples=3)
    return dataclasses.replace(planner, auto_scale=auto)


def _run(tmp_path: Path, ps_cpu: float) -> tuple[Run, list[str]]:
    """The run of test_elastic_master's SPEC (2 workers x 0.5 core, 2 PS), its PS at
    ``ps_cpu``, its PS switches 1 s each on the fake clock; returns it and its progress lines."""
    run, _, _ = _started(tmp_path)
    policy = run.policy
    policy.planner = _local(policy.planner)
    run.start = run.clock.monotonic()
    run.ps = NodeGroup(count=2, cpu=ps_cpu, memory_mb=1024)
    policy.plan = dataclasses.replace(policy.plan, ps=run.ps)
    for k in range(2):
        run.launch(NodeId("ps", k), run.ps)
    clock = run.clock
    assert isinstance(clock, FakeClock)

    def switch(target: NodeGroup, moved: frozenset[int] | None, *, live: bool = True) -> None:
        clock.advance(1.0)
        run.ps = target

    policy._switch_ps = switch  # type: ignore[method-assign]
    lines: list[str] = []
    run.progress = lines.append
    return run, lines


def _sample(run: Run, t: float) -> RuntimeSample:
    """Two workers at 1,000 samples/s each; the first PS uses 0.24 core whatever it has (hot at
    0.25, idle at 0.5), the other 0.12: the PS CPU buys nothing. (Issue 30: a PS is hot only
    when it also carries 1.5x its peers' load or more, so the replay has one PS hotter than the
    other; two PS busy alike are left to Stage 2, and never start this flip-flop.)"""
    workers = [
        node_sample(run.worker_name(k), "worker", cpu_used=0.45, throughput=1000.0)
        for k in range(2)
    ]
    ps = [
        node_sample(
            run.pod_name(node), "ps", cpu_used=0.24 if i == 0 else 0.12, cpu_requested=run.ps.cpu
        )
        for i, (_, node) in enumerate(sorted(run.policy._ps_nodes.items()))
    ]
    return RuntimeSample(
        time=round(t, 3),
        global_step=int(t),
        throughput=2000.0,
        workers=run.workers.count,
        ps=run.ps.count,
        worker_cpu=run.workers.cpu,
        ps_cpu=run.ps.cpu,
        nodes=(*workers, *ps),
    )


def _give_back(ctx, current, samples, now, settings, **kwargs) -> AutoScaleDecision:  # type: ignore[no-untyped-def]
    """Stage 2, scripted: PS at 0.5 core idle for 3 samples -> back to 0.25, promising the
    rate measured (a give-back)."""
    at = [x for x in samples if x.ps_cpu == current.ps.cpu]
    if current.ps.cpu != 0.5 or len(at) < 3:
        return AutoScaleDecision(None, "stable")
    rate = sum(x.throughput for x in at[-3:]) / 3
    plan = dataclasses.replace(
        current,
        ps=dataclasses.replace(current.ps, cpu=0.25),
        stage=Stage.AUTO_SCALE,
        reason="give the PS core back",
        predicted_throughput=rate,
    )
    return AutoScaleDecision(plan, "give back", kind="give_back")


def _ps_cpus(
    tmp_path: Path, seconds: float, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[tuple[float, float]], list[str]]:
    """(time, PS CPU) at the start and at every change over ``seconds`` of the replayed loop
    (a sample and a decision every 2 s), and the master's progress lines."""
    monkeypatch.setattr(elastic, "auto_scale", _give_back)
    run, lines = _run(tmp_path, ps_cpu=0.25)
    assert isinstance(run.clock, FakeClock)
    cpus = [(0.0, run.ps.cpu)]
    while run.t() < seconds:
        run.clock.advance(2.0)
        t = run.t()
        run.samples.append(_sample(run, t))
        run.policy.decide(t)
        if run.ps.cpu != cpus[-1][1]:
            cpus.append((run.t(), run.ps.cpu))
    return cpus, lines


def test_without_the_rules_the_ps_flip_flops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's symptom, replayed with the rules switched off."""
    monkeypatch.setattr(elastic, "refusal", lambda *args, **kwargs: None)
    cpus, _ = _ps_cpus(tmp_path, 60.0, monkeypatch)
    assert len(cpus) - 1 >= 5 and {cpu for _, cpu in cpus} == {0.25, 0.5}


def test_the_ps_flip_flop_stops_after_one_round_trip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0.25 -> 0.5 (hot PS, no gain: contradicted) -> 0.25 (given back, the rate kept) and then
    held: each move cost 2 s (two PS switches), so 0.5 is held 2 · 2 / 0.1 = 40 s from the
    give-back (applied at 20 s). At 60 s the hold ends and the hot-PS rule may move it again
    (a round trip of 4 s per 40 s held: the 10% the hold bounds a flip-flop's share to)."""
    cpus, lines = _ps_cpus(tmp_path, 62.0, monkeypatch)
    assert [cpu for _, cpu in cpus] == [0.25, 0.5, 0.25, 0.5]
    assert cpus[2][0] == 20.0 and cpus[3][0] >= 60.0
    held = [line for line in lines if "not taken: held" in line]
    assert len(held) == 1 and "held 40s, until 60s" in held[0], lines


def test_a_scale_out_with_every_shard_leased_is_not_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30's late step: the only rows left are leased; Stage 2 proposes a third worker."""

    def scale_out(ctx, current, samples, now, settings, **kwargs) -> AutoScaleDecision:  # type: ignore[no-untyped-def]
        workers = dataclasses.replace(current.workers, count=3)
        plan = dataclasses.replace(
            current, workers=workers, reason="scale out", predicted_throughput=3000.0
        )
        return AutoScaleDecision(plan, "scale out")

    monkeypatch.setattr(elastic, "auto_scale", scale_out)
    run, lines = _run(tmp_path, ps_cpu=0.5)
    applied: list[ResourcePlan] = []
    run.policy._apply = lambda state, target: applied.append(target)  # type: ignore[method-assign]
    ledger = run.state.ledger
    while ledger.lease("worker-0", run.clock.monotonic()) is not None:
        pass
    assert isinstance(run.clock, FakeClock)
    for _ in range(4):
        run.clock.advance(2.0)
        run.samples.append(_sample(run, run.t()))
        run.policy.decide(run.t())
    assert applied == []
    assert [line for line in lines if "not taken: too late: 0 rows left to lease" in line]
    # With the rows still to lease (the ledger as it started), the same step is taken.
    ledger.requeue("worker-0")
    run.clock.advance(2.0)
    run.samples.append(_sample(run, run.t()))
    run.policy.decide(run.t())
    assert [p.workers.count for p in applied] == [3]
