"""A scenario's runs side by side, in time order: JCT, CPU utilisation and the plans' CPU."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from matplotlib.figure import Figure

from dlrover_kfp.report.plots.series import time_unit
from dlrover_kfp.report.plots.style import _WIDTH, EVENT_STYLES, ROLE_COLOURS, _styled, new_figure


@dataclass(frozen=True, slots=True)
class RunPoint:
    """One run of a scenario, as the scenario chart shows it."""

    label: str  #: x tick label (the start time, short)
    jct_s: float
    succeeded: bool
    #: total cores used / total cores requested over the run's samples; None: no samples
    cpu_utilisation: float | None
    start_cpu: float  #: total CPU requested by the first plan (cores)
    final_cpu: float  #: total CPU requested by the last plan (cores)
    start_shape: str
    final_shape: str


@_styled
def scenario_figure(runs: Sequence[RunPoint]) -> Figure:
    """JCT, CPU utilisation and CPU requested (start and final plan) per run, in time order."""
    figure = new_figure(_WIDTH, 7.4)
    figure.set_label("scenario")
    jct_ax, util_ax, cpu_ax = figure.subplots(3, 1, sharex=True)
    xs = list(range(1, len(runs) + 1))
    unit = time_unit(max((r.jct_s for r in runs), default=1.0))
    jcts = [r.jct_s / unit.seconds for r in runs]
    jct_ax.plot(xs, jcts, color=ROLE_COLOURS["total"], marker="o", gid="scenario-jct", label="JCT")
    failed = [(x, y) for x, y, r in zip(xs, jcts, runs, strict=True) if not r.succeeded]
    if failed:
        jct_ax.plot(
            [x for x, _ in failed],
            [y for _, y in failed],
            linestyle="none",
            marker="X",
            markersize=9,
            color=EVENT_STYLES["failure"].colour,
            gid="scenario-failed",
            label="failed run",
        )
        jct_ax.legend(loc="best")
    jct_ax.set_ylabel(f"JCT ({unit.label})")
    jct_ax.set_title("Job completion time", loc="left", fontsize=9.5)
    jct_ax.set_ylim(bottom=0.0, top=max(jcts, default=1.0) * 1.2 or 1.0)

    util = [math.nan if r.cpu_utilisation is None else r.cpu_utilisation * 100 for r in runs]
    util_ax.plot(xs, util, color=ROLE_COLOURS["worker"], marker="o", gid="scenario-utilisation")
    util_ax.set_ylabel("CPU used / requested (%)")
    util_ax.set_title("CPU utilisation: cores used / cores requested", loc="left", fontsize=9.5)
    finite = [u for u in util if not math.isnan(u)]
    util_ax.set_ylim(0.0, max(100.0, *finite) * 1.05 if finite else 100.0)

    start = [r.start_cpu for r in runs]
    final = [r.final_cpu for r in runs]
    cpu_ax.plot(
        xs,
        start,
        color=ROLE_COLOURS["ps"],
        marker="s",
        markersize=7,
        linestyle="--",
        gid="scenario-start-cpu",
        label="start plan",
    )
    cpu_ax.plot(
        xs,
        final,
        color=ROLE_COLOURS["total"],
        marker="o",
        markersize=5,
        gid="scenario-final-cpu",
        label="final plan",
    )
    for x, r in zip(xs, runs, strict=True):
        cpu_ax.annotate(
            r.final_shape,
            xy=(x, r.final_cpu),
            xytext=(0, 8),
            textcoords="offset points",
            ha="center",
            fontsize=7,
            color="#333333",
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0, "alpha": 0.85},
        )
        if r.start_shape != r.final_shape:
            cpu_ax.annotate(
                r.start_shape,
                xy=(x, r.start_cpu),
                xytext=(0, -18),
                textcoords="offset points",
                ha="center",
                fontsize=7,
                color=ROLE_COLOURS["ps"],
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0, "alpha": 0.85},
            )
    cpu_ax.set_ylabel("CPU requested (cores)")
    cpu_ax.set_title("Plan: CPU requested at the start and at the end", loc="left", fontsize=9.5)
    cpu_ax.set_ylim(0.0, max([*start, *final], default=1.0) * 1.35 or 1.0)
    cpu_ax.legend(loc="lower right")
    cpu_ax.set_xlabel("run (started at, UTC)")
    # at most about 15 labels: every k-th run's when there are more
    every = max(1, math.ceil(len(runs) / 15))
    cpu_ax.set_xticks(xs[::every], [r.label for r in runs][::every], rotation=30, ha="right")
    cpu_ax.set_xlim(0.5, len(runs) + 0.5)
    return figure
