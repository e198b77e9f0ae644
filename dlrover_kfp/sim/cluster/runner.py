"""Running several policies over the same trace, side by side, one process per policy.

Each policy gets its own fresh instance (and so its own history) and its own copy of the
cluster; the trace, the cluster size, the fault rates and the seed are the same for all, so the
policies meet the same arrivals, the same node failures' rates and the same straggler draws.

The quota regime (:data:`~dlrover_kfp.sim.cluster.trace.QuotaRegime`) is applied to the trace
once, before any policy sees it: every policy, manual included, meets the same quotas.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from dlrover_kfp.core.planner.settings import PlannerSettings
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.sim.cluster.api import Policy
from dlrover_kfp.sim.cluster.engine import ClusterSettings, FaultSettings, Simulation
from dlrover_kfp.sim.cluster.policies.oracle import (
    OraclePolicy,
    reference_name,
    reference_share,
)
from dlrover_kfp.sim.cluster.results import PolicySummary, summarize
from dlrover_kfp.sim.cluster.trace import QuotaRegime, TraceJob, in_regime


def _manual() -> Policy:
    from dlrover_kfp.sim.cluster.policies.manual import ManualPolicy  # noqa: PLC0415

    return ManualPolicy()


def _optimus() -> Policy:
    from dlrover_kfp.sim.cluster.policies.optimus import OptimusPolicy  # noqa: PLC0415

    return OptimusPolicy()


def _dlrover_oss() -> Policy:
    from dlrover_kfp.sim.cluster.policies.dlrover_oss import DlroverOssPolicy  # noqa: PLC0415

    return DlroverOssPolicy()


def _ours(settings: PlannerSettings | None = None) -> Policy:
    from dlrover_kfp.sim.cluster.policies.planner import PlannerPolicy  # noqa: PLC0415

    return PlannerPolicy(settings)


POLICIES: dict[str, Callable[[], Policy]] = {
    "manual": _manual,
    "optimus": _optimus,
    "dlrover-oss": _dlrover_oss,
    "dlrover-kfp": _ours,
}


def parse_policies(text: str) -> list[str]:
    """Policy names, the four peers (:data:`POLICIES`) and the truth-given references
    ``oracle-<a>`` (opt-in; :mod:`~dlrover_kfp.sim.cluster.policies.oracle`), a reference's
    name in its one spelling (``oracle-0.90`` is ``oracle-0.9``), each once (the results are
    keyed by name)."""
    names: list[str] = []
    unknown: list[str] = []
    for name in (n.strip() for n in text.split(",")):
        share = reference_share(name)
        if name in POLICIES:
            known = name
        elif share is not None:
            known = reference_name(share)
        else:
            unknown += [name] if name else []
            continue
        if known not in names:
            names.append(known)
    if unknown or not names:
        raise UserInputError(
            f"--policies: unknown policy {', '.join(unknown) or '(none)'}; choose from "
            f"{', '.join(POLICIES)} or a reference oracle-<a>, a in (0, 1] (oracle-0.9)"
        )
    return names


@dataclass(frozen=True, slots=True)
class Comparison:
    seed: int
    summaries: tuple[PolicySummary, ...]
    #: the quota regime the policies ran under
    quota: QuotaRegime
    #: per policy: the outcomes and utilisation series, for plots
    jct_minutes: dict[str, list[float]]
    utilisation: dict[str, list[tuple[float, float, float]]]  # (hour, cpu util, memory util)


def make_policy(
    name: str,
    planner: PlannerSettings | None = None,
    *,
    jobs: Sequence[TraceJob] = (),
    cluster: ClusterSettings | None = None,
) -> Policy:
    """A fresh instance of policy ``name``; ``planner`` configures dlrover-kfp; a reference
    (``oracle-<a>``) is handed the trace's ``jobs``, truths included, and the ``cluster``."""
    share = reference_share(name)
    if share is not None:
        if cluster is None:
            raise ValueError(f"{name}: a reference policy needs the cluster and the jobs")
        return OraclePolicy(jobs, cluster, share)
    return _ours(planner) if name == "dlrover-kfp" else POLICIES[name]()


def run_policy(
    name: str,
    jobs: Sequence[TraceJob],
    cluster: ClusterSettings,
    faults: FaultSettings,
    seed: int,
    planner: PlannerSettings | None = None,
) -> tuple[PolicySummary, list[float], list[tuple[float, float, float]]]:
    policy = make_policy(name, planner, jobs=jobs, cluster=cluster)
    result = Simulation(jobs, policy, cluster, faults, seed=seed).run()
    # Only the policy knows where its planner fell back for the quota (dlrover-kfp counts it).
    summary = dataclasses.replace(
        summarize(result), infeasible_jobs=getattr(policy, "infeasible_jobs", 0)
    )
    jct = sorted(o.jct / 60 for o in result.outcomes if o.succeeded and o.jct is not None)
    series = [
        (
            u.time / 3600,
            u.cpu_used / u.cpu_allocated if u.cpu_allocated else 0.0,
            u.memory_used_mb / u.memory_allocated_mb if u.memory_allocated_mb else 0.0,
        )
        for u in result.utilisation
    ]
    return summary, jct, series


def compare(
    jobs: Sequence[TraceJob],
    policies: Sequence[str],
    cluster: ClusterSettings,
    faults: FaultSettings,
    seed: int,
    *,
    processes: int | None = None,
    progress: Callable[[str], None] | None = None,
    planner: PlannerSettings | None = None,
    quota: QuotaRegime = "headroom",
) -> Comparison:
    """Every policy over ``jobs`` under quota regime ``quota``; in parallel processes when more
    than one core is free."""
    jobs = in_regime(jobs, quota)
    workers = processes or min(len(policies), os.cpu_count() or 1)
    summaries: dict[str, PolicySummary] = {}
    jcts: dict[str, list[float]] = {}
    series: dict[str, list[tuple[float, float, float]]] = {}
    if workers <= 1:
        for name in policies:
            summaries[name], jcts[name], series[name] = run_policy(
                name, jobs, cluster, faults, seed, planner
            )
            if progress:
                progress(f"seed {seed}: {name} done")
    else:
        with ProcessPoolExecutor(workers) as pool:
            futures = {
                name: pool.submit(run_policy, name, list(jobs), cluster, faults, seed, planner)
                for name in policies
            }
            for name, future in futures.items():
                summaries[name], jcts[name], series[name] = future.result()
                if progress:
                    progress(f"seed {seed}: {name} done")
    return Comparison(
        seed=seed,
        summaries=tuple(summaries[n] for n in policies),
        quota=quota,
        jct_minutes=jcts,
        utilisation=series,
    )
