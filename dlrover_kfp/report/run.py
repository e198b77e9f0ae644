"""The HTML report of one run: what it was given, what it did with it, and why it changed.

:func:`render_run_report` turns a :class:`~dlrover_kfp.core.profile.JobProfile` into one
self-contained page: the outcome, four charts (the resource plan over time, throughput with the
job's events, each pod's CPU and memory used against requested, the resource-performance model
fitted on the run's own samples against what it measured) and the tables of plans and events.
Pure: a profile in, a string out; the CLI writes it.
"""

from __future__ import annotations

from collections.abc import Sequence

from dlrover_kfp.core.observation import Observation
from dlrover_kfp.core.perf_model import FitSettings, PerfModel, fit
from dlrover_kfp.core.plan import NodeGroup
from dlrover_kfp.core.profile import AppliedPlan, JobProfile
from dlrover_kfp.core.summary import cpu_utilisation, summarize
from dlrover_kfp.report import html, plots


def format_seconds(seconds: float) -> str:
    """``87.2 s`` (under 10 minutes), ``13 min 20 s``, ``2 h 05 min`` (from an hour)."""
    if seconds < 600:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes} min {rest:02d} s"
    hours, rest = divmod(round(seconds / 60), 60)
    return f"{hours} h {rest:02d} min"


def group_text(group: NodeGroup) -> str:
    """``2 × 1.5 cores / 2,048 MiB``."""
    return f"{group.count} × {group.cpu:g} cores / {group.memory_mb:,} MiB"


def plan_shape(workers: NodeGroup, ps: NodeGroup) -> str:
    """``2w×1 + 1ps×0.5 = 2.5 cores``."""
    total = workers.total_cpu + ps.total_cpu
    return f"{workers.count}w×{workers.cpu:g} + {ps.count}ps×{ps.cpu:g} = {total:g} cores"


def _optional(value: float | None, pattern: str) -> str:
    return "—" if value is None else pattern.format(value)


def _header(profile: JobProfile) -> list[str]:
    outcome = profile.outcome
    metrics = profile.metrics
    status = outcome.status + (f": {outcome.reason}" if outcome.reason else "")
    throughput = outcome.samples_processed / outcome.jct_seconds if outcome.jct_seconds else None
    utilisation = cpu_utilisation(profile)
    pairs = [
        ("job", profile.job.name),
        ("run id", profile.run_id),
        ("scenario", profile.job.scenario or "—"),
        ("started at", profile.started_at),
        ("outcome", status),
        ("JCT", format_seconds(outcome.jct_seconds)),
        ("samples processed", f"{outcome.samples_processed:,}"),
        ("mean throughput", _optional(throughput, "{:,.0f} samples/s")),
        ("held-out AUC", _optional(metrics.auc, "{:.4f}")),
        ("held-out loss", _optional(metrics.loss, "{:.4f}")),
        ("CPU used / requested", _optional(utilisation, "{:.0%}")),
    ]
    if profile.plans:
        first, last = profile.plans[0], profile.plans[-1]
        pairs.append(("start plan", plan_shape(first.workers, first.ps)))
        pairs.append(("final plan", plan_shape(last.workers, last.ps)))
    if profile.limits is not None:
        enforced = "enforced" if profile.limits.cpu else "NOT enforced"
        detail = f" ({profile.limits.detail})" if profile.limits.detail else ""
        pairs.append(("CPU limits", enforced + detail))
    return [
        html.heading(1, f"Run report: {profile.job.name}"),
        html.paragraph(
            "One run of a dlrover-kfp job: what it was given, what it used, and why its "
            "resources changed.",
            "lead",
        ),
        html.facts(pairs, classes={"outcome": outcome.status}),
    ]


def run_end(profile: JobProfile) -> float:
    """The end of every run chart's time axis (s): the JCT, or a later sample, plan or event."""
    return max(
        [
            profile.outcome.jct_seconds,
            *(s.time for s in profile.samples),
            *(p.time for p in profile.plans),
            *(e.time for e in profile.events),
        ]
    )


def _plan_section(profile: JobProfile) -> list[str]:
    end = run_end(profile)
    limits = profile.job.resources.limits if profile.job.resources else None
    figure = plots.plan_timeline_figure(
        profile.plans, end, quota_cpu=limits.cpu if limits is not None else None
    )
    return [
        html.heading(2, "Resource plan over time"),
        html.paragraph(
            "CPU requested by the workers (count × cores each), the PS and the job in total, "
            "from every plan applied; each change is numbered and labelled with the planner "
            "stage that made it (see the plans table below for its reason).",
            "note",
        ),
        html.inline_svg(plots.render_svg(figure, "plan"), label="resource plan", gid="plot-plan"),
    ]


def _throughput_section(profile: JobProfile) -> list[str]:
    figure = plots.throughput_figure(profile.samples, profile.events, run_end(profile))
    return [
        html.heading(2, "Throughput and events"),
        html.paragraph(
            "Samples per second of all workers together, sample by sample; dotted lines mark "
            "the job's events (relaunches, OOMs, PS migrations, stragglers, scaling, failures).",
            "note",
        ),
        html.inline_svg(
            plots.render_svg(figure, "throughput"), label="throughput", gid="plot-throughput"
        ),
    ]


