"""The plan step: Stage 1's plan for a job, as a document and as Markdown."""

from __future__ import annotations

from dataclasses import dataclass

from dlrover_kfp.core.plan import ResourcePlan
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.planning import plan_start, with_data_rows
from dlrover_kfp.steps.spec import (
    history_url_or_default,
    load_job_spec,
    planner_for,
    with_data_path,
)


@dataclass(frozen=True, slots=True)
class PlanStepResult:
    spec: JobSpec
    plan: ResourcePlan
    #: the plan for people: what it asks for and why
    markdown: str


def plan_step(
    job_spec: str,
    history_url: str | None = None,
    backend: str = "kubernetes",
    *,
    data_path: str = "",
) -> PlanStepResult:
    """Stage 1's plan for ``job_spec`` from the history at ``history_url`` (the default store
    when empty), with ``backend``'s planner settings. Reads the history; writes nothing.
    ``data_path`` (a pipeline's data location) replaces the spec's, as for the train step
    (:func:`~dlrover_kfp.steps.spec.with_data_path`): the plan sizes the data the run trains."""
    loaded = with_data_path(load_job_spec(job_spec), data_path)
    settings = planner_for(backend)
    spec = with_data_rows(loaded.spec, loaded.base_dir)
    plan, _ = plan_start(spec, history_url_or_default(history_url), settings)
    return PlanStepResult(loaded.spec, plan, plan_markdown(loaded.spec, plan))


def cores(value: float) -> str:
    return f"{value:g}"


def plan_markdown(spec: JobSpec, plan: ResourcePlan) -> str:
    """A short Markdown page: the pods the plan asks for, its stage, reason and sources."""
    lines = [
        f"# Resource plan for `{spec.name}`",
        "",
        f"**Stage:** {plan.stage.value}  ",
        f"**Reason:** {plan.reason}",
        "",
        "| role | pods | CPU per pod (cores) | memory per pod (MiB) |",
        "|---|---:|---:|---:|",
        f"| worker | {plan.workers.count} | {cores(plan.workers.cpu)} | {plan.workers.memory_mb} |",
        f"| PS | {plan.ps.count} | {cores(plan.ps.cpu)} | {plan.ps.memory_mb} |",
        f"| **total** | {plan.workers.count + plan.ps.count} | {cores(plan.total_cpu)} | "
        f"{plan.total_memory_mb} |",
        "",
    ]
    if plan.predicted_throughput is not None:
        lines.append(f"Predicted throughput: {plan.predicted_throughput:,.0f} samples/s.")
    limits = spec.resources.limits
    if limits is not None:
        lines.append(f"Quota: {cores(limits.cpu)} cores, {limits.memory} MiB.")
    if plan.similar_jobs:
        lines += ["", "Warm-started from these runs in the history:", ""]
        lines += [f"- `{run_id}`" for run_id in plan.similar_jobs]
    return "\n".join(lines) + "\n"


__all__ = ["PlanStepResult", "plan_markdown", "plan_step"]
