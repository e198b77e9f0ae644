"""Held-out metrics of a click model: log-loss and ROC AUC, in numpy.

AUC is the Mann-Whitney statistic: the probability that a random positive scores above a random
negative, ties counting one half,

    AUC = (sum of the ranks of the positives - n⁺(n⁺+1)/2) / (n⁺ · n⁻)

with average ranks for tied scores. It is undefined with only one class; we return None then,
rather than a number that looks like a result.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from scipy.stats import rankdata

_EPS = 1e-7


def log_loss(labels: npt.NDArray[np.floating], probs: npt.NDArray[np.floating]) -> float:
    """Mean binary cross-entropy: -mean(y·log p + (1-y)·log(1-p)), p clipped to [eps, 1-eps]."""
    if len(labels) == 0:
        raise ValueError("log_loss of an empty set")
    p = np.clip(probs.astype(np.float64), _EPS, 1.0 - _EPS)
    y = labels.astype(np.float64)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))


def roc_auc(labels: npt.NDArray[np.floating], scores: npt.NDArray[np.floating]) -> float | None:
    """ROC AUC, or None when the labels hold a single class."""
    y = labels.astype(bool)
    n_pos = int(y.sum())
    n_neg = len(y) - n_pos
    if n_pos == 0 or n_neg == 0:
        return None
    ranks = rankdata(scores, method="average")
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))
