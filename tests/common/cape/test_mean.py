"""Tests of dpmarket.common.cape.mean: the mean's sensitivity, Lemma 1 and Remark 3 for the CAPE
mean,
Proposition 1 against conv, and bad input.

Variance tests compare the sample second moment of ``n`` independent errors (the mean is known:
the estimators are unbiased) with the theory through ``sum x^2 / sigma^2 ~ chi2(n)``, with a
two-sided failure probability of 1e-6 per assertion.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpmarket.common.cape.mean import (
    check_box,
    mean_baseline,
    mean_sensitivity,
    plan_mean,
    run_cape_mean,
    site_mean,
)
from dpmarket.common.cape.privacy import calibrate_tau, gaussian_sigma
from dpmarket.common.privacy.noise import SeededNoise

FAILURE = 1e-6
#: Columns of different ranges: the noise is isotropic, scaled by the box's diagonal.
BOUNDS = np.array([[0.0, 1.0], [-5.0, 5.0], [100.0, 102.0]])
DIAGONAL = math.sqrt(1.0 + 100.0 + 4.0)


def _chi2_interval(n: int) -> tuple[float, float]:
    """Interval of ``mean(x^2) / sigma^2`` over ``n`` samples, failure probability FAILURE."""
    return stats.chi2.ppf(FAILURE / 2, n) / n, stats.chi2.isf(FAILURE / 2, n) / n


def _sites(sizes: list[int], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(BOUNDS[:, 0], BOUNDS[:, 1], (n, len(BOUNDS))) for n in sizes]


# ------------------------------------------------------------------------------ sensitivity
def test_the_sensitivity_is_attained_by_opposite_corners_and_never_exceeded() -> None:
    """Replacing one of ``n`` records moves the mean by at most ``||high - low|| / n``; the
    worst case (a record moved from one corner to the opposite one) attains it."""
    n = 7
    delta = mean_sensitivity(BOUNDS, n)
    assert delta == pytest.approx(DIAGONAL / n, rel=1e-15)
    data = _sites([n], 0)[0]
    worst = data.copy()
    worst[0], data[0] = BOUNDS[:, 0], BOUNDS[:, 1]
    assert np.linalg.norm(data.mean(axis=0) - worst.mean(axis=0)) == pytest.approx(delta)
    rng = np.random.default_rng(1)
    for _ in range(200):
        other = data.copy()
        other[rng.integers(n)] = rng.uniform(BOUNDS[:, 0], BOUNDS[:, 1])
        assert np.linalg.norm(data.mean(axis=0) - other.mean(axis=0)) <= delta * (1 + 1e-12)


def test_the_plan_scales_each_sites_noise_to_its_own_sensitivity() -> None:
    """``tau_s = kappa ||high - low|| / N_s`` with ``kappa`` CAPE's calibration for a unit
    sensitivity; Remark 3's ``w_s tau_s`` is the same at every site."""
    sizes = [50, 100, 250]
    plan = plan_mean(BOUNDS, sizes, 1.0, 1e-6)
    kappa = calibrate_tau(1.0, 1e-6, sites=3, colluders=0, sensitivity=1.0)
    assert plan.kappa == kappa and plan.colluders == 0 and plan.weighted
    np.testing.assert_allclose(plan.site_scales, [kappa * DIAGONAL / n for n in sizes])
    np.testing.assert_allclose(plan.weights * np.array(plan.site_scales), kappa * DIAGONAL / 400)
    assert plan.aggregator_std() == pytest.approx(kappa * DIAGONAL / 400, rel=1e-12)
    assert plan.delta_exact <= 1e-6
    assert plan.delta_theorem1 is not None and plan.delta_theorem1 > plan.delta_exact


