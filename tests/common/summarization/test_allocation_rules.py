"""The allocation's rules derived from public quantities, and the owners' shrinkage."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpmarket.common.privacy.accounting import analytic_gaussian_sigma
from dpmarket.common.sketches import Domain, SketchMechanism, draw_rff
from dpmarket.common.summarization.candidates import (
    shrink_embedding,
    shrink_towards_moments,
    shrink_towards_points,
)
from dpmarket.common.summarization.sketch_allocation import (
    SHARE_FALSE_POSITIVES,
    derived_allocation_share,
    relevance_matrix,
    responsibilities,
    share_threshold,
    shrink_decision,
)


def test_the_decision_is_shrunk_towards_the_even_split_by_james_stein() -> None:
    noisy = np.array([0.5, 0.1, 0.2, 0.3])
    sigma = 0.1
    shrunk, alpha = shrink_decision(noisy, sigma)
    y = noisy - 0.25
    assert alpha == pytest.approx(1 - 2 * sigma**2 / float(y @ y))
    np.testing.assert_allclose(shrunk, 0.25 + alpha * y)
    # Noise as large as the differences: the even split.
    assert shrink_decision(noisy, 1.0) == (pytest.approx(np.full(4, 0.25)), 0.0)
    # Two owners: nothing to gain from James-Stein (d - 2 = 0).
    assert shrink_decision(np.array([0.9, 0.1]), 5.0)[1] == 1.0


def test_shrinking_the_decision_lowers_its_error_when_the_noise_swamps_it() -> None:
    """Stein's risk argument, measured: K = 16 owners, shares of 1/16 and noise of the same
    size (digits-16's regime); the shrunk decision's mean squared error is smaller over 2,000
    draws (the standard error of the difference is < 5% of it)."""
    rng = np.random.default_rng(0)
    k, sigma = 16, 0.1
    truth = rng.dirichlet(np.ones(k))
    raw, shrunk = [], []
    for _ in range(2000):
        noisy = truth + rng.normal(0, sigma, k)
        raw.append(np.sum((noisy - truth) ** 2))
        shrunk.append(np.sum((shrink_decision(noisy, sigma)[0] - truth) ** 2))
    assert np.mean(shrunk) < 0.5 * np.mean(raw)


def test_the_share_threshold_keeps_the_false_positives_per_point_fixed() -> None:
    from scipy.stats import norm

    for k in (3, 16, 50):
        t = share_threshold(k)
        assert k * norm.sf(t) == pytest.approx(SHARE_FALSE_POSITIVES)
    assert share_threshold(1) == 0.0
    with pytest.raises(ValueError):
        share_threshold(0)


def test_the_derived_split_follows_m_and_k() -> None:
    # A small validation set cannot make the embedding useful: the decision gets nearly all.
    assert derived_allocation_share(20, 3, 1.0, 1e-6) == 0.95
    # A large one: both releases accurate, a / (1 - a) -> K * signal / sqrt(2).
    a = derived_allocation_share(100_000, 8, 1.0, 1e-6, signal=0.1)
    assert a / (1 - a) == pytest.approx(8 * 0.1 / math.sqrt(2), abs=0.05)
    for m, k in ((44, 5), (300, 8), (2000, 7), (150, 40), (500, 50)):
        share = derived_allocation_share(m, k, 1.0, 1e-6)
        assert 0.05 <= share <= 0.95
    # The rule minimises the stated cost on its grid.
    m, k, s = 150, 40, 0.1
    sigma_u = analytic_gaussian_sigma(1.0, 1e-6, 1.0)
    big_a = (2 * sigma_u / (m * s)) ** 2
    big_b = (math.sqrt(2) * sigma_u * k / m) ** 2

    def cost(x: float) -> float:
        xg, xa = big_a / (1 - x), big_b / x
        return xg / (1 + xg) + xa / (1 + xa)

    best = derived_allocation_share(m, k, 1.0, 1e-6, signal=s)
    assert all(cost(best) <= cost(x) + 1e-12 for x in np.arange(0.05, 0.951, 0.01))


def _sketches(rng: np.random.Generator) -> tuple[list, np.ndarray]:
    fmap = draw_rff(2, 200, 0.5, rng)
    mech = SketchMechanism(fmap, Domain(np.full(2, -4.0), np.full(2, 4.0)), math.inf, "none")
    owners = [rng.normal(c, 0.3, size=(200, 2)) for c in ((-2, 0), (0, 0), (2, 0))]
    return [mech.release(o, None) for o in owners], rng.normal((2, 0), 0.3, size=(30, 2))


def test_a_zero_norm_weight_is_the_density_vote() -> None:
    sketches, validation = _sketches(np.random.default_rng(1))
    vote = relevance_matrix(sketches, validation, score="mmd", norm_weight=0.0)
    density = responsibilities(relevance_matrix(sketches, validation, score="density"))
    np.testing.assert_array_equal(vote, density)
    assert vote.mean(axis=0)[2] == 1.0  # every validation point is owner 2's kind
    with pytest.raises(ValueError, match="norm_weight"):
        relevance_matrix(sketches, validation, score="mmd", norm_weight=1.5)


def test_the_share_score_splits_points_by_noise_free_mass() -> None:
    sketches, validation = _sketches(np.random.default_rng(2))
    u = relevance_matrix(sketches, validation, score="share")  # no noise: threshold 0
    pi = responsibilities(u, vote=False)
    assert pi.mean(axis=0)[2] > 0.95


def test_owner_shrinks_towards_the_prior_nearer_in_its_own_metric() -> None:
    rng = np.random.default_rng(3)
    d, n = 140, 400
    x = rng.normal(size=(n, d)) / math.sqrt(d)
    mu, second = x.mean(axis=0), x.T @ x / n
    sigma = 0.01
    far = mu + 3.0 * x[:20].mean(axis=0)  # off along directions the points span
    near = x[:50].mean(axis=0)
    # The release lies near the owner's own mean: its own mean is the prior.
    noisy = near + rng.normal(0, sigma, d)
    shrunk, alpha, public = shrink_towards_points(noisy, x, sigma, prior=far)
    expected, expected_alpha = shrink_embedding(noisy, mu, sigma)
    assert not public and alpha == expected_alpha
    np.testing.assert_allclose(shrunk, expected)
    # The release lies near the public prior: it is the prior.
    noisy = far + rng.normal(0, sigma, d)
    shrunk, alpha, public = shrink_towards_points(noisy, x, sigma, prior=far)
    assert public
    np.testing.assert_allclose(shrunk, shrink_embedding(noisy, far, sigma)[0])
    # Without a prior, the owner's own mean; from the moments, the same.
    assert shrink_towards_points(noisy, x, sigma)[2] is False
    moments = shrink_towards_moments(noisy, mu, second, sigma, prior=far)
    np.testing.assert_allclose(moments[0], shrunk, rtol=1e-9, atol=1e-12)
    assert moments[1:] == (alpha, True)
    with pytest.raises(ValueError):
        shrink_towards_points(noisy, x[:, :10], sigma)
    with pytest.raises(ValueError, match="second_moment"):
        shrink_towards_moments(noisy, mu, np.eye(d - 1), sigma, prior=far)
    with pytest.raises(ValueError, match="prior embedding"):
        shrink_towards_moments(noisy, mu, second, sigma, prior=far[:3])
    with pytest.raises(ValueError, match="noise_sigma"):
        shrink_towards_moments(noisy, mu, np.eye(d), 0.0)


def test_the_owner_shrinkage_estimates_its_signal_without_bias() -> None:
    """E[y^T Sigma y] = theta^T Sigma theta + sigma^2 tr Sigma: over 4,000 noise draws the mean
    is within 3 standard errors of it (failure probability about 0.3%)."""
    rng = np.random.default_rng(4)
    d, n, sigma = 30, 200, 0.05
    x = rng.normal(size=(n, d)) / math.sqrt(d)
    theta = rng.normal(size=d) * 0.05
    cov = x.T @ x / n
    expected = float(theta @ cov @ theta + sigma**2 * np.trace(cov))
    values = []
    for _ in range(4000):
        y = theta + rng.normal(0, sigma, d)
        values.append(float(np.mean((x @ y) ** 2)))
    values_arr = np.asarray(values)
    assert abs(values_arr.mean() - expected) < 3 * values_arr.std() / math.sqrt(values_arr.size)
