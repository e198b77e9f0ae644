"""The page of one scenario: does scheduled retraining get better from run to run?

:func:`render_scenario_report` lays a scenario's runs out in the order they started: the JCT of
each, the share of its requested CPU it used, and the plan it started with against the one it
ended with. A warm start that learns from the history shows as a start plan that moves towards
the final one, CPU utilisation that rises and a JCT that holds or falls.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from dlrover_kfp.core.plan import NodeGroup
from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.core.summary import cpu_utilisation, parse_timestamp, summarize
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.report import html, plots
from dlrover_kfp.report.run import format_seconds, plan_shape


def start_groups(profile: JobProfile) -> tuple[NodeGroup, NodeGroup]:
    """What the run started with: its first plan, else the spec's own resources, else its
    final shape (a run that recorded neither)."""
    if profile.plans:
        return profile.plans[0].workers, profile.plans[0].ps
    request = profile.job.resources
    if request is not None and request.workers is not None and request.ps is not None:
        return request.workers.to_group(), request.ps.to_group()
    summary = summarize(profile)
    return summary.workers, summary.ps


def _compact(workers: NodeGroup, ps: NodeGroup) -> str:
    return f"{workers.count}w×{workers.cpu:g} + {ps.count}ps×{ps.cpu:g}"


def _start_labels(profiles: Sequence[JobProfile]) -> list[str]:
    """Start times to the minute (UTC), or to the second when two runs share a minute."""
    moments = [datetime.fromtimestamp(parse_timestamp(p.started_at), UTC) for p in profiles]
    minutes = [m.strftime("%Y-%m-%d %H:%M") for m in moments]
    if len(set(minutes)) == len(minutes):
        return minutes
    return [m.strftime("%Y-%m-%d %H:%M:%S") for m in moments]


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def _trend(first: float, last: float) -> str:
    if first <= 0:
        return ""
    return f" ({(last - first) / first:+.0%})"


def render_scenario_report(profiles: Sequence[JobProfile], scenario: str) -> str:
    """The self-contained HTML page of ``scenario``'s runs (the caller selects them).

    Raises :class:`~dlrover_kfp.errors.UserInputError` when ``profiles`` is empty.
    """
    if not profiles:
        raise UserInputError(f"no runs of scenario {scenario!r} in the history")
    ordered = sorted(profiles, key=lambda p: (parse_timestamp(p.started_at), p.run_id))
    points: list[plots.RunPoint] = []
    rows: list[tuple[str, ...]] = []
    started = _start_labels(ordered)
    for index, profile in enumerate(ordered, start=1):
        summary = summarize(profile)
        start_w, start_p = start_groups(profile)
        utilisation = cpu_utilisation(profile)
        outcome = profile.outcome
        points.append(
            plots.RunPoint(
                label=f"#{index}  {started[index - 1]}",
                jct_s=outcome.jct_seconds,
                succeeded=outcome.status == "succeeded",
                cpu_utilisation=utilisation,
                start_cpu=start_w.total_cpu + start_p.total_cpu,
                final_cpu=summary.workers.total_cpu + summary.ps.total_cpu,
                start_shape=_compact(start_w, start_p),
                final_shape=_compact(summary.workers, summary.ps),
            )
        )
        throughput = outcome.samples_processed / outcome.jct_seconds if outcome.jct_seconds else 0
        auc = profile.metrics.auc
        rows.append(
            (
                str(index),
                profile.run_id,
                started[index - 1],
                outcome.status + (f": {outcome.reason}" if outcome.reason else ""),
                format_seconds(outcome.jct_seconds),
                f"{throughput:,.0f} samples/s",
                _percent(utilisation),
                plan_shape(start_w, start_p),
                plan_shape(summary.workers, summary.ps),
                "—" if auc is None else f"{auc:.4f}",
            )
        )
    first, last = points[0], points[-1]
    unit = plots.time_unit(max(first.jct_s, last.jct_s))
    verdict = (
        f"From the first run to the last: JCT {first.jct_s / unit.seconds:.1f} → "
        f"{last.jct_s / unit.seconds:.1f} {unit.label}{_trend(first.jct_s, last.jct_s)}, "
        "CPU used / requested "
        f"{_percent(first.cpu_utilisation)} → {_percent(last.cpu_utilisation)}, start plan "
        f"{first.start_cpu:g} → {last.start_cpu:g} cores."
        if len(points) > 1
        else "One run so far: the trend shows from the second run on."
    )
    figure = plots.scenario_figure(points)
    body = [
        html.heading(1, f"Scenario {scenario}: {len(points)} run(s)"),
        html.paragraph(
            "Does scheduled retraining get better? Each run is planned from the history of "
            "the runs before it (warm start); a plan that learns shows as a start plan close "
            "to the final one, CPU utilisation that rises and a JCT that holds or falls.",
            "lead",
        ),
        html.paragraph(verdict),
        html.inline_svg(
            plots.render_svg(figure, "scenario"), label=f"scenario {scenario}", gid="plot-scenario"
        ),
        html.paragraph(
            "JCT: job completion time. CPU used / requested: cores used over cores requested, "
            "summed over every sample and pod of the run. Start plan: the first plan applied; "
            "final plan: the last (labelled on the chart).",
            "note",
        ),
        html.heading(2, "Runs, oldest first"),
        html.table(
            (
                "#",
                "run id",
                "started (UTC)",
                "outcome",
                "JCT",
                "mean throughput",
                "CPU used / requested",
                "start plan",
                "final plan",
                "AUC",
            ),
            rows,
            cls="runs",
            wrap=(3, 7, 8),
        ),
    ]
    return html.page(f"dlrover-kfp scenario {scenario}", body)
