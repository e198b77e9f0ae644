"""The simulator's two chart files, drawn by the package's plotting module.

The charts themselves (the JCT CDF over completed jobs on a log minutes axis, and CPU and
memory utilisation in 1-hour windows with 0.0 read as no data) are
:func:`dlrover_kfp.report.plots.jct_cdf_svg` and :func:`dlrover_kfp.report.plots.utilisation_svg`;
their docstrings say what they show. This module only names the files and writes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from dlrover_kfp.files import write_atomic
from dlrover_kfp.report.plots import jct_cdf_svg, utilisation_svg

JCT_CDF_FILE = "jct_cdf.svg"
UTILISATION_FILE = "utilisation.svg"


def write_plots(
    directory: Path,
    jct_minutes: Mapping[str, Sequence[float]],
    utilisation: Mapping[str, Sequence[tuple[float, float, float]]],
    *,
    label: str = "",
) -> list[Path]:
    """Write ``jct_cdf.svg`` and ``utilisation.svg`` into ``directory`` (atomically each).

    ``jct_minutes``: per policy, the JCT (minutes) of its completed jobs; ``utilisation``: per
    policy, ``(hour, cpu used/allocated, memory used/allocated)`` per simulated step.
    ``label`` (e.g. "seed 0") is appended to both titles. Returns the two paths.
    """
    suffix = f" ({label})" if label else ""
    jct_path = directory / JCT_CDF_FILE
    util_path = directory / UTILISATION_FILE
    write_atomic(jct_path, jct_cdf_svg(jct_minutes, title=f"Job completion time CDF{suffix}"))
    write_atomic(util_path, utilisation_svg(utilisation, title=f"Cluster utilisation{suffix}"))
    return [jct_path, util_path]
