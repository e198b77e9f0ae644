"""The publish gate's rule: may a trained model replace the one that is served?

A retraining pipeline runs unattended every day; a bad day (a broken upstream table, a
learning rate that diverged) must not reach the model another system serves. The rule compares
the new model's held-out AUC with the last published one's:

    publish  iff  auc >= last_auc - max_auc_drop

``max_auc_drop`` tolerates the noise of a held-out AUC measured on a fresh day of data (a
strict ``>=`` would refuse every other day of an unchanged model). The first model is
published when it has an AUC; a model without one (no held-out rows: nothing says it is
any good) never is. Pure: the step that reads the files and copies the model is
:mod:`dlrover_kfp.steps.publish`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

#: The default tolerance: half a point of AUC.
DEFAULT_MAX_AUC_DROP: Final = 0.005


@dataclass(frozen=True, slots=True)
class Verdict:
    """The gate's answer and its reason: one line a person reads in a task's log."""

    publish: bool
    reason: str


def check_max_auc_drop(value: float, source: str = "max_auc_drop") -> float:
    """A tolerance in AUC points: finite and within [0, 1]."""
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{source}: {value!r}; expected an AUC difference from 0 to 1")
    return value


def judge(auc: float | None, last_auc: float | None, max_auc_drop: float) -> Verdict:
    """Publish a model of held-out AUC ``auc`` over the published one of ``last_auc`` (None:
    nothing published yet, or a published model without an AUC)?"""
    check_max_auc_drop(max_auc_drop)
    if auc is None or not math.isfinite(auc):
        return Verdict(False, "refused: the model has no held-out AUC (no held-out rows)")
    if last_auc is None:
        return Verdict(True, f"published: AUC {auc:.6f}, the first model published here")
    floor = last_auc - max_auc_drop
    if auc >= floor:
        return Verdict(
            True,
            f"published: AUC {auc:.6f} >= {floor:.6f} (the published {last_auc:.6f} less "
            f"max_auc_drop {max_auc_drop:g})",
        )
    return Verdict(
        False,
        f"refused: AUC {auc:.6f} < {floor:.6f} (the published {last_auc:.6f} less "
        f"max_auc_drop {max_auc_drop:g}); the published model stays",
    )


__all__ = ["DEFAULT_MAX_AUC_DROP", "Verdict", "check_max_auc_drop", "judge"]
