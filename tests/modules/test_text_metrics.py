"""The text tasks' metrics against scikit-learn / scipy / a direct ECE on fixed predictions."""

import numpy as np
import pytest
import torch
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, log_loss, matthews_corrcoef

from modules.lit.sequence_classification import ECE_BINS, task_metrics, update_metrics


def expected_calibration_error(probs: np.ndarray, labels: np.ndarray, bins: int) -> float:
    """Guo et al. 2017: top-label confidence vs accuracy in equal-width bins, weighted by bin size."""
    confidence, predicted = probs.max(1), probs.argmax(1)
    edges = np.linspace(0, 1, bins + 1)
    ece = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        in_bin = (confidence > lo) & (confidence <= hi)
        if in_bin.any():
            ece += in_bin.mean() * abs((predicted[in_bin] == labels[in_bin]).mean() - confidence[in_bin].mean())
    return ece


@pytest.fixture
def classification():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(500, 2)) * 2
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    labels = (rng.random(500) < probs[:, 1] * 0.8 + 0.1).astype(int)  # informative but miscalibrated
    return probs, labels


def compute(names, num_labels, prediction, labels, batches=5):
    metrics = task_metrics(names, num_labels)
    for p, y in zip(torch.tensor(prediction).chunk(batches), torch.tensor(labels).chunk(batches)):
        update_metrics(metrics, p.float(), y)
    return {k: float(v) for k, v in metrics.compute().items()}


def test_classification_metrics_match_sklearn(classification):
    probs, labels = classification
    got = compute(["acc", "f1", "mcc", "ece", "nll"], 2, probs, labels)
    predicted = probs.argmax(1)
    assert got["acc"] == pytest.approx(accuracy_score(labels, predicted), abs=1e-6)
    assert got["f1"] == pytest.approx(f1_score(labels, predicted), abs=1e-6)
    assert got["mcc"] == pytest.approx(matthews_corrcoef(labels, predicted), abs=1e-5)
    assert got["nll"] == pytest.approx(log_loss(labels, probs), abs=1e-5)
    assert got["ece"] == pytest.approx(expected_calibration_error(probs, labels, ECE_BINS), abs=1e-5)
    assert got["ece"] > 0.02  # the fixture is miscalibrated on purpose: a zero would hide a bug


def test_three_class_accuracy_and_mcc():
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.ones(3), size=300)
    labels = rng.integers(0, 3, size=300)
    got = compute(["acc", "mcc"], 3, probs, labels)
    assert got["acc"] == pytest.approx(accuracy_score(labels, probs.argmax(1)), abs=1e-6)
    assert got["mcc"] == pytest.approx(matthews_corrcoef(labels, probs.argmax(1)), abs=1e-5)


def test_regression_metrics_match_scipy():
    rng = np.random.default_rng(2)
    target = rng.uniform(0, 5, size=400)
    prediction = target + rng.normal(scale=1.5, size=400) + 0.3 * np.sin(3 * target)
    got = compute(["pearson", "spearman"], 2, prediction.astype(np.float32), target.astype(np.float32))
    assert got["pearson"] == pytest.approx(pearsonr(prediction, target)[0], abs=1e-5)
    assert got["spearman"] == pytest.approx(spearmanr(prediction, target)[0], abs=1e-4)


def test_unknown_metric_is_named():
    with pytest.raises(ValueError, match="unknown text metric.*'auc'"):
        task_metrics(["acc", "auc"], 2)
