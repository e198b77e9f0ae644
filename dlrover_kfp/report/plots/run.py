"""A run's charts, for its report: the plan over time, throughput with the job's events, each
pod's use against its request, and the fitted model against what the run measured.

The three charts over time share fixed margins (:func:`.style._time_chart`), so that a moment
lines up from one chart to the next.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, MaxNLocator

from dlrover_kfp.core.observation import Observation
from dlrover_kfp.core.perf_model import PerfModel
from dlrover_kfp.core.profile import AppliedPlan, JobEvent, RuntimeSample
from dlrover_kfp.report.plots.series import TimeUnit, _series, time_unit
from dlrover_kfp.report.plots.style import (
    _POD_SHADES,
    _WIDTH,
    EVENT_STYLES,
    ROLE_COLOURS,
    _empty_note,
    _legend_right,
    _styled,
    _time_chart,
    new_figure,
)


def _shape(workers: int, worker_cpu: float, ps: int, ps_cpu: float) -> str:
    return f"{workers}w×{worker_cpu:g} + {ps}ps×{ps_cpu:g}"


# ------------------------------------------------------------------- a run: the plan


def _time_axis(ax: Axes, end_s: float) -> TimeUnit:
    """Label ``ax``'s x axis as time since the job started, 0 to ``end_s``; the unit used."""
    end = end_s if end_s > 0 else 1.0
    unit = time_unit(end)
    ax.set_xlim(0.0, end / unit.seconds)
    ax.set_xlabel(f"time since job start ({unit.label})")
    return unit


@_styled
def plan_timeline_figure(
    plans: Sequence[AppliedPlan], end_s: float, *, quota_cpu: float | None = None
) -> Figure:
    """CPU requested over the run, a step line per role and for the total, from the plans.

    Each plan holds from its time to the next plan's (the last to ``end_s``); each change is
    numbered and annotated with the stage that made it. ``quota_cpu``: the job's CPU limit,
    drawn dotted. The PS line is dashed, so that it does not hide the workers' where the two
    request the same.
    """
    figure, (ax,) = _time_chart(3.4)
    figure.set_label("plan")
    end = max([end_s, *(p.time for p in plans)])
    unit = _time_axis(ax, end)
    ax.set_ylabel("CPU requested (cores)")
    if not plans:
        _empty_note(ax, "no plan recorded")
        return figure
    xs = [p.time / unit.seconds for p in plans] + [end / unit.seconds]
    series = {
        "worker": [p.workers.total_cpu for p in plans],
        "ps": [p.ps.total_cpu for p in plans],
        "total": [p.workers.total_cpu + p.ps.total_cpu for p in plans],
    }
    labels = {"worker": "workers × CPU", "ps": "PS × CPU", "total": "total CPU requested"}
    styles = {"worker": "-", "ps": "--", "total": "-"}
    handles: list[Line2D] = []
    for role, values in series.items():
        (line,) = ax.step(
            xs,
            [*values, values[-1]],
            where="post",
            color=ROLE_COLOURS[role],
            linestyle=styles[role],
            linewidth=2.2 if role == "total" else 1.6,
            gid=f"plan-{role}",
            label=labels[role],
        )
        handles.append(line)
    top = max(series["total"])
    if quota_cpu is not None:
        line = ax.axhline(
            quota_cpu,
            color="#999999",
            linestyle=":",
            linewidth=1.2,
            gid="plan-quota",
            label=f"quota ({quota_cpu:g} cores)",
        )
        handles.append(line)
        top = max(top, quota_cpu)
    ax.set_ylim(0.0, top * 1.3 if top > 0 else 1.0)
    ax.yaxis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
    ax.plot(
        xs[:-1],
        series["total"],
        linestyle="none",
        marker="o",
        markersize=4,
        color=ROLE_COLOURS["total"],
        gid="plan-changes",
    )
    for index, plan in enumerate(plans):
        ax.annotate(
            f"{index + 1} {plan.stage.value}",
            xy=(plan.time / unit.seconds, series["total"][index]),
            xytext=(4, 5),
            textcoords="offset points",
            rotation=35,
            rotation_mode="anchor",
            fontsize=8,
            color="#333333",
            annotation_clip=False,
            gid=f"plan-stage-{index + 1}",
        )
    _legend_right(figure, handles)
    return figure


# ------------------------------------------------------ a run: throughput and events