# ------------------------------------------------------------------------- Lemma 1, Prop. 1
@pytest.mark.parametrize("sizes", [[40] * 5, [20, 40, 60, 80, 100]], ids=["equal", "remark3"])
def test_the_cape_means_variance_is_the_pooled_variance(sizes: list[int]) -> None:
    """Lemma 1 (and Remark 3 for unequal sizes): over 1,500 seeded runs the CAPE mean's error
    has variance ``(kappa ||high - low|| / N)^2`` per coordinate, the pooled-data Gaussian
    mechanism's with the same multiplier (4,500 samples; chi-square interval, failure
    probability 1e-6); every run's zero-sum noise cancels to rounding."""
    sites = _sites(sizes, 2)
    exact = np.vstack(sites).mean(axis=0)
    noise = SeededNoise(np.random.default_rng(3))
    errors = []
    for _ in range(1500):
        result = run_cape_mean(sites, BOUNDS, 1.0, 1e-6, noise)
        assert result.zero_sum_residual <= 1e-9
        errors.append(result.estimate - exact)
    pooled = result.plan.kappa * DIAGONAL / sum(sizes)
    assert result.plan.aggregator_std() == pytest.approx(pooled, rel=1e-12)
    ratio = float(np.mean(np.square(errors))) / pooled**2
    low, high = _chi2_interval(np.size(errors))
    assert low <= ratio <= high, ratio


def test_conv_has_S_times_the_variance_of_the_pooled_mechanism() -> None:
    """Proposition 1: averaging every site's own Gaussian mechanism has ``S`` times the variance
    of one mechanism on the pooled data (equal sizes), as the plan states."""
    sizes = [40] * 5
    sites = _sites(sizes, 4)
    exact = np.vstack(sites).mean(axis=0)
    noise = SeededNoise(np.random.default_rng(5))
    errors = [mean_baseline("conv", sites, BOUNDS, 1.0, 1e-6, noise) - exact for _ in range(1000)]
    stated = plan_mean(BOUNDS, sizes, 1.0, 1e-6).baseline_stds()
    pooled = gaussian_sigma(1.0, 1e-6, DIAGONAL / 200)
    assert stated["pooled"] == pytest.approx(pooled, rel=1e-12)
    assert stated["conv"] == pytest.approx(math.sqrt(5) * pooled, rel=1e-12)
    ratio = float(np.mean(np.square(errors))) / stated["conv"] ** 2
    low, high = _chi2_interval(np.size(errors))
    assert low <= ratio <= high, ratio


def test_without_noise_worth_the_name_the_estimate_is_the_pooled_mean() -> None:
    sites = _sites([30, 70], 6)
    result = run_cape_mean(sites, BOUNDS, 1e4, 0.5, SeededNoise(np.random.default_rng(7)))
    exact = np.vstack(sites).mean(axis=0)
    np.testing.assert_allclose(result.estimate, exact, atol=6 * result.plan.aggregator_std())
    assert 6 * result.plan.aggregator_std() < 0.01  # small against columns of size 1 to 100


# ------------------------------------------------------------------------------- bad input
def test_a_value_outside_the_box_is_refused_naming_row_and_column_never_clipped() -> None:
    data = _sites([5], 8)[0]
    data[3, 1] = 5.5
    with pytest.raises(ValueError, match=r"values\[3, 1\] = 5\.5 is outside \[-5\.0, 5\.0\]"):
        check_box(data, BOUNDS)
    data[3, 1] = np.nan
    with pytest.raises(ValueError, match=r"values\[3, 1\] = nan is outside"):
        check_box(data, BOUNDS)
    plan = plan_mean(BOUNDS, [5, 5], 1.0, 1e-6)
    with pytest.raises(ValueError, match="outside"):
        site_mean(plan, 0, data)
    with pytest.raises(ValueError, match="holds 4 records, planned 5"):
        site_mean(plan, 0, _sites([4], 9)[0])


@pytest.mark.parametrize(
    ("bounds", "sizes", "message"),
    [
        (BOUNDS, [10], "at least 2 sites"),
        (np.array([[1.0, 0.0]]), [10, 10], "low < high"),
        (np.array([[0.0, np.inf]]), [10, 10], "finite"),
        (BOUNDS, [10, 0], "sizes"),
    ],
)
def test_a_malformed_plan_is_refused(bounds: np.ndarray, sizes: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_mean(bounds, sizes, 1.0, 1e-6)
