"""Fitting a plan into the quota (core/planner/quota.py): the order of the cuts and the bound."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from dlrover_kfp.core.footprint import RUNTIME_MB
from dlrover_kfp.core.plan import NodeGroup
from dlrover_kfp.core.planner import InfeasiblePlanError, PlannerSettings
from dlrover_kfp.core.planner.context import PlanningContext
from dlrover_kfp.core.planner.quota import fit_to_quota, require_quota_fit
from dlrover_kfp.core.planner.settings import NodeLimits

NODE = PlannerSettings().node


def _g(count: int, cpu: float, memory_mb: int) -> NodeGroup:
    return NodeGroup(count=count, cpu=cpu, memory_mb=memory_mb)


def _ctx(
    cpu: float, memory_mb: int = 256 * 1024, node: NodeLimits = NODE, **bounds: int
) -> PlanningContext:
    return PlanningContext(
        quota_cpu=cpu,
        quota_memory_mb=memory_mb,
        min_workers=bounds.get("min_workers", 1),
        max_workers=bounds.get("max_workers", 64),
        min_ps=bounds.get("min_ps", 1),
        max_ps=bounds.get("max_ps", 16),
        batch_size=512,
        worker_memory_floor_mb=1024,
        ps_state_mb=2048,
        dataset_rows=None,
        node=node,
    )


def test_a_plan_within_the_quota_is_unchanged() -> None:
    workers, ps = _g(4, 2.0, 4096), _g(2, 1.0, 4096)
    fitted = fit_to_quota(workers, ps, _ctx(10))
    assert (fitted.workers, fitted.ps, fitted.fits, fitted.cut) == (workers, ps, True, False)
    assert fitted.note() == ""


def test_workers_are_given_up_first() -> None:
    fitted = fit_to_quota(_g(8, 2.0, 4096), _g(2, 2.0, 4096), _ctx(12), max_trim=0.0)
    assert (fitted.workers.count, fitted.workers.cpu, fitted.ps) == (
        4,
        2.0,
        _g(2, 2.0, 4096),
    )
    assert fitted.workers_given_up == 4 and not fitted.cpu_cut
    assert "4 worker(s) given up" in fitted.note()


def test_a_small_cpu_trim_is_taken_instead_of_a_worker() -> None:
    # 2 x 1 + 2 x 0.25 = 2.5 under 2 (a quickstart round's warm start): giving up a worker
    # would leave 0.5 of the 2 cores idle; trimming 20% keeps both workers at 0.75.
    fitted = fit_to_quota(
        _g(2, 1.0, 4096), _g(2, 0.25, 4096), _ctx(2, node=NodeLimits(min_cpu=0.25, cpu_step=0.25))
    )
    assert (fitted.workers.count, fitted.workers.cpu, fitted.ps.cpu) == (2, 0.75, 0.25)
    assert fitted.fits and fitted.workers_given_up == 0 and fitted.cpu_cut
    # 8 x 2 + 2 x 2 = 20 under 12 needs 40%: more than a trim, so workers go first (to 6,
    # where a 25% trim fits: 6 x 1.5 + 2 x 1.5 = 12)
    fitted = fit_to_quota(_g(8, 2.0, 4096), _g(2, 2.0, 4096), _ctx(12))
    assert (fitted.workers.count, fitted.workers.cpu, fitted.ps.cpu) == (6, 1.5, 1.5)
    assert fitted.workers_given_up == 2 and fitted.fits


def test_then_cpu_shrinks_in_proportion_then_by_steps() -> None:
    # 1 worker x 3 + 3 PS x 0.5 = 4.5 under 4 (the seed-370 case of the old test).
    fitted = fit_to_quota(_g(1, 3.0, 4096), _g(3, 0.5, 4096), _ctx(4))
    assert fitted.fits and fitted.workers.total_cpu + fitted.ps.total_cpu <= 4
    assert (fitted.workers.cpu, fitted.ps.cpu) == (2.5, 0.5)
    assert fitted.ps.count == 3 and fitted.cpu_cut


def test_then_ps_are_given_up_with_their_rows_repartitioned() -> None:
    ps = _g(4, 0.5, RUNTIME_MB + 1024)
    fitted = fit_to_quota(_g(1, 0.5, 2048), ps, _ctx(1.5))
    assert fitted.fits and fitted.ps.count == 2 and fitted.ps_given_up == 2
    # 4 x 1024 MiB of rows over 2 PS: each holds 2048 (rounded up to the memory step).
    assert fitted.ps.memory_mb >= RUNTIME_MB + 2048
    kept = dataclasses.replace(_ctx(1.5), min_ps=4)
    assert not fit_to_quota(_g(1, 0.5, 2048), ps, kept).fits
    assert not fit_to_quota(_g(1, 0.5, 2048), ps, _ctx(1.5), drop_ps=False).fits


def test_memory_is_never_cut() -> None:
    fitted = fit_to_quota(_g(4, 1.0, 8192), _g(1, 1.0, 8192), _ctx(64, 20_000))
    assert fitted.workers.memory_mb == 8192 and fitted.ps.memory_mb == 8192
    assert fitted.workers.count == 1 and fitted.fits


def test_the_minimum_job_above_the_quota_is_a_clear_error() -> None:
    with pytest.raises(InfeasiblePlanError) as info:
        require_quota_fit(_g(3, 1.0, 2048), _g(1, 1.0, 2048), _ctx(1, min_workers=2))
    message = str(info.value)
    assert "quota (cpu 1, memory 262144Mi) cannot hold the smallest job" in message
    assert "2 worker(s) of 0.5 cpu" in message and "min_workers" in message


def test_property_never_above_a_quota_that_can_hold_the_minimum_job() -> None:
    # 2,000 random plans and quotas of 1-64 CPU: within the quota whenever the smallest job
    # (min workers and min PS at the node's minimum CPU, memory as planned) fits, and then never
    # below the bounds; otherwise fits is false, never a silent plan above the quota.
    rng = random.Random(7)
    for case in range(2000):
        ctx = _ctx(
            round(rng.uniform(1, 64) * 2) / 2,
            rng.choice([16, 64, 256]) * 1024,
            min_workers=rng.randint(1, 3),
            min_ps=rng.randint(1, 2),
        )
        workers = _g(rng.randint(1, 40), rng.choice([0.5, 1, 2, 3.5, 8, 16]), 2048)
        ps = _g(rng.randint(2, 8), rng.choice([0.5, 1, 2, 4, 8]), RUNTIME_MB + 1024)
        workers = dataclasses.replace(workers, count=max(workers.count, ctx.min_workers))
        fitted = fit_to_quota(workers, ps, ctx)
        w, p = fitted.workers, fitted.ps
        smallest_cpu = (ctx.min_workers + ctx.min_ps) * NODE.min_cpu
        where = f"case {case}: {ctx.quota_cpu} cpu {ctx.quota_memory_mb}Mi -> {w} {p}"
        # The smallest job's memory: min workers as planned, min PS holding all the rows, each
        # PS's figure rounded up to the 256 MiB step.
        per_ps = RUNTIME_MB + math.ceil(ps.count * 1024 / ctx.min_ps)
        per_ps = math.ceil(per_ps / 256) * 256
        smallest_mb = ctx.min_workers * 2048 + ctx.min_ps * per_ps
        if smallest_cpu <= ctx.quota_cpu and smallest_mb <= ctx.quota_memory_mb:
            assert fitted.fits, where
        if fitted.fits:
            assert w.total_cpu + p.total_cpu <= ctx.quota_cpu + 1e-9, where
            assert w.total_memory_mb + p.total_memory_mb <= ctx.quota_memory_mb, where
        assert w.count >= ctx.min_workers and p.count >= ctx.min_ps, where
        assert w.cpu >= NODE.min_cpu and p.cpu >= NODE.min_cpu, where
        # The rows are all still held.
        assert p.count * (p.memory_mb - RUNTIME_MB) >= ps.count * 1024, where
