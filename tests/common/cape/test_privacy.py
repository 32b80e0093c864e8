"""Tests of dpmarket.common.cape.privacy: Theorem 1 (rederived and printed), the exact delta,
calibration
and Remark 3's weights."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpmarket.common.cape.privacy import (
    calibrate_tau,
    cape_exact_delta,
    collusion_factor,
    default_colluders,
    exact_delta,
    gaussian_sigma,
    printed_collusion_factor,
    privacy_loss_mu_sigma,
    remark3_site_taus,
    remark3_weights,
    theorem1_delta,
    unweighted_variance_ratio,
)
from dpmarket.common.privacy.accounting import analytic_gaussian_sigma

# (S, N, tau, epsilon): the symmetric setting of Theorem 1, Delta = 1 / N_s = S / N.
THEOREM1_TABLE = [
    (3, 300, 0.05, 1.0),
    (4, 1_000, 0.01, 0.5),
    (5, 1_000, 0.03, 1.0),
    (5, 10_000, 0.002, 2.0),
    (6, 600, 0.05, 1.5),
    (10, 5_000, 0.01, 1.0),
    (20, 20_000, 0.005, 0.8),
]


def _adversary_view_sigma2(sites: int, colluders: int, tau: float, sensitivity: float) -> float:
    """``v^T Sigma^+ v`` of the adversary's full view, built from the generative model.

    Latent noise ``z = [e_hat_1..S, g_1..S]`` with covariance ``diag(tau^2 I, tau^2 / S I)``; the
    view stacks every release ``a_hat_s = f_s + e_hat_s - mean(e_hat) + g_s``, the broadcast sum
    ``T = sum e_hat`` and the colluders' (the last ``S_C`` sites') ``e_hat`` and ``g``. Changing
    site 1's statistic by ``Delta`` shifts only ``a_hat_1``. The view is degenerate (the
    colluders' releases are functions of the rest), hence the pseudo-inverse.
    """
    s = sites
    rows = []
    for site in range(s):
        r = np.zeros(2 * s)
        r[:s] -= 1.0 / s
        r[site] += 1.0
        r[s + site] = 1.0
        rows.append(r)
    rows.append(np.r_[np.ones(s), np.zeros(s)])
    for site in range(s - colluders, s):
        r = np.zeros(2 * s)
        r[site] = 1.0
        rows.append(r)
        r = np.zeros(2 * s)
        r[s + site] = 1.0
        rows.append(r)
    a = np.array(rows)
    cov = a @ np.diag([tau**2] * s + [tau**2 / s] * s) @ a.T
    v = np.zeros(a.shape[0])
    v[0] = sensitivity
    return float(v @ np.linalg.pinv(cov, rcond=1e-12, hermitian=True) @ v)


def _proof_model_sigma2(sites: int, colluders: int, tau: float, sensitivity: float) -> float:
    """``v~^T Sigma^-1 v~`` with the proof's ``Sigma`` (colluders' ``e_hat`` left random)."""
    h = sites - colluders
    sa = (1.0 + 1.0 / sites) * tau**2 * np.eye(h) - tau**2 / sites * np.ones((h, h))
    c = (1.0 - h / sites) * tau**2 * np.ones((h, 1))
    cov = np.block([[sa, c], [c.T, np.array([[h * tau**2]])]])
    v = np.zeros(h + 1)
    v[0] = sensitivity
    return float(v @ np.linalg.solve(cov, v))


def _printed_eq45(sites: int, n: int, tau: float, colluders: int) -> tuple[float, float]:
    """Equations (4) and (5) transcribed as printed: (mu_z, sigma_z^2)."""
    s, sc = sites, colluders
    bracket = (s - sc + 2) / (s - sc) + (9 / (s - sc)) * sc**2 / (s * (1 + s) - 3 * sc**2)
    mu = s**3 / (2 * tau**2 * n**2 * (1 + s)) * bracket
    var = s**3 / (tau**2 * n**2 * (1 + s)) * bracket
    return mu, var


def _delta_bound(eps: float, mu: float, sigma: float) -> float:
    return 2 * sigma / (eps - mu) * stats.norm.pdf((eps - mu) / sigma)


@pytest.mark.parametrize(
    ("sites", "expected"), [(2, 0), (3, 0), (4, 1), (5, 1), (6, 1), (7, 2), (20, 6)]
)
def test_default_colluders(sites: int, expected: int) -> None:
    assert default_colluders(sites) == expected


@pytest.mark.parametrize(("sites", "n", "tau", "eps"), THEOREM1_TABLE)
def test_theorem1_matches_direct_evaluation_of_the_adversary_view(
    sites: int, n: int, tau: float, eps: float
) -> None:
    sc = default_colluders(sites)
    sens = sites / n
    sigma2 = _adversary_view_sigma2(sites, sc, tau, sens)
    mu = sigma2 / 2
    mu_z, sigma_z = privacy_loss_mu_sigma(sites=sites, tau=tau, sensitivity=sens)
    assert sigma_z**2 == pytest.approx(sigma2, rel=1e-8)
    assert mu_z == pytest.approx(mu, rel=1e-8)
    expected = _delta_bound(eps, mu, math.sqrt(sigma2))
    assert theorem1_delta(eps, sites=sites, tau=tau, sensitivity=sens) == pytest.approx(
        expected, rel=1e-7
    )


@pytest.mark.parametrize(("sites", "n", "tau", "eps"), THEOREM1_TABLE)
def test_printed_variant_is_equations_4_and_5(sites: int, n: int, tau: float, eps: float) -> None:
    sc = default_colluders(sites)
    mu, var = _printed_eq45(sites, n, tau, sc)
    mu_z, sigma_z = privacy_loss_mu_sigma(
        sites=sites, tau=tau, sensitivity=sites / n, variant="printed"
    )
    assert mu_z == pytest.approx(mu, rel=1e-12)
    assert sigma_z**2 == pytest.approx(var, rel=1e-12)
    got = theorem1_delta(eps, sites=sites, tau=tau, sensitivity=sites / n, variant="printed")
    assert got == pytest.approx(_delta_bound(eps, mu, math.sqrt(var)), rel=1e-9)


@pytest.mark.parametrize(("sites", "colluders"), [(5, 1), (10, 3), (20, 6), (6, 1), (7, 2)])
def test_printed_formula_equals_the_proof_model_only_when_s_is_3sc_plus_2(
    sites: int, colluders: int
) -> None:
    proof = _proof_model_sigma2(sites, colluders, 1.0, 1.0)
    printed = printed_collusion_factor(sites, colluders)
    assert (sites == 3 * colluders + 2) == math.isclose(proof, printed, rel_tol=1e-9)
    # The proof's view leaves out what the colluders know: it understates the loss.
    assert proof <= collusion_factor(sites, colluders) + 1e-12


def test_collusion_factor_limits() -> None:
    assert collusion_factor(5, 0) == pytest.approx(2 * 5 / 6)
    assert collusion_factor(5, 4) == pytest.approx(5.0)  # only g_s protects the last honest site
    assert collusion_factor(5) == pytest.approx(1.875)
    assert printed_collusion_factor(5) == pytest.approx(1.3194444444)
    factors = [collusion_factor(10, c) for c in range(10)]
    assert factors == sorted(factors)  # more colluders, more loss


def test_theorem1_errors_name_the_condition() -> None:
    with pytest.raises(ValueError, match="epsilon > mu_z"):
        theorem1_delta(0.01, sites=5, tau=0.001, sensitivity=0.01)
    with pytest.raises(ValueError, match=r"S\(1\+S\) - 3 S_C\^2 > 0"):
        theorem1_delta(1.0, sites=5, colluders=4, tau=1.0, sensitivity=0.01, variant="printed")
    # the rederived formula holds for any number of colluders below S
    assert 0 < theorem1_delta(1.0, sites=5, colluders=4, tau=1.0, sensitivity=0.2) < 1
    with pytest.raises(ValueError, match="colluders"):
        theorem1_delta(1.0, sites=5, colluders=5, tau=1.0, sensitivity=0.01)
    with pytest.raises(ValueError, match="at least 2 sites"):
        theorem1_delta(1.0, sites=1, tau=1.0, sensitivity=0.01)
    with pytest.raises(ValueError, match="tau"):
        theorem1_delta(1.0, sites=5, tau=0.0, sensitivity=0.01)


@pytest.mark.parametrize("ratio", [0.05, 0.3, 1.0, 2.5])
@pytest.mark.parametrize("eps", [0.0, 0.1, 1.0, 3.0])
def test_exact_delta_is_the_gaussian_privacy_profile(ratio: float, eps: float) -> None:
    from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss

    expected = GaussianPrivacyLoss(1.0, sensitivity=ratio).get_delta_for_epsilon(eps)
    assert exact_delta(eps, ratio**2 / 2, ratio) == pytest.approx(expected, rel=1e-7, abs=1e-300)


def test_exact_delta_rejects_an_inconsistent_loss() -> None:
    with pytest.raises(ValueError, match="sigma\\^2 = 2 mu"):
        exact_delta(1.0, 1.0, 1.0)


@pytest.mark.parametrize("sites", [3, 5, 10, 20])
def test_exact_delta_never_exceeds_theorem1(sites: int) -> None:
    checked = 0
    for tau in (0.5, 1.0, 3.0, 8.0):
        for eps in (0.3, 1.0, 3.0):
            mu, _ = privacy_loss_mu_sigma(sites=sites, tau=tau, sensitivity=1.0)
            if eps <= mu:  # Theorem 1 does not apply
                continue
            exact = cape_exact_delta(eps, sites=sites, tau=tau, sensitivity=1.0)
            assert exact <= theorem1_delta(eps, sites=sites, tau=tau, sensitivity=1.0)
            checked += 1
    assert checked >= 6


def test_exact_delta_is_tens_of_times_smaller_than_theorem1_at_s5_eps1() -> None:
    """S = 5, epsilon = 1, tau set so that Theorem 1 gives delta = 1e-5 (N = 1,000)."""
    sens = 5 / 1_000
    tau = calibrate_tau(1.0, 1e-5, sites=5, sensitivity=sens, method="theorem1")
    bound = theorem1_delta(1.0, sites=5, tau=tau, sensitivity=sens)
    exact = cape_exact_delta(1.0, sites=5, tau=tau, sensitivity=sens)
    assert bound == pytest.approx(1e-5, rel=1e-6)
    ratio = bound / exact
    assert 40 < ratio < 55, ratio  # measured 47.9 (the reference: 40)


@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-8])
@pytest.mark.parametrize("eps", [0.2, 1.0, 4.0])
def test_calibrate_tau_exact_is_the_analytic_gaussian_of_the_inflated_sensitivity(
    eps: float, delta: float
) -> None:
    sens = 0.01
    tau = calibrate_tau(eps, delta, sites=5, sensitivity=sens)
    reference = analytic_gaussian_sigma(eps, delta, sens * math.sqrt(collusion_factor(5)))
    assert tau == pytest.approx(reference, rel=1e-6)
    assert gaussian_sigma(eps, delta, sens) == pytest.approx(
        analytic_gaussian_sigma(eps, delta, sens), rel=1e-6
    )


@pytest.mark.parametrize("method", ["exact", "theorem1"])
def test_calibrate_tau_is_the_smallest_tau_meeting_the_target(method: str) -> None:
    eps, delta, sens = 1.0, 1e-6, 0.02
    tau = calibrate_tau(eps, delta, sites=8, sensitivity=sens, method=method)  # type: ignore[arg-type]
    f = theorem1_delta if method == "theorem1" else cape_exact_delta
    assert f(eps, sites=8, tau=tau, sensitivity=sens) <= delta
    assert f(eps, sites=8, tau=tau * (1 - 1e-6), sensitivity=sens) > delta
    # Theorem 1 is looser, so it needs more noise
    if method == "theorem1":
        assert tau > calibrate_tau(eps, delta, sites=8, sensitivity=sens)


@settings(max_examples=60, deadline=None)
@given(
    eps=st.floats(0.05, 8.0),
    log_delta=st.floats(-12.0, -1.5),
    sites=st.integers(2, 30),
    data=st.data(),
)
def test_calibrated_tau_never_gives_a_delta_above_the_target(
    eps: float, log_delta: float, sites: int, data: st.DataObject
) -> None:
    delta = 10.0**log_delta
    colluders = data.draw(st.integers(0, sites - 1))
    for method in ("exact", "theorem1"):
        tau = calibrate_tau(
            eps, delta, sites=sites, colluders=colluders, sensitivity=0.1, method=method
        )
        kwargs = {"sites": sites, "colluders": colluders, "tau": tau, "sensitivity": 0.1}
        assert cape_exact_delta(eps, **kwargs) <= delta  # type: ignore[arg-type]
        if method == "theorem1":
            assert theorem1_delta(eps, **kwargs) <= delta  # type: ignore[arg-type]


def test_remark3_reduces_to_equal_weights() -> None:
    np.testing.assert_allclose(remark3_weights([200] * 5), np.full(5, 0.2))
    np.testing.assert_allclose(remark3_site_taus(0.01, [200] * 5), np.full(5, 0.05))
    assert unweighted_variance_ratio([200] * 5) == pytest.approx(1.0)


def test_remark3_unequal_sizes() -> None:
    sizes = [100, 300, 600]
    w = remark3_weights(sizes)
    np.testing.assert_allclose(w, [0.1, 0.3, 0.6])
    taus = remark3_site_taus(0.002, sizes)
    np.testing.assert_allclose(taus, [0.02, 0.002 * 1000 / 300, 0.002 * 1000 / 600])
    # w_s tau_s is the same for every site: the rescaled releases are symmetric
    np.testing.assert_allclose(w * taus, np.full(3, 0.002))
    # Var(sum_s w_s g_s) with g_s ~ N(0, tau_s^2 / S) is tau_pool^2
    assert float(np.sum(w**2 * taus**2 / 3)) == pytest.approx(0.002**2)
    # plain 1/S averaging pays H(n) >= 1, at most the Schur-convexity bound of Remark 3
    n, s = 1000, 3
    h = unweighted_variance_ratio(sizes)
    assert 1.0 < h <= n**2 / s**3 * (1 / (n - s + 1) ** 2 + s - 1)
    assert unweighted_variance_ratio([n - s + 1, 1, 1]) == pytest.approx(
        n**2 / s**3 * (1 / (n - s + 1) ** 2 + s - 1)
    )


@pytest.mark.parametrize("bad", [[], [10, 0], [10, 2.5], [[1, 2]]])
def test_remark3_rejects_bad_sizes(bad: list[object]) -> None:
    with pytest.raises(ValueError):
        remark3_weights(bad)  # type: ignore[arg-type]
