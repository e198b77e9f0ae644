"""The objective frontier (``benchmarks/objective_frontier.py``): median JCT against CPU
utilisation, one panel per truth family."""

from __future__ import annotations

from collections.abc import Mapping

from matplotlib.figure import Figure

from dlrover_kfp.report.plots.style import _WIDTH, _styled, new_figure, policy_colours, render_svg


@_styled
def frontier_figure(
    means: Mapping[str, Mapping[str, Mapping[str, float]]], *, title: str
) -> Figure:
    """Median JCT (min) against CPU utilisation (%), one panel per truth family.

    ``means``: family -> run label -> metrics (``median_jct_min``, ``cpu_utilization``). A
    label ``"dlrover-kfp OBJECTIVE FLOOR"`` is a point of that objective's curve (joined in
    order of floor, each point labelled with its floor); any other label is a peer, drawn as
    one marker.
    """
    families = list(means)
    figure = new_figure(_WIDTH, 3.6 * max(1, len(families)))
    figure.set_label("frontier")
    figure.suptitle(title)
    axes = figure.subplots(max(1, len(families)), 1, squeeze=False)[:, 0]
    peers = sorted({label for f in families for label in means[f] if " " not in label})
    colours = policy_colours([*peers, "dlrover-kfp"])
    objective_styles = {"cost": "-", "fastest": "--"}
    for ax, family in zip(axes, families, strict=False):
        runs = means[family]
        ax.set_title(family)
        ax.set_xlabel("CPU utilisation, used / allocated (%)")
        ax.set_ylabel("median JCT (min)")
        for label in peers:
            if label in runs:
                m = runs[label]
                ax.plot(
                    [100 * m["cpu_utilization"]],
                    [m["median_jct_min"]],
                    marker="o",
                    linestyle="none",
                    color=colours[label],
                    label=label,
                    gid=f"frontier-{family}-{label}",
                )
        curves: dict[str, list[tuple[float, float, float]]] = {}
        for label, m in runs.items():
            parts = label.split(" ")
            if len(parts) == 3:
                curves.setdefault(parts[1], []).append(
                    (float(parts[2]), 100 * m["cpu_utilization"], m["median_jct_min"])
                )
        for objective, points in sorted(curves.items()):
            points.sort(reverse=True)
            ax.plot(
                [p[1] for p in points],
                [p[2] for p in points],
                linestyle=objective_styles.get(objective, ":"),
                marker="s",
                color=colours["dlrover-kfp"],
                label=f"dlrover-kfp, {objective} (floor)",
                gid=f"frontier-{family}-{objective}",
            )
            for floor, x, y in points:
                ax.annotate(f"{floor:g}", (x, y), textcoords="offset points", xytext=(4, 4))
        ax.set_ylim(bottom=0)
        ax.legend(loc="upper right")
    return figure


def frontier_svg(means: Mapping[str, Mapping[str, Mapping[str, float]]], *, title: str) -> str:
    """:func:`frontier_figure` as an SVG document."""
    return render_svg(frontier_figure(means, title=title), "frontier")
