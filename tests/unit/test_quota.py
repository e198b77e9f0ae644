"""Fitting a plan into the quota (core/planner/quota.py): the order of the cuts and the bound."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import random
import types

import pytest

from dlrover_kfp import planning
from dlrover_kfp.core.footprint import RUNTIME_MB, min_ps_memory_mb, min_worker_memory_mb
from dlrover_kfp.core.plan import NodeGroup
from dlrover_kfp.core.planner import (
    InfeasiblePlanError,
    PlannerSettings,
    cold_start,
    context_from_spec,
)
from dlrover_kfp.core.planner.context import PlanningContext
from dlrover_kfp.core.planner.quota import (
    BelowMinimumError,
    at_least_minimum,
    fit_to_quota,
    require_quota_fit,
    require_runnable,
)
from dlrover_kfp.core.planner.settings import DefaultQuota, NodeLimits
from dlrover_kfp.core.spec import JobSpec, ResourcesSpec
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.planning import local_planner_settings, machine_capacity, plan_start

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
        worker_memory_need_mb=900,
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


# -- the minimums every plan applied must clear (require_runnable) -----------------------------


def _spec_ctx(
    tables: list[int], limits: dict[str, object] | None = None
) -> tuple[JobSpec, PlanningContext]:
    spec = JobSpec(
        name="m",
        model={"table_sizes": tables},  # type: ignore[arg-type]
        data={"format": "synthetic", "rows": 1000},  # type: ignore[arg-type]
        training={"batch_size": 128},  # type: ignore[arg-type]
        resources={"limits": limits} if limits else {},  # type: ignore[arg-type]
    )
    return spec, context_from_spec(spec, PlannerSettings())


def test_a_plan_at_the_models_minimum_runs_and_one_mib_less_is_refused_naming_the_numbers() -> None:
    # 4M rows x 16 dims x 4 B x 2 (Adagrad) x 2 (snapshot) = 977 MiB of PS state. The planner
    # plans with RUNTIME_MB; a refusal is sure only below the measured low end, 256 MiB.
    spec, ctx = _spec_ctx([4_000_000])
    assert ctx.ps_memory_floor_mb(1) == RUNTIME_MB + 977 == min_ps_memory_mb(spec.model, 1)
    need_ps = 256 + 977
    need_w = min_worker_memory_mb(spec.model, spec.training) - (RUNTIME_MB - 256)
    require_runnable(_g(1, 1, need_w), _g(1, 1, need_ps), ctx, limits=None, source="x")
    with pytest.raises(BelowMinimumError) as err:
        require_runnable(_g(1, 1, need_w), _g(1, 1, need_ps - 1), ctx, limits=None, source="--plan")
    message = str(err.value)
    assert message.startswith("--plan: ps: ")
    assert f"{need_ps - 1}Mi each, but with 1 PS each needs at least {need_ps}Mi" in message
    assert "workers" not in message  # only the role that is short
    assert isinstance(err.value, UserInputError)  # exit 2, no traceback
    with pytest.raises(BelowMinimumError, match=f"workers: 256Mi each, .* at least {need_w}Mi"):
        require_runnable(_g(2, 1, 256), _g(2, 1, need_ps), ctx, limits=None, source="x")
    # More PS hold the rows in less memory each: 2 PS of the 1-PS figure minus a half are fine.
    require_runnable(_g(1, 1, need_w), _g(2, 1, need_ps - 488), ctx, limits=None, source="x")


def test_a_model_too_big_for_its_pods_is_refused_with_a_clear_reason() -> None:
    """table_sizes [2000000000] once failed as "Error (exit code 1)" in a 2Gi PS."""
    _, ctx = _spec_ctx([2_000_000_000])
    with pytest.raises(BelowMinimumError) as err:
        require_runnable(_g(1, 1, 2048), _g(1, 1, 2048), ctx, limits=None, source="resources")
    message = str(err.value)
    # 2e9 rows x 16 x 4 B x 2 x 2: 476.8 GiB of state and the runtime, halved by a second PS
    assert "ps: 2048Mi each, but with 1 PS each needs at least 488538Mi" in message
    assert "with 2 PS each needs 244397Mi" in message


def test_a_plan_above_the_users_limits_is_refused() -> None:
    spec, ctx = _spec_ctx([1000], {"cpu": 4, "memory": "8Gi"})
    limits = spec.resources.limits
    require_runnable(_g(2, 1, 2048), _g(2, 1, 2048), ctx, limits=limits, source="x")
    with pytest.raises(BelowMinimumError, match=r"cpu 6 and memory 8192Mi, more than"):
        require_runnable(_g(4, 1, 1024), _g(2, 1, 2048), ctx, limits=limits, source="--plan")


def test_stage_3_never_takes_a_pod_below_its_minimum() -> None:
    _, ctx = _spec_ctx([4_000_000])
    low = _g(1, 1, 1024)
    assert at_least_minimum(low, "ps", ctx) == _g(1, 1, ctx.ps_memory_floor_mb(1))
    assert at_least_minimum(low, "worker", ctx) == low  # a worker of this model needs less
    assert at_least_minimum(_g(1, 1, 9999), "ps", ctx).memory_mb == 9999


def test_a_machine_caps_the_quota_the_planner_plans_in() -> None:
    spec, _ = _spec_ctx([1000], {"cpu": 64, "memory": "256Gi"})
    capped = dataclasses.replace(PlannerSettings(), capacity=DefaultQuota(cpu=2, memory_mb=8192))
    ctx = context_from_spec(spec, capped)
    assert (ctx.quota_cpu, ctx.quota_memory_mb) == (2, 8192)
    # A spec without resources plans a cluster's cold start (4 cpu a pod, 12 cores): cut to 2.
    plan = cold_start(dataclasses.replace(spec, resources=ResourcesSpec()), ctx, capped)
    assert plan.workers.total_cpu + plan.ps.total_cpu <= 2
    assert "cut to the quota" in plan.reason


def test_the_local_backend_plans_within_this_machine_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A spec without resources once started 12 cores of pods on a 2-core machine."""
    spec, _ = _spec_ctx([1000, 2000])
    machine_capacity.cache_clear()
    caplog.set_level(logging.INFO, logger="dlrover_kfp.planning")
    cores = len(os.sched_getaffinity(0))
    for _ in range(2):
        plan, _ = plan_start(spec, None, local_planner_settings())
        assert plan.workers.total_cpu + plan.ps.total_cpu <= cores
    said = [r.getMessage() for r in caplog.records if "capped at this machine" in r.getMessage()]
    assert len(said) == 1 and f"{cores:g} cores" in said[0]


def test_the_local_backend_plans_within_the_memory_available_not_the_total(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """24 GiB in the machine, 3 GiB available (other processes hold the rest): plans are
    capped at the 3 GiB (they were capped at the total, and the kernel killed the pods)."""
    gib = 2**30
    memory = types.SimpleNamespace(total=24 * gib, available=3 * gib)
    monkeypatch.setattr(planning.psutil, "virtual_memory", lambda: memory)
    machine_capacity.cache_clear()
    try:
        assert machine_capacity().memory_mb == 3072
        assert local_planner_settings().capacity.memory_mb == 3072
    finally:
        machine_capacity.cache_clear()
