"""The quota regimes (``--quota request|headroom``): the trace transform, every policy driven
through the engine with a quota equal to the user's request, and what the table says."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dlrover_kfp.core.plan import Stage
from dlrover_kfp.core.planner.quota import over_quota
from dlrover_kfp.core.quantity import Mebibytes
from dlrover_kfp.core.spec import NodeRequest
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.sim.cluster.engine import Simulation
from dlrover_kfp.sim.cluster.policies.planner import PlannerPolicy
from dlrover_kfp.sim.cluster.runner import POLICIES, compare, make_policy, run_policy
from dlrover_kfp.sim.cluster.trace import (
    TraceJob,
    in_regime,
    read_trace,
    synthetic_trace,
    write_trace,
)
from tests.sim.test_engine import HOUR, OOM_AT, QUIET, cluster, even_workers, make_job, template


def test_the_request_regime_sets_each_quota_to_the_totals_of_its_request(tmp_path: Path) -> None:
    jobs = synthetic_trace(40, 3)
    held = in_regime(jobs, "request")
    assert in_regime(jobs, "headroom") == jobs
    for before, after in zip(jobs, held, strict=True):
        w, p = before.workers, before.ps
        assert after.quota.cpu == pytest.approx(w.count * w.cpu + p.count * p.cpu)
        assert after.quota.memory == w.count * w.memory + p.count * p.memory
        assert after.quota.cpu < before.quota.cpu and after.quota.memory < before.quota.memory
        # Nothing but the quota changes.
        resources = dataclasses.replace(after.spec.resources, limits=before.quota)
        spec = dataclasses.replace(after.spec, resources=resources)
        assert dataclasses.replace(after, spec=spec) == before
    # A trace file gets the same transform as a synthetic trace.
    write_trace(tmp_path / "t.jsonl", jobs)
    assert in_regime(read_trace(tmp_path / "t.jsonl"), "request") == held
    with pytest.raises(ValueError, match="regime"):
        in_regime(jobs, "lots")  # type: ignore[arg-type]
    # A request too small to be a spec's limits: an error naming the job, not a traceback.
    tiny = NodeRequest(count=1, cpu=0.25, memory=Mebibytes(512))
    resources = dataclasses.replace(jobs[0].spec.resources, workers=tiny, ps=tiny)
    small = dataclasses.replace(
        jobs[0], id="tiny", spec=dataclasses.replace(jobs[0].spec, resources=resources)
    )
    with pytest.raises(UserInputError, match="job tiny: its request cannot be its quota"):
        in_regime([small], "request")


def outgrown_runs() -> list[TraceJob]:
    """Two runs, 6 hours apart, of a one-worker job whose largest PS outgrows its memory
    request at 56% of the training, under quota = request: the history of the first tells the
    planner the PS need more memory than the quota leaves them, even with the one worker."""
    memory = template().truth.memory
    ps_mb = int(memory.ps_used_mb(OOM_AT, 2))
    runs = [
        make_job(f"run-{k}", arrival_s=k * 6 * HOUR, workers=1, ps_memory_mb=ps_mb)
        for k in range(2)
    ]
    return in_regime(runs, "request")


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_policy_runs_a_trace_whose_quota_is_the_request(name: str) -> None:
    jobs = outgrown_runs()
    policy = make_policy(name)
    result = Simulation(jobs, policy, cluster(), QUIET, seed=0, stragglers=even_workers()).run()
    assert len(result.outcomes) == len(jobs)
    assert all(o.started_at is not None for o in result.outcomes)
    if isinstance(policy, PlannerPolicy):
        # Warm start found the history's needs above the quota and ran the request instead.
        first = [policy.store.get(j.id).plans[0] for j in jobs[1:]]
        assert all(p.stage is Stage.WARM_START and over_quota(p.reason) for p in first), first
        request = (jobs[1].workers.to_group(), jobs[1].ps.to_group())
        assert all((p.workers, p.ps) == request for p in first)
        assert policy.infeasible_jobs >= len(first)  # the first run may hit the quota too
    # Whatever room Stage 3 finds for the PS, a job completes or fails on its OOM limit.
    assert all(o.succeeded or o.reason.startswith("OOMKilled") for o in result.outcomes)


def test_the_comparison_records_its_regime_and_counts_infeasible_jobs() -> None:
    jobs = outgrown_runs()
    summary, _, _ = run_policy("dlrover-kfp", jobs, cluster(), QUIET, seed=0)
    assert summary.infeasible_jobs >= len(jobs) - 1  # at least the warm starts
    manual, _, _ = run_policy("manual", jobs, cluster(), QUIET, seed=0)
    assert manual.infeasible_jobs == 0
    assert compare(jobs, ["manual"], cluster(), QUIET, 0, processes=1).quota == "headroom"
    held = compare(jobs, ["manual"], cluster(), QUIET, 0, processes=1, quota="request")
    assert held.quota == "request"
