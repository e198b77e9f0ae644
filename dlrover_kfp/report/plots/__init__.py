"""Every chart dlrover-kfp draws, on matplotlib: the one place in the library that plots.

Each public ``*_figure`` function builds a :class:`matplotlib.figure.Figure` from plain data
and each ``*_svg`` one renders it (:func:`render_svg`, or :func:`render_png` for bytes). No
pyplot: a figure is created directly and given an Agg canvas, so nothing here touches
pyplot's global figure registry or the process's default backend, and importing this package
from a server or a test changes nothing for anyone else. Styles (fonts, SVG text as text)
apply only inside :func:`.style._style`.

Conventions every chart keeps:

* every axis says what it measures and its unit (s, min, h, samples/s, cores, MiB, %);
* a role or a policy has one colour everywhere (:data:`ROLE_COLOURS`, :data:`POLICY_COLOURS`),
  an event kind one colour and marker (:data:`EVENT_STYLES`);
* series longer than :data:`MAX_POINTS` are averaged into that many bins, so that an SVG of a
  long run stays small;
* artists a test or a reader needs to find carry a ``gid`` (an ``id`` in the SVG):
  ``cdf-POLICY``, ``cpu-POLICY``, ``memory-POLICY``, ``plan-worker``, ``throughput``,
  ``event-KIND``, ``model-parity`` ...

The modules, by chart family:

* :mod:`.style`: the colours, the rc style, figures without pyplot, SVG and PNG rendering;
* :mod:`.series`: time units, and long or gappy series made drawable;
* :mod:`.simulation`: the simulator's JCT CDF and utilisation charts;
* :mod:`.run`: a run report's plan, throughput, pod and model charts;
* :mod:`.scenario`: a scenario's runs side by side;
* :mod:`.frontier`: the objective frontier of ``benchmarks/objective_frontier.py``.

Everything public is imported here: callers write ``from dlrover_kfp.report.plots import X``.
"""

from __future__ import annotations

from dlrover_kfp.report.plots.frontier import (
    frontier_figure,
    frontier_svg,
)
from dlrover_kfp.report.plots.run import (
    model_fit_figure,
    plan_timeline_figure,
    pod_usage_figure,
    throughput_figure,
)
from dlrover_kfp.report.plots.scenario import (
    RunPoint,
    scenario_figure,
)
from dlrover_kfp.report.plots.series import (
    MAX_POINTS,
    TimeUnit,
    bin_means,
    break_gaps,
    time_unit,
)
from dlrover_kfp.report.plots.simulation import (
    MAX_WINDOWS,
    WINDOW_HOURS,
    cdf_points,
    jct_cdf_figure,
    jct_cdf_svg,
    log_ticks,
    utilisation_figure,
    utilisation_svg,
    window_means,
)
from dlrover_kfp.report.plots.style import (
    EVENT_STYLES,
    PALETTE,
    POLICY_COLOURS,
    ROLE_COLOURS,
    EventStyle,
    new_figure,
    policy_colours,
    render_png,
    render_svg,
)

__all__ = [
    "EVENT_STYLES",
    "MAX_POINTS",
    "MAX_WINDOWS",
    "PALETTE",
    "POLICY_COLOURS",
    "ROLE_COLOURS",
    "WINDOW_HOURS",
    "EventStyle",
    "RunPoint",
    "TimeUnit",
    "bin_means",
    "break_gaps",
    "cdf_points",
    "frontier_figure",
    "frontier_svg",
    "jct_cdf_figure",
    "jct_cdf_svg",
    "log_ticks",
    "model_fit_figure",
    "new_figure",
    "plan_timeline_figure",
    "pod_usage_figure",
    "policy_colours",
    "render_png",
    "render_svg",
    "scenario_figure",
    "throughput_figure",
    "time_unit",
    "utilisation_figure",
    "utilisation_svg",
    "window_means",
]