def _pods_section(profile: JobProfile) -> list[str]:
    figure = plots.pod_usage_figure(
        profile.samples, run_end(profile), name_prefix=f"{profile.job.name}-"
    )
    return [
        html.heading(2, "Pods: CPU and memory used vs requested"),
        html.paragraph(
            "Each pod's use (solid) against its request (dashed): the gap is what the plan "
            "gave and the pod did not use. Workers are blue, PS orange.",
            "note",
        ),
        html.inline_svg(plots.render_svg(figure, "pods"), label="pod usage", gid="plot-pods"),
    ]


def _final_observation(
    observations: Sequence[Observation], plans: Sequence[AppliedPlan]
) -> Observation:
    """The observation at the last plan's shape, else the last one measured."""
    if plans:
        last = plans[-1]
        for o in observations:
            c = o.config
            if (c.workers, c.worker_cpu, c.ps, c.ps_cpu) == (
                last.workers.count,
                last.workers.cpu,
                last.ps.count,
                last.ps.cpu,
            ):
                return o
    return observations[-1]


def fit_run_model(
    observations: Sequence[Observation], settings: FitSettings | None = None
) -> PerfModel | str:
    """The model fitted on a run's observations, or why it could not be.

    A fit needs ``settings.min_configs_for_full_fit`` distinct configurations: with fewer,
    :func:`~dlrover_kfp.core.perf_model.fit` only scales its prior, and a chart of it against
    the one or two points it was scaled on would show a fit that is not one.
    """
    settings = settings or FitSettings()
    configs = {(o.config, o.batch_size) for o in observations}
    needed = settings.min_configs_for_full_fit
    if len(configs) < needed:
        return (
            f"The model was not fitted: the run measured its throughput at {len(configs)} "
            f"configuration(s), and a fit needs at least {needed}. A run that the planner "
            "resized more often, or a longer one, measures more."
        )
    try:
        return fit(observations, settings=settings)
    except ValueError as exc:
        return f"The model was not fitted: {exc}"


def _model_section(profile: JobProfile) -> list[str]:
    observations = summarize(profile).observations
    out = [html.heading(2, "Resource-performance model")]
    model = fit_run_model(observations)
    if isinstance(model, str):
        out.append(f'<p class="missing" id="model-not-fitted">{html.text(model)}</p>')
        return out
    diagnostics = model.diagnostics
    described = [
        f"{len(observations)} configurations",
        f"{'overlap' if model.overlap else 'additive'} form",
        f"γ = {model.gamma:.2f}",
    ]
    if diagnostics is not None:
        described.append(f"relative RMSE {diagnostics.rmse_relative:.1%}")
        if diagnostics.scale_only:
            described.append("only a scale on the prior")
    out.append(
        html.paragraph(
            "The model of docs/model.md fitted (NNLS) on this run's mean throughput per "
            "configuration: " + ", ".join(described) + ". Points on the diagonal are "
            "predicted exactly; the curve is what the model expects of the final shape with "
            "more or less CPU per pod.",
            "note",
        )
    )
    if profile.limits is not None and not profile.limits.cpu:
        out.append(
            html.paragraph(
                "CPU limits were not enforced in this run: a pod could use more CPU than it "
                "requested, so the fit says little about what a request buys.",
                "missing",
            )
        )
    figure = plots.model_fit_figure(
        observations, model, curve_through=_final_observation(observations, profile.plans)
    )
    out.append(html.inline_svg(plots.render_svg(figure, "model"), label="model", gid="plot-model"))
    return out


def _tables(profile: JobProfile) -> list[str]:
    out = [html.heading(2, "Plans applied")]
    if profile.plans:
        out.append(
            html.table(
                ("#", "time", "stage", "reason", "workers", "PS"),
                [
                    (
                        str(i + 1),
                        f"{p.time:.1f} s",
                        p.stage.value,
                        p.reason,
                        group_text(p.workers),
                        group_text(p.ps),
                    )
                    for i, p in enumerate(profile.plans)
                ],
                cls="plans",
                wrap=(3,),
            )
        )
    else:
        out.append(html.paragraph("No plan was recorded.", "note"))
    out.append(html.heading(2, "Events"))
    if profile.events:
        out.append(
            html.table(
                ("time", "kind", "pod", "detail"),
                [
                    (f"{e.time:.1f} s", e.kind, e.node or "—", e.detail)
                    for e in sorted(profile.events, key=lambda e: e.time)
                ],
                cls="events",
                wrap=(3,),
            )
        )
    else:
        out.append(html.paragraph("No events: no relaunch, OOM, migration or straggler.", "note"))
    return out


def render_run_report(profile: JobProfile) -> str:
    """The self-contained HTML report of one run (see the module's docstring)."""
    body = [
        *_header(profile),
        *_plan_section(profile),
        *_throughput_section(profile),
        *_pods_section(profile),
        *_model_section(profile),
        *_tables(profile),
    ]
    return html.page(f"dlrover-kfp run {profile.run_id}", body)
