"""One quota rule (``core/planner/quota_rule.py``), and every caller agrees (issue 26).

The planner's context, Optimus's and open-source DLRover's bounds read a job's quota from the
same function; before, the peers raised the default quota to the user's request (48 cores for
10 workers x 4 + 2 PS x 4 where the planner had 32), and their starting plans broke the
planner's own quota check. Random specs, with and without ``limits`` and requests.
"""

from __future__ import annotations

import contextlib
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dlrover_kfp.core.plan import ResourcePlan
from dlrover_kfp.core.planner import InfeasiblePlanError, PlannerSettings, context_from_spec
from dlrover_kfp.core.planner.context import PlanningContext
from dlrover_kfp.core.planner.quota_rule import job_quota
from dlrover_kfp.core.planner.settings import DefaultQuota
from dlrover_kfp.core.planner.warm_start import cold_start
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.sim.cluster.policies import dlrover_oss, optimus

S = PlannerSettings()
DEFAULT = DefaultQuota()
_CPU = [0.5, 1.0, 2.0, 4.0, 8.0, 12.0, 16.0]


@st.composite
def specs(draw: st.DrawFn) -> JobSpec:
    """A valid spec: small tables, optional requests, optional limits at 1-3x the request
    (and at least 2 cores, 4 GiB: room for one worker and one PS of these models)."""
    resources: dict[str, Any] = {}
    cpu, memory_gi = 0.0, 0
    for role in ("workers", "ps"):
        if draw(st.booleans()):
            count = draw(st.integers(1, 16))
            pod_cpu = draw(st.sampled_from(_CPU))
            pod_gi = draw(st.integers(1, 16))
            resources[role] = {"count": count, "cpu": pod_cpu, "memory": f"{pod_gi}Gi"}
            cpu, memory_gi = cpu + count * pod_cpu, memory_gi + count * pod_gi
    if draw(st.booleans()):
        factor = draw(st.sampled_from([1, 1.5, 2, 3]))
        resources["limits"] = {
            "cpu": max(2.0, cpu * factor),
            "memory": f"{max(4, int(memory_gi * factor))}Gi",
        }
    min_w, min_p = draw(st.integers(1, 4)), draw(st.integers(1, 2))
    return JobSpec(
        name="job",
        model={"table_sizes": draw(st.lists(st.integers(1_000, 200_000), min_size=1, max_size=4))},  # type: ignore[arg-type]
        data={"format": "synthetic", "rows": 100_000},  # type: ignore[arg-type]
        training={"batch_size": 512},  # type: ignore[arg-type]
        resources=resources,  # type: ignore[arg-type]
        elastic={  # type: ignore[arg-type]
            "min_workers": min_w,
            "max_workers": draw(st.integers(min_w, 40)),
            "min_ps": min_p,
            "max_ps": draw(st.integers(min_p, 15)),
        },
    )


def _quotas(spec: JobSpec) -> dict[str, tuple[float, int]]:
    """Every caller's reading of ``spec``'s quota, (cores, MiB)."""
    ctx = context_from_spec(spec, S)
    opt = optimus.job_bounds(spec)
    oss = dlrover_oss.job_bounds(spec, dlrover_oss.DlroverOssSettings())
    rule = job_quota(spec, S)
    return {
        "rule": (rule.cpu, rule.memory_mb),
        "planner": (ctx.quota_cpu, ctx.quota_memory_mb),
        "optimus": (opt.quota_cpu, opt.quota_memory_mb),
        "dlrover-oss": (oss.quota_cpu, oss.quota_memory_mb),
    }


def _within(ctx: PlanningContext, plan: ResourcePlan) -> bool:
    return ctx.fits(plan.workers, plan.ps)


@settings(max_examples=150, deadline=None, database=None, derandomize=True)
@given(specs())
def test_every_caller_reads_the_one_rule(spec: JobSpec) -> None:
    """limits when set, else the default quota (never the request), in every caller."""
    limits = spec.resources.limits
    expected = (
        (float(limits.cpu), int(limits.memory)) if limits else (DEFAULT.cpu, DEFAULT.memory_mb)
    )
    quotas = _quotas(spec)
    assert set(quotas.values()) == {expected}, quotas


@settings(max_examples=150, deadline=None, database=None, derandomize=True)
@given(specs())
def test_every_start_passes_the_planners_quota_check(spec: JobSpec) -> None:
    """The planner's cold start and each peer's first plan fit the planner's quota."""
    ctx = context_from_spec(spec, S)
    starts = {
        "optimus": optimus.OptimusPolicy().initial(spec, 0.0),
        "dlrover-oss": dlrover_oss.DlroverOssPolicy().initial(spec, 0.0),
    }
    # InfeasiblePlanError: the quota cannot hold this spec's minimum job, said, never planned
    with contextlib.suppress(InfeasiblePlanError):
        starts["planner"] = cold_start(spec, ctx, S)
    outside = {name: plan for name, plan in starts.items() if not _within(ctx, plan)}
    assert not outside, (ctx.quota_cpu, ctx.quota_memory_mb, outside)


def test_the_issue_spec_has_one_quota_and_every_start_fits_it() -> None:
    """Issue 26's case: 10 workers x 4 + 2 PS x 4 cores (48) with no limits: 32 cores for
    every caller (the peers said 48), and every start within them."""
    spec = JobSpec(
        name="job",
        model={"table_sizes": [1000] * 4},  # type: ignore[arg-type]
        data={"format": "synthetic", "rows": 1000},  # type: ignore[arg-type]
        training={"batch_size": 512},  # type: ignore[arg-type]
        resources={  # type: ignore[arg-type]
            "workers": {"count": 10, "cpu": 4, "memory": "8Gi"},
            "ps": {"count": 2, "cpu": 4, "memory": "8Gi"},
        },
    )
    assert set(_quotas(spec).values()) == {(32.0, 128 * 1024)}
    ctx = context_from_spec(spec, S)
    for plan in (
        cold_start(spec, ctx, S),
        optimus.OptimusPolicy().initial(spec, 0.0),
        dlrover_oss.DlroverOssPolicy().initial(spec, 0.0),
    ):
        assert plan.workers.total_cpu + plan.ps.total_cpu <= 32.0, plan


def test_a_capacity_caps_the_rule_per_resource() -> None:
    """On one machine (``capacity``) each resource is the smaller of quota and capacity."""
    spec = JobSpec(
        name="job",
        model={"table_sizes": [1000]},  # type: ignore[arg-type]
        data={"format": "synthetic", "rows": 1000},  # type: ignore[arg-type]
        training={"batch_size": 512},  # type: ignore[arg-type]
        resources={"limits": {"cpu": 8, "memory": "4Gi"}},  # type: ignore[arg-type]
    )
    for capacity, expected in [
        (DefaultQuota(cpu=2.0, memory_mb=64 * 1024), (2.0, 4096)),
        (DefaultQuota(cpu=16.0, memory_mb=2048), (8.0, 2048)),
    ]:
        quota = job_quota(spec, PlannerSettings(capacity=capacity))
        assert (quota.cpu, quota.memory_mb) == expected
