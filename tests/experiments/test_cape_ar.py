"""dpmarket.experiments.cape_ar: the Anderson-Rubin statistic of a capeFM release is exactly
chi-squared at the pooled fit, and its level sets are unbounded exactly where the theory says."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dpmarket.common.cape.functional_mechanism import (
    FMCoefficients,
    FMRelease,
    default_floor,
    fit_coefficients,
)
from dpmarket.experiments.cape_ar import ar_intervals, ar_statistic

S1, S2 = 0.01, 0.004
#: A noise-free Gram matrix with eigenvalues 0.5, 0.2 and 0.1 (25 to 125 noise std of order 2).
_Q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(3, 3)))
LAM2 = (_Q * np.array([0.5, 0.2, 0.1])) @ _Q.T
W_STAR = np.array([2.0, -1.5, 3.0])
LAM1 = -2.0 * LAM2 @ W_STAR


def _draws(count: int, seed: int, lam2: np.ndarray = LAM2) -> tuple[np.ndarray, np.ndarray]:
    """Released ``Lambda_1`` ``(count, 3)`` and symmetrized ``Lambda_2`` ``(count, 3, 3)``."""
    rng = np.random.default_rng(seed)
    l1 = -2.0 * lam2 @ W_STAR + rng.normal(0.0, S1, (count, 3))
    l2 = lam2 + rng.normal(0.0, S2, (count, 3, 3))
    return l1, 0.5 * (l2 + np.swapaxes(l2, 1, 2))


def test_the_statistic_at_the_pooled_fit_is_chi_squared_and_the_rank_one_term_matters() -> None:
    """``Q(w*) ~ chi2_3`` exactly: 4,000 releases, Kolmogorov-Smirnov p > 1e-4 (fails with
    probability 1e-4 if the law is exact). Control: the covariance without its ``2 s2^2 w w^T``
    term (the symmetric noise's; a Kronecker form as in linear IV) gives a statistic whose mean
    is about ``D + c |w|^2 / a`` = 3.9, rejected at p < 1e-4."""
    l1, l2 = _draws(4000, 1)
    q = np.array([ar_statistic(W_STAR, a, b, S1, S2)[0] for a, b in zip(l1, l2, strict=True)])
    assert stats.kstest(q, stats.chi2(3).cdf).pvalue > 1e-4
    a = S1**2 + 2.0 * S2**2 * float(W_STAR @ W_STAR)
    g = 2.0 * np.einsum("bij,j->bi", l2, W_STAR) + l1
    naive = np.sum(g * g, axis=1) / a
    assert stats.kstest(naive, stats.chi2(3).cdf).pvalue < 1e-4


def test_the_gradient_is_the_statistics() -> None:
    """The analytic gradient matches central differences to 1e-6 relative."""
    l1, l2 = _draws(1, 2)
    w = W_STAR + np.array([0.3, -0.2, 0.1])
    _, grad = ar_statistic(w, l1[0], l2[0], S1, S2)
    step = 1e-6
    numeric = [
        (
            ar_statistic(w + step * e, l1[0], l2[0], S1, S2)[0]
            - ar_statistic(w - step * e, l1[0], l2[0], S1, S2)[0]
        )
        / (2 * step)
        for e in np.eye(3)
    ]
    np.testing.assert_allclose(grad, numeric, rtol=1e-6)


def _release(lam2: np.ndarray, seed: int) -> FMRelease:
    rng = np.random.default_rng(seed)
    noisy = FMCoefficients(
        0.0,
        -2.0 * lam2 @ W_STAR + rng.normal(0.0, S1, 3),
        lam2 + rng.normal(0.0, S2, (3, 3)),
    )
    return fit_coefficients(noisy, noise_std2=S2, floor=default_floor(3, S2), scales={1: S1, 2: S2})


@pytest.mark.slow
def test_a_resolved_fit_gets_a_bounded_profile_interval_at_about_its_level() -> None:
    """Eigenvalues at 25-125 noise std: every profile interval (``chi2_1``) is finite and each
    coefficient is covered at least 180 times in 200 (at a true rate of 0.95 the chance of 179
    or fewer is 1.2e-3 per coefficient)."""
    kappa = float(stats.chi2.ppf(0.95, 1))
    raw = (np.eye(3), np.zeros(3))
    covered = np.zeros(3)
    for seed in range(200):
        low, high, bounded = ar_intervals(_release(LAM2, seed), S1, S2, raw, kappa)
        assert bounded
        covered += (low <= W_STAR) & (high >= W_STAR)
    assert np.all(covered >= 180), covered  # 189, 192 and 193 at these seeds


def test_the_set_is_unbounded_exactly_when_an_eigenvalue_is_within_sqrt_kappa_noise_std() -> None:
    """A released Gram matrix whose smallest eigenvalue is 1.5 noise std: unbounded at
    ``chi2_1(0.95)`` (1.96 std) and at every coefficient, bounded at a level of 0.5 (``chi2_1``
    0.45: 0.67 std) around the noise-free fit."""
    lam2 = (_Q * np.array([0.5, 0.2, 1.5 * S2])) @ _Q.T
    exact = FMCoefficients(0.0, -2.0 * lam2 @ W_STAR, lam2)
    fit = fit_coefficients(exact, noise_std2=S2, floor=default_floor(3, S2), scales={1: S1, 2: S2})
    raw = (np.eye(3), np.zeros(3))
    low, high, bounded = ar_intervals(fit, S1, S2, raw, float(stats.chi2.ppf(0.95, 1)))
    assert not bounded and np.all(np.isinf(low)) and np.all(np.isinf(high))
    kappa = float(stats.chi2.ppf(0.5, 1))
    low, high, bounded = ar_intervals(fit, S1, S2, raw, kappa)
    assert bounded and np.all(np.isfinite(low)) and np.all(low < W_STAR) and np.all(high > W_STAR)


@pytest.mark.slow
def test_every_interval_holds_the_pooled_fit_when_the_set_does() -> None:
    """A weak direction (eigenvalue 3 noise std), 100 releases: where the profile set holds
    ``w*`` (``Q(w*) <= chi2_1(0.95)``; 68 releases) and is bounded, every coefficient's interval
    holds it, the intercept-like sum ``w_1 + w_2 + w_3`` too: the ends are the set's, not a
    solver's stop. Control: SLSQP started at the set's centre (where ``Q = 0`` and its gradient
    vanishes) reported an interval without ``w*`` in 15 of the 68."""
    kappa = float(stats.chi2.ppf(0.95, 1))
    lam2 = (_Q * np.array([0.5, 0.2, 3.0 * S2])) @ _Q.T
    m = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    held = 0
    for seed in range(100):
        fit = _release(lam2, seed)
        sym = 0.5 * (fit.coefficients.lam2 + fit.coefficients.lam2.T)
        low, high, bounded = ar_intervals(fit, S1, S2, (m, np.zeros(3)), kappa)
        if not bounded or ar_statistic(W_STAR, fit.coefficients.lam1, sym, S1, S2)[0] > kappa:
            continue
        held += 1
        assert np.all((low <= m @ W_STAR) & (m @ W_STAR <= high)), seed
    assert held == 68
