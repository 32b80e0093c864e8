"""Tests for dpmarket.common.sketches.tasks: moments, CDF, covariance, counting queries and
implicit-M2M
logistic regression, on exact sketches with known answers (truth from the same target
functions on the data)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.typing import NDArray
from sklearn.metrics import roc_auc_score

from dpmarket.common.sketches import (
    Domain,
    FeatureMap,
    M2MEstimator,
    PrivateSketch,
    SketchMechanism,
    SyntheticDesign,
    draw_rff,
    histogram_map,
    tasks,
)

UNIT2 = Domain.unit(2)
N_S = 20_000


def _exact(fmap: FeatureMap, x: NDArray[np.float64], domain: Domain = UNIT2) -> PrivateSketch:
    return SketchMechanism(fmap, domain, math.inf, "none").release(x)


@pytest.fixture(scope="module")
def data() -> NDArray[np.float64]:
    rng = np.random.default_rng(0)
    z = rng.beta(2.0, 3.0, size=(4000, 1))
    return np.clip(np.hstack([z, 0.6 * z + 0.4 * rng.uniform(size=(4000, 1))]), 0.0, 1.0)


@pytest.fixture(scope="module")
def hist(data: NDArray[np.float64]) -> M2MEstimator:
    fmap = histogram_map(UNIT2, 10)
    return M2MEstimator(_exact(fmap, data), rng=np.random.default_rng(1), n_synthetic=N_S)


@pytest.fixture(scope="module")
def rff(data: NDArray[np.float64]) -> M2MEstimator:
    fmap = draw_rff(2, 60, 1.0, np.random.default_rng(2))
    return M2MEstimator(_exact(fmap, data), rng=np.random.default_rng(3), n_synthetic=N_S)


def test_moments(hist: M2MEstimator, rff: M2MEstimator, data: NDArray[np.float64]) -> None:
    for order in (1, 2):
        truth = tasks.moment_function(order)(data).mean(0)
        np.testing.assert_allclose(tasks.moments(rff, order), truth, atol=3e-3)
        # HIST: within the discretization error of a 0.1-wide bin
        np.testing.assert_allclose(tasks.moments(hist, order), truth, atol=0.05 * order)
    assert tasks.moments(rff, 1, attributes=[1]).shape == (1,)


def test_cdf_at_bin_edges_is_exact_with_hist(hist: M2MEstimator, data: NDArray[np.float64]) -> None:
    """A CDF at a bin edge is a sum of whole bins: HIST represents it exactly, so only the
    ridge term (lambda = 1e-9) separates estimate and truth."""
    edges = np.array([0.2, 0.5, 0.7])
    got = tasks.cdf(hist, edges)
    truth = tasks.cdf_function(edges)(data).mean(0).reshape(2, 3)
    assert got.shape == (2, 3)
    np.testing.assert_allclose(got, truth, atol=1e-5)
    per_attr = tasks.cdf(hist, [[0.3], [0.6]])
    np.testing.assert_allclose(
        per_attr[:, 0], [(data[:, 0] <= 0.3).mean(), (data[:, 1] <= 0.6).mean()], atol=1e-5
    )


def test_covariance(rff: M2MEstimator, data: NDArray[np.float64]) -> None:
    got = tasks.covariance(rff)
    truth = np.cov(data.T, bias=True)
    np.testing.assert_allclose(got, got.T)
    np.testing.assert_allclose(got, truth, atol=2e-3)
    assert got[0, 1] > 0.5 * truth[0, 1]  # the correlation is recovered, not just the variances
    np.testing.assert_allclose(tasks.covariance(rff, means=data.mean(0)), truth, atol=2e-3)


def test_counting_queries(hist: M2MEstimator, rff: M2MEstimator, data: NDArray[np.float64]) -> None:
    # Single-attribute ranges on bin edges: exact with HIST.
    lower = np.array([[0.2, -np.inf], [-np.inf, 0.1]])
    upper = np.array([[0.6, np.inf], [np.inf, 0.5]])
    truth = tasks.range_function(lower, upper)(data).mean(0)
    np.testing.assert_allclose(tasks.counting_queries(hist, lower, upper), truth, atol=1e-5)
    # Conjunctions over both attributes: RFF, within 0.03 (a discontinuous target).
    rng = np.random.default_rng(4)
    lo = rng.uniform(0.0, 0.5, (20, 2))
    hi = lo + rng.uniform(0.2, 0.5, (20, 2))
    truth = tasks.range_function(lo, hi)(data).mean(0)
    got = tasks.counting_queries(rff, lo, hi)
    assert np.mean(np.abs(got - truth)) < 0.03
    counts = got * rff.sketch.count_estimate
    assert counts.shape == (20,)


def test_task_arguments_are_checked(rff: M2MEstimator) -> None:
    with pytest.raises(ValueError, match="attribute 5 does not exist"):
        tasks.moments(rff, 1, attributes=[5])
    with pytest.raises(ValueError, match="order must be an integer >= 1"):
        tasks.moments(rff, 0)
    with pytest.raises(ValueError, match=r"thresholds must have shape \(q,\) or \(2, q\)"):
        tasks.cdf(rff, np.ones((3, 2)))
    with pytest.raises(ValueError, match="lower and upper must both have shape"):
        tasks.counting_queries(rff, np.zeros((2, 2)), np.ones((3, 2)))
    with pytest.raises(ValueError, match="NaN"):
        tasks.counting_queries(rff, np.full((1, 2), np.nan), np.ones((1, 2)))


# ------------------------------------------------------------------ logistic regression
LABELLED = Domain(
    np.array([0.0, 0.0, 0.0]), np.array([1.0, 1.0, 1.0]), levels=(None, None, np.array([0.0, 1.0]))
)


def _labelled(n: int, rng: np.random.Generator) -> NDArray[np.float64]:
    x = rng.uniform(size=(n, 2))
    y = (x[:, 0] + 0.5 * x[:, 1] + rng.normal(0, 0.1, n) > 0.8).astype(float)
    return np.column_stack([x, y])


@pytest.mark.parametrize("negative_weights", ["clip", "keep"])
def test_implicit_logistic_regression_separates_the_classes(negative_weights: str) -> None:
    rng = np.random.default_rng(5)
    train, test = _labelled(3000, rng), _labelled(1000, rng)
    fmap = draw_rff(3, 60, 1.0, rng)
    est = M2MEstimator(_exact(fmap, train, LABELLED), rng=rng, n_synthetic=N_S)
    fit = tasks.implicit_logistic_regression(est, 2, negative_weights=negative_weights)  # type: ignore[arg-type]
    auc = roc_auc_score(test[:, 2], fit.predict_proba(test))
    assert auc > 0.9
    assert fit.feature_attributes == (0, 1) and fit.label_attribute == 2
    assert fit.sample_weight.sum() == pytest.approx(3000.0)
    assert fit.decision_function(test).shape == (1000,)
    if negative_weights == "clip":
        assert (fit.sample_weight >= 0).all()


def test_implicit_logistic_regression_reaches_the_weighted_loss_optimum() -> None:
    """Newton's method (the solver with clipped weights, for speed) finds the minimum of the
    same penalized weighted loss as L-BFGS run to a tight tolerance: the same model."""
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(6)
    est = M2MEstimator(
        _exact(draw_rff(3, 60, 1.0, rng), _labelled(3000, rng), LABELLED), rng=rng, n_synthetic=N_S
    )
    fit = tasks.implicit_logistic_regression(est, 2)
    assert fit.model.solver == "newton-cholesky"
    tight = LogisticRegression(solver="lbfgs", tol=1e-10, max_iter=10_000)
    tight.fit(est.points[:, :2], est.points[:, 2], sample_weight=fit.sample_weight)
    np.testing.assert_allclose(fit.model.coef_, tight.coef_, rtol=1e-4)
    np.testing.assert_allclose(fit.model.intercept_, tight.intercept_, rtol=1e-4)


def test_implicit_logistic_regression_needs_a_binary_label() -> None:
    rng = np.random.default_rng(6)
    fmap = draw_rff(3, 5, 1.0, rng)
    est = M2MEstimator(_exact(fmap, _labelled(50, rng), Domain.unit(3)), rng=rng, n_synthetic=200)
    with pytest.raises(ValueError, match="discrete with exactly two levels"):
        tasks.implicit_logistic_regression(est, 2)
    design = SyntheticDesign.draw(fmap, LABELLED, rng, n_synthetic=200)
    est = M2MEstimator(_exact(fmap, _labelled(50, rng), LABELLED), design=design)
    with pytest.raises(ValueError, match="negative_weights must be"):
        tasks.implicit_logistic_regression(est, 2, negative_weights="abs")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="C must be"):
        tasks.implicit_logistic_regression(est, 2, C=0.0)
