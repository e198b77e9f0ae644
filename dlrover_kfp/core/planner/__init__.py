"""The three-stage planner, as pure functions over frozen dataclasses.

- Stage 1, :func:`warm_start` (and :func:`cold_start`): the plan a job starts with.
- Stage 2, :func:`auto_scale`: resize a running job toward the cheapest near-best plan.
- Stage 3, :func:`post_scale`: react to hot PS, stragglers, OOM (real or predicted), pending pods.

The elastic runtime and the cluster simulator both call these functions; neither has a copy.
"""

from dlrover_kfp.core.planner.auto_scale import (
    AutoScaleDecision,
    ScalingStep,
    auto_scale,
    throughput_before,
)
from dlrover_kfp.core.planner.context import PlanningContext, context_from_spec
from dlrover_kfp.core.planner.post_scale import Instability, post_scale
from dlrover_kfp.core.planner.search import InfeasiblePlanError
from dlrover_kfp.core.planner.settings import PlannerSettings
from dlrover_kfp.core.planner.warm_start import cold_start, select_similar, warm_start

__all__ = [
    "AutoScaleDecision",
    "InfeasiblePlanError",
    "Instability",
    "PlannerSettings",
    "PlanningContext",
    "ScalingStep",
    "auto_scale",
    "cold_start",
    "context_from_spec",
    "post_scale",
    "select_similar",
    "throughput_before",
    "warm_start",
]
