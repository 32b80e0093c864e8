"""Tests of dpmarket.consumer.evaluation.downstream_accuracy."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from dpmarket.consumer.evaluation import downstream_accuracy
from dpmarket.experiments.scenarios import digits_scenario, flights_scenario
from dpmarket.runtime.tables import PointSet


def _blobs(n: int, seed: int, shift: float = 6.0) -> PointSet:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    features = rng.normal(size=(n, 4)) + shift * labels[:, None]
    return PointSet(features=features, labels=labels, name=f"blobs-{seed}")


def test_separable_problem_is_learned() -> None:
    accuracy = downstream_accuracy(_blobs(60, 0), _blobs(2000, 1))
    assert accuracy >= 0.99


def test_chance_level_on_unrelated_labels() -> None:
    rng = np.random.default_rng(2)
    train = PointSet(rng.normal(size=(200, 3)), rng.integers(0, 2, 200), "noise")
    test = PointSet(rng.normal(size=(4000, 3)), rng.integers(0, 2, 4000), "noise-test")
    # Independent labels: accuracy is 0.5 +- 3 standard deviations (sd = 0.5 / sqrt(4000)).
    assert abs(downstream_accuracy(train, test) - 0.5) <= 3 * 0.5 / np.sqrt(4000)


def test_multiclass() -> None:
    rng = np.random.default_rng(3)
    centers = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    y_train, y_test = rng.integers(0, 3, 90), rng.integers(0, 3, 900)
    train = PointSet(centers[y_train] + rng.normal(size=(90, 2)), y_train, "train")
    test = PointSet(centers[y_test] + rng.normal(size=(900, 2)), y_test, "test")
    assert downstream_accuracy(train, test) >= 0.98


def test_single_class_summary_predicts_that_class() -> None:
    rng = np.random.default_rng(4)
    train = PointSet(rng.normal(size=(10, 2)), np.full(10, 3), "one-class")
    test = PointSet(rng.normal(size=(8, 2)), np.array([3, 3, 3, 4, 4, 3, 3, 3]), "test")
    assert downstream_accuracy(train, test) == pytest.approx(6 / 8)


def test_deterministic_by_seed() -> None:
    train, test = _blobs(40, 5, shift=1.0), _blobs(500, 6, shift=1.0)
    assert downstream_accuracy(train, test, seed=7) == downstream_accuracy(train, test, seed=7)


def test_errors() -> None:
    labeled = _blobs(10, 0)
    unlabeled = PointSet(labeled.features, None, "summary")
    with pytest.raises(ValueError, match="'summary' has no labels"):
        downstream_accuracy(unlabeled, labeled)
    with pytest.raises(ValueError, match="test set 'summary' has no labels"):
        downstream_accuracy(labeled, unlabeled)
    other = PointSet(np.ones((3, 2)), np.array([0, 1, 0]), "narrow")
    with pytest.raises(ValueError, match="4 features but test set 'narrow' has 2"):
        downstream_accuracy(labeled, other)


def test_no_convergence_trouble_on_scenario_summaries(caplog: pytest.LogCaptureFixture) -> None:
    """Random summaries of the real scenarios' sizes train without a ConvergenceWarning."""
    rng = np.random.default_rng(0)
    digits = digits_scenario(seed=0)
    flights = flights_scenario(seed=0, max_points_per_owner=2000)
    with caplog.at_level(logging.WARNING, logger="dpmarket.consumer.evaluation"):
        for scenario in (digits, flights):
            features = np.vstack([o.features for o in scenario.owners])
            labels = np.concatenate([o.labels for o in scenario.owners if o.labels is not None])
            for p in (scenario.default_p, 4 * scenario.default_p):
                idx = rng.choice(len(features), size=p, replace=False)
                summary = PointSet(features[idx], labels[idx], "summary")
                accuracy = downstream_accuracy(summary, scenario.test)
                assert 0.0 <= accuracy <= 1.0
    assert not caplog.records


def test_convergence_warning_is_logged_not_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import dpmarket.consumer.evaluation as evaluation

    monkeypatch.setattr(evaluation, "_MAX_ITER", 1)
    rng = np.random.default_rng(8)
    train = PointSet(rng.normal(size=(30, 50)), rng.integers(0, 2, 30), "hard")
    with caplog.at_level(logging.WARNING, logger="dpmarket.consumer.evaluation"):
        accuracy = downstream_accuracy(train, train)
    assert 0.0 <= accuracy <= 1.0
    assert any("did not converge on 'hard'" in r.getMessage() for r in caplog.records)