@_styled
def throughput_figure(
    samples: Sequence[RuntimeSample], events: Sequence[JobEvent], end_s: float
) -> Figure:
    """Samples/s over time (0 to ``end_s``), the job's events as dotted vertical lines.

    Each event kind has its colour and marker (:data:`EVENT_STYLES`), drawn along the top in
    a row of its own so that two kinds at the same moment stay apart; the legend counts them.
    """
    figure, (ax,) = _time_chart(3.2)
    figure.set_label("throughput")
    end = max([end_s, *(s.time for s in samples), *(e.time for e in events)])
    unit = _time_axis(ax, end)
    ax.set_ylabel("throughput (samples/s)")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
    handles: list[Line2D] = []
    top = 0.0
    if samples:
        xs, ys = _series([s.time / unit.seconds for s in samples], [s.throughput for s in samples])
        (line,) = ax.plot(
            xs,
            ys,
            color=ROLE_COLOURS["worker"],
            marker=".",
            markersize=5,
            gid="throughput",
            label="samples/s (all workers)",
        )
        handles.append(line)
        top = max((y for y in ys if not math.isnan(y)), default=0.0)
    else:
        _empty_note(ax, "no runtime samples")
    kinds = [kind for kind in EVENT_STYLES if any(e.kind == kind for e in events)]
    top = top if top > 0 else 1.0
    # room above the data for one row of markers per kind present
    ax.set_ylim(0.0, top * (1.08 + 0.07 * len(kinds)))
    for row, kind in enumerate(kinds):
        style = EVENT_STYLES[kind]
        times = [e.time / unit.seconds for e in events if e.kind == kind]
        for t in times:
            ax.axvline(t, color=style.colour, linestyle=":", linewidth=1.1)
        ax.plot(
            times,
            [top * (1.04 + 0.07 * row)] * len(times),
            linestyle="none",
            marker=style.marker,
            markersize=6,
            color=style.colour,
            gid=f"event-{kind}",
        )
        handles.append(
            Line2D(
                [],
                [],
                color=style.colour,
                linestyle=":",
                marker=style.marker,
                label=f"{style.label} ({len(times)})",
            )
        )
    _legend_right(figure, handles)
    return figure


# --------------------------------------------------------- a run: pods, used vs given


@_styled
def pod_usage_figure(
    samples: Sequence[RuntimeSample], end_s: float, *, name_prefix: str = ""
) -> Figure:
    """Per pod, CPU (top) and memory (bottom) used (solid) against requested (dashed).

    Workers in shades of blue, PS in shades of orange; a pod's line has a gap where the pod
    did not exist (before it started, after it was replaced). ``name_prefix`` (the job's name
    and a dash, which every pod name repeats) is left out of the legend.
    """
    figure, (cpu_ax, mem_ax) = _time_chart(5.2, rows=2)
    figure.set_label("pods")
    end = max([end_s, *(s.time for s in samples)])
    unit = _time_axis(mem_ax, end)
    cpu_ax.set_ylabel("CPU (cores)")
    mem_ax.set_ylabel("memory (MiB)")
    mem_ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
    pods: dict[str, str] = {}
    for s in samples:
        for n in s.nodes:
            pods.setdefault(n.name, n.role)
    if not pods:
        _empty_note(cpu_ax, "no per-pod samples")
        return figure
    ordered = sorted(pods, key=lambda name: (pods[name] != "worker", name))
    handles: list[Line2D] = []
    shade_index = {"worker": 0, "ps": 0}
    for name in ordered:
        role = pods[name]
        shades = _POD_SHADES[role]
        colour = shades[shade_index[role] % len(shades)]
        shade_index[role] += 1
        times: list[float] = []
        values: dict[str, list[float]] = {k: [] for k in ("cpu", "cpu_req", "mem", "mem_req")}
        for s in samples:
            node = next((n for n in s.nodes if n.name == name), None)
            times.append(s.time / unit.seconds)
            # NaN while the pod did not exist: a gap, not a drop to zero
            values["cpu"].append(node.cpu_used if node else math.nan)
            values["cpu_req"].append(node.cpu_requested if node else math.nan)
            values["mem"].append(node.memory_used_mb if node else math.nan)
            values["mem_req"].append(node.memory_requested_mb if node else math.nan)
        for ax, used, given in ((cpu_ax, "cpu", "cpu_req"), (mem_ax, "mem", "mem_req")):
            xs, ys = _series(times, values[used])
            (line,) = ax.plot(
                xs,
                ys,
                color=colour,
                marker=".",
                markersize=3,
                gid=f"pod-{used}-{name}",
                label=name.removeprefix(name_prefix) or name,
            )
            xs, ys = _series(times, values[given])
            ax.plot(
                xs,
                ys,
                color=colour,
                linestyle="--",
                linewidth=1.1,
                drawstyle="steps-post",
                gid=f"pod-{given}-{name}",
            )
            if ax is cpu_ax:
                handles.append(line)
    for ax in (cpu_ax, mem_ax):
        ax.set_ylim(0.0, ax.get_ylim()[1] * 1.05)
    handles.append(Line2D([], [], color="#555555", label="used (solid)"))
    handles.append(Line2D([], [], color="#555555", linestyle="--", label="requested (dashed)"))
    _legend_right(figure, handles)
    return figure


