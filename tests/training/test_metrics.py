"""Held-out metrics: ROC AUC against a pairwise count, log-loss against its formula."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dlrover_kfp.training.metrics import log_loss, roc_auc


def pairwise_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """P(score of a random positive > score of a random negative), ties counting 1/2."""
    pos = scores[labels == 1]
    neg = scores[labels == 0]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(wins / (len(pos) * len(neg)))


@pytest.mark.parametrize("seed", range(8))
def test_roc_auc_equals_pairwise_count_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 300))
    labels = (rng.random(n) < 0.3).astype(np.float32)
    labels[0], labels[1] = 0.0, 1.0  # both classes present
    # Few distinct scores, so many ties, within and across the classes.
    scores = rng.integers(0, 6, size=n).astype(np.float32) / 5 + 0.1 * labels
    auc = roc_auc(labels, scores)
    assert auc is not None
    assert auc == pytest.approx(pairwise_auc(labels, scores), abs=1e-12)


def test_roc_auc_of_continuous_scores() -> None:
    rng = np.random.default_rng(42)
    labels = (rng.random(500) < 0.25).astype(np.float64)
    scores = rng.standard_normal(500) + labels
    auc = roc_auc(labels, scores)
    assert auc == pytest.approx(pairwise_auc(labels, scores), abs=1e-12)
    assert 0.6 < (auc or 0) < 0.9


def test_perfect_inverted_and_constant_rankings() -> None:
    labels = np.array([0, 0, 1, 0, 1, 1], dtype=np.float32)
    scores = np.array([0.1, 0.2, 0.8, 0.3, 0.9, 0.7], dtype=np.float32)
    assert roc_auc(labels, scores) == 1.0
    assert roc_auc(labels, -scores) == 0.0
    assert roc_auc(labels, np.full(6, 0.5, dtype=np.float32)) == 0.5


@pytest.mark.parametrize("value", [0.0, 1.0])
def test_single_class_has_no_auc(value: float) -> None:
    labels = np.full(10, value, dtype=np.float32)
    assert roc_auc(labels, np.linspace(0, 1, 10)) is None


def test_log_loss_equals_the_formula() -> None:
    rng = np.random.default_rng(3)
    labels = (rng.random(200) < 0.4).astype(np.float32)
    probs = rng.uniform(0.01, 0.99, 200).astype(np.float32)
    pairs = zip(labels.tolist(), probs.tolist(), strict=True)  # as Python floats
    expected = -math.fsum(y * math.log(q) + (1 - y) * math.log(1 - q) for y, q in pairs) / 200
    assert log_loss(labels, probs) == pytest.approx(expected, rel=1e-12)


def test_log_loss_known_values() -> None:
    assert log_loss(np.array([1.0, 0.0]), np.array([0.5, 0.5])) == pytest.approx(math.log(2))
    assert log_loss(np.array([1.0]), np.array([0.9])) == pytest.approx(-math.log(0.9))
    assert log_loss(np.array([0.0]), np.array([0.9])) == pytest.approx(-math.log(0.1))


def test_log_loss_clips_certain_probabilities() -> None:
    labels = np.array([1.0, 0.0, 1.0, 0.0])
    # Confidently right: near zero, not NaN (0 * log 0).
    right = log_loss(labels, np.array([1.0, 0.0, 1.0, 0.0]))
    assert math.isfinite(right)
    assert 0.0 <= right < 1e-6
    # Confidently wrong: large but finite, about -log(1e-7) per row.
    wrong = log_loss(labels, np.array([0.0, 1.0, 0.0, 1.0]))
    assert math.isfinite(wrong)
    assert wrong == pytest.approx(-math.log(1e-7), rel=1e-3)


def test_log_loss_of_nothing_raises() -> None:
    with pytest.raises(ValueError, match="empty"):
        log_loss(np.array([]), np.array([]))
