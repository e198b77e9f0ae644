"""PS memory over a job's progress: its growth measured, projected to the end of the job.

A PS holds the embedding rows its workers have touched so far (and their optimizer slots, and
a checkpoint's snapshot buffer). New ids keep arriving, at a falling rate, until the tables
fill: PS memory grows with progress and saturates. A reading at start-up therefore says little
about the end state, and a PS sized from one is OOM-killed half-way (issue 30: 13-22 of 300
jobs on seeds 7 and 11, every one of which the user's own request would have held).

The rule every stage applies (Stage 2's plans, Stage 3's OOM reaction and prediction):

* **Not measured yet**: the PS keep the state they hold (a cold start's is the user's request,
  at least the model's footprint x 1.5 where the request clears the footprint; a warm start's
  is what earlier runs of the job were measured to reach at their end): nothing is planned
  below it.
* **Measured** once ``min_samples`` readings with progress span ``min_progress`` of the job
  (progress ``f = global_step · batch_size / total_samples``). Over the last ``window`` of
  them, with ``S(f)`` the state of all PS together (each PS's use less the runtime):

      b      = Σ(f − f̄)(S − S̄) / Σ(f − f̄)²       (least squares, MiB per unit of progress)
      S(1)  <= E = max(S_last, Ŝ(f_last)) + max(0, b) · (1 − f_last)
      N      = max(footprint, E) · r · (1 + margin)            (r = largest PS / mean PS)
      per PS = runtime + N / p

  The form is a straight line from the latest reading: for any concave growth curve (rows
  touched at a falling rate) the least-squares slope over a window is at least the curve's
  slope at the window's end, so the line lies above the curve from there to the end of the
  job. ``margin`` covers reading noise and a curve that is not quite concave. ``r`` scales the
  even share to the largest PS; the rows re-partition with the count, so ``N`` holds for any
  ``p``. No plan puts the PS below ``N``; one below it is raised before it is OOM-killed.
* **Stopped**: the growth still to come at the measured rate is at most ``stop_share`` of the
  state held now, ``b · (1 − f) <= stop_share · S_last``. Only then is memory given back,
  down to ``N``: before, the projection is still falling as the curve bends, and each give-back
  would be followed by another.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from dlrover_kfp.core.footprint import RUNTIME_MB
from dlrover_kfp.core.planner.context import PlanningContext
from dlrover_kfp.core.planner.settings import MemoryGrowthSettings
from dlrover_kfp.core.profile import RuntimeSample


def trend_slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of y over x:  b = Σ(x-x̄)(y-ȳ) / Σ(x-x̄)²  (0 when x does not vary)."""
    x_mean = statistics.fmean(x for x, _ in points)
    y_mean = statistics.fmean(y for _, y in points)
    den = sum((x - x_mean) ** 2 for x, _ in points)
    if den == 0:
        return 0.0
    return sum((x - x_mean) * (y - y_mean) for x, y in points) / den


@dataclass(frozen=True, slots=True)
class PsGrowth:
    """The PS state's growth as measured: where it is and how fast it grows with progress."""

    #: progress of the latest reading, 0..1
    progress: float
    #: MiB the PS hold together at that reading, runtime excluded (``S_last``, or the fitted
    #: line there where that is higher)
    state_mb: float
    #: MiB of state per unit of progress over the window (``b``, at least 0)
    slope_mb: float
    #: largest PS's state / mean PS state at the latest reading (``r``, at least 1)
    imbalance: float

    @property
    def end_state_mb(self) -> float:
        """``E = S_last + b · (1 − f_last)``: the state at progress 1, from above."""
        return self.state_mb + self.slope_mb * (1.0 - self.progress)

    def stopped(self, s: MemoryGrowthSettings) -> bool:
        """Growth has stopped: ``b · (1 − f) <= stop_share · S_last``."""
        return self.slope_mb * (1.0 - self.progress) <= s.stop_share * self.state_mb

    def need_state_mb(self, ctx: PlanningContext, s: MemoryGrowthSettings) -> int:
        """``N = max(footprint, E) · r · (1 + margin)``: the PS state to plan, all PS together,
        re-partitioned evenly over any count (``MemoryNeeds.ps_mb``)."""
        return math.ceil(
            max(ctx.ps_state_mb, self.end_state_mb) * self.imbalance * (1.0 + s.margin)
        )

    def need_per_ps_mb(self, ctx: PlanningContext, s: MemoryGrowthSettings, ps_count: int) -> int:
        """Memory one of ``ps_count`` PS needs to the end of the job: runtime + N / p."""
        return RUNTIME_MB + math.ceil(self.need_state_mb(ctx, s) / max(1, ps_count))


def progress_of(sample: RuntimeSample, ctx: PlanningContext) -> float | None:
    """``f = global_step · batch_size / total_samples`` (None when the job's size is unknown)."""
    if not ctx.total_samples:
        return None
    return min(1.0, sample.global_step * ctx.batch_size / ctx.total_samples)


def ps_growth(
    ctx: PlanningContext, samples: Sequence[RuntimeSample], s: MemoryGrowthSettings
) -> PsGrowth | None:
    """The PS state's measured growth (module docstring), None until it is measured: fewer
    than ``min_samples`` readings with progress, or spanning less than ``min_progress``."""
    readings: list[tuple[float, float, float]] = []  # (progress, state, imbalance)
    for sample in samples:
        f = progress_of(sample, ctx)
        shares = [max(0, n.memory_used_mb - RUNTIME_MB) for n in sample.nodes if n.role == "ps"]
        if f is None or f <= 0 or not shares:
            continue
        total = float(sum(shares))
        readings.append((f, total, max(shares) / statistics.fmean(shares) if total else 1.0))
    recent = readings[-s.window :]
    if len(recent) < s.min_samples or recent[-1][0] - recent[0][0] < s.min_progress:
        return None
    points = [(f, state) for f, state, _ in recent]
    slope = max(0.0, trend_slope(points))
    f_last, s_last, imbalance = recent[-1]
    fitted = statistics.fmean(y for _, y in points) + slope * (
        f_last - statistics.fmean(x for x, _ in points)
    )
    return PsGrowth(
        progress=f_last,
        state_mb=max(s_last, fitted),
        slope_mb=slope,
        imbalance=max(1.0, imbalance),
    )


__all__ = ["PsGrowth", "progress_of", "ps_growth", "trend_slope"]