# ------------------------------------------------------- a run: the fitted model


@_styled
def model_fit_figure(
    observations: Sequence[Observation], model: PerfModel, *, curve_through: Observation
) -> Figure:
    """The fitted resource-performance model against what the run measured.

    Left: predicted vs measured throughput, one point per configuration, with the line of
    perfect prediction and a ±10% band. Right: measured throughput against total CPU
    requested, the model's prediction at the same configurations, and the model's curve
    through ``curve_through``'s shape (its pod counts, CPU per pod scaled from 0.25x to 2x).
    """
    figure = new_figure(_WIDTH, 3.8)
    figure.set_label("model")
    parity, curve = figure.subplots(1, 2)
    measured = [o.throughput for o in observations]
    predicted = [model.throughput(o.config, o.batch_size) for o in observations]
    low = 0.0
    high = max([*measured, *predicted]) * 1.12
    parity.fill_between(
        [low, high],
        [low * 0.9, high * 0.9],
        [low * 1.1, high * 1.1],
        color="#dddddd",
        alpha=0.6,
        linewidth=0,
        label="±10%",
    )
    parity.plot(
        [low, high], [low, high], color="#777777", linewidth=1, label="prediction = measured"
    )
    parity.plot(
        measured,
        predicted,
        linestyle="none",
        marker="o",
        color=ROLE_COLOURS["worker"],
        gid="model-parity",
        label="configuration",
    )
    for o, x, y in zip(observations, measured, predicted, strict=True):
        c = o.config
        right = x > 0.6 * high  # labels of points on the right go left, inside the axes
        parity.annotate(
            _shape(c.workers, c.worker_cpu, c.ps, c.ps_cpu),
            xy=(x, y),
            xytext=(-5 if right else 5, -10),
            textcoords="offset points",
            ha="right" if right else "left",
            fontsize=7,
            color="#333333",
        )
    parity.set_xlim(low, high)
    parity.set_ylim(low, high)
    parity.set_aspect("equal", adjustable="box")
    for axis in (parity.xaxis, parity.yaxis):
        axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
        axis.set_major_locator(MaxNLocator(nbins=4))
    parity.set_xlabel("measured (samples/s)")
    parity.set_ylabel("predicted (samples/s)")
    parity.legend(loc="upper left")

    totals = [o.config.total_cpu for o in observations]
    curve.plot(
        totals,
        measured,
        linestyle="none",
        marker="o",
        color=ROLE_COLOURS["worker"],
        gid="model-measured",
        label="measured",
    )
    curve.plot(
        totals,
        predicted,
        linestyle="none",
        marker="x",
        color=ROLE_COLOURS["ps"],
        markersize=7,
        gid="model-predicted",
        label="model, same configuration",
    )
    base = curve_through.config
    factors = [0.25 + 0.05 * i for i in range(36)]
    curve_x = [base.total_cpu * f for f in factors]
    curve_y = [
        float(
            model.throughput_many(
                base.workers,
                base.ps,
                base.worker_cpu * f,
                base.ps_cpu * f,
                curve_through.batch_size,
            )
        )
        for f in factors
    ]
    curve.plot(
        curve_x,
        curve_y,
        color=ROLE_COLOURS["total"],
        linewidth=1.2,
        gid="model-curve",
        label=f"model at {base.workers}w + {base.ps}ps, CPU per pod scaled",
    )
    curve.set_xlabel("total CPU requested (cores)")
    curve.set_ylabel("throughput (samples/s)")
    curve.set_ylim(bottom=0.0)
    curve.set_xlim(left=0.0)
    curve.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
    curve.legend(loc="lower right")
    return figure
